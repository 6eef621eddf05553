"""attnscale.to_bfloat16 / from_bfloat16 against a float64 statement of bfloat16's rounding."""
import numpy as np
import pytest

import attnscale


def rounded_bits(x):
    """float32 x to bfloat16 bits, nearest even, finite and infinite values: the value among the two
    neighbours 2^-7 ulp-steps apart (the top 16 bits, or the next) nearer to x, the even one on a tie."""
    bits = x.view(np.uint32).astype(np.uint64)
    low, high = bits >> 16, (bits >> 16) + 1
    with np.errstate(invalid="ignore"):  # an infinity's neighbour is a NaN pattern, unused
        lo_val = (low << 16).astype(np.uint32).view(np.float32).astype(np.float64)
        hi_val = (high << 16).astype(np.uint32).view(np.float32).astype(np.float64)
        xd = x.astype(np.float64)
        d_lo, d_hi = np.abs(xd - lo_val), np.abs(hi_val - xd)
    pick_high = (d_hi < d_lo) | ((d_hi == d_lo) & (low % 2 == 1))
    exact = (bits & 0xFFFF) == 0  # infinities and values already bfloat16
    return np.where(exact | ~pick_high, low, high).astype(np.uint16)


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 4, 5), (2, 1, 3, 1, 2)])
def test_round_trip_matches_the_rounding_rule(shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30, shape)).astype(np.float32)
    b = attnscale.to_bfloat16(x)
    assert b.dtype == attnscale.bfloat16 and b.shape == x.shape
    np.testing.assert_array_equal(b.view(np.uint16), rounded_bits(x))
    back = attnscale.from_bfloat16(b)
    assert back.dtype == np.float32 and back.shape == x.shape
    np.testing.assert_array_equal(back.view(np.uint32), rounded_bits(x).astype(np.uint32) << 16)


def test_ties_infinities_nan_and_views():
    # Ties to even: 1 + 2^-8 (halfway between 1 and 1 + 2^-7) goes down, 1 + 3·2^-8 up.
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), np.inf, -np.inf, 0.0, -0.0, 3.0e38], np.float32)
    np.testing.assert_array_equal(attnscale.to_bfloat16(x).view(np.uint16), rounded_bits(x))
    assert np.isnan(attnscale.from_bfloat16(attnscale.to_bfloat16(np.array([np.nan], np.float32)))).all()
    m = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(attnscale.from_bfloat16(attnscale.to_bfloat16(m[:, ::2]))[:, 1], m[:, 2])
    assert attnscale.to_bfloat16(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert attnscale.from_bfloat16(attnscale.to_bfloat16(np.float32(2.5))).shape == ()


def test_a_bfloat16_cache_from_to_bfloat16_decodes_as_its_values():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 1, 64), dtype=np.float32)
    k, v = (rng.standard_normal((1, 2, 37, 64), dtype=np.float32) for _ in range(2))
    kb, vb = attnscale.to_bfloat16(k), attnscale.to_bfloat16(v)
    out = attnscale.decode(q, kb, vb, causal=False)
    ref = attnscale.attention(q, attnscale.from_bfloat16(kb), attnscale.from_bfloat16(vb), reference=True)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)


def test_to_bfloat16_names_its_argument():
    with pytest.raises(TypeError, match="x: expected real numbers, got str"):
        attnscale.to_bfloat16("abc")
    with pytest.raises(TypeError, match="x: already an attnscale.bfloat16 array"):
        attnscale.to_bfloat16(attnscale.to_bfloat16(np.ones(2, np.float32)))


def test_from_bfloat16_names_its_argument():
    with pytest.raises(TypeError, match="x: expected an attnscale.bfloat16 array"):
        attnscale.from_bfloat16(np.zeros(3, np.int16))
    with pytest.raises(TypeError, match="x: expected an attnscale.bfloat16 array"):
        attnscale.from_bfloat16([1.0])
