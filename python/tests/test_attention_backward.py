"""attnscale.attention_backward against autograd through the float64 PyTorch reference."""
import numpy as np
import pytest
import torch

import attnscale
import torch_reference
from test_attention_forward import random_case

TOL = {np.float32: dict(rtol=1e-3, atol=1e-4), np.float64: dict(rtol=1e-9, atol=1e-10)}


def reference_grads(q, k, v, dout, **options):
    tq, tk, tv = (torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v))
    out, _, _ = torch_reference.attention(tq, tk, tv, **options)
    out.backward(torch.from_numpy(dout.astype(np.float64)))
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


def check(q, k, v, **options):
    out, lse = attnscale.attention(q, k, v, return_lse=True, **options)
    dout = np.random.default_rng(q.size).standard_normal(out.shape).astype(q.dtype)
    grads = attnscale.attention_backward(q, k, v, out, lse, dout, **options)
    ref_grads = attnscale.attention_backward(q, k, v, None, None, dout, reference=True, **options)
    want = reference_grads(q, k, v, dout, **options)
    for name, got, ref, w, x in zip("qkv", grads, ref_grads, want, (q, k, v)):
        assert got.shape == x.shape and got.dtype == x.dtype, name
        np.testing.assert_allclose(got, w, err_msg=f"d{name}", **TOL[q.dtype.type])
        np.testing.assert_allclose(ref, w, err_msg=f"reference d{name}", **TOL[q.dtype.type])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trial", range(10))
def test_random_shapes_and_options(rng, dtype, trial):
    q, k, v = random_case(rng, dtype)
    nq, nkv = q.shape[-2], k.shape[-2]
    options = [
        {},
        dict(causal=True),
        dict(causal="bottom-right", scale=0.2),
        dict(window=(2, 1), scale="linear"),
        dict(mask=rng.random((nq, nkv)) < 0.6),
    ][trial % 5]
    check(q, k, v, **options)


def test_gqa_sums_over_the_query_heads_of_a_group(rng):
    q = rng.standard_normal((2, 6, 11, 8))
    k, v = rng.standard_normal((2, 3, 13, 8)), rng.standard_normal((2, 3, 13, 5))
    check(q, k, v, causal="bottom-right")


def test_additive_mask_and_fully_masked_rows(rng):
    q, k, v = (rng.standard_normal((3, 6, 4)) for _ in range(3))
    keep = rng.random((6, 6)) < 0.5
    keep[0] = False
    check(q, k, v, mask=keep)
    check(q, k, v, mask=rng.standard_normal((6, 6)), window=(1, None))


@pytest.mark.parametrize("options", [{}, dict(causal=True), dict(causal="bottom-right"), dict(window=(5, 2)),
                                     dict(softcap=4.0, causal=True), dict(dropout_p=0.1, dropout_seed=3)])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 1, 23, 41, 7), (4, 2, 70, 131, 40)])
def test_bf16_compute_within_one_percent(rng, shape, options):
    hq, hkv, nq, nkv, d = shape
    q = rng.standard_normal((hq, nq, d)).astype(np.float32)
    k, v = (rng.standard_normal((hkv, nkv, d)).astype(np.float32) for _ in range(2))
    out, lse = attnscale.attention(q, k, v, return_lse=True, **options)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    grads = attnscale.attention_backward(q, k, v, out, lse, dout, compute="bf16", **options)
    want = attnscale.attention_backward(q, k, v, None, None, dout, reference=True, **options)
    for name, got, w in zip("qkv", grads, want):
        assert got.dtype == np.float32
        assert np.linalg.norm(got - w) <= 1e-2 * max(np.linalg.norm(w), 1.0), f"d{name}"
    with pytest.raises(ValueError, match=r"^compute: expected 'native' or 'bf16', got 'int8'$"):
        attnscale.attention_backward(q, k, v, out, lse, dout, compute="int8", **options)


def test_bf16_compute_keeps_a_value_beyond_bfloat16_from_hidden_pairs(rng):
    """A float32 value of V finite in float32 but infinite once rounded to bfloat16 (3.4e38), at a key
    that only the last rows see: with compute="bf16" the backward must not let 0 * inf reach the
    rows and keys a causal mask keeps apart from it (it takes such inputs in float32), and the
    forward's rows that do not see it stay finite."""
    n, d, j = 300, 64, 295
    q, k, v, do = (rng.standard_normal((1, 1, n, d), dtype=np.float32) for _ in range(4))
    v[0, 0, j, 3] = 3.4e38
    do *= 0.1  # dO·V stays finite in float32
    o, lse = attnscale.attention(q, k, v, causal=True, compute="bf16", return_lse=True)
    assert np.isfinite(np.asarray(o)[0, 0, :j]).all()
    dq, dk, dv = attnscale.attention_backward(q, k, v, o, lse, do, causal=True, compute="bf16")
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.isfinite(np.asarray(g)).all(), name
