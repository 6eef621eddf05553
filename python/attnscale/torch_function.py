"""The autograd Function under attnscale.torch: forward and backward through the C++ kernels.

Tensors reach the kernels as numpy arrays sharing their memory and strides (no copy): float32 and
float64 through Tensor.numpy(), bfloat16 (which numpy lacks) as its int16 storage tagged
attnscale.bfloat16. The forward keeps each row's log-sum-exp (float32 for bfloat16 inputs); the
backward recomputes the probabilities from q, k, v and it.
"""
import functools

import numpy as np
import torch

from . import _attnscale

_FLOAT = (torch.float32, torch.float64, torch.bfloat16)
_MASK = _FLOAT + (torch.bool, torch.uint8)


def to_numpy(name, t):
    """A numpy array sharing the tensor's memory (a CPU float32/float64/bfloat16 tensor, any strides)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: must be a CPU tensor, got device {t.device}")
    if t.dtype not in (_MASK if name == "mask" else _FLOAT):
        allowed = "bool, uint8, float32, float64 or bfloat16" if name == "mask" else "float32, float64 or bfloat16"
        raise TypeError(f"{name}: dtype must be {allowed}, got {t.dtype}")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_attnscale.bfloat16)
    return t.numpy()


def from_numpy(a):
    """The tensor over a kernel's output array (bfloat16 when the array carries attnscale's tag)."""
    if a.dtype.metadata and a.dtype.metadata.get("attnscale") == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def once_differentiable(backward):
    """Like torch.autograd.function.once_differentiable, with a message that names the limit.

    The backward runs without building a graph; when the caller asked for one (create_graph=True),
    its outputs hang on a node that raises when differentiated: gradients of gradients are not
    available from the kernels.
    """

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled() or not any(isinstance(g, torch.Tensor) and g.requires_grad for g in grads):
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


class Attention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v with gradients for q, k and v (see attnscale.torch.attention)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, forward_options, options):
        # mask: a constant, a tensor or a numpy array (attnscale.torch_flash's strided ALiBi bias).
        mask_np = mask if mask is None or isinstance(mask, np.ndarray) else to_numpy("mask", mask)
        out, lse = _attnscale.attention(
            to_numpy("q", q), to_numpy("k", k), to_numpy("v", v), mask=mask_np, return_lse=True, **forward_options
        )
        out, lse = from_numpy(out), from_numpy(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask = mask_np
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse):
        # _dlse is always zero: lse is marked non-differentiable.
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _attnscale.attention_backward(
            to_numpy("q", q),
            to_numpy("k", k),
            to_numpy("v", v),
            to_numpy("out", out),
            lse.numpy(),
            to_numpy("dout", dout.to(out.dtype)),
            mask=ctx.mask,
            **ctx.options,
        )
        need = ctx.needs_input_grad
        return (
            from_numpy(dq) if need[0] else None,
            from_numpy(dk) if need[1] else None,
            from_numpy(dv) if need[2] else None,
            None,
            None,
            None,
        )
