"""PyTorch's shapes onto the library's: leading dimensions that broadcast, folded into [B, H, N, d].

The library reads q [B, Hq, Nq, dk], k [B, Hkv, Nkv, dk], v [B, Hkv, Nkv, dv] and a mask
[B|1, Hq|1, Nq, Nkv], with Hq % Hkv == 0 (grouped-query attention). PyTorch's
scaled_dot_product_attention takes q [..., Hq, Nq, dk] and k, v [..., Hkv, Nkv, d] whose leading
dimensions ("...") broadcast against each other, and a mask that broadcasts to [..., Hq, Nq, Nkv].

A Layout says how to get from one to the other: every operand is broadcast (stride-0 views, no
copy) to `batch + (heads, rows, cols)` and its leading dimensions merged into B (a reshape, which
copies only when merged dimensions cannot share one stride: rank > 4 with mixed broadcasting).
The same arithmetic serves numpy arrays (np.broadcast_to) and torch tensors (Tensor.expand, under
autograd, which sums the gradient back over the broadcast dimensions).

    >>> layout((2, 8, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3), mask=(2, 1, 1, 7)).mask
    (2, 8, 5, 7)
"""
import functools
import math
from typing import NamedTuple, Optional, Tuple

Shape = Tuple[int, ...]


class Layout(NamedTuple):
    batch: Shape  # the broadcast dimensions before the head dimension
    hq: int  # query heads (q's heads after broadcasting)
    hkv: int  # key/value heads: hq % hkv == 0
    nq: int
    nkv: int
    q: Shape  # [B, Hq, Nq, dk] the library reads
    k: Shape  # [B, Hkv, Nkv, dk]
    v: Shape  # [B, Hkv, Nkv, dv]
    mask: Optional[Shape]  # [B, Hq, Nq, Nkv] or None
    lead: Shape  # out's leading dimensions as the caller sees them: batch + (Hq,), or () for 2-D

    @property
    def out(self) -> Shape:
        return self.lead + (self.nq, self.v[3])

    @property
    def lse(self) -> Shape:
        return self.lead + (self.nq,)

    @property
    def empty(self) -> bool:
        """No work: out has no element, or there is no key (out 0, lse -inf). dk = 0 is not empty."""
        return 0 in (self.q[0], self.hq, self.nq, self.nkv, self.v[3])


def _split(shape: Shape) -> Tuple[Shape, Optional[int]]:
    """(dimensions before the head dimension, heads or None) of an operand [..., H, N, d]."""
    if len(shape) < 3:
        return (), None
    return tuple(shape[:-3]), shape[-3]


