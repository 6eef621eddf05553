"""attnscale.attention against float64 PyTorch on random shapes, masks, GQA and dtypes."""
import numpy as np
import pytest
import torch

import attnscale
import torch_reference

# Awkward sizes: 1, odd, prime, a power of two and a larger prime.
SIZES = [1, 2, 5, 7, 13, 31, 64, 97]
TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-10, atol=1e-11)}


def random_case(rng, dtype, rank=None):
    """Random q, k, v with B, Hq = group * Hkv, Nq, Nkv, dk, dv drawn from awkward sizes."""
    rank = rank or int(rng.integers(2, 5))
    b, hkv, group = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.choice([1, 2, 3]))
    if rank == 2:
        hkv = group = 1
    nq, nkv = (int(rng.choice(SIZES)) for _ in range(2))
    dk, dv = (int(rng.choice([1, 3, 8, 17, 64])) for _ in range(2))
    lead_q = [b, hkv * group][4 - rank :] if rank > 2 else []
    lead_kv = [b, hkv][4 - rank :] if rank > 2 else []
    q = rng.standard_normal(lead_q + [nq, dk]).astype(dtype)
    k = rng.standard_normal(lead_kv + [nkv, dk]).astype(dtype)
    v = rng.standard_normal(lead_kv + [nkv, dv]).astype(dtype)
    return q, k, v


def check(q, k, v, **options):
    out, lse, probs = attnscale.attention(q, k, v, return_lse=True, return_probs=True, **options)
    ref_out, ref_lse, ref_probs = torch_reference.attention(q, k, v, **options)
    tol = TOL[q.dtype.type]
    assert out.dtype == q.dtype and out.shape == tuple(ref_out.shape)
    np.testing.assert_allclose(out, ref_out.numpy(), **tol)
    np.testing.assert_allclose(probs, ref_probs.numpy(), **tol)
    # lse: equal infinities where every key is masked, close elsewhere.
    np.testing.assert_allclose(lse, ref_lse.numpy(), rtol=tol["rtol"], atol=tol["atol"] * 10)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trial", range(12))
def test_random_shapes_and_options(rng, dtype, trial):
    q, k, v = random_case(rng, dtype)
    options = {}
    choice = trial % 6
    if choice == 1:
        options["causal"] = True
    elif choice == 2:
        options = dict(causal="bottom-right", scale="linear")
    elif choice == 3:
        options = dict(window=(int(rng.integers(0, 4)), int(rng.integers(0, 4))), align="bottom-right")
    elif choice == 4:
        nq, nkv = q.shape[-2], k.shape[-2]
        options = dict(mask=rng.random((nq, nkv)) < 0.7, scale="none", window=(None, 2))
    elif choice == 5:
        nq, nkv = q.shape[-2], k.shape[-2]
        hq = q.shape[-3] if q.ndim > 2 else 1
        additive = rng.standard_normal((1, hq, nq, nkv)).astype(dtype)
        options = dict(mask=additive, scale=float(rng.uniform(0.05, 0.5)), causal="top-left")
    check(q, k, v, **options)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_torch_scaled_dot_product_attention(rng, dtype):
    # torch 1.13's own kernel: scale 1/sqrt(d), bool masks, top-left causal; GQA by repeat_interleave.
    sdpa = torch.nn.functional._scaled_dot_product_attention
    q = rng.standard_normal((3, 6, 29, 24)).astype(dtype)
    k = rng.standard_normal((3, 2, 29, 24)).astype(dtype)
    v = rng.standard_normal((3, 2, 29, 11)).astype(dtype)
    expand = lambda x: torch.from_numpy(x).repeat_interleave(3, dim=1)
    tq, tk, tv = torch.from_numpy(q), expand(k), expand(v)
    tol = TOL[dtype]
    want, _ = sdpa(tq, tk, tv, None, 0.0, False, True)
    np.testing.assert_allclose(attnscale.attention(q, k, v, causal=True), want.numpy(), **tol)
    keep = rng.random((3, 1, 29, 29)) < 0.8
    keep[..., 0] = True  # torch gives NaN for a row with no key; attnscale gives 0 (tested below)
    want, _ = sdpa(tq, tk, tv, torch.from_numpy(keep), 0.0, False, False)
    np.testing.assert_allclose(attnscale.attention(q, k, v, mask=keep), want.numpy(), **tol)


def test_every_option_of_the_scale(rng):
    q, k, v = (rng.standard_normal((2, 9, 16)) for _ in range(3))
    for scale in [None, "none", "sqrt", "linear", 0.3, np.float32(2.0), 3]:
        check(q, k, v, scale=scale)


