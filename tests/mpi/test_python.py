"""attnscale.distributed with an mpi4py communicator, under `mpirun -np K python3` for K = 1..3:
each rank's rows of the ring forward and backward equal attnscale.attention's on the whole sequence.
Run: ATTNSCALE_PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/mpi/test_python.py
"""
import os
import pathlib
import sys

import pytest

from conftest import MPIRUN, ROOT, run

PYTHONPATH = os.environ.get("ATTNSCALE_PYTHONPATH", str(ROOT / "build" / "python"))
RANK_SCRIPT = pathlib.Path(__file__).with_name("ring_python_rank.py")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_ring_attention_through_mpi4py(k):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = run([*MPIRUN, "-x", "PYTHONPATH", "-np", str(k), "/usr/bin/python3", RANK_SCRIPT], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok") == k, r.stdout


FAULT_SCRIPT = pathlib.Path(__file__).with_name("ring_python_fault_rank.py")


@pytest.mark.parametrize("call", ["forward", "backward"])
@pytest.mark.parametrize("mode, error", [
    ("int32", "TypeError: q: dtype must be float32 or float64, got int32"),
    ("list", "TypeError: q: expected a numpy array, got list"),
    ("sharding", "ValueError: sharding: expected None, 'contiguous' or 'zigzag', got 'spiral'"),
    ("window", "TypeError: window: expected (left, right) with ints or None, got (1,)"),
    ("threads", "TypeError: threads: expected int, got str"),
    ("keyword", "TypeError: {fn}() got an unexpected keyword argument 'casual' (did you mean 'causal'?)"),
    ("missing", "TypeError: {fn}() missing required argument 'v'"),
])
def test_an_argument_error_on_one_rank_raises_on_every_rank(tmp_path, mode, error, call):
    """Arguments are agreed on before the ring starts, whether the binding refuses them or the
    Python signature does (a misspelt keyword never reaches the binding): rank 1 raises its own
    error, rank 0 an error naming rank 1's; no rank waits for the other (bounded by a timeout)."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = run([*MPIRUN, "-x", "PYTHONPATH", "-np", "2", "/usr/bin/python3", FAULT_SCRIPT, mode, call, tmp_path],
            timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    error = error.format(fn="ring_attention" if call == "forward" else "ring_attention_backward")
    message = error.split(": ", 1)[1]
    assert (tmp_path / "rank0.txt").read_text() == f"ValueError: rank 1: {message}"
    assert (tmp_path / "rank1.txt").read_text() == error
