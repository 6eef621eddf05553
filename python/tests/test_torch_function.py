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
    assert lse.shape == (5,) and lse.requires_grad  # its gradient: test_lse_gradient.py
    np.testing.assert_allclose(lse.detach().numpy(), torch.logsumexp(q.detach() @ k.detach().T / 2, dim=-1).numpy())
    with pytest.raises(TypeError, match=r"^q: dtype must be float32, float64 or bfloat16, got torch.int64$"):
        at.attention(torch.zeros(5, 4, dtype=torch.int64), k, v)
    with pytest.raises(TypeError, match=r"^k: expected a torch.Tensor, got ndarray$"):
        at.attention(q, k.detach().numpy(), v)
    with pytest.raises(ValueError, match=r"^k: last dimension dk = 3 must equal q's dk = 4"):
        at.attention(q, torch.zeros(5, 3, dtype=torch.float64), v)


def test_bf16_compute_forward_and_backward(gen):
    q, k, v = leaves(gen, (2, 17, 16), (2, 19, 16), (2, 19, 8), dtype=torch.float32)
    dout = torch.randn(2, 17, 8, generator=gen)
    out = at.attention(q, k, v, compute="bf16")
    want = at.attention(q, k, v)
    torch.testing.assert_close(out, want, rtol=0, atol=5e-2)
    got = torch.autograd.grad(out, (q, k, v), dout)
    exact = torch.autograd.grad(want, (q, k, v), dout)
    for g, e in zip(got, exact):
        assert torch.linalg.norm(g - e) <= 1e-2 * torch.linalg.norm(e)


def test_bfloat16_tensors_get_bfloat16_gradients(gen):
    # bfloat16 leaves: forward and backward run the bf16 kernels (no upcast); the gradients are
    # bfloat16 and within 1e-2 of float64 autograd on the same values.
    shapes = ((1, 4, 33, 24), (1, 2, 47, 24), (1, 2, 47, 16))
    q, k, v = (torch.randn(*s, generator=gen).to(torch.bfloat16).requires_grad_() for s in shapes)
    dout = torch.randn(1, 4, 33, 16, generator=gen).to(torch.bfloat16)
    out = at.attention(q, k, v, causal="bottom-right")
    assert out.dtype == torch.bfloat16
    got = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = at.attention(q64, k64, v64, causal="bottom-right")
    exact = torch.autograd.grad(want, (q64, k64, v64), dout.double())
    for g, e in zip(got, exact):
        assert g.dtype == torch.bfloat16
        assert torch.linalg.norm(g.double() - e) <= 1e-2 * torch.linalg.norm(e)


def test_sinks_and_their_gradient(gen):
    # A sink joins every row's softmax without a value: softmax over [scores, sink], sink column dropped.
    q, k, v = leaves(gen, (2, 4, 5, 3), (2, 2, 6, 3), (2, 2, 6, 2))
    sinks = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    f = lambda q, k, v, sinks: at.attention(q, k, v, causal=True, sinks=sinks)
    assert torch.autograd.gradcheck(f, (q, k, v, sinks))
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ kk.transpose(-1, -2) / 3**0.5).masked_fill(~torch.ones(5, 6, dtype=torch.bool).tril(), float("-inf"))
    column = sinks[None, :, None, None].expand(2, 4, 5, 1)
    want = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1] @ vv
    torch.testing.assert_close(f(q, k, v, sinks), want)
    with pytest.raises(ValueError, match=r"^sinks: expected a tensor of shape \(4,\)"):
        at.attention(q, k, v, sinks=torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_call_without_gradients_skips_autograd_with_the_same_results(gen, dtype):
    """Under no_grad, or when no operand requires grad, the kernels run without autograd's node: the
    same out and lse, bit for bit, as through it (masks, sinks, GQA, odd sizes), and no grad_fn; a
    forward-mode AD level still meets autograd's refusal (Attention has no jvp)."""
    q, k, v = (t.detach().to(dtype) for t in leaves(gen, (2, 4, 5, 3), (2, 2, 7, 3), (2, 2, 7, 2)))
    mask = torch.randn(5, 7, dtype=torch.float64, generator=gen).to(dtype if dtype != torch.bfloat16 else torch.float32)
    sinks = torch.randn(4, dtype=torch.float64, generator=gen)
    for kw in (dict(causal=True), dict(mask=mask), dict(mask=mask > 0, sinks=sinks), dict(window=(2, 1))):
        grads = [t.clone().requires_grad_() for t in (q, k, v)]
        want_out, want_lse = at.attention(*grads, return_lse=True, **kw)
        assert want_out.grad_fn is not None
        for no_grad in (True, False):
            with torch.set_grad_enabled(not no_grad):
                out, lse = at.attention(q, k, v, return_lse=True, **kw)
            assert out.grad_fn is None and lse.grad_fn is None and not out.requires_grad
            assert torch.equal(out, want_out.detach()) and torch.equal(lse, want_lse.detach())
    with torch.no_grad():  # a float mask that requires grad, under no_grad: read as it is
        out = at.attention(q, k, v, mask=mask.clone().requires_grad_())
    assert torch.equal(out, at.attention(q, k, v, mask=mask))
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, torch.ones_like(q))
        with pytest.raises(NotImplementedError, match="jvp"):
            at.attention(dual, k, v)