def test_causal_alignments_differ_when_nq_differs_from_nkv(rng):
    q = rng.standard_normal((4, 8))
    k, v = rng.standard_normal((9, 8)), rng.standard_normal((9, 8))
    top = check(q, k, v, causal="top-left")
    bottom = check(q, k, v, causal="bottom-right")
    assert not np.allclose(top, bottom)
    np.testing.assert_array_equal(top, attnscale.attention(q, k, v, causal=True))


def test_uint8_mask_and_4d_broadcast_mask(rng):
    q, k, v = (rng.standard_normal((2, 3, 7, 5)) for _ in range(3))
    check(q, k, v, mask=(rng.random((7, 7)) < 0.6).astype(np.uint8))
    check(q, k, v, mask=rng.random((2, 1, 7, 7)) < 0.6)
    check(q, k, v, mask=rng.standard_normal((1, 3, 7, 7)))


def test_fully_masked_rows_give_zero_and_minus_infinity(rng):
    q, k, v = (rng.standard_normal((5, 4)) for _ in range(3))
    keep = np.ones((5, 5), dtype=bool)
    keep[2] = False
    out, lse = attnscale.attention(q, k, v, mask=keep, return_lse=True)
    assert np.all(out[2] == 0) and lse[2] == -np.inf
    assert np.all(np.isfinite(np.delete(out, 2, axis=0)))


def test_reference_kernel_agrees(rng):
    q, k, v = random_case(rng, np.float64, rank=4)
    fast = attnscale.attention(q, k, v, causal=True)
    ref = attnscale.attention(q, k, v, causal=True, reference=True)
    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-13)


def test_threads_do_not_change_the_result(rng):
    q, k, v = random_case(rng, np.float32, rank=4)
    one = attnscale.attention(q, k, v, threads=1)
    np.testing.assert_array_equal(one, attnscale.attention(q, k, v, threads=3))


def test_return_values(rng):
    q, k, v = (rng.standard_normal((3, 4)) for _ in range(3))
    assert isinstance(attnscale.attention(q, k, v), np.ndarray)
    out, probs = attnscale.attention(q, k, v, return_probs=True)
    assert probs.shape == (3, 3)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0)
    assert len(attnscale.attention(q, k, v, return_lse=True, return_probs=True)) == 3


def test_bf16_compute_is_close_to_float64(rng):
    # bfloat16 keeps 8 significant bits: q, k, p and v are rounded to 2^-9 relative, so outputs of
    # unit-variance inputs land within a few 1e-3 of the float64 result.
    for _ in range(4):
        q, k, v = random_case(rng, np.float32, rank=4)
        out = attnscale.attention(q, k, v, causal="bottom-right", compute="bf16")
        want, _, _ = torch_reference.attention(q, k, v, causal="bottom-right")
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, want.numpy(), rtol=0, atol=5e-2)
    q64 = q.astype(np.float64)
    np.testing.assert_array_equal(attnscale.attention(q64, q64, q64, compute="bf16"),
                                  attnscale.attention(q64, q64, q64))  # float64 ignores it
    with pytest.raises(ValueError, match=r"^compute: expected 'native' or 'bf16', got 'fp8'$"):
        attnscale.attention(q, q, q, compute="fp8")


def test_merge_partials_equals_attention_over_all_keys(rng):
    q = rng.standard_normal((2, 3, 5, 8))
    k, v = rng.standard_normal((2, 3, 29, 8)), rng.standard_normal((2, 3, 29, 4))
    cuts = [0, 1, 12, 29]
    parts = [attnscale.attention(q, k[..., a:b, :], v[..., a:b, :], return_lse=True) for a, b in zip(cuts, cuts[1:])]
    out, lse = attnscale.merge_partials([p[0] for p in parts], [p[1] for p in parts])
    want_out, want_lse = attnscale.attention(q, k, v, return_lse=True)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    with pytest.raises(ValueError, match=r"^outs: at least one partial result is needed$"):
        attnscale.merge_partials([], [])


@pytest.mark.parametrize("compute", [None, "bf16"])
def test_keys_no_query_sees_may_hold_nan(rng, compute):
    # The unused tail of a preallocated KV cache: 3 queries over 8 keys whose rows 3..7 are NaN.
    q = rng.standard_normal((3, 16)).astype(np.float32)
    k = np.concatenate([rng.standard_normal((3, 16)), np.full((5, 16), np.nan)]).astype(np.float32)
    v = np.concatenate([rng.standard_normal((3, 16)), np.full((5, 16), np.nan)]).astype(np.float32)
    out, lse = attnscale.attention(q, k, v, causal=True, compute=compute, return_lse=True)
    want = attnscale.attention(q, k[:3], v[:3], causal=True, reference=True)
    assert np.allclose(out, want, atol=3e-2 if compute else 1e-6)
    dq, dk, dv = attnscale.attention_backward(q, k, v, out, lse, np.ones_like(out), causal=True)
    assert np.isfinite(dq).all()
    assert (dk[3:] == 0).all() and (dv[3:] == 0).all()
