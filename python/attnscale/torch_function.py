"""The autograd Function under attnscale.torch: forward and backward through the C++ kernels.

Tensors reach the kernels as numpy arrays sharing their memory and strides (no copy): float32 and
float64 through Tensor.numpy(), bfloat16 (which numpy lacks) as its int16 storage tagged
attnscale.bfloat16. The forward keeps each row's log-sum-exp (float32 for bfloat16 inputs); the
backward recomputes the probabilities from q, k, v and it.

A float mask that requires grad is an additive bias b: s = q k^T * scale + b, so its gradient is
the score gradient dS = P o (dP - D), which the backward kernel returns on request (dbias). It has
the mask's size, B Hq Nq Nkv before autograd sums it over the mask's broadcast dimensions.
"""
import functools

import math
import operator

import numpy as np
import torch
import torch.autograd.forward_ad as forward_ad
from torch.overrides import handle_torch_function, has_torch_function_variadic

from . import _attnscale, broadcast
from .arrays import check_options
from .torch_threads import with_threads

_FLOAT = (torch.float32, torch.float64, torch.bfloat16)
_MASK = _FLOAT + (torch.bool, torch.uint8)


def to_numpy(name, t, is_mask=False):
    """A numpy array sharing the tensor's memory (a CPU float32/float64/bfloat16 tensor, or a mask of
    those or bool/uint8, any strides)."""
    # Each check reads what is cheapest to read (is_cpu, not device.type; detach only a tensor that
    # requires grad, which numpy() refuses): a small drop-in call makes three or four of these.
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(f"{name}: must be a CPU tensor, got device {t.device}")
    if t.dtype not in (_MASK if is_mask else _FLOAT):
        allowed = "bool, uint8, float32, float64 or bfloat16" if is_mask else "float32, float64 or bfloat16"
        raise TypeError(f"{name}: dtype must be {allowed}, got {t.dtype}")
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_attnscale.bfloat16)
    return t.numpy()


def refuse_tracing():
    """A clear error under torch.jit.trace, which cannot record a call into the kernels (they run on
    numpy arrays, outside torch's operators: a trace would replay this call's result, and the traced
    shapes, tensors, fail the checks with a message about broadcasting)."""
    if torch.jit.is_tracing():
        raise RuntimeError("attnscale.torch: torch.jit.trace cannot record a call into attnscale's kernels "
                           "(they run outside torch's operators); call it eagerly")


def check_operands(q, k, v, float16=False):
    """q, k and v are tensors of one dtype (which to_numpy then checks): a float16 q among float32
    k and v is told that the dtypes differ, not that float16 is unsupported. float16=True: the
    caller computes float16 in float32 (float16_as_float32), so its message lists float16 too."""
    refuse_tracing()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if float16 and t.dtype not in _FLOAT + (torch.float16,):
            raise TypeError(f"{name}: dtype must be float32, float64, bfloat16 or float16, got {t.dtype}")
    # A dtype that is no float at all is left to to_numpy, which names that operand.
    if not q.dtype == k.dtype == v.dtype and all(t.dtype.is_floating_point for t in (q, k, v)):
        named = ", ".join(f"{n} {str(t.dtype).replace('torch.', '')}" for n, t in (("q", q), ("k", k), ("v", v)))
        raise ValueError(f"q, k, v: dtypes differ ({named})")


def real(name, x):
    """x as a finite float, or an error naming the caller's argument `name`."""
    try:
        if isinstance(x, (str, bytes, bool)):
            raise TypeError
        value = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value}")
    return value


def integer(name, x):
    """x as an int (numpy's integers and 0-d integer tensors too; a float, not cut, and a bool, not
    read as 0 or 1, refused), or an error naming the caller's argument `name`."""
    try:
        if isinstance(x, bool):
            raise TypeError
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}") from None


def cache_to_numpy(name, t):
    """to_numpy for a KV cache, which may also be float16: numpy's own float16 over the tensor's
    memory (attnscale.decode reads it as stored)."""
    if isinstance(t, torch.Tensor) and t.dtype == torch.float16 and t.device.type == "cpu":
        return t.detach().numpy()
    return to_numpy(name, t)


