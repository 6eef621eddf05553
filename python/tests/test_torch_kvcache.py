"""attnscale.torch.flash_attn_with_kvcache against FlashAttention's semantics, written out in float64.

The reference rebuilds each sequence's keys from the cache as it was before the call (its rows by
block_table or cache_batch_idx, then the new keys rotated), keeps [cache_leftpad, end) and runs
torch_reference.flash on them: bottom-right diagonal, windows, softcap and ALiBi as in flash_attn_func.
"""
import math
import re

import numpy as np
import pytest
import torch

import attnscale
import attnscale.torch as at
from attnscale import torch_kvcache
import torch_reference


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(4242)


def rotate(x, cos, sin, positions, interleaved):
    """The rotary embedding as a complex product: pair (a, b) -> (a + ib) * (cos + i sin)."""
    x = x.to(torch.float64).clone()
    half = cos.shape[1]
    c, s = cos.double()[positions].unsqueeze(2), sin.double()[positions].unsqueeze(2)
    if interleaved:
        a, b = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
    else:
        a, b = x[..., :half], x[..., half : 2 * half]
    z = torch.complex(a, b) * torch.complex(c, s)
    if interleaved:
        x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2] = z.real, z.imag
    else:
        x[..., :half], x[..., half : 2 * half] = z.real, z.imag
    return x


