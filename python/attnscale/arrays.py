"""attnscale.attention and attention_backward on numpy arrays of PyTorch's shapes.

The extension reads q [B, Hq, Nq, dk], k and v [B, Hkv, Nkv, d] (2-D and 3-D read as B = H = 1)
and a mask [B|1, Hq|1, Nq, Nkv]. These functions add what PyTorch users pass (attnscale.broadcast):
any number of leading dimensions, leading dimensions that broadcast between q, k, v and the mask,
a mask that broadcasts in Nq or Nkv too (the [B, 1, 1, Nkv] padding mask, or [Nkv] alone), all as
stride-0 views, and an empty key set (Nkv = 0: out 0, lse -inf, once dtypes, shapes and options
have passed the checks of a call with work to do). Arrays the extension takes as they are go to it
untouched, so its messages show the shapes the caller gave.
"""
import numpy as np

from . import _attnscale, broadcast
from .keywords import short_errors

_attention = short_errors(_attnscale.attention)
_attention_backward = short_errors(_attnscale.attention_backward)


def _shape(x):
    return tuple(np.shape(x))


def _fits(q, k, v, mask):
    """True when the extension reads these shapes as they are (nothing to broadcast)."""
    if any(not 2 <= len(s) <= 4 for s in (q, k, v)):
        return False
    q4, k4, v4 = ((1,) * (4 - len(s)) + s for s in (q, k, v))
    if 0 in q4[:3] + k4[:3] + v4:
        return False  # no work (attnscale.broadcast.Layout.empty); dk = 0 is the extension's error
    if not (q4[0] == k4[0] == v4[0] and k4[1] == v4[1] and q4[1] % k4[1] == 0):
        return False
    if mask is None:
        return True
    m4 = (1,) * (4 - len(mask)) + mask
    return 2 <= len(mask) <= 4 and m4[0] in (1, q4[0]) and m4[1] in (1, q4[1]) and m4[2:] == (q4[2], k4[2])


def _layout(q, k, v, mask):
    """The Layout that folds these operands, or None when the extension takes them as given (or
    rejects them: then its message shows the shapes the caller passed). A mask of rank 0 or 1
    broadcasts as in PyTorch (broadcast.layout), which the extension does not."""
    shapes = (_shape(q), _shape(k), _shape(v)) + (() if mask is None else (_shape(mask),))
    if any(len(s) < 2 for s in shapes[:3]) or _fits(*shapes[:3], shapes[3] if mask is not None else None):
        return None
    try:
        return broadcast.layout(*shapes)
    except ValueError:
        # The extension's message then (the caller's shapes), unless an operand is empty: it would
        # name the empty dimension, not what does not fit.
        if all(2 <= len(s) <= 4 for s in shapes) and all(0 not in s for s in shapes[:3]):
            return None
        raise


def _array(name, x, mask=False):
    """x as a numpy array; what numpy cannot read gets the extension's TypeError naming `name`."""
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except Exception:
        return _attnscale._as_array(name, x, mask)  # raises the TypeError naming `name`


def _fold(name, x, shape4, lay, mask=False):
    return broadcast.fold(_array(name, x, mask), shape4, lay.batch, np.broadcast_to)


def _is_bfloat16(a):
    return bool(a.dtype.metadata) and a.dtype.metadata.get("attnscale") == "bfloat16"


