#!/usr/bin/python3
"""Every figure of docs/distributed.md in one run (`make bench-distributed`), printed as its tables.

    /usr/bin/python3 bench/distributed_figures.py [--build build] [--repeats 3] [--compare-bin OTHER/attnscale]

1. Ring attention at K = 2 (2 ranks x 1 thread) against one process (2 threads) on the same total N
   (N = 2048, d = 128, 4 heads, fp32), full and causal (zig-zag shards), forward and backward:
   build/bin/ring_attention_bench, each invocation 5 timed rounds after a warm-up, the slowest rank
   per round; the one-process and ring invocations alternate, `repeats` times, and each ratio is
   taken within one repeat (median and range over repeats).
2. The fraction of the K/V transfer hidden behind compute, 1 - (wait in the ring) / (bare exchange of
   the same bytes), full mask, with MPI_THREAD_SERIALIZED (the ring's progress thread drives the
   transfer during the compute) and with MPI_THREAD_SINGLE (transfers move between blocks only),
   the two invocations alternating with those of 1, with their forward and backward times.
3. The many-node model: c >= (bytes per value) F / (2 B) with F the block compute rate per rank
   measured in 1 and B for the shared memory exchange measured in 2, 25 GbE and 200 Gb InfiniBand.
4. Sweep speed-up at K = 2: a lab sweep whose point costs grow along the sweep (saturation over
   d = 1 .. 512) and a small training grid with cheap and costly runs (d_head 8 and 64, scalings
   sqrt and additive, 3 learning rates), each as one process with 1 thread and as
   `mpirun -np 2` with 1 thread per rank (wall time including MPI's start-up), alternating; the
   result files are checked byte-identical. --compare-bin times another attnscale binary's
   `mpirun -np 2` run on the same sweeps (e.g. a build with another point scheduler).

The load average is printed before and after each part: figures taken on a busy machine measure the
scheduler as much as the code.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl", "self,vader",
          "--mca", "btl_vader_single_copy_mechanism", "none"]
RING = ["--n", "2048", "--d", "128", "--heads", "4", "--rounds", "5"]
SWEEPS = {
    "lab sweep (saturation, d = 1..512)":
        ["experiment", "saturation", "--d", "1,4,16,64,128,256,512", "--trials", "6000"],
    "training grid (12 runs)":
        ["experiment", "training", "--grid", "quick", "--scaling", "sqrt,additive", "--d-head", "8,64",
         "--seeds", "1", "--torch-check", ""],
}
LINKS = [("25 GbE", 25e9 / 8), ("200 Gb InfiniBand", 200e9 / 8)]


def load():
    return pathlib.Path("/proc/loadavg").read_text().split()[0]


def spread(values, fmt="{:.2f}"):
    s = sorted(values)
    return (fmt + " [" + fmt + ", " + fmt + "]").format(statistics.median(s), s[0], s[-1])


def ring(bench, k, threads, causal, level="serialized"):
    cmd = [*MPIRUN, "-np", str(k), bench, *RING, "--threads", str(threads), "--causal", str(int(causal)),
           "--thread-level", level]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("result "))[len("result "):])


def ring_figures(bench, repeats):
    print(f"## Ring attention, K = 2 against one process (N = 2048, d = 128, 4 heads, fp32); load {load()}")
    print()
    print("| case | one process ms (2 threads) | ring K = 2 ms (2 x 1 thread) | ring / one process |")
    print("| --- | --- | --- | --- |")
    full_ring, single = [], []
    for causal in (False, True):
        one, two = [], []
        for _ in range(repeats):
            one.append(ring(bench, 1, 2, causal))
            two.append(ring(bench, 2, 1, causal))
            if not causal:
                full_ring.append(two[-1])
                single.append(ring(bench, 2, 1, False, "single"))
        for part, key in (("forward", "forward_ms"), ("backward", "backward_ms")):
            ratios = [b[key][0] / a[key][0] for a, b in zip(one, two)]
            name = ("causal (zig-zag)" if causal else "full") + ", " + part
            print(f"| {name} | {spread([a[key][0] for a in one], '{:.1f}')} | {spread([b[key][0] for b in two], '{:.1f}')} "
                  f"| {spread(ratios)} |")
    print(f"\nload {load()}\n")

    print(f"## Transfer hidden behind compute (full mask, K = 2); load {load()}")
    print()
    print("| MPI thread level | forward ms | forward block compute ms | forward wait ms | backward ms | "
          "backward wait ms | bare exchange ms | hidden (forward) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, runs in (("serialized (progress thread)", full_ring), ("single (between blocks only)", single)):
        cells = [spread([r[key][0] for r in runs]) for key in
                 ("forward_ms", "forward_compute_ms", "forward_wait_ms", "backward_ms", "backward_wait_ms",
                  "bare_exchange_ms")]
        print(f"| {name} | " + " | ".join(cells) + f" | {spread([r['hidden'] for r in runs])} |")
    print(f"\nload {load()}\n")

    F = statistics.median(r["flops_per_second"] for r in full_ring)
    B = statistics.median(r["bytes_per_second"] for r in full_ring)
    print("## The many-node model: c >= 4 F / (2 B) (fp32)")
    print()
    print(f"F = {F / 1e9:.1f} GFLOP/s per rank (block compute of the full-mask ring, 1 thread)")
    print()
    print("| link | B GB/s | c >= |")
    print("| --- | --- | --- |")
    for name, b in [("shared memory (measured)", B), *LINKS]:
        print(f"| {name} | {b / 1e9:.2f} | {4 * F / (2 * b):.0f} |")
    print()


def timed(cmd, cwd):
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, check=True)
    return time.perf_counter() - t0


def sweep_figures(binary, repeats, compare):
    print(f"## Sweep speed-up at K = 2 (wall time with start-up, seconds); load {load()}")
    print()
    header = "| sweep | one process, 1 thread | mpirun -np 2, 1 thread each | speed-up |"
    if compare:
        header += " other binary, mpirun -np 2 | its speed-up |"
    print(header)
    print("| --- | --- | --- | --- |" + (" --- | --- |" if compare else ""))
    listed = subprocess.run([binary, "experiment", "--help"], capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in SWEEPS.items():
            if args[1] not in listed:
                print(f"| {name} | (this build has no `{args[1]}` experiment) |")
                continue
            one, two, other = [], [], []
            for r in range(repeats):
                one.append(timed([binary, *args, "--threads", "1", "--out", "one.csv"], tmp))
                two.append(timed([*MPIRUN, "-np", "2", binary, *args, "--threads", "1", "--out", "two.csv"], tmp))
                if compare:
                    other.append(timed([*MPIRUN, "-np", "2", compare, *args, "--threads", "1", "--out", "other.csv"], tmp))
                a, b = pathlib.Path(tmp, "one.csv").read_bytes(), pathlib.Path(tmp, "two.csv").read_bytes()
                if a != b:
                    sys.exit(f"{name}: the mpirun -np 2 file differs from the one-process file")
            line = (f"| {name} | {spread(one)} | {spread(two)} | {spread([x / y for x, y in zip(one, two)])} |")
            if compare:
                line += f" {spread(other)} | {spread([x / y for x, y in zip(one, other)])} |"
            print(line)
    print(f"\nload {load()}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="the build folder (bin/attnscale, bin/ring_attention_bench)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compare-bin", default="", help="another attnscale binary to time on the sweeps")
    ap.add_argument("--only", choices=["ring", "sweeps"], default=None)
    a = ap.parse_args()
    bindir = pathlib.Path(a.build).resolve() / "bin"
    for exe in ("attnscale", "ring_attention_bench"):
        if not (bindir / exe).exists():
            sys.exit(f"--build: {bindir / exe} not found (build with MPI: make benchmarks)")
    print(f"# docs/distributed.md figures; {os.cpu_count()} cores; load average {load()} at start\n")
    if a.only in (None, "ring"):
        ring_figures(str(bindir / "ring_attention_bench"), a.repeats)
    if a.only in (None, "sweeps"):
        sweep_figures(str(bindir / "attnscale"), a.repeats, a.compare_bin)


if __name__ == "__main__":
    main()
