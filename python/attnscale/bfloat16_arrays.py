"""bfloat16 arrays from float32 and back.

numpy has no bfloat16: attnscale.bfloat16 is int16 storage tagged for the kernels, so
x.astype(attnscale.bfloat16) converts the values to integers (1.5 becomes the bits 0x0001, a
subnormal bfloat16). to_bfloat16 rounds them instead, as the library rounds (nearest even, NaN
kept NaN), by the conversion the torch wrappers use (attnscale::convert).
"""
import numpy as np

from . import _attnscale
from .arrays import _is_bfloat16


def _converted(src, dtype):
    """A new array of `dtype` holding the C-contiguous src's values (_convert, any rank)."""
    out = np.empty(src.shape, dtype=dtype)
    if src.size:
        _attnscale._convert(src.reshape(-1), out.reshape(-1))
    return out


def to_bfloat16(x):
    """x rounded to bfloat16 (nearest even) as an attnscale.bfloat16 array of x's shape. float64 and
    float16 values go through float32 first (float64: rounded twice, as torch's x.float().bfloat16())."""
    if isinstance(x, np.ndarray) and _is_bfloat16(x):
        raise TypeError("x: already an attnscale.bfloat16 array (its int16 storage is not its values)")
    try:
        src = np.asarray(x, dtype=np.float32, order="C")
    except (TypeError, ValueError) as e:
        raise TypeError(f"x: expected real numbers, got {type(x).__name__} ({e})") from None
    return _converted(src, _attnscale.bfloat16)


def from_bfloat16(x):
    """An attnscale.bfloat16 array's values as float32 (exact)."""
    if not isinstance(x, np.ndarray) or not _is_bfloat16(x):
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise TypeError(f"x: expected an attnscale.bfloat16 array (attnscale.to_bfloat16), got {got}")
    return _converted(np.asarray(x, order="C"), np.float32)
