"""Where outputs go: through symbolic links, into FIFOs and devices, and never over a user's file
when the command fails.

Every output flag (`attend --out/--lse/--probs`, `experiment --out`) writes a temporary beside the
file its path names and renames it into place once every output is written; a symbolic link is
followed (the link stays), a FIFO or device is written in place (never replaced by a regular file).
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/cli/test_output_files.py
"""
import os
import stat
import subprocess
import threading

import numpy as np
import pytest

BIN = os.environ.get("ATTNSCALE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "attnscale"))


@pytest.fixture
def work(tmp_path):
    """q [4, 8], k [6, 8], v [6, 3] float32 files, and the output of attend over them."""
    rng = np.random.default_rng(8)
    for name, shape in (("q", (4, 8)), ("k", (6, 8)), ("v", (6, 3))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype("<f4"))
    r = attend(tmp_path, "--out", "expected.npy", "--lse", "expected_lse.npy")
    assert r.returncode == 0, r.stderr
    return tmp_path


def attend(work, *outputs):
    return subprocess.run([BIN, "attend", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", *outputs], cwd=work,
                          capture_output=True, text=True, timeout=120)


def refused(r, *words):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnscale: error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def read_fifo_in_background(path):
    """Starts a reader of the FIFO at `path`; returns a function giving the bytes it read."""
    got = {}

    def read():
        with open(path, "rb") as f:
            got["bytes"] = f.read()

    t = threading.Thread(target=read, daemon=True)
    t.start()

    def result():
        t.join(timeout=60)
        assert not t.is_alive(), "nothing was written into the FIFO"
        return got["bytes"]

    return result


def test_symlink_output_writes_the_target_and_keeps_the_link(work):
    (work / "real").mkdir()
    (work / "real" / "o.npy").write_bytes(b"OLD")
    os.symlink("real/o.npy", work / "o.npy")
    os.symlink("real/lse.npy", work / "lse.npy")  # dangling: its target is created
    r = attend(work, "--out", "o.npy", "--lse", "lse.npy")
    assert r.returncode == 0, r.stderr
    assert os.path.islink(work / "o.npy") and os.path.islink(work / "lse.npy")
    assert (work / "real" / "o.npy").read_bytes() == (work / "expected.npy").read_bytes()
    assert (work / "real" / "lse.npy").read_bytes() == (work / "expected_lse.npy").read_bytes()
    assert sorted(os.listdir(work / "real")) == ["lse.npy", "o.npy"]  # no temporary left


def test_fifo_output_is_written_through_and_stays_a_fifo(work):
    os.mkfifo(work / "o.npy")
    result = read_fifo_in_background(work / "o.npy")
    r = attend(work, "--out", "o.npy", "--lse", "lse.npy")
    assert r.returncode == 0, r.stderr
    assert result() == (work / "expected.npy").read_bytes()
    assert stat.S_ISFIFO(os.lstat(work / "o.npy").st_mode)
    assert (work / "lse.npy").read_bytes() == (work / "expected_lse.npy").read_bytes()


def test_fifo_behind_a_symlink_is_written_through(work):
    os.mkfifo(work / "pipe")
    os.symlink("pipe", work / "o.npy")
    result = read_fifo_in_background(work / "pipe")
    r = attend(work, "--out", "o.npy")
    assert r.returncode == 0, r.stderr
    assert result() == (work / "expected.npy").read_bytes()
    assert os.path.islink(work / "o.npy") and stat.S_ISFIFO(os.lstat(work / "pipe").st_mode)


def test_experiment_out_through_a_fifo(work):
    args = ["experiment", "saturation", "--n", "6", "--d", "4", "--trials", "10"]
    expected = subprocess.run([BIN, *args], capture_output=True, timeout=120).stdout
    os.mkfifo(work / "x.csv")
    result = read_fifo_in_background(work / "x.csv")
    r = subprocess.run([BIN, *args, "--out", "x.csv"], cwd=work, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert result() == expected
    assert stat.S_ISFIFO(os.lstat(work / "x.csv").st_mode)


def test_dev_null_output_stays_a_device(work):
    # A build that replaced non-regular files would replace /dev/null itself (we may run as root),
    # so first the same through a FIFO behind a link, and /dev/null only if that FIFO survived.
    os.mkfifo(work / "pipe")
    os.symlink("pipe", work / "guard.npy")
    result = read_fifo_in_background(work / "pipe")
    assert attend(work, "--out", "guard.npy").returncode == 0
    result()
    assert stat.S_ISFIFO(os.lstat(work / "pipe").st_mode) and sorted(os.listdir(work)).count("pipe") == 1
    assert not [p for p in os.listdir(work) if ".tmp." in p]
    before = os.lstat("/dev/null")
    link = work / "null.npy"
    os.symlink("/dev/null", link)
    r = attend(work, "--out", str(link))
    assert r.returncode == 0, r.stderr
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


@pytest.mark.parametrize("second", [["--lse", "nodir/l.npy"], ["--lse", "adir"], ["--probs", "nodir/p.npy"]])
def test_failed_second_output_leaves_the_existing_first_untouched(work, second):
    (work / "adir").mkdir()
    (work / "o.npy").write_bytes(b"OLD\n")
    r = attend(work, "--out", "o.npy", *second)
    refused(r, second[0], second[1])
    assert (work / "o.npy").read_bytes() == b"OLD\n"
    assert sorted(p for p in os.listdir(work) if p.startswith("o.npy")) == ["o.npy"]


def test_directory_at_the_output_path_is_refused(work):
    (work / "adir").mkdir()
    refused(attend(work, "--out", "adir"), "--out", "adir", "is a directory")
    assert os.listdir(work / "adir") == []


def test_experiment_checks_out_before_running(work):
    (work / "adir").mkdir()
    r = subprocess.run([BIN, "experiment", "saturation", "--n", "6", "--d", "4", "--trials", "10", "--out",
                        "nodir/x.csv"], cwd=work, capture_output=True, text=True, timeout=120)
    refused(r, "--out", "nodir/x.csv", "no directory")
    assert "experiment saturation" not in r.stderr  # no progress: nothing ran
