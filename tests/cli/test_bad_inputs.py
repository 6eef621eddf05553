"""Every kind of bad input, end to end through the `attnscale` command line.

Each case must exit with code 2, print exactly one line "attnscale: error: ..." naming the
problem, and leave no output file (nor a temporary one) behind.
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/cli/test_bad_inputs.py
"""
import os
import re
import struct
import subprocess

import numpy as np
import pytest

BIN = os.environ.get("ATTNSCALE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "attnscale"))


def npy_bytes(header, data, version=1):
    """A .npy file with a hand-written header dict (padded as numpy pads it)."""
    pre = 10 if version == 1 else 12
    h = header + " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    n = struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + n + h.encode("latin1") + data


@pytest.fixture
def work(tmp_path):
    """A folder with valid q [4, 8], k [6, 8], v [6, 3] float32 files."""
    rng = np.random.default_rng(6)
    np.save(tmp_path / "q.npy", rng.standard_normal((4, 8)).astype("<f4"))
    np.save(tmp_path / "k.npy", rng.standard_normal((6, 8)).astype("<f4"))
    np.save(tmp_path / "v.npy", rng.standard_normal((6, 3)).astype("<f4"))
    return tmp_path


def attend(work, *extra, q="q.npy", k="k.npy", v="v.npy", out="o.npy"):
    args = ["attend", "--q", q, "--k", k, "--v", v, "--out", out, *extra]
    return subprocess.run([BIN, *args], cwd=work, capture_output=True, text=True, timeout=120)


def assert_refused(result, work, *words):
    """Exit 2, one error line containing every word, no output or temporary file left."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("attnscale: error: "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert result.stdout == ""
    left = sorted(p.name for p in work.iterdir() if p.name.startswith(("o.npy", "lse.npy", "probs.npy")))
    assert left == [], left


def test_valid_inputs_work(work):
    r = attend(work, "--lse", "lse.npy", "--probs", "probs.npy")
    assert r.returncode == 0, r.stderr
    assert np.load(work / "o.npy").shape == (4, 3)


# --- files -------------------------------------------------------------------------------------

def test_missing_file(work):
    assert_refused(attend(work, q="absent.npy"), work, "absent.npy", "cannot open file")


def test_a_file_error_names_the_flag_of_the_file(work):
    # read_npy knows only the path; the line starts with the flag the file was given to, so that
    # `--k x.npy --v x.npy` or a float16 file from PyTorch says which input is refused.
    np.save(work / "h.npy", np.ones((6, 8), np.float16))
    np.save(work / "i.npy", np.ones((4, 6), np.int64))
    for r, flag, words in [
            (attend(work, q="absent.npy"), "--q", "absent.npy: cannot open file"),
            (attend(work, k="h.npy"), "--k", "h.npy: unsupported dtype '<f2'"),
            (attend(work, "--mask", "i.npy"), "--mask", "i.npy: unsupported dtype '<i8'"),
            (attend(work, "--sinks", "absent.npy"), "--sinks", "absent.npy: cannot open file"),
            (subprocess.run([BIN, "explain", "--q", "h.npy", "--k", "k.npy", "--v", "k.npy"], cwd=work,
                            capture_output=True, text=True, timeout=60), "--q", "h.npy: unsupported dtype")]:
        assert_refused(r, work, f"attnscale: error: {flag}: {words}")


def test_directory_instead_of_file(work):
    (work / "adir").mkdir()
    assert_refused(attend(work, k="adir"), work, "adir", "is a directory")


def test_empty_file(work):
    (work / "e.npy").write_bytes(b"")
    assert_refused(attend(work, q="e.npy"), work, "e.npy", "empty file")


def test_truncated_data(work):
    full = (work / "q.npy").read_bytes()
    (work / "t.npy").write_bytes(full[:-7])
    assert_refused(attend(work, q="t.npy"), work, "t.npy", "truncated")


def test_truncated_header(work):
    (work / "t.npy").write_bytes((work / "q.npy").read_bytes()[:40])
    assert_refused(attend(work, q="t.npy"), work, "t.npy", "truncated header")


def test_oversized_file(work):
    (work / "big.npy").write_bytes((work / "v.npy").read_bytes() + b"\0" * 12)
    assert_refused(attend(work, v="big.npy"), work, "big.npy", "header promises 72 data bytes but the file holds 84")


def test_wrong_magic(work):
    (work / "zip.npy").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    assert_refused(attend(work, q="zip.npy"), work, "zip.npy", "bad magic")


def test_text_file(work):
    (work / "t.npy").write_text("1.0 2.0 3.0\n" * 10)
    assert_refused(attend(work, q="t.npy"), work, "t.npy", "not a .npy file")


def test_unknown_format_version(work):
    data = bytearray((work / "q.npy").read_bytes())
    data[6] = 9
    (work / "v9.npy").write_bytes(bytes(data))
    assert_refused(attend(work, q="v9.npy"), work, "v9.npy", "format version 9")


def test_garbled_header(work):
    (work / "g.npy").write_bytes(npy_bytes("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4, 8), }", b"\0" * 128))
    assert_refused(attend(work, q="g.npy"), work, "g.npy", "malformed header")


def test_big_endian(work):
    np.save(work / "be.npy", np.ones((4, 8), ">f4"))
    assert_refused(attend(work, q="be.npy"), work, "be.npy", "big-endian")


def test_fortran_order(work):
    np.save(work / "f.npy", np.asfortranarray(np.ones((4, 8), "<f4")))
    assert_refused(attend(work, q="f.npy"), work, "f.npy", "Fortran-order")


@pytest.mark.parametrize("dtype", ["<i8", "<i4", "<f2", "<c8", "<u2"])
def test_unsupported_dtype(work, dtype):
    np.save(work / "d.npy", np.ones((4, 8), dtype))
    assert_refused(attend(work, q="d.npy"), work, "d.npy", "unsupported dtype", dtype)


def test_object_dtype(work):
    np.save(work / "o_arr.npy", np.array([[1, "a"]], dtype=object), allow_pickle=True)
    assert_refused(attend(work, q="o_arr.npy"), work, "o_arr.npy", "unsupported dtype '|O'")


def test_structured_dtype(work):
    np.save(work / "s.npy", np.zeros(4, dtype=[("a", "<f4"), ("b", "<i4")]))
    assert_refused(attend(work, q="s.npy"), work, "s.npy", "structured arrays")


@pytest.mark.parametrize("dtype", [bool, np.uint8])
def test_a_bool_or_uint8_input_is_told_it_looks_like_a_mask(work, dtype):
    # A keep mask given to --q, --k or --v (or --k m.npy typed for --mask m.npy): the line says so
    # before it offers the conversion to float32.
    np.save(work / "b.npy", np.ones((4, 8), dtype))
    tail = ("b.npy: unsupported dtype bool/uint8 (expected float32 '<f4' or float64 '<f8'); this looks like a "
            "mask: pass it as --mask, or save it as float32 (arr.astype('<f4'))")
    for r, flag in [(attend(work, q="b.npy"), "--q"), (attend(work, k="b.npy"), "--k"), (attend(work, v="b.npy"), "--v"),
                    (explain(work, "b.npy"), "--q")]:
        assert_refused(r, work, f"error: {flag}: {tail}")
        assert r.stderr.strip().endswith(tail)
    # --sinks takes one logit a head: a bool file there is not a mask in the wrong place.
    r = attend(work, "--sinks", "b.npy")
    assert_refused(r, work, "error: --sinks: b.npy: unsupported dtype bool/uint8")
    assert r.stderr.strip().endswith("; save it as float32 (arr.astype('<f4'))") and "mask" not in r.stderr


FLOATS = "(expected float32 '<f4' or float64 '<f8')"
MASKS = "(expected bool '|b1', uint8 '|u1', float32 '<f4' or float64 '<f8')"
TO_F4 = "; save it as float32 (arr.astype('<f4'))"


def explain(work, q):
    return subprocess.run([BIN, "explain", "--q", q, "--k", "k.npy", "--v", "k.npy"], cwd=work,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("dtype,advice", [("<f2", TO_F4), (">f2", TO_F4), ("<i8", TO_F4), ("<u2", TO_F4),
                                          ("<c8", ""), ("<U3", "")])
def test_a_dtype_message_lists_what_the_flag_takes_and_how_to_convert(work, dtype, advice):
    # Every flag was told "(expected float32 '<f4', float64 '<f8', bool or uint8)", read_npy's list,
    # though --q/--k/--v refuse bool; a float16 file from PyTorch got no advice. Each flag now lists
    # its own dtypes, and a float or integer file is told how to convert it (a complex or string
    # one, whose values do not convert, is not).
    np.save(work / "d.npy", np.ones((4, 8), dtype))
    tail = f"d.npy: unsupported dtype '{dtype}' {FLOATS}{advice}"
    for r, flag in [(attend(work, q="d.npy"), "--q"), (attend(work, v="d.npy"), "--v"), (explain(work, "d.npy"), "--q"),
                    (attend(work, "--sinks", "d.npy"), "--sinks")]:
        assert_refused(r, work, f"error: {flag}: {tail}")
        assert r.stderr.strip().endswith(tail)


@pytest.mark.parametrize("dtype,advice", [
    ("<f2", TO_F4), ("<i8", "; save a keep mask as bool (arr.astype(bool)) or an additive one as float32 "
                            "(arr.astype('<f4'))"), ("<c8", "")])
def test_a_mask_dtype_message_lists_what_mask_takes(work, dtype, advice):
    np.save(work / "m.npy", np.ones((4, 6), dtype))
    r = attend(work, "--mask", "m.npy")
    assert_refused(r, work, f"error: --mask: m.npy: unsupported dtype '{dtype}' {MASKS}{advice}")
    assert r.stderr.strip().endswith(MASKS + advice)


def test_rank_one_and_rank_five(work):
    np.save(work / "r1.npy", np.ones(8, "<f4"))
    assert_refused(attend(work, q="r1.npy"), work, "--q", "expected rank 2, 3 or 4")
    np.save(work / "r5.npy", np.ones((1, 1, 1, 4, 8), "<f4"))
    assert_refused(attend(work, q="r5.npy"), work, "r5.npy", "rank 1..4")


def test_scalar_file(work):
    np.save(work / "s.npy", np.float32(3))
    assert_refused(attend(work, q="s.npy"), work, "s.npy", "rank 1..4")


# --- shapes ------------------------------------------------------------------------------------

def test_dk_mismatch(work):
    np.save(work / "k7.npy", np.ones((6, 7), "<f4"))
    assert_refused(attend(work, k="k7.npy"), work, "dk = 7", "dk = 8")


def test_v_keys_mismatch(work):
    np.save(work / "v5.npy", np.ones((5, 3), "<f4"))
    assert_refused(attend(work, v="v5.npy"), work, "v:", "[5, 3]", "[6, 8]")


def test_v_rank_differs_from_k(work):
    np.save(work / "v3.npy", np.ones((1, 6, 3), "<f4"))
    assert_refused(attend(work, v="v3.npy"), work, "--v", "rank 3", "rank 2")


def test_heads_not_a_multiple(work):
    np.save(work / "q3.npy", np.ones((3, 4, 8), "<f4"))
    np.save(work / "k2.npy", np.ones((2, 6, 8), "<f4"))
    np.save(work / "v2.npy", np.ones((2, 6, 3), "<f4"))
    assert_refused(attend(work, q="q3.npy", k="k2.npy", v="v2.npy"), work, "Hq = 3", "Hkv = 2")


def test_batch_mismatch(work):
    np.save(work / "q4.npy", np.ones((2, 1, 4, 8), "<f4"))
    np.save(work / "k4.npy", np.ones((3, 1, 6, 8), "<f4"))
    np.save(work / "v4.npy", np.ones((3, 1, 6, 3), "<f4"))
    assert_refused(attend(work, q="q4.npy", k="k4.npy", v="v4.npy"), work, "batch")


def test_dtype_mismatch(work):
    np.save(work / "k64.npy", np.ones((6, 8), "<f8"))
    assert_refused(attend(work, k="k64.npy"), work, "dtypes differ", "float64")


def test_mask_shape_mismatch(work):
    np.save(work / "m.npy", np.ones((4, 5), bool))
    assert_refused(attend(work, "--mask", "m.npy"), work, "mask", "[4, 5]", "[4, 6]")


def test_mask_unsupported_dtype(work):
    np.save(work / "m.npy", np.ones((4, 6), "<i2"))
    assert_refused(attend(work, "--mask", "m.npy"), work, "m.npy", "unsupported dtype")


@pytest.mark.parametrize("which,shape", [("q", (0, 8)), ("k", (0, 8)), ("q", (4, 0)), ("v", (6, 0))])
def test_zero_size_dimension(work, which, shape):
    np.save(work / "z.npy", np.zeros(shape, "<f4"))
    assert_refused(attend(work, **{which: "z.npy"}), work, "every dimension must be positive", str(list(shape)).replace("(", "["))


# --- values ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,word", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_nonfinite_inputs_refused(work, which, value, word):
    a = np.load(work / f"{which}.npy")
    a[2, 1] = value
    np.save(work / "x.npy", a)
    assert_refused(attend(work, **{which: "x.npy"}), work, f"--{which}", f"holds {word} at [2, 1]")


def test_nonfinite_mask_refused_but_minus_inf_allowed(work):
    m = np.zeros((4, 6), "<f4")
    m[1, 2] = -np.inf
    np.save(work / "m.npy", m)
    assert attend(work, "--mask", "m.npy").returncode == 0
    (work / "o.npy").unlink()
    m[3, 0] = np.nan
    np.save(work / "m.npy", m)
    assert_refused(attend(work, "--mask", "m.npy"), work, "--mask", "holds nan at [3, 0]")


def test_allow_nonfinite_keeps_nan_in_its_row(work):
    q = np.load(work / "q.npy")
    q[2, 0] = np.nan
    np.save(work / "x.npy", q)
    r = attend(work, "--allow-nonfinite", q="x.npy")
    assert r.returncode == 0, r.stderr
    o = np.load(work / "o.npy")
    assert np.isnan(o[2]).all() and np.isfinite(np.delete(o, 2, axis=0)).all()


# --- sizes that cannot be allocated --------------------------------------------------------------

def test_header_claims_huge_shape_short_file(work):
    (work / "h.npy").write_bytes(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }", b"\0" * 64))
    assert_refused(attend(work, q="h.npy"), work, "h.npy", "header promises 4000000000000 data bytes", "truncated")


def test_header_shape_overflows(work):
    (work / "h.npy").write_bytes(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (999999999999999, 999999999999999, 9), }", b"\0" * 8))
    assert_refused(attend(work, q="h.npy"), work, "h.npy", "shape too large")


def huge_problem(work, n=1_000_000):
    """q, k, v of n rows and width 1: a few MB each, but n x n probabilities would take terabytes."""
    x = np.linspace(-1, 1, n, dtype="<f4").reshape(n, 1)
    for name in ("q", "k", "v"):
        np.save(work / f"{name}_big.npy", x)
    return dict(q="q_big.npy", k="k_big.npy", v="v_big.npy")


def test_probs_that_would_need_terabytes(work):
    r = attend(work, "--probs", "probs.npy", **huge_problem(work))
    assert_refused(r, work, "--probs", "[1000000, 1000000] float32 needs 3.6 TiB", "more than")


def memory_limit_bytes():
    """RAM + swap, as the tool reads it (sysinfo: totalram + totalswap)."""
    swap_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("SwapTotal:"))
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") + 1024 * swap_kib


def sparse_npy(path, *shape):
    """A float32 .npy of `shape` made of holes: its header, then a file size that holds the data, no
    data written (a few KiB on disk whatever the size)."""
    header = npy_bytes(f"{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple(shape)}, }}", b"")
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + 4 * int(np.prod(shape, dtype=object)))


def test_arrays_that_fit_one_by_one_but_not_together(work):
    # q, k, v and the output of 30% of RAM + swap each: every tensor passes its own check, but the
    # call holds all four at once. Refused from the headers, before any input is read.
    rows = int(0.3 * memory_limit_bytes()) // (4 * 64)
    sparse_npy(work / "x.npy", rows, 64)
    r = attend(work, q="x.npy", k="x.npy", v="x.npy")
    shape = f"[{rows}, 64] float32"
    # The kernels' per-thread tiles come last, with their size (tens of KiB a thread).
    assert_refused(r, work, f"error: --q {shape}, --k {shape}, --v {shape}, --out {shape}, the kernels' scratch ",
                   "KiB: the call needs about", "more than the",
                   "of memory (RAM + swap) this machine has; smaller arrays need less")
    # 128 query rows: their probabilities [128, rows] take 60%, k and v 30% each.
    np.save(work / "q128.npy", np.random.default_rng(7).standard_normal((128, 64)).astype("<f4"))
    r = attend(work, "--lse", "lse.npy", "--probs", "probs.npy", q="q128.npy", k="x.npy", v="x.npy")
    assert_refused(r, work, f"--k {shape}, --v {shape}, --out [128, 64] float32, --lse [128] float32, "
                   f"--probs [128, {rows}] float32, the kernels' scratch ", ": the call needs about",
                   "smaller arrays, or no --probs, need less")


def test_reference_score_matrix_that_would_need_terabytes(work):
    # One head's P, soft-capping and dropout factors in float64 and its visibility flags: 25 bytes a
    # score, 22.7 TiB for 10^12 of them.
    r = attend(work, "--reference", **huge_problem(work))
    assert_refused(r, work, "reference: one head's 1000000 x 1000000 score matrix needs 22.7 TiB")


def test_reference_scores_counted_with_the_arrays(work):
    # k and v of 30% of RAM + swap each; 16 query rows, whose reference scores over those keys take
    # 25 · 16 · rows bytes (47%) of their own. Each fits, the arrays fit, the sum does not.
    rows = int(0.3 * memory_limit_bytes()) // (4 * 64)
    sparse_npy(work / "x.npy", rows, 64)
    np.save(work / "q16.npy", np.random.default_rng(8).standard_normal((16, 64)).astype("<f4"))
    r = attend(work, "--reference", q="q16.npy", k="x.npy", v="x.npy")
    shape = f"[{rows}, 64] float32"
    assert_refused(r, work, f"error: --q [16, 64] float32, --k {shape}, --v {shape}, --out [16, 64] float32, "
                   f"--reference's scores of one head [16, {rows}] ", ": the call needs about",
                   "smaller arrays, or no --reference, need less")


def test_reference_scores_of_packed_sequences_are_one_sequence_s(work):
    # Packed sequences (--cu-seqlens) run one at a time: the scores held are one sequence's. k and v
    # of 35% each, all in the first of two sequences of 12 query rows: [12, rows] scores, 41%.
    rows = int(0.35 * memory_limit_bytes()) // (4 * 64)
    sparse_npy(work / "x.npy", 1, rows, 64)
    np.save(work / "q.npy", np.random.default_rng(8).standard_normal((1, 24, 64)).astype("<f4"))
    r = attend(work, "--reference", "--cu-seqlens-q", "0,12,24", "--cu-seqlens-k", f"0,{rows},{rows}",
               k="x.npy", v="x.npy")
    assert_refused(r, work, f"--out [1, 24, 64] float32, --reference's scores of one head [12, {rows}] ",
                   ": the call needs about", "smaller arrays, or no --reference, need less")


def test_alibi_slopes_and_sinks_counted_with_the_arrays(work):
    # H heads of one row of width 1: q, k, v and out of 20% of RAM + swap each, and --alibi-slopes and
    # --sinks [H] of 20% each: 120% together, 80% without them.
    heads = int(0.2 * memory_limit_bytes()) // 4
    sparse_npy(work / "x.npy", heads, 1, 1)
    sparse_npy(work / "h.npy", heads)
    r = attend(work, "--alibi-slopes", "h.npy", "--sinks", "h.npy", q="x.npy", k="x.npy", v="x.npy")
    shape = f"[{heads}, 1, 1] float32"
    assert_refused(r, work, f"error: --alibi-slopes [{heads}] float32, --sinks [{heads}] float32, --q {shape}, "
                   f"--k {shape}, --v {shape}, --out {shape}", ": the call needs about", "smaller arrays need less")


# --- flags and values ----------------------------------------------------------------------------

@pytest.mark.parametrize("extra,words", [
    (["--bogus"], ["unknown flag --bogus"]),
    (["--causal", "sideways"], ["--causal", "sideways"]),
    (["--align", "middle"], ["--align", "middle"]),
    (["--causal", "top-left", "--align", "bottom-right"], ["--align", "conflicts"]),
    (["--window", "3"], ["--window", "2 required"]),
    (["--window", "a,b"], ["--window", "expected an integer from -1 to", "got 'a'"]),
    (["--window", "-5,2"], ["--window", "got '-5'"]),
    (["--window", "99999999999999999999,1"], ["--window"]),
    (["--scale", "abc"], ["--scale", "abc"]),
    (["--scale", "nan"], ["--scale"]),
    (["--scale", "inf"], ["--scale"]),
    (["--threads", "-1"], ["--threads", "expected an integer from 0 to 4096, got '-1'"]),
    (["--threads", "many"], ["--threads", "got 'many'"]),
    (["--dropout-seed", "-1"], ["--dropout-seed", "got '-1'"]),
    (["--dropout-offset", "x"], ["--dropout-offset", "got 'x'"]),
    (["--threads", "99999999999"], ["--threads"]),
    (["--lse"], ["--lse"]),
])
def test_bad_flags(work, extra, words):
    assert_refused(attend(work, *extra), work, *words)


def test_missing_required_flag(work):
    r = subprocess.run([BIN, "attend", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"], cwd=work,
                       capture_output=True, text=True)
    assert_refused(r, work, "--out", "required")


def test_unknown_subcommand(work):
    r = subprocess.run([BIN, "frobnicate"], cwd=work, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "frobnicate" in r.stderr, r.stderr


def test_unwritable_output_leaves_nothing(work):
    r = attend(work, out="no_such_dir/o.npy")
    assert_refused(r, work, "no_such_dir/o.npy", "cannot write")


def test_failed_second_output_removes_the_first(work):
    r = attend(work, "--lse", "no_such_dir/lse.npy")
    assert_refused(r, work, "no_such_dir/lse.npy")
    assert not (work / "o.npy").exists()


def test_misspelt_flag_is_named_with_the_nearest_one(work):
    r = subprocess.run([BIN, "attend", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--outt", "o.npy"],
                       cwd=work, capture_output=True, text=True)
    assert_refused(r, work, "unknown flag --outt (did you mean --out?)")
    assert_refused(attend(work, "--casual", "top-left"), work, "unknown flag --casual (did you mean --causal?)")


@pytest.mark.parametrize("extra,out,words", [
    (["--lse", "o.npy"], "o.npy", ["--lse: 'o.npy' is also --out's file"]),
    (["--probs", "./lse.npy", "--lse", "lse.npy"], "o.npy", ["--probs: './lse.npy' is also --lse's file"]),
    ([], "q.npy", ["--out: 'q.npy' is also the input --q"]),
    (["--lse", "./k.npy"], "o.npy", ["--lse: './k.npy' is also the input --k"]),
])
def test_one_file_per_output_and_no_output_over_an_input(work, extra, out, words):
    before = {name: (work / name).read_bytes() for name in ("q.npy", "k.npy", "v.npy")}
    assert_refused(attend(work, *extra, out=out), work, *words)
    assert {name: (work / name).read_bytes() for name in before} == before


def experiment(*args):
    return subprocess.run([BIN, "experiment", *args], capture_output=True, text=True, timeout=120)


def test_trials_zero_is_an_error_not_the_default():
    r = experiment("moments", "--trials", "0")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.startswith("attnscale: error: --trials: expected an integer from 1 to 2147483648, got '0'"), r.stderr


@pytest.mark.parametrize("args,words", [
    (["bench", "--n", "0"], ["--n", "expected an integer from 1 to", "got '0'"]),
    (["bench", "--d", "64,abc"], ["--d", "got 'abc'", "'64,abc'"]),
    (["bench", "--n", "4096,,"], ["--n", "got ''", "'4096,,'"]),
    (["bench", "--rounds", "-1"], ["--rounds", "expected an integer from 1 to 1000, got '-1'"]),
    (["bench", "--rounds", "1.5"], ["--rounds", "got '1.5'"]),
    (["bench", "--threads", "many"], ["--threads", "got 'many'"]),
    (["bench", "--rows", "fwd,nope"], ["--rows", "no case 'nope'", "'fwd,nope'", "kv-i8-tok"]),
    (["explain", "--n", "0"], ["--n", "expected an integer from 1 to 16, got '0'"]),
    (["explain", "--d", "abc"], ["--d", "got 'abc'"]),
    (["explain", "--seed", "-5"], ["--seed", "expected an integer from 0 to 18446744073709551615, got '-5'"]),
    (["experiment", "moments", "--seed", "-5"], ["--seed", "got '-5'"]),
    (["report", "--seed", "x"], ["--seed", "got 'x'"]),
])
def test_integer_flags_name_the_flag_and_the_range(args, words):
    # Refused before any work: exit 2, nothing on stdout, one line naming the flag.
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.returncode, r.stderr)
    assert r.stderr.startswith("attnscale: error: "), r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_one_trial_gives_no_interval_and_says_so():
    r = experiment("saturation", "--n", "5", "--d", "4", "--scaling", "sqrt", "--trials", "1")
    assert r.returncode == 0, r.stderr
    assert "have no confidence interval (1 trial is too few for it); their ci_low and ci_high are nan" in r.stderr
    rows = [line.split(",") for line in r.stdout.splitlines()[1:]]
    assert rows and all(row[5] == "nan" and row[6] == "nan" and row[4] != "nan" for row in rows)


def test_identical_trials_give_no_zero_width_interval_and_say_so():
    # Row-wise attention never leaks a later query into earlier outputs: the leak is exactly 0 in
    # every trial. It read "0 [0, 0]", an interval that looks exact; a leak has no upper bound to
    # reach from, so there is none, and the note gives identical values as a possible cause.
    r = experiment("columns", "--n", "5", "--d", "4", "--trials", "3")
    assert r.returncode == 0, r.stderr
    row = next(line.split(",") for line in r.stdout.splitlines() if line.startswith("5,4,row,causal_leak,"))
    assert row[4:7] == ["0", "nan", "nan"], row
    assert "(3 trials are too few for it, or all gave the same value)" in r.stderr, r.stderr


def test_a_slope_over_two_points_blames_the_points_not_the_trials():
    # Two head sizes give a slope but no interval for it, however many trials each point has.
    r = experiment("variance", "--d", "1,4", "--trials", "10")
    assert r.returncode == 0, r.stderr
    assert "3 of 11 rows have no confidence interval (too few sweep points behind it, or they lie on one line)" in r.stderr, r.stderr
    r = experiment("variance", "--d", "1,4", "--trials", "1")  # a variance needs 2 trials
    assert r.returncode == 0, r.stderr
    assert "6 of 6 rows have no confidence interval (1 trial is too few for it)" in r.stderr, r.stderr


@pytest.mark.parametrize("args,words", [
    (["variance", "--d", "1,16,16"], ["--d: each value may be listed once, got 16 twice in '1,16,16'"]),
    (["variance", "--d", "1,1,1"], ["--d:", "1 twice"]),
    (["saturation", "--scaling", "sqrt, sqrt"], ["--scaling:", "sqrt twice"]),
    (["projections", "--x-mean", "0.5,5e-1"], ["--x-mean: each value may be listed once, got 0.5 and 5e-1"]),
    (["variance", "--dist", "t5,t05"], ["--dist: each value may be listed once, got t5 and t05 in 't5,t05'"]),
    (["moments", "--dist", "laplace,t5.0,t5"], ["--dist:", "got t5.0 and t5"]),
])
def test_a_value_listed_twice_is_refused(tmp_path, args, words):
    # Repeated values used to repeat rows, and --d 1,1,1 fitted a slope of 0 with the interval [0, 0].
    out = tmp_path / "x.csv"
    r = experiment(*args, "--trials", "3", "--out", str(out))
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.returncode, r.stderr)
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not out.exists()


@pytest.mark.parametrize("args,words", [
    (["variance", "--dist", "t2"], ["--dist: distribution 't2': Student-t needs nu > 2"]),
    (["moments", "--dist", "laplace,cauchy"], ["--dist: unknown distribution 'cauchy'"]),
])
def test_a_bad_distribution_names_the_flag(args, words):
    r = experiment(*args, "--trials", "3")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.returncode, r.stderr)
    for w in words:
        assert w in r.stderr, (w, r.stderr)


@pytest.mark.parametrize("args,words", [
    (["variance", "--sigma", "1e200"], ["--sigma: expected one number in [1e-6, 1e6]"]),
    (["variance", "--sigma", "1e-200"], ["--sigma: expected one number in [1e-6, 1e6]"]),
    (["variance", "--mu", "1e308"], ["--mu: expected one number in [-1e6, 1e6]"]),
    (["moments", "--mu", "-1e200"], ["--mu: expected one number in [-1e6, 1e6]"]),
    (["projections", "--x-std", "1e100"], ["--x-std: expected one number in [1e-6, 1e6]"]),
    (["projections", "--x-mean", "1e200"], ["--x-mean: expected one number in [-1e6, 1e6]"]),
])
def test_component_moments_float64_cannot_measure_are_refused(tmp_path, args, words):
    # --sigma 1e200 wrote rows of nan (theory inf), --sigma 1e-200 variances of exactly 0 with the
    # interval [0, 0], both with exit code 0.
    out = tmp_path / "x.csv"
    r = experiment(*args, "--d", "4", "--trials", "3", "--out", str(out)) if args[0] != "projections" else \
        experiment(*args, "--trials", "3", "--out", str(out))
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.returncode, r.stderr)
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not out.exists() and not (tmp_path / "x.csv.partial").exists()


@pytest.mark.parametrize("name", ["training", "recall"])
def test_trials_of_a_training_experiment_are_refused_not_ignored(tmp_path, name):
    # --trials 5 ran the same runs as without it (the help said "Monte Carlo trials per point").
    out = tmp_path / "x.csv"
    r = experiment(name, "--grid", "quick", "--trials", "5", "--out", str(out))
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.returncode, r.stderr)
    assert r.stderr.startswith(f"attnscale: error: --trials: experiment {name} trains models, it has no trials; "
                               "--seeds sets the runs per configuration"), r.stderr
    assert not out.exists() and not (tmp_path / "x.csv.partial").exists()
    assert "not taken: experiment" in experiment(name, "--help").stdout


def test_projections_report_nothing_measured_as_nan_not_as_an_exact_zero():
    # At d = 1 there is no pair of components, yet corr_q_components read 0 [0, 0] (theory 0): (iv)
    # "met exactly"; the note then blamed too few trials for rows no number of trials would give.
    r = experiment("projections", "--n", "4", "--dx", "3", "--d", "1", "--init", "scaled", "--layernorm", "off",
                   "--trials", "30")
    assert r.returncode == 0, r.stderr
    row = next(line.split(",") for line in r.stdout.splitlines() if ",corr_q_components," in line)
    assert row[6:9] == ["nan", "nan", "nan"], row
    assert r.stderr == "attnscale: note: 1 of 6 rows are nan: their statistic is not defined at their point's settings\n"
    # LayerNorm over one entry makes every row 0: refused, not measured as var_q 0 against theory 1.
    r = experiment("projections", "--dx", "1,8", "--layernorm", "on", "--trials", "3")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--dx: LayerNorm (--layernorm on) of a row of 1 entry is 0; give dx >= 2" in r.stderr


def test_a_point_too_large_for_memory_is_an_error_naming_it(tmp_path):
    # Sizes inside the flags' ranges whose arrays no machine here holds (K of 2^20 x 2^16 doubles,
    # 512 GiB) ended in "internal error: std::bad_alloc", exit code 1, with x.csv.partial left; they
    # are now refused from the flags before the sweep starts (tests/cli/test_size_limits.py).
    out = tmp_path / "x.csv"
    r = experiment("length", "--n", "1048576", "--d", "65536", "--rule", "fixed", "--trials", "2", "--out", str(out))
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (r.returncode, r.stderr)
    assert r.stderr.startswith("attnscale: error: --trials 2 --n 1048576 --d 65536 --rule fixed: the sweep needs about "
                               "1.0 TiB, more than the"), r.stderr
    assert not out.exists() and not (tmp_path / "x.csv.partial").exists()


def test_variance_theory_keeps_sigma_when_the_mean_dwarfs_it():
    # Var(q_i k_i) = (σ² + μ²)² − μ⁴ lost every digit of σ²(σ² + 2μ²) to cancellation: at μ = 1e6,
    # σ = 1e-3 the theory read 0 (true value 1e-6 · 2e12 = 2e6 per component, 8e6 at d = 4).
    r = experiment("variance", "--mu", "1e6", "--sigma", "1e-3", "--d", "4", "--scaling", "none", "--trials", "200")
    assert r.returncode == 0, r.stderr
    row = next(line.split(",") for line in r.stdout.splitlines() if ",var," in line)
    mean, low, high, theory = map(float, row[4:8])
    assert theory == pytest.approx(4 * 1e-6 * (1e-6 + 2e12)) and low <= theory <= high, row


# --- empty values --------------------------------------------------------------------------------

ATTEND_VALUE_FLAGS = {"--q": "q.npy", "--k": "k.npy", "--v": "v.npy", "--out": "o.npy", "--lse": None,
                      "--probs": None, "--mask": None, "--causal": None, "--align": None, "--window": None,
                      "--scale": None, "--threads": None, "--sharding": None, "--softcap": None,
                      "--alibi-slopes": None, "--sinks": None, "--dropout": None, "--dropout-seed": None,
                      "--dropout-offset": None, "--cu-seqlens-q": None, "--cu-seqlens-k": None}
EXPLAIN_VALUE_FLAGS = ["--q", "--k", "--v", "--n", "--d", "--seed", "--scale", "--causal", "--window", "--align",
                       "--mask", "--threads"]


@pytest.mark.parametrize("flag", sorted(ATTEND_VALUE_FLAGS))
def test_empty_value_is_refused_not_taken_as_absent_attend(work, flag):
    args = ["attend"]
    for f, value in ATTEND_VALUE_FLAGS.items():
        if f != flag and value is not None:
            args += [f, value]
    r = subprocess.run([BIN, *args, flag, ""], cwd=work, capture_output=True, text=True, timeout=60)
    assert_refused_empty(r, work, flag)


@pytest.mark.parametrize("flag", EXPLAIN_VALUE_FLAGS)
def test_empty_value_is_refused_not_taken_as_absent_explain(work, flag):
    r = subprocess.run([BIN, "explain", flag, ""], cwd=work, capture_output=True, text=True, timeout=60)
    assert_refused_empty(r, work, flag)


def assert_refused_empty(r, work, flag):
    """Refused naming the flag: "empty value", or a number flag's own "got ''"."""
    assert_refused(r, work, f"error: {flag}: ")
    assert "empty value" in r.stderr or "got ''" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["experiment", "saturation", "--d", ""], ["experiment", "saturation", "--out", ""],
                                  ["experiment", "saturation", "--format", ""], ["bench", "--rows", ""],
                                  ["report", "--out", ""]])
