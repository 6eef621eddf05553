"""scaled_dot_product_attention with the signature and semantics of PyTorch 2's
torch.nn.functional.scaled_dot_product_attention, on attnscale's kernels.

PyTorch defines it by its math (matmul, softmax, matmul):

    scores = query @ key.transpose(-2, -1) * scale        # scale = 1/sqrt(E) when None
    scores += bias   # is_causal: -inf above the diagonal i = j (top-left); bool mask: -inf where
                     # False; float mask: the mask itself; the mask broadcasts to scores' shape
    out = softmax(scores, dim=-1) @ value                 # leading dimensions broadcast

with enable_gqa=True letting key and value have Hkv heads (dimension -3) for Hq query heads,
Hq % Hkv == 0, each read by Hq/Hkv consecutive query heads. Here the leading dimensions are folded
into the library's [B, H, N, d] by attnscale.broadcast (stride-0 views, no copy of q, k, v), and
the kernels compute forward and backward.
"""
import torch

from . import broadcast
from .torch_function import Attention


def _empty_attention(query, key, value, enable_gqa):
    """PyTorch's math on operands with a zero-sized dimension (no work; an empty key set gives 0)."""
    if enable_gqa and key.dim() >= 3 and key.shape[-3] not in (0, query.shape[-3]):
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    return torch.softmax(query @ key.transpose(-2, -1), dim=-1) @ value


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)

    A drop-in for torch.nn.functional.scaled_dot_product_attention on CPU tensors of float32,
    float64 or bfloat16, differentiable with respect to query, key and value.

    query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev]; leading dimensions
    broadcast; Hkv must equal Hq (or be 1) unless enable_gqa=True (then Hq % Hkv == 0).
    attn_mask: None, bool (True = take part) or float (added to the scaled scores), broadcasting
    to [..., Hq, L, S] (a [B, 1, 1, S] padding mask is read with stride 0, not copied).
    is_causal: query i sees keys j <= i (top-left diagonal); not together with attn_mask.
    scale: None (1/sqrt(E)) or a number. dropout_p must be 0.

    Returns [..., Hq, L, Ev] in query's dtype. Where PyTorch's math would divide 0 by 0 (every key
    of a row masked), the row is 0, as in PyTorch's fused kernels; an empty key set (S = 0) gives 0.

    Example:
        >>> import torch, attnscale.torch as at
        >>> q = torch.randn(2, 8, 10, 16, requires_grad=True)
        >>> kv = torch.randn(2, 2, 10, 16, requires_grad=True)
        >>> out = at.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        >>> out.sum().backward(); out.shape
        torch.Size([2, 8, 10, 16])
    """
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: only 0.0 is supported, got {dropout_p}")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask: must be None when is_causal=True (as in PyTorch)")
    mask = attn_mask
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            mask = torch.as_tensor(mask)
        if mask.requires_grad:
            raise ValueError("attn_mask: gradients with respect to the mask are not supported; pass attn_mask.detach()")
        if mask.dtype in (torch.bfloat16, torch.float16):
            mask = mask.float()  # the kernels read float32/float64 masks; a copy of the mask as given
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    try:
        lay = broadcast.layout(query.shape, key.shape, value.shape, None if mask is None else mask.shape, enable_gqa)
    except ValueError as e:
        if not enable_gqa and str(e).startswith("q, k:"):
            raise ValueError(f"{e} (key/value with fewer heads than query need enable_gqa=True)") from None
        raise
    if 0 in lay.q or 0 in lay.k or 0 in lay.v:
        return _empty_attention(query, key, value, enable_gqa)
    q, k, v = (
        broadcast.fold(t, shape, lay.batch, torch.Tensor.expand)
        for t, shape in ((query, lay.q), (key, lay.k), (value, lay.v))
    )
    m = None if mask is None else broadcast.fold(mask, lay.mask, lay.batch, torch.Tensor.expand)
    options = dict(scale=None if scale is None else float(scale), causal=bool(is_causal))
    out, _ = Attention.apply(q, k, v, m, options, options)
    return out.reshape(lay.out)
