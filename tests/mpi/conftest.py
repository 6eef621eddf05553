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


def mpirun(k, *args, cwd=None, timeout=TIMEOUT):
    """`mpirun -np k attnscale ARGS` (k = 0: the binary alone, without mpirun)."""
    cmd = ([BIN] if k == 0 else [*MPIRUN, "-np", str(k), BIN]) + [str(a) for a in args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session", autouse=True)
def binary_present():
    if not os.path.exists(BIN):
        pytest.fail(f"attnscale binary not found at {BIN}; run `make build` first")
