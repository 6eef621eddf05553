"""scaled_dot_product_attention with the signature and semantics of PyTorch 2's
torch.nn.functional.scaled_dot_product_attention, on attnscale's kernels.

PyTorch defines it by its math (matmul, softmax, matmul):

    scores = query @ key.transpose(-2, -1) * scale        # scale = 1/sqrt(E) when None
    scores += bias   # is_causal: -inf above the diagonal i = j (top-left); bool mask: -inf where
                     # False; float mask: the mask itself; the mask broadcasts to scores' shape
    out = softmax(scores, dim=-1) @ value                 # leading dimensions broadcast

with enable_gqa=True letting key and value have fewer heads (dimension -3) than query's Hq, each
count dividing Hq: query head h reads key head h // (Hq / Hk) and value head h // (Hq / Hv) (PyTorch
repeats each with repeat_interleave; key and value may have different counts). Here the leading dimensions are folded
into the library's [B, H, N, d] by attnscale.broadcast (stride-0 views, no copy of q, k, v), and
the kernels compute forward and backward. A float attn_mask that requires grad (a learned bias)
gets its gradient, dS, summed over its broadcast dimensions by autograd.
"""
import math

import torch
from torch.overrides import handle_torch_function, has_torch_function, has_torch_function_variadic

from .argument_names import caller_names
from .torch_errors import drop_in_errors
from .torch_function import as_float16, attend, check_operands, dropout_keywords, float16_as_float32, real


