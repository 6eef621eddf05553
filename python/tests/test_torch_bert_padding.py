"""attnscale.torch.bert_padding (FlashAttention's flash_attn.bert_padding): pad -> unpad ->
flash_attn_varlen_func -> pad equals the padded batch through a key padding mask, forward and
gradients, float64; return values as FlashAttention 2's; gradients through the gather and scatter."""
import pytest
import torch

import attnscale.torch as at
from attnscale.torch.bert_padding import index_first_axis, index_put_first_axis, pad_input, unpad_input

B, N, H, HKV, D = 4, 9, 4, 2, 8


def _mask(left):
    """[B, N] bool: lengths 5, 9, 1, 7, padded on the right, or on the left (Hugging Face's
    generation) when `left`."""
    lengths = torch.tensor([5, 9, 1, 7])
    pos = torch.arange(N)[None, :]
    return pos >= N - lengths[:, None] if left else pos < lengths[:, None]


def test_unpad_input_returns_flash_attentions_five_values():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, N, H, D, generator=g, dtype=torch.float64)
    mask = _mask(left=True).to(torch.int32)  # Hugging Face passes integer masks
    hidden, indices, cu, max_len, seqused = unpad_input(x, mask)
    assert hidden.shape == (22, H, D) and indices.dtype == torch.int64 and indices.shape == (22,)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 14, 15, 22]
    assert isinstance(max_len, int) and max_len == 9
    assert seqused.dtype == torch.int32 and seqused.tolist() == [5, 9, 1, 7]
    assert torch.equal(hidden, x.reshape(B * N, H, D)[mask.flatten().bool()])
    assert torch.equal(index_first_axis(x.reshape(B * N, H, D), indices), hidden)
    assert torch.equal(pad_input(hidden, indices, B, N), x * mask[:, :, None, None])
    # unused_mask: tokens kept as allocated but unused, counted in cu_seqlens, not in seqused
    unused = torch.zeros(B, N, dtype=torch.bool)
    unused[0, 3] = True  # left padding of sequence 0
    hidden, _, cu, _, seqused = unpad_input(x, mask, unused)
    assert cu.tolist() == [0, 6, 15, 16, 23] and seqused.tolist() == [5, 9, 1, 7] and hidden.shape[0] == 23


def test_gather_and_scatter_are_differentiable():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, N, 3, generator=g, dtype=torch.float64, requires_grad=True)
    mask = _mask(left=False)
    indices = unpad_input(x, mask)[1]
    assert torch.autograd.gradcheck(lambda t: unpad_input(t, mask)[0], (x,))
    rows = torch.randn(len(indices), 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices, B, N), (rows,))
    flat = torch.randn(7, 2, generator=g, dtype=torch.float64, requires_grad=True)
    picks = torch.tensor([4, 0, 4, 6])  # a repeated row sums its gradients
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, picks), (flat,))
    assert torch.autograd.gradcheck(lambda t: index_put_first_axis(t, picks[1:], 7), (flat[:3].detach().requires_grad_(),))


@pytest.mark.parametrize("left, causal", [(False, False), (True, False), (False, True)])
def test_varlen_over_unpadded_rows_equals_the_masked_padded_batch(left, causal):
    """Hugging Face's path (unpad q, k, v, flash_attn_varlen_func, pad the output) against
    scaled_dot_product_attention over the padded batch with a bool key padding mask (and, causal,
    the lower triangle: with right padding each sequence's own diagonal is the batch's)."""
    g = torch.Generator().manual_seed(3 + left + 2 * causal)
    q = torch.randn(B, N, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, N, HKV, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, N, HKV, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(B, N, H, D, generator=g, dtype=torch.float64)  # the loss's weights
    mask = _mask(left)

    qu, indices, cu, max_len, _ = unpad_input(q, mask)
    ku, _, _, _, _ = unpad_input(k, mask)
    vu, _, _, _, _ = unpad_input(v, mask)
    out = pad_input(at.flash_attn_varlen_func(qu, ku, vu, cu, cu, max_len, max_len, causal=causal), indices, B, N)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))

    keep = mask[:, None, None, :]  # [B, 1, 1, N]: keys of the sequence
    if causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool).tril()
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    ref = at.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep, enable_gqa=True).transpose(1, 2)
    ref = ref * mask[:, :, None, None]  # padded query rows: 0, as pad_input leaves them
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))

    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert not out[~mask].any()
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for name, grad in zip("qkv", grads):
        assert not grad[~mask].any(), f"d{name} at padding"


def test_errors_name_the_argument():
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"attention_mask: expected a \[batch, seqlen\] = \[2, 3\] tensor, got \[2, 4\]"):
        unpad_input(x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask: dtype must be bool or an integer dtype, got torch.float32"):
        unpad_input(x, torch.ones(2, 3))
    with pytest.raises(RuntimeError, match=r"indices: expected rows in 0..5 \(first_axis_dim 6\), got 0..6"):
        pad_input(torch.randn(2, 4), torch.tensor([0, 6]), 2, 3)  # also a RuntimeError, as torch's
    with pytest.raises(TypeError, match="seqlen: expected an int, got float"):
        pad_input(torch.randn(2, 4), torch.tensor([0, 1]), 2, 3.0)
    with pytest.raises(ValueError, match="indices: expected a 1-D integer tensor of row indices, got torch.float32"):
        index_first_axis(x, torch.tensor([0.0]))
