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
the kernels compute forward and backward. A float attn_mask that requires grad (a learned bias)
gets its gradient, dS, summed over its broadcast dimensions by autograd.
"""
import torch

from .argument_names import caller_names
from .torch_function import as_float16, attend, check_operands, dropout_keywords, float16_as_float32, real


# The arguments as PyTorch's signature names them, for the messages (attnscale's checks say q, k, v).
_NAMES = {"q": "query", "k": "key", "v": "value", "mask": "attn_mask"}


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)

    A drop-in for torch.nn.functional.scaled_dot_product_attention on CPU tensors of float32,
    float64, bfloat16 or float16 (computed in float32, returned as float16), differentiable with
    respect to query, key, value and a float attn_mask.

    query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev]; leading dimensions
    broadcast; Hkv must equal Hq (or be 1) unless enable_gqa=True (then Hq % Hkv == 0).
    attn_mask: None, bool (True = take part) or float (added to the scaled scores; uint8 and other
    integers refused, as by PyTorch 2), broadcasting
    to [..., Hq, L, S] as in PyTorch ([S] and 0-d masks too; a [B, 1, 1, S] padding mask is read
    with stride 0, not copied).
    is_causal: query i sees keys j <= i (top-left diagonal); not together with attn_mask.
    scale: None (1/sqrt(E)) or a number. dropout_p: as PyTorch's function, dropout is applied
    whenever dropout_p > 0 (pass 0.0 in evaluation), kept probabilities scaled by 1/(1 - p); the
    mask comes from torch's default generator (torch.manual_seed fixes it) and the backward
    regenerates it instead of storing it.

    Returns [..., Hq, L, Ev] in query's dtype. A row whose every key is masked is 0, as PyTorch's
    _safe_softmax gives it from 2.5 on (before, its math path gave NaN); an empty key set (S = 0)
    gives 0.

    Example:
        >>> import torch, attnscale.torch as at
        >>> q = torch.randn(2, 8, 10, 16, requires_grad=True)
        >>> kv = torch.randn(2, 2, 10, 16, requires_grad=True)
        >>> out = at.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        >>> out.sum().backward(); out.shape
        torch.Size([2, 8, 10, 16])
    """
    with caller_names(_NAMES):
        if is_causal and attn_mask is not None:
            raise ValueError("attn_mask: must be None when is_causal=True (as in PyTorch)")
        check_operands(query, key, value)  # before float16's conversion: mixed dtypes are told so
        mask = attn_mask
        if mask is not None:
            if not isinstance(mask, torch.Tensor):
                mask = torch.as_tensor(mask)
            if not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
                # PyTorch 2 refuses a uint8 mask too: nn.MultiheadAttention read one as True = masked,
                # attnscale.attention as True = kept; guessing would silently flip it.
                raise TypeError(f"attn_mask: dtype must be bool or a float dtype (as in PyTorch 2), got {mask.dtype}")
            if mask.dtype in (torch.bfloat16, torch.float16):
                mask = mask.float()  # the kernels read float32/float64 masks; a copy of the mask as given
        scale = None if scale is None else real("scale", scale)
        options = dict(scale=scale, causal=bool(is_causal), **dropout_keywords(dropout_p))
        (query, key, value), half = float16_as_float32(query, key, value)
        try:
            out, _ = attend(query, key, value, mask, options, options, gqa=enable_gqa, mask_name="attn_mask")
        except ValueError as e:
            if not enable_gqa and str(e).startswith("q, k:"):
                raise ValueError(f"{e} (key/value with fewer heads than query need enable_gqa=True)") from None
            raise
    return as_float16(out) if half else out
