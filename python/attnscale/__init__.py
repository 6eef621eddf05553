"""attnscale: scaled dot-product attention softmax(Q K^T * s) V on numpy arrays, and the lab.

    >>> import numpy as np, attnscale
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((4, 32, 64), dtype=np.float32) for _ in range(3))
    >>> out = attnscale.attention(q, k, v, causal=True)   # [H, N, d], s = 1/sqrt(64)
    >>> out.shape
    (4, 32, 64)

Submodules:
    attnscale.torch  a torch.autograd.Function over the same kernels (imports torch on first use)
    attnscale.lab    the lab's experiments (saturation, moments, ...) returning their rows
"""
from . import _attnscale
from ._attnscale import __version__, bfloat16, cpu_target, git_hash, version  # noqa: F401
from .argument_names import caller_names
from .arrays import attention, attention_backward  # noqa: F401
from .bfloat16_arrays import from_bfloat16, to_bfloat16  # noqa: F401
from .keywords import short_errors

merge_partials = short_errors(_attnscale.merge_partials)
self_attention = short_errors(_attnscale.self_attention)
multi_head_attention = short_errors(_attnscale.multi_head_attention)
decode = short_errors(_attnscale.decode)
_quantize_q8 = short_errors(_attnscale.quantize_q8)


def quantize_q8(x):
    with caller_names({"src": "x"}):  # the library's messages name it src
        return _quantize_q8(x)


quantize_q8.__doc__ = _attnscale.quantize_q8.__doc__

__all__ = [
    "attention",
    "attention_backward",
    "merge_partials",
    "self_attention",
    "multi_head_attention",
    "decode",
    "quantize_q8",
    "version",
    "git_hash",
    "cpu_target",
    "bfloat16",
    "to_bfloat16",
    "from_bfloat16",
    "lab",
    "torch",
]


def __getattr__(name):
    # attnscale.torch and attnscale.lab load on first use: torch takes seconds to import.
    if name in ("torch", "lab"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'attnscale' has no attribute {name!r}")
