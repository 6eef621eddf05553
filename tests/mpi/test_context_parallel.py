"""`mpirun -np K attnscale attend ... --context-parallel`: each rank reads its rows of the inputs and
writes its rows of the outputs; the files match a single-process `attnscale attend` within float32
rounding, for K = 1..4, ragged shards (N not divisible by K), GQA, dk != dv, causal masks and windows.
Faults (a rank that cannot open its file, ranks that disagree on shapes or flags, an error every rank
sees, a rank that is killed) make every rank exit non-zero within the time bound, with no output file
left behind; the errors are agreed on, one line per rank.
Run: ATTNSCALE_BIN=build/bin/attnscale /usr/bin/python3 -m pytest -q tests/mpi/test_context_parallel.py
"""
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import BIN, MPIRUN, TIMEOUT, mpirun, mpmd, run


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


@pytest.mark.parametrize("extra", [["--alibi-slopes", "slopes.npy"], ["--sinks", "sinks.npy"], ["--dropout", "0.1"]])
def test_options_a_block_cannot_take_alone_are_refused(tmp_path, extra):
    flag = extra[0]
    # ALiBi's distances and dropout's mask are global, a sink joins each row once: per block they
    # would give another result than one process, so they are refused on every rank.
    qkv = inputs(tmp_path, hkv=3)
    np.save(tmp_path / "slopes.npy", np.array([0.5, 0.25, 0.125], np.float32))
    np.save(tmp_path / "sinks.npy", np.array([0.3, -0.2, 1.0], np.float32))
    r = mpirun(2, "attend", *qkv, *extra, "--out", tmp_path / "o.npy", "--context-parallel", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("attnscale:")]
    assert lines and all(f"{flag}: not supported by ring attention" in x for x in lines), r.stderr
    assert not (tmp_path / "o.npy").exists()


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
    # Each rank's file is named with its shape, as given (not the ring's internal fields).
    want = (f"the ranks disagree on the inputs: --q: {tmp_path / 'q.npy'} (37 rows, shape (2, 3, 37, 16) float32) "
            f"on rank 0, {tmp_path / 'q12.npy'} (37 rows, shape (2, 3, 37, 12) float32) on rank 1")
    assert r.stderr.count(want) == 2, r.stderr
    only(tmp_path, "q.npy", "k.npy", "v.npy", "k12.npy", "q12.npy")


def agreed_lines(r):
    """The job's error lines: exactly one per rank (two ranks), and no MPI_Abort or ORTE banner."""
    lines = [x for x in r.stderr.splitlines() if x.startswith("attnscale:")]
    assert len(lines) == 2 and lines[0] == lines[1], r.stderr
    assert "MPI_ABORT" not in r.stderr and "ORTE_ERROR_LOG" not in r.stderr, r.stderr
    return lines[0]


def test_a_q_of_other_length_on_one_rank_names_each_file_and_its_rows(tmp_path):
    qkv = inputs(tmp_path, nq=12, nkv=12)
    np.save(tmp_path / "q14.npy", np.ones((2, 3, 14, 16), np.float32))
    out = ["--out", tmp_path / "o.npy", "--context-parallel"]
    r = mpmd(tmp_path, ["attend", *qkv, *out], ["attend", "--q", tmp_path / "q14.npy", *qkv[2:], *out])
    assert r.returncode == 2, r.stderr
    line = agreed_lines(r)
    assert "q.npy (12 rows" in line and "on rank 0" in line and "q14.npy (14 rows" in line and "on rank 1" in line, line
    assert "Nq =" not in line, line
    only(tmp_path, "q.npy", "k.npy", "v.npy", "q14.npy")


def test_lse_given_on_one_rank_only_stops_every_rank_before_any_output(tmp_path):
    """The --lse file is shared: a rank without it would leave the others waiting for its rows."""
    qkv = inputs(tmp_path)
    out = ["--out", tmp_path / "o.npy", "--context-parallel"]
    r = mpmd(tmp_path, ["attend", *qkv, *out, "--lse", tmp_path / "l.npy"], ["attend", *qkv, *out])
    assert r.returncode == 2, r.stderr
    line = agreed_lines(r)
    assert f"the ranks disagree on the arguments: --lse: {tmp_path / 'l.npy'} on rank 0, not given on rank 1" in line, line
    only(tmp_path, "q.npy", "k.npy", "v.npy")


