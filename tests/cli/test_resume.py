"""Sweeps that survive a kill: `attnscale experiment ... --out FILE` journals each finished point
to FILE.partial; after a SIGKILL, `--resume` runs only the missing points and writes a file
byte-identical to an uninterrupted run of the same seed.
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/cli/test_resume.py
"""
import os
import signal
import subprocess
import time

import pytest

BIN = os.environ.get("ATTNSCALE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "attnscale"))

POINTS = 40
SWEEP = ["experiment", "saturation", "--n", "16", "--d", ",".join(str(d) for d in range(1, POINTS + 1)),
         "--scaling", "sqrt,none", "--trials", "1000", "--seed", "11"]


def journal_records(path):
    """Completed points in a journal: lines that start a record ("R <point> <len> <sum>")."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.startswith(b"R "))


def kill_after_records(args, out, cwd, records):
    """Runs `BIN args --out out --threads 1` and kills it (SIGKILL) once its journal holds
    `records` completed points; returns the journal's path."""
    partial = out.parent / (out.name + ".partial")
    proc = subprocess.Popen([BIN, *args, "--out", str(out), "--threads", "1"], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while journal_records(partial) < records and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return partial


def damage_first_record(partial):
    """Flips one bit inside record 0's rows, as a garbled byte on disk would."""
    data = bytearray(partial.read_bytes())
    first = data.index(b"\nR 0 ") + 1
    data[data.index(b"\n", first) + 2] ^= 0x01
    partial.write_bytes(bytes(data))


def run(args, cwd, **kw):
    return subprocess.run([BIN, *args], cwd=cwd, capture_output=True, **kw)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    d = tmp_path_factory.mktemp("clean")
    r = run(SWEEP + ["--out", "clean.csv", "--threads", "2"], d, timeout=600)
    assert r.returncode == 0, r.stderr
    assert not (d / "clean.csv.partial").exists(), "the journal outlives a finished run"
    return (d / "clean.csv").read_bytes()


def test_sigkill_midway_then_resume_is_byte_identical(tmp_path, uninterrupted):
    out = tmp_path / "swept.csv"
    partial = kill_after_records(SWEEP, out, tmp_path, 3)
    done = journal_records(partial)
    assert 3 <= done < POINTS
    assert not out.exists(), "a killed run left a partial result file"

    r = run(SWEEP + ["--out", str(out), "--resume", "--threads", "2"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert b"resuming saturation:" in r.stderr
    resumed = int(r.stderr.split(b"resuming saturation: ")[1].split()[0])
    assert resumed >= done  # every journaled point was reused (a torn last record may be re-run)
    assert out.read_bytes() == uninterrupted
    assert not partial.exists()


def test_torn_journal_tail_is_recovered(tmp_path, uninterrupted):
    out = tmp_path / "t.csv"
    partial = kill_after_records(SWEEP, out, tmp_path, 2)
    with open(partial, "ab") as f:  # a record cut short, as a kill inside write() would leave it
        f.write(b"R 39 4000 0123456789abcdef\n1\n2;3:abc")
    r = run(SWEEP + ["--out", str(out), "--resume"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == uninterrupted


def test_damaged_record_in_the_middle_keeps_every_later_record(tmp_path, uninterrupted):
    out = tmp_path / "d.csv"
    partial = kill_after_records(SWEEP, out, tmp_path, 4)
    damage_first_record(partial)
    done = journal_records(partial)
    r = run(SWEEP + ["--out", str(out), "--resume", "--threads", "2"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert f"warning: {partial}: skipped 1 damaged record; its point is run again" in err, err
    resumed = int(err.split("resuming saturation: ")[1].split()[0])
    assert resumed >= done - 1  # every record but the damaged one (a torn last one may be re-run)
    assert out.read_bytes() == uninterrupted
    assert not partial.exists()


def test_a_damaged_record_is_warned_about_by_one_resume_only(tmp_path, uninterrupted):
    """The resume that skips a damaged record rewrites the journal without it: a later resume (of a
    run killed again) finds nothing damaged and says nothing of it."""
    out = tmp_path / "w.csv"
    partial = kill_after_records(SWEEP, out, tmp_path, 4)
    damage_first_record(partial)
    kill_after_records(SWEEP + ["--resume"], out, tmp_path, journal_records(partial) + 1)
    r = run(SWEEP + ["--out", str(out), "--resume", "--threads", "2"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert b"damaged" not in r.stderr, r.stderr
    assert out.read_bytes() == uninterrupted
    assert not partial.exists()


def test_resume_refuses_a_foreign_partial_file(tmp_path):
    out = tmp_path / "x.csv"
    (tmp_path / "x.csv.partial").write_text("n,d,metric\n1,2,x\n")
    r = run(["experiment", "saturation", "--n", "8", "--d", "1,2", "--trials", "20", "--out", str(out), "--resume"],
            tmp_path)
    assert r.returncode == 2
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and "x.csv.partial: not a journal" in lines[0], lines
    assert not out.exists()


def test_resume_refuses_a_different_run(tmp_path):
    out = tmp_path / "y.csv"
    kill_after_records(SWEEP, out, tmp_path, 1)
    other = [a if a != "11" else "12" for a in SWEEP]  # another seed
    r = run(other + ["--out", str(out), "--resume"], tmp_path)
    assert r.returncode == 2
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and "belongs to a different run" in lines[0] and "seed=11" in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize("flags", [["variance", "--d", "0"], ["saturation", "--n", "8", "--d", "1,1"],
                                   ["variance", "--d", "4", "--no-such-flag", "1"]])
def test_a_refused_flag_leaves_no_journal(tmp_path, flags):
    out = tmp_path / "x.csv"
    r = run(["experiment", *flags, "--trials", "3", "--out", str(out)], tmp_path)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.decode().splitlines()) == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == [], "a refused run left files behind"


def test_resume_needs_out(tmp_path):
    r = run(["experiment", "saturation", "--n", "8", "--d", "1", "--resume"], tmp_path)
    assert r.returncode == 2 and b"--resume: needs --out" in r.stderr


def test_training_killed_then_resumed_is_byte_identical(tmp_path):
    """The training experiment's runs (libtorch) are journaled like any sweep's points: a run killed
    midway resumes to the bytes of an uninterrupted one, its summary rows (CIs over seeds, LR
    sensitivity, the drift against PyTorch's attention) computed from journaled and new runs alike."""
    listed = run(["experiment", "--help"], tmp_path).stdout
    if b"training" not in listed:
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    sweep = ["experiment", "training", "--grid", "quick", "--scaling", "none,sqrt", "--lr", "0.001,0.01,0.1",
             "--seeds", "2", "--steps", "12", "--seed", "5"]
    clean = run(sweep + ["--out", "clean.csv", "--threads", "2"], tmp_path, timeout=600)
    assert clean.returncode == 0, clean.stderr
    out = tmp_path / "t.csv"
    kill_after_records(sweep, out, tmp_path, 3)
    assert not out.exists()
    r = run(sweep + ["--out", str(out), "--resume", "--threads", "2"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert b"resuming training:" in r.stderr
    assert out.read_bytes() == (tmp_path / "clean.csv").read_bytes()
