"""`attnscale attend` against an independent float64 numpy computation, and its error contract."""
import re

import numpy as np
import pytest


def numpy_attention(q, k, v, scale, causal=None, window=None, mask=None):
    """softmax(Q K^T * s + mask) V in float64, written independently of the library.

    q [B,Hq,Nq,d], k/v [B,Hkv,Nkv,*]; query head h reads kv head h // (Hq // Hkv).
    causal/window use the diagonal j = i (top-left) or j = i + Nkv - Nq (bottom-right).
    """
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Hq, Nq, _ = q.shape
    Hkv, Nkv = k.shape[1], k.shape[2]
    k = np.repeat(k, Hq // Hkv, axis=1)
    v = np.repeat(v, Hq // Hkv, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    i = np.arange(Nq)[:, None]
    j = np.arange(Nkv)[None, :]
    align = (causal or (window or {}).get("align") or "top-left")
    diag = i + (Nkv - Nq if align == "bottom-right" else 0)
    keep = np.ones((Nq, Nkv), bool)
    if causal:
        keep &= j <= diag
    if window:
        if window["left"] >= 0:
            keep &= j >= diag - window["left"]
        if window["right"] >= 0:
            keep &= j <= diag + window["right"]
    keep = np.broadcast_to(keep, s.shape).copy()
    if mask is not None:
        if mask.dtype == bool:
            keep &= np.broadcast_to(mask, s.shape)
        else:
            s = s + mask.astype(np.float64)
            keep &= np.broadcast_to(mask != -np.inf, s.shape)
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    any_key = np.isfinite(m)
    e = np.where(keep, np.exp(s - np.where(any_key, m, 0)), 0.0)
    l = e.sum(-1, keepdims=True)
    p = np.where(any_key, e / np.where(l == 0, 1, l), 0.0)
    lse = np.where(any_key[..., 0], (m + np.log(np.where(l == 0, 1, l)))[..., 0], -np.inf)
    return p @ v, lse, p


def rel_err(a, b):
    return np.linalg.norm((a.astype(np.float64) - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-300)


CASES = [
    # (B, Hq, Hkv, Nq, Nkv, dk, dv, rank, dtype, flags)
    (1, 1, 1, 1, 1, 1, 1, 2, "float32", {}),
    (1, 1, 1, 41, 41, 7, 5, 2, "float32", {"causal": "top-left"}),
    (1, 6, 2, 13, 29, 11, 3, 3, "float32", {"causal": "bottom-right"}),
    (2, 4, 1, 31, 17, 64, 32, 4, "float64", {"window": (3, 2)}),
    (3, 2, 2, 19, 23, 5, 9, 4, "float32", {"causal": "bottom-right", "window": (4, -1)}),
    (2, 3, 3, 7, 11, 13, 2, 4, "float32", {"mask": "bool4"}),
    (1, 4, 2, 17, 9, 3, 3, 4, "float64", {"mask": "additive2", "scale": "none"}),
    (2, 8, 4, 37, 53, 96, 48, 4, "float32", {"mask": "bool2", "causal": "top-left", "scale": "linear"}),
    (1, 2, 1, 127, 131, 128, 64, 3, "float32", {"scale": "0.3", "window": (9, 9), "align": "bottom-right"}),
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_attend_matches_numpy(run, tmp_path, case):
    B, Hq, Hkv, Nq, Nkv, dk, dv, rank, dtype, flags = case
    rng = np.random.default_rng(abs(hash(str(case))) % 2**32)
    q = rng.standard_normal((B, Hq, Nq, dk)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Nkv, dk)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nkv, dv)).astype(dtype)
    squeeze = {2: (0, 1), 3: (0,), 4: ()}[rank]
    args = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x.squeeze(axis=squeeze) if squeeze else x)
        args += [f"--{name}", tmp_path / f"{name}.npy"]
    scale_flag = flags.get("scale", "sqrt")
    scale = {"none": 1.0, "sqrt": 1 / np.sqrt(dk), "linear": 1 / dk}.get(scale_flag)
    scale = float(scale_flag) if scale is None else scale
    args += ["--scale", scale_flag]
    mask = None
    if "mask" in flags:
        kind = flags["mask"]
        shape = (Nq, Nkv) if kind.endswith("2") else (B, 1, Nq, Nkv)
        mask = rng.random(shape) < 0.7 if kind.startswith("bool") else rng.standard_normal(shape).astype(dtype)
        np.save(tmp_path / "m.npy", mask)
        args += ["--mask", tmp_path / "m.npy"]
    window = None
    if "causal" in flags:
        args += ["--causal", flags["causal"]]
    if "window" in flags:
        left, right = flags["window"]
        args += [f"--window={left},{right}"]
        window = {"left": left, "right": right, "align": flags.get("align")}
    if "align" in flags:
        args += ["--align", flags["align"]]
    out, lse, probs = tmp_path / "o.npy", tmp_path / "l.npy", tmp_path / "p.npy"
    r = run("attend", *args, "--out", out, "--lse", lse, "--probs", probs)
    assert r.returncode == 0, r.stderr
    o_ref, l_ref, p_ref = numpy_attention(q, k, v, scale, flags.get("causal"), window, mask)
    o, l, p = np.load(out), np.load(lse), np.load(probs)
    assert o.dtype == np.dtype(dtype) and o.shape == o_ref.squeeze(axis=squeeze).shape
    assert rel_err(o.reshape(o_ref.shape), o_ref) <= 1e-5
    assert rel_err(p.reshape(p_ref.shape), p_ref) <= 1e-5
    finite = np.isfinite(l_ref)
    assert np.array_equal(np.isfinite(l.reshape(l_ref.shape)), finite)
    assert rel_err(l.reshape(l_ref.shape)[finite], l_ref[finite]) <= 1e-5


def test_huge_unscaled_logits(run, tmp_path):
    rng = np.random.default_rng(7)
    q = (12 * rng.standard_normal((64, 128))).astype(np.float32)
    k = (12 * rng.standard_normal((64, 128))).astype(np.float32)
    v = rng.standard_normal((64, 16)).astype(np.float32)
    for n, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{n}.npy", x)
    r = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
            "--out", tmp_path / "o.npy", "--scale", "none")
    assert r.returncode == 0, r.stderr
    o = np.load(tmp_path / "o.npy")
    assert np.all(np.isfinite(o))
    o_ref, _, _ = numpy_attention(q[None, None], k[None, None], v[None, None], 1.0)
    assert rel_err(o, o_ref[0, 0]) <= 1e-5


