"""flash_attn_func and flash_attn_varlen_func with FlashAttention 2's arguments and layout.

FlashAttention (flash_attn/flash_attn_interface.py) takes q [B, Nq, H, d], k and v [B, Nkv, Hkv, d]
(varlen: q [total_q, H, d] packed, sequence b in rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]) and
aligns its diagonal bottom-right: query i sits at key position i + Nkv - Nq, causal keeps keys
j <= i + Nkv - Nq, and window_size (left, right) keeps i + Nkv - Nq - left <= j <= i + Nkv - Nq +
right (-1: unbounded). alibi_slopes (H,) or (B, H) add -slope * |i + Nkv - Nq - j| to the scaled
scores, softcap c > 0 turns each scaled score x into c tanh(x / c), and dropout_p drops each
probability with that chance (kept ones scaled by 1/(1 - p)); the kernels do all three. The
[B, N, H, d] tensors are read in place through a transposed view (strides, no copy); packed
sequences go to the kernels in one call, as [H, total, d] views.
"""
import math
import operator

import torch
from torch.overrides import handle_torch_function, has_torch_function_variadic

from . import _attnscale
from .torch_errors import drop_in_errors
from .torch_threads import with_threads
from .torch_function import (as_float16, attend, check_operands, dropout_keywords, float16_as_float32, from_numpy,
                             integer, real, refuse_tracing, to_numpy)


def window_sides(window_size):
    """(left, right) ints of FlashAttention's window_size; a TypeError naming it for anything else
    (1.7 is not cut to 1, nor True read as 1)."""
    try:
        left, right = window_size
        if isinstance(left, bool) or isinstance(right, bool):
            raise TypeError
        return operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected (left, right), two ints (-1: unbounded), got {window_size!r}") from None


def kernel_window(window_size, causal, seqlen_k):
    """(left, right): the window FlashAttention's kernels apply for window_size, causal and seqlen_k
    (max_seqlen_k for packed sequences, the cache's capacity for a KV cache), as its mha_fwd and
    set_params_fprop set them: a side of seqlen_k or more is -1, causal makes the right side 0, and
    a left side without a right one gets seqlen_k on the right. FlashAttention's docstring gives
    the formula without these steps; they change the result only where a query row sits more than
    seqlen_k keys before the last key (Nq > Nkv + 1): window_size=(-1, Nkv) is then no window, and
    (left, -1) hides every key from the first rows."""
    left, right = (-1 if side >= seqlen_k else side for side in window_sides(window_size))
    if causal:
        right = 0
    if left >= 0 and right < 0:
        right = seqlen_k
    return left, right


def _options(softmax_scale, causal, window_size, softcap, alibi_slopes, heads, dropout_p):
    """attnscale's keywords for FlashAttention's arguments (checked under FlashAttention's names);
    window_size as kernel_window gives it."""
    left, right = window_sides(window_size)
    window = None if left < 0 and right < 0 else (None if left < 0 else left, None if right < 0 else right)
    options = dict(
        scale=None if softmax_scale is None else real("softmax_scale", softmax_scale),
        causal="bottom-right" if causal else None,
        window=window,
        align="bottom-right",
        softcap=max(real("softcap", softcap), 0.0),  # FlashAttention's "<= 0.0 means deactivate"
        **dropout_keywords(dropout_p),
    )
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dim() not in (1, 2) or alibi_slopes.shape[-1] != heads:
            got = list(alibi_slopes.shape) if isinstance(alibi_slopes, torch.Tensor) else type(alibi_slopes).__name__
            raise ValueError(f"alibi_slopes: expected a tensor of shape ({heads},) or (batch, {heads}), got {got}")
        if not alibi_slopes.dtype.is_floating_point:
            # FlashAttention refuses every dtype but float32 ("ALiBi slopes must have dtype fp32");
            # other float dtypes are taken here (read as float64), integers refused as there.
            raise TypeError(f"alibi_slopes: dtype must be float32 (or another float dtype), got {alibi_slopes.dtype}")
        # A copy: the backward reads the slopes this forward used, whatever happens to the tensor.
        options["alibi_slopes"] = to_numpy("alibi_slopes", alibi_slopes.detach().to(torch.float64, copy=True))
    return options


