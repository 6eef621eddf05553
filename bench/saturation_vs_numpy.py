"""The Simulation note's numpy simulation against `attnscale experiment saturation` on the same sweep.

N = 50 tokens, d in {1, 2, 4, ..., 512}, 200 trials, unscaled and 1/sqrt(d)-scaled softmax;
metric top_p_95 (per row: sort descending, the smallest count whose cumulative sum reaches 0.95),
averaged over the rows of a trial. Prints both wall times (the attnscale time includes starting the
process) and both CPU times (numpy: this process; attnscale: the child's user + system time), the
speed ratios, and whether every mean agrees within the two 95% intervals. On a machine shared with
other work the wall times move with its load; the CPU times much less.

Run: /usr/bin/python3 bench/saturation_vs_numpy.py [--bin build/bin/attnscale] [--threads T]
"""
import argparse
import csv
import io
import math
import resource
import subprocess
import time

import numpy as np

from openblas_kernels import openblas_core_note, restart_with_openblas_core

N_TOK, TRIALS = 50, 200
DIMS = [2 ** i for i in range(10)]

# ---- the Simulation note's code (as published), with its top_p_95 definition ----
rng = np.random.default_rng(0)


def calc_softmax(x: np.ndarray) -> np.ndarray:
    '''Compute softmax with numerical stability.'''
    if x.ndim != 2:
        raise ValueError("expected 2D array")
    x_centered = x - np.max(x, axis=1, keepdims=True)
    exp_x = np.exp(x_centered)
    return exp_x / np.sum(exp_x, axis=1, keepdims=True)


def run_experiment(n_tok: int, h_dim: int) -> tuple:
    # Generate random query and key matrices
    Q = rng.normal(0, 1, size=(n_tok, h_dim))
    K = rng.normal(0, 1, size=(n_tok, h_dim))
    # Compute attention scores (dot product)
    A = Q @ K.T  # unscaled attention
    A_scaled = A / np.sqrt(h_dim)  # scaled attention
    # Apply softmax
    A_softmax = calc_softmax(A)
    A_scaled_softmax = calc_softmax(A_scaled)
    return A_softmax, A_scaled_softmax


def top_p_95(P: np.ndarray) -> np.ndarray:
    '''Per row: sort descending, the first n elements whose sum crosses 0.95.'''
    s = -np.sort(-P, axis=1)
    c = np.cumsum(s, axis=1)
    return np.minimum((c < 0.95).sum(axis=1) + 1, P.shape[1])


def numpy_sweep():
    out = {}
    for d in DIMS:
        unscaled, scaled = [], []
        for _ in range(TRIALS):
            a, b = run_experiment(N_TOK, d)
            unscaled.append(top_p_95(a).mean())
            scaled.append(top_p_95(b).mean())
        for name, xs in (("none", unscaled), ("sqrt", scaled)):
            x = np.asarray(xs)
            h = 1.9720 * x.std(ddof=1) / math.sqrt(len(x))  # t_{0.975,199}
            out[(d, name)] = (x.mean(), x.mean() - h, x.mean() + h)
    return out


def attnscale_sweep(binary, threads, sampler):
    cmd = [binary, "experiment", "saturation", "--n", str(N_TOK), "--d", ",".join(map(str, DIMS)),
           "--trials", str(TRIALS), "--scaling", "none,sqrt", "--sampler", sampler, "--seed", "1"]
    if threads:
        cmd += ["--threads", str(threads)]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out = {}
    for r in csv.DictReader(io.StringIO(text)):
        if r["metric"] == "top_p_95":
            out[(int(r["d"]), r["scaling"])] = (float(r["mean"]), float(r["ci_low"]), float(r["ci_high"]))
    return seconds, cpu, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/bin/attnscale")
    ap.add_argument("--threads", type=int, default=0, help="attnscale threads (0: all cores)")
    args = ap.parse_args()
    restart_with_openblas_core()  # numpy's products are OpenBLAS's: on the CPU's own kernels
    print(f"OpenBLAS on its {openblas_core_note()}")
    t0, c0 = time.perf_counter(), time.process_time()
    ref = numpy_sweep()
    t_numpy, c_numpy = time.perf_counter() - t0, time.process_time() - c0
    print(f"numpy (the Simulation note code):       wall {t_numpy:7.3f} s  cpu {c_numpy:7.3f} s   "
          f"N={N_TOK} d=1..512 trials={TRIALS} none+sqrt")
    for sampler in ("auto", "direct", "wishart"):
        t_ours, c_ours, got = attnscale_sweep(args.bin, args.threads, sampler)
        if sampler == "auto":
            ours = got
        agree = sum(1 for k in ref if got[k][1] <= ref[k][2] and ref[k][1] <= got[k][2])
        print(f"attnscale --sampler {sampler:7s}: wall {t_ours:7.3f} s  cpu {c_ours:7.3f} s   "
              f"speed-up wall {t_numpy / t_ours:5.1f}x  cpu {c_numpy / max(c_ours, 1e-9):5.1f}x (goal >= 20x)   "
              f"means agree within CIs: {agree}/{len(ref)}")
    print("\n    d  scaling   numpy mean [95% CI]          attnscale (auto) mean [95% CI]")
    for k in sorted(ref):
        a, b = ref[k], ours[k]
        print(f"{k[0]:5d}  {k[1]:7s}  {a[0]:7.3f} [{a[1]:7.3f}, {a[2]:7.3f}]   {b[0]:7.3f} [{b[1]:7.3f}, {b[2]:7.3f}]")


if __name__ == "__main__":
    main()
