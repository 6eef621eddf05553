"""The drop-ins' errors, caught as PyTorch's and FlashAttention's are.

PyTorch's scaled_dot_product_attention and FlashAttention's functions report a bad argument with
RuntimeError (TORCH_CHECK; TypeError for an argument of the wrong Python type); attnscale's checks
raise TypeError or ValueError. The drop-ins raise classes that are both, with the same message:
code written for PyTorch (`except RuntimeError:` around a fused kernel, then a fallback) catches
them, and `except ValueError:` still does.

    try:
        out = flash_attn_func(q, k[..., :3], v)   # headdims differ
    except RuntimeError as e:                     # DropInValueError: a ValueError and a RuntimeError
        out = fallback(q, k, v)

drop_in_errors wraps a drop-in's implementation (`_` and its name; in the packed forms, their one
check), not the public function, which first offers the call to __torch_function__ (attnscale.torch):
an override's own exceptions reach the caller as it raised them, as from torch.nn.functional's.
"""
import functools


class DropInTypeError(TypeError, RuntimeError):
    """A TypeError of a drop-in (an argument's type or dtype), also a RuntimeError as PyTorch's."""


class DropInValueError(ValueError, RuntimeError):
    """A ValueError of a drop-in (an argument's shape or value), also a RuntimeError as PyTorch's."""


def drop_in_errors(fn):
    """fn raising DropInTypeError / DropInValueError where it raised TypeError / ValueError (the
    message unchanged; one already converted, by a drop-in fn calls, passes as it is)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (DropInTypeError, DropInValueError):
            raise
        except TypeError as e:
            raise DropInTypeError(str(e)) from None
        except ValueError as e:
            raise DropInValueError(str(e)) from None

    return call