def _check_shapes(q, k, v):
    """FlashAttention's rules for q [B, Nq, H, d] and k, v [B, Nkv, Hkv, d] (packed: [total, H, d]),
    in its layout and names: the kernels would report them on the transposed views, [B, H, N, d]."""
    check_operands(q, k, v, float16=True)
    # The shapes for a message, written out only when one is raised.
    shown = lambda: f"(q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)})"
    q_shape, k_shape = q.shape, k.shape
    if k_shape[:-1] != v.shape[:-1]:
        raise ValueError(f"v: expected the {'batch, ' if k.dim() == 4 else ''}seqlen and heads of k {shown()}")
    if len(k_shape) == 4 and k_shape[0] != q_shape[0]:
        raise ValueError(f"k, v: batch {k_shape[0]} differs from q's {q_shape[0]} {shown()}")
    if k_shape[-1] != q_shape[-1]:
        raise ValueError(f"k: headdim {k_shape[-1]} differs from q's {q_shape[-1]} {shown()}")
    if q_shape[-1] == 0:
        raise ValueError(f"q: headdim must be positive {shown()}")
    heads, heads_k = q_shape[-2], k_shape[-2]
    if heads_k == 0 or heads % heads_k:
        raise ValueError(f"k, v: {heads_k} heads do not divide q's {heads} heads {shown()}")


def _keyless_as_inf(lse):
    """lse with FlashAttention's +inf where a row has no visible key (attnscale's -inf). Most calls
    have no such row: the minimum (one small reduction) says so without the comparison and copy of
    masked_fill; a NaN minimum (NaN propagates, hiding any -inf) takes the masked_fill too."""
    if lse.numel():
        low = float((lse.detach() if lse.requires_grad else lse).min())
        if low != -math.inf and low == low:
            return lse
    return lse.masked_fill(lse == -math.inf, math.inf)


def _attend(q, k, v, options, want_probs=False):
    """(out [.., N, H, dv] contiguous, lse [.., H, N], probs or None) of [.., N, H, d] tensors (4-D,
    or 3-D packed). probs (when asked for) are the kernel's: [B, H, Nq, Nkv] (packed: [H, total_q,
    total_k], each sequence's diagonal block), the softmax with dropped pairs negated. float16
    (FlashAttention's usual dtype; the kernels have none) is computed in float32, as FlashAttention
    accumulates it, and out comes back as float16 (lse and probs float32, as FlashAttention's).
    No key (Nkv = 0) gives out 0 and lse +inf, as FlashAttention's mha_fwd does."""
    _check_shapes(q, k, v)
    (q, k, v), half = float16_as_float32(q, k, v)
    qh, kh, vh = (t.transpose(-3, -2) for t in (q, k, v))
    out, lse = attend(qh, kh, vh, None, options, options, checked=True)
    # FlashAttention's log-sum-exp of a row with no visible key is +inf.
    lse = _keyless_as_inf(lse)
    probs = None
    if want_probs and 0 in qh.shape[:-1] + kh.shape[:-1]:
        probs = lse.new_zeros(qh.shape[:-1] + kh.shape[-2:-1])
    elif want_probs:
        arrays = [to_numpy(name, t) for name, t in (("q", qh), ("k", kh), ("v", vh))]
        probs = from_numpy(_attnscale.attention(*arrays, return_probs=True, **with_threads(options))[1])
    out = out.transpose(-3, -2).contiguous()
    return (as_float16(out) if half else out), lse, probs


def check_rank(name, t, layout):
    """t is a tensor with as many dimensions as `layout` ("[batch, seqlen, ...]") names."""
    refuse_tracing()
    _check_rank(name, t, layout)


def _check_rank(name, t, layout):
    """check_rank without refuse_tracing, for a caller that has called it."""
    if not isinstance(t, torch.Tensor) or t.dim() != layout.count(",") + 1:
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a {layout} tensor, got {shape}")


