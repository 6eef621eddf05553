"""attnscale.torch.attention: autograd through the C++ kernels (gradcheck, training, strides)."""
import numpy as np
import pytest
import torch

import attnscale
import attnscale.torch as at
import torch_reference


def leaves(gen, *shapes, dtype=torch.float64):
    return [torch.randn(*s, dtype=dtype, generator=gen).requires_grad_() for s in shapes]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def test_gradcheck_plain(gen):
    q, k, v = leaves(gen, (2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 3))
    assert torch.autograd.gradcheck(lambda q, k, v: at.attention(q, k, v), (q, k, v))


def test_gradcheck_causal_and_gqa(gen):
    q, k, v = leaves(gen, (2, 4, 6, 5), (2, 2, 6, 5), (2, 2, 6, 3))
    assert torch.autograd.gradcheck(lambda q, k, v: at.attention(q, k, v, causal=True), (q, k, v))
    q, k, v = leaves(gen, (6, 7, 4), (2, 9, 4), (2, 9, 2))
    f = lambda q, k, v: at.attention(q, k, v, causal="bottom-right", scale="linear")
    assert torch.autograd.gradcheck(f, (q, k, v))


def test_gradcheck_window_and_masks(gen):
    q, k, v = leaves(gen, (7, 4), (8, 4), (8, 3))
    keep = torch.rand(7, 8, generator=gen) < 0.7
    keep[3] = False  # a row with no key: output 0, gradient 0
    f = lambda q, k, v: at.attention(q, k, v, mask=keep, window=(2, 3), scale=0.7)
    assert torch.autograd.gradcheck(f, (q, k, v))
    additive = torch.randn(1, 1, 7, 8, dtype=torch.float64, generator=gen)
    assert torch.autograd.gradcheck(lambda q, k, v: at.attention(q, k, v, mask=additive), (q, k, v))


def test_gradients_match_torch_autograd_in_float32(gen):
    q, k, v = leaves(gen, (2, 4, 33, 16), (2, 1, 40, 16), (2, 1, 40, 8), dtype=torch.float32)
    out = at.attention(q, k, v, causal="bottom-right")
    dout = torch.randn(out.shape, generator=gen)
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want, _, _ = torch_reference.attention(q64, k64, v64, causal="bottom-right")
    want.backward(dout.double())
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    for got, ref in [(q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)]:
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, rtol=1e-3, atol=1e-4)


def test_permuted_inputs_are_read_in_place(gen):
    # [B, N, H, d] activations viewed as [B, H, N, d] by permute: strided, no copy.
    x = torch.randn(2, 9, 4, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    q = x.permute(0, 2, 1, 3)
    before = attnscale._attnscale._copy_count()
    out = at.attention(q, q, q, causal=True)
    out.sum().backward()
    assert attnscale._attnscale._copy_count() == before
    x2 = x.detach().clone().requires_grad_()
    q2 = x2.permute(0, 2, 1, 3).contiguous()
    want, _, _ = torch_reference.attention(q2, q2, q2, causal=True)
    want.sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(x.grad, x2.grad)


def test_a_model_trains_through_it(gen):
    # One attention layer learns to copy its input: the loss must fall by an order of magnitude.
    torch.manual_seed(0)
    d, n = 8, 12
    proj = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3))
    opt = torch.optim.Adam(proj.parameters(), lr=0.05)
    x = torch.randn(16, n, d, generator=gen)
    losses = []
    for _ in range(150):
        q, k, v = (p(x) for p in proj)
        y = at.attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), causal=True).squeeze(1)
        loss = (y - x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 10


def test_return_lse_and_errors(gen):
    q, k, v = leaves(gen, (5, 4), (5, 4), (5, 4))
    out, lse = at.attention(q, k, v, return_lse=True)
    assert lse.shape == (5,) and not lse.requires_grad
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(q.detach() @ k.detach().T / 2, dim=-1).numpy())
    with pytest.raises(TypeError, match=r"^q: dtype must be float32, float64 or bfloat16, got torch.int64$"):
        at.attention(torch.zeros(5, 4, dtype=torch.int64), k, v)
    with pytest.raises(TypeError, match=r"^k: expected a torch.Tensor, got ndarray$"):
        at.attention(q, k.detach().numpy(), v)
    with pytest.raises(ValueError, match=r"^k: last dimension dk = 3 must equal q's dk = 4"):
        at.attention(q, torch.zeros(5, 3, dtype=torch.float64), v)


def test_bf16_forward_with_native_backward(gen):
    q, k, v = leaves(gen, (2, 17, 16), (2, 19, 16), (2, 19, 8), dtype=torch.float32)
    out = at.attention(q, k, v, compute="bf16")
    want = at.attention(q, k, v)
    torch.testing.assert_close(out, want, rtol=0, atol=5e-2)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