def sequence_rows(cache, b, n, table=None, batch_idx=None):
    """Sequence b's first n rows of a cache [rows, block, Hkv, d] (paged by table, else batch row)."""
    if table is None:
        return cache[b if batch_idx is None else int(batch_idx[b]), :n]
    bs = cache.shape[1]
    pos = torch.arange(n)
    return cache[table[b][pos // bs].long(), pos % bs]


def reference(q, kc, vc, k=None, v=None, cos=None, sin=None, seqlens=None, batch_idx=None, leftpad=None, table=None,
              interleaved=True, causal=False, window_size=(-1, -1), **flash):
    """(out [B, Nq, H, dv], lse [B, H, Nq]) in float64, from the caches as they were before the call."""
    B, Nq = q.shape[:2]
    n_new = 0 if k is None else k.shape[1]
    outs, lses = [], []
    for b in range(B):
        n = int(seqlens[b]) if seqlens is not None else kc.shape[1]
        kb, vb = sequence_rows(kc, b, n, table, batch_idx).double(), sequence_rows(vc, b, n, table, batch_idx).double()
        qb = q[b : b + 1].double()
        if k is not None:
            knew = k[b : b + 1].double()
            if cos is not None:
                knew = rotate(knew, cos, sin, (n + torch.arange(n_new))[None], interleaved)
                local = causal or window_size != (-1, -1)
                qpos = n + (torch.arange(Nq) if local else torch.zeros(Nq, dtype=torch.long))
                qb = rotate(qb, cos, sin, qpos[None], interleaved)
            kb, vb = torch.cat([kb, knew[0]]), torch.cat([vb, v[b].double()])
        start = 0 if leftpad is None else int(leftpad[b])
        opts = dict(flash)
        if opts.get("alibi_slopes") is not None and opts["alibi_slopes"].dim() == 2:
            opts["alibi_slopes"] = opts["alibi_slopes"][b]
        out, lse = torch_reference.flash(qb, kb[start:][None], vb[start:][None], causal=causal, window_size=window_size,
                                         **opts)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def paged(gen, seqlens, block, Hkv, d, dtype, spare=3):
    """A paged cache holding random rows, its blocks handed out to the sequences in a shuffled order
    (each sequence gets room for its keys plus `spare` more), and its table."""
    need = [(n + spare + block - 1) // block for n in seqlens]
    width, total = max(need), sum(need)
    order = torch.randperm(total + 2, generator=gen)  # two blocks more than needed, never referenced
    table = torch.full((len(seqlens), width), -1, dtype=torch.int32)
    at_ = 0
    for b, m in enumerate(need):
        table[b, :m] = order[at_ : at_ + m].int()
        at_ += m
    kc = torch.randn(total + 2, block, Hkv, d, generator=gen).to(dtype)
    vc = torch.randn(total + 2, block, Hkv, d, generator=gen).to(dtype)
    return kc, vc, table


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


TOL = {torch.float32: 2e-5, torch.float64: 1e-12}

# (B, Nq, Nnew, H, Hkv, d, seqlens, options): one row and several (speculative decoding, chunked
# prefill), GQA and MQA, a sequence shorter than Nq, an empty one, windows, softcap, ALiBi.
CASES = [
    (1, 1, 1, 1, 1, 1, [0], {}),
    (3, 1, 1, 8, 2, 16, [5, 0, 37], {}),
    (2, 1, 0, 4, 4, 8, [13, 1], dict(window_size=(4, -1))),
    (2, 4, 4, 6, 3, 16, [29, 2], dict(causal=True)),
    (3, 5, 2, 4, 1, 8, [11, 0, 3], dict(causal=True)),
    (2, 3, 1, 4, 2, 8, [9, 17], {}),
    (2, 3, 3, 4, 2, 8, [9, 17], dict(window_size=(5, 1))),
    (2, 3, 1, 4, 2, 8, [12, 6], dict(window_size=(-1, 0))),
    (2, 1, 1, 4, 2, 8, [30, 7], dict(softcap=1.5, softmax_scale=1.0)),
    (2, 2, 2, 4, 2, 8, [19, 4], dict(alibi_slopes="per-head", causal=True)),
    (3, 1, 1, 2, 1, 8, [8, 21, 3], dict(alibi_slopes="per-batch")),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c[:7]) for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_matches_flash_attention_semantics(gen, case, dtype, layout):
    B, Nq, Nnew, H, Hkv, d, seqlens, _ = case
    opts = torch_reference.case_options(gen, case)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    if layout == "paged":
        kc, vc, table = paged(gen, seqlens, 7, Hkv, d, dtype, spare=Nnew)
    else:
        kc, vc, table = randn(gen, B, max(seqlens) + Nnew + 2, Hkv, d, dtype=dtype), randn(
            gen, B, max(seqlens) + Nnew + 2, Hkv, d, dtype=dtype), None
    q = randn(gen, B, Nq, H, d, dtype=dtype)
    k, v = (randn(gen, B, Nnew, Hkv, d, dtype=dtype) for _ in range(2)) if Nnew else (None, None)
    want, want_lse = reference(q, kc, vc, k, v, seqlens=lens, table=table, **opts)
    out, lse = at.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table,
                                          return_softmax_lse=True, **opts)
    assert out.shape == (B, Nq, H, d) and out.dtype == dtype and lse.shape == (B, H, Nq)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), want_lse, rtol=tol, atol=tol)  # +inf where a row sees no key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cache_of_more_batch_rows_reads_its_first_ones(gen, dtype):
    """Without cache_batch_idx, sequence b reads cache row b: a cache of more rows than q's batch gives
    the bits of one cut to those rows (decode's views of either)."""
    kc, vc = (torch.randn(4, 9, 2, 8, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(3, 1, 4, 8, generator=gen).to(dtype)
    lens = torch.tensor([5, 9, 1], dtype=torch.int32)
    out, lse = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_softmax_lse=True)
    cut_out, cut_lse = at.flash_attn_with_kvcache(q, kc[:3], vc[:3], cache_seqlens=lens, return_softmax_lse=True)
    assert torch.equal(out, cut_out) and torch.equal(lse, cut_lse)


def test_new_keys_are_written_in_place_and_nothing_else(gen):
    B, Hkv, d, seqlens = 3, 2, 8, [4, 0, 9]
    kc, vc, table = paged(gen, seqlens, 4, Hkv, d, torch.float32, spare=2)
    k0, v0 = kc.clone(), vc.clone()
    k, v = randn(gen, B, 2, Hkv, d), randn(gen, B, 2, Hkv, d)
    at.flash_attn_with_kvcache(randn(gen, B, 1, 4, d), kc, vc, k, v, cache_seqlens=torch.tensor(seqlens), block_table=table)
    written = torch.zeros(kc.shape[:2], dtype=torch.bool)
    for b, n in enumerate(seqlens):
        for t in range(2):
            blk, row = int(table[b, (n + t) // 4]), (n + t) % 4
            assert torch.equal(kc[blk, row], k[b, t]) and torch.equal(vc[blk, row], v[b, t])
            written[blk, row] = True
    assert torch.equal(kc[~written], k0[~written]) and torch.equal(vc[~written], v0[~written])


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_rotary_embedding(gen, interleaved, causal):
    B, Nq, H, Hkv, d, seqlens = 2, 3, 4, 2, 16, [6, 11]
    cos_sin = torch.rand(20, 6, generator=gen) * 2 * math.pi  # rotary_dim 12 of 16
    cos, sin = torch.cos(cos_sin), torch.sin(cos_sin)
    kc, vc = randn(gen, B, 20, Hkv, d), randn(gen, B, 20, Hkv, d)
    q, k, v = randn(gen, B, Nq, H, d), randn(gen, B, Nq, Hkv, d), randn(gen, B, Nq, Hkv, d)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    want, _ = reference(q, kc, vc, k, v, cos, sin, seqlens=lens, interleaved=interleaved, causal=causal)
    out = at.flash_attn_with_kvcache(q, kc, vc, k, v, cos, sin, cache_seqlens=lens, rotary_interleaved=interleaved,
                                     causal=causal)
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
    # The cache holds the rotated keys.
    knew = rotate(k, cos, sin, lens[:, None].long() + torch.arange(Nq)[None], interleaved)
    torch.testing.assert_close(kc[0, 6:9].double(), knew[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("Nq", [1, 2, 4])
def test_cache_batch_idx_and_leftpad(gen, Nq, monkeypatch):
    """Left padding (with cache_batch_idx choosing the rows) runs through attnscale.decode's
    seq_starts, not sequence by sequence: one row, several, and (Nq = 4) a sequence whose start lies
    past the keys every row sees; softcap over several rows; a window and ALiBi with one row;
    windows with a right side over several."""
    B, H, Hkv, d = 3, 4, 2, 8
    kc, vc = randn(gen, 5, 24, Hkv, d), randn(gen, 5, 24, Hkv, d)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    lens = torch.tensor([10, 17, 3], dtype=torch.int32)
    q, k, v = randn(gen, B, Nq, H, d), randn(gen, B, 1, Hkv, d), randn(gen, B, 1, Hkv, d)
    slopes = torch.rand(H, generator=gen) * 0.3
    monkeypatch.setattr(torch_kvcache, "_per_sequence", None)  # decode takes every call here
    options = [dict(causal=False), dict(causal=True), dict(causal=True, softcap=1.5), dict(softcap=0.7)]
    if Nq == 1:
        options += [dict(window_size=(3, -1)), dict(alibi_slopes=slopes, softcap=2.0)]
    else:  # windows with a right side, not causal
        options += [dict(window_size=(2, 1)), dict(window_size=(-1, 2), softcap=1.5)]
    for leftpad in (None, torch.tensor([3, 0, 4], dtype=torch.int32)):
        for opts in options:
            k0, v0 = kc.clone(), vc.clone()
            want, want_lse = reference(q, k0, v0, k, v, seqlens=lens, batch_idx=idx, leftpad=leftpad, **opts)
            out, lse = at.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, cache_batch_idx=idx,
                                                  cache_leftpad=leftpad, return_softmax_lse=True, **opts)
            torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
            torch.testing.assert_close(lse.double(), want_lse, rtol=2e-5, atol=2e-5)
            assert torch.equal(kc[4, 10], k[0, 0]) and torch.equal(kc[1], k0[1])  # row 1 is no sequence's
            kc.copy_(k0), vc.copy_(v0)


@pytest.mark.parametrize("Nq,causal", [(1, False), (4, True), (3, False)])
def test_paged_and_contiguous_give_the_same_bits(gen, Nq, causal):
    B, H, Hkv, d, seqlens, block = 3, 8, 2, 32, [100, 0, 33], 16
    kc, vc, table = paged(gen, seqlens, block, Hkv, d, torch.float32)
    contiguous_k = torch.zeros(B, 128, Hkv, d)
    contiguous_v = torch.zeros(B, 128, Hkv, d)
    for b, n in enumerate(seqlens):
        contiguous_k[b, :n], contiguous_v[b, :n] = sequence_rows(kc, b, n, table), sequence_rows(vc, b, n, table)
    q = randn(gen, B, Nq, H, d)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    a, la = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=causal,
                                       return_softmax_lse=True)
    b_, lb = at.flash_attn_with_kvcache(q, contiguous_k, contiguous_v, cache_seqlens=lens, causal=causal,
                                        return_softmax_lse=True)
    assert torch.equal(a, b_) and torch.equal(la, lb)


def test_bfloat16_and_float16(gen):
    B, Nq, H, Hkv, d, seqlens = 2, 2, 4, 2, 64, [40, 9]
    lens = torch.tensor(seqlens, dtype=torch.int32)
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        kc, vc, table = paged(gen, seqlens, 16, Hkv, d, dtype)
        q, k, v = (randn(gen, B, n, h, d, dtype=dtype) for n, h in ((Nq, H), (1, Hkv), (1, Hkv)))
        want, _ = reference(q, kc, vc, k, v, seqlens=lens, table=table, causal=True)
        out = at.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), want, rtol=0, atol=tol)


def test_float16_cache_is_read_as_stored(gen):
    """One new token over a float16 cache goes to attnscale.decode on the cache itself (no float32
    copy): the same bits as decode called on the float16 arrays, rounded to float16."""
    B, H, Hkv, d, seqlens = 2, 8, 2, 64, [300, 77]
    kc, vc = randn(gen, B, 320, Hkv, d, dtype=torch.float16), randn(gen, B, 320, Hkv, d, dtype=torch.float16)
    q = randn(gen, B, 1, H, d, dtype=torch.float16)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    out = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    direct = attnscale.decode(q[:, 0].float().numpy(), kc.transpose(1, 2).numpy(), vc.transpose(1, 2).numpy(),
                              seq_lens=lens.numpy())
    assert out.dtype == torch.float16
    assert torch.equal(out[:, 0], torch.from_numpy(direct).to(torch.float16))


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_a_window_past_the_cache_is_no_window(gen, layout):
    """FlashAttention's mha_fwd_kvcache sets a window side >= seqlen_k (seqlen_cache; paged:
    max_blocks * block_size) to -1 before anything else, so (seqlen_k, -1) is (-1, -1): q's rotary
    positions too, which a window would move (rows at cache_seqlens + i, not all at cache_seqlens)."""
    B, Nq, H, Hkv, d, seqlens = 2, 3, 4, 2, 8, [5, 9]
    if layout == "paged":
        kc, vc, table = paged(gen, seqlens, 4, Hkv, d, torch.float32, spare=Nq)
        capacity = 4 * table.shape[1]
    else:
        kc, vc, table = randn(gen, B, 16, Hkv, d), randn(gen, B, 16, Hkv, d), None
        capacity = 16
    q, k, v = randn(gen, B, Nq, H, d), randn(gen, B, Nq, Hkv, d), randn(gen, B, Nq, Hkv, d)
    angles = torch.rand(capacity + 4, d // 2, generator=gen) * 2 * math.pi
    cos, sin = torch.cos(angles), torch.sin(angles)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    runs = {}
    for window in ((-1, -1), (capacity, -1), (1000, -1), (-1, capacity), (capacity - 1, -1)):
        kk, vv = kc.clone(), vc.clone()
        runs[window] = at.flash_attn_with_kvcache(q, kk, vv, k, v, cos, sin, cache_seqlens=lens, block_table=table,
                                                  window_size=window, return_softmax_lse=True)
    for window in ((capacity, -1), (1000, -1), (-1, capacity)):
        assert all(torch.equal(a, b) for a, b in zip(runs[window], runs[(-1, -1)])), window
    want, _ = reference(q, kc, vc, k, v, cos, sin, seqlens=lens, table=table)
    torch.testing.assert_close(runs[(-1, -1)][0].double(), want, rtol=2e-5, atol=2e-5)
    # One key less than seqlen_k is a window: q's rows at their own positions.
    want, _ = reference(q, kc, vc, k, v, cos, sin, seqlens=lens, table=table, window_size=(capacity - 1, -1))
    torch.testing.assert_close(runs[(capacity - 1, -1)][0].double(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_a_left_window_alone_gets_seqlen_k_on_its_right(gen, layout):
    """As flash_attn_func's (kernel_window): FlashAttention's set_params_fprop gives (left, -1) a
    right side of seqlen_k, which hides keys from rows more than seqlen_k keys before the last."""
    B, Nq, H, Hkv, d, seqlens = 2, 9, 2, 1, 8, [3, 4]
    if layout == "paged":
        kc, vc, table = paged(gen, seqlens, 2, Hkv, d, torch.float32, spare=0)
        capacity = 2 * table.shape[1]
    else:
        kc, vc, table = randn(gen, B, 4, Hkv, d), randn(gen, B, 4, Hkv, d), None
        capacity = 4
    q, lens = randn(gen, B, Nq, H, d), torch.tensor(seqlens, dtype=torch.int32)
    out, lse = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, window_size=(1, -1),
                                          return_softmax_lse=True)
    want, want_lse = reference(q, kc, vc, seqlens=lens, table=table, window_size=(1, capacity))
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=2e-5, atol=2e-5)
    assert (lse[0, :, 0] == math.inf).all()  # row 0 of sequence 0 sits 8 keys before its last key


def test_a_cache_of_no_key_gives_zero_and_infinite_lse(gen):
    # seqlen_cache = 0 (or a paged cache of no block): every row sees no key, as FlashAttention's.
    q = randn(gen, 2, 3, 4, 8)
    for kc, table in ((randn(gen, 2, 0, 2, 8), None), (randn(gen, 0, 16, 2, 8), torch.zeros(2, 1, dtype=torch.int32))):
        lens = None if table is None else torch.zeros(2, dtype=torch.int32)
        out, lse = at.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=lens, block_table=table,
                                              return_softmax_lse=True)
        assert out.shape == (2, 3, 4, 8) and (out == 0).all()
        assert lse.shape == (2, 4, 3) and (lse == math.inf).all()


def test_whole_cache_without_seqlens(gen):
    kc, vc = randn(gen, 2, 9, 1, 8), randn(gen, 2, 9, 1, 8)
    q = randn(gen, 2, 1, 3, 8)
    want, _ = reference(q, kc, vc)
    torch.testing.assert_close(at.flash_attn_with_kvcache(q, kc, vc).double(), want, rtol=2e-5, atol=2e-5)
    # num_splits changes nothing, a numpy integer included (FlashAttention's binding takes one).
    for splits in (1, 3, np.int64(2)):
        assert torch.equal(at.flash_attn_with_kvcache(q, kc, vc, num_splits=splits), at.flash_attn_with_kvcache(q, kc, vc))


def bad_calls(gen):
    kc, vc = randn(gen, 2, 8, 2, 4), randn(gen, 2, 8, 2, 4)
    q, k, v = randn(gen, 2, 1, 4, 4), randn(gen, 2, 1, 2, 4), randn(gen, 2, 1, 2, 4)
    lens = torch.tensor([3, 7], dtype=torch.int32)
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    cs = torch.ones(4, 2)
    return [
        (dict(q=q[0]), "q: expected a [batch, seqlen, heads, headdim] tensor"),
        (dict(q=q.double()), "q, k_cache, v_cache: expected one dtype"),
        (dict(q=q.long()), "q: dtype must be float32, bfloat16, float16 or float64 (the cache's), got torch.int64"),
        (dict(cache_seqlens=lens, alibi_slopes=torch.ones(4, dtype=torch.int32)), "alibi_slopes: dtype must be float32 (or another float dtype), got torch.int32"),
        (dict(q=randn(gen, 2, 1, 3, 4)), "k_cache: 2 KV heads do not divide q's 3 heads"),
        (dict(k=k), "k, v: pass both"),
        (dict(k=k.long(), v=v, cache_seqlens=lens), "k: dtype must be a float dtype (written as the cache's torch.float32), got torch.int64"),
        (dict(k=k, v=v.bool(), cache_seqlens=lens), "v: dtype must be a float dtype (written as the cache's torch.float32), got torch.bool"),
        (dict(k=k, v=v, cache_seqlens=torch.tensor([3, 8], dtype=torch.int32)), "cache_seqlens[1] = 8 plus 1 new keys: outside 0..8"),
        (dict(k=k, v=v), "cache_seqlens: required with new keys"),
        (dict(cache_seqlens=torch.tensor([3])), "cache_seqlens: expected 2 entries"),
        (dict(block_table=table), "cache_seqlens: required with a paged cache"),
        (dict(cache_seqlens=lens, block_table=torch.tensor([[0], [5]], dtype=torch.int32)), "block_table[1][0] = 5: outside 0..1"),
        (dict(cache_seqlens=lens, cache_batch_idx=torch.tensor([0, 2])), "cache_batch_idx[1] = 2: outside 0..1"),
        (dict(cache_seqlens=lens, cache_batch_idx=torch.tensor([0, 1]), block_table=table), "cache_batch_idx: not supported with a paged cache"),
        (dict(cache_seqlens=lens, cache_leftpad=torch.tensor([4, 0])), "cache_leftpad[0] = 4: outside 0..3"),
        (dict(cache_seqlens=lens, rotary_cos=cs, rotary_sin=cs), "rotary_cos, rotary_sin: apply only with new keys"),
        (dict(k=k, v=v, cache_seqlens=lens, rotary_cos=cs, rotary_sin=cs), "rotary_cos: 4 positions (rows), the keys and queries reach position 7"),
        (dict(k=k, v=v, cache_seqlens=lens, rotary_cos=cs, rotary_sin=cs.int()), "rotary_sin: dtype must be a float dtype, got torch.int32"),
        (dict(cache_seqlens=lens, alibi_slopes=torch.ones(3, 4)), "alibi_slopes: expected (4,) or (2, 4)"),
        (dict(num_splits=-1), "num_splits: expected an int >= 0"),
        (dict(window_size=(1.5, -1)), "window_size: expected (left, right), two ints"),
        (dict(softmax_scale="x"), "softmax_scale: expected a number, got str"),
        (dict(q=q[:0]), "q: batch size must be positive (as in FlashAttention), got q [0, 1, 4, 4]"),
    ], kc, vc, q


def test_bad_arguments_name_themselves_and_leave_the_cache_alone(gen):
    calls, kc, vc, q = bad_calls(gen)
    k0, v0 = kc.clone(), vc.clone()
    for kwargs, message in calls:
        kwargs = dict(kwargs)
        qq = kwargs.pop("q", q)
        with pytest.raises((ValueError, TypeError), match=re.escape(message)):
            at.flash_attn_with_kvcache(qq, kc, vc, **kwargs)
        assert torch.equal(kc, k0) and torch.equal(vc, v0), message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cache_rows_past_the_sequence_are_never_read(gen, dtype):
    # A cache from torch.empty may hold NaN past cache_seqlens and before cache_leftpad: no row reads it.
    kc, vc = torch.full((2, 24, 2, 8), math.nan, dtype=dtype), torch.full((2, 24, 2, 8), math.nan, dtype=dtype)
    lens, pad = torch.tensor([9, 17], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    for b, (s, n) in enumerate(zip(pad.tolist(), lens.tolist())):
        kc[b, s:n], vc[b, s:n] = randn(gen, n - s, 2, 8, dtype=dtype), randn(gen, n - s, 2, 8, dtype=dtype)
    for Nq, causal in ((1, False), (3, True), (3, False)):
        q = randn(gen, 2, Nq, 4, 8, dtype=dtype)
        out = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_leftpad=pad, causal=causal)
        assert torch.isfinite(out).all()
