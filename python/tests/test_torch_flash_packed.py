"""attnscale.torch's packed FlashAttention calls: the same numbers and gradients as flash_attn_func
and flash_attn_varlen_func on the stacked tensor's parts, and FlashAttention's semantics in float64."""
import pytest
import torch

import attnscale
import attnscale.torch as at
import torch_reference


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(2718)


def randn(gen, *shape):
    return torch.randn(*shape, dtype=torch.float64, generator=gen).requires_grad_()


@pytest.mark.parametrize("opts", [dict(causal=True), dict(window_size=(2, 1), softcap=1.5), dict(alibi_slopes="per-head")])
def test_qkvpacked_and_kvpacked_equal_flash_attn_func(gen, opts):
    B, N, Nq, H, Hkv, d = 2, 7, 5, 4, 2, 8
    if opts.get("alibi_slopes") == "per-head":
        opts = dict(alibi_slopes=torch.rand(H, generator=gen))
    qkv = randn(gen, B, N, 3, H, d)
    before = attnscale._attnscale._copy_count()
    out, lse, probs = at.flash_attn_qkvpacked_func(qkv, return_attn_probs=True, **opts)
    assert attnscale._attnscale._copy_count() == before  # the parts are read in place
    q, k, v = qkv.unbind(2)
    want, want_lse, want_probs = torch_reference.flash(q, k, v, probs=True, **opts)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(probs, want_probs, rtol=1e-12, atol=1e-12)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    (want_dqkv,) = torch.autograd.grad(want, qkv, dout)
    torch.testing.assert_close(dqkv, want_dqkv, rtol=1e-10, atol=1e-12)

    q, kv = randn(gen, B, Nq, H, d), randn(gen, B, N, 2, Hkv, d)  # GQA: 2 kv heads for 4
    out = at.flash_attn_kvpacked_func(q, kv, **opts)
    k, v = kv.unbind(2)
    assert torch.equal(out, at.flash_attn_func(q, k, v, **opts))
    torch.testing.assert_close(out, torch_reference.flash(q, k, v, **opts)[0], rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda q, kv: at.flash_attn_kvpacked_func(q, kv, **opts), (q[:1, :3], kv[:1, :4]))


def test_varlen_packed_equal_flash_attn_varlen_func(gen):
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    qkv = randn(gen, 9, 3, 2, 4)
    out = at.flash_attn_varlen_qkvpacked_func(qkv, cu, 5, causal=True)
    q, k, v = qkv.unbind(1)
    assert torch.equal(out, at.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, causal=True))
    assert torch.autograd.gradcheck(lambda t: at.flash_attn_varlen_qkvpacked_func(t, cu, 5, causal=True), (qkv,))

    cu_k = torch.tensor([0, 2, 8, 10], dtype=torch.int32)
    kv = randn(gen, 10, 2, 1, 4)
    out, lse, _ = at.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 5, 6, window_size=(1, 0), return_attn_probs=True)
    k, v = kv.unbind(1)
    want, want_lse, _ = at.flash_attn_varlen_func(q, k, v, cu, cu_k, 5, 6, window_size=(1, 0), return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_a_stacked_tensor_of_the_wrong_shape_is_named():
    bad = [
        (lambda: at.flash_attn_qkvpacked_func(torch.zeros(2, 5, 2, 4, 8)),
         r"^qkv: expected a \[batch, seqlen, 3, heads, headdim\] tensor, got \[2, 5, 2, 4, 8\]$"),
        (lambda: at.flash_attn_kvpacked_func(torch.zeros(2, 5, 4, 8), torch.zeros(2, 5, 4, 8)),
         r"^kv: expected a \[batch, seqlen, 2, heads_k, headdim\] tensor, got \[2, 5, 4, 8\]$"),
        (lambda: at.flash_attn_varlen_qkvpacked_func([1.0], torch.tensor([0, 1]), 1),
         r"^qkv: expected a \[total, 3, heads, headdim\] tensor, got list$"),
        (lambda: at.flash_attn_varlen_kvpacked_func(torch.zeros(3, 4, 8), torch.zeros(3, 3, 4, 8), torch.tensor([0, 3]),
                                                    torch.tensor([0, 3]), 3, 3),
         r"^kv: expected a \[total_k, 2, heads_k, headdim\] tensor, got \[3, 3, 4, 8\]$"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=message):
            call()