def test_scores_past_float32_are_refused_not_written_as_nan(run, tmp_path):
    # q·k = 1e40 from finite float32 entries of 1e20: the score is inf in float32 and its row NaN
    # (as in PyTorch's float32); the result is refused, float64 inputs compute it, and
    # --allow-nonfinite writes it as it is.
    q = np.array([[1e20]], np.float32)
    k = np.array([[1e20], [-1e20]], np.float32)
    v = np.array([[1.0], [2.0]], np.float32)
    for n, x in (("q", q), ("k", k), ("v", v), ("q64", q.astype(np.float64)), ("k64", k.astype(np.float64)),
                 ("v64", v.astype(np.float64))):
        np.save(tmp_path / f"{n}.npy", x)
    qkv = ["--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy", "--scale", "none"]
    out = tmp_path / "o.npy"
    assert_usage_error(run("attend", *qkv, "--out", out), "--out: the result holds nan at [0, 0] though every "
                       "input is finite: float32 overflowed", out)
    r = run("attend", *qkv, "--out", out, "--allow-nonfinite")
    assert r.returncode == 0, r.stderr
    assert np.isnan(np.load(out)).all()
    r = run("attend", "--q", tmp_path / "q64.npy", "--k", tmp_path / "k64.npy", "--v", tmp_path / "v64.npy",
            "--scale", "none", "--out", tmp_path / "o64.npy")
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "o64.npy").tolist() == [[1.0]]


def write_inputs(tmp_path, nq=5, nkv=6, d=4):
    rng = np.random.default_rng(1)
    for n, shape in (("q", (nq, d)), ("k", (nkv, d)), ("v", (nkv, d))):
        np.save(tmp_path / f"{n}.npy", rng.standard_normal(shape).astype(np.float32))
    return ["--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy"]


def assert_usage_error(r, needle, *outputs):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0], lines[0]
    for path in outputs:
        assert not path.exists(), f"{path} left behind"