def _broadcast(names: str, *shapes: Shape) -> Shape:
    """NumPy/PyTorch broadcasting of `shapes`; ValueError naming the operands if they clash."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            shown = ", ".join(str(list(s)) for s in shapes)
            raise ValueError(f"{names}: leading dimensions {shown} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def layout(q: Shape, k: Shape, v: Shape, mask: Optional[Shape] = None, gqa: bool = True,
           mask_name: str = "mask") -> Layout:
    """The Layout of q, k, v (and mask) shapes, or ValueError naming what does not fit (the mask by
    mask_name, the caller's name for it).

    Computed once per combination of shapes (a model calls with the same few, and working it out
    took 10-25 µs of a step's Python).

    gqa=True: k and v may have fewer heads than q when they divide Hq (attnscale's rule, and
    PyTorch's enable_gqa=True). gqa=False: heads broadcast as any other dimension (PyTorch's
    default), so only Hkv == Hq or one of them 1. Last-two-dimension mismatches (dk, Nkv) are left to
    the library, which names them (check_rows, where the library has nothing to compute). A mask of
    rank 0 or 1 broadcasts as in PyTorch: [Nkv] is [1, Nkv].
    """
    return _layout(tuple(q), tuple(k), tuple(v), None if mask is None else tuple(mask), bool(gqa), mask_name)


def check_rows(q: Shape, k: Shape, v: Shape):
    """The library's checks of the last two dimensions, with its messages, for a call it does not
    see (an empty one): q's dk is k's, and k and v have as many keys."""
    if q[-1] != k[-1]:
        raise ValueError(f"k: last dimension dk = {k[-1]} must equal q's dk = {q[-1]} (q {list(q)}, k {list(k)})")
    if k[-2] != v[-2]:
        raise ValueError(f"v: heads and keys must match k's (k {list(k)}, v {list(v)})")


@functools.lru_cache(maxsize=256)
def _layout(q: Shape, k: Shape, v: Shape, mask: Optional[Shape], gqa: bool, mask_name: str) -> Layout:
    for name, s in (("q", q), ("k", k), ("v", v)):
        if len(s) < 2:
            raise ValueError(f"{name}: expected [..., N, d], got rank {len(s)} {list(s)}")
    (qb, hq), (kb, hk), (vb, hv) = _split(q), _split(k), _split(v)
    leading = [qb, kb, vb]
    given = mask
    if mask is not None:
        mask = (1,) * (2 - len(mask)) + mask  # rank 0 or 1: PyTorch's broadcasting prepends dimensions
        mb, hm = _split(mask)
        leading.append(mb)
    else:
        hm = None
    batch = _broadcast("q, k, v" + (f", {mask_name}" if mask is not None else ""), *leading)
    one = lambda h: 1 if h is None else h
    hkv = _broadcast("k, v", (one(hk),), (one(hv),))[0]
    hq = one(hq)
    if gqa and hq > 1 and hkv > 1 and hq % hkv:  # the library's message, which a 4-D call gets
        raise ValueError(f"k: query heads Hq = {hq} must be a multiple of key/value heads Hkv = {hkv} "
                         f"(q {list(q)}, k {list(k)})")
    if not (gqa and hkv and hq % hkv == 0):
        hq = _broadcast("q, k", (hq,), (hkv,))[0]
        hkv = hq if hkv != 1 else 1
    if hm not in (None, 1, hq) and hq == 1 and hkv == 1:
        hq = hm  # only the mask has heads: q (and k, v through GQA) broadcast to them
    nq, nkv = q[-2], k[-2]
    ranked = any(len(s) > 2 for s in (q, k, v) + (() if mask is None else (mask,)))
    lead = batch + (hq,) if ranked else ()
    if mask is not None:
        heads_fit = mask[-3:-2] in ((), (1,), (hq,))
        if mask[-2] not in (1, nq) or mask[-1] not in (1, nkv) or not heads_fit:
            raise ValueError(f"{mask_name}: shape {list(given)} does not broadcast to {list(lead + (nq, nkv))}")
    b = math.prod(batch)
    return Layout(
        lead=lead,
        batch=batch,
        hq=hq,
        hkv=hkv,
        nq=nq,
        nkv=nkv,
        q=(b, hq, nq, q[-1]),
        k=(b, hkv, k[-2], k[-1]),
        v=(b, hkv, v[-2], v[-1]),
        mask=None if mask is None else (b, hq, nq, nkv),
    )


def fold(x, shape4: Shape, batch: Shape, expand):
    """x broadcast to batch + shape4[1:] by `expand(x, shape)`, then merged to shape4 (x itself
    when it has that shape already)."""
    if tuple(x.shape) == tuple(shape4):
        return x
    return expand(x, tuple(batch) + tuple(shape4[1:])).reshape(shape4)


def unfold_sum(grad, original: Shape, batch: Shape, total):
    """The gradient of fold(): grad [B, H, N, d] summed back onto an operand of shape `original`.

    `total(x, axes)` sums x over `axes` keeping them (numpy: x.sum(axis=axes, keepdims=True)).
    """
    full = tuple(batch) + tuple(grad.shape[1:])
    grad = grad.reshape(full)
    padded = (1,) * (len(full) - len(original)) + tuple(original)
    axes = tuple(d for d, (g, o) in enumerate(zip(full, padded)) if o == 1 and g != 1)
    if axes:
        grad = total(grad, axes)
    return grad.reshape(original)