def test_second_backward_and_in_place_changes(gen):
    """A graph kept for a second backward (retain_graph) gives the same gradients again; an input
    changed in place after the forward is refused by autograd's check, not read changed."""
    q, k, v = leaves(gen, (1, 2, 9, 8), (1, 2, 11, 8), (1, 2, 11, 8), dtype=torch.float32)
    out = at.attention(q, k, v, causal=True)
    dout = torch.randn(out.shape, generator=gen)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    x = torch.randn(1, 2, 9, 8, generator=gen, requires_grad=True)
    q2 = x * 2  # not a leaf, so it may be changed in place
    out = at.attention(q2, k, v)
    with torch.no_grad():
        q2.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_forward_arrays_are_let_go_by_the_backward(gen):
    """The arrays the forward checked once and the first backward reads (q, k, v, out, lse, mask) are
    dropped by that backward, so they keep nothing alive that autograd has freed."""
    q, k, v = leaves(gen, (1, 2, 9, 8), (1, 2, 11, 8), (1, 2, 11, 8), dtype=torch.float32)
    out = at.attention(q, k, v)
    node = out.grad_fn  # the kernels' node, under any reshape of its output
    while type(node).__name__ != "AttentionBackward":
        node = node.next_functions[0][0]
    assert len(node.arrays) == 6
    out.sum().backward()
    assert not hasattr(node, "arrays")


def test_double_backward_is_refused_by_every_function(gen):
    """A gradient taken with create_graph=True (a gradient penalty) depends on the inputs through
    the saved tensors even when the incoming gradient is a constant (out.sum()): differentiating it
    raises, instead of giving 0 for the penalty's term. Without create_graph nothing changes."""
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)  # [B, N, H, d]
    half = x.detach().to(torch.float16).requires_grad_()
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    heads = lambda t: t.transpose(1, 2)  # [B, H, N, d]
    calls = {
        "attention": (x, lambda t: at.attention(heads(t), heads(t), heads(t), causal=True)),
        "sdpa": (x, lambda t: at.scaled_dot_product_attention(heads(t), heads(t), heads(t), attn_mask=torch.ones(5))),
        "sdpa float16": (half, lambda t: at.scaled_dot_product_attention(heads(t), heads(t), heads(t))),
        "flash_attn_func": (x, lambda t: at.flash_attn_func(t, t, t, causal=True)),
        "flash float16": (half, lambda t: at.flash_attn_func(t, t, t)),
        "varlen": (x, lambda t: at.flash_attn_varlen_func(t.flatten(0, 1), t.flatten(0, 1), t.flatten(0, 1), cu, cu, 7, 7)),
    }
    for name, (leaf, f) in calls.items():
        (g,) = torch.autograd.grad(f(leaf).float().sum(), leaf, create_graph=True)
        assert g.requires_grad, name
        with pytest.raises(RuntimeError, match=r"double backward \(the gradient of a gradient\) is not supported"):
            (g.float() ** 2).sum().backward()
        (plain,) = torch.autograd.grad(f(leaf).float().sum(), leaf)
        assert not plain.requires_grad and torch.equal(plain, g.detach()), name