# Options holding per-head or per-sequence arrays, whose shapes a one-element problem cannot check;
# of the per-head ones (float arrays) it checks the dtype on a one-element stand-in, as the
# operands'.
_SHAPED = ("sinks", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k")
_PER_HEAD = ("sinks", "alibi_slopes")


def check_options(q, k, v, mask, options):
    """What the extension checks of a call with nothing to compute, on one-element stand-ins of the
    operands' dtypes: the dtypes (each, that q, k, v share one, and those of sinks and alibi_slopes:
    an integer alibi_slopes is refused here as in a call with work) and the options (misspelt
    keywords refused). The shapes are broadcast.check_rows'."""
    one = lambda name, x, is_mask=False: np.zeros((1, 1), dtype=_array(name, x, is_mask).dtype)
    m = None if mask is None else one("mask", mask, True)
    kept = {key: value for key, value in options.items() if key not in _SHAPED}
    for key in _PER_HEAD:
        if options.get(key) is not None:
            kept[key] = np.zeros(1, dtype=_array(key, options[key]).dtype)  # [Hq] of the stand-in's one head
    _attention(one("q", q), one("k", k), one("v", v), mask=m, **kept)


def _sum_kept(grad, axes):
    if _is_bfloat16(grad):
        raise ValueError("bfloat16 gradients of broadcast operands: use attnscale.torch, which sums them")
    return grad.sum(axis=axes, keepdims=True)


def attention(q, k, v, *, mask=None, return_lse=False, return_probs=False, **options):
    lay = _layout(q, k, v, mask)
    if lay is None:
        return _attention(q, k, v, mask=mask, return_lse=return_lse, return_probs=return_probs, **options)
    probs_shape = lay.lse + (lay.nkv,)
    if lay.empty and lay.v[3] == 0 and 0 not in (lay.q[0], lay.hq, lay.nq, lay.nkv) and (return_lse or return_probs):
        # dv = 0 over keys: out has no element, but lse and probs do not read v: those of the
        # kernels over a one-column v of zeros.
        v1 = np.zeros(_shape(v)[:-1] + (1,), _array("v", v).dtype)
        out, *stats = attention(q, k, v1, mask=mask, return_lse=return_lse, return_probs=return_probs, **options)
        return (out[..., :0], *stats)
    if lay.empty:
        broadcast.check_rows(_shape(q), _shape(k), _shape(v))
        check_options(q, k, v, mask, options)
        dtype = _array("q", q).dtype
        stats = np.float32 if _is_bfloat16(np.zeros(0, dtype)) else dtype
        results = [np.zeros(lay.out, dtype)]
        if return_lse:
            # No key: lse = -inf, or sink_h where sinks join each row's softmax (the extension's rule).
            lse = np.full(lay.q[:3], -np.inf, stats)
            if options.get("sinks") is not None and lay.nkv == 0:
                sinks = _array("sinks", options["sinks"])
                if sinks.shape != (lay.hq,):
                    raise ValueError(f"sinks: expected shape [{lay.hq}], got {list(sinks.shape)}")
                lse[...] = sinks.reshape(1, -1, 1)
            results.append(lse.reshape(lay.lse))
        results += [np.zeros(probs_shape, stats)] if return_probs else []
    else:
        folded = [_fold(n, x, s, lay) for n, x, s in (("q", q, lay.q), ("k", k, lay.k), ("v", v, lay.v))]
        m = None if mask is None else _fold("mask", mask, lay.mask, lay, mask=True)
        got = _attention(*folded, mask=m, return_lse=return_lse, return_probs=return_probs, **options)
        got = list(got) if isinstance(got, tuple) else [got]
        want = [lay.out] + ([lay.lse] if return_lse else []) + ([probs_shape] if return_probs else [])
        results = [a.reshape(s) for a, s in zip(got, want)]
    return results[0] if len(results) == 1 else tuple(results)


def attention_backward(q, k, v, out, lse, dout, *, mask=None, return_dsinks=False, return_dbias=False,
                       dlse=None, **options):
    asked = dict(return_dsinks=return_dsinks, return_dbias=return_dbias)
    lay = _layout(q, k, v, mask)
    if lay is None:
        return _attention_backward(q, k, v, out, lse, dout, mask=mask, dlse=dlse, **asked, **options)
    shapes = _shape(q), _shape(k), _shape(v)
    dbias_shape = lay.lse + (lay.nkv,)  # q's leading dimensions (broadcast), Nq, Nkv
    if lay.empty:
        broadcast.check_rows(*shapes)
        check_options(q, k, v, mask, options)
        for name, x, want in (("out", out, lay.out), ("lse", lse, lay.lse), ("dout", dout, lay.out),
                              ("dlse", dlse, lay.lse)):
            if x is not None and _shape(x) != tuple(want):
                raise ValueError(f"{name}: expected shape {list(want)}, got {list(_shape(x))}")
        dtype = _array("q", q).dtype
        grads = [np.zeros(s, dtype) for s in shapes]
        if return_dsinks:
            # No key: lse_i = sink_h (P_sink = 1), so dsink_h = Σ dlse over h's rows; 0 without dlse.
            dsinks = np.zeros(np.shape(options.get("sinks")), dtype)
            if dlse is not None and lay.nkv == 0:
                dsinks += _array("dlse", dlse).reshape(lay.q[:3]).sum(axis=(0, 2), dtype=np.float64).astype(dtype)
            grads.append(dsinks)
        grads += [np.zeros(dbias_shape, dtype)] if return_dbias else []
        return tuple(grads)
    folded = [_fold(n, x, s, lay) for n, x, s in (("q", q, lay.q), ("k", k, lay.k), ("v", v, lay.v))]
    m = None if mask is None else _fold("mask", mask, lay.mask, lay, mask=True)
    o4, l3 = lay.q[:3] + (lay.v[3],), lay.q[:3]
    out4 = None if out is None else _array("out", out).reshape(o4)
    lse3 = None if lse is None else _array("lse", lse).reshape(l3)
    dout4 = _array("dout", dout).reshape(o4)
    dlse3 = None if dlse is None else _array("dlse", dlse).reshape(l3)
    dq, dk, dv, *rest = _attention_backward(*folded, out4, lse3, dout4, mask=m, dlse=dlse3, **asked, **options)
    grads = [broadcast.unfold_sum(g, s, lay.batch, _sum_kept) for g, s in zip((dq, dk, dv), shapes)]
    grads += [rest.pop(0)] if return_dsinks else []
    grads += [rest.pop(0).reshape(dbias_shape)] if return_dbias else []
    return tuple(grads)


attention.__doc__ = _attnscale.attention.__doc__
attention_backward.__doc__ = _attnscale.attention_backward.__doc__
