"""Where outputs go: through symbolic links, into FIFOs and devices, and never over a user's file
when the command fails.

Every output flag (`attend --out/--lse/--probs`, `experiment --out`) writes a temporary beside the
file its path names and renames it into place once every output is written; a symbolic link is
followed (the link stays), a FIFO or device is written in place (never replaced by a regular file).
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/cli/test_output_files.py
"""
import json
import os
import resource
import signal
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


# A full disk, made deterministic as root too: a file-size limit (RLIMIT_FSIZE) with SIGXFSZ ignored
# makes a write past it fail with EFBIG ("File too large"), as ENOSPC would on a full disk.
def file_size_limit(limit):
    def set_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def run_limited(work, limit, *args):
    return subprocess.run([BIN, *args], cwd=work, capture_output=True, text=True, timeout=120,
                          preexec_fn=None if limit is None else file_size_limit(limit))


@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_under_attend_out_leaves_no_file(work, existing):
    size = (work / "expected.npy").stat().st_size
    if existing:
        (work / "o.npy").write_bytes(b"OLD\n")
    before = sorted(os.listdir(work))
    r = run_limited(work, size - 1, "attend", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["attnscale: error: --out: o.npy: cannot write (File too large)"], r.stderr
    assert sorted(os.listdir(work)) == before, "a partial or temporary file was left"
    if existing:
        assert (work / "o.npy").read_bytes() == b"OLD\n"


def test_a_full_device_at_the_output_path_is_an_error(work):
    os.symlink("/dev/full", work / "o.npy")
    r = run_limited(work, None, "attend", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["attnscale: error: --out: o.npy: write failed (No space left on device)"], r.stderr
    assert os.path.islink(work / "o.npy") and stat.S_ISCHR(os.stat(work / "o.npy").st_mode)


SWEEP_2 = ["experiment", "saturation", "--n", "6", "--d", "4,8", "--trials", "10", "--threads", "1"]


def without_timing(json_text):
    """A result's JSON without the metadata that describe the run that finished (seconds, threads)."""
    doc = json.loads(json_text)
    del doc["metadata"]["seconds"], doc["metadata"]["threads"]
    return doc


def test_a_file_size_limit_is_a_write_error_not_a_kill(work):
    """Under `ulimit -f` alone (SIGXFSZ at its default, which kills), attnscale ignores the signal:
    the write fails as on a full disk, one line names --out, and no temporary is left."""
    def limit_only():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    r = subprocess.run([BIN, *SWEEP_2, "--format", "json", "--out", "limited.json"], cwd=work, capture_output=True,
                       text=True, timeout=120, preexec_fn=limit_only)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.splitlines()[-1].startswith("attnscale: error: --out: limited.json"), r.stderr
    assert [p for p in os.listdir(work) if p.startswith("limited.") and not p.endswith(".partial")] == []


def test_a_full_disk_under_experiment_out_keeps_the_journal_for_resume(work):
    """FILE fails to be written after every point is done: no FILE and no temporary, and the
    journal, which holds every point, stays so that --resume writes FILE without running one."""
    clean = run_limited(work, None, *SWEEP_2, "--format", "json").stdout
    # 64 bytes under the JSON's size, as its "seconds" may be written with fewer digits (below).
    r = run_limited(work, len(clean.encode()) - 64, *SWEEP_2, "--format", "json", "--out", "x.json")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1:] == ["attnscale: error: --out: x.json: cannot write (File too large); x.json.partial "
                                          "keeps 2 finished points for --resume"], r.stderr
    assert [p for p in os.listdir(work) if p.startswith("x.")] == ["x.json.partial"]
    r = run_limited(work, None, *SWEEP_2, "--format", "json", "--out", "x.json", "--resume")
    assert r.returncode == 0 and "2 points already done" in r.stderr, r.stderr
    assert without_timing((work / "x.json").read_text()) == without_timing(clean)
    assert [p for p in os.listdir(work) if p.startswith("x.")] == ["x.json"]


def test_a_full_disk_under_the_journal_keeps_its_finished_points_or_removes_it(work):
    """The journal itself cannot grow: the points it holds stay for --resume (the record cut short
    is cut off); a journal that could not even take its header holds nothing and goes."""
    clean = run_limited(work, None, *SWEEP_2).stdout
    # The whole journal's size: the one a failure of the last write of a (larger) JSON FILE leaves.
    # The limit lies 64 bytes under the JSON's size: its "seconds" differ between runs in their
    # digits (a trailing zero is not written), so one byte under would let a shorter one through.
    clean_json = run_limited(work, None, *SWEEP_2, "--format", "json").stdout
    full = run_limited(work, len(clean_json.encode()) - 64, *SWEEP_2, "--format", "json", "--out", "j.json")
    assert full.returncode == 2, full.stderr
    journal_size = (work / "j.json.partial").stat().st_size
    r = run_limited(work, journal_size - 1, *SWEEP_2, "--out", "x.csv")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1:] == ["attnscale: error: --out: x.csv.partial: cannot write journal (File too "
                                          "large); x.csv.partial keeps 1 finished point for --resume"], r.stderr
    assert [p for p in os.listdir(work) if p.startswith("x.")] == ["x.csv.partial"]
    r = run_limited(work, None, *SWEEP_2, "--out", "x.csv", "--resume")
    assert r.returncode == 0 and "1 point already done" in r.stderr, r.stderr
    assert (work / "x.csv").read_text() == clean
    r = run_limited(work, 64, *SWEEP_2, "--out", "y.csv")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["attnscale: error: --out: y.csv.partial: cannot write journal (File too large)"]
    assert [p for p in os.listdir(work) if p.startswith("y.")] == []
