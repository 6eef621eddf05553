"""attnscale.distributed with an mpi4py communicator, under `mpirun -np K python3` for K = 1..3:
each rank's rows of the ring forward and backward equal attnscale.attention's on the whole sequence.
Run: ATTNSCALE_PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/mpi/test_python.py
"""
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import MPIRUN, ROOT, TIMEOUT

PYTHONPATH = os.environ.get("ATTNSCALE_PYTHONPATH", str(ROOT / "build" / "python"))
RANK_SCRIPT = pathlib.Path(__file__).with_name("ring_python_rank.py")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_ring_attention_through_mpi4py(k):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = subprocess.run([*MPIRUN, "-x", "PYTHONPATH", "-np", str(k), "/usr/bin/python3", str(RANK_SCRIPT)],
                       capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok") == k, r.stdout


FAULT_SCRIPT = pathlib.Path(__file__).with_name("ring_python_fault_rank.py")


@pytest.mark.parametrize("call", ["forward", "backward"])
@pytest.mark.parametrize("mode, error", [
    ("int32", "TypeError: q: dtype must be float32 or float64, got int32"),
    ("sharding", "ValueError: sharding: expected None, 'contiguous' or 'zigzag', got 'spiral'"),
    ("window", "TypeError: window: expected (left, right) with ints or None, got (1,)"),
])
def test_an_argument_error_on_one_rank_raises_on_every_rank(tmp_path, mode, error, call):
    """The binding's argument checks are agreed on before the ring starts: rank 1 raises its own
    error, rank 0 an error naming rank 1's; no rank waits for the other (bounded by a timeout)."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = subprocess.run([*MPIRUN, "-x", "PYTHONPATH", "-np", "2", "/usr/bin/python3", str(FAULT_SCRIPT), mode, call,
                        str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    message = error.split(": ", 1)[1]
    assert (tmp_path / "rank0.txt").read_text() == f"ValueError: rank 1: {message}"
    assert (tmp_path / "rank1.txt").read_text() == error