def test_bad_flags_and_files(run, tmp_path):
    base = write_inputs(tmp_path)
    out, lse = tmp_path / "o.npy", tmp_path / "l.npy"
    assert_usage_error(run("attend", *base, "--out", out, "--scale", "huge"), "--scale", out)
    assert_usage_error(run("attend", *base, "--out", out, "--causal", "diagonal"), "--causal", out)
    assert_usage_error(run("attend", *base, "--out", out, "--window", "3"), "--window", out)
    assert_usage_error(run("attend", *base, "--out", out, "--frobnicate"), "--frobnicate", out)
    assert_usage_error(run("attend", "--q", tmp_path / "q.npy", "--out", out), "--k", out)
    assert_usage_error(run("nonsense"), "nonsense")
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    assert_usage_error(run("attend", *base[:-1], tmp_path / "junk.npy", "--out", out), "bad magic", out)
    raw = (tmp_path / "q.npy").read_bytes()
    (tmp_path / "trunc.npy").write_bytes(raw[:-3])
    assert_usage_error(run("attend", "--q", tmp_path / "trunc.npy", *base[2:], "--out", out), "truncated", out)
    np.save(tmp_path / "big.npy", np.ones((5, 4), ">f4"))
    assert_usage_error(run("attend", "--q", tmp_path / "big.npy", *base[2:], "--out", out), "big-endian", out)
    np.save(tmp_path / "fort.npy", np.asfortranarray(np.ones((5, 4), np.float32)))
    assert_usage_error(run("attend", "--q", tmp_path / "fort.npy", *base[2:], "--out", out), "Fortran", out)
    np.save(tmp_path / "int.npy", np.ones((5, 4), np.int32))
    assert_usage_error(run("attend", "--q", tmp_path / "int.npy", *base[2:], "--out", out), "dtype", out)
    np.save(tmp_path / "k7.npy", np.ones((6, 7), np.float32))
    assert_usage_error(run("attend", *base[:2], "--k", tmp_path / "k7.npy", *base[4:], "--out", out), "dk", out)
    np.save(tmp_path / "m.npy", np.ones((6, 5), bool))
    assert_usage_error(run("attend", *base, "--mask", tmp_path / "m.npy", "--out", out, "--lse", lse),
                       "mask: shape [6, 5] does not broadcast", out, lse)
    # A failure on the second output removes the first.
    assert_usage_error(run("attend", *base, "--out", out, "--lse", tmp_path / "missing_dir" / "l.npy"),
                       "l.npy", out)


def test_help_reads_well(run):
    r = run("--help")
    assert r.returncode == 0 and "attend" in r.stdout and "explain" in r.stdout
    r = run("attend", "--help")
    assert r.returncode == 0 and "--causal" in r.stdout and "--window" in r.stdout


def help_pages(run):
    """{command: --help text} of every subcommand and every experiment."""
    listed = run("experiment", "--help").stdout.split("Subcommands:\n", 1)[1]
    experiments = re.findall(r"^  ([a-z_]+) ", listed, re.M)
    assert "moments" in experiments and "training" in experiments, experiments
    pages = {}
    for command in [["attend"], ["explain"], ["report"], ["bench"], ["experiment"]] + [["experiment", e] for e in experiments]:
        r = run(*command, "--help")
        assert r.returncode == 0, (command, r.stderr)
        pages[" ".join(command)] = r.stdout
    return pages


def test_help_shows_no_validator_noise(run):
    # `--window L,R:INT in [-1 - 4611686018427387904] x 2`: CLI11 appended each check's description
    # and the value count to the type name. Every flag's line shows one plain name for its value
    # (the ranges are in the help texts, in words).
    for command, text in help_pages(run).items():
        for line in text.splitlines():
            m = re.match(r"^  (-[-\w,]+)((?: \S+)*?)(?:  +\S.*)?$", line)
            if not m or not m.group(1).startswith("--"):
                continue
            value = m.group(2).split(" Excludes:")[0]  # which flags it excludes: kept, it says something
            for noise in [":", " x ", " ...", "in [", "Needs"]:
                assert noise not in value, (command, line)
    attend = help_pages(run)["attend"]
    assert re.search(r"^  --window L,R  +Sliding window L,R, each -1 to 2\^62", attend, re.M), attend
    assert re.search(r"^  --cu-seqlens-q LIST  +Packed sequences", attend, re.M), attend


def test_explain_default_shows_the_scale(run):
    r = run("explain")
    assert r.returncode == 0, r.stderr
    assert "Q K^T" in r.stdout and "softmax" in r.stdout
    assert "N = 4, d_k = 8" in r.stdout and "s = 1/√d_k = 1/√8 = 0.3536" in r.stdout
    assert "P with s = 1" in r.stdout
    # The Study notes' 3×1 example: P row 0 of softmax([1, 2, 3]) = [0.0900, 0.2447, 0.6652].
    r = run("explain", "--notes-example")
    assert r.returncode == 0, r.stderr
    assert "0.0900     0.2447     0.6652" in r.stdout and "s = 1/√d_k = 1/√1 = 1" in r.stdout
    assert_usage_error(run("explain", "--notes-example", "--n", "3"), "--notes-example")
    r = run("explain", "--n", "4", "--d", "3", "--seed", "2", "--causal", "top-left", "--scale", "none")
    assert r.returncode == 0 and "-inf" in r.stdout
    assert_usage_error(run("explain", "--n", "100", "--d", "3"), "--n")


CROWDS = "each row's weight crowds onto"