def _check_layout(q, k, v, layout):
    """q, k and v are tensors of the dimensions `layout` names."""
    refuse_tracing()
    _check_rank("q", q, layout)
    _check_rank("k", k, layout)
    _check_rank("v", v, layout)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)

    A drop-in for FlashAttention 2's flash_attn_func on CPU tensors (float32, float64, bfloat16;
    float16 computed in float32 and returned as float16).

    q [B, Nq, H, d], k and v [B, Nkv, Hkv, d] (H % Hkv == 0: grouped-query attention), read in
    place. softmax_scale: None (1/sqrt(d)) or a number. causal: keys j <= i + Nkv - Nq (aligned
    bottom-right). window_size (left, right), ints, -1 unbounded, around the same diagonal, as
    FlashAttention's kernels apply it (kernel_window: a side of Nkv or more is -1, a left side
    alone gets Nkv on its right).
    alibi_slopes (H,) or (B, H): -slope * |i + Nkv - Nq - j| added to the scaled scores.
    softcap: <= 0 (off) or c > 0: scores become c * tanh(score / c). dropout_p: dropout on the
    probabilities (kept ones scaled by 1/(1 - p)), its mask drawn from torch's default generator
    (torch.manual_seed fixes it) and regenerated, not stored, by the backward.
    deterministic: accepted; attnscale's backward is always deterministic.

    Returns out [B, Nq, H, dv] (contiguous); with return_attn_probs, (out, softmax_lse [B, H, Nq],
    S_dmask) in FlashAttention's order: S_dmask is the attention probabilities [B, H, Nq, Nkv]
    (float32, float64 for float64 inputs; not rounded up to a block size as on a GPU) after softcap,
    ALiBi and the masks, before dropout; under dropout the pairs it removed are negated (negative:
    dropped), as FlashAttention encodes them. (FlashAttention itself gives no S_dmask without
    dropout; here it is the plain softmax then.)
    They come from a second forward pass with the same dropout mask; like FlashAttention's, they
    are for testing and carry no gradient. A row with no visible key gives out 0 and softmax_lse
    +inf (Nkv = 0 too). Differentiable with respect to q, k and v.

    Example:
        >>> import torch, attnscale.torch as at
        >>> q = torch.randn(2, 10, 8, 16, requires_grad=True)    # [B, N, H, d]
        >>> kv = torch.randn(2, 12, 2, 16, requires_grad=True)   # 2 kv heads
        >>> out = at.flash_attn_func(q, kv, kv, causal=True)
        >>> out.sum().backward(); out.shape
        torch.Size([2, 10, 8, 16])
    """
    if has_torch_function_variadic(q, k, v, alibi_slopes):
        return handle_torch_function(
            flash_attn_func, (q, k, v, alibi_slopes), q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale,
            causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
            deterministic=deterministic, return_attn_probs=return_attn_probs)
    return _flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                            return_attn_probs)


@drop_in_errors
def _flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs):
    _check_layout(q, k, v, "[batch, seqlen, heads, headdim]")
    window = kernel_window(window_size, causal, k.shape[1])
    options = _options(softmax_scale, causal, window, softcap, alibi_slopes, q.shape[2], dropout_p)
    out, lse, s_dmask = _attend(q, k, v, options, want_probs=return_attn_probs)
    return (out, lse, s_dmask) if return_attn_probs else out


def _offsets(name, cu_seqlens, total, max_seqlen, max_name):
    """cu_seqlens as a list of ints, checked: 0 first, `total` last, non-decreasing, within max."""
    max_seqlen = integer(max_name, max_seqlen)  # an int, as FlashAttention's binding takes
    if (not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point
            or cu_seqlens.dtype == torch.bool):
        raise ValueError(f"{name}: expected a 1-D integer tensor of batch + 1 offsets")
    cu = [int(x) for x in cu_seqlens.tolist()]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != total or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0 to {total} (the packed rows), got {cu}")
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    if longest > max_seqlen:
        raise ValueError(f"{max_name}: {max_seqlen} is shorter than a sequence of {name} ({longest})")
    return cu


def check_block_table(block_table, batch):
    """block_table is an integer tensor [batch, max_blocks]."""
    if (not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != batch
            or block_table.dtype.is_floating_point or block_table.dtype == torch.bool):
        got = f"{block_table.dtype} {list(block_table.shape)}" if isinstance(block_table, torch.Tensor) else type(block_table).__name__
        raise ValueError(f"block_table: expected an integer tensor [{batch}, max_blocks], got {got}")


def _paged_rows(k, v, block_table, cu):
    """The keys and values of a paged cache [num_blocks, block_size, Hkv, d], sequence b's first
    cu[b+1] - cu[b] keys of its blocks (block_table [batch, max_blocks]), packed [total, Hkv, d]."""
    batch = len(cu) - 1
    check_block_table(block_table, batch)
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"v: expected shape {list(k.shape[:3])} + [headdim], got {list(v.shape)}")
    size, table = k.shape[1], block_table.to(torch.int64)
    seq, pos = [], []
    for b in range(batch):
        n = cu[b + 1] - cu[b]
        if n > size * table.shape[1]:
            raise ValueError(f"cu_seqlens_k: sequence {b} has {n} keys, more than its {table.shape[1]} blocks of {size} hold")
        seq.append(torch.full((n,), b, dtype=torch.int64))
        pos.append(torch.arange(n))
    seq, pos = torch.cat(seq), torch.cat(pos)
    blocks = table[seq, pos // size]
    bad = ((blocks < 0) | (blocks >= k.shape[0])).nonzero()
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"block_table[{int(seq[i])}][{int(pos[i]) // size}] = {int(blocks[i])}: outside 0..{k.shape[0] - 1}, "
                         "the cache's blocks")
    return k[blocks, pos % size], v[blocks, pos % size]


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None)

    A drop-in for FlashAttention 2's flash_attn_varlen_func: sequences of different lengths packed
    without padding. q [total_q, H, d], k and v [total_k, Hkv, d]; sequence b holds query rows
    cu_seqlens_q[b] .. cu_seqlens_q[b+1] and key rows cu_seqlens_k[b] .. cu_seqlens_k[b+1], and
    attends only within itself (one kernel call for all of them); causal and window_size align
    each sequence's own diagonal bottom-right; alibi_slopes are (H,) or (batch, H) per sequence.
    max_seqlen_q/k bound the lengths (checked). Other arguments as flash_attn_func. block_table
    [batch, max_blocks] (integers): k and v are a paged cache [num_blocks, block_size, Hkv, d]
    instead (vLLM's layout), sequence b's keys 0 .. cu_seqlens_k[b+1] - cu_seqlens_k[b] - 1 in
    blocks block_table[b][0], [1], ..: gathered (a copy) into the packed layout, gradients flowing
    back to the cache's rows.

    Returns out [total_q, H, dv]; with return_attn_probs, (out, softmax_lse [H, total_q], S_dmask):
    S_dmask [batch, H, max_seqlen_q, max_seqlen_k], sequence b's probabilities in its top-left
    corner (0 beyond its lengths), dropped pairs negated, as
    flash_attn_func's.

    Example:
        >>> import torch, attnscale.torch as at
        >>> q = torch.randn(3 + 7, 4, 16)                        # two sequences: 3 and 7 tokens
        >>> cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        >>> at.flash_attn_varlen_func(q, q, q, cu, cu, 7, 7, causal=True).shape
        torch.Size([10, 4, 16])
    """
    if has_torch_function_variadic(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, block_table):
        return handle_torch_function(
            flash_attn_varlen_func, (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, block_table), q, k, v,
            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=dropout_p, softmax_scale=softmax_scale,
            causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
            deterministic=deterministic, return_attn_probs=return_attn_probs, block_table=block_table)
    return _flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                   softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                                   block_table)


