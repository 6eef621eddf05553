"""`attnscale report --quick`: the files it writes, and the page rendered by headless Chromium.

The screenshot is kept at $ATTNSCALE_BUILD/report-screenshot.png (default build/).
"""
import csv
import os
import pathlib
import re
import resource
import shutil
import signal
import struct
import subprocess
import tempfile
import zlib

import pytest

BIN = os.environ.get("ATTNSCALE_BIN", "build/bin/attnscale")
BUILD = pathlib.Path(os.environ.get("ATTNSCALE_BUILD", "build"))


def lab_experiments():
    """The experiments the binary's lab knows (listed by `attnscale experiment --help`)."""
    out = subprocess.run([BIN, "experiment", "--help"], capture_output=True, text=True).stdout
    names = re.findall(r"^  ([a-z]+)\s{2,}", out.split("Subcommands:")[-1], flags=re.M)
    assert "variance" in names and "saturation" in names, out
    return names


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    subprocess.run([BIN, "report", "--quick", "--out", str(out), "--threads", "2"], check=True, timeout=600)
    return out


def chromium(*args, timeout=120):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed (Debian package `chromium`, in scripts/debian-packages.txt)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def png_pixels(path):
    """Width, height and the raw (filtered) scanline bytes of a PNG, with the standard library."""
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_writes_every_file(report_dir):
    assert (report_dir / "index.html").stat().st_size > 10_000
    assert (report_dir / "report.md").stat().st_size > 2_000
    svgs = sorted((report_dir / "figures").glob("*.svg"))
    assert len(svgs) >= len(lab_experiments())  # at least one figure per experiment
    for svg in svgs:
        assert svg.read_text().lstrip().startswith("<?xml") or "<svg" in svg.read_text()
        png = svg.with_suffix(".png")
        w, h, raw = png_pixels(png)
        assert w > 500 and h > 300
        assert len(set(raw)) > 16, f"{png.name} looks blank"
    for name in lab_experiments():
        csv = (report_dir / "data" / f"{name}.csv").read_text().splitlines()
        assert csv[0].endswith("metric,mean,ci_low,ci_high,theory"), csv[0]
        assert len(csv) > 1
        assert (report_dir / "data" / f"{name}.json").stat().st_size > 100


def test_page_is_self_contained(report_dir):
    html = (report_dir / "index.html").read_text()
    assert "<script" not in html
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:|//|figures/)""", html)
    assert "<link" not in html
    md = (report_dir / "report.md").read_text()
    for svg in (report_dir / "figures").glob("*.svg"):
        assert f"figures/{svg.name}" in md


def test_sections_and_claims(report_dir):
    html = (report_dir / "index.html").read_text()
    for title in ["Introduction", "Algorithm", "Experiments", "Discussion", "Conclusion", "Appendix"]:
        assert re.search(rf"<h2[^>]*>\d+ {title}</h2>", html), title
    verdicts = re.findall(r'<span class="verdict (supported|refuted|mixed)">', html)
    assert len(verdicts) >= 8
    assert "column" in html and "online softmax" in html
    for key in ["seed 0", "git ", "CPU target", "threads", "measured in"]:
        assert key in html, key


def test_chromium_renders_every_figure(report_dir):
    html = (report_dir / "index.html").read_text()
    figures = html.count("<figure")
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", (report_dir / "index.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    svgs = re.findall(r"<svg\b.*?</svg>", dom.stdout, flags=re.S)
    drawn = [s for s in svgs if re.search(r"<(path|image|polyline|rect)\b", s)]
    assert figures >= len(lab_experiments())
    assert len(drawn) == figures, f"{len(drawn)} of {figures} figures have content in the rendered DOM"

    BUILD.mkdir(parents=True, exist_ok=True)
    shot = BUILD / "report-screenshot.png"
    if shot.exists():
        shot.unlink()
    r = chromium("--window-size=1280,2400", f"--screenshot={shot}", (report_dir / "index.html").as_uri())
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    w, h, raw = png_pixels(shot)
    assert (w, h) == (1280, 2400)
    assert len(set(raw)) > 64, "the screenshot is blank"


def test_help_of_full_says_what_it_runs():
    # --full is not "ten times the trials" everywhere: the heatmap keeps its one matrix, and training
    # and recall run their --grid full, which docs/lab.md puts at about 100 CPU-hours.
    text = " ".join(subprocess.run([BIN, "report", "--help"], capture_output=True, text=True, check=True).stdout.split())
    assert "--grid full" in text and "100 CPU-hours" in text, text


