"""Soft-capping, ALiBi, sinks, dropout, packed sequences and the gradients w.r.t. sinks and an
additive mask, through attnscale.attention / attention_backward, against the float64 reference
(written from the formulas in src/attention/reference.cc) and against finite differences."""
import numpy as np
import pytest

import attnscale

EXTRAS = {
    "softcap": lambda rng, H: dict(softcap=1.7),
    "alibi": lambda rng, H: dict(alibi_slopes=rng.uniform(0, 1, H)),
    "alibi_per_batch": lambda rng, H: dict(alibi_slopes=rng.uniform(0, 1, (2, H))),
    "sinks": lambda rng, H: dict(sinks=rng.standard_normal(H)),
    "dropout": lambda rng, H: dict(dropout_p=0.3, dropout_seed=5, dropout_offset=2),
    "all": lambda rng, H: dict(softcap=1.5, alibi_slopes=rng.uniform(0, 1, H), sinks=rng.standard_normal(H),
                               dropout_p=0.2, dropout_seed=11),
}
MASKS = [dict(), dict(causal=True), dict(causal="bottom-right", window=(5, None))]


def problem(rng, dtype, Nq, Nkv=71, B=2, Hq=4, Hkv=2, dk=24, dv=13):
    return [rng.standard_normal(s).astype(dtype) for s in ((B, Hq, Nq, dk), (B, Hkv, Nkv, dk), (B, Hkv, Nkv, dv))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_forward_and_backward_match_the_reference(rng, dtype, extra):
    tol = 2e-5 if dtype == np.float32 else 1e-11
    for mask in MASKS:
        for Nq in (1, 37, 130):
            kw = dict(EXTRAS[extra](rng, 4), **mask)
            q, k, v = problem(rng, dtype, Nq)
            out, lse = attnscale.attention(q, k, v, return_lse=True, **kw)
            ref, ref_lse = attnscale.attention(q, k, v, return_lse=True, reference=True, **kw)
            np.testing.assert_allclose(out, ref, rtol=0, atol=tol * 10)
            np.testing.assert_allclose(lse, ref_lse, rtol=tol, atol=tol)
            dout = rng.standard_normal(out.shape).astype(dtype)
            grads = attnscale.attention_backward(q, k, v, out, lse, dout, **kw)
            want = attnscale.attention_backward(q, k, v, None, None, dout, reference=True, **kw)
            for g, w in zip(grads, want):
                np.testing.assert_allclose(g, w, rtol=0, atol=tol * 10 * max(1, np.abs(w).max()))
            if dtype == np.float32 and Nq == 37:  # bf16 products: 8 significant bits
                np.testing.assert_allclose(attnscale.attention(q, k, v, compute="bf16", **kw), ref, rtol=0, atol=5e-2)


def test_decode_path_takes_every_extra(rng):
    # One query row against 5000 keys: the key-split decode path with its merge.
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5000, 64)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5000, 32)).astype(np.float32)
    kw = dict(causal="bottom-right", softcap=3.0, alibi_slopes=rng.uniform(0, 0.01, 8), sinks=rng.standard_normal(8),
              dropout_p=0.5, dropout_seed=3)
    np.testing.assert_allclose(attnscale.attention(q, k, v, **kw), attnscale.attention(q, k, v, reference=True, **kw),
                               rtol=0, atol=1e-6)


