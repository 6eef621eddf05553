#!/usr/bin/python3
"""One table: attnscale against PyTorch (1.13, CPU) and the machine's ceilings, all measured in one run.

Runs `attnscale bench --format csv` (our rows and the machine's limits: fp32 and bf16 peak, copy bandwidth,
OpenBLAS sgemm 2048^3), then times in
this process, with the same thread count: torch bf16 matmul 2048^3 (the bf16 ceiling),
torch.nn.functional._scaled_dot_product_attention, and torch's matmul-softmax-matmul composition,
on the same shapes. Ratios: ours / the row's limit (from the bench), ours / torch SDPA, ours / composition; bf16 rows / bf16 matmul.

    /usr/bin/python3 bench/compare.py --bin build/bin/attnscale [--quick] [--threads 2] [--memory]
"""
import argparse
import csv
import io
import math
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from openblas_kernels import openblas_core_note, restart_with_openblas_core


def best_seconds(fn, reps=5, budget=3.0):
    fn()
    best, spent = math.inf, 0.0
    for r in range(reps):
        t0 = time.perf_counter()
        fn()
        s = time.perf_counter() - t0
        best, spent = min(best, s), spent + s
        if spent > budget:
            break
    return best


def visible_pairs(n, causal):
    return n * (n + 1) / 2 if causal else float(n) * n


def torch_attention(H, N, d, causal, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(1, H, N, d, generator=g, dtype=torch.float32).to(dtype) * 2 - 1 for _ in range(3))
    mask = torch.ones(N, N, dtype=torch.bool).tril() if causal else None

    def sdpa():
        with torch.no_grad():
            F._scaled_dot_product_attention(q, k, v, None, 0.0, causal)

    def composition():
        with torch.no_grad():
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            torch.softmax(s, dim=-1) @ v

    return best_seconds(sdpa), best_seconds(composition)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/attnscale")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("ATTNSCALE_THREADS", os.cpu_count())))
    ap.add_argument("--memory", action="store_true", help="also run the N=65536 memory case under /usr/bin/time -v")
    a = ap.parse_args()
    restart_with_openblas_core()  # torch's products are OpenBLAS's: both sides on the CPU's own kernels
    torch.set_num_threads(a.threads)
    cmd = [a.bin, "bench", "--format", "csv", "--threads", str(a.threads)] + (["--quick"] if a.quick else [])
    rows = list(csv.DictReader(io.StringIO(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)))
    limits = {r["case"]: float(r["rate"]) for r in rows if r["limit"] == "" and r["unit"] != "us/call" and r["threads"] == "0"}
    sgemm = limits["sgemm"]
    n = 2048
    x, y = torch.rand(n, n).bfloat16(), torch.rand(n, n).bfloat16()
    bf16_mm = 2.0 * n**3 / best_seconds(lambda: x @ y) * 1e-9
    print(f"attnscale vs PyTorch {torch.__version__} on {a.threads} threads; best of up to 5 runs each; "
          f"OpenBLAS on its {openblas_core_note()}")
    # The bench times the bf16 dot loop only where a row goes against it: not where the bf16 products
    # run on AMX (their rows go against amx-peak).
    bf16 = "".join(f"{label} {limits[key]:.1f} GFLOP/s, " for key, label in (("bf16-peak", "bf16 peak"),
                                                                             ("amx-peak", "AMX peak")) if key in limits)
    print(f"ceilings: fp32 peak {limits['fp32-peak']:.1f} GFLOP/s, {bf16}"
          f"OpenBLAS sgemm 2048^3 {sgemm:.1f} GFLOP/s, torch bf16 matmul 2048^3 {bf16_mm:.1f} GFLOP/s, "
          f"copy {limits['copy']:.1f} GB/s, cache-resident copy {limits['copy-cache']:.1f} GB/s")
    head = f"{'case':<12}{'H':>3}{'N/Nkv':>7}{'d':>5} {'mask':<7}{'dtype':<6}{'thr':>4}{'ours':>10} {'unit':<8}" \
           f"{'/limit':>8}{'/bf16mm':>8}{'torch sdpa':>11}{'/sdpa':>7}{'torch mm-sm-mm':>15}{'/comp':>7}"
    print(head)
    for r in rows:
        if r["limit"] == "":
            continue
        H, N, d, causal = int(r["H"]), int(r["Nkv"]), int(r["d"]), r["causal"] == "1"
        ours = float(r["rate"])
        sd = comp = "" 
        ratio_sd = ratio_comp = ""
        if r["case"] == "fwd":
            flops = 4.0 * H * visible_pairs(N, causal) * d
            t_sdpa, t_comp = torch_attention(H, N, d, causal)
            sd, comp = f"{flops / t_sdpa * 1e-9:.1f}", f"{flops / t_comp * 1e-9:.1f}"
            ratio_sd, ratio_comp = f"{ours / (flops / t_sdpa * 1e-9):.2f}", f"{ours / (flops / t_comp * 1e-9):.2f}"
        vs_sgemm = f"{float(r['ratio']):.3f}" + {"copy": "c", "copy-cache": "L", "fwd-1thread": "x", "bwd-1thread": "x", "fma-1thread": "x"}.get(r["limit"], "")
        vs_bf16 = f"{ours / bf16_mm:.3f}" if r["dtype"] == "bf16" else ""
        print(f"{r['case']:<12}{H:>3}{N:>7}{d:>5} {'causal' if causal else 'none':<7}{r['dtype']:<6}{int(r['threads']):>4}"
              f"{ours:>10.1f} {r['unit']:<8}{vs_sgemm:>8}{vs_bf16:>8}{sd:>11}{ratio_sd:>7}{comp:>15}{ratio_comp:>7}")
    print("/limit: ours over the fp32 or bf16 peak (decode rows over the copy bandwidth, c; over the cache-resident copy, L;")
    print("fwd-, bwd- and peak-scaling over their 1-thread runs, x), medians of `attnscale bench`'s rounds; /bf16mm: over torch bf16 matmul;")
    print("/sdpa, /comp: ours over torch's _scaled_dot_product_attention and matmul-softmax-matmul, same shape;")
    print("fwd-, bwd- and peak-scaling: rate on all threads over rate on 1 thread, the two timed alternately")
    if a.memory:
        p = subprocess.run(["/usr/bin/time", "-v", a.bin, "bench", "--memory-case"], capture_output=True, text=True)
        rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
        io_mib = float(re.search(r"inputs\+outputs ([\d.]+) MiB", p.stdout).group(1))
        print(f"memory case N=65536 d=128 one head fwd+bwd: peak RSS {rss / 1024:.1f} MiB, inputs+outputs {io_mib:.1f} MiB, "
              f"above them {rss / 1024 - io_mib:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
