"""Inputs are read in place whatever their strides; only unviewable layouts are copied."""
import numpy as np
import pytest

import attnscale
from attnscale._attnscale import _copy_count


def layouts(rng):
    """(name, q, k, v) with the same values in different memory layouts."""
    base = rng.standard_normal((2, 11, 3, 8))  # [B, N, H, d] activations
    q = base.transpose(0, 2, 1, 3)  # [B, H, N, d] view, no copy
    k = rng.standard_normal((2, 3, 11, 8))
    v = rng.standard_normal((2, 3, 11, 5))
    wide = rng.standard_normal((2, 3, 22, 16))
    yield "contiguous", np.ascontiguousarray(q), k, v
    yield "transposed", q, k, v
    yield "fortran", np.asfortranarray(q), np.asfortranarray(k), v
    yield "step slices", q, wide[:, :, ::2, ::2], v
    yield "odd offset step slices", q, wide[:, :, 1::2, 1::2], v
    reversed_copy = lambda x, axis: np.flip(np.flip(x, axis).copy(), axis)  # same values, negative stride
    yield "negative steps", reversed_copy(q, 2), reversed_copy(k, 1), reversed_copy(v, 3)
    yield "broadcast batch", q, np.broadcast_to(k[:1], k.shape), np.broadcast_to(v[:1], v.shape)
    yield "offset into a larger buffer", q, k, np.pad(v, 1)[1:-1, 1:-1, 1:-1, 1:-1]


def test_strided_views_are_not_copied(rng):
    for name, q, k, v in layouts(rng):
        if name == "negative steps":
            assert q.strides[2] < 0 and k.strides[1] < 0 and v.strides[3] < 0
        want = attnscale.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), causal=True)
        before = _copy_count()
        out, lse = attnscale.attention(q, k, v, causal=True, return_lse=True)
        mask = np.broadcast_to(rng.random((11, 1)) < 2, (11, 11))  # stride-0 bool mask
        attnscale.attention(q, k, v, mask=mask)
        grads = attnscale.attention_backward(q, k, v, out, lse, np.ones_like(out)[..., ::1], causal=True)
        assert _copy_count() == before, name
        np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-14, err_msg=name)
        assert all(g.flags.c_contiguous for g in grads)


def test_reads_the_callers_memory(rng):
    # Changing the caller's buffer between calls changes the result: the array is read in place.
    buf = rng.standard_normal((12, 8))
    q = buf[::2]
    first = attnscale.attention(q, q, q)
    buf[0] += 1.0
    assert not np.allclose(first, attnscale.attention(q, q, q))


def test_unviewable_layouts_are_copied_once(rng):
    values = rng.standard_normal((6, 4)).astype(np.float32)
    want = attnscale.attention(values, values, values)
    # A field of a structured array: 5-byte strides between float32 items.
    rec = np.zeros((6, 4), dtype=[("x", "<f4"), ("flag", "u1")])
    rec["x"] = values
    # Big-endian storage, and a float32 view starting one byte into a buffer.
    swapped = values.astype(">f4")
    raw = np.zeros(values.nbytes + 1, dtype=np.uint8)
    shifted = raw[1:].view(np.float32).reshape(6, 4)
    shifted[...] = values
    for name, q in [("structured field", rec["x"]), ("big-endian", swapped), ("misaligned", shifted)]:
        before = _copy_count()
        np.testing.assert_array_equal(attnscale.attention(q, values, values), want, err_msg=name)
        assert _copy_count() == before + 1, name


def test_outputs_are_new_arrays(rng):
    q = rng.standard_normal((3, 5, 4))
    out, lse, probs = attnscale.attention(q, q, q, return_lse=True, return_probs=True)
    for a in (out, lse, probs):
        assert a.flags.c_contiguous and a.flags.owndata and a.flags.writeable
        assert not np.shares_memory(a, q)


def test_outputs_take_the_librarys_blocks(rng):
    """Outputs are numpy's own arrays on the library's allocator (numpy_blocks.h): 64-byte aligned,
    owning their data (resize keeps the values), freed by numpy at any time; numpy's default
    allocator is back in place after the call."""
    from numpy.core.multiarray import get_handler_name

    for shape in [(1, 1, 1, 1), (2, 3, 7, 5), (1, 8, 300, 64)]:  # 4 bytes .. 600 KiB (a kept block)
        q = rng.standard_normal(shape).astype(np.float32)
        out, lse = attnscale.attention(q, q, q, causal=True, return_lse=True)
        grads = attnscale.attention_backward(q, q, q, out, lse, np.ones_like(out), causal=True)
        bf = attnscale.attention(*(attnscale.to_bfloat16(q),) * 3)
        for a in (out, lse, bf, *grads):
            assert get_handler_name(a) == "attnscale_blocks"
            assert a.flags.owndata and a.ctypes.data % 64 == 0
        assert get_handler_name(np.empty(shape)) == get_handler_name(q) == "default_allocator"
        kept = out.copy()
        out.resize(out.size + 100, refcheck=False)  # numpy's realloc through the handler
        np.testing.assert_array_equal(out[: kept.size], kept.reshape(-1))
        del out, lse, grads, bf  # handed back to release_block by numpy