def test_ranks_given_different_out_paths_stop(tmp_path):
    """Every rank writes its rows of one shared file: another path on one rank is refused, not ignored."""
    qkv = inputs(tmp_path)
    r = mpmd(tmp_path, ["attend", *qkv, "--out", "c.npy", "--context-parallel"],
             ["attend", *qkv, "--out", "d.npy", "--context-parallel"])
    assert r.returncode == 2, r.stderr
    real = os.path.realpath(tmp_path)
    assert (f"the ranks disagree on the arguments: --out: c.npy ({real}/c.npy) on rank 0, d.npy ({real}/d.npy) "
            "on rank 1") in agreed_lines(r)
    only(tmp_path, "q.npy", "k.npy", "v.npy")


def test_ranks_naming_one_out_file_in_other_words_agree(tmp_path):
    """--out and --lse are compared as the files they name: o.npy, ./o.npy, a path through a link to
    the folder and one from another working folder are one file, written whole."""
    qkv = inputs(tmp_path)
    one = mpirun(0, "attend", *qkv, "--out", tmp_path / "o1.npy", "--lse", tmp_path / "l1.npy")
    assert one.returncode == 0, one.stderr
    (tmp_path / "sub").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path, target_is_directory=True)
    cmd = [*MPIRUN, "-np", "1", BIN, "attend", *map(str, qkv), "--out", "o.npy", "--lse", "l.npy", "--context-parallel",
           ":", "-np", "1", "-wdir", str(tmp_path / "sub"), BIN, "attend", *map(str, qkv), "--out", "../o.npy",
           "--lse", str(tmp_path / "alias" / "." / "l.npy"), "--context-parallel"]
    r = run(cmd, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), np.load(tmp_path / "o1.npy"), rtol=0, atol=2e-6)
    np.testing.assert_allclose(np.load(tmp_path / "l.npy"), np.load(tmp_path / "l1.npy"), rtol=0, atol=2e-6)
    only(tmp_path, "q.npy", "k.npy", "v.npy", "o1.npy", "l1.npy", "o.npy", "l.npy", "sub", "alias")