@pytest.mark.parametrize("kind", ["float", "bool"])
def test_a_mask_changed_in_place_after_the_forward_is_refused(gen, kind):
    """The backward reads the mask: changed in place before it, autograd's check refuses it (as
    PyTorch's own attention does), not the new mask read into the gradients."""
    (q,) = leaves(gen, (1, 2, 6, 4))
    if kind == "float":
        mask = torch.randn(6, 6, dtype=torch.float64, generator=gen)
    else:
        mask = torch.rand(6, 6, generator=gen) < 0.7
        mask[:, 0] = True
    calls = (lambda m: at.attention(q, q, q, mask=m), lambda m: at.scaled_dot_product_attention(q, q, q, attn_mask=m),
             lambda m: at.attention(q, q, q, mask=m[0]))  # a [Nkv] view of the buffer
    for f in calls:
        m = mask.clone()
        out = f(m)
        m.fill_(0)
        m.fill_diagonal_(1)  # the buffer reused for the next chunk
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
        torch.autograd.grad(f(mask).sum(), q)  # left alone, the mask passes the check


def test_sinks_changed_after_the_forward_leave_its_gradients_alone(gen):
    # The backward reads a copy of the logits the forward used (one per head, no cost to keep).
    q, k, v = leaves(gen, (1, 4, 5, 3), (1, 2, 7, 3), (1, 2, 7, 2))
    sinks = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    want = torch.autograd.grad(at.attention(q, k, v, sinks=sinks).sum(), (q, k, v, sinks))
    out = at.attention(q, k, v, sinks=sinks)
    with torch.no_grad():
        sinks.add_(3.0)  # an optimizer step between the forward and the backward
    got = torch.autograd.grad(out.sum(), (q, k, v, sinks))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_tracing_is_refused_by_name(gen):
    """torch.jit.trace cannot record a call into the kernels (numpy arrays, outside torch's operators):
    every entry point says so instead of failing a shape check on the traced sizes."""
    x = torch.randn(2, 3, 5, 4, generator=gen)
    lens, cu = torch.tensor([2, 3], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)
    calls = [
        lambda x: at.attention(x, x, x),
        lambda x: at.scaled_dot_product_attention(x, x, x),
        lambda x: at.flash_attn_func(x, x, x),
        lambda x: at.flash_attn_varlen_func(x[0], x[0], x[0], cu, cu, 3, 3),
        lambda x: at.flash_attn_with_kvcache(x, x.clone(), x.clone(), cache_seqlens=lens),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match=r"^attnscale.torch: torch.jit.trace cannot record a call"):
            torch.jit.trace(call, (x,), check_trace=False)


def test_drop_in_errors_are_caught_as_pytorch_s(gen):
    """PyTorch and FlashAttention report a bad argument with RuntimeError: the drop-ins' TypeError and
    ValueError are RuntimeErrors too (same messages), so `except RuntimeError` written for them holds."""
    q = torch.randn(2, 5, 4, 8, generator=gen)
    calls = [
        (lambda: at.scaled_dot_product_attention(q, q[..., :3], q), ValueError, r"^key: last dimension dk = 3"),
        (lambda: at.scaled_dot_product_attention(q, q, q, scale="x"), TypeError, r"^scale: expected a number"),
        (lambda: at.flash_attn_func(q, q[..., :3], q), ValueError, r"^k: headdim 3 differs from q's 8"),
        (lambda: at.flash_attn_qkvpacked_func(q), ValueError, r"^qkv: expected a \[batch, seqlen, 3, heads, headdim\]"),
        (lambda: at.flash_attn_varlen_func(q[0], q[0], q[0], [0, 5], [0, 5], 5, 5), ValueError, r"^cu_seqlens_q: expected a 1-D"),
        (lambda: at.flash_attn_with_kvcache(q, q, q, cache_seqlens=9), ValueError, r"^cache_seqlens\[0\] = 9: outside 0..5"),
        (lambda: at.flash_attn_with_kvcache(q.long(), q.long(), q.long()), TypeError, r"^k_cache: dtype must be"),
    ]
    for call, error, message in calls:
        with pytest.raises(error, match=message) as caught:
            call()
        assert isinstance(caught.value, RuntimeError)
    with pytest.raises(ValueError) as caught:  # attnscale's own function keeps plain ValueError
        at.attention(q, q[..., :3], q)
    assert not isinstance(caught.value, RuntimeError)
