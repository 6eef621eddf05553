"""Context-parallel (ring) attention over an mpi4py communicator (builds with MPI only).

Each rank holds the rows shard(N, comm.size, comm.rank, sharding) of q (and k, v) along N, the
second-to-last dimension; K/V shards travel around the ring while each rank attends to them, and each
rank gets back its rows of the output (and of dq, dk, dv from the backward). See distributed.md (docs/ in
the source, share/doc/attnscale/ installed).

    # mpirun -np 4 /usr/bin/python3 script.py
    >>> from mpi4py import MPI
    >>> import attnscale.distributed as dist
    >>> rows = dist.rows(n, MPI.COMM_WORLD, "zigzag")        # this rank's global rows, as an index array
    >>> out, lse = dist.ring_attention(q[..., rows, :], k[..., rows, :], v[..., rows, :],
    ...                                MPI.COMM_WORLD, causal=True, return_lse=True)
"""
import functools
import inspect

import numpy as np

from . import _distributed
from .keywords import signature_error

__all__ = ["ring_attention", "ring_attention_backward", "shard", "rows"]


def _handle(comm):
    if not hasattr(comm, "py2f"):
        raise TypeError(f"comm: expected an mpi4py communicator (e.g. MPI.COMM_WORLD), got {type(comm).__name__}")
    if not getattr(_distributed, "has_mpi", False):
        raise RuntimeError("attnscale was built without MPI (install libopenmpi-dev and rebuild)")
    return comm.py2f()


def _agreed(fn):
    """fn, a call every rank of its comm makes together, whose arguments every rank agrees on before
    any collective: an error on one rank raises on every rank, never leaving the others waiting.

    The binding checks the values (arrays, dtypes, keywords' values) and agrees on the outcome first
    thing (python/distributed_bindings.cc); a call its signature refuses (a misspelt keyword, a
    missing argument) never reaches it, so the refusing rank takes part in that agreement with its
    error (_refuse): it raises its own TypeError, the others "rank R: ...". Only a rank given no
    communicator cannot reach the others; it raises alone."""
    position = list(inspect.signature(fn).parameters).index("comm")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        error = signature_error(fn, args, kwargs)
        if error is None:
            return fn(*args, **kwargs)
        comm = kwargs.get("comm", args[position] if len(args) > position else None)
        if not hasattr(comm, "py2f"):
            raise TypeError(error)
        _distributed._refuse(_handle(comm), error)

    return call


@_agreed
def ring_attention(q, k, v, comm, *, sharding=None, return_lse=False, scale=None, causal=None, window=None,
                   align=None, threads=0):
    """This rank's rows of attention over the whole sequence (every rank of comm calls it together).

    sharding: None (zigzag when causal, else contiguous), 'contiguous' or 'zigzag'. Other keywords as
    in attnscale.attention (no explicit mask). Returns out, or (out, lse) with return_lse=True."""
    return _distributed._ring_attention(q, k, v, _handle(comm), sharding, scale, causal, window, align,
                                      return_lse, threads)


@_agreed
def ring_attention_backward(q, k, v, out, lse, dout, comm, *, sharding=None, scale=None, causal=None,
                            window=None, align=None, threads=0, dlse=None):
    """(dq, dk, dv) for this rank's rows, from ring_attention's out and lse and this rank's dout
    (and dlse, this rank's rows of dLoss/dlse, when the loss reads lse; as in attention_backward)."""
    return _distributed._ring_attention_backward(q, k, v, out, lse, dout, _handle(comm), sharding, scale, causal,
                                               window, align, threads, dlse)


def shard(n, comm, sharding="contiguous"):
    """[(begin, length), ...]: the global rows this rank of comm holds of a sequence of n rows."""
    return _distributed._shard(n, comm.size, comm.rank, sharding)


def rows(n, comm, sharding="contiguous"):
    """This rank's global row indices (for q[..., rows, :]), in local order."""
    return np.concatenate([np.arange(b, b + l) for b, l in shard(n, comm, sharding)])
