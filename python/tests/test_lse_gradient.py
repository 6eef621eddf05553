"""The gradient through lse: attnscale.attention_backward(..., dlse=) and attnscale.torch.attention's
lse, which carries its gradient (d lse_i / d s_ij = P_ij). A loss that reads lse, as one that merges
partial results by their lse does, gets the gradients of float64 autograd."""
import math

import numpy as np
import pytest
import torch

import attnscale
import attnscale.torch as at
import torch_reference


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(4321)


def leaves(gen, *shapes, dtype=torch.float64):
    return [torch.randn(*s, dtype=dtype, generator=gen).requires_grad_() for s in shapes]


def test_gradcheck_through_out_and_lse(gen):
    q, k, v = leaves(gen, (2, 4, 6, 5), (2, 2, 7, 5), (2, 2, 7, 3))
    f = lambda q, k, v: at.attention(q, k, v, causal="bottom-right", return_lse=True)
    assert torch.autograd.gradcheck(f, (q, k, v))
    sinks = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(1, 4, 6, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    g = lambda q, k, v, s, b: at.attention(q, k, v, mask=b, sinks=s, window=(2, 1), return_lse=True)
    assert torch.autograd.gradcheck(g, (q, k, v, sinks, bias))


def test_lse_alone_is_differentiable(gen):
    q, k, v = leaves(gen, (3, 9, 8), (3, 11, 8), (3, 11, 4))
    _, lse = at.attention(q, k, v, return_lse=True)
    assert lse.requires_grad
    lse.sum().backward()
    q64, k64, v64 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    _, want, _ = torch_reference.attention(q64, k64, v64)
    want.sum().backward()
    for got, ref in ((q.grad, q64.grad), (k.grad, k64.grad)):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    assert torch.count_nonzero(v.grad) == 0  # lse does not read v


def test_merging_two_key_chunks_by_lse_gives_the_whole_call_and_its_gradients(gen):
    """What cascade and ring attention do in PyTorch: attention over two chunks of the keys, merged
    by their lse, is attention over all keys, and so are its gradients (float32, GQA, 2 threads)."""
    q, k, v = leaves(gen, (2, 8, 37, 32), (2, 2, 101, 32), (2, 2, 101, 16), dtype=torch.float32)
    dout = torch.randn(2, 8, 37, 16, generator=gen)
    whole = at.attention(q, k, v, threads=2)
    want = torch.autograd.grad(whole, (q, k, v), dout)
    o1, l1 = at.attention(q, k[:, :, :60], v[:, :, :60], return_lse=True, threads=2)
    o2, l2 = at.attention(q, k[:, :, 60:], v[:, :, 60:], return_lse=True, threads=2)
    lse = torch.logaddexp(l1, l2)
    merged = torch.exp(l1 - lse)[..., None] * o1 + torch.exp(l2 - lse)[..., None] * o2
    torch.testing.assert_close(merged, whole, rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(merged, (q, k, v), dout)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_backward_with_dlse_against_float64_autograd(dtype):
    rng = np.random.default_rng(7)
    # Leading dimensions that broadcast (folded by attnscale.broadcast), GQA and a bool mask.
    q = rng.standard_normal((3, 4, 13, 16)).astype(dtype)
    k = rng.standard_normal((1, 2, 29, 16)).astype(dtype)
    v = rng.standard_normal((1, 2, 29, 8)).astype(dtype)
    keep = rng.random((13, 29)) < 0.8
    out, lse = attnscale.attention(q, k, v, mask=keep, causal="bottom-right", return_lse=True)
    dout = rng.standard_normal(out.shape).astype(dtype)
    dlse = rng.standard_normal(lse.shape).astype(dtype)
    dq, dk, dv = attnscale.attention_backward(q, k, v, out, lse, dout, mask=keep, causal="bottom-right", dlse=dlse)
    t = [torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v)]
    o, l, _ = torch_reference.attention(t[0], t[1].expand(3, 2, 29, 16), t[2].expand(3, 2, 29, 8),
                                        causal="bottom-right", mask=torch.from_numpy(keep))
    l = torch.where(torch.isfinite(l), l, torch.zeros_like(l))  # rows with no key: no gradient
    ((o * torch.from_numpy(dout.astype(np.float64))).sum() + (l * torch.from_numpy(dlse.astype(np.float64))).sum()).backward()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for got, ref in zip((dq, dk, dv), t):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, ref.grad.numpy(), rtol=tol, atol=tol)


