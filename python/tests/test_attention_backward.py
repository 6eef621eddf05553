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
