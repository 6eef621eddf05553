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
from ._attnscale import (  # noqa: F401
    __version__,
    attention,
    attention_backward,
    cpu_target,
    git_hash,
    merge_partials,
    multi_head_attention,
    self_attention,
    version,
)

__all__ = [
    "attention",
    "attention_backward",
    "merge_partials",
    "self_attention",
    "multi_head_attention",
    "version",
    "git_hash",
    "cpu_target",
    "lab",
    "torch",
]


def __getattr__(name):
    # attnscale.torch and attnscale.lab load on first use: torch takes seconds to import.
    if name in ("torch", "lab"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'attnscale' has no attribute {name!r}")
