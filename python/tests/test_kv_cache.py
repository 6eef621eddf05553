"""attnscale.decode over KV caches (float32, bfloat16, float16, int8; contiguous and paged) against a
float64 numpy reference on the values the cache holds, and attnscale.quantize_q8."""
import re

import numpy as np
import pytest

import attnscale


def reference(q, k, v, lens, window=-1, softcap=0.0, slopes=None, starts=None, causal=True, right=-1,
              return_lse=False):
    """float64: out = softmax(t over the visible keys) · V, t = q·Kᵀ/√d (softcap c: c·tanh(t / c);
    ALiBi slopes [B, Hq]: minus slope·|p − j|); k, v [B, Hkv, N, d]. q [B, Hq, d]: one token a
    sequence at its last key; or [B, Hq, Nq, d]: token i of sequence b at key p = len_b − Nq + i.
    A token sees keys from max(starts[b], p − window) (left padding; window −1: none) to its own
    (causal) or `right` past it (−1: to the end). With return_lse, (out, lse)."""
    q4 = q[:, :, None] if q.ndim == 3 else q
    B, Hq, Nq, d = q4.shape
    g = Hq // k.shape[1]
    out = np.zeros((B, Hq, Nq, v.shape[3]))
    lse = np.full((B, Hq, Nq), -np.inf)
    for b in range(B):
        for i in range(Nq):
            pos = lens[b] - Nq + i
            lo = max(0 if starts is None else starts[b], pos - window if window >= 0 else 0)
            hi = pos + 1 if causal else (min(lens[b], pos + 1 + right) if right >= 0 else lens[b])
            for h in range(Hq if hi > lo else 0):
                s = k[b, h // g, lo:hi].astype(np.float64) @ q4[b, h, i].astype(np.float64) / np.sqrt(d)
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if slopes is not None:
                    s = s - slopes[b, h] * np.abs(pos - np.arange(lo, hi))
                p = np.exp(s - s.max())
                out[b, h, i] = p @ v[b, h // g, lo:hi].astype(np.float64) / p.sum()
                lse[b, h, i] = s.max() + np.log(p.sum())
    if q.ndim == 3:
        out, lse = out[:, :, 0], lse[:, :, 0]
    return (out, lse) if return_lse else out


def bf16(x):
    """Round float32 to bfloat16 (nearest even): the bits as attnscale.bfloat16, and the values."""
    bits = x.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.view(attnscale.bfloat16), (rounded.astype(np.uint32) << 16).view(np.float32)


def cache_of(kind, kf, vf):
    """K and V float32 values as a cache of `kind`: (k, v, the values it holds as float32, the keyword
    arguments its scales need)."""
    if kind == "f32":
        return kf, vf, kf, vf, {}
    if kind == "bf16":
        (k, kd), (v, vd) = bf16(kf), bf16(vf)
        return k, v, kd, vd, {}
    if kind == "f16":  # numpy's float16, read as stored
        k, v = kf.astype(np.float16), vf.astype(np.float16)
        return k, v, k.astype(np.float32), v.astype(np.float32), {}
    (k, ks), (v, vs) = attnscale.quantize_q8(kf), attnscale.quantize_q8(vf)
    kd = k.astype(np.float32) * np.repeat(ks, 32, axis=-1)
    vd = v.astype(np.float32) * np.repeat(vs, 32, axis=-1)
    return k, v, kd, vd, dict(k_scales=ks, v_scales=vs)


@pytest.mark.parametrize("kind", ["f32", "bf16", "f16", "i8"])
def test_paged_equals_contiguous_and_matches_reference(kind):
    rng = np.random.default_rng(3)
    B, Hq, Hkv, d, block = 3, 8, 2, 64, 16
    lens = np.array([1, 37, 1100], np.int32)
    N = int(lens.max())
    kf = rng.standard_normal((B, Hkv, N, d), dtype=np.float32)
    vf = rng.standard_normal((B, Hkv, N, d), dtype=np.float32)
    q = rng.standard_normal((B, Hq, d), dtype=np.float32)
    k, v, kd, vd, extra = cache_of(kind, kf, vf)
    out = attnscale.decode(q, k, v, seq_lens=lens, **extra)
    ref = reference(q, kd, vd, lens)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    # The same cache paged: blocks in shuffled order in a [blocks, block, Hkv, d] pool.
    per = -(-N // block)
    order = rng.permutation(B * per + 1).astype(np.int32)
    table = order[: B * per].reshape(B, per)

    def pool(x):
        p = np.zeros((B * per + 1, block, Hkv) + x.shape[3:], x.dtype)
        padded = np.zeros((B, Hkv, per * block) + x.shape[3:], x.dtype)
        padded[:, :, :N] = x
        for b in range(B):
            for i in range(per):
                p[table[b, i]] = padded[b, :, i * block:(i + 1) * block].swapaxes(0, 1)
        return p

    paged_extra = {name: pool(a) for name, a in extra.items()}
    paged = attnscale.decode(q, pool(k), pool(v), block_table=table, seq_lens=lens, **paged_extra)
    assert np.array_equal(paged.view(np.uint32), out.view(np.uint32))


def test_window_lse_and_errors():
    rng = np.random.default_rng(5)
    k = rng.standard_normal((1, 1, 300, 32), dtype=np.float32)
    q = rng.standard_normal((1, 3, 32), dtype=np.float32)
    out, lse = attnscale.decode(q, k, k, window_left=10, return_lse=True)
    ref = reference(q, k, k, [300], window=10)
    assert np.allclose(out, ref, atol=1e-5) and lse.shape == (1, 3)
    with pytest.raises(ValueError, match="k_scales"):
        attnscale.decode(q, k.astype(np.int8), k.astype(np.int8))
    with pytest.raises(TypeError, match="seq_lens"):
        attnscale.decode(q, k, k, seq_lens=np.array([3], np.int64))
    with pytest.raises(ValueError, match="multiple of 32"):
        attnscale.quantize_q8(np.zeros((2, 33), np.float32))
    bad = np.ones((2, 64), np.float32)
    bad[1, 40] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        attnscale.quantize_q8(bad)
    kq, ks = attnscale.quantize_q8(np.ones((0, 64), np.float32))
    assert kq.shape == (0, 64) and ks.shape == (0, 2)
    # Messages name the argument as quantize_q8(x) does, not as the C++ library (src).
    with pytest.raises(ValueError, match=r"^quantize_q8: x: last dimension 48 is not a multiple of 32$"):
        attnscale.quantize_q8(np.ones((2, 48), np.float32))
    # Arguments that take float32 alone say so: not "float32 or float64", then float64 refused.
    kq, ks = attnscale.quantize_q8(k[..., :32].copy())
    for call, message in [
        (lambda: attnscale.quantize_q8(np.ones((2, 64))), "x: dtype must be float32, got float64"),
        (lambda: attnscale.decode(q.astype(np.float64), k, k), "q: dtype must be float32, got float64"),
        (lambda: attnscale.decode(q.astype(np.float16), k, k), "q: dtype must be float32, got float16"),
        (lambda: attnscale.decode(q[..., :32], kq, kq, k_scales=ks.astype(np.float64), v_scales=ks),
         "k_scales: dtype must be float32, got float64"),
    ]:
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            call()
    with pytest.raises(ValueError, match="threads: must be >= 0, got -3"):
        attnscale.decode(q, k, k, threads=-3)
    # A paged cache: a negative length is named as such, a length past the table as not fitting.
    pool = rng.standard_normal((4, 16, 1, 32), dtype=np.float32)
    table = np.array([[0, 1]], np.int32)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = -1: a length must be >= 0"):
        attnscale.decode(q, pool, pool, block_table=table, seq_lens=np.array([-1], np.int32))
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 33 does not fit in 2 blocks of 16"):
        attnscale.decode(q, pool, pool, block_table=table, seq_lens=np.array([33], np.int32))


def test_softcap_and_alibi():
    rng = np.random.default_rng(9)
    B, Hq, Hkv, d = 2, 8, 2, 64
    lens = np.array([700, 1300], np.int32)
    k = rng.standard_normal((B, Hkv, 1300, d), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, 1300, d), dtype=np.float32)
    q = rng.standard_normal((B, Hq, d), dtype=np.float32)
    slopes = rng.uniform(0, 0.05, Hq)
    out = attnscale.decode(q, k, v, seq_lens=lens, softcap=1.5, alibi_slopes=slopes)
    ref = reference(q, k, v, lens, softcap=1.5, slopes=np.broadcast_to(slopes, (B, Hq)))
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    per_batch = attnscale.decode(q, k, v, seq_lens=lens, softcap=1.5, alibi_slopes=np.tile(slopes, (B, 1)))
    assert np.array_equal(per_batch, out)
    with pytest.raises(ValueError, match="softcap: must be a finite number >= 0"):
        attnscale.decode(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match=r"alibi_slopes: expected shape \[8\] or \[2, 8\]"):
        attnscale.decode(q, k, v, alibi_slopes=np.ones(3))


def test_left_padding():
    """seq_starts (FlashAttention's cache_leftpad): keys before a sequence's start are never read
    (NaN there changes nothing), with GQA, a window, int8, and paged == contiguous."""
    rng = np.random.default_rng(11)
    B, Hq, Hkv, d = 3, 8, 2, 64
    lens = np.array([900, 40, 1500], np.int32)
    starts = np.array([100, 40, 1031], np.int32)
    k = rng.standard_normal((B, Hkv, 1500, d), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, 1500, d), dtype=np.float32)
    q = rng.standard_normal((B, Hq, d), dtype=np.float32)
    ref = reference(q, k, v, lens, starts=starts)
    for b in range(B):
        k[b, :, : starts[b]] = np.nan
        v[b, :, : starts[b]] = np.nan
    out, lse = attnscale.decode(q, k, v, seq_lens=lens, seq_starts=starts, return_lse=True)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    assert np.all(out[1] == 0) and np.all(lse[1] == -np.inf)  # start == length: no key
    windowed = attnscale.decode(q, k, v, seq_lens=lens, seq_starts=starts, window_left=850)
    ref_w = reference(q, np.nan_to_num(k), np.nan_to_num(v), lens, window=850, starts=starts)
    assert np.linalg.norm(windowed - ref_w) / np.linalg.norm(ref_w) < 1e-5
    kq, ks = attnscale.quantize_q8(np.nan_to_num(k))
    vq, vs = attnscale.quantize_q8(np.nan_to_num(v))
    q8 = attnscale.decode(q, kq, vq, k_scales=ks, v_scales=vs, seq_lens=lens, seq_starts=starts)
    kd, vd = kq * np.repeat(ks, 32, axis=-1), vq * np.repeat(vs, 32, axis=-1)
    ref_q8 = reference(q, kd, vd, lens, starts=starts)
    assert np.linalg.norm(q8 - ref_q8) / np.linalg.norm(ref_q8) < 1e-5
    # Paged, one block per 100 keys: the same bits.
    block, per = 100, 15
    table = np.arange(B * per, dtype=np.int32).reshape(B, per)
    pool_k = k.reshape(B, Hkv, per, block, d).transpose(0, 2, 3, 1, 4).reshape(B * per, block, Hkv, d)
    pool_v = v.reshape(B, Hkv, per, block, d).transpose(0, 2, 3, 1, 4).reshape(B * per, block, Hkv, d)
    paged = attnscale.decode(q, pool_k, pool_v, block_table=table, seq_lens=lens, seq_starts=starts)
    assert np.array_equal(paged.view(np.uint32), out.view(np.uint32))
    with pytest.raises(ValueError, match=r"seq_starts\[1\] = 41 is outside 0..40"):
        attnscale.decode(q, k, v, seq_lens=lens, seq_starts=np.array([0, 41, 0], np.int32))
    with pytest.raises(TypeError, match="seq_starts"):
        attnscale.decode(q, k, v, seq_lens=lens, seq_starts=starts.astype(np.int64))


def test_several_new_tokens():
    """q [B, Hq, Nq, d]: the sequence's last Nq keys are the new tokens, token i at key len - Nq + i
    seeing keys up to its own (causal), up to window_right past it, or all; ALiBi measured from each
    token's own key; a strided q (FlashAttention's [B, Nq, H, d] transposed) as it lies."""
    rng = np.random.default_rng(13)
    B, Hq, Hkv, Nq, d = 2, 8, 2, 4, 64
    lens = np.array([3, 1200], np.int32)  # the first shorter than Nq: its first row sees no key
    k = rng.standard_normal((B, Hkv, 1200, d), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, 1200, d), dtype=np.float32)
    q = rng.standard_normal((B, Nq, Hq, d), dtype=np.float32).transpose(0, 2, 1, 3)  # [B, Hq, Nq, d] view
    slopes = rng.uniform(0, 0.05, (B, Hq))
    for causal, right in ((True, -1), (False, -1), (False, 1)):
        out, lse = attnscale.decode(q, k, v, seq_lens=lens, causal=causal, window_right=right, alibi_slopes=slopes,
                                    return_lse=True)
        assert out.shape == (B, Hq, Nq, d) and lse.shape == (B, Hq, Nq)
        for i in range(Nq):
            # Row i alone: a cache cut at its own key (causal) or right keys past it, with ALiBi from
            # its own key.
            cut = np.maximum(lens - Nq + i + 1, 0) if causal else np.minimum(lens, lens - Nq + i + 1 + right) if right >= 0 else lens
            ref = np.zeros((B, Hq, d))
            for b in range(B):
                pos = lens[b] - Nq + i
                s = np.einsum("hjd,hd->hj", np.repeat(k[b], Hq // Hkv, 0)[:, : cut[b]].astype(np.float64),
                              q[b, :, i].astype(np.float64)) / np.sqrt(d)
                s -= slopes[b][:, None] * np.abs(pos - np.arange(cut[b]))[None, :]
                if cut[b]:
                    p = np.exp(s - s.max(1, keepdims=True))
                    ref[b] = np.einsum("hj,hjd->hd", p, np.repeat(v[b], Hq // Hkv, 0)[:, : cut[b]]) / p.sum(1, keepdims=True)
            assert np.abs(out[:, :, i] - ref).max() < 1e-5, (causal, i)
        if causal:
            assert np.all(out[0, :, 0] == 0) and np.all(lse[0, :, 0] == -np.inf)  # key -1: none
    with pytest.raises(ValueError, match="q: no query row"):
        attnscale.decode(np.zeros((B, Hq, 0, d), np.float32), k, v)
    with pytest.raises(ValueError, match="window_right"):
        attnscale.decode(q, k, v, seq_lens=lens, window_right=2)  # causal by default


def test_bf16_products():
    """compute='bf16' over a bfloat16 cache: GQA within the bf16 rule (1e-2 relative of float64 on the
    cache's values), paged bits equal to contiguous; float32 caches and compute='native' keep the
    float32 products' bits; a bad value is named."""
    rng = np.random.default_rng(11)
    B, Hq, Hkv, d, block = 2, 16, 2, 128, 16
    lens = np.array([1537, 70], np.int32)
    N = int(lens.max())
    (k, kd), (v, vd) = (bf16(rng.standard_normal((B, Hkv, N, d), dtype=np.float32)) for _ in range(2))
    q = rng.standard_normal((B, Hq, d), dtype=np.float32)
    out = attnscale.decode(q, k, v, seq_lens=lens, compute="bf16")
    ref = reference(q, kd, vd, lens)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-2
    native = attnscale.decode(q, k, v, seq_lens=lens)
    assert np.array_equal(native, attnscale.decode(q, k, v, seq_lens=lens, compute="native"))
    per = -(-N // block)
    table = np.arange(B * per, dtype=np.int32).reshape(B, per)[:, ::-1].copy()
    pool = np.zeros((B * per, block, Hkv, d), np.uint16)
    for b in range(B):
        for i in range(per):
            part = k.view(np.uint16)[b, :, i * block:(i + 1) * block]
            pool[table[b, i], : part.shape[1]] = part.swapaxes(0, 1)
    vpool = np.zeros_like(pool)
    for b in range(B):
        for i in range(per):
            part = v.view(np.uint16)[b, :, i * block:(i + 1) * block]
            vpool[table[b, i], : part.shape[1]] = part.swapaxes(0, 1)
    paged = attnscale.decode(q, pool.view(attnscale.bfloat16), vpool.view(attnscale.bfloat16), block_table=table,
                             seq_lens=lens, compute="bf16")
    assert np.array_equal(paged.view(np.uint32), out.view(np.uint32))
    f32 = attnscale.decode(q, kd, vd, seq_lens=lens)
    assert np.array_equal(f32, attnscale.decode(q, kd, vd, seq_lens=lens, compute="bf16"))
    with pytest.raises(ValueError, match="compute: expected 'native' or 'bf16', got 'fp8'"):
        attnscale.decode(q, k, v, compute="fp8")
    with pytest.raises(TypeError, match="compute"):
        attnscale.decode(q, k, v, compute=1)


def test_random_option_combinations_match_reference():
    """200 calls drawn from a fixed seed over every cache type, GQA groups 1-16, awkward dims, one or
    several new tokens, windows on both sides, left padding, softcap, ALiBi, both compute modes and
    thread counts: out and lse against float64 on the cache's values (the bf16 products within
    2e-2 of the output's scale, the rest 2e-5)."""
    rng = np.random.default_rng(2026)
    for case in range(200):
        B, Hkv, g = int(rng.integers(1, 4)), int(rng.choice([1, 2, 3])), int(rng.choice([1, 2, 3, 5, 8, 16]))
        kind = str(rng.choice(["f32", "bf16", "f16", "i8"]))
        dk = int(rng.choice([32, 64, 128] if kind == "i8" else [1, 5, 8, 33, 64, 72, 128]))
        dv = int(rng.choice([32, 64, 128] if kind == "i8" else [1, 7, 32, 40, 64, 96]))
        Nq, Nmax = int(rng.choice([1, 1, 2, 3, 5])), int(rng.choice([1, 3, 17, 64, 65, 200, 1025]))
        lens = rng.integers(0, Nmax + 1, B).astype(np.int32)
        lens[0] = Nmax
        starts = (rng.integers(0, 2, B) * rng.integers(0, np.maximum(lens, 1))).astype(np.int32)
        causal = bool(rng.random() < 0.7)
        left, right = int(rng.choice([-1, -1, 0, 1, 7, 100])), -1 if causal else int(rng.choice([-1, 0, 1, 5]))
        cap = float(rng.choice([0.0, 0.0, 1.5]))
        slopes = rng.uniform(0, 0.05, (B, Hkv * g)) if rng.random() < 0.25 else None
        compute, threads = str(rng.choice(["native", "bf16"])), int(rng.choice([0, 1, 2]))
        kf = rng.standard_normal((B, Hkv, Nmax, dk), dtype=np.float32)
        vf = rng.standard_normal((B, Hkv, Nmax, dv), dtype=np.float32)
        k, v, kd, vd, extra = cache_of(kind, kf, vf)
        q = rng.standard_normal((B, Hkv * g, Nq, dk), dtype=np.float32)
        if slopes is not None:
            extra["alibi_slopes"] = slopes
        out, lse = attnscale.decode(q, k, v, seq_lens=lens, seq_starts=starts, causal=causal, window_left=left,
                                    window_right=right, softcap=cap, threads=threads, compute=compute,
                                    return_lse=True, **extra)
        ref, ref_lse = reference(q, kd, vd, lens, window=left, softcap=cap, slopes=slopes, starts=starts,
                                 causal=causal, right=right, return_lse=True)
        tol = 2e-2 if compute == "bf16" and kind == "bf16" else 2e-5
        what = (case, kind, B, Hkv, g, dk, dv, Nq, lens.tolist(), starts.tolist(), causal, left, right, cap, compute)
        assert np.abs(out - ref).max() <= tol * max(1.0, np.abs(ref).max()), what
        assert np.array_equal(np.isinf(lse), np.isinf(ref_lse)), what
        seen = np.isfinite(ref_lse)
        assert np.abs(lse[seen] - ref_lse[seen]).max(initial=0) <= 10 * tol * (1 + np.abs(ref_lse[seen]).max(initial=0)), what


def test_quantize_q8_reads_any_strides(rng):
    """Rows whose values lie a stride apart (Fortran order, a step, reversed) quantise as their
    contiguous copy does, in place: numpy arrays of any strides, as documented."""
    x = rng.standard_normal((3, 5, 64), dtype=np.float32)
    want_q, want_s = attnscale.quantize_q8(x)
    wide = rng.standard_normal((3, 5, 128), dtype=np.float32)
    wide[..., ::2] = x
    for view in (np.asfortranarray(x), wide[..., ::2], x[..., ::-1]):
        before = attnscale._attnscale._copy_count()
        q, s = attnscale.quantize_q8(view)
        assert attnscale._attnscale._copy_count() == before
        flip = slice(None, None, -1 if view.strides[-1] < 0 else 1)  # reversed rows: reversed blocks
        assert np.array_equal(q, want_q[..., flip]) and np.array_equal(s, want_s[..., flip])
