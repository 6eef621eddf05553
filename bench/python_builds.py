#!/usr/bin/python3
"""Whole calls from Python, two builds of the module side by side: time and page faults a call.

Each round starts one process per build (the order alternating between rounds), and each process
times, for every N, the forward (out and lse) and the backward of B = 1, H heads, d = dk = dv,
its best of max(3, 4000 / N) calls after two untimed ones, and counts the minor page faults of
those calls (getrusage). With --gap-ms G each timed call comes G ms after the last (a sleep, as
between the layers of a model, where the library's helper threads park), and the median of 300
such calls is taken instead of the best; with --median-of K, the median of K back-to-back calls.
With --api torch the calls go through attnscale.torch on tensors that require grad: "forward" is
attnscale.torch.attention, "backward" a whole step, the forward and torch.autograd.grad of q, k, v.
A process's memory state (where malloc's heap top stands, which pages it gave back) moves its
times, so the two builds run in as many fresh processes each; printed: the median over the rounds
of each build's time, its range, the median faults a call, and new / old.

    /usr/bin/python3 bench/python_builds.py --old OLD/build/python --new build/python \\
        [--n 64,128,256,512,1024] [--d 128] [--heads 8] [--dtype float32|bfloat16] [--rounds 9]
        [--gap-ms 1 | --median-of 3000] [--api numpy|torch]
"""
import argparse
import json
import os
import subprocess
import sys


def one_process(args):
    """The child: times every N once, prints one JSON line {N: [fwd s, bwd s, fwd faults, bwd faults]}."""
    import resource
    import time

    import numpy as np

    import attnscale

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def timed(call, reps):
        """(seconds a call: the best of reps, or a median as asked, faults a call)."""
        call()
        call()
        median = bool(args.gap_ms or args.median_of)
        if median:
            reps, times = (300 if args.gap_ms else args.median_of), []
        f0, t = faults(), float("inf")
        for _ in range(reps):
            if args.gap_ms:
                time.sleep(args.gap_ms / 1e3)
            s = time.perf_counter()
            call()
            if median:
                times.append(time.perf_counter() - s)
            else:
                t = min(t, time.perf_counter() - s)
        if median:
            t = float(np.median(times))
        return t, (faults() - f0) / reps

    rng = np.random.default_rng(1)
    result = {}
    for n in args.n:
        q, k, v, do = (rng.standard_normal((1, args.heads, n, args.d), dtype=np.float32) for _ in range(4))
        if args.dtype == "bfloat16":
            q, k, v, do = (attnscale.to_bfloat16(x) for x in (q, k, v, do))
        out, lse = attnscale.attention(q, k, v, causal=True, return_lse=True)
        reps = max(3, 4000 // n)
        if args.api == "torch":
            import torch

            import attnscale.torch as at

            # attnscale.torch runs on torch's thread count (python/attnscale/torch_threads.py): every
            # core, as the numpy calls and builds from before it use.
            torch.set_num_threads(os.cpu_count() or 1)
            tq, tk, tv, tdo = (torch.from_numpy(np.array(x)) for x in (q, k, v, do))
            if args.dtype == "bfloat16":
                tq, tk, tv, tdo = (t.view(torch.bfloat16) for t in (tq, tk, tv, tdo))
            for t in (tq, tk, tv):
                t.requires_grad_()
            fwd = timed(lambda: at.attention(tq, tk, tv, causal=True), reps)
            bwd = timed(lambda: torch.autograd.grad(at.attention(tq, tk, tv, causal=True), (tq, tk, tv), tdo), reps)
        else:
            fwd = timed(lambda: attnscale.attention(q, k, v, causal=True, return_lse=True), reps)
            bwd = timed(lambda: attnscale.attention_backward(q, k, v, out, lse, do, causal=True), reps)
        result[n] = [fwd[0], bwd[0], fwd[1], bwd[1]]
    print(json.dumps(result))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", help="the first build's python directory (with attnscale/)")
    ap.add_argument("--new", default="build/python", help="the second build's python directory")
    ap.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256, 512, 1024])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--gap-ms", type=float, default=0, help="sleep this long before each timed call (median of 300)")
    ap.add_argument("--median-of", type=int, default=0, help="the median of this many back-to-back calls, not the best")
    ap.add_argument("--api", choices=["numpy", "torch"], default="numpy",
                    help="torch: attnscale.torch's forward, and a forward + autograd.grad step as the backward")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return one_process(args)
    if not args.old:
        ap.error("--old: required (the build to compare --new with)")
    builds = {"old": args.old, "new": args.new}
    for name, path in builds.items():
        if not os.path.isdir(os.path.join(path, "attnscale")):
            ap.error(f"--{name}: {path} holds no attnscale/ package")
    child = [sys.executable, os.path.abspath(__file__), "--child", "--n", ",".join(map(str, args.n)),
             "--d", str(args.d), "--heads", str(args.heads), "--dtype", args.dtype, "--gap-ms", str(args.gap_ms), "--median-of", str(args.median_of), "--api", args.api]
    runs = {name: [] for name in builds}
    print(f"load average {os.getloadavg()[0]:.2f} before; B = 1, H = {args.heads}, d = {args.d}, causal, "
          f"{args.dtype}, {args.rounds} rounds" + (f", {args.gap_ms:g} ms before each call" if args.gap_ms else "")
          + (f", medians of {args.median_of} calls" if args.median_of and not args.gap_ms else "")
          + (", through attnscale.torch (backward: a forward + autograd.grad step)" if args.api == "torch" else ""))
    for r in range(args.rounds):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(builds[name]))
            line = subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout
            runs[name].append({int(n): v for n, v in json.loads(line).items()})
    for n in args.n:
        cells = []
        for what, i in (("forward", 0), ("backward", 1)):
            t = {name: [run[n][i] * 1e3 for run in runs[name]] for name in builds}
            f = {name: median([run[n][i + 2] for run in runs[name]]) for name in builds}
            cells.append(f"{what} old {median(t['old']):.3f} [{min(t['old']):.3f}-{max(t['old']):.3f}] ms "
                         f"{f['old']:.0f} faults, new {median(t['new']):.3f} [{min(t['new']):.3f}-{max(t['new']):.3f}] "
                         f"{f['new']:.0f} faults, new/old {median(t['new']) / median(t['old']):.3f}")
        print(f"N {n:5d}: " + " | ".join(cells))
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
