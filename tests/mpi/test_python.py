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
