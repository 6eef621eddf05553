"""attnscale.torch.bert_padding: FlashAttention's flash_attn.bert_padding, between padded batches and
the packed rows flash_attn_varlen_func reads.

Hugging Face's FlashAttention path imports unpad_input, pad_input and index_first_axis from
flash_attn.bert_padding; these have FlashAttention 2's current signatures and return values:

    unpad_input(hidden_states [B, N, ...], attention_mask [B, N], unused_mask=None)
        -> (hidden [total, ...], indices [total], cu_seqlens [B + 1] int32, max_seqlen int, seqused [B] int32)
    unpad_input_for_concatenated_sequences(hidden_states [B, N, ...], attention_mask_in_length [B, N])
        -> (hidden [total, ...], indices [total], cu_seqlens [S + 1] int32, max_seqlen int)
    pad_input(hidden [total, ...], indices, batch, seqlen) -> [batch, seqlen, ...], 0 at the padding
    index_first_axis(x [M, ...], indices) -> x[indices]
    index_put_first_axis(values [total, ...], indices, first_axis_dim) -> zeros with values at indices

unpad_input_for_concatenated_sequences reads rows that each hold several sequences one after the
other; its cu_seqlens runs over those sequences, so flash_attn_varlen_func keeps each to itself.

Token t of sequence b is row b * N + t of the flattened batch; `indices` lists the kept rows in that
order (so each sequence's kept tokens stay in order, packed one sequence after the other), and
cu_seqlens[b] .. cu_seqlens[b + 1] are sequence b's rows of the packed tensor. unpad_input's tuple
had four entries before FlashAttention 2.6.2 added the fifth, seqused (the tokens attention_mask
keeps, without unused_mask's); Hugging Face unpacks it as `hidden, indices, cu, max_len, *_ = ...`.

All are torch operations (index_select, index_copy), differentiable: the gradient of a gather is a
scatter into zeros, that of a scatter a gather. Unlike FlashAttention's, a mask is read as kept
where it is nonzero (FlashAttention sums its values, so a 2 would count twice in cu_seqlens), and
unused_mask joins attention_mask by a logical or (FlashAttention adds them). Lengths that
FlashAttention would turn into outputs that disagree with each other are refused by name: a
negative one, a row whose lengths sum past its seqlen (its cu_seqlens would count tokens its
indices do not hold), and a bool mask (read as lengths, each kept token a sequence of 1); a batch
without any sequence gives cu_seqlens [0] and max_seqlen 0 (FlashAttention's max of nothing raises).
"""
import torch

from .torch_errors import drop_in_errors
from .torch_function import integer


def _check_indices(indices, name="indices"):
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1 or indices.dtype.is_floating_point or (
        indices.dtype == torch.bool
    ):
        got = f"{indices.dtype} {list(indices.shape)}" if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise ValueError(f"{name}: expected a 1-D integer tensor of row indices, got {got}")
    return indices.to(torch.int64)


