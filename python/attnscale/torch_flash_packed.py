"""FlashAttention 2's packed calls: q, k and v (or k and v) stacked in one tensor, as a fused QKV
projection writes them.

    flash_attn_qkvpacked_func(qkv [B, N, 3, H, d], ...)
        = flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], ...)
    flash_attn_kvpacked_func(q, kv [B, Nkv, 2, Hkv, d], ...)
        = flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], ...)
    flash_attn_varlen_qkvpacked_func(qkv [total, 3, H, d], cu_seqlens, max_seqlen, ...)
    flash_attn_varlen_kvpacked_func(q, kv [total_k, 2, Hkv, d], cu_seqlens_q, cu_seqlens_k, ...)
        the same on packed sequences (flash_attn_varlen_func)

The parts are views of the stacked tensor (read in place, no copy); autograd gathers their
gradients into one gradient of the stacked tensor. Every other argument is flash_attn_func's or
flash_attn_varlen_func's.
"""
import torch
from torch.overrides import handle_torch_function, has_torch_function_variadic

from .torch_errors import drop_in_errors
from .torch_flash import flash_attn_func, flash_attn_varlen_func


@drop_in_errors
def _parts(name, t, layout, count):
    """The `count` views of t [.., count, heads, headdim] along its stacked dimension (-3); the functions'
    only check of their own (flash_attn_func and flash_attn_varlen_func check the rest)."""
    if not isinstance(t, torch.Tensor) or t.dim() != layout.count(",") + 1 or t.shape[-3] != count:
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a {layout} tensor, got {shape}")
    return t.unbind(-3)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)

    FlashAttention 2's flash_attn_qkvpacked_func: flash_attn_func on the views q, k, v of
    qkv [B, N, 3, H, d]. Returns out [B, N, H, d] (and softmax_lse, S_dmask with
    return_attn_probs); qkv gets one gradient.

    Example:
        >>> import torch, attnscale.torch as at
        >>> qkv = torch.randn(2, 10, 3, 4, 16, requires_grad=True)
        >>> at.flash_attn_qkvpacked_func(qkv, causal=True).shape
        torch.Size([2, 10, 4, 16])
    """
    if has_torch_function_variadic(qkv, alibi_slopes):
        return handle_torch_function(
            flash_attn_qkvpacked_func, (qkv, alibi_slopes), qkv, dropout_p=dropout_p, softmax_scale=softmax_scale,
            causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
            deterministic=deterministic, return_attn_probs=return_attn_probs)
    q, k, v = _parts("qkv", qkv, "[batch, seqlen, 3, heads, headdim]", 3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)

    FlashAttention 2's flash_attn_kvpacked_func: flash_attn_func on q [B, Nq, H, d] and the views
    k, v of kv [B, Nkv, 2, Hkv, d] (H % Hkv == 0: grouped-query attention).
    """
    if has_torch_function_variadic(q, kv, alibi_slopes):
        return handle_torch_function(
            flash_attn_kvpacked_func, (q, kv, alibi_slopes), q, kv, dropout_p=dropout_p, softmax_scale=softmax_scale,
            causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
            deterministic=deterministic, return_attn_probs=return_attn_probs)
    k, v = _parts("kv", kv, "[batch, seqlen, 2, heads_k, headdim]", 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)

    FlashAttention 2's flash_attn_varlen_qkvpacked_func: flash_attn_varlen_func on the views q, k, v
    of qkv [total, 3, H, d], cu_seqlens and max_seqlen serving queries and keys alike.
    """
    if has_torch_function_variadic(qkv, cu_seqlens, alibi_slopes):
        return handle_torch_function(
            flash_attn_varlen_qkvpacked_func, (qkv, cu_seqlens, alibi_slopes), qkv, cu_seqlens, max_seqlen,
            dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
            alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=return_attn_probs)
    q, k, v = _parts("qkv", qkv, "[total, 3, heads, headdim]", 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
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
):
    """flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)

    FlashAttention 2's flash_attn_varlen_kvpacked_func: flash_attn_varlen_func on q [total_q, H, d]
    and the views k, v of kv [total_k, 2, Hkv, d].
    """
    if has_torch_function_variadic(q, kv, cu_seqlens_q, cu_seqlens_k, alibi_slopes):
        return handle_torch_function(
            flash_attn_varlen_kvpacked_func, (q, kv, cu_seqlens_q, cu_seqlens_k, alibi_slopes), q, kv, cu_seqlens_q,
            cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic,
            return_attn_probs=return_attn_probs)
    k, v = _parts("kv", kv, "[total_k, 2, heads_k, headdim]", 2)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)