def test_rejects_quick_with_full(tmp_path):
    r = subprocess.run([BIN, "report", "--quick", "--full", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.startswith("attnscale: error:")
    assert not (tmp_path / "x").exists()


def test_rejects_a_file_as_out(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = subprocess.run([BIN, "report", "--quick", "--out", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "--out" in r.stderr and "not a folder" in r.stderr


def test_training_section_has_its_figures_and_judges_its_claims(report_dir):
    if "training" not in lab_experiments():
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    md = (report_dir / "report.md").read_text()
    for fig in ("training_loss", "training_logits", "training_drift", "recall"):
        assert f"figures/{fig}.svg" in md
        assert (report_dir / "figures" / f"{fig}.png").exists()
    for claim in ("The scale stabilises training", "may not always be utilized in modern applications",
                  "Additive attention outperforms unscaled", "in training, learning suffers"):
        row = next(line for line in md.splitlines() if line.startswith("|") and claim in line)
        assert "not measured" not in row and "not testable" not in row, row
        assert re.search(r'class="verdict (supported|refuted|mixed)"', row), row


def test_saturated_start_is_told_only_when_the_data_shows_it(report_dir):
    """The abstract and the discussion say the unscaled model's rows start saturated exactly when
    its step-0 row entropy (layer 0, seed 0) is below half the scaled model's, and quote both."""
    if "training" not in lab_experiments():
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    with open(report_dir / "data" / "training.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["metric"] == "entropy" and r["step"] == "0" and r["layer"] == "0"
                and r["seed"] == "0" and r["attention"] == "attnscale" and r["task"] == "lm"]
    ent0 = {r["scaling"]: float(r["mean"]) for r in rows}
    md = " ".join((report_dir / "report.md").read_text().split())
    saturated = ent0["none"] < 0.5 * ent0["sqrt"]
    assert ("although its rows start saturated" in md) == saturated, ent0
    assert ("the saturation of the unscaled softmax is there at step 0" in md) == saturated, ent0
    assert ("does not start saturated here" in md) == (not saturated), ent0


def page_number(text):
    """A number as the report prints it: "−" for minus, "8.9×10<sup>−8</sup>" for 8.9e-8."""
    assert "-" not in text, f"an ASCII hyphen as a minus sign: {text}"
    return float(text.replace("×10<sup>", "e").replace("</sup>", "").replace("−", "-"))


def test_training_drift_sentences_match_their_numbers(report_dir):
    """The drift paragraph's words follow the figures it quotes: no "at most 0" where the losses
    were equal, and "steady" only for the rules whose fit has R² >= 0.9."""
    if "training" not in lab_experiments():
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    md = " ".join((report_dir / "report.md").read_text().split())
    low = re.search(r"Over the first 20 steps at η = \S+ \(1/√d\) the two implementations (.*?)\.(?: |$)", md)
    assert low, "the drift sentence at the smallest η is missing"
    at_most = re.search(r"differ by at most ([^ ]+) \(relative\)", low.group(1))
    assert at_most is None or page_number(at_most.group(1)) > 0, low.group(0)
    grow = re.search(r"the difference grows (.*?), fitted by least squares.*?: (.*?)\.(?: |$)", md)
    if grow is None:
        return
    fits = re.findall(r"per step for (.+?) \(\d+ steps fitted, R² = ([0-9.]+)\)", grow.group(2))
    assert fits, grow.group(0)
    steady = [name for name, r2 in fits if float(r2) >= 0.9]
    words = grow.group(1)
    if len(steady) == len(fits):
        assert words == "by a steady factor", words
    elif not steady:
        assert words.startswith("by a factor that is not steady"), words
    else:
        assert words.startswith(f"by a steady factor for {', '.join(steady)}, not for"), words


def test_discussion_names_each_verdict_once(report_dir):
    """Propositions 3 and 4's verdicts in one clause: "both judged supported", not "supported and
    supported", and each named with its own proposition when they differ."""
    md = " ".join((report_dir / "report.md").read_text().split())
    said = re.search(r"(Propositions? 3 .*?) by a rule", md)
    assert said, "the discussion's sentence on Propositions 3 and 4 is missing"
    v = "(supported|refuted|mixed)"
    assert re.fullmatch(rf"Propositions 3 and 4 are both judged {v}|Proposition 3 is judged {v} and Proposition 4 {v}",
                        said.group(1)), said.group(0)
    for v in ("supported", "refuted", "mixed"):
        assert f"{v} and {v}" not in md


def test_reproduce_commands_parse_as_shell_words(report_dir):
    """Each command of Appendix A.2 splits, as a shell splits it, into the experiment's name and
    --flag value pairs: an empty value (the recall runs' --torch-check) stays an argument."""
    import shlex
    md = (report_dir / "report.md").read_text()
    commands = re.findall(r"^\| [a-z]+ \| \d+ \| [0-9.]+ \| `(attnscale experiment [^`]*)` \|$", md, flags=re.M)
    assert len(commands) >= 8, commands
    for cmd in commands:
        words = shlex.split(cmd)
        flags = words[3:]
        assert len(flags) % 2 == 0, cmd
        assert all(f.startswith("--") for f in flags[::2]), cmd
        assert not any(v.startswith("--") for v in flags[1::2]), cmd


def test_a_training_reproduce_command_reproduces_its_data(report_dir, tmp_path):
    """Appendix A.2's command for the training runs gives the bytes of data/training.csv; it gave
    --trials 1, which the training experiment refuses (it has no trials)."""
    import shlex
    if "training" not in lab_experiments():
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    md = (report_dir / "report.md").read_text()
    cmd = re.search(r"`(attnscale experiment training [^`]*)`", md).group(1)
    assert "--trials" not in cmd, cmd
    out = tmp_path / "training.csv"
    r = subprocess.run([BIN, *shlex.split(cmd)[1:], "--threads", "2", "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == (report_dir / "data" / "training.csv").read_bytes()


def test_prose_and_verdicts_follow_the_data(report_dir, tmp_path):
    """Rewrite the report from a changed data file: the words and the verdict change with it."""
    import json
    src = tmp_path / "changed"
    shutil.copytree(report_dir / "data", src / "data")
    table = json.loads((src / "data" / "variance.json").read_text())
    for row in table["rows"]:  # unscaled variances 1.5 times the theory d
        if row["scaling"] == "none" and row["metric"] == "var":
            for key in ("mean", "ci_low", "ci_high"):
                row[key] *= 1.5
    (src / "data" / "variance.json").write_text(json.dumps(table))

    def verdict(md, claim):
        line = next(l for l in md.splitlines() if l.startswith("| " + claim))
        return re.search(r'class="verdict (\w+)"', line).group(1)

    before = (report_dir / "report.md").read_text()
    out = tmp_path / "out"
    subprocess.run([BIN, "report", "--from", str(src), "--out", str(out)], check=True, capture_output=True, timeout=300)
    after = (out / "report.md").read_text()
    assert "Proposition 5 holds" in before and verdict(before, "Var(q·k) = d<sub>k</sub> for") == "supported"
    assert "Proposition 5 does not hold" in after and verdict(after, "Var(q·k) = d<sub>k</sub> for") == "refuted"
    assert "The derivation's prediction is not met" in " ".join(after.split())
    # Everything else is read back unchanged.
    assert verdict(after, "Softmax is applied") == verdict(before, "Softmax is applied")
    r = subprocess.run([BIN, "report", "--from", str(tmp_path / "nothing"), "--out", str(tmp_path / "o2")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--from" in r.stderr


def test_training_words_follow_the_best_losses_and_the_rules_run(report_dir, tmp_path):
    """A best loss 16% below the scaled one's, its interval overlapping, was "within 2% of" it, and
    the section listed seven rules "for every scaling rule" where the quick grid trains four."""
    import json
    if "training" not in lab_experiments():
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    src = tmp_path / "changed"
    shutil.copytree(report_dir / "data", src / "data")
    table = json.loads((src / "data" / "training.json").read_text())
    best = {r["scaling"]: r for r in table["rows"]
            if r["metric"] == "best_loss" and r["lr"] == "all" and r["attention"] == "attnscale"}
    assert sorted(best) == ["additive", "folded", "none", "sqrt"], sorted(best)
    scaled = best["sqrt"]
    scaled.update(mean=5.0, ci_low=4.9, ci_high=5.1)
    best["none"].update(mean=4.2, ci_low=-6.0, ci_high=14.4)  # 16% below, the intervals overlapping
    (src / "data" / "training.json").write_text(json.dumps(table))
    out = tmp_path / "out"
    subprocess.run([BIN, "report", "--from", str(src), "--out", str(out)], check=True, capture_output=True, timeout=300)
    md = " ".join((out / "report.md").read_text().split())
    assert "within 2% of" not in md
    assert "the unscaled attention's best loss is 16% below (CIs overlapping) the scaled one's" in md
    assert "reaches a best loss 16% below (CIs overlapping) the scaled one's" in md
    assert "for 4 scaling rules at the peak learning rates" in md and "every scaling rule" not in md
    assert ("The rules: unscaled (s = 1), 1/√d, *folded* (s = 1 with W<sub>q</sub>'s initialisation divided by √d, "
            "as T5 does, Raffel et al. (2020)) and additive attention vₐᵀ tanh(W q + U k).") in md
    assert "μP" not in md.split("### 3.9")[1].split("### 3.10")[0]


def test_recall_says_what_holds_the_unscaled_model_back_only_when_something_does(report_dir):
    """With no seed learning the task either way, the section said "what holds the unscaled model
    back here is not a smaller gradient at Q"; nothing held it back more than the scaled one."""
    if "recall" not in lab_experiments():
        pytest.fail("the recall experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    md = (report_dir / "report.md").read_text()
    learnt = {}
    for line in md.splitlines():
        m = re.match(r"\| (unscaled|1/√d) \| [^|]+ \| (\d+) of (\d+) \|", line)
        if m:
            learnt[m.group(1)] = int(m.group(2))
    assert set(learnt) == {"unscaled", "1/√d"}, learnt
    text = " ".join(md.split("### 3.10")[1].split("## 4")[0].split())
    ratio = float(re.search(r"the gradient reaching Q in the last block of seed 0 is ([0-9.]+) times", text).group(1))
    held_back = "what holds the unscaled model back here is not a smaller gradient at Q" in text
    if learnt["1/√d"] <= learnt["unscaled"]:  # the quick grid: no seed learns it in 40 steps
        assert not held_back, text
        assert ratio < 0.5 or "(geometric mean of the ratio over the logged steps): not smaller." in text, text


def test_recall_cites_the_schedule_trials_only_for_their_setting(report_dir):
    """The section said "In shorter trials of the same setting no model learnt the task (docs/lab.md),
    so whether learning sets in within a run depends on the schedule" for any grid: those trials were
    of the default grid's setting, and in a run where no seed learns the task nothing follows about
    when learning sets in."""
    if "recall" not in lab_experiments():
        pytest.fail("the recall experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    text = " ".join((report_dir / "report.md").read_text().split("### 3.10")[1].split("## 4")[0].split())
    assert "steps with a warm-up and cosine decay over them." in text, text
    assert "depends on the schedule" not in text and "shorter trials" not in text, text
    assert "2 seeds say little about how often a model learns it." in text, text
    # The quick grid learns nothing either way: the clause is said once, not twice.
    assert "With 1/√d no seed learns the task; without the scale no seed learns it either," in text, text
    md = " ".join((report_dir / "report.md").read_text().split())
    assert md.count("no seed learns the task") == len(re.findall(r"no seed learns it either(?! way)", md)), md


def test_the_report_names_docs_as_installed_too(report_dir):
    """The appendix and the recall section named docs/lab.md, a path in the source only: a report
    names a document as the CLI's help does, "lab.md: docs/ in the source, share/doc/attnscale/
    installed"."""
    md = " ".join((report_dir / "report.md").read_text().split())
    assert re.findall(r"(?<!\w)docs/[\w-]+\.md", md) == []
    assert "lab.md: docs/ in the source, share/doc/attnscale/ installed" in md


def test_appendix_does_not_promise_nominal_coverage_for_the_kurtosis(report_dir):
    """Appendix A.1 said every row's true value "falls outside about one time in 20"; the kurtosis
    rows' jackknife interval misses 12% of the time over 20 seeds (docs/lab.md)."""
    md = " ".join((report_dir / "report.md").read_text().split())
    a1 = md.split("### A.1")[1].split("### A.2")[0]
    assert "one time in 20)" not in a1, a1
    assert "the kurtosis interval, a jackknife, is too narrow for heavy-tailed products" in a1, a1


def test_a_report_from_data_names_what_measured_the_data(report_dir, tmp_path):
    """--from takes the seed, version, git hash, CPU target and threads from the data files: a
    report rewritten by another build, or asked for --seed 5, said so of data measured at seed 0."""
    import json
    src = tmp_path / "other"
    shutil.copytree(report_dir / "data", src / "data")
    for path in (src / "data").glob("*.json"):
        table = json.loads(path.read_text())
        table["metadata"].update(seed=7, version="0.0.9", git_hash="abcdef123456", cpu_target="SSE4", threads=3)
        path.write_text(json.dumps(table))
    out = tmp_path / "out"
    subprocess.run([BIN, "report", "--from", str(src), "--out", str(out)], check=True, capture_output=True, timeout=300)
    md = (out / "report.md").read_text()
    line = "attnscale 0.0.9 (git abcdef123456) · seed 7 · CPU target SSE4 · 3 threads · measured in"
    assert md.count(line) == 2, md[:600]  # the subtitle and the reproducibility table's caption
    # A seed or depth given with --from would change nothing: refused, nothing written.
    for flag in (["--seed", "5"], ["--quick"], ["--full"]):
        r = subprocess.run([BIN, "report", "--from", str(src), "--out", str(tmp_path / "o3"), *flag],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.startswith(f"attnscale: error: {flag[0]}: not used with --from"), r.stderr
        assert not (tmp_path / "o3").exists()


def test_training_section_tabulates_every_task_and_head_dimension(report_dir, tmp_path):
    """A training run over two tasks and two head dimensions (as --grid full sweeps them) gets the
    table of best losses per task and d_head, MQAR with its accuracy; the drift's growth is fitted."""
    if "training" not in lab_experiments():
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    src = tmp_path / "sweep"
    shutil.copytree(report_dir / "data", src / "data")
    subprocess.run([BIN, "experiment", "training", "--grid", "quick", "--task", "lm,mqar", "--d-head", "4,8",
                    "--scaling", "none,sqrt,folded,additive", "--lr", "0.003,0.3", "--seeds", "2", "--steps", "12",
                    "--seq-len", "16", "--batch", "4", "--d-model", "16", "--log-every", "4", "--threads", "2",
                    "--format", "json", "--out", str(src / "data" / "training.json")],
                   check=True, capture_output=True, timeout=300)
    out = tmp_path / "out"
    subprocess.run([BIN, "report", "--from", str(src), "--out", str(out)], check=True, capture_output=True, timeout=300)
    md = (out / "report.md").read_text()
    header = next(l for l in md.splitlines() if l.startswith("| scaling") and "d_head = 4" in l)
    for col in ("fortunes, d_head = 4", "fortunes, d_head = 8", "MQAR, d_head = 4", "MQAR, d_head = 8"):
        assert col in header, header
    row = next(l for l in md.splitlines() if l.startswith("| unscaled") and "accuracy" in l)
    assert "not run" not in row, row
    # The quick report's own section has one task and one d_head: no such table there.
    assert "Best loss per scaling rule, task and head dimension" not in (report_dir / "report.md").read_text()


def tree(d):
    """Every file under d (relative path → bytes)."""
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(pathlib.Path(d).rglob("*")) if p.is_file()}


def test_from_a_folder_missing_a_data_file_names_it_and_writes_nothing(report_dir, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(report_dir / "data", src / "data")
    (src / "data" / "saturation.json").unlink()
    r = subprocess.run([BIN, "report", "--from", str(src), "--out", str(tmp_path / "new")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines == [f"attnscale: error: --from: {src / 'data' / 'saturation.json'}: missing; the report needs the "
                     "data of the saturation experiment"], r.stderr
    assert not (tmp_path / "new").exists(), "a partial report folder was left"
    # An existing report in --out is left as it was.
    old = tmp_path / "old"
    shutil.copytree(report_dir, old)
    before = tree(old)
    r = subprocess.run([BIN, "report", "--from", str(src), "--out", str(old)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert tree(old) == before


def test_a_report_that_fails_while_drawing_leaves_no_partial_output(report_dir, tmp_path):
    """Without gnuplot the report fails after its data are written: nothing of it may stay."""
    env = dict(os.environ, PATH=str(tmp_path / "no-programs-here"))
    r = subprocess.run([os.path.abspath(BIN), "report", "--from", str(report_dir), "--out", "new"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and "gnuplot" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == [], os.listdir(tmp_path)
    old = tmp_path / "old"
    shutil.copytree(report_dir, old)
    before = tree(old)
    r = subprocess.run([os.path.abspath(BIN), "report", "--from", str(report_dir), "--out", str(old)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stderr
    assert tree(old) == before, "the earlier report was changed, or a temporary folder left in it"


def test_a_report_whose_placing_fails_takes_back_what_it_placed(report_dir, tmp_path):
    """A rename that fails while the report's files are put in place (a folder where index.html,
    placed last, must go: no rename replaces it, root or not) takes back every file placed before
    it: an earlier report's files come back, and the data/ and figures/ folders it made go."""
    old = tmp_path / "old"
    shutil.copytree(report_dir, old)
    (old / "data" / "saturation.csv").write_bytes(b"an earlier report's data\n")
    (old / "index.html").unlink()
    (old / "index.html").mkdir()
    (old / "index.html" / "kept").write_bytes(b"")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "notes.txt").write_bytes(b"the user's\n")
    (fresh / "index.html").mkdir()
    (fresh / "index.html" / "kept").write_bytes(b"")
    for out in (old, fresh):
        before = tree(out)
        r = subprocess.run([BIN, "report", "--from", str(report_dir), "--out", str(out)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [f"attnscale: error: --out: {out / 'index.html'}: Is a directory"], r.stderr
        assert tree(out) == before, "a placed file was left, or an earlier one not restored"
    assert sorted(p.name for p in fresh.iterdir()) == ["index.html", "notes.txt"], "a new folder was left"


def test_a_full_disk_under_the_report_leaves_no_partial_output(report_dir, tmp_path):
    """A file of the report that cannot be written whole (a file-size limit stands in for a full
    disk, root or not: write fails with EFBIG) is one line naming it, and nothing of the report stays."""
    largest = max((report_dir / "data").iterdir(), key=lambda p: p.stat().st_size).stat().st_size

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (largest - 1, largest - 1))

    old = tmp_path / "old"
    shutil.copytree(report_dir, old)
    before = tree(old)
    for out in (tmp_path / "new", old):
        r = subprocess.run([BIN, "report", "--from", str(report_dir), "--out", str(out)], capture_output=True,
                           text=True, timeout=300, preexec_fn=limit)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"attnscale: error: --out: {out / 'data'}/"), r.stderr
        assert lines[0].endswith(": cannot write (File too large)"), r.stderr
    assert not (tmp_path / "new").exists(), "a partial report folder was left"
    assert tree(old) == before


@pytest.mark.parametrize("failure", ["missing data", "no gnuplot"])
def test_a_failed_report_into_nested_folders_leaves_none_of_them(report_dir, tmp_path, failure):
    """--out a/b/c creates a and a/b too: a failure takes back every folder it made, not just c."""
    run_in = tmp_path / "cwd"
    run_in.mkdir()
    src, env = report_dir, None
    if failure == "missing data":
        src = tmp_path / "src"
        shutil.copytree(report_dir / "data", src / "data")
        (src / "data" / "saturation.json").unlink()
    else:
        env = dict(os.environ, PATH=str(tmp_path / "no-programs-here"))
    (run_in / "x").mkdir()  # an existing parent stays
    for out in ("a/b/c", "x/b/c/", str(run_in / "p" / "q")):
        r = subprocess.run([os.path.abspath(BIN), "report", "--from", str(src), "--out", out], cwd=run_in,
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert sorted(p.relative_to(run_in).as_posix() for p in run_in.rglob("*")) == ["x"], out


def test_figure_scripts_redraw_into_their_own_folder(report_dir, tmp_path):
    """figures/NAME.gp names its outputs relative to its folder: the same script for any --out, and
    `gnuplot NAME.gp` run in a copied report's figures/ writes into the copy."""
    r = subprocess.run([os.path.abspath(BIN), "report", "--from", str(report_dir), "--out", "rel"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    scripts = sorted(p.name for p in (report_dir / "figures").glob("*.gp"))
    assert "variance.gp" in scripts
    for name in scripts:
        assert (tmp_path / "rel" / "figures" / name).read_bytes() == (report_dir / "figures" / name).read_bytes(), name
    text = (report_dir / "figures" / "variance.gp").read_text()
    assert text.startswith("# ") and "gnuplot variance.gp" in text.splitlines()[0]
    assert 'set output "variance.svg"' in text and 'set output "variance.png"' in text
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "rel", moved)
    before = tree(tmp_path / "rel")
    (moved / "figures" / "variance.svg").unlink()
    (moved / "figures" / "variance.png").unlink()
    subprocess.run(["gnuplot", "variance.gp"], cwd=moved / "figures", check=True, capture_output=True, timeout=120)
    assert (moved / "figures" / "variance.svg").stat().st_size > 0
    assert (moved / "figures" / "variance.png").stat().st_size > 0
    assert tree(tmp_path / "rel") == before
