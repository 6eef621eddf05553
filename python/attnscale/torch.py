"""attnscale.torch: attention for PyTorch, differentiable through attnscale's C++ kernels.

The forward pass runs attnscale.attention and keeps the log-sum-exp of each row; the backward
pass runs attnscale.attention_backward, which recomputes the probabilities from q, k, v and that
log-sum-exp. CPU tensors of float32 or float64 go to the kernels without a copy (through
``tensor.detach().numpy()``, which shares memory and strides), so a [B, N, H, d] tensor permuted
to [B, H, N, d] is read in place.

    >>> import torch, attnscale.torch as at
    >>> q = torch.randn(2, 4, 16, 32, dtype=torch.float64, requires_grad=True)  # [B, H, N, d]
    >>> k = torch.randn(2, 1, 16, 32, dtype=torch.float64, requires_grad=True)  # one kv head
    >>> v = torch.randn(2, 1, 16, 32, dtype=torch.float64, requires_grad=True)
    >>> out = at.attention(q, k, v, causal=True)
    >>> out.square().sum().backward()
    >>> q.grad.shape, k.grad.shape
    (torch.Size([2, 4, 16, 32]), torch.Size([2, 1, 16, 32]))
"""
import torch
from torch.autograd.function import once_differentiable

from . import _attnscale

__all__ = ["attention", "Attention"]


def _to_numpy(name, t):
    """A numpy array sharing the tensor's memory (a CPU float32/float64 tensor, any strides)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: must be a CPU tensor, got device {t.device}")
    if t.dtype not in (torch.float32, torch.float64) and not (name == "mask" and t.dtype in (torch.bool, torch.uint8)):
        allowed = "bool, uint8, float32 or float64" if name == "mask" else "float32 or float64"
        raise TypeError(f"{name}: dtype must be {allowed}, got {t.dtype}")
    return t.detach().numpy()


class Attention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v with gradients for q, k and v (see attention())."""

    @staticmethod
    def forward(ctx, q, k, v, mask, forward_options, options):
        mask_np = None if mask is None else _to_numpy("mask", mask)
        out, lse = _attnscale.attention(
            _to_numpy("q", q), _to_numpy("k", k), _to_numpy("v", v), mask=mask_np, return_lse=True, **forward_options
        )
        out, lse = torch.from_numpy(out), torch.from_numpy(lse)
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
            _to_numpy("q", q),
            _to_numpy("k", k),
            _to_numpy("v", v),
            out.numpy(),
            lse.numpy(),
            _to_numpy("dout", dout),
            mask=ctx.mask,
            **ctx.options,
        )
        need = ctx.needs_input_grad
        return (
            torch.from_numpy(dq) if need[0] else None,
            torch.from_numpy(dk) if need[1] else None,
            torch.from_numpy(dv) if need[2] else None,
            None,
            None,
            None,
        )


def attention(
    q, k, v, *, scale=None, causal=None, window=None, align=None, mask=None, threads=0, return_lse=False, compute=None
):
    """attention(q, k, v, *, scale=None, causal=None, window=None, align=None, mask=None, threads=0, return_lse=False, compute=None)

    Differentiable scaled dot-product attention on CPU torch tensors (float32 or float64).

    Shapes and options are those of attnscale.attention: q [..., Nq, dk], k [..., Nkv, dk],
    v [..., Nkv, dv] (2-D, 3-D or 4-D; k and v may have fewer heads than q), scale None | 'none' |
    'sqrt' | 'linear' | number, causal None | True | 'top-left' | 'bottom-right', window
    (left, right), align, mask (bool keep-mask or float additive mask, [Nq, Nkv] or
    [B|1, H|1, Nq, Nkv]; a constant: it must not require grad), threads.

    compute='bf16' runs the forward products in bfloat16 (float32 inputs); the backward pass
    always computes in the inputs' dtype.

    Returns out [..., Nq, dv], or (out, lse) with return_lse (lse carries no gradient).
    Gradients flow to q, k and v; double backward is not supported.

    Example:
        >>> import torch, attnscale.torch as at
        >>> x = torch.randn(10, 8, requires_grad=True)
        >>> y = at.attention(x, x, x, causal=True)
        >>> y.sum().backward(); x.grad.shape
        torch.Size([10, 8])
    """
    if mask is not None and isinstance(mask, torch.Tensor) and mask.requires_grad:
        raise ValueError("mask: gradients with respect to the mask are not supported; pass mask.detach()")
    if mask is not None and not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(mask)
    options = dict(scale=scale, causal=causal, window=window, align=align, threads=threads)
    out, lse = Attention.apply(q, k, v, mask, dict(options, compute=compute), options)
    return (out, lse) if return_lse else out
