#!/usr/bin/python3
"""The performance goals of docs/performance.md, each a ratio of two timings taken in one run.

On a machine shared with other jobs the available CPU changes from second to second, so a ratio of
two timings taken a minute apart says little. Here every measured function runs once per round,
all of them in turn, for several rounds, the two sides of each ratio next to each other (every
other round in reverse order); a ratio is computed within each round (timings seconds apart, under
the same load) and the median over rounds is reported with its range. The load average is printed before and after.
A ratio to one of the machine's limits (the FMA and bf16 peaks, the copy) takes the limit timed right
before and right after its row, their mean, as `attnscale bench` does (cli/limit_bracket.h): a round
counts ("steady") when the two agree within 15% and neither is under 0.6 of that limit's median over
the run (a slow spell of the host); the median is over the steady rounds, or over every round when
none was (0/N).

    /usr/bin/python3 bench/goals.py [--pymod build/python] [--threads 2] [--rounds 5]

Measured (B = 1, H = 8, d = 128): the machine's fp32 FMA peak and bf16 dot peak (independent-chain loops
of the library's own dispatched SIMD target, see src/attention/peak_loops.h; where the bf16 products run
on AMX, the AMX tdpbf16ps loop in place of the bf16 dot one), against which the float32
and bf16 forward and the backward are reported; our float32 forward at N = 4096 against OpenBLAS sgemm 2048^3
(through ctypes, the library `attnscale bench` links) and torch's _scaled_dot_product_attention;
the same forward on 1 thread against `threads` threads (with sgemm and the FMA loop on 1 and `threads`
threads as controls of what the machine gives); our backward at N = 4096 against the fp32 peak and sgemm; our bf16 forward
against torch's bf16 matmul 2048^3 (the bf16 forward and backward on bf16 tensors in and out, fp32
accumulation, as `attnscale bench` runs them); decode (Nq = 1, Nkv = 65536) against a 256 MiB copy on
as many threads (bytes read + written per second), also with GQA (32 query heads over 4 KV heads);
int8-KV against float32-KV decode through the cache API (attnscale.decode) in tokens per second;
causal against non-causal forward time at N = 4096.

Thread scaling needs idle cores: Linux shares the CPU between sessions (autogroups), not threads,
so while other sessions keep the cores busy a second thread gains nothing, for sgemm as for us
(the control row shows it). The CPU-time row is the work done on 1 thread over the work done on
`threads` threads (all threads' CPU seconds): near 1 when splitting the work costs nothing extra.
"""
import argparse
import ctypes
import os
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from openblas_kernels import openblas_core_note, restart_with_openblas_core


