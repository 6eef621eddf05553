#!/usr/bin/python3
"""attnscale.torch.flash_attn_with_kvcache against attnscale.decode on the same cache, in one process.

FlashAttention's cache layouts, [B, Nkv, Hkv, d] and paged [num_blocks, block_size, Hkv, d] (blocks
shuffled), and the [B, Hkv, Nkv, d] layout attnscale.decode reads one head at a time; one new query
token, and four (speculative decoding, `causal=True`) in one call against four calls of one. Every
function runs once per round, in turn, for several rounds; medians and ranges over rounds, each
row's time also as a multiple of attnscale.decode's on the [B, Hkv, Nkv, d] cache, and bytes of K
and V read per second. The load average is printed before and after.

    /usr/bin/python3 bench/kvcache_dropin.py [--pymod build/python] [--nkv 65536] [--heads 32 --kv-heads 4]
        [--dim 128] [--dtype float32|bfloat16|float16] [--rounds 9]
"""
import argparse
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pymod", default="build/python", help="folder holding the attnscale Python module")
    ap.add_argument("--nkv", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--block", type=int, default=256, help="keys per block of the paged cache")
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    sys.path.insert(0, a.pymod)
    import torch  # noqa: E402

    # The drop-in runs on torch's thread count (python/attnscale/torch_threads.py), attnscale.decode
    # on the library's default, every core: the same count for both, and the drop-in keeps decode's
    # one-thread rule for small calls.
    torch.set_num_threads(os.cpu_count() or 1)
    import attnscale  # noqa: E402
    import attnscale.torch as at  # noqa: E402
    from attnscale.torch_function import cache_to_numpy  # noqa: E402

    N, H, Hkv, d, bs = a.nkv, a.heads, a.kv_heads, a.dim, a.block
    dtype = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    kc, vc = (torch.randn(1, N + bs, Hkv, d, generator=g).to(dtype) for _ in range(2))  # room for new keys
    apart_k, apart_v = (t.transpose(1, 2).contiguous() for t in (kc, vc))  # [1, Hkv, N + bs, d]
    blocks = (N + bs) // bs
    order = torch.randperm(blocks, generator=g)
    kp, vp = (torch.empty(blocks, bs, Hkv, d, dtype=dtype) for _ in range(2))
    kp[order], vp[order] = kc[0].reshape(blocks, bs, Hkv, d), vc[0].reshape(blocks, bs, Hkv, d)
    table = order[None].to(torch.int32)
    lens = torch.full((1,), N, dtype=torch.int32)
    q1 = torch.randn(1, 1, H, d, generator=g).to(dtype)
    q4 = torch.randn(1, 4, H, d, generator=g).to(dtype)
    qd = q1[:, 0].float().numpy()
    ak, av = cache_to_numpy("k", apart_k), cache_to_numpy("v", apart_v)
    ik, iv = cache_to_numpy("k", kc.transpose(1, 2)), cache_to_numpy("v", vc.transpose(1, 2))  # views, no copy
    lens_np = lens.numpy()

    fns = {
        "decode, [B, Hkv, Nkv, d]": lambda: attnscale.decode(qd, ak, av, seq_lens=lens_np),
        "decode, [B, Nkv, Hkv, d]": lambda: attnscale.decode(qd, ik, iv, seq_lens=lens_np),
        "kvcache, Nq = 1": lambda: at.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=lens),
        "kvcache, Nq = 1, paged": lambda: at.flash_attn_with_kvcache(q1, kp, vp, cache_seqlens=lens, block_table=table),
        "kvcache, Nq = 4, causal": lambda: at.flash_attn_with_kvcache(q4, kc, vc, cache_seqlens=lens, causal=True),
        "4 calls of Nq = 1": lambda: [
            at.flash_attn_with_kvcache(q4[:, i : i + 1], kc, vc, cache_seqlens=lens - 3 + i) for i in range(4)
        ],
    }
    for f in fns.values():
        f()
    load0 = os.getloadavg()[0]
    times = {k: [] for k in fns}
    for _ in range(a.rounds):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    load1 = os.getloadavg()[0]
    nbytes = 2 * N * Hkv * d * kc.element_size()
    print(f"attnscale {attnscale.version()} ({attnscale.git_hash()}), target {attnscale.cpu_target()}; Hq = {H}, "
          f"Hkv = {Hkv}, d = {d}, Nkv = {N}, {a.dtype}, paged blocks of {bs}; {a.rounds} rounds; load average "
          f"{load0:.2f} before, {load1:.2f} after")
    base = statistics.median(times["decode, [B, Hkv, Nkv, d]"])
    print(f"{'measured':<28}{'median ms':>10}{'min':>9}{'max':>9}{'x decode':>10}{'GB/s':>8}")
    for name, t in times.items():
        m = statistics.median(t)
        print(f"{name:<28}{m * 1e3:>10.3f}{min(t) * 1e3:>9.3f}{max(t) * 1e3:>9.3f}{m / base:>10.3f}{nbytes / m / 1e9:>8.1f}")


if __name__ == "__main__":
    main()
