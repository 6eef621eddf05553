#!/usr/bin/python3
"""The fixed cost of a tiny call through attnscale.torch's drop-ins, two builds of the module side by side.

A call on q, k, v [1, 4, 2, 16] (FlashAttention's [B, N, H, d]; SDPA and attention read the
[B, H, N, d] views of the same tensors, strided) computes almost nothing: its time is the Python
around the kernel. Each round starts one process per build (old first, then new), and each process
times every entry point on one torch thread: per-thread CPU time (time.thread_time) of 2000 calls
(1000 for the one that records a graph), after 200 untimed ones, the median of 5 such runs.
flash_attn_with_kvcache decodes one token over a cache [1, 64, 2, 16] of 40 keys;
flash_attn_varlen_func packs two sequences of 2 and 3 tokens. PyTorch's own
F._scaled_dot_product_attention is timed beside them as a yardstick (the same in both builds).
Printed: for each entry point, the median over the rounds of each build's time (µs a call), its
range, and the median of the per-round ratios new / old with their range, and the load average
before the first and after the last round.

    /usr/bin/python3 bench/dropin_overhead.py --old OLD/build/python --new build/python [--rounds 4]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def one_process():
    """The child (the module on sys.path already): prints one JSON line {entry point: µs a call}."""
    import time

    import torch
    import torch.nn.functional as F

    import attnscale.torch as at

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 2, 16, generator=g) for _ in range(3))
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    qg = q.clone().requires_grad_()
    kc, vc = torch.randn(1, 64, 2, 16, generator=g), torch.randn(1, 64, 2, 16, generator=g)
    q1 = torch.randn(1, 1, 4, 16, generator=g)
    lens = torch.tensor([40], dtype=torch.int32)
    packed, cu = torch.randn(5, 4, 16, generator=g), torch.tensor([0, 2, 5], dtype=torch.int32)

    def timed(call, n=2000):
        for _ in range(200):
            call()
        runs = []
        for _ in range(5):
            start = time.thread_time()
            for _ in range(n):
                call()
            runs.append((time.thread_time() - start) / n * 1e6)
        return statistics.median(runs)

    res = {}
    with torch.no_grad():
        res["flash_attn_func, no_grad"] = timed(lambda: at.flash_attn_func(q, k, v))
        res["flash_attn_func causal, no_grad"] = timed(lambda: at.flash_attn_func(q, k, v, causal=True))
        res["scaled_dot_product_attention, no_grad"] = timed(lambda: at.scaled_dot_product_attention(qh, kh, vh))
        res["attention, no_grad"] = timed(lambda: at.attention(qh, kh, vh))
        res["flash_attn_varlen_func, no_grad"] = timed(lambda: at.flash_attn_varlen_func(packed, packed, packed, cu, cu, 3, 3))
        res["flash_attn_with_kvcache, 1 token"] = timed(lambda: at.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=lens))
    res["flash_attn_func, no operand requires grad"] = timed(lambda: at.flash_attn_func(q, k, v))
    res["scaled_dot_product_attention, idem"] = timed(lambda: at.scaled_dot_product_attention(qh, kh, vh))
    res["flash_attn_func, q requires grad"] = timed(lambda: at.flash_attn_func(qg, k, v), 1000)
    with torch.no_grad():
        res["torch's F._scaled_dot_product_attention"] = timed(
            lambda: F._scaled_dot_product_attention(qh, kh, vh, None, 0.0, False)[0])
    print(json.dumps(res))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="the old build's python directory")
    parser.add_argument("--new", required=True, help="the new build's python directory")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    runs = {"old": [], "new": []}
    loads = [os.getloadavg()]
    for _ in range(args.rounds):
        for name in ("old", "new"):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(args, name)))
            line = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True, capture_output=True,
                                  text=True).stdout
            runs[name].append(json.loads(line))
    loads.append(os.getloadavg())
    print(f"{args.rounds} rounds, load average {' '.join(f'{x:.2f}' for x in loads[0])} before, "
          f"{' '.join(f'{x:.2f}' for x in loads[1])} after; µs a call: median [range]")
    for key in runs["old"][0]:
        old = [r[key] for r in runs["old"]]
        new = [r[key] for r in runs["new"]]
        ratios = [b / a for a, b in zip(old, new)]
        print(f"{key:42s} old {statistics.median(old):6.1f} [{min(old):.1f}-{max(old):.1f}]  "
              f"new {statistics.median(new):6.1f} [{min(new):.1f}-{max(new):.1f}]  "
              f"new/old {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        one_process()
    else:
        main()