def from_numpy(a):
    """The tensor over a kernel's output array (bfloat16 when the array carries attnscale's tag)."""
    if a.dtype.metadata and a.dtype.metadata.get("attnscale") == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def once_differentiable(backward):
    """Like torch.autograd.function.once_differentiable, with a message that names the limit.

    The backward runs without building a graph; when the caller asked for one (create_graph=True)
    and an input needs its gradient, the outputs hang on a node that raises when differentiated:
    gradients of gradients are not available from the kernels. torch's own decorator looks only at
    the incoming gradients, but these gradients depend on the inputs through the saved tensors even
    when the incoming one is a constant (the ones of out.sum()): a gradient penalty would lose its
    term without a word.
    """

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled() or not any(ctx.needs_input_grad):
            return outputs
        error = torch._C._functions.DelayedError(
            b"attnscale.torch: double backward (the gradient of a gradient) is not supported", len(outputs)
        )

        def alias(t):
            if t is None:
                return None
            t = t.detach()
            t.requires_grad = True
            return t

        return error(*[alias(t) for t in outputs])

    return wrapper


def _records_graph(*tensors):
    """Whether autograd records a call on `tensors` (None among them: no operand): grad mode on and one
    of them requiring grad, or a forward-mode AD level open (its dual tensors do not say so by
    requires_grad; Attention has no jvp, and autograd's Function refuses them with its message)."""
    if forward_ad._current_level >= 0:
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _forward(q, k, v, mask, forward_options, options, sinks):
    """(out, lse, arrays, options) of Attention's forward: the kernels' outputs as tensors, the
    numpy arrays the backward reads (q, k, v, out, lse, mask) and the backward's options (with the
    sinks this forward used)."""
    mask_np = None if mask is None else to_numpy("mask", mask, is_mask=True)
    if sinks is not None:
        # A copy: the backward reads the logits this forward used, whatever happens to sinks.
        options = dict(options, sinks=to_numpy("sinks", sinks.detach().to(torch.float64, copy=True)))
        forward_options = dict(forward_options, sinks=options["sinks"])
    arrays = (to_numpy("q", q), to_numpy("k", k), to_numpy("v", v))
    out_np, lse_np = _attnscale.attention(*arrays, mask=mask_np, return_lse=True, **with_threads(forward_options))
    return from_numpy(out_np), from_numpy(lse_np), arrays + (out_np, lse_np, mask_np), options


