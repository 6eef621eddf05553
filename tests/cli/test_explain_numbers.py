"""`attnscale explain`'s printed matrices against a float64 numpy computation of the same steps."""
import re

import numpy as np
import pytest


def printed_matrix(stdout, title):
    """The matrix printed under a line starting with `title` ("S = Q K^T * s  [2 x 3]")."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows, cols = map(int, re.search(r"\[(\d+) x (\d+)\]", lines[at]).groups())
    m = np.array([[float(x) for x in line.split()] for line in lines[at + 1:at + 1 + rows]])
    assert m.shape == (rows, cols), lines[at:at + rows + 1]
    return m


def numpy_steps(q, k, v, s, keep, added):
    """S = Q K^T s + added, -inf where not kept; P its row softmax (0 for a row with no key); O = P V."""
    scores = np.where(keep, q @ k.T * s + added, -np.inf)
    m = scores.max(axis=1, keepdims=True)
    e = np.where(keep, np.exp(scores - np.where(np.isfinite(m), m, 0)), 0.0)
    l = e.sum(axis=1, keepdims=True)
    p = e / np.where(l == 0, 1, l)
    return scores, p, p @ v


def run_explain(run, tmp_path, q, k, v, *flags, mask=None):
    files = []
    for name, a in (("q", q), ("k", k), ("v", v), ("m", mask)):
        if a is not None:
            np.save(tmp_path / f"{name}.npy", a)
            files += ["--mask" if name == "m" else f"--{name}", tmp_path / f"{name}.npy"]
    r = run("explain", *files, *flags)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_visible_key_whose_weight_underflows_keeps_its_score(run, tmp_path):
    # Scores 900 and 0 in a row: exp(-900) is 0 in float64. The window 5,5 hides no key, but the
    # scores were recovered as lse + log P, so the visible 0 showed as -inf under "The mask hides
    # some keys".
    q = np.array([[30.0, 0.0], [0.0, 30.0]])
    out = run_explain(run, tmp_path, q, q, np.eye(2), "--scale", "none", "--window", "5,5")
    np.testing.assert_array_equal(printed_matrix(out, "S = Q K^T * s"), [[900, 0], [0, 900]])
    assert "hides some keys" not in out and "The mask hides no key here." in out


@pytest.mark.parametrize("flags, keep", [
    (["--causal", "bottom-right"], lambda i, j: j <= i + 2),
    (["--causal", "top-left", "--window", "1,-1"], lambda i, j: (j <= i) & (j >= i - 1)),
    (["--window", "0,1", "--align", "bottom-right"], lambda i, j: (j >= i + 2) & (j <= i + 3)),
])
def test_masked_steps_match_numpy(run, tmp_path, flags, keep):
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    out = run_explain(run, tmp_path, q, k, v, *flags)
    i, j = np.arange(3)[:, None], np.arange(5)[None, :]
    scores, p, o = numpy_steps(q, k, v, 0.5, keep(i, j), 0.0)
    np.testing.assert_allclose(printed_matrix(out, "S = Q K^T * s"), scores, atol=6e-5)
    np.testing.assert_allclose(printed_matrix(out, "P = softmax(S)"), p, atol=6e-5)
    np.testing.assert_allclose(printed_matrix(out, "O  "), o, atol=6e-5)
    assert "The mask hides some keys: their scores become -inf." in out


def test_additive_and_boolean_masks_show_in_the_scores(run, tmp_path):
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    added = np.array([[0.0, -1.5, 2.0, -np.inf]] * 3)
    out = run_explain(run, tmp_path, q, k, v, "--scale", "none", mask=added)
    scores, p, _ = numpy_steps(q, k, v, 1.0, np.isfinite(added), np.where(np.isfinite(added), added, 0))
    np.testing.assert_allclose(printed_matrix(out, "S = Q K^T * s"), scores, atol=6e-5)
    np.testing.assert_allclose(printed_matrix(out, "P = softmax(S)"), p, atol=6e-5)
    assert "(the additive mask's values are added to the others)" in out

    # A boolean mask that hides all of row 1: its P row is 0, and the title says so.
    keep = np.array([[True, False, True, True], [False] * 4, [True, True, False, False]])
    out = run_explain(run, tmp_path, q, k, v, "--scale", "none", mask=keep)
    scores, p, _ = numpy_steps(q, k, v, 1.0, keep, 0.0)
    np.testing.assert_allclose(printed_matrix(out, "S = Q K^T * s"), scores, atol=6e-5)
    np.testing.assert_allclose(printed_matrix(out, "P = softmax(S)"), p, atol=6e-5)
    assert "P = softmax(S) (each row sums to 1, a fully masked row to 0)" in out
    assert "row 1: every key is masked" in out


def test_closing_sentence_counts_the_rows_that_changed(run):
    # Causal top-left: row 0 sees one key and keeps weight 1 at any scale, yet the closing sentence
    # said "each row's weight crowds onto fewer keys".
    r = run("explain", "--causal", "top-left")
    assert r.returncode == 0, r.stderr
    largest = re.findall(r"row (\d+): (\d\.\d{4})  vs  (\d\.\d{4})", r.stdout)
    rose = sum(float(b) > float(a) for _, a, b in largest)
    assert largest[0][1:] == ("1.0000", "1.0000") and 0 < rose < len(largest), largest
    assert "each row's weight" not in r.stdout
    assert f"the weight of {rose} of the {len(largest)} rows crowds onto" in r.stdout
    assert "(the other row keeps its own, to the digits printed)" in r.stdout


def test_large_values_keep_their_columns(run, tmp_path):
    # Before, %10.4f printed an unscaled score of 1e200 with all its two hundred digits.
    q = np.array([[1e100, 0.0], [0.0, 2.0]])
    out = run_explain(run, tmp_path, q, q, np.eye(2), "--scale", "none")
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("S = Q K^T * s"))
    assert max(len(line) for line in lines[at + 1:at + 3]) <= 3 + 2 * 11, lines[at:at + 3]
    np.testing.assert_allclose(printed_matrix(out, "S = Q K^T * s"), [[1e200, 0], [0, 4]], rtol=1e-3)
    assert not re.search(r"\d{20}", out), "a number printed with all its digits"
