"""Sweeps over MPI ranks: `mpirun -np K attnscale experiment|report ...` writes files byte-identical
to a single-process run of the same seed, for K = 1..4, and `--resume` works under mpirun.
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/mpi/test_sweeps.py
"""
import os
import signal
import subprocess
import time

import pytest

from conftest import BIN, MPIRUN, mpirun, mpmd

SWEEP = ["experiment", "saturation", "--n", "17", "--d", "1,3,8,31,64", "--scaling", "sqrt,none",
         "--trials", "23", "--seed", "5"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    d = tmp_path_factory.mktemp("single")
    r = mpirun(0, *SWEEP, "--out", "one.csv", cwd=d)
    assert r.returncode == 0, r.stderr
    return (d / "one.csv").read_bytes()


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_sweep_is_byte_identical_for_every_rank_count(tmp_path, single, k):
    r = mpirun(k, *SWEEP, "--out", "k.csv", "--threads", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "k.csv").read_bytes() == single
    assert sorted(os.listdir(tmp_path)) == ["k.csv"], "a rank other than 0 wrote, or the journal was left"


def test_several_workers_per_rank_are_byte_identical(tmp_path, single):
    """Three workers on each of two ranks: rank 0 serves requests while its own workers run."""
    r = mpirun(2, *SWEEP, "--out", "k.csv", "--threads", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "k.csv").read_bytes() == single


TRAINING = ["experiment", "training", "--grid", "quick", "--steps", "3", "--log-every", "1", "--lr", "0.01,0.1",
            "--seeds", "1", "--scaling", "sqrt,additive", "--d-head", "4,16", "--torch-check", "", "--seed", "2"]


def test_training_grid_is_byte_identical(tmp_path):
    """Runs of unequal cost (d_head, additive scaling) dealt on demand give the one-process file."""
    if "training" not in mpirun(0, "experiment", "--help").stdout:
        pytest.fail("the training experiment is missing: libtorch-dev is in scripts/debian-packages.txt")
    one = mpirun(0, *TRAINING, "--out", "one.csv", "--threads", "1", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    three = mpirun(3, *TRAINING, "--out", "three.csv", "--threads", "1", cwd=tmp_path)
    assert three.returncode == 0, three.stderr
    assert (tmp_path / "three.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()


def test_stdout_sweep_is_written_once(single):
    r = mpirun(3, *SWEEP)
    assert r.returncode == 0, r.stderr
    assert r.stdout.encode() == single


def test_resume_under_mpirun_is_byte_identical(tmp_path):
    sweep = ["experiment", "saturation", "--n", "16", "--d", ",".join(str(d) for d in range(1, 41)),
             "--trials", "600", "--seed", "3"]
    clean = mpirun(0, *sweep, "--out", "clean.csv", "--threads", "2", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    out, partial = tmp_path / "swept.csv", tmp_path / "swept.csv.partial"
    proc = subprocess.Popen([BIN, *sweep, "--out", str(out), "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while (not partial.exists() or partial.read_bytes().count(b"\nR ") < 3) and proc.poll() is None \
            and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    r = mpirun(3, *sweep, "--out", out, "--resume", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "resuming saturation:" in r.stderr
    assert out.read_bytes() == (tmp_path / "clean.csv").read_bytes()
    assert not partial.exists()


def test_report_data_are_byte_identical(tmp_path):
    one = mpirun(0, "report", "--quick", "--out", tmp_path / "one", "--threads", "1")
    assert one.returncode == 0, one.stderr
    two = mpirun(3, "report", "--quick", "--out", tmp_path / "three", "--threads", "1")
    assert two.returncode == 0, two.stderr
    data = sorted(p for p in os.listdir(tmp_path / "one" / "data") if p.endswith(".csv"))
    assert data
    for name in data:
        assert (tmp_path / "three" / "data" / name).read_bytes() == (tmp_path / "one" / "data" / name).read_bytes(), name
    assert (tmp_path / "three" / "index.html").exists()


def test_ranks_naming_one_out_file_in_other_words_agree(tmp_path, single):
    """--out is compared as the file it names: x.csv, ./x.csv and a path through a link to the folder agree."""
    (tmp_path / "alias").symlink_to(tmp_path, target_is_directory=True)
    r = mpmd(tmp_path, [*SWEEP, "--out", "x.csv"], [*SWEEP, "--out", "./x.csv"],
             [*SWEEP, "--out", tmp_path / "alias" / "x.csv"])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "x.csv").read_bytes() == single
    assert sorted(os.listdir(tmp_path)) == ["alias", "x.csv"]


def test_ranks_started_with_different_sweeps_stop_with_one_line_each(tmp_path):
    r = subprocess.run([*MPIRUN, "-np", "1", BIN, *SWEEP, "--out", "x.csv", ":", "-np", "1", BIN, *SWEEP[:5], "1,2", *SWEEP[6:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "the ranks disagree on the sweep" in r.stderr
    assert not (tmp_path / "x.csv").exists()


def test_ranks_started_with_different_lists_of_as_many_points_stop(tmp_path):
    """Same number of points, other values: agreed on before any point runs (the CSV would mix both)."""
    sweep = ["experiment", "saturation", "--n", "9", "--trials", "5", "--threads", "1", "--out", "x.csv"]
    r = subprocess.run([*MPIRUN, "-np", "1", BIN, *sweep, "--d", "1,2,4,8,16,32", ":",
                        "-np", "1", BIN, *sweep, "--d", "3,5,7,9,11,13"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("attnscale:")]
    want = ("attnscale: error: the ranks disagree on the sweep: --d: 1,2,4,8,16,32 on rank 0, 3,5,7,9,11,13 on rank 1"
            " (start every rank with the same command)")
    assert lines == [want, want], r.stderr
    assert os.listdir(tmp_path) == [], "a file or journal was written"


@pytest.mark.parametrize("flag, value", [("--seed", "6"), ("--format", "json"), ("--trials", "24")])
def test_ranks_that_differ_in_seed_format_or_trials_stop(tmp_path, flag, value):
    other = [*SWEEP, flag, value] if flag not in SWEEP else \
        [value if i > 0 and SWEEP[i - 1] == flag else w for i, w in enumerate(SWEEP)]
    r = subprocess.run([*MPIRUN, "-np", "1", BIN, *SWEEP, "--out", "x.csv", ":", "-np", "1", BIN, *other,
                        "--out", "x.csv"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count(f"the ranks disagree on the sweep: {flag}: ") == 2, r.stderr
    assert os.listdir(tmp_path) == []