@drop_in_errors
def _flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                            causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table):
    if block_table is not None:
        check_rank("q", q, "[total, heads, headdim]")
        check_rank("k", k, "[num_blocks, block_size, heads_k, headdim]")
        check_rank("v", v, "[num_blocks, block_size, heads_k, headdim]")
        total_k = int(cu_seqlens_k[-1]) if isinstance(cu_seqlens_k, torch.Tensor) and cu_seqlens_k.numel() else 0
        ck = _offsets("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k, "max_seqlen_k")
        k, v = _paged_rows(k, v, block_table, ck)
    _check_layout(q, k, v, "[total, heads, headdim]")
    cq = _offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q")
    ck = _offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k")
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_k: {len(ck) - 1} sequences, cu_seqlens_q has {len(cq) - 1}")
    max_seqlen_q, max_seqlen_k = integer("max_seqlen_q", max_seqlen_q), integer("max_seqlen_k", max_seqlen_k)
    if isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.dim() == 2 and alibi_slopes.shape[0] != len(cq) - 1:
        raise ValueError(f"alibi_slopes: expected (heads,) or ({len(cq) - 1}, heads), got {list(alibi_slopes.shape)}")
    window = kernel_window(window_size, causal, max_seqlen_k)
    options = _options(softmax_scale, causal, window, softcap, alibi_slopes, q.shape[1], dropout_p)
    # Copies, as alibi_slopes: the backward reads the offsets this forward used.
    options.update(cu_seqlens_q=cu_seqlens_q.to(torch.int64, copy=True).numpy(),
                   cu_seqlens_k=cu_seqlens_k.to(torch.int64, copy=True).numpy())
    out, lse, packed = _attend(q, k, v, options, want_probs=return_attn_probs)
    if not return_attn_probs:
        return out
    # [H, total_q, total_k] block-diagonal -> [batch, H, max_seqlen_q, max_seqlen_k]
    s_dmask = packed.new_zeros((len(cq) - 1, packed.shape[0], max_seqlen_q, max_seqlen_k))
    for b in range(len(cq) - 1):
        nq, nk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        s_dmask[b, :, :nq, :nk] = packed[:, cq[b] : cq[b + 1], ck[b] : ck[b + 1]]
    return out, lse, s_dmask
