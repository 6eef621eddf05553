#!/usr/bin/python3
"""One-row decode over caches 64-byte aligned against the same caches 16 bytes past a line.

NumPy and malloc place large blocks 16 bytes past a 64-byte line, so a numpy cache is rarely
aligned; the library reads such rows line by line (src/attention/kv_stream_row.cc, WordsFromLines).
Each round times both placements in turn (order alternating); the ratio off / aligned is taken
within each round, and its median over rounds is printed with its range, beside the aligned
cache's read rate and the load average.

    /usr/bin/python3 bench/decode_alignment.py [--pymod build/python] [--threads 2] [--rounds 15]
"""
import argparse
import os
import sys
import time

import numpy as np


def placed(shape, dtype, rng, offset, bf16):
    """A C-order array of `shape` whose first byte lies `offset` bytes past a 64-byte line."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = np.empty(nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    a = buf[start:start + nbytes].view(dtype).reshape(shape)
    x = rng.standard_normal(shape, dtype=np.float32)
    a[...] = (x.view(np.uint32) >> 16).astype(np.uint16).view(dtype) if bf16 else x
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pymod", default="build/python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    sys.path.insert(0, args.pymod)
    import attnscale

    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f} before; B = 1, H = 8, one query row a head, threads {args.threads}")
    print(f"{'kv':8s} {'d':>4s} {'Nkv':>6s} {'aligned GB/s':>12s} {'off / aligned':>14s}  range")
    for name in ("float32", "bfloat16"):
        dtype, bf16 = (np.float32, False) if name == "float32" else (attnscale.bfloat16, True)
        for d in (64, 128, 256):
            for nkv, calls in ((2048, 40), (65536, 4)):
                q = placed((1, 8, d), np.float32, rng, 0, False)
                caches = [tuple(placed((1, 8, nkv, d), dtype, rng, off, bf16) for _ in range(2)) for off in (0, 16)]
                times = [[], []]
                for r in range(args.rounds):
                    for which in ((0, 1) if r % 2 == 0 else (1, 0)):
                        k, v = caches[which]
                        attnscale.decode(q, k, v, threads=args.threads)
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            attnscale.decode(q, k, v, threads=args.threads)
                        times[which].append((time.perf_counter() - t0) / calls)
                ratio = np.array(times[1]) / np.array(times[0])
                rate = 2 * caches[0][0].nbytes / np.median(times[0]) / 1e9
                print(f"{name:8s} {d:4d} {nkv:6d} {rate:12.1f} {np.median(ratio):14.3f}  {ratio.min():.3f}-{ratio.max():.3f}",
                      flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