def _check_rows(name, t, rows_name):
    """t is a tensor of at least 2 dimensions (rows, then each row's shape)."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a tensor of 2 or more dimensions [{rows_name}, ...], got {got}")


def _check_range(indices, rows, what):
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= rows):
        raise ValueError(f"indices: expected rows in 0..{rows - 1} ({what}), got {int(indices.min())}..{int(indices.max())}")


@drop_in_errors
def index_first_axis(input, indices):
    """index_first_axis(input, indices)

    input[indices] along the first axis: input [M, ...], indices [total] int -> [total, ...];
    differentiable (the gradient scatters back into zeros, summing repeated indices)."""
    _check_rows("input", input, "rows")
    indices = _check_indices(indices)
    _check_range(indices, input.shape[0], "the rows of input")
    return input.index_select(0, indices)


@drop_in_errors
def index_put_first_axis(values, indices, first_axis_dim):
    """index_put_first_axis(values, indices, first_axis_dim)

    A tensor [first_axis_dim, ...] of zeros with row indices[i] = values[i]; differentiable (the
    gradient of values gathers those rows)."""
    _check_rows("values", values, "total")
    indices = _check_indices(indices)
    rows = _count("first_axis_dim", first_axis_dim)
    if indices.shape[0] != values.shape[0]:
        raise ValueError(f"indices: {indices.shape[0]} entries for the {values.shape[0]} rows of values")
    _check_range(indices, rows, f"first_axis_dim {rows}")
    return values.new_zeros((rows,) + tuple(values.shape[1:])).index_copy(0, indices, values)


def _count(name, x):
    n = integer(name, x)
    if n < 0:
        raise ValueError(f"{name}: must be >= 0, got {n}")
    return n


def _mask(name, mask, shape):
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != shape:
        got = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name}: expected a [batch, seqlen] = {list(shape)} tensor, got {got}")
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(f"{name}: dtype must be bool or an integer dtype, got {mask.dtype}")
    return mask != 0


@drop_in_errors
def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """unpad_input(hidden_states, attention_mask, unused_mask=None)

    The tokens a padding mask keeps, packed: hidden_states [B, N, ...], attention_mask [B, N] bool or
    integer (nonzero: a token; zero: padding, on either side), unused_mask [B, N] optional (tokens
    kept as allocated but unused; FlashAttention 3's seqused).

    Returns (hidden [total, ...], indices [total] int64 (rows of the flattened [B * N, ...] batch),
    cu_seqlens [B + 1] int32, max_seqlen_in_batch (an int), seqused [B] int32 (attention_mask's
    tokens per sequence)); hidden is differentiable.

    Example:
        >>> import torch
        >>> from attnscale.torch.bert_padding import unpad_input, pad_input
        >>> x = torch.randn(2, 4, 3, 8)                             # [B, N, H, d]
        >>> mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])       # right and left padding
        >>> packed, indices, cu, max_len, _ = unpad_input(x, mask)
        >>> packed.shape, cu.tolist(), max_len
        (torch.Size([6, 3, 8]), [0, 3, 6], 3)
        >>> torch.equal(pad_input(packed, indices, 2, 4), x * mask[:, :, None, None])
        True
    """
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() < 2:
        got = list(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
        raise ValueError(f"hidden_states: expected a [batch, seqlen, ...] tensor, got {got}")
    shape = tuple(hidden_states.shape[:2])
    used = _mask("attention_mask", attention_mask, shape)
    kept = used if unused_mask is None else used | _mask("unused_mask", unused_mask, shape)
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    indices = kept.flatten().nonzero().flatten()
    cu_seqlens = torch.cat((torch.zeros(1, dtype=torch.int32), seqlens.cumsum(0, dtype=torch.int32)))
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    rows = hidden_states.reshape((shape[0] * shape[1],) + tuple(hidden_states.shape[2:]))
    return rows.index_select(0, indices), indices, cu_seqlens, max_seqlen, used.sum(dim=-1, dtype=torch.int32)


@drop_in_errors
def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length)

    Rows that each hold several short sequences one after the other (packed samples for
    fine-tuning), as packed rows of their own sequences: hidden_states [B, N, ...];
    attention_mask_in_length [B, N] integer, row b listing the lengths of the sequences that
    row b holds, in order (its nonzero entries; a 0 is none), so that row b's first sum(row b)
    tokens are kept and the rest are padding.

    Returns (hidden [total, ...], indices [total] int64 (rows of the flattened [B * N, ...] batch),
    cu_seqlens [S + 1] int32 over the S sequences of all rows in order, max_seqlen_in_batch (an
    int)), FlashAttention's four values; hidden is differentiable. flash_attn_varlen_func over them
    attends within each sequence alone (the block-diagonal mask of FlashAttention's docstring).

    Example:
        >>> import torch
        >>> from attnscale.torch.bert_padding import unpad_input_for_concatenated_sequences as unpad
        >>> x = torch.randn(2, 6, 3, 8)                                    # [B, N, H, d]
        >>> lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
        >>> packed, indices, cu, max_len = unpad(x, lengths)
        >>> packed.shape, cu.tolist(), max_len
        (torch.Size([11, 3, 8]), [0, 2, 5, 11], 6)
    """
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() < 2:
        got = list(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
        raise ValueError(f"hidden_states: expected a [batch, seqlen, ...] tensor, got {got}")
    shape = tuple(hidden_states.shape[:2])
    name = "attention_mask_in_length"
    lengths = attention_mask_in_length
    if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != shape:
        got = list(lengths.shape) if isinstance(lengths, torch.Tensor) else type(lengths).__name__
        raise ValueError(f"{name}: expected a [batch, seqlen] = {list(shape)} tensor, got {got}")
    # A bool padding mask read as lengths would make each kept token a sequence of its own.
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"{name}: dtype must be an integer dtype (the lengths of each row's sequences), got "
                        f"{lengths.dtype}; a bool or 0/1 padding mask is unpad_input's")
    lengths = lengths.to(torch.int64)
    if lengths.numel() and int(lengths.min()) < 0:
        b, j = (int(i) for i in (lengths < 0).nonzero()[0])
        raise ValueError(f"{name}: lengths must be >= 0, got {int(lengths[b, j])} at [{b}, {j}]")
    used = lengths.sum(dim=-1)
    if used.numel() and int(used.max()) > shape[1]:
        b = int((used > shape[1]).nonzero()[0, 0])
        raise ValueError(f"{name}: row {b}'s lengths sum to {int(used[b])}, more than its seqlen {shape[1]} tokens")
    # Row b keeps its first used[b] tokens (where its sequences lie); the sequences are the nonzero
    # entries, row after row, so cu_seqlens runs over them in the order their rows are packed.
    kept = torch.arange(shape[1], device=lengths.device)[None, :] < used[:, None]
    indices = kept.flatten().nonzero().flatten()
    seqlens = lengths.flatten()[lengths.flatten() != 0]
    cu_seqlens = torch.cat((torch.zeros(1, dtype=torch.int32), seqlens.cumsum(0, dtype=torch.int32)))
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    rows = hidden_states.reshape((shape[0] * shape[1],) + tuple(hidden_states.shape[2:]))
    return rows.index_select(0, indices), indices, cu_seqlens, max_seqlen


@drop_in_errors
def pad_input(hidden_states, indices, batch, seqlen):
    """pad_input(hidden_states, indices, batch, seqlen)

    unpad_input undone: hidden_states [total, ...] put at rows `indices` of a [batch * seqlen, ...]
    tensor of zeros, returned as [batch, seqlen, ...]; differentiable."""
    batch, seqlen = _count("batch", batch), _count("seqlen", seqlen)
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape((batch, seqlen) + tuple(out.shape[1:]))