# The arguments as PyTorch's signature names them, for the messages (attnscale's checks say q, k, v).
_NAMES = {"q": "query", "k": "key", "v": "value", "mask": "attn_mask"}


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)

    A drop-in for torch.nn.functional.scaled_dot_product_attention on CPU tensors of float32,
    float64, bfloat16 or float16 (computed in float32, returned as float16), differentiable with
    respect to query, key, value and a float attn_mask. Under torch.autocast("cpu") the floating
    operands (not float64) are cast to the autocast dtype first, as PyTorch's CPU policy casts them.

    query [..., Hq, L, E], key [..., Hk, S, E], value [..., Hv, S, Ev]; leading dimensions
    broadcast; the heads too unless enable_gqa=True, which asks Hq % Hk == 0 and Hq % Hv == 0 instead
    (query head h reads key head h // (Hq / Hk), value head h // (Hq / Hv)).
    attn_mask: None, bool (True = take part) or float (added to the scaled scores; uint8 and other
    integers refused, as by PyTorch 2), broadcasting
    to [..., Hq, L, S] as in PyTorch ([S] and 0-d masks too; a [B, 1, 1, S] padding mask is read
    with stride 0, not copied).
    PyTorch 2's causal_upper_left(L, S) / causal_lower_right(L, S) (torch.nn.attention.bias) as
    attn_mask are top-left causal and keys j <= i + S - L (bottom-right).
    is_causal: query i sees keys j <= i (top-left diagonal); not together with attn_mask.
    scale: None (1/sqrt(E)) or a number. dropout_p: as PyTorch's function, dropout is applied
    whenever dropout_p > 0 (pass 0.0 in evaluation), kept probabilities scaled by 1/(1 - p); the
    mask comes from torch's default generator (torch.manual_seed fixes it) and the backward
    regenerates it instead of storing it; dropout_p=1.0 drops them all (out 0), as PyTorch's does.

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
    if has_torch_function_variadic(query, key, value, attn_mask):
        # A CausalBias is read here as the causal mask it stands for (_causal_bias_variant), not handed
        # to its own __torch_function__, which knows only PyTorch's function (and would return out as
        # a CausalBias); other subclasses and modes see the call, as torch.nn.functional's.
        relevant = (query, key, value) if _causal_bias_variant(attn_mask) else (query, key, value, attn_mask)
        if has_torch_function(relevant):
            return handle_torch_function(scaled_dot_product_attention, relevant, query, key, value, attn_mask=attn_mask,
                                         dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return _scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@drop_in_errors
def _scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    with caller_names(_NAMES):
        causal = bool(is_causal)
        if _causal_bias_variant(attn_mask):
            if causal:  # PyTorch's CausalBias._dispatch
                raise ValueError("attn_mask: a CausalBias must not be used with is_causal=True (as in PyTorch)")
            attn_mask, causal = _causal_bias(attn_mask, query, key)
        if causal and attn_mask is not None:
            raise ValueError("attn_mask: must be None when is_causal=True (as in PyTorch)")
        mask = attn_mask
        query, key, value, mask = _autocast(query, key, value, mask)
        check_operands(query, key, value, float16=True)  # before float16's conversion: mixed dtypes are told so
        if mask is not None:
            if not isinstance(mask, torch.Tensor):
                mask = torch.as_tensor(mask)
            if not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
                # PyTorch 2 refuses a uint8 mask too: nn.MultiheadAttention read one as True = masked,
                # attnscale.attention as True = kept; guessing would silently flip it.
                raise TypeError(f"attn_mask: dtype must be bool or a float dtype (as in PyTorch 2), got {mask.dtype}")
            if mask.dtype in (torch.bfloat16, torch.float16):
                mask = mask.float()  # the kernels read float32/float64 masks; a copy of the mask as given
        if enable_gqa:
            key, value = _gqa_heads(query, key, value)
        scale = None if scale is None else real("scale", scale)
        # PyTorch's dropout takes p = 1 and zeroes every probability: out = 0 @ value, gradients 0
        # (the kernels' dropout takes p < 1): out * 0 below, which a NaN still reaches, as there.
        drop = real("dropout_p", dropout_p)
        every = drop == 1
        options = dict(scale=scale, causal=causal, **dropout_keywords(0.0 if every else drop, "[0, 1]"))
        (query, key, value), half = float16_as_float32(query, key, value)
        try:
            out, _ = attend(query, key, value, mask, options, options, gqa=enable_gqa, mask_name="attn_mask",
                            checked=True)
        except ValueError as e:
            if not enable_gqa and str(e).startswith("q, k:"):
                raise ValueError(f"{e} (key/value with fewer heads than query need enable_gqa=True)") from None
            raise
        if every:
            out = out * 0
    return as_float16(out) if half else out


def _causal_bias_variant(mask):
    """"UPPER_LEFT" or "LOWER_RIGHT" for PyTorch 2's torch.nn.attention.bias.CausalBias (causal_upper_left,
    causal_lower_right), known by its attributes; None for any other mask. A CausalBias is a tensor
    whose values mean nothing (torch.Tensor.__new__ of its arguments): read as a float mask it would
    add uninitialised memory to the scores. PyTorch's own function hands it to its __torch_function__,
    which knows only that function: this one reads it itself, leaving it out of its own
    __torch_function__ dispatch."""
    variant = getattr(getattr(mask, "variant", None), "name", None)
    if variant in ("UPPER_LEFT", "LOWER_RIGHT") and hasattr(mask, "seq_len_q") and hasattr(mask, "seq_len_kv"):
        return variant
    return None


def _causal_bias(bias, query, key):
    """(attn_mask, causal option) for a CausalBias, as its _dispatch computes: UPPER_LEFT, or equal
    lengths, is is_causal=True (top-left); LOWER_RIGHT is the bool mask tril(ones(Lq, Lkv), Lkv - Lq),
    that is the kernels' bottom-right causal mask when (Lq, Lkv) are query's and key's lengths (the
    mask itself otherwise, which then broadcasts or is refused as any mask)."""
    lq, lkv = int(bias.seq_len_q), int(bias.seq_len_kv)
    if _causal_bias_variant(bias) == "UPPER_LEFT" or lq == lkv:
        return None, True
    if all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in (query, key)) and (query.shape[-2], key.shape[-2]) == (lq, lkv):
        return None, "bottom-right"
    return torch.ones(lq, lkv, dtype=torch.bool).tril(lkv - lq), False


def _autocast(*tensors):
    """The tensors as PyTorch's autocast hands them to scaled_dot_product_attention, which its CPU
    policy lists as lower_precision_fp: under torch.autocast("cpu"), every floating tensor but a
    float64 one (a float mask too) cast to the autocast dtype (differentiable), so that float32 q
    and k beside a bfloat16 v (rotary embeddings computed in float32) meet as there, and out is
    bfloat16. The tensors as given otherwise, or outside autocast."""
    if not torch.is_autocast_cpu_enabled():
        return tensors
    dtype = torch.get_autocast_cpu_dtype()
    eligible = lambda t: isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
    return tuple(t.to(dtype) if eligible(t) else t for t in tensors)


def _gqa_heads(query, key, value):
    """(key, value) for enable_gqa=True, with PyTorch's rule (pre_process_group_query_attention_input):
    unless query, key and value have one head count, Hq % Hk == 0 and Hq % Hv == 0, else an error
    (also Hq = 1 under more key heads, which heads broadcasting would take). The kernels read one kv
    head count for both; key and value with different counts are repeated (a copy, under autograd)
    to their least common multiple, which divides Hq: query head h then reads repeated head
    h // (Hq / m), that is key head h // (Hq / Hk) and value head h // (Hq / Hv), as in PyTorch.
    A single key or value head broadcasts, as without enable_gqa. Operands of fewer than 3
    dimensions have no head dimension and broadcast."""
    if min(t.dim() for t in (query, key, value)) < 3:
        return key, value
    hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if hq == hk == hv:
        return key, value
    for name, t in (("k", key), ("v", value)):
        h = t.shape[-3]
        if h == 0 or hq % h:
            raise ValueError(f"{name}: query heads Hq = {hq} must be a multiple of key/value heads Hkv = {h} "
                             f"(q {list(query.shape)}, {name} {list(t.shape)})")
    if hk != hv and 1 not in (hk, hv):  # a single head broadcasts (a stride-0 view, as without enable_gqa)
        common = math.lcm(hk, hv)
        key, value = key.repeat_interleave(common // hk, dim=-3), value.repeat_interleave(common // hv, dim=-3)
    return key, value
