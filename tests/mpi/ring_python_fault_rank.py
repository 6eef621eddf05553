"""One rank of test_python.py's fault tests: rank 1 alone gets a bad argument (MODE, argv[1]) to
ring_attention or ring_attention_backward (argv[2]); every rank writes `<exception type>: <message>`
to argv[3]/rankR.txt (not stdout, where mpirun may run the ranks' lines together)."""
import pathlib
import sys

import numpy as np
from mpi4py import MPI

import attnscale.distributed as dist

comm = MPI.COMM_WORLD
mode, backward = sys.argv[1], sys.argv[2] == "backward"
q = np.random.default_rng(0).standard_normal((2, 12, 8)).astype(np.float32)[..., dist.rows(12, comm), :]
if backward:
    out, lse = dist.ring_attention(q, q, q, comm, return_lse=True)
    call, args = dist.ring_attention_backward, [q, q, q, out, lse, q, comm]
else:
    call, args = dist.ring_attention, [q, q, q, comm]
kw = {}
if comm.rank == 1:
    if mode == "int32":  # a dtype the kernels do not take
        args[0] = q.astype(np.int32)
    elif mode == "list":  # no array at all: numpy cannot make one of it
        args[0] = [[1.0, 2.0], [3.0]]
    elif mode == "sharding":
        kw["sharding"] = "spiral"
    elif mode == "window":
        kw["window"] = (1,)
    elif mode == "threads":
        kw["threads"] = "2"
    elif mode == "keyword":  # refused by the Python signature, before the extension is called
        kw["casual"] = True
    elif mode == "missing":  # v, by keyword, forgotten
        args, kw = args[:2], {"comm": comm}
try:
    call(*args, **kw)
    said = "no error"
except Exception as e:  # noqa: BLE001 - the test reads the type and message
    said = f"{type(e).__name__}: {e}"
(pathlib.Path(sys.argv[3]) / f"rank{comm.rank}.txt").write_text(said)