def test_gradients_match_finite_differences(rng):
    # Every input with a gradient, sinks and the additive mask included, in float64.
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 7, 5), (2, 2, 9, 5), (2, 2, 9, 3)))
    sinks, bias, dout = rng.standard_normal(4), rng.standard_normal((2, 4, 7, 9)), rng.standard_normal((2, 4, 7, 3))
    kw = dict(causal=True, softcap=1.3, alibi_slopes=rng.uniform(0, 1, 4), dropout_p=0.3, dropout_seed=4)

    def loss(q, k, v, sinks, bias):
        return (attnscale.attention(q, k, v, sinks=sinks, mask=bias, reference=True, **kw) * dout).sum()

    args = [q, k, v, sinks, bias]
    for reference in (True, False):
        out, lse = attnscale.attention(q, k, v, sinks=sinks, mask=bias, return_lse=True, **kw)
        grads = attnscale.attention_backward(q, k, v, out, lse, dout, sinks=sinks, mask=bias, return_dsinks=True,
                                             return_dbias=True, reference=reference, **kw)
        assert len(grads) == 5
        for a, g in zip(args, grads):
            assert g.shape == a.shape
            for idx in [tuple(rng.integers(0, s) for s in a.shape) for _ in range(5)]:
                plus, minus = [x.copy() for x in args], [x.copy() for x in args]
                i = next(n for n, x in enumerate(args) if x is a)
                plus[i][idx] += 1e-6
                minus[i][idx] -= 1e-6
                assert abs((loss(*plus) - loss(*minus)) / 2e-6 - g[idx]) < 1e-7


def test_dropout_mask_regenerates_and_averages_out(rng):
    q, k, v = problem(rng, np.float64, 9, Nkv=12)
    kw = dict(dropout_p=0.4, dropout_seed=7, dropout_offset=1)
    # The same (seed, offset) gives the same bits, any thread count; another offset another mask.
    a = attnscale.attention(q, k, v, threads=1, **kw)
    np.testing.assert_array_equal(a, attnscale.attention(q, k, v, threads=3, **kw))
    assert not np.allclose(a, attnscale.attention(q, k, v, **dict(kw, dropout_offset=2)))
    # E[out] over seeds is the output without dropout: 400 seeds, error ~ 1/sqrt(400) of the spread.
    plain = attnscale.attention(q, k, v)
    mean = np.mean([attnscale.attention(q, k, v, dropout_p=0.4, dropout_seed=s) for s in range(400)], axis=0)
    assert np.abs(mean - plain).max() < 0.15
    assert np.abs(mean - plain).mean() < 0.03
    # The kept fraction is 1 - p: probs of v = identity rows read the mask back.
    eye = np.broadcast_to(np.eye(12), (2, 2, 12, 12))
    probs = attnscale.attention(q, k, np.ascontiguousarray(eye), return_probs=True)[1]
    dropped = attnscale.attention(q, k, np.ascontiguousarray(eye), **kw)
    kept = dropped != 0
    np.testing.assert_allclose(dropped[kept], probs[kept] / 0.6, rtol=1e-12)
    assert abs(kept.mean() - 0.6) < 0.05
    # probs under dropout: the softmax before dropout, dropped pairs negated (FlashAttention's
    # S_dmask), the same on the fast path, the float64 reference and the bf16 path.
    fast = attnscale.attention(q, k, np.ascontiguousarray(eye), return_probs=True, **kw)[1]
    ref = attnscale.attention(q, k, np.ascontiguousarray(eye), return_probs=True, reference=True, **kw)[1]
    np.testing.assert_array_equal(np.signbit(fast), ~kept)
    np.testing.assert_array_equal(np.signbit(ref), ~kept)
    np.testing.assert_allclose(np.abs(fast), probs, rtol=1e-12)
    np.testing.assert_allclose(ref, fast, rtol=1e-12)
    q32, k32 = q.astype(np.float32), k.astype(np.float32)
    bf = attnscale.attention(q32, k32, np.ascontiguousarray(eye, np.float32), return_probs=True, compute="bf16", **kw)[1]
    np.testing.assert_array_equal(np.signbit(bf), ~kept)


