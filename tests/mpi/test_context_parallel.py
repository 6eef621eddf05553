"""`mpirun -np K attnscale attend ... --context-parallel`: each rank reads its rows of the inputs and
writes its rows of the outputs; the files match a single-process `attnscale attend` within float32
rounding, for K = 1..4, ragged shards (N not divisible by K), GQA, dk != dv, causal masks and windows.
Faults (a rank that cannot open its file, ranks that disagree on shapes, a rank that is killed) make
every rank exit non-zero within the time bound, with no output file left behind.
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/mpi/test_context_parallel.py
"""
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import BIN, MPIRUN, TIMEOUT, mpirun


def inputs(d, nq=37, nkv=37, dk=16, dv=8, hq=3, hkv=1, seed=1):
    r = np.random.default_rng(seed)
    np.save(d / "q.npy", r.standard_normal((2, hq, nq, dk)).astype(np.float32))
    np.save(d / "k.npy", r.standard_normal((2, hkv, nkv, dk)).astype(np.float32))
    np.save(d / "v.npy", r.standard_normal((2, hkv, nkv, dv)).astype(np.float32))
    return ["--q", d / "q.npy", "--k", d / "k.npy", "--v", d / "v.npy"]


def only(d, *names):
    assert sorted(os.listdir(d)) == sorted(names), "unexpected files: " + ", ".join(sorted(os.listdir(d)))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_rows_match_one_process(tmp_path, k):
    qkv = inputs(tmp_path)
    one = mpirun(0, "attend", *qkv, "--out", tmp_path / "o1.npy", "--lse", tmp_path / "l1.npy")
    assert one.returncode == 0, one.stderr
    r = mpirun(k, "attend", *qkv, "--out", tmp_path / "o.npy", "--lse", tmp_path / "l.npy", "--context-parallel")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), np.load(tmp_path / "o1.npy"), rtol=0, atol=2e-6)
    np.testing.assert_allclose(np.load(tmp_path / "l.npy"), np.load(tmp_path / "l1.npy"), rtol=0, atol=2e-6)
    only(tmp_path, "q.npy", "k.npy", "v.npy", "o1.npy", "l1.npy", "o.npy", "l.npy")


@pytest.mark.parametrize("mask", [["--causal", "bottom-right"], ["--causal", "top-left", "--window", "5,0"]])
def test_causal_masks_with_zigzag_shards(tmp_path, mask):
    qkv = inputs(tmp_path, nq=29, nkv=43, seed=2)
    one = mpirun(0, "attend", *qkv, *mask, "--out", tmp_path / "o1.npy")
    assert one.returncode == 0, one.stderr
    r = mpirun(3, "attend", *qkv, *mask, "--out", tmp_path / "o.npy", "--context-parallel")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), np.load(tmp_path / "o1.npy"), rtol=0, atol=2e-6)


def mpmd(tmp_path, first, second):
    """Two ranks started with different arguments (as on nodes whose files differ)."""
    cmd = [*MPIRUN, "-np", "1", BIN, *map(str, first), ":", "-np", "1", BIN, *map(str, second)]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)


def test_a_rank_that_cannot_open_its_file_stops_every_rank(tmp_path):
    qkv = inputs(tmp_path)
    out = ["--out", tmp_path / "o.npy", "--context-parallel"]
    r = mpmd(tmp_path, ["attend", *qkv, *out], ["attend", "--q", tmp_path / "missing.npy", *qkv[2:], *out])
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("attnscale:")]
    assert len(lines) == 2 and all("rank 1: --q: " in x and "missing.npy: cannot open file" in x for x in lines), r.stderr
    only(tmp_path, "q.npy", "k.npy", "v.npy")


def test_ranks_that_disagree_on_shapes_stop(tmp_path):
    qkv = inputs(tmp_path)
    np.save(tmp_path / "k12.npy", np.ones((2, 1, 37, 12), np.float32))
    np.save(tmp_path / "q12.npy", np.ones((2, 3, 37, 12), np.float32))
    out = ["--out", tmp_path / "o.npy", "--context-parallel"]
    r = mpmd(tmp_path, ["attend", *qkv, *out],
             ["attend", "--q", tmp_path / "q12.npy", "--k", tmp_path / "k12.npy", *qkv[4:], *out])
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("the ranks disagree on the attention: rank 1 has") == 2, r.stderr
    only(tmp_path, "q.npy", "k.npy", "v.npy", "k12.npy", "q12.npy")


def rank_pid(marker, rank):
    """The pid of the attnscale process of `rank` whose command line holds `marker`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and os.path.basename(cmd[0]) == b"attnscale" and marker.encode() in cmd \
                and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return None


def blocked_opening_fifo(pid):
    """True once `pid` waits in open() of a FIFO (after its MPI start-up, before any collective)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            if f.read().strip() == "wait_for_partner":
                return True
        with open(f"/proc/{pid}/syscall") as f:  # where wchan is hidden: openat (257) in progress
            return f.read().startswith("257 ")
    except OSError:
        return False


def test_a_killed_rank_makes_the_others_exit_in_time(tmp_path):
    qkv = inputs(tmp_path)
    fifo = str(tmp_path / "never-written.npy")
    os.mkfifo(fifo)  # rank 2 blocks opening it until it is killed; the others wait for it
    out = ["--out", str(tmp_path / "o.npy"), "--context-parallel"]
    args = [str(a) for a in ["attend", *qkv, *out]]
    cmd = [*MPIRUN, "-np", "2", BIN, *args, ":", "-np", "1", BIN, "attend", "--q", fifo, *map(str, qkv[2:]), *out]
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    while (pid is None or not blocked_opening_fifo(pid)) and time.time() - start < TIMEOUT / 2:
        pid = pid or rank_pid(fifo, 2)
        time.sleep(0.05)
    assert pid is not None and blocked_opening_fifo(pid), "rank 2 never reached its input"
    os.kill(pid, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=TIMEOUT / 2)
    except subprocess.TimeoutExpired:
        ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,wchan:32,args"], capture_output=True, text=True).stdout
        left = [line for line in ps.splitlines() if fifo in line or "mpirun" in line]
        for rank in (0, 1):
            if (p := rank_pid(fifo.replace("never-written.npy", "o.npy"), rank)) is not None:
                os.kill(p, signal.SIGKILL)
        proc.kill()
        pytest.fail("the surviving ranks hang after rank 2 was killed:\n" + "\n".join(left))
    assert proc.returncode != 0
    assert "rank 2" in err, err
    only(tmp_path, "q.npy", "k.npy", "v.npy", "never-written.npy")


def test_without_mpirun_context_parallel_is_refused(tmp_path):
    qkv = inputs(tmp_path)
    r = mpirun(0, "attend", *qkv, "--out", tmp_path / "o.npy", "--context-parallel")
    assert r.returncode == 2
    assert r.stderr.strip() == "attnscale: error: --context-parallel: start the ranks with mpirun (mpirun -np K attnscale attend ...)"
