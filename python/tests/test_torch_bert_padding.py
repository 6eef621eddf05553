"""attnscale.torch.bert_padding (FlashAttention's flash_attn.bert_padding): pad -> unpad ->
flash_attn_varlen_func -> pad equals the padded batch through a key padding mask, forward and
gradients, float64; return values as FlashAttention 2's; gradients through the gather and scatter."""
import pytest
import torch

import attnscale.torch as at
from attnscale.torch.bert_padding import (index_first_axis, index_put_first_axis, pad_input, unpad_input,
                                         unpad_input_for_concatenated_sequences)

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


# Rows of N = 9 tokens, each holding sequences one after the other: lengths 2, 3 and 4 (full), one
# sequence of 9, one of 1, then 1, 1 and 5 with a 0 between them (entries after the first need not
# be packed to the front), and 7 then padding.
CONCATENATED = [[2, 3, 4, 0, 0, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0, 0],
                [1, 1, 0, 5, 0, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0, 0, 0, 0]]


def _concatenated_reference(lengths):
    """FlashAttention's outputs from the lengths by plain loops: each row's sequences (its nonzero
    entries) in order, over the row's first sum(lengths) tokens."""
    indices, cu, n = [], [0], len(lengths[0])
    for b, row in enumerate(lengths):
        indices += [b * n + t for t in range(sum(row))]
        for length in row:
            if length:
                cu.append(cu[-1] + length)
    return indices, cu, max(length for row in lengths for length in row)


def _segments(lengths, n):
    """[B, N] int: the sequence each token belongs to within its row (1, 2, ...), 0 for padding."""
    seg = torch.zeros(len(lengths), n, dtype=torch.int64)
    for b, row in enumerate(lengths):
        start = 0
        for s, length in enumerate(x for x in row if x):
            seg[b, start:start + length] = s + 1
            start += length
    return seg


def test_unpad_for_concatenated_sequences_returns_flash_attentions_four_values():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, N, H, D, generator=g, dtype=torch.float64)
    for dtype in (torch.int32, torch.int64):
        got = unpad_input_for_concatenated_sequences(x, torch.tensor(CONCATENATED, dtype=dtype))
        assert len(got) == 4
        hidden, indices, cu, max_len = got
        want_indices, want_cu, want_max = _concatenated_reference(CONCATENATED)
        assert indices.dtype == torch.int64 and indices.tolist() == want_indices
        assert cu.dtype == torch.int32 and cu.tolist() == want_cu == [0, 2, 5, 9, 18, 19, 20, 21, 26, 33]
        assert isinstance(max_len, int) and max_len == want_max == 9
        assert torch.equal(hidden, x.reshape(5 * N, H, D)[want_indices])
        assert torch.equal(pad_input(hidden, indices, 5, N), x * (_segments(CONCATENATED, N) > 0)[:, :, None, None])
    # No sequence at all: nothing kept (FlashAttention's max over no lengths raised).
    hidden, indices, cu, max_len = unpad_input_for_concatenated_sequences(x[:2], torch.zeros(2, N, dtype=torch.int64))
    assert hidden.shape == (0, H, D) and indices.numel() == 0 and cu.tolist() == [0] and max_len == 0
    y = torch.randn(2, N, 3, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor(CONCATENATED[3:])
    assert torch.autograd.gradcheck(lambda t: unpad_input_for_concatenated_sequences(t, lengths)[0], (y,))


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_over_concatenated_sequences_equals_the_block_diagonal_padded_batch(causal):
    """Unpad the concatenated rows, flash_attn_varlen_func, pad: each sequence attends within itself,
    as scaled_dot_product_attention over the padded batch with the block-diagonal mask (lower
    triangular in each block, causal) of FlashAttention's docstring; outputs and gradients, float64."""
    B5 = len(CONCATENATED)
    g = torch.Generator().manual_seed(7 + causal)
    q = torch.randn(B5, N, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B5, N, HKV, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B5, N, HKV, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(B5, N, H, D, generator=g, dtype=torch.float64)
    lengths = torch.tensor(CONCATENATED)

    qu, indices, cu, max_len = unpad_input_for_concatenated_sequences(q, lengths)
    ku, vu = (unpad_input_for_concatenated_sequences(t, lengths)[0] for t in (k, v))
    out = pad_input(at.flash_attn_varlen_func(qu, ku, vu, cu, cu, max_len, max_len, causal=causal), indices, B5, N)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))

    seg = _segments(CONCATENATED, N)
    token = (seg > 0)[:, :, None, None]
    keep = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)  # [B, Nq, Nkv]: same sequence
    if causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool).tril()
    keep = keep | torch.eye(N, dtype=torch.bool)  # a padding row sees itself (no NaN; zeroed below)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    ref = at.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep[:, None], enable_gqa=True).transpose(1, 2)
    ref = ref * token
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))

    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_concatenated_lengths_errors_name_the_argument():
    x = torch.randn(2, 4, 3)
    name = "attention_mask_in_length"
    with pytest.raises(ValueError, match=rf"{name}: expected a \[batch, seqlen\] = \[2, 4\] tensor, got \[2, 3\]"):
        unpad_input_for_concatenated_sequences(x, torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match=rf"{name}: dtype must be an integer dtype .*got torch.bool; a bool or 0/1 "
                       "padding mask is unpad_input's"):
        unpad_input_for_concatenated_sequences(x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match=rf"{name}: dtype must be an integer dtype .*got torch.float32"):
        unpad_input_for_concatenated_sequences(x, torch.ones(2, 4))
    with pytest.raises(ValueError, match=rf"{name}: lengths must be >= 0, got -1 at \[1, 0\]"):
        unpad_input_for_concatenated_sequences(x, torch.tensor([[4, 0, 0, 0], [-1, 2, 0, 0]]))
    with pytest.raises(ValueError, match=rf"{name}: row 0's lengths sum to 5, more than its seqlen 4 tokens"):
        unpad_input_for_concatenated_sequences(x, torch.tensor([[2, 3, 0, 0], [1, 0, 0, 0]]))
    with pytest.raises(RuntimeError):  # also a RuntimeError, as FlashAttention's checks
        unpad_input_for_concatenated_sequences(x, torch.tensor([[2, 3, 0, 0], [1, 0, 0, 0]]))
