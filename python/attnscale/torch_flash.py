"""flash_attn_func and flash_attn_varlen_func with FlashAttention 2's arguments and layout.

FlashAttention (flash_attn/flash_attn_interface.py) takes q [B, Nq, H, d], k and v [B, Nkv, Hkv, d]
(varlen: q [total_q, H, d] packed, sequence b in rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]) and
aligns its diagonal bottom-right: query i sits at key position i + Nkv - Nq, causal keeps keys
j <= i + Nkv - Nq, and window_size (left, right) keeps i + Nkv - Nq - left <= j <= i + Nkv - Nq +
right (-1: unbounded). alibi_slopes (H,) or (B, H) add -slope * |i + Nkv - Nq - j| to the scaled
scores. The [B, N, H, d] tensors are read in place through a transposed view (strides, no copy).

ALiBi's bias depends on j - i only (a Toeplitz matrix), so each head's [Nq, Nkv] bias is one
array of Nq + Nkv - 1 values read with a row stride of -1 element: the kernels take it as an
additive mask of O(H (Nq + Nkv)) memory, not O(H Nq Nkv).
"""
import math

import numpy as np
import torch

from .torch_function import Attention


def _options(softmax_scale, causal, window_size):
    """attnscale's keywords for FlashAttention's softmax_scale, causal and window_size."""
    left, right = (int(w) for w in window_size)
    window = None if left < 0 and right < 0 else (None if left < 0 else left, None if right < 0 else right)
    return dict(
        scale=None if softmax_scale is None else float(softmax_scale),
        causal="bottom-right" if causal else None,
        window=window,
        align="bottom-right",
    )


def _refuse(dropout_p, softcap):
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: only 0.0 is supported, got {dropout_p}")
    if softcap != 0.0:
        raise ValueError(f"softcap: only 0.0 (off) is supported, got {softcap}")


def alibi_bias(slopes, heads, nq, nkv, dtype):
    """-slope[b, h] * |i + nkv - nq - j| as a numpy [B|1, H, nq, nkv] view of [B|1, H, nq + nkv - 1].

    Row i of head h is the slice starting at t = nq - 1 - i of a[h, t] = bias at j - i = t - (nq - 1):
    element (i, j) sits at t = nq - 1 - i + j, hence strides (-1, +1) elements from a[h, nq - 1].
    """
    if not isinstance(slopes, torch.Tensor) or slopes.dim() not in (1, 2) or slopes.shape[-1] != heads:
        shape = list(slopes.shape) if isinstance(slopes, torch.Tensor) else type(slopes).__name__
        raise ValueError(f"alibi_slopes: expected a tensor of shape ({heads},) or (batch, {heads}), got {shape}")
    s = slopes.detach().to(torch.float64).reshape(-1, heads).numpy().astype(dtype)
    t = np.arange(-(nq - 1), nkv, dtype=dtype)
    a = -s[:, :, None] * np.abs(t - (nkv - nq))
    e = a.itemsize
    return np.lib.stride_tricks.as_strided(
        a[:, :, nq - 1 :], shape=(a.shape[0], heads, nq, nkv), strides=(a.strides[0], a.strides[1], -e, e)
    )