def test_empty_value_is_refused_in_every_subcommand(work, args):
    r = subprocess.run([BIN, *args], cwd=work, capture_output=True, text=True, timeout=60)
    assert_refused_empty(r, work, args[-2])


# --- explain's inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("value,word", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_explain_refuses_nonfinite_inputs(work, value, word):
    k = np.load(work / "k.npy")
    k[2, 1] = value
    np.save(work / "x.npy", k)
    r = subprocess.run([BIN, "explain", "--q", "q.npy", "--k", "x.npy", "--v", "k.npy"], cwd=work,
                       capture_output=True, text=True, timeout=60)
    assert_refused(r, work, "--k", f"x.npy holds {word} at [2, 1]")
    assert "--allow-nonfinite" not in r.stderr  # explain has no such flag


# --- stdout --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["experiment", "saturation", "--n", "10", "--d", "4,8", "--trials", "20"],
    ["experiment", "saturation", "--n", "10", "--d", "4,8", "--trials", "20", "--format", "json"],
    ["explain"],
    ["--help"],
])
def test_failed_write_to_stdout_is_an_error(args):
    # /dev/full only as the shell would redirect stdout to it: every write fails with ENOSPC.
    with open("/dev/full", "w") as full:
        r = subprocess.run([BIN, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert lines[-1] == "attnscale: error: stdout: write failed (No space left on device)", r.stderr


# --- messages ------------------------------------------------------------------------------------

def test_big_endian_float64_advice_keeps_float64(work):
    np.save(work / "be.npy", np.ones((4, 8), ">f8"))
    assert_refused(attend(work, q="be.npy"), work, "be.npy", "arr.astype('<f8')")


@pytest.mark.parametrize("dtype", [">u2", ">i4", ">f2", ">c8"])
def test_big_endian_of_an_unread_type_gets_no_advice_that_fails_next(work, dtype):
    # '>u2' was told "save it little-endian (arr.astype('<u2'))", which is refused in turn; the only
    # advice is float32, which --q takes.
    np.save(work / "be.npy", np.ones((4, 8), dtype))
    r = attend(work, q="be.npy")
    assert_refused(r, work, "be.npy", f"unsupported dtype '{dtype}' (expected float32 '<f4'")
    assert re.findall(r"astype\('[^']*'\)", r.stderr) == ([] if dtype == ">c8" else ["astype('<f4')"])


def test_nul_in_descr_is_shown_escaped(work):
    (work / "n.npy").write_bytes(npy_bytes("{'descr': '<f\0x', 'fortran_order': False, 'shape': (4, 8), }", b"\0" * 128))
    assert_refused(attend(work, q="n.npy"), work, "n.npy", "unsupported dtype '<f\\x00x' (expected")


@pytest.mark.parametrize("extra,words", [
    (["--softcap", "-1"], ["error: --softcap: must be a finite number >= 0"]),
    (["--softcap", "1e999"], ["--softcap", "expected a finite number, got '1e999'"]),
    (["--dropout", "1.5"], ["error: --dropout: p must be in [0, 1)"]),
    (["--sinks", "s3.npy"], ["error: --sinks: expected shape"]),
    (["--alibi-slopes", "s3.npy"], ["error: --alibi-slopes: expected shape"]),
    (["--mask", "m45.npy"], ["error: --mask: shape [4, 5]"]),
    (["--scale", "1e-400"], ["--scale: '1e-400' is too small"]),
])
def test_library_errors_name_the_flag(work, extra, words):
    np.save(work / "s3.npy", np.zeros(3, "<f4"))
    np.save(work / "m45.npy", np.ones((4, 5), bool))
    assert_refused(attend(work, *extra), work, *words)


def test_packed_sequence_errors_name_the_flag(work):
    for name in ("q", "k", "v"):
        np.save(work / f"{name}3.npy", np.load(work / f"{name}.npy")[None])
    r = attend(work, "--cu-seqlens-q", "0,3,5", "--cu-seqlens-k", "0,2,6", q="q3.npy", k="k3.npy", v="v3.npy")
    assert_refused(r, work, "error: --cu-seqlens-q: must end at the packed length 4, got 5")


def test_k_v_dtype_message_names_the_flags(work):
    np.save(work / "k64.npy", np.ones((6, 8), "<f8"))
    assert_refused(attend(work, k="k64.npy"), work, "error: --q, --k, --v: dtypes differ")


@pytest.mark.parametrize("scale", [" 0.5", "0.5 ", " 0.5 ", "1e-320"])
def test_scale_text_is_read_alike_and_subnormals_are_finite(work, scale):
    r = attend(work, "--scale", scale)
    assert r.returncode == 0, r.stderr
    want = attend(work, "--scale", scale.strip(), out="want.npy")
    assert want.returncode == 0, want.stderr
    assert (work / "o.npy").read_bytes() == (work / "want.npy").read_bytes()


def test_a_refused_number_is_shown_as_given(work):
    # std::to_string's "%f" showed -2 as "-2.000000" and a dropout of -1e-9 as "-0.000000".
    for flag, value, shown in (("--softcap", "-2", "-2"), ("--dropout", "-1e-9", "-1e-09")):
        r = attend(work, flag, value)
        assert_refused(r, work, flag)
        assert r.stderr.rstrip().endswith(f"got {shown}"), r.stderr
