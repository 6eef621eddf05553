"""Bad arguments raise ValueError (bad values) or TypeError (bad types) with one exact message."""
import pathlib
import re

import numpy as np
import pytest

import attnscale

Q = np.ones((5, 4))
K = np.ones((5, 4))
V = np.ones((5, 4))


def raises(exc, message, *args, fn=attnscale.attention, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert type(info.value) is exc
    assert str(info.value) == message


def test_misspelt_keywords_and_torch_tensors():
    raises(TypeError, "attention() got an unexpected keyword argument 'casual' (did you mean 'causal'?)", Q, K, V,
           casual=True)
    raises(TypeError, "attention_backward() got an unexpected keyword argument 'windw' (did you mean 'window'?)",
           Q, K, V, Q, Q[:, 0], Q, windw=(1, 1), fn=attnscale.attention_backward)
    raises(TypeError, "threads: expected int, got str", Q, K, V, threads="2")
    raises(TypeError, "self_attention() got an unexpected keyword argument 'scaling' (did you mean 'scale'?)",
           Q, Q, Q, Q, scaling="none", fn=attnscale.self_attention)
    import torch
    x = torch.ones(5, 4, requires_grad=True)
    raises(TypeError, "k: a torch.Tensor that requires grad; use attnscale.torch.attention (differentiable), "
           "or pass k.detach()", Q, x, V)


def test_array_types():
    raises(TypeError, "q: dtype must be float32, float64 or attnscale.bfloat16, got int64",
           np.ones((5, 4), dtype=np.int64), K, V)
    raises(TypeError, "k: expected a numpy array, got object", Q, object(), V)
    raises(TypeError, "v: dtype must be float32, float64 or attnscale.bfloat16, got <U3", Q, K, "abc")
    raises(TypeError, "mask: dtype must be bool, uint8, float32 or float64, got int32", Q, K, V,
           mask=np.ones((5, 5), dtype=np.int32))


FLOATS = "float32, float64 or attnscale.bfloat16"


def test_each_dtype_message_lists_what_the_argument_takes():
    # A message listed "float32 or float64" where attnscale.bfloat16 is taken too (q), and
    # "float32, attnscale.bfloat16, float16 or int8" where float64 is taken and int8 is not
    # (_convert); each now lists the dtypes that argument takes, no more and no fewer.
    i64, f16 = np.ones((5, 4), np.int64), np.ones((5, 4), np.float16)
    q = np.ones((5, 4), np.float32)
    bf = attnscale.to_bfloat16(q)
    for fn, args, kwargs, message in [
            (attnscale.attention, (i64, q, q), {}, f"q: dtype must be {FLOATS}, got int64"),
            (attnscale.attention, (q, q, f16), {}, f"v: dtype must be {FLOATS}, got float16"),
            (attnscale.attention_backward, (q, q, q, q, q[:, 0], i64), {}, f"dout: dtype must be {FLOATS}, got int64"),
            (attnscale.attention_backward, (q, q, q, q, i64[:, 0], q), {}, f"lse: dtype must be {FLOATS}, got int64"),
            (attnscale.attention, (q, q, q), {"sinks": np.ones(1, np.float16)},
             "sinks: dtype must be float32 or float64, got float16"),
            (attnscale.attention, (q, q, q), {"alibi_slopes": attnscale.to_bfloat16(np.ones(1, np.float32))},
             "alibi_slopes: dtype must be float32 or float64, got attnscale.bfloat16"),
            (attnscale.self_attention, (bf, q, q, q), {}, "x: dtype must be float32 or float64, got attnscale.bfloat16"),
            (attnscale.merge_partials, ([i64], [q[:, 0]]), {}, "outs[0]: dtype must be float32 or float64, got int64"),
            (attnscale.decode, (np.ones((1, 2, 4), np.float32), np.ones((1, 2, 5, 4)), np.ones((1, 2, 5, 4))), {},
             "k: dtype must be float32, attnscale.bfloat16, float16 or int8, got float64"),
            (attnscale.decode, (bf[None, :2], np.ones((1, 2, 5, 4), np.float16), np.ones((1, 2, 5, 4), np.float16)), {},
             "q: dtype must be float32, got attnscale.bfloat16"),
            (attnscale._attnscale._convert, (q, np.ones((5, 4), np.int8)), {},
             "dst: dtype must be float32, float64, attnscale.bfloat16 or float16, got int8"),
    ]:
        raises(TypeError, message, *args, fn=fn, **kwargs)
    # What a message lists is taken: bfloat16 q, k, v; float64 through _convert.
    assert attnscale.attention(bf, bf, bf).shape == (5, 4)
    wide = np.empty((5, 4))
    attnscale._attnscale._convert(q, wide)
    assert (wide == 1).all()


def test_docs_quote_the_dtype_message():
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    message = f"q: dtype must be {FLOATS}, got int64"
    assert f"`{message}`" in doc
    raises(TypeError, message, np.ones((5, 4), np.int64), Q, Q)


def test_shapes():
    raises(ValueError, "q: expected rank 2, 3 or 4 ([N, d], [H, N, d] or [B, H, N, d]), got rank 1 [4]",
           np.ones(4), K, V)
    raises(ValueError, "k: last dimension dk = 3 must equal q's dk = 4 (q [5, 4], k [5, 3])", Q, np.ones((5, 3)), V)
    raises(ValueError, "q, k, v: dtypes differ (q float32, k float64, v float64)", Q.astype(np.float32), K, V)
    raises(ValueError, "k: query heads Hq = 3 must be a multiple of key/value heads Hkv = 2 "
           "(q [3, 5, 4], k [2, 5, 4])", np.ones((3, 5, 4)), np.ones((2, 5, 4)), np.ones((2, 5, 4)))
    raises(ValueError, "v: heads and keys must match k's (k [5, 4], v [6, 4])", Q, K, np.ones((6, 4)))
    raises(ValueError, "q: every dimension must be positive, got shape [5, 0]", np.ones((5, 0)), K, V)
    raises(ValueError, "mask: shape [4, 5] does not broadcast to [1, 1, 5, 5] (expected [5, 5] or [1|1, 1|1, 5, 5])",
           Q, K, V, mask=np.ones((4, 5), dtype=bool))
    raises(ValueError, "q, k, v: leading dimensions [2, 1], [3, 1], [3, 1] do not broadcast",
           np.ones((2, 1, 1, 5, 4)), np.ones((3, 1, 1, 5, 4)), np.ones((3, 1, 1, 5, 4)))


def test_options():
    raises(ValueError, "scale: expected none, sqrt, linear or a finite number, got 'huge'", Q, K, V, scale="huge")
    raises(ValueError, "scale: must be finite, got inf", Q, K, V, scale=float("inf"))
    raises(TypeError, "scale: expected None, 'none', 'sqrt', 'linear' or a number, got list", Q, K, V, scale=[1])
    raises(TypeError, "scale: expected None, 'none', 'sqrt', 'linear' or a number, got bool", Q, K, V, scale=True)
    raises(ValueError, "causal: expected 'top-left' or 'bottom-right', got 'yes'", Q, K, V, causal="yes")
    raises(TypeError, "causal: expected None, True, 'top-left' or 'bottom-right', got int", Q, K, V, causal=1)
    raises(ValueError, "align: expected 'top-left' or 'bottom-right', got 'middle'", Q, K, V, align="middle")
    raises(ValueError, "align: conflicts with causal='top-left' (they share one diagonal)", Q, K, V,
           causal="top-left", align="bottom-right")
    raises(ValueError, "window: sizes must be >= 0 (or -1 for unbounded), got (-2, 1)", Q, K, V, window=(-2, 1))
    raises(TypeError, "window: expected (left, right) with ints or None, got 3", Q, K, V, window=3)
    raises(TypeError, "window: expected (left, right) with ints or None, got (1.5, 2)", Q, K, V, window=(1.5, 2))
    raises(ValueError, "threads: must be >= 0, got -1", Q, K, V, threads=-1)
    # Integers the extension's C++ types cannot hold, named by their keyword.
    raises(TypeError, "threads: 2147483648 is out of range (too large for the extension's integers)", Q, K, V,
           threads=2**31)
    raises(TypeError, "dropout_seed: -1 is out of range (expected an integer >= 0)", Q, K, V, dropout_p=0.1,
           dropout_seed=-1)
    raises(TypeError, "window: 9223372036854775808 is out of range (too large for the extension's integers)",
           Q, K, V, window=(2**63, 1))


def test_backward():
    out, lse = attnscale.attention(Q, K, V, return_lse=True)
    bw = attnscale.attention_backward
    raises(ValueError, "out: required (the forward's output; only reference=True recomputes it)",
           Q, K, V, None, lse, out, fn=bw)
    raises(ValueError, "dout: expected shape [5, 4], got [5, 3]", Q, K, V, out, lse, np.ones((5, 3)), fn=bw)
    raises(ValueError, "lse: expected shape [5], got [4]", Q, K, V, out, lse[:4], out, fn=bw)
    # No key: the same checks of out, lse and dout, in the caller's shapes.
    k0, v0 = np.ones((2, 0, 4)), np.ones((2, 0, 4))
    q2, o2, l2 = np.ones((2, 5, 4)), np.zeros((2, 5, 4)), np.zeros((2, 5))
    raises(ValueError, "dout: expected shape [2, 5, 4], got [9, 9]", q2, k0, v0, o2, l2, np.ones((9, 9)), fn=bw)
    raises(ValueError, "lse: expected shape [2, 5], got [5]", q2, k0, v0, o2, l2[0], o2, fn=bw)
    # The message of the same call with keys (test_shapes).
    raises(ValueError, "k: query heads Hq = 3 must be a multiple of key/value heads Hkv = 2 (q [3, 5, 4], k [2, 0, 4])",
           np.ones((3, 5, 4)), k0, v0)


def test_self_attention():
    w = np.ones((4, 2))
    raises(ValueError, "w_q: expected 4 rows (x is [5, 4]), got [3, 2]", Q, np.ones((3, 2)), w, w,
           fn=attnscale.self_attention)
    raises(ValueError, "heads: must be positive, got 0", Q, w, w, w, np.ones((2, 2)), 0,
           fn=attnscale.multi_head_attention)


def test_nothing_is_written_on_error():
    # Validation happens before any computation: an error leaves the inputs untouched.
    q = np.random.default_rng(0).standard_normal((5, 4))
    before = q.copy()
    with pytest.raises(ValueError):
        attnscale.attention(q, q, q, window=(-3, 0))
    np.testing.assert_array_equal(q, before)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
def test_integer_alibi_slopes_are_refused_by_name(dtype):
    # A call with nothing to compute (no key) took integer slopes (and sinks) without a word, where
    # the same call with keys refuses them, as the torch drop-ins do.
    got = np.dtype(dtype).name
    message = f"alibi_slopes: dtype must be float32 or float64, got {got}"
    q, none = np.ones((2, 3, 4)), np.ones((2, 0, 4))
    slopes = np.ones(2, dtype=dtype)
    raises(TypeError, message, q, q, q, alibi_slopes=slopes)
    raises(TypeError, message, q, none, none, alibi_slopes=slopes)
    raises(TypeError, message, q[None, None], q[None, None], q[None, None], alibi_slopes=slopes)  # broadcast path
    raises(TypeError, message, q, none, none, q, np.zeros((2, 3)), q, alibi_slopes=slopes, fn=attnscale.attention_backward)
    raises(TypeError, f"sinks: dtype must be float32 or float64, got {got}", q, none, none, sinks=slopes)
    raises(TypeError, message, np.ones((1, 2, 4), np.float32), np.ones((1, 2, 5, 4), np.float32),
           np.ones((1, 2, 5, 4), np.float32), alibi_slopes=slopes, fn=attnscale.decode)
    # Float slopes still pass where there is nothing to compute.
    assert attnscale.attention(q, none, none, alibi_slopes=np.ones(2, np.float32)).shape == (2, 3, 4)
