"""attnscale.torch: attention for PyTorch, differentiable through attnscale's C++ kernels.

    attention(q, k, v, *, ...)                 attnscale's own options (scale rules, align, window)
    scaled_dot_product_attention(...)          a drop-in for torch.nn.functional's
    flash_attn_func(...), flash_attn_varlen_func(...)   drop-ins for FlashAttention 2's
    flash_attn_qkvpacked_func(...), flash_attn_kvpacked_func(...) and their varlen forms: the same
                                               on q, k, v stacked in one tensor
    flash_attn_with_kvcache(...)               FlashAttention 2's decoding over a KV cache (no gradient)
    bert_padding.unpad_input(...), pad_input(...), index_first_axis(...),
    bert_padding.unpad_input_for_concatenated_sequences(...)
                                               flash_attn.bert_padding's, between padded batches and
                                               varlen's packed rows (import attnscale.torch.bert_padding)

The forward pass runs attnscale.attention and keeps the log-sum-exp of each row; the backward
pass runs attnscale.attention_backward, which recomputes the probabilities from q, k, v and that
log-sum-exp. CPU tensors of float32, float64 or bfloat16 go to the kernels without a copy (they
share memory and strides with the arrays the kernels read), so a [B, N, H, d] tensor permuted to
[B, H, N, d] is read in place.

Each function here (and Attention.apply) takes part in PyTorch's __torch_function__ protocol as
torch.nn.functional's do (torch.overrides.has_torch_function / handle_torch_function): a call with a
tensor subclass that overrides __torch_function__ among its tensor arguments (optional ones too:
masks, sinks, alibi_slopes, cu_seqlens, block_table, a KV cache and its indices), or under a
torch.overrides.TorchFunctionMode, goes to that override first, the function itself as `func`. A
subclass that does not override it gets torch.Tensor's, which runs the function and returns its
tensors as that subclass; plain tensors pay one check.

    >>> import torch, attnscale.torch as at
    >>> q = torch.randn(2, 4, 16, 32, dtype=torch.float64, requires_grad=True)  # [B, H, N, d]
    >>> k = torch.randn(2, 1, 16, 32, dtype=torch.float64, requires_grad=True)  # one kv head
    >>> v = torch.randn(2, 1, 16, 32, dtype=torch.float64, requires_grad=True)
    >>> out = at.attention(q, k, v, causal=True)
    >>> out.square().sum().backward()
    >>> q.grad.shape, k.grad.shape
    (torch.Size([2, 4, 16, 32]), torch.Size([2, 1, 16, 32]))
"""
import sys

import torch
from torch.overrides import handle_torch_function, has_torch_function_variadic

from . import torch_bert_padding as bert_padding
from .torch_flash import flash_attn_func, flash_attn_varlen_func
from .torch_flash_packed import (flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_kvpacked_func,
                                 flash_attn_varlen_qkvpacked_func)
from .torch_kvcache import flash_attn_with_kvcache
from .torch_function import Attention, attend
from .torch_sdpa import scaled_dot_product_attention

# `import attnscale.torch.bert_padding` and `from attnscale.torch.bert_padding import unpad_input`, as
# flash_attn.bert_padding is imported (attnscale.torch is a module, not a package).
sys.modules[__name__ + ".bert_padding"] = bert_padding

__all__ = [
    "attention",
    "scaled_dot_product_attention",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "Attention",
    "bert_padding",
]


def attention(
    q,
    k,
    v,
    *,
    scale=None,
    causal=None,
    window=None,
    align=None,
    mask=None,
    threads=0,
    return_lse=False,
    compute=None,
    sinks=None,
):
    """attention(q, k, v, *, scale=None, causal=None, window=None, align=None, mask=None, threads=0, return_lse=False, compute=None, sinks=None)

    Differentiable scaled dot-product attention on CPU torch tensors (float32, float64 or bfloat16).

    Shapes and options are those of attnscale.attention: q [..., Nq, dk], k [..., Nkv, dk],
    v [..., Nkv, dv] (leading dimensions broadcast as in PyTorch; k and v may have fewer heads
    than q), scale None | 'none' | 'sqrt' | 'linear' | number, causal None | True | 'top-left' |
    'bottom-right', window (left, right), align, mask (bool keep-mask or float additive mask,
    broadcasting to [..., H, Nq, Nkv] as in PyTorch, [Nkv] and 0-d included; a float mask that
    requires grad gets its gradient; changed in place before the backward, it is refused by
    autograd's check), threads (0: $ATTNSCALE_THREADS, else torch.get_num_threads() at each forward
    and backward call; attnscale.torch_threads).

    compute='bf16' runs the forward's and the backward's products in bfloat16 with float32
    accumulation (float32 inputs; bfloat16 inputs always do, without upcasting); the gradients are
    then within about 1e-2 of float64's. Where the CPU would widen bf16 pairs to float32 anyway
    (no AMX on an Intel core, AVX2), calls of 64 or more query rows (16 for the backward, and for
    the forward over short keys) run the float32 kernels on
    the bfloat16 values widened to float32 (P not rounded), in about a float32 call's time. sinks: None or a tensor [Hq], one logit per query head
    that joins every row's softmax without a value (gpt-oss), P_ij = exp(s_ij) / (exp(sink_h) +
    sum_j exp(s_ij)); it gets its gradient when it requires grad.

    Returns out [..., Nq, dv], or (out, lse) with return_lse; lse carries its gradient too
    (d lse_i / d s_ij = P_ij), so a loss may read it, as one that merges partial results does.
    Gradients flow to q, k, v, a float mask and sinks; double backward is not supported (a gradient
    taken with create_graph=True raises when differentiated).

    Example:
        >>> import torch, attnscale.torch as at
        >>> x = torch.randn(10, 8, requires_grad=True)
        >>> y = at.attention(x, x, x, causal=True)
        >>> y.sum().backward(); x.grad.shape
        torch.Size([10, 8])
    """
    if has_torch_function_variadic(q, k, v, mask, sinks):
        return handle_torch_function(attention, (q, k, v, mask, sinks), q, k, v, scale=scale, causal=causal,
                                     window=window, align=align, mask=mask, threads=threads, return_lse=return_lse,
                                     compute=compute, sinks=sinks)
    if mask is not None and not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(mask)
    options = dict(scale=scale, causal=causal, window=window, align=align, threads=threads)
    options = dict(options, compute=compute)
    out, lse = attend(q, k, v, mask, options, options, sinks=sinks)
    return (out, lse) if return_lse else out