class Attention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v with gradients for q, k, v, a float mask and sinks (a logit per
    head that joins every row's softmax without a value; see attnscale.torch.attention)."""

    @classmethod
    def apply(cls, q, k, v, mask, forward_options, options, sinks=None):
        """torch.autograd.Function.apply, first offering the call to the tensors' __torch_function__ (or a
        TorchFunctionMode's), as the public functions do: torch's own apply offers it only to the
        operations inside forward. `func` is then Attention.apply (a bound method: compare it with ==)."""
        if has_torch_function_variadic(q, k, v, mask, sinks):
            return handle_torch_function(cls.apply, (q, k, v, mask, sinks), q, k, v, mask, forward_options, options,
                                         sinks)
        if not _records_graph(q, k, v, mask, sinks):
            # Nothing to differentiate: the kernels' outputs without autograd's node (its apply,
            # ctx and saved tensors cost a small call a fifth of its time). The same tensors.
            return _forward(q, k, v, mask, forward_options, options, sinks)[:2]
        return super().apply(q, k, v, mask, forward_options, options, sinks)

    @staticmethod
    def forward(ctx, q, k, v, mask, forward_options, options, sinks=None):
        out, lse, arrays, options = _forward(q, k, v, mask, forward_options, options, sinks)
        # The mask is saved as q, k and v are: the backward reads it, so a change in place between
        # the forward and the backward must meet autograd's check, not change the gradients.
        ctx.save_for_backward(q, k, v, out, lse, mask)
        # The arrays the first backward reads, checked once here: q, k, v's and the mask's over
        # detached views and the kernel's own out and lse (none refers to a tensor of the graph: no
        # reference cycle).
        ctx.arrays = arrays
        ctx.mask_dtype = None if mask is None else mask.dtype
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        ctx.options = options
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        # dlse: zeros when the loss does not read lse (autograd fills an unused output's gradient
        # with zeros; D − 0 = D, so the gradients are those of a loss on out alone, bit for bit).
        # The saved tensors are read for
        # autograd's check that none was modified in place since the forward. The forward's arrays
        # are let go here, so that they keep no memory alive past the backward that the saved
        # tensors would not; a second backward (retain_graph=True) takes them from the tensors.
        q, k, v, out, lse, mask = ctx.saved_tensors
        arrays = ctx.__dict__.pop("arrays", None) or (
            to_numpy("q", q), to_numpy("k", k), to_numpy("v", v), to_numpy("out", out), lse.numpy(),
            None if mask is None else to_numpy("mask", mask, is_mask=True))
        need = ctx.needs_input_grad + (False,) * (7 - len(ctx.needs_input_grad))  # sinks: optional
        grads = _attnscale.attention_backward(
            *arrays[:5],
            to_numpy("dout", dout.to(out.dtype)),
            mask=arrays[5],
            return_dsinks=need[6],
            return_dbias=need[3],
            dlse=to_numpy("dlse", dlse.to(lse.dtype)),
            **with_threads(ctx.options),  # torch's count when the backward runs (torch_threads)
        )
        dq, dk, dv, *extra = grads  # then dsinks, then dbias, each when asked for
        dsinks = from_numpy(extra.pop(0)).to(ctx.sinks_dtype) if need[6] else None
        dmask = from_numpy(extra.pop(0)).to(ctx.mask_dtype) if need[3] else None
        result = (
            from_numpy(dq) if need[0] else None,
            from_numpy(dk) if need[1] else None,
            from_numpy(dv) if need[2] else None,
            dmask,
            None,
            None,
            dsinks,
        )
        return result[: len(ctx.needs_input_grad)]


def _converted(t, dtype):
    """A new contiguous tensor of `dtype` (float32 or float16) holding t's values (attnscale's
    conversion, _convert), in memory numpy allocates: numpy asks for transparent huge pages for
    arrays of 4 MiB and more, torch does not, and where first touches of 4 KiB pages are costly a
    fresh 256 MiB copy took 0.5 s in them (performance.md: docs/ in the source, share/doc/attnscale/
    installed)."""
    out = np.empty(tuple(t.shape), dtype=np.float32 if dtype == torch.float32 else np.float16)
    _attnscale._convert(t.detach().numpy(), out)
    return torch.from_numpy(out)


class _Half(torch.autograd.Function):
    """float16 <-> float32 by the CPU's conversion instructions (torch 1.13 converts float16 on the
    CPU element by element, about 0.1 GB/s; performance.md: docs/ in the source, share/doc/attnscale/
    installed), differentiable: the gradient converts back."""

    @staticmethod
    def forward(ctx, t, dtype):
        ctx.source = t.dtype
        return _converted(t, dtype)

    @staticmethod
    def backward(ctx, grad):
        # Itself differentiable (the conversion is linear): under create_graph=True the gradient of
        # a gradient passes through, and reaches the kernels' node that refuses it.
        return _Half.apply(grad, ctx.source), None


def as_float16(t):
    """t (float32) rounded to float16, to nearest even; differentiable."""
    return _Half.apply(t, torch.float16)


def float16_as_float32(*tensors):
    """(tensors, half): float16 has no kernels of its own, so when all of `tensors` are float16 they
    come back as float32 copies of the same values (differentiable: their gradients return as
    float16), half = True, and the caller rounds its output back to float16 (as_float16).
    FlashAttention and PyTorch accumulate float16 in float32 too. Otherwise the tensors as given,
    half = False."""
    if all(isinstance(t, torch.Tensor) and t.dtype == torch.float16 for t in tensors):
        return tuple(_Half.apply(t, torch.float32) for t in tensors), True
    return tensors, False


def dropout_keywords(p, allowed="[0, 1)"):
    """The kernels' dropout keywords for probability p (the caller's dropout_p): a seed from torch's
    default generator, so torch.manual_seed fixes the mask (the backward regenerates it from the
    same seed). `allowed`: the caller's range, as its message states it (SDPA takes 1 and handles
    it itself)."""
    p = real("dropout_p", p)
    if not 0 <= p < 1:
        raise ValueError(f"dropout_p: must be in {allowed}, got {p}")
    if p == 0:
        return {}
    seed = int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())
    return dict(dropout_p=p, dropout_seed=seed)