def test_packed_sequences_equal_a_loop_over_sequences(rng):
    cq, ck = [0, 3, 3, 20, 21], [0, 5, 9, 9, 40]  # an empty query set and an empty key set
    Hq, Hkv = 4, 2
    q, k, v = rng.standard_normal((Hq, 21, 16)), rng.standard_normal((Hkv, 40, 16)), rng.standard_normal((Hkv, 40, 8))
    slopes, sinks = rng.uniform(0, 1, (4, Hq)), rng.standard_normal(Hq)
    kw = dict(causal="bottom-right", softcap=2.0, sinks=sinks, dropout_p=0.25, dropout_seed=9)
    out, lse = attnscale.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, alibi_slopes=slopes, return_lse=True, **kw)
    dout = rng.standard_normal(out.shape)
    dq, dk, dv, dsinks = attnscale.attention_backward(q, k, v, out, lse, dout, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                                      alibi_slopes=slopes, return_dsinks=True, **kw)
    dsinks_sum = np.zeros(Hq)
    for s in range(4):
        a, b, c, d = cq[s], cq[s + 1], ck[s], ck[s + 1]
        if a == b:
            continue
        if c == d:  # no key: out 0, lse = the sink
            assert (out[:, a:b] == 0).all() and (dq[:, a:b] == 0).all()
            np.testing.assert_allclose(lse[:, a:b], np.broadcast_to(sinks[:, None], (Hq, b - a)))
            continue
        # Sequence s is batch entry s of its own problem (the dropout mask is indexed by it).
        Q, K, V, DO = (np.zeros((s + 1, x.shape[0], n, x.shape[2])) for x, n in ((q, b - a), (k, d - c), (v, d - c),
                                                                              (dout, b - a)))
        Q[s], K[s], V[s], DO[s] = q[:, a:b], k[:, c:d], v[:, c:d], dout[:, a:b]
        o, l = attnscale.attention(Q, K, V, alibi_slopes=np.tile(slopes[s], (s + 1, 1)), return_lse=True, **kw)
        np.testing.assert_array_equal(o[s], out[:, a:b])
        np.testing.assert_array_equal(l[s], lse[:, a:b])
        g = attnscale.attention_backward(Q, K, V, o, l, DO, alibi_slopes=np.tile(slopes[s], (s + 1, 1)),
                                         return_dsinks=True, **kw)
        np.testing.assert_array_equal(g[0][s], dq[:, a:b])
        np.testing.assert_array_equal(g[1][s], dk[:, c:d])
        np.testing.assert_array_equal(g[2][s], dv[:, c:d])
        dsinks_sum += g[3]
    np.testing.assert_allclose(dsinks, dsinks_sum, rtol=1e-12, atol=1e-15)
    ref = attnscale.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, alibi_slopes=slopes, reference=True, **kw)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)


def test_bad_extras_name_the_argument(rng):
    q, k, v = problem(rng, np.float32, 5)
    for kw, msg in [(dict(softcap=-1.0), r"^softcap: must be a finite number >= 0 \(0: off\), got -1$"),
                    (dict(dropout_p=-1e-9), r"^dropout: p must be in \[0, 1\), got -1e-09$"),
                    (dict(alibi_slopes=np.ones(3)), r"^alibi_slopes: expected shape \[4\] or \[2, 4\], got \[3\]$"),
                    (dict(sinks=np.ones((2, 4))), r"^sinks: expected shape \[4\], got \[2, 4\]$"),
                    (dict(sinks=np.array([0, 0, np.nan, 0])), r"^sinks: values must be finite"),
                    (dict(dropout_p=1.0), r"^dropout: p must be in \[0, 1\), got 1"),
                    (dict(cu_seqlens_q=[0, 5], cu_seqlens_k=[0, 71]), r"^q: packed sequences"),
                    (dict(cu_seqlens_q=[0, 5]), r"^cu_seqlens_k: required with cu_seqlens_q$")]:
        with pytest.raises(ValueError, match=msg):
            attnscale.attention(q, k, v, **kw)
    q, k, v = q[0], k[0], v[0]
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: must end at the packed length 71, got 70$"):
        attnscale.attention(q, k, v, cu_seqlens_q=[0, 2, 5], cu_seqlens_k=[0, 3, 70])
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: offsets must not decrease"):
        attnscale.attention(q, k, v, cu_seqlens_q=[0, 3, 2, 5], cu_seqlens_k=[0, 3, 3, 71])
    with pytest.raises(ValueError, match=r"^return_dbias: requires a float \(additive\) mask$"):
        attnscale.attention_backward(q, k, v, None, None, q[..., :13], reference=True, return_dbias=True)
