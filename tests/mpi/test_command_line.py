"""The command line under mpirun: every rank either runs the same command or stops with one line.
--help and --version ask for no command: given on every rank, each prints it; given on some ranks
only, every rank stops with one line naming the flag, instead of the others waiting for ranks that
printed and left.
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/mpi/test_command_line.py
"""
import os

import pytest

from conftest import BIN, MPIRUN, TIMEOUT, mpirun, mpmd, run

SWEEP = ["experiment", "saturation", "--n", "9", "--d", "1,2", "--trials", "5", "--threads", "1"]


@pytest.mark.parametrize("flag", ["--help", "--version"])
@pytest.mark.parametrize("asking", [0, 1])
def test_help_or_version_on_one_rank_only_stops_every_rank(tmp_path, flag, asking):
    lines = [list(SWEEP), list(SWEEP)]
    lines[asking] = ["--version"] if flag == "--version" else [*SWEEP, "--help"]
    r = mpmd(tmp_path, *lines)
    assert r.returncode == 2, r.stdout + r.stderr
    said = [x for x in r.stderr.splitlines() if x.startswith("attnscale:")]
    given = {asking: "given", 1 - asking: "not given"}
    want = (f"attnscale: error: the ranks disagree on the command line: {flag}: {given[0]} on rank 0, "
            f"{given[1]} on rank 1 (start every rank with the same command)")
    assert said == [want, want], r.stderr
    assert "MPI_ABORT" not in r.stderr, r.stderr
    assert "Usage" not in r.stdout and os.listdir(tmp_path) == [], r.stdout


@pytest.mark.parametrize("args", [["--version"], ["experiment", "--help"]])
def test_help_or_version_on_every_rank_is_printed(tmp_path, args):
    alone = mpirun(0, *args).stdout
    # Each rank's output in a file of its own: mpirun interleaves the ranks' lines on its stdout.
    files = tmp_path / "ranks"
    r = run([*MPIRUN, "--output-filename", str(files), "-np", "2", BIN, *args], cwd=tmp_path, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    for rank in (0, 1):
        out = next(files.glob(f"*/rank.{rank}"))
        assert (out / "stdout").read_text() == alone, rank
        assert (out / "stderr").read_text() == "", rank