def _check_empty(q, k, v, mask, options):
    """What the kernels would check of a call that has nothing to compute (broadcast.Layout.empty):
    dtypes, devices, the last two dimensions and the options."""
    arrays = [to_numpy(name, t) for name, t in (("q", q), ("k", k), ("v", v))]
    broadcast.check_rows(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    check_options(*arrays, None if mask is None else to_numpy("mask", mask, is_mask=True), options)


def attend(q, k, v, mask, forward_options, options, gqa=True, sinks=None, mask_name="mask", checked=False):
    """(out, lse) of attention over tensors of PyTorch's shapes (attnscale.broadcast folds them).

    An empty key set (or no query) is PyTorch's math on the empty operands: out 0, lse -inf, once
    the arguments have passed the checks a non-empty call meets. mask_name: the caller's name of the
    mask, for its messages. checked=True: the caller has passed q, k and v through check_operands.
    """
    if not checked:
        check_operands(q, k, v)
    if mask is not None:
        to_numpy(mask_name, mask, is_mask=True)  # its dtype and device, under the caller's name
    lay = broadcast.layout(q.shape, k.shape, v.shape, None if mask is None else mask.shape, gqa, mask_name)
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.shape != (lay.hq,)):
        got = list(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"sinks: expected a tensor of shape ({lay.hq},), one logit per query head, got {got}")
    if lay.empty and lay.v[3] == 0 and 0 not in (lay.q[0], lay.hq, lay.nq, lay.nkv):
        # dv = 0 over keys: out has no element, but lse does not read v: the kernels' over a
        # one-column v of zeros, with its gradient.
        out, lse = attend(q, k, v.new_zeros(v.shape[:-1] + (1,)), mask, forward_options, options, gqa, sinks, mask_name,
                          checked)
        return out[..., :0], lse
    if lay.empty:
        _check_empty(q, k, v, mask, forward_options)
        kk, vv = k, v
        if lay.hq != lay.hkv and k.dim() >= 3 and lay.hkv:
            kk, vv = (t.repeat_interleave(lay.hq // lay.hkv, dim=-3) for t in (k, v))
        out = torch.softmax(q @ kk.transpose(-2, -1), dim=-1) @ vv
        stats = torch.float64 if q.dtype == torch.float64 else torch.float32
        lse = torch.full(lay.q[:3], -math.inf, dtype=stats)
        if sinks is not None and lay.nkv == 0:  # no key: lse = sink_h, with its gradient
            lse = sinks.to(stats).reshape(1, -1, 1).expand(lay.q[:3])
        return out.reshape(lay.out), lse.reshape(lay.lse)
    q4, k4, v4 = (broadcast.fold(t, s, lay.batch, torch.Tensor.expand) for t, s in ((q, lay.q), (k, lay.k), (v, lay.v)))
    m4 = None if mask is None else broadcast.fold(mask, lay.mask, lay.batch, torch.Tensor.expand)
    out, lse = Attention.apply(q4, k4, v4, m4, forward_options, options, sinks)
    # (A reshape to the shape a tensor has already costs a small call a few µs.)
    return (out if out.shape == lay.out else out.reshape(lay.out)), (lse if lse.shape == lay.lse else lse.reshape(lay.lse))
