"""Attention in float64 PyTorch ops, the ground truth of the tests: matmul, softmax, matmul.

Shapes as in attnscale: q [..., Nq, dk], k [..., Nkv, dk], v [..., Nkv, dv] with 2-4 dimensions;
k and v may have fewer heads than q (expanded with repeat_interleave, as grouped-query attention
reads kv head h // (Hq // Hkv)). Differentiable, so autograd gives the reference gradients.
"""
import math

import numpy as np
import torch


def _rank4(t):
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def scale_value(scale, dk):
    if scale is None or scale == "sqrt":
        return 1.0 / math.sqrt(dk)
    if scale == "none":
        return 1.0
    if scale == "linear":
        return 1.0 / dk
    return float(scale)


def keep_matrix(nq, nkv, causal=None, window=None, align=None):
    """Bool [Nq, Nkv]: which keys the causal and window parts of a mask let each query see."""
    bottom_right = causal == "bottom-right" or align == "bottom-right"
    i = torch.arange(nq)[:, None]
    j = torch.arange(nkv)[None, :]
    diag = i + (nkv - nq if bottom_right else 0)
    keep = torch.ones(nq, nkv, dtype=torch.bool)
    if causal:
        keep &= j <= diag
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            keep &= j >= diag - left
        if right is not None and right >= 0:
            keep &= j <= diag + right
    return keep


def attention(q, k, v, scale=None, causal=None, window=None, align=None, mask=None):
    """(out, lse, probs) in float64 torch tensors shaped like attnscale's outputs."""
    as_t = lambda x: x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
    q, k, v = (as_t(x).to(torch.float64) for x in (q, k, v))
    q_shape = q.shape
    q4, k4, v4 = _rank4(q), _rank4(k), _rank4(v)
    group = q4.shape[1] // k4.shape[1]
    k4 = k4.repeat_interleave(group, dim=1)
    v4 = v4.repeat_interleave(group, dim=1)
    nq, nkv = q4.shape[2], k4.shape[2]
    scores = q4 @ k4.transpose(-1, -2) * scale_value(scale, q4.shape[3])
    keep = keep_matrix(nq, nkv, causal, window, align).expand_as(scores)
    if mask is not None:
        m = as_t(mask)
        if m.dtype in (torch.bool, torch.uint8):
            keep = keep & (m != 0)
        else:
            scores = scores + m.to(torch.float64)
    scores = scores.masked_fill(~keep, -math.inf)
    # Softmax with the row maximum subtracted; a row with every key masked gives probs 0.
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(dim=-1, keepdim=True)
    probs = e / torch.where(total > 0, total, torch.ones_like(total))
    lse = (row_max + torch.log(total)).squeeze(-1)
    out = probs @ v4
    lead = tuple(q_shape[:-1])
    return out.reshape(lead + (v4.shape[-1],)), lse.reshape(lead), probs.reshape(lead + (nkv,))


def sdpa(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch 2's documented math for F.scaled_dot_product_attention, in float64.

    A row whose every key is masked gives 0 (PyTorch's _safe_softmax from 2.5 on; softmax alone gives NaN).
    """
    query, key, value = (t.to(torch.float64) for t in (query, key, value))
    L, S = query.size(-2), key.size(-2)
    s = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    bias = torch.zeros(L, S, dtype=torch.float64)
    if is_causal:
        bias.masked_fill_(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = bias.masked_fill(~attn_mask, -math.inf)
        else:
            bias = attn_mask.to(torch.float64) + bias
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    scores = query @ key.transpose(-2, -1) * s + bias
    p = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(p, nan=0.0) @ value


def flash(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, softcap=0.0, probs=False):
    """FlashAttention's documented semantics in float64, [B, N, H, d] layout: (out, lse), and with
    probs=True also the probabilities [B, H, Nq, Nkv].

    Diagonal bottom-right (query i at key i + Nkv - Nq); window (left, right), -1 unbounded;
    softcap c > 0 caps the scaled scores to c tanh(s / c), then ALiBi adds -slope * |i + Nkv - Nq - j|.
    A row with no visible key gives out 0 and lse +inf.
    """
    q, k, v = (t.to(torch.float64).transpose(1, 2) for t in (q, k, v))  # [B, H, N, d]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    nq, nkv = q.shape[2], k.shape[2]
    scale = 1 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    scores = q @ k.transpose(-1, -2) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(nq)[:, None] + nkv - nq
    j = torch.arange(nkv)[None, :]
    left, right = window_size
    right = 0 if causal else right
    keep = torch.ones(nq, nkv, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(torch.float64).reshape(-1, q.shape[1], 1, 1)
        scores = scores - slopes * (i - j).abs()
    scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, -1)
    p = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
    out, lse = (p @ v).transpose(1, 2), lse.masked_fill(lse == -math.inf, math.inf)
    return (out, lse, p) if probs else (out, lse)


def case_options(gen, case):
    """The options of a test case (B, .., H at index 3, .., options last) with "per-head" or
    "per-batch" alibi_slopes drawn as tensors of (H,) or (B, H) random slopes."""
    B, H, opts = case[0], case[3], dict(case[-1])
    if opts.get("alibi_slopes") == "per-head":
        opts["alibi_slopes"] = torch.rand(H, generator=gen)
    elif opts.get("alibi_slopes") == "per-batch":
        opts["alibi_slopes"] = torch.rand(B, H, generator=gen)
    return opts