def test_no_key_set_lse_is_the_sink_and_dsinks_sums_dlse():
    q = np.ones((2, 3, 5, 4))
    k = np.ones((2, 3, 0, 4))
    v = np.ones((2, 3, 0, 2))
    sinks = np.array([0.5, -1.0, 2.0])
    out, lse = attnscale.attention(q, k, v, sinks=sinks, return_lse=True)
    assert not out.any()
    np.testing.assert_array_equal(lse, np.broadcast_to(sinks[None, :, None], (2, 3, 5)))
    dlse = np.arange(30, dtype=np.float64).reshape(2, 3, 5)
    *_, dsinks = attnscale.attention_backward(q, k, v, out, lse, np.ones_like(out), sinks=sinks, dlse=dlse,
                                              return_dsinks=True)
    np.testing.assert_array_equal(dsinks, dlse.sum(axis=(0, 2)))
    # attnscale.torch: lse = sink, and its gradient reaches sinks.
    s = torch.tensor(sinks, requires_grad=True)
    _, tl = at.attention(torch.ones(2, 3, 5, 4, dtype=torch.float64), torch.ones(2, 3, 0, 4, dtype=torch.float64),
                         torch.ones(2, 3, 0, 2, dtype=torch.float64), sinks=s, return_lse=True)
    (tl * torch.from_numpy(dlse)).sum().backward()
    np.testing.assert_array_equal(s.grad.numpy(), dlse.sum(axis=(0, 2)))
    with pytest.raises(ValueError, match=r"^sinks: expected shape \[3\], got \[2\]$"):
        attnscale.attention(q, k, v, sinks=sinks[:2], return_lse=True)


def test_dlse_refusals():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    out, lse = attnscale.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"^dlse: expected shape \[2, 5\], got \[2, 4\]$"):
        attnscale.attention_backward(q, k, v, out, lse, out, dlse=np.zeros((2, 4)))
    with pytest.raises(TypeError, match=r"^dlse: "):
        attnscale.attention_backward(q, k, v, out, lse, out, dlse=np.zeros((2, 5), dtype=np.int32))


def test_values_of_no_column_still_give_lse_and_probs(gen):
    """dv = 0 over keys: out has no element, but lse and probs do not read v."""
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((2, 3, 7, 8)), rng.standard_normal((2, 1, 9, 8))
    out, lse, probs = attnscale.attention(q, k, np.zeros((2, 1, 9, 0)), causal=True, return_lse=True,
                                          return_probs=True)
    _, want_lse, want_probs = attnscale.attention(q, k, rng.standard_normal((2, 1, 9, 4)), causal=True,
                                                  return_lse=True, return_probs=True)
    assert out.shape == (2, 3, 7, 0)
    np.testing.assert_array_equal(lse, want_lse)
    np.testing.assert_array_equal(probs, want_probs)
    tq, tk = leaves(gen, (2, 3, 7, 8), (2, 1, 9, 8))
    tout, tlse = at.attention(tq, tk, torch.zeros(2, 1, 9, 0, dtype=torch.float64), causal=True, return_lse=True)
    assert tout.shape == (2, 3, 7, 0)
    tlse.sum().backward()
    _, ref, _ = torch_reference.attention(tq.detach().requires_grad_(), tk.detach(), torch.zeros(2, 1, 9, 1),
                                          causal=True)
    torch.testing.assert_close(tlse.detach(), ref)
    assert tq.grad is not None and tk.grad is not None and torch.count_nonzero(tq.grad) > 0