@pytest.mark.parametrize("extra, want", [
    (["--probs", "p.npy"], "rank 0: --probs: not available with --context-parallel"),
    (["--reference"], "rank 0: --reference: not available with --context-parallel"),
    (["--sharding", "spiral"], "rank 0: --sharding: expected contiguous or zigzag, got 'spiral'"),
    (["--bogus"], "rank 0: unknown flag --bogus (see attnscale attend --help)"),
])
def test_errors_every_rank_sees_are_one_line_per_rank(tmp_path, extra, want):
    """Agreed on like an error of one rank: no MPI_Abort, one line per rank, exit code 2."""
    qkv = inputs(tmp_path)
    r = mpirun(2, "attend", *qkv, "--out", "o.npy", "--context-parallel", *extra, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert agreed_lines(r) == "attnscale: error: " + want
    only(tmp_path, "q.npy", "k.npy", "v.npy")


def test_one_row_is_named_in_the_singular(tmp_path):
    qkv = inputs(tmp_path, nq=1, nkv=8)
    r = mpirun(2, "attend", *qkv, "--out", "o.npy", "--context-parallel", "--sharding", "contiguous", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "--q: 1 row cannot be split over 2 ranks" in agreed_lines(r)


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


def blocked_opening(pid, path):
    """True once `pid` waits in open() of the FIFO `path` (after its MPI start-up, before any
    collective). The kernel's wait channel names the FIFO wait; where it is hidden, the syscall in
    progress must be openat (257) of that very path (its argument read from the process's memory)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
        with open(f"/proc/{pid}/syscall") as f:
            call = f.read().split()
        if wchan not in ("", "0"):
            return wchan == "wait_for_partner"
        if len(call) < 3 or call[0] != "257":
            return False
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(int(call[2], 16))
            return mem.read(len(path) + 1) == path.encode() + b"\0"
    except (OSError, ValueError):
        return False


def stops_quietly(pid):
    """True once `pid` has its SIGTERM handler (it is past MPI's start-up: mpi_job::start)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(x.split()[1], 16) for x in f if x.startswith("SigCgt:"))
        return bool(caught & (1 << (signal.SIGTERM - 1)))
    except (OSError, StopIteration, ValueError):
        return False


def test_a_killed_rank_makes_the_others_exit_in_time(tmp_path):
    """Deterministic under any load: rank 2 is killed only once it waits in open() of a FIFO nobody
    writes (past MPI's start-up) and ranks 0 and 1 are past theirs (waiting for rank 2's rows or about
    to); each step has its own time bound, and a hang kills what is left and fails with the ranks'
    states."""
    qkv = inputs(tmp_path)
    fifo = str(tmp_path / "never-written.npy")
    os.mkfifo(fifo)
    out = ["--out", str(tmp_path / "o.npy"), "--context-parallel"]
    args = [str(a) for a in ["attend", *qkv, *out]]
    cmd = [*MPIRUN, "-np", "2", BIN, *args, ":", "-np", "1", BIN, "attend", "--q", fifo, *map(str, qkv[2:]), *out]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = str(tmp_path / "o.npy")

    def ranks():
        return {r: rank_pid(marker, r) for r in range(3)}

    def ready(pids):
        return None not in pids.values() and blocked_opening(pids[2], fifo) \
            and stops_quietly(pids[0]) and stops_quietly(pids[1])

    def fail(why):
        ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,wchan:32,args"], capture_output=True, text=True).stdout
        left = [line for line in ps.splitlines() if marker in line or "mpirun" in line]
        for p in ranks().values():
            if p is not None:
                os.kill(p, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        pytest.fail(why + ":\n" + "\n".join(left))

    deadline = time.time() + TIMEOUT
    while not ready(pids := ranks()):
        if proc.poll() is not None:
            pytest.fail("the job ended before rank 2 was killed:\n" + proc.communicate()[1])
        if time.time() > deadline:
            fail(f"the ranks did not reach their inputs within {TIMEOUT} s")
        time.sleep(0.05)
    os.kill(pids[2], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        fail("the surviving ranks hang after rank 2 was killed")
    assert proc.returncode != 0
    assert "rank 2" in err, err
    only(tmp_path, "q.npy", "k.npy", "v.npy", "never-written.npy")


def test_without_mpirun_context_parallel_is_refused(tmp_path):
    qkv = inputs(tmp_path)
    r = mpirun(0, "attend", *qkv, "--out", tmp_path / "o.npy", "--context-parallel")
    assert r.returncode == 2
    assert r.stderr.strip() == "attnscale: error: --context-parallel: start the ranks with mpirun (mpirun -np K attnscale attend ...)"


# --- what the ranks hold, checked before any row is copied ---------------------------------------

def memory_limit_bytes():
    """RAM + swap, as the tool reads it (sysinfo: totalram + totalswap)."""
    swap_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("SwapTotal:"))
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") + 1024 * swap_kib


def sparse_inputs(d, share):
    """q, k, v [rows, 64] float32 of `share` of RAM + swap each, as files of holes (a few KiB on
    disk); their rows are never read when the call is refused."""
    rows = int(share * memory_limit_bytes()) // (4 * 64)
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, 64), }}"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    head = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1")
    with open(d / "x.npy", "wb") as f:
        f.write(head)
        f.truncate(len(head) + 4 * 64 * rows)
    return rows, ["--q", "x.npy", "--k", "x.npy", "--v", "x.npy"]


def test_a_rank_s_share_past_the_memory_is_refused_on_every_rank(tmp_path):
    # Two ranks, q, k, v of 20% each: a rank holds half of q, k, v and out (40%), and ring
    # attention's two K/V buffers (40%), float64 running result (20%) and a block's result (30%).
    rows, qkv = sparse_inputs(tmp_path, 0.2)
    r = mpirun(2, "attend", *qkv, "--out", "o.npy", "--context-parallel", "--sharding", "contiguous", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    half = f"[{rows // 2}, 64] float32"
    line = agreed_lines(r)
    assert line.startswith(f"attnscale: error: rank 0: --q {half}, --k {half}, --v {half}, --out {half}, "
                           "ring attention's buffers and scratch "), line
    assert ": this rank needs about" in line and "more ranks or smaller arrays need less" in line, line
    only(tmp_path, "x.npy")


def test_the_shares_of_the_ranks_on_one_machine_are_added(tmp_path):
    # q, k, v of 10% each: a rank's share (65%) fits, the two ranks' (130%) on this machine do not.
    rows, qkv = sparse_inputs(tmp_path, 0.1)
    r = mpirun(2, "attend", *qkv, "--out", "o.npy", "--context-parallel", "--sharding", "contiguous", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    line = agreed_lines(r)
    assert f"--q [{rows // 2}, 64] float32" in line, line
    assert "on this rank, the others' alike: what the 2 ranks on this machine hold needs about" in line, line
    assert "ranks on more machines or smaller arrays need less" in line, line
    only(tmp_path, "x.npy")