def test_explain_says_what_its_own_rows_show(run):
    # The closing sentence follows the printed largest weights: the usual s < 1 crowds the rows
    # without it, an s > 1 spreads them, and rows that see one key do not change at all.
    r = run("explain")
    assert r.returncode == 0 and CROWDS in r.stdout
    r = run("explain", "--scale", "4")
    assert r.returncode == 0, r.stderr
    assert CROWDS not in r.stdout and "without it each row's weight spreads over more keys" in r.stdout
    r = run("explain", "--n", "3", "--d", "2", "--window", "0,0")
    assert r.returncode == 0, r.stderr
    assert CROWDS not in r.stdout and "No row's largest weight changes" in r.stdout
    r = run("explain", "--scale", "-1")
    assert r.returncode == 0, r.stderr
    assert CROWDS not in r.stdout and "rises in" in r.stdout and "falls in" in r.stdout


def test_explain_refuses_flags_its_input_would_ignore(run, tmp_path):
    # With files, --n 3 and --seed 7 were ignored and --notes-example lost to the files, silently.
    files = write_inputs(tmp_path)
    for extra, flag in ((["--n", "3"], "--n"), (["--seed", "7"], "--seed"), (["--notes-example"], "--notes-example")):
        r = run("explain", *files, *extra)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
        assert flag in r.stderr, r.stderr
    r = run("explain", "--notes-example", "--seed", "3")
    assert r.returncode == 2 and "--seed" in r.stderr, r.stderr
    assert run("explain", *files).returncode == 0


def test_probs_with_dropout_are_what_the_help_says(run, tmp_path):
    # --probs with --dropout wrote negative "probabilities", which --help did not mention: a dropped
    # entry is -P_ij (P before dropout), and the output is the kept entries / (1 - p) times V.
    base = write_inputs(tmp_path, nq=6, nkv=9, d=5)
    out, probs, plain = tmp_path / "o.npy", tmp_path / "p.npy", tmp_path / "p0.npy"
    r = run("attend", *base, "--out", out, "--probs", probs, "--dropout", "0.5", "--dropout-seed", "3")
    assert r.returncode == 0, r.stderr
    assert run("attend", *base, "--out", tmp_path / "o0.npy", "--probs", plain).returncode == 0
    p, p0, v = np.load(probs), np.load(plain), np.load(tmp_path / "v.npy")
    assert (p < 0).any() and (p > 0).any()
    np.testing.assert_array_equal(np.abs(p), p0)
    np.testing.assert_allclose(np.load(out), (np.where(p > 0, p, 0) / 0.5) @ v, atol=1e-6)
    help_text = " ".join(run("attend", "--help").stdout.split())
    assert "with --dropout: P before dropout, a dropped entry as -P_ij" in help_text


def test_score_transforms_dropout_and_packed_sequences(run, tmp_path):
    # The CLI's flags give the library's numbers (checked against the float64 reference in the
    # library's own tests), here through the Python binding on the same files.
    import attnscale
    rng = np.random.default_rng(3)
    arrays = {"q": rng.standard_normal((4, 21, 16)), "k": rng.standard_normal((2, 40, 16)),
              "v": rng.standard_normal((2, 40, 8)), "sinks": rng.standard_normal(4), "alibi": rng.uniform(0, 1, 4)}
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.npy", a.astype(np.float32) if name in "qkv" else a)
    out = tmp_path / "o.npy"
    r = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy", "--out", out,
            "--causal", "bottom-right", "--softcap", "2", "--alibi-slopes", tmp_path / "alibi.npy",
            "--sinks", tmp_path / "sinks.npy", "--dropout", "0.25", "--dropout-seed", "9",
            "--cu-seqlens-q", "0,3,3,20,21", "--cu-seqlens-k", "0,5,9,9,40")
    assert r.returncode == 0, r.stderr
    q, k, v = (arrays[n].astype(np.float32) for n in "qkv")
    want = attnscale.attention(q, k, v, causal="bottom-right", softcap=2.0, alibi_slopes=arrays["alibi"],
                               sinks=arrays["sinks"], dropout_p=0.25, dropout_seed=9,
                               cu_seqlens_q=[0, 3, 3, 20, 21], cu_seqlens_k=[0, 5, 9, 9, 40])
    np.testing.assert_array_equal(np.load(out), want)
    base = write_inputs(tmp_path)
    out2 = tmp_path / "o2.npy"
    assert_usage_error(run("attend", *base, "--out", out2, "--cu-seqlens-q", "0,x"), "--cu-seqlens-q", out2)
    assert_usage_error(run("attend", *base, "--out", out2, "--cu-seqlens-q", "0,5"), "requires --cu-seqlens-k", out2)
    assert_usage_error(run("attend", *base, "--out", out2, "--dropout", "1.5"), "dropout: p must be in [0, 1)", out2)
    assert_usage_error(run("attend", *base, "--out", out2, "--softcap", "-1"), "softcap:", out2)
