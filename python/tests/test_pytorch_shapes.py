"""attnscale.attention / attention_backward on numpy arrays of PyTorch's shapes: leading dimensions
that broadcast, masks that broadcast in every dimension, more than 4 dimensions, empty key sets."""
import numpy as np
import pytest
import torch

import attnscale
import torch_reference

# (q, k, v, mask): rank 5, broadcast batch, the [B, 1, 1, Nkv] padding mask, masks broadcast in Nq
# or in Nkv, q with one head against k with three, GQA, an [Nkv] mask.
CASES = [
    ((2, 3, 2, 5, 4), (3, 1, 7, 4), (3, 1, 7, 3), (2, 1, 1, 1, 7)),
    ((3, 4, 9, 8), (1, 2, 11, 8), (1, 2, 11, 8), (3, 1, 1, 11)),
    ((1, 13, 6), (2, 3, 17, 6), (2, 3, 17, 5), (13, 1)),
    ((2, 1, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4), (1, 5)),
    ((3, 2, 6, 4), (3, 2, 7, 4), (3, 2, 7, 2), (7,)),  # a key mask of rank 1, as PyTorch broadcasts it
]


def uses_gqa(qs, ks):
    """Whether k has fewer heads than q (then PyTorch needs enable_gqa=True; attnscale always has it)."""
    return len(qs) >= 3 and len(ks) >= 3 and qs[-3] > ks[-3] > 1


def with_lse(q, k, v, mask):
    """PyTorch's math in float64 (attnscale's GQA rule) with each row's log-sum-exp."""
    t = [torch.from_numpy(x) for x in (q, k, v)]
    m = torch.from_numpy(mask)
    gqa = uses_gqa(q.shape, k.shape)
    out = torch_reference.sdpa(*t, attn_mask=m, enable_gqa=gqa)
    kk = t[1].repeat_interleave(t[0].shape[-3] // t[1].shape[-3], -3) if gqa else t[1]
    scores = (t[0] @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])).masked_fill(~m, -np.inf)
    return out.numpy(), torch.logsumexp(scores, -1).numpy()


@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) for c in CASES])
def test_forward_and_backward_broadcast_as_pytorch(rng, case):
    qs, ks, vs, ms = case
    q, k, v = rng.standard_normal(qs), rng.standard_normal(ks), rng.standard_normal(vs)
    mask = rng.random(ms) < 0.8
    mask[..., 0] = True
    out, lse = attnscale.attention(q, k, v, mask=mask, return_lse=True)
    want, want_lse = with_lse(q, k, v, mask)
    assert out.shape == want.shape and lse.shape == want_lse.shape
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    # Gradients of sum(dout * out): summed over the broadcast dimensions, as autograd does.
    dout = rng.standard_normal(out.shape)
    grads = attnscale.attention_backward(q, k, v, out, lse, dout, mask=mask)
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    gqa = uses_gqa(qs, ks)
    (torch_reference.sdpa(tq, tk, tv, attn_mask=torch.from_numpy(mask), enable_gqa=gqa) * torch.from_numpy(dout)).sum().backward()
    for got, ref in zip(grads, (tq.grad, tk.grad, tv.grad)):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-10, atol=1e-12)


def test_padding_mask_is_read_in_place(rng):
    q = rng.standard_normal((2, 4, 9, 8), dtype=np.float32)
    pad = np.ones((2, 1, 1, 9), dtype=bool)
    pad[1, ..., 5:] = False
    before = attnscale._attnscale._copy_count()
    out = attnscale.attention(q, q, q, mask=pad)
    assert attnscale._attnscale._copy_count() == before
    np.testing.assert_array_equal(out[1], attnscale.attention(q[1], q[1, :, :5], q[1, :, :5]))


def test_an_empty_key_set_gives_zero_and_minus_infinity(rng):
    q, kv = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 0, 4))
    out, lse, probs = attnscale.attention(q, kv, kv, causal=True, return_lse=True, return_probs=True)
    assert out.shape == (2, 3, 5, 4) and (out == 0).all()
    assert lse.shape == (2, 3, 5) and (lse == -np.inf).all() and probs.shape == (2, 3, 5, 0)
    dq, dk, dv = attnscale.attention_backward(q, kv, kv, out, lse, out)
    assert (dq == 0).all() and dk.shape == kv.shape and dv.shape == kv.shape
    assert attnscale.attention(q[:, :, :0], q, q).shape == (2, 3, 0, 4)
    with pytest.raises(TypeError, match=r"^attention\(\) got an unexpected keyword argument 'casual'"):
        attnscale.attention(q, kv, kv, casual=True)
    # Nothing to compute, but the checks of a call with work to do, with their messages.
    with pytest.raises(ValueError, match=r"^q, k, v: dtypes differ \(q float64, k float32, v float32\)$"):
        attnscale.attention(q, kv.astype(np.float32), kv.astype(np.float32))
    with pytest.raises(ValueError, match=r"^k: last dimension dk = 3 must equal q's dk = 4 \(q \[2, 3, 0, 4\], k \[2, 3, 5, 3\]\)$"):
        attnscale.attention(q[:, :, :0], q[..., :3], q[..., :3])
    with pytest.raises(ValueError, match=r"^v: heads and keys must match k's"):
        attnscale.attention_backward(q, kv, q, out, lse, out)


def test_dbias_of_a_broadcast_mask_has_q_s_leading_shape(rng):
    q, k = rng.standard_normal((2, 3, 2, 5, 4)), rng.standard_normal((3, 1, 7, 4))
    bias = rng.standard_normal((2, 1, 1, 1, 7))
    out, lse = attnscale.attention(q, k, k, mask=bias, return_lse=True)
    dout = rng.standard_normal(out.shape)
    dq, dk, dv, dbias = attnscale.attention_backward(q, k, k, out, lse, dout, mask=bias, return_dbias=True)
    assert dbias.shape == (2, 3, 2, 5, 7)
    tq, tk, tb = (torch.from_numpy(x).requires_grad_() for x in (q, k, bias))
    (torch_reference.sdpa(tq, tk, tk, attn_mask=tb) * torch.from_numpy(dout)).sum().backward()
    np.testing.assert_allclose(dbias.sum(axis=(1, 2, 3), keepdims=True), tb.grad.numpy(), rtol=1e-9, atol=1e-12)
    empty = attnscale.attention_backward(q, k[..., :0, :], k[..., :0, :], out, lse, dout, mask=bias[..., :0],
                                         return_dbias=True)
    assert empty[3].shape == (2, 3, 2, 5, 0)
