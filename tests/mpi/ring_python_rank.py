"""One rank of the Python test (run by test_python.py under mpirun): attnscale.distributed over
mpi4py's COMM_WORLD against attnscale.attention on the whole sequence. Exits non-zero on a mismatch."""
import sys

import numpy as np
from mpi4py import MPI

import attnscale
import attnscale.distributed as dist

comm = MPI.COMM_WORLD
rng = np.random.default_rng(5)  # the same inputs on every rank
n, failures = 29, []
q = rng.standard_normal((2, 4, n, 16)).astype(np.float32)
k = rng.standard_normal((2, 2, n, 16)).astype(np.float32)
v = rng.standard_normal((2, 2, n, 8)).astype(np.float32)
dout = rng.standard_normal((2, 4, n, 8)).astype(np.float32)
dlse = rng.standard_normal((2, 4, n)).astype(np.float32)
for causal, sharding, with_dlse in [(False, "contiguous", False), (True, "zigzag", False), (True, "zigzag", True)]:
    out, lse = attnscale.attention(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = attnscale.attention_backward(q, k, v, out, lse, dout, causal=causal, dlse=dlse if with_dlse else None)
    r = dist.rows(n, comm, sharding)
    o_r, l_r = dist.ring_attention(q[..., r, :], k[..., r, :], v[..., r, :], comm, causal=causal, return_lse=True)
    g = dist.ring_attention_backward(q[..., r, :], k[..., r, :], v[..., r, :], o_r, l_r, dout[..., r, :], comm,
                                     causal=causal, dlse=dlse[..., r] if with_dlse else None)
    for name, got, want, tol in [("out", o_r, out[..., r, :], 1e-5), ("lse", l_r, lse[..., r], 1e-5),
                                 ("dq", g[0], dq[..., r, :], 1e-4), ("dk", g[1], dk[..., r, :], 1e-4),
                                 ("dv", g[2], dv[..., r, :], 1e-4)]:
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        if not err <= tol:
            failures.append(f"rank {comm.rank}: causal={causal} dlse={with_dlse} {name}: relative error {err:.3g} > {tol}")
try:
    dist.ring_attention(q, k, v, "not a communicator")
    failures.append("a string was accepted as a communicator")
except TypeError as e:
    assert "comm: expected an mpi4py communicator" in str(e), e
print("\n".join(failures) if failures else f"rank {comm.rank}: ok", flush=True)
sys.exit(1 if failures else 0)
