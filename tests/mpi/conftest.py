"""Shared pieces of the MPI tests: the binary, and mpirun with a time bound on every run.

Every run is bounded (TIMEOUT): a rank that hangs fails the test instead of stalling the suite.
Open MPI's start-up costs about a second per run on the 2-core build machine, so the tests keep
their sweeps small and their runs few.
"""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("ATTNSCALE_BIN", str(ROOT / "build" / "bin" / "attnscale"))
# Shared memory without the single-copy (CMA) path, which containers often forbid (ptrace rules).
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader",
          "--mca", "btl_vader_single_copy_mechanism", "none"]
TIMEOUT = 120


def run(cmd, cwd=None, timeout=TIMEOUT, env=None):
    """subprocess.run(cmd, capture_output=True, text=True) bounded by `timeout`. A job still running
    then (a rank that hangs) is stopped through mpirun, which passes SIGTERM on to every rank, and
    killed if that does not end it; the test fails with what the job wrote."""
    cmd = [str(a) for a in cmd]
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                out, err = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            pytest.fail(f"still running after {timeout} s (a rank hangs): {' '.join(cmd)}\n{out}{err}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def mpirun(k, *args, cwd=None, timeout=TIMEOUT):
    """`mpirun -np k attnscale ARGS` (k = 0: the binary alone, without mpirun)."""
    return run(([BIN] if k == 0 else [*MPIRUN, "-np", str(k), BIN]) + list(args), cwd=cwd, timeout=timeout)


def mpmd(cwd, *commands, timeout=TIMEOUT):
    """One rank per command (argument lists, each given to attnscale), as on nodes given other lines."""
    cmd = list(MPIRUN)
    for i, args in enumerate(commands):
        cmd += ([":"] if i else []) + ["-np", "1", BIN, *args]
    return run(cmd, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="session", autouse=True)
def binary_present():
    if not os.path.exists(BIN):
        pytest.fail(f"attnscale binary not found at {BIN}; run `make build` first")