def _attend(q, k, v, alibi_slopes, options):
    """(out [.., Nq, H, dv] contiguous, lse [.., H, Nq]) of [.., N, H, d] views (3-D or 4-D)."""
    qh, kh, vh = (t.transpose(-3, -2) for t in (q, k, v))
    nq, nkv = qh.shape[-2], kh.shape[-2]
    bias = None
    if alibi_slopes is not None:
        dtype = np.float64 if q.dtype == torch.float64 else np.float32
        bias = alibi_bias(alibi_slopes, qh.shape[-3], nq, nkv, dtype)
    out, lse = Attention.apply(qh, kh, vh, bias, options, options)
    # FlashAttention's log-sum-exp of a row with no visible key is +inf.
    lse = lse.masked_fill(lse == -math.inf, math.inf)
    return out.transpose(-3, -2).contiguous(), lse


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

    A drop-in for FlashAttention 2's flash_attn_func on CPU tensors (float32, float64, bfloat16).

    q [B, Nq, H, d], k and v [B, Nkv, Hkv, d] (H % Hkv == 0: grouped-query attention), read in
    place. softmax_scale: None (1/sqrt(d)) or a number. causal: keys j <= i + Nkv - Nq (aligned
    bottom-right). window_size (left, right), -1 unbounded, around the same diagonal.
    alibi_slopes (H,) or (B, H): -slope * |i + Nkv - Nq - j| added to the scaled scores.
    deterministic: accepted; attnscale's backward is always deterministic. dropout_p and softcap
    must be 0.

    Returns out [B, Nq, H, dv] (contiguous); with return_attn_probs, (out, softmax_lse [B, H, Nq],
    None): as FlashAttention, the probabilities come back only under dropout. A row with no
    visible key gives out 0 and softmax_lse +inf. Differentiable with respect to q, k and v.

    Example:
        >>> import torch, attnscale.torch as at
        >>> q = torch.randn(2, 10, 8, 16, requires_grad=True)    # [B, N, H, d]
        >>> kv = torch.randn(2, 12, 2, 16, requires_grad=True)   # 2 kv heads
        >>> out = at.flash_attn_func(q, kv, kv, causal=True)
        >>> out.sum().backward(); out.shape
        torch.Size([2, 10, 8, 16])
    """
    _refuse(dropout_p, softcap)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected a [batch, seqlen, heads, headdim] tensor, got {shape}")
    out, lse = _attend(q, k, v, alibi_slopes, _options(softmax_scale, causal, window_size))
    return (out, lse, None) if return_attn_probs else out


def _offsets(name, cu_seqlens, total, max_seqlen, max_name):
    """cu_seqlens as a list of ints, checked: 0 first, `total` last, non-decreasing, within max."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
        raise ValueError(f"{name}: expected a 1-D integer tensor of batch + 1 offsets")
    cu = [int(x) for x in cu_seqlens.tolist()]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != total or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0 to {total} (the packed rows), got {cu}")
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    if longest > max_seqlen:
        raise ValueError(f"{max_name}: {max_seqlen} is shorter than a sequence of {name} ({longest})")
    return cu


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
    attends only within itself; causal and window_size align each sequence's own diagonal
    bottom-right. max_seqlen_q/k bound the lengths (checked). Other arguments as flash_attn_func;
    block_table (a paged KV cache) must be None.

    Returns out [total_q, H, dv]; with return_attn_probs, (out, softmax_lse [H, total_q], None).

    Example:
        >>> import torch, attnscale.torch as at
        >>> q = torch.randn(3 + 7, 4, 16)                        # two sequences: 3 and 7 tokens
        >>> cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        >>> at.flash_attn_varlen_func(q, q, q, cu, cu, 7, 7, causal=True).shape
        torch.Size([10, 4, 16])
    """
    _refuse(dropout_p, softcap)
    if block_table is not None:
        raise ValueError("block_table: a paged KV cache is not supported here; pass None")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected a [total, heads, headdim] tensor, got {shape}")
    cq = _offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q")
    ck = _offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k")
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_k: {len(ck) - 1} sequences, cu_seqlens_q has {len(cq) - 1}")
    if alibi_slopes is not None and alibi_slopes.dim() == 2 and alibi_slopes.shape[0] != len(cq) - 1:
        raise ValueError(f"alibi_slopes: expected (heads,) or ({len(cq) - 1}, heads), got {list(alibi_slopes.shape)}")
    options = _options(softmax_scale, causal, window_size)
    heads, dv = q.shape[1], v.shape[2]
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    outs, lses = [], []
    # One kernel call per sequence, each on views of the packed tensors.
    for b in range(len(cq) - 1):
        qb, kb, vb = q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]]
        if qb.shape[0] == 0 or kb.shape[0] == 0:  # nothing to attend to: out 0, lse +inf
            outs.append(q.new_zeros(qb.shape[0], heads, dv))
            lses.append(torch.full((heads, qb.shape[0]), math.inf, dtype=lse_dtype))
            continue
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        out, lse = _attend(qb, kb, vb, slopes, options)
        outs.append(out)
        lses.append(lse)
    out = torch.cat(outs, dim=0)
    if not return_attn_probs:
        return out
    return out, torch.cat(lses, dim=1), None
