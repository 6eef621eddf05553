"""attention() and attention_backward() on random combinations of every option, against the library's
float64 reference (reference=True; it is checked against PyTorch in test_attention_forward.py and
test_attention_backward.py).

The fast path takes different routes by shape: few query rows go the decode route (row layout,
one dot product per key), blocks of 64 rows the tiled products, the bf16 products their own tiles,
GQA groups share key tiles, threads split rows or keys. Fixed cases test each route alone; here a
seeded generator draws shapes that straddle those boundaries (1, 2, 5, 16, 17, 63, 64, 65, 130, 200
rows and keys) with masks, windows, scales, soft-capping, ALiBi, sinks, dropout, GQA, 1-3 threads
and both compute modes, and puts Inf and NaN into the K and V rows of keys that no row sees (their
values must never reach an output or a gradient), then a NaN into one key's value, which must reach
exactly the outputs of the rows that see that key.
"""
import numpy as np

import attnscale

ROWS = [1, 2, 5, 16, 17, 63, 64, 65, 130, 200]
DIMS = [1, 8, 17, 64, 128]


def draw(rng):
    """One call's inputs and options."""
    B, Hkv, g = int(rng.integers(1, 3)), int(rng.choice([1, 2])), int(rng.choice([1, 2, 4]))
    Nq, Nkv = int(rng.choice(ROWS)), int(rng.choice(ROWS))
    dk, dv = int(rng.choice(DIMS)), int(rng.choice(DIMS))
    q = rng.standard_normal((B, Hkv * g, Nq, dk), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, Nkv, dk), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, Nkv, dv), dtype=np.float32)
    o = {}
    shape = str(rng.choice(["none", "causal", "bottom-right", "window", "mask", "additive"]))
    if shape == "causal":
        o["causal"] = True
    elif shape == "bottom-right":
        o["causal"] = "bottom-right"
    elif shape == "window":
        left, right = (None if rng.random() < 0.3 else int(rng.integers(0, 40)) for _ in range(2))
        o["window"], o["align"] = (left, right), str(rng.choice(["top-left", "bottom-right"]))
    elif shape == "mask":
        o["mask"] = rng.random((B, 1, Nq, Nkv)) < 0.7
    elif shape == "additive":
        o["mask"] = rng.standard_normal((1, Hkv * g, Nq, Nkv)).astype(np.float32)
    o["scale"] = [None, "none", "linear", float(rng.uniform(0.05, 0.5))][int(rng.integers(0, 4))]
    if rng.random() < 0.2:
        o["softcap"] = float(rng.choice([1.0, 30.0]))
    if rng.random() < 0.2:
        o["alibi_slopes"] = rng.uniform(0, 0.1, Hkv * g).astype(np.float32)
    if rng.random() < 0.2:
        o["sinks"] = rng.standard_normal(Hkv * g).astype(np.float32)
    if rng.random() < 0.15:
        o["dropout_p"], o["dropout_seed"] = 0.25, int(rng.integers(0, 1000))
    o["threads"] = int(rng.integers(1, 4))
    # bf16 products at the default scale and without dropout only: their 2^-8 rounding of q·s and P
    # moves logits of 10 and more (unscaled scores, d >= 64) and the gradients' cancellations
    # (dP - D, one key) by more than the fixed 2e-2 / 5e-2 checked here, as it must.
    bf16_ok = o["scale"] is None and "dropout_p" not in o and "softcap" not in o
    o["compute"] = "bf16" if bf16_ok and rng.random() < 0.4 else None
    return q, k, v, o


def hidden_keys(q, k, o):
    """Keys that no row of the call sees (by the structural options and a bool mask), per batch."""
    probs = attnscale.attention(q, k, k[..., :1], return_probs=True, reference=True,
                                **{n: x for n, x in o.items() if n in ("causal", "window", "align", "mask")})[1]
    return ~np.any(probs > 0, axis=(1, 2))  # [B, Nkv]


def test_random_forward_and_backward_routes_match_reference():
    rng = np.random.default_rng(20261205)
    for case in range(160):
        q, k, v, o = draw(rng)
        hidden = hidden_keys(q, k, o)
        for b, j in zip(*np.nonzero(hidden)):  # values no row sees, which must never show
            k[b, :, j, 0], v[b, :, j, -1] = np.inf, np.nan
        what = (case, q.shape, k.shape, v.shape, {n: x for n, x in o.items() if not isinstance(x, np.ndarray)},
                [n for n, x in o.items() if isinstance(x, np.ndarray)], int(hidden.sum()))
        out, lse = attnscale.attention(q, k, v, return_lse=True, **o)
        ref, ref_lse = attnscale.attention(q, k, v, return_lse=True, reference=True, **o)
        scale = max(1.0, float(np.abs(ref).max()))
        tol = 2e-2 if o["compute"] == "bf16" else 2e-5
        assert np.all(np.isfinite(out)), what
        assert np.abs(out - ref).max(initial=0) <= tol * scale, what
        if "dropout_p" not in o and k.shape[2] > 1:  # a NaN in one key's value: exactly the rows that see it
            poisoned = v.copy()
            poisoned[:, :, int(rng.integers(0, k.shape[2])), int(rng.integers(0, v.shape[3]))] = np.nan
            got = attnscale.attention(q, k, poisoned, **o)
            want = attnscale.attention(q, k, poisoned, reference=True, **o)
            assert np.array_equal(np.isnan(got), np.isnan(want)), ("NaN pattern", what)
            fine = ~np.isnan(want)
            assert np.abs(got[fine] - want[fine]).max(initial=0) <= tol * scale, ("poisoned", what)
        assert np.array_equal(np.isinf(lse), np.isinf(ref_lse)), what
        seen = np.isfinite(ref_lse)
        assert np.abs(lse[seen] - ref_lse[seen]).max(initial=0) <= tol * (1 + np.abs(ref_lse[seen]).max(initial=0)), what

        dout = rng.standard_normal(out.shape, dtype=np.float32)
        grads = attnscale.attention_backward(q, k, v, out, lse, dout, **o)
        want = attnscale.attention_backward(q, k, v, None, None, dout, reference=True, **o)
        # bf16 products round each dS = P·(dP - D) term, whose two sides cancel (exactly, for one
        # key) and whose dP is a sum of dv rounded products (error growing as sqrt(dv)); those
        # errors add as a random walk over the terms a gradient sums: Nkv keys for dq, Nq·group
        # rows for dk and dv (dv has no dP: only P's rounding).
        rows, dS = q.shape[2] * q.shape[1] // k.shape[1], max(1.0, np.sqrt(v.shape[3]) / 4)
        terms = {"dq": k.shape[2] * dS**2, "dk": rows * dS**2, "dv": rows}
        for name, got, w in zip(("dq", "dk", "dv"), grads, want):
            assert np.all(np.isfinite(got)), (name, what)
            gscale = max(1.0, float(np.abs(w).max()))
            gtol = 5e-2 * np.sqrt(terms[name]) if o["compute"] == "bf16" else 2e-4
            assert np.abs(got - w).max(initial=0) <= gtol * gscale, (name, float(np.abs(got - w).max()), what)