KV_I8_CALLS = 4  # int8-KV decode calls a timing (see fns below)
STEADY_TOLERANCE = 0.15  # as cli/limit_bracket.h's kSteadyTolerance and kSlowShare
SLOW_SHARE = 0.6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pymod", default="build/python", help="folder holding the attnscale Python module")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    restart_with_openblas_core()
    sys.path.insert(0, a.pymod)
    import attnscale  # noqa: E402
    import attnscale._attnscale as native  # noqa: E402
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
    from attnscale.torch_function import to_numpy  # noqa: E402

    T = a.threads
    torch.set_num_threads(T)
    blas = ctypes.CDLL("libopenblas.so.0")
    n = 2048
    ga, gb = np.full((n, n), 0.5, np.float32), np.full((n, n), 0.25, np.float32)
    gc = np.zeros((n, n), np.float32)

    def sgemm(threads):
        def run():
            blas.openblas_set_num_threads(threads)
            blas.cblas_sgemm(101, 111, 111, n, n, n, ctypes.c_float(1), ctypes.c_void_p(ga.ctypes.data), n,
                             ctypes.c_void_p(gb.ctypes.data), n, ctypes.c_float(0), ctypes.c_void_p(gc.ctypes.data), n)
        return run

    rng = np.random.default_rng(0)
    H, d = 8, 128

    def qkv(N, nq=None):
        return tuple(rng.uniform(-1, 1, (1, H, nq if (nq and i == 0) else N, d)).astype(np.float32) for i in range(3))

    q4, k4, v4 = qkv(4096)
    tq, tk, tv = (torch.from_numpy(x) for x in (q4, k4, v4))
    out4, lse4 = attnscale.attention(q4, k4, v4, return_lse=True, threads=T)
    outc4, lsec4 = attnscale.attention(q4, k4, v4, causal=True, return_lse=True, threads=T)
    dout4 = rng.uniform(-1, 1, out4.shape).astype(np.float32)

    # The bf16 rows on bf16 tensors in and out (fp32 accumulation), as `attnscale bench` runs them:
    # torch's rounding to bfloat16, seen as attnscale.bfloat16 arrays.
    qb4, kb4, vb4, doutb4 = (to_numpy("bf16", torch.from_numpy(x).bfloat16()) for x in (q4, k4, v4, dout4))
    outb4, lseb4 = attnscale.attention(qb4, kb4, vb4, return_lse=True, threads=T)
    qd, kd, vd = qkv(65536, nq=1)
    # GQA decode: 32 query heads over 4 KV heads; and the cache API over int8 and float32 K/V.
    qg = rng.uniform(-1, 1, (1, 32, 1, d)).astype(np.float32)
    kg, vg = (rng.uniform(-1, 1, (1, 4, 65536, d)).astype(np.float32) for _ in range(2))
    kq, ks = attnscale.quantize_q8(kd)
    vq, vs = attnscale.quantize_q8(vd)
    qc = qd[:, :, 0, :]
    xb, yb = torch.rand(n, n).bfloat16(), torch.rand(n, n).bfloat16()
    src = np.ones(256 << 20, np.uint8)
    dst = np.zeros_like(src)

    pool = ThreadPoolExecutor(T)
    slices = [slice(i * src.size // T, (i + 1) * src.size // T) for i in range(T)]

    def copy():  # with the same thread count as decode; numpy's copy releases the GIL
        list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))

    def sdpa():
        with torch.no_grad():
            F._scaled_dot_product_attention(tq, tk, tv, None, 0.0, False)

    peak_steps = 1 << 23  # about 20 ms of each peak loop on an idle core
    # Where the bf16 products run on AMX, the bf16 forward and backward are reported against the AMX
    # loop (tdpbf16ps, src/attention/peak_loops.h), timed beside them as the vdpbf16ps loop is; the
    # goals' targets for them were set against the vdpbf16ps loop and are not carried over.
    # Where bf16 pairs are widened to float32 (the "widened" path: no bf16 dot instruction, or one no
    # faster than two FMAs), against the FMA loop.
    amx = native._bf16_path() == "amx"
    widened = native._bf16_path() in ("widened", "portable")
    # The peak loops time themselves (native._timed_peak_loop: every thread started together
    # after a barrier, as attnscale bench times them), so that a helper thread woken late delays
    # the start instead of leaving its loop to the caller; their rows return (flops, seconds).
    def peak(kind, threads, steps):
        return lambda: native._timed_peak_loop(kind, threads, steps)

    bf16_peak = (peak("amx", T, peak_steps // 8) if amx
                 else peak("fp32", T, peak_steps) if widened
                 else peak("bf16", T, peak_steps // 2))
    bf16_peak_name = "AMX peak" if amx else "fp32 peak" if widened else "bf16 peak"
    fns = {  # in this order, so that the two sides of every ratio run next to each other
        "fwd-causal": lambda: attnscale.attention(q4, k4, v4, causal=True, threads=T),
        "torch-sdpa": sdpa,
        "fp32-peak": peak("fp32", T, peak_steps),
        "fwd": lambda: attnscale.attention(q4, k4, v4, threads=T),
        "fp32-peak-2": peak("fp32", T, peak_steps),
        "bwd": lambda: attnscale.attention_backward(q4, k4, v4, out4, lse4, dout4, threads=T),
        "fp32-peak-3": peak("fp32", T, peak_steps),
        "fp32-peak-1thread": peak("fp32", 1, peak_steps),
        "sgemm-1thread": sgemm(1),
        "sgemm": sgemm(T),
        "bwd-causal": lambda: attnscale.attention_backward(q4, k4, v4, outc4, lsec4, dout4, causal=True, threads=T),
        "bwd-1thread": lambda: attnscale.attention_backward(q4, k4, v4, out4, lse4, dout4, threads=1),
        "fwd-1thread": lambda: attnscale.attention(q4, k4, v4, threads=1),
        "bf16-peak": bf16_peak,
        "fwd-bf16": lambda: attnscale.attention(qb4, kb4, vb4, threads=T),
        "bf16-peak-2": bf16_peak,
        "bwd-bf16": lambda: attnscale.attention_backward(qb4, kb4, vb4, outb4, lseb4, doutb4, threads=T),
        "bf16-peak-3": bf16_peak,
        "torch-bf16-mm": lambda: xb @ yb,
        "copy": copy,
        "decode": lambda: attnscale.attention(qd, kd, vd, threads=T),
        "copy-2": copy,
        "decode-gqa": lambda: attnscale.attention(qg, kg, vg, threads=T),
        "copy-3": copy,
        "kv-f32": lambda: attnscale.decode(qc, kd, vd, threads=T),
        # Four calls (four new tokens) a timing: about as long as one float32 call (3-4 ms each
        # against 12-14), so that both sides of the ratio see the host's hiccups for as long.
        "kv-i8": lambda: [attnscale.decode(qc, kq, vq, k_scales=ks, v_scales=vs, threads=T) for _ in range(KV_I8_CALLS)],
    }
    load0 = os.getloadavg()
    times = {k: [] for k in fns}  # wall seconds per round
    cpus = {k: [] for k in fns}  # CPU seconds of all the process's threads, same calls
    # PyTorch's OpenMP threads and OpenBLAS's threads keep spinning for a while after a parallel
    # call, on the same cores: the decode row right after torch's bf16 matmul took 12.5 ms against
    # 9.2 with 50 ms between the two (or with the decode one row later). So every torch and sgemm
    # row is followed by an untimed pause.
    settle = 0.1

    peak_flops = {}  # per peak row, the flops one call does (as _timed_peak_loop counts them)

    def timed_call(name, f):
        c0, t0 = time.process_time(), time.perf_counter()
        result = f()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if "peak" in name:
            peak_flops[name], wall = result  # the flops of all its threads, the loop's own timing
        if name.startswith(("torch-", "sgemm")):
            time.sleep(settle)
        return wall, cpu

    for name, f in fns.items():
        timed_call(name, f)
    # Every other round in reverse order (as `attnscale bench` runs its rows): each ratio's two
    # sides are then timed in one order in half the rounds and in the other in the rest, so that
    # neither side is always the one timed first, after the row before it.
    names = list(fns)
    for r in range(a.rounds):
        for name in (names if r % 2 == 0 else reversed(names)):
            wall, cpu = timed_call(name, fns[name])
            times[name].append(wall)
            cpus[name].append(cpu)
    load1 = os.getloadavg()

    fwd_flops = 4.0 * H * 4096 * 4096 * d
    work = {
        "sgemm": 2.0 * n**3, "sgemm-1thread": 2.0 * n**3, "fwd": fwd_flops, "fwd-1thread": fwd_flops,
        "fwd-causal": 4.0 * H * (4096 * 4097 / 2) * d, "torch-sdpa": fwd_flops, "bwd": 2.5 * fwd_flops,
        "bwd-causal": 2.5 * 4.0 * H * (4096 * 4097 / 2) * d, "bwd-1thread": 2.5 * fwd_flops, "bwd-bf16": 2.5 * fwd_flops,
        **peak_flops,
        "fwd-bf16": fwd_flops, "torch-bf16-mm": 2.0 * n**3, "decode": 2.0 * H * 65536 * d * 4,
        "copy": 2.0 * src.nbytes, "copy-2": 2.0 * src.nbytes, "copy-3": 2.0 * src.nbytes,
        "decode-gqa": 2.0 * 4 * 65536 * d * 4,
        "kv-f32": 1.0, "kv-i8": float(KV_I8_CALLS),  # one new token per call: rates in tokens/s
    }
    print(f"attnscale {attnscale.version()} ({attnscale.git_hash()}), target {attnscale.cpu_target()}, "
          f"{T} threads, {a.rounds} interleaved rounds; load average {load0[0]:.2f} before, {load1[0]:.2f} after")
    print(f"OpenBLAS sgemm on its {openblas_core_note()}")
    if amx:
        print("bf16 products on AMX: bf16-peak and bf16-peak-2 are the AMX tdpbf16ps loop")
    elif widened:
        print("bf16 products widened to float32: bf16-peak and bf16-peak-2 are the FMA loop")
    print(f"{'measured':<15}{'best ms':>10}{'rate':>10}  unit (rate from the best time)")
    for name in fns:
        unit = ("GB/s" if name in ("decode", "copy", "copy-2", "copy-3", "decode-gqa")
                else "tok/s" if name.startswith("kv-") else "GFLOP/s")
        scale = 1.0 if unit == "tok/s" else 1e-9
        print(f"{name:<15}{min(times[name]) * 1e3:>10.2f}{work[name] / min(times[name]) * scale:>10.1f}  {unit}")

    def ratio(num, den, t=times):
        # Rate of `num` over rate of `den` (time of den over time of num for equal work), per round:
        # the two were timed seconds apart, under the same load. The median over rounds is reported.
        per_round = sorted((work[num] / tn) / (work[den] / td) for tn, td in zip(t[num], t[den]))
        return statistics.median(per_round), per_round[0], per_round[-1]

    def rates(name):
        return [work[name] / t for t in times[name]]

    def limit_kind(name):  # "copy-2" and "copy-3" are timings of "copy"
        return re.sub(r"-\d+$", "", name)

    def limit_median(limit):  # every timing of that limit over the run
        return statistics.median(r for other in fns if limit_kind(other) == limit_kind(limit) for r in rates(other))

    def bracketed(num, before, after):
        # `num`'s rate over the mean of its limit's two timings around it, per round; the rounds in
        # which those two agree within STEADY_TOLERANCE and neither is under SLOW_SHARE of the
        # limit's median over the run ("steady"), else every round (0 steady).
        median = limit_median(before)
        per_round, steady = [], []
        for rn, rb, ra in zip(rates(num), rates(before), rates(after)):
            per_round.append(rn / (0.5 * (rb + ra)))
            if abs(ra - rb) <= STEADY_TOLERANCE * max(ra, rb) and min(ra, rb) >= SLOW_SHARE * median:
                steady.append(per_round[-1])
        kept = sorted(steady or per_round)
        return statistics.median(kept), kept[0], kept[-1], f"{len(steady)}/{len(per_round)}"

    def speedup(slow, fast, t=times):
        per_round = sorted(ts / tf for ts, tf in zip(t[slow], t[fast]))
        return statistics.median(per_round), per_round[0], per_round[-1]

    goals = [
        ("fp32 fwd N=4096 / fp32 peak", bracketed("fwd", "fp32-peak", "fp32-peak-2"), 0.88),
        ("fp32 bwd N=4096 / fp32 peak", bracketed("bwd", "fp32-peak-2", "fp32-peak-3"), 0.75),
        (f"bf16 fwd N=4096 / {bf16_peak_name}", bracketed("fwd-bf16", "bf16-peak", "bf16-peak-2"), None if amx else 0.75),
        (f"bf16 bwd N=4096 / {bf16_peak_name}", bracketed("bwd-bf16", "bf16-peak-2", "bf16-peak-3"),
         None if amx else 0.6),
        ("decode Nkv=65536 / copy", bracketed("decode", "copy", "copy-2"), 0.90),
        ("GQA decode 32/4 heads / copy", bracketed("decode-gqa", "copy-2", "copy-3"), 0.90),
        ("int8 / f32 KV decode tokens/s", ratio("kv-i8", "kv-f32"), 3.0),
        ("fp32 fwd N=4096 / sgemm", ratio("fwd", "sgemm"), None),
        ("fp32 fwd N=4096 / torch SDPA", ratio("fwd", "torch-sdpa"), 2.0),
        (f"{T} threads / 1 thread (fwd)", speedup("fwd-1thread", "fwd"), 1.9),
        (f"  control: sgemm {T} threads / 1", speedup("sgemm-1thread", "sgemm"), None),
        (f"  control: FMA loop {T} threads / 1", ratio("fp32-peak-3", "fp32-peak-1thread"), None),
        (f"  fwd CPU time, 1 thread / {T}", speedup("fwd-1thread", "fwd", cpus), None),
        ("fp32 bwd N=4096 / sgemm", ratio("bwd", "sgemm"), None),
        ("bf16 fwd N=4096 / torch bf16 mm", ratio("fwd-bf16", "torch-bf16-mm"), None),
        ("causal speedup N=4096 (time)", speedup("fwd", "fwd-causal"), 1.8),
        ("causal speedup N=4096 bwd (time)", speedup("bwd", "bwd-causal"), 1.85),
        (f"{T} threads / 1 thread (bwd)", speedup("bwd-1thread", "bwd"), 1.9),
    ]
    print(f"{'goal':<34}{'median':>8}{'min':>8}{'max':>8}{'target':>8}{'met':>5}{'steady':>8}"
          "  (median of the per-round ratios; steady: rounds counted of a limit's)")
    for name, (med, lo, hi, *steady), target in goals:
        print(f"{name:<34}{med:>8.3f}{lo:>8.3f}{hi:>8.3f}{'' if target is None else f'{target:>8.2f}':>8}"
              f"{'' if target is None else ('yes' if med >= target else 'no'):>5}{steady[0] if steady else '':>8}")


if __name__ == "__main__":
    sys.exit(main())
