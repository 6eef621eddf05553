"""flash_attn_with_kvcache: FlashAttention 2's inference call over a KV cache, on CPU tensors.

The cache is FlashAttention's: k_cache [batch_cache, seqlen_cache, Hkv, d] (contiguous layout) or
[num_blocks, block_size, Hkv, d] with block_table [B, max_blocks] (paged: key j of sequence b is row
j % block_size of block block_table[b][j // block_size]). New keys and values k, v [B, Nnew, Hkv, d]
are written into it in place at positions cache_seqlens[b] .. cache_seqlens[b] + Nnew - 1 (after the
rotary embedding, when given), then q [B, Nq, H, d] attends to sequence b's keys
[cache_leftpad[b], cache_seqlens[b] + Nnew), its diagonal aligned bottom-right.

How each call is computed (the same result up to float32 rounding; tests check both against a
float64 reference):
- attnscale.decode reads the cache where it lies (float32, bfloat16 or float16, either layout; a contiguous
  cache indexed by cache_batch_idx is the paged layout with one block of seqlen_cache keys per batch
  row), all of a call's query rows in one pass over the cache: q's Nq rows are decode's new tokens
  (row i at key L - Nq + i, L the sequence's keys after the update), causal or not, with left
  padding (seq_starts), windows on either side, softcap and ALiBi.
- Otherwise (a float64 cache) each
  sequence runs through attnscale.attention with FlashAttention's options (the same kernels as
  flash_attn_func), on a view of its keys for a contiguous cache (no copy) and on its blocks
  gathered for a paged one.
"""
import math
import operator

import numpy as np
import torch
from torch.overrides import handle_torch_function, has_torch_function_variadic

from . import _attnscale
from .torch_errors import drop_in_errors
from .torch_flash import _attend, _options, check_block_table, check_rank, kernel_window
from .torch_function import as_float16, cache_to_numpy
from .torch_threads import kernel_threads

_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _int_vector(name, t, n):
    """An integer tensor of n entries as a list of ints."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a 1-D integer tensor of {n} entries (one per sequence), got {got}")
    if t.shape[0] != n:
        raise ValueError(f"{name}: expected {n} entries (one per sequence), got {t.shape[0]}")
    return [int(x) for x in t.tolist()]


def _check_tensor(name, t, layout):
    """t is a CPU tensor of the dimensions `layout` names."""
    check_rank(name, t, layout)
    if t.device.type != "cpu":
        raise ValueError(f"{name}: must be a CPU tensor, got device {t.device}")


def _rotate(x, cos, sin, positions, interleaved):
    """FlashAttention's rotary embedding of x [B, N, H, d] at positions [B, N] (cos, sin [seqlen_ro,
    rotary_dim / 2]): each pair (a, b) of the first rotary_dim dimensions, (x[2k], x[2k+1]) when
    interleaved (GPT-J) and (x[k], x[k + rotary_dim/2]) otherwise (GPT-NeoX), becomes
    (a cos - b sin, b cos + a sin) with the angle of its position and k; computed in float32 (float64
    for float64 x), rounded to x's dtype."""
    half = cos.shape[1]
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = cos.to(work)[positions].unsqueeze(2)  # [B, N, 1, half]
    s = sin.to(work)[positions].unsqueeze(2)
    y = x.to(work)
    if interleaved:
        a, b = y[..., 0 : 2 * half : 2], y[..., 1 : 2 * half : 2]
        rot = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    else:
        a, b = y[..., :half], y[..., half : 2 * half]
        rot = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    return torch.cat((rot, y[..., 2 * half :]), dim=-1).to(x.dtype)


class _Cache:
    """Where sequence b's key j lives: (row of the cache's first dimension, index in the second)."""

    def __init__(self, k_cache, block_table, batch_idx, B):
        self.paged = block_table is not None
        self.rows = k_cache.shape[0]
        # Sequence b in batch row b of a contiguous cache (no cache_batch_idx): rows 0..B-1, which
        # the cache's shape was checked to hold.
        self.identity = not self.paged and batch_idx is None
        self.block = k_cache.shape[1]
        if self.paged:
            check_block_table(block_table, B)
            self._table = block_table.to(torch.int64)
            self.capacity = self.block * block_table.shape[1]
        else:
            self._table = None if batch_idx is None else batch_idx.to(torch.int64)[:, None]
            self._B = B
            self.capacity = self.block

    @property
    def table(self):
        """[B, blocks]: the cache row of each block of each sequence (a contiguous cache: one block of
        seqlen_cache keys per sequence; rows 0..B-1 unless cache_batch_idx chose them), made when first
        asked for: the identity's one-token call reads the cache through views and needs none."""
        if self._table is None:
            self._table = torch.arange(self._B)[:, None]
        return self._table

    def check_blocks(self, lengths):
        """The table entries that hold sequence b's first lengths[b] keys name blocks of the cache."""
        if self.identity:
            return
        # The whole table at once (a few tensor operations for any batch, not a few per sequence).
        table = self.table
        used = torch.arange(table.shape[1])[None, :] < ((torch.tensor(lengths) + self.block - 1) // self.block)[:, None]
        bad = (((table < 0) | (table >= self.rows)) & used).nonzero()
        if len(bad):
            b, i = (int(x) for x in bad[0])  # the first in row-major order, as a loop over b, then i
            name = "block_table" if self.paged else "cache_batch_idx"
            where = f"[{b}][{i}]" if self.paged else f"[{b}]"
            raise ValueError(f"{name}{where} = {int(table[b, i])}: outside 0..{self.rows - 1}, the cache's rows")

    def locate(self, positions, seqs=None):
        """(rows, indices) of the keys at positions [n, N] (each < the capacity) of sequences seqs
        [n] (default 0..n-1)."""
        seqs = torch.arange(positions.shape[0]) if seqs is None else seqs
        return self.table[seqs[:, None].expand_as(positions), positions // self.block], positions % self.block


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False)

    A drop-in for FlashAttention 2's flash_attn_with_kvcache (incremental decoding) on CPU tensors:
    q and the cache float32, bfloat16 or float16 (a float16 cache read as stored, products and sums
    in float32, out returned as float16; float64 through the general kernels).

    q [B, Nq, H, d]. k_cache, v_cache [batch_cache, seqlen_cache, Hkv, d] (Hkv dividing H: GQA), or
    with block_table [B, max_blocks] (int) a paged cache [num_blocks, block_size, Hkv, d] (any
    block_size). cache_seqlens: int or [B] ints, the keys each sequence holds (default: all
    seqlen_cache). k, v [B, Nnew, Hkv, d] (optional, both or neither): written into the cache in
    place at positions cache_seqlens[b] + t, then attended to. rotary_cos, rotary_sin [seqlen_ro,
    rotary_dim / 2] (with k and v only): k rotated at those positions, q at cache_seqlens[b] + i when
    causal or windowed, else all at cache_seqlens[b]; rotary_interleaved pairs dimensions (0, 1),
    (2, 3), .. (GPT-J) or (k, k + rotary_dim/2) (GPT-NeoX). cache_batch_idx [B]: the cache row of
    each sequence (contiguous cache only). cache_leftpad [B]: the first key of each sequence (keys
    before it are not attended to). softmax_scale, causal, window_size, softcap and alibi_slopes as
    in flash_attn_func, with sequence b's diagonal at its last key: query i at key position
    L_b - Nq + i, L_b = cache_seqlens[b] + Nnew - cache_leftpad[b] keys; a window side of seqlen_k
    or more (seqlen_cache; paged: max_blocks * block_size) is -1, as FlashAttention sets it (for
    q's rotary positions too), and a left side alone gets seqlen_k on its right (kernel_window).
    num_splits: accepted; the keys are split by the kernels' own fixed chunks (the result does not
    depend on the thread count).

    Returns out [B, Nq, H, d] in q's dtype; with return_softmax_lse, (out, softmax_lse [B, H, Nq]
    float32, float64 for float64 q). A row with no visible key gives out 0 and softmax_lse +inf (a
    cache of seqlen 0 too; B = 0 is refused, as by FlashAttention). No gradient (as
    FlashAttention's: inference only).

    Example (a paged cache of 4 blocks of 16 keys; one new token for each of 2 sequences):
        >>> import torch, attnscale.torch as at
        >>> kc, vc = torch.zeros(4, 16, 2, 64), torch.zeros(4, 16, 2, 64)
        >>> table = torch.tensor([[0, 1], [3, 2]], dtype=torch.int32)
        >>> lens = torch.tensor([20, 5], dtype=torch.int32)       # keys already cached
        >>> q, k, v = torch.randn(2, 1, 8, 64), torch.randn(2, 1, 2, 64), torch.randn(2, 1, 2, 64)
        >>> out = at.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table)
        >>> out.shape, bool(kc[1, 4].eq(k[0, 0]).all())           # key 20 of sequence 0: block 1, row 4
        (torch.Size([2, 1, 8, 64]), True)
    """
    if has_torch_function_variadic(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                   cache_leftpad, block_table, alibi_slopes):
        relevant = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                    block_table, alibi_slopes)
        return handle_torch_function(
            flash_attn_with_kvcache, relevant, q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos,
            rotary_sin=rotary_sin, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
            cache_leftpad=cache_leftpad, block_table=block_table, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, rotary_interleaved=rotary_interleaved,
            alibi_slopes=alibi_slopes, num_splits=num_splits, return_softmax_lse=return_softmax_lse)
    return _flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                                    rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse)


@drop_in_errors
def _flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                             cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                             rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse):
    _check_tensor("q", q, "[batch, seqlen, heads, headdim]")
    layout = "[num_blocks, block_size, heads_k, headdim]" if block_table is not None else "[batch, seqlen, heads_k, headdim]"
    _check_tensor("k_cache", k_cache, layout)
    _check_tensor("v_cache", v_cache, layout)
    B, Nq, H, d = q.shape
    Hkv = k_cache.shape[2]
    if B == 0:
        raise ValueError(f"q: batch size must be positive (as in FlashAttention), got q {list(q.shape)}")
    if d == 0:
        raise ValueError(f"q: headdim must be positive, got q {list(q.shape)}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"v_cache: expected shape {list(k_cache.shape[:3])} + [headdim], got {list(v_cache.shape)}")
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache: headdim {k_cache.shape[3]} differs from q's {d}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"k_cache: {Hkv} KV heads do not divide q's {H} heads")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
        if t.dtype not in _CACHE_DTYPES:
            raise TypeError(f"{name}: dtype must be float32, bfloat16, float16 or float64, got {t.dtype}")
    if q.dtype not in _CACHE_DTYPES:
        raise TypeError(f"q: dtype must be float32, bfloat16, float16 or float64 (the cache's), got {q.dtype}")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise TypeError(f"q, k_cache, v_cache: expected one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    dv = v_cache.shape[3]
    if dv == 0:
        raise ValueError(f"v_cache: headdim must be positive, got v_cache {list(v_cache.shape)}")
    if block_table is not None and cache_batch_idx is not None:
        raise ValueError("cache_batch_idx: not supported with a paged cache (block_table)")
    if cache_batch_idx is None:
        if block_table is None and k_cache.shape[0] < B:
            raise ValueError(f"k_cache: {k_cache.shape[0]} batch rows for {B} sequences (pass cache_batch_idx to choose them)")
        batch_idx = None
    else:
        batch_idx = torch.tensor(_int_vector("cache_batch_idx", cache_batch_idx, B))
    cache = _Cache(k_cache, block_table, batch_idx, B)

    if isinstance(cache_seqlens, bool) or not (cache_seqlens is None or isinstance(cache_seqlens, (int, torch.Tensor))):
        raise ValueError(f"cache_seqlens: expected an int or a [{B}] integer tensor, got {type(cache_seqlens).__name__}")
    if cache_seqlens is None:
        if block_table is not None:
            raise ValueError("cache_seqlens: required with a paged cache (block_table)")
        seqlens = [cache.capacity] * B
    elif isinstance(cache_seqlens, int):
        seqlens = [cache_seqlens] * B
    else:
        seqlens = _int_vector("cache_seqlens", cache_seqlens, B)
    if (k is None) != (v is None):
        raise ValueError("k, v: pass both new keys and new values, or neither")
    n_new = 0
    if k is not None:
        if cache_seqlens is None:
            raise ValueError("cache_seqlens: required with new keys k, v (where they go in the cache)")
        _check_tensor("k", k, "[batch, seqlen_new, heads_k, headdim]")
        _check_tensor("v", v, "[batch, seqlen_new, heads_k, headdim]")
        for name, t in (("k", k), ("v", v)):
            # Another float dtype is rounded to the cache's (FlashAttention asks for q's); integers and
            # bools, which FlashAttention refuses too, would be written as numbers.
            if not t.dtype.is_floating_point:
                raise TypeError(f"{name}: dtype must be a float dtype (written as the cache's {k_cache.dtype}), got {t.dtype}")
        n_new = k.shape[1]
        if list(k.shape) != [B, n_new, Hkv, d] or list(v.shape) != [B, n_new, Hkv, dv]:
            raise ValueError(f"k, v: expected [{B}, seqlen_new, {Hkv}, {d}] and [{B}, seqlen_new, {Hkv}, {dv}], got "
                             f"{list(k.shape)} and {list(v.shape)}")
    for b, n in enumerate(seqlens):
        if n < 0 or n + n_new > cache.capacity:
            room = "" if not n_new else f" plus {n_new} new keys"
            raise ValueError(f"cache_seqlens[{b}] = {n}{room}: outside 0..{cache.capacity}, the keys the cache holds for a sequence")
    lengths = [n + n_new for n in seqlens]  # keys after the update
    starts = [0] * B if cache_leftpad is None else _int_vector("cache_leftpad", cache_leftpad, B)
    for b, (s, n) in enumerate(zip(starts, lengths)):
        if not 0 <= s <= n:
            raise ValueError(f"cache_leftpad[{b}] = {s}: outside 0..{n}, the sequence's keys")
    cache.check_blocks(lengths)
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary:
        if k is None:
            raise ValueError("rotary_cos, rotary_sin: apply only with new keys k, v")
        if not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (rotary_cos, rotary_sin)) or (
            rotary_cos.shape != rotary_sin.shape
        ):
            raise ValueError("rotary_cos, rotary_sin: expected two [seqlen_ro, rotary_dim / 2] tensors of one shape")
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if not t.dtype.is_floating_point:
                raise TypeError(f"{name}: dtype must be a float dtype, got {t.dtype}")
        if 2 * rotary_cos.shape[1] > d:
            raise ValueError(f"rotary_cos: rotary_dim {2 * rotary_cos.shape[1]} exceeds headdim {d}")
    try:
        splits = operator.index(num_splits)  # numpy's integers too, as FlashAttention's binding takes them
    except TypeError:
        splits = None
    if splits is None or splits < 0:
        raise ValueError(f"num_splits: expected an int >= 0, got {num_splits!r}")
    # FlashAttention's mha_fwd_kvcache first turns a window side that reaches the cache's seqlen_k
    # (seqlen_cache; paged: max_blocks * block_size) into -1: such a window is no window, also where
    # the rotary embedding puts q's rows (kernel_window, as flash_attn_func's).
    left, right = kernel_window(window_size, causal, cache.capacity)
    options = _options(softmax_scale, causal, (left, right), softcap, alibi_slopes, H, 0.0)
    if alibi_slopes is not None and alibi_slopes.dim() == 2 and alibi_slopes.shape[0] != B:
        raise ValueError(f"alibi_slopes: expected ({H},) or ({B}, {H}), got {list(alibi_slopes.shape)}")
    if k is not None:
        positions = torch.tensor(seqlens)[:, None] + torch.arange(n_new)[None, :]  # [B, Nnew]
        if rotary:
            # q's rows sit at cache_seqlens + i when causal or windowed (after the normalisation
            # above), else all at cache_seqlens.
            local = causal or left >= 0 or right >= 0
            qpos = torch.tensor(seqlens)[:, None] + (torch.arange(Nq) if local else torch.zeros(Nq, dtype=torch.long))[None, :]
            last = max([int(t.max()) for t in (positions, qpos) if t.numel()], default=0)
            if last >= rotary_cos.shape[0]:
                raise ValueError(f"rotary_cos: {rotary_cos.shape[0]} positions (rows), the keys and queries reach position {last}")

    with torch.no_grad():
        q = q.detach()
        if k is not None:
            if rotary:
                k = _rotate(k, rotary_cos, rotary_sin, positions, rotary_interleaved)
                q = _rotate(q, rotary_cos, rotary_sin, qpos, rotary_interleaved)
            rows, idx = cache.locate(positions)
            k_cache[rows, idx] = k.to(k_cache.dtype)
            v_cache[rows, idx] = v.to(v_cache.dtype)
        if q.numel() == 0 or k_cache.numel() == 0:
            # No query row, or a cache of no key (seqlen_cache 0, or no block): nothing for the
            # kernels to read; each row sees no key.
            out, lse = q.new_zeros(B, Nq, H, dv), torch.full((B, H, Nq), -math.inf)
        elif k_cache.dtype in (torch.float32, torch.bfloat16, torch.float16):
            # decode's rows see keys up to their own (causal, or a right window of 0), right keys
            # past it or to the end.
            out, lse = _decode(q, k_cache, v_cache, cache, starts, lengths, options, causal or right == 0, left, right)
        else:
            out, lse = _per_sequence(q, k_cache, v_cache, cache, starts, lengths, options, alibi_slopes)
    out = as_float16(out) if q.dtype == torch.float16 and out.dtype == torch.float32 else out.to(q.dtype).contiguous()
    if not return_softmax_lse:
        return out
    lse = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32).masked_fill(lse == -math.inf, math.inf)
    return out, lse


def _decode_views(k_cache, v_cache, cache, B):
    """(k, v, block_table) for attnscale.decode: [B, Hkv, seqlen, d] views of a contiguous cache
    whose sequences are its first B rows; else the paged layout (a contiguous cache as blocks of
    seqlen_cache keys, one per batch row, picked by cache_batch_idx)."""
    if cache.identity:
        if k_cache.shape[0] != B:  # (a slice of every row would cost a one-token call a few µs)
            k_cache, v_cache = k_cache[:B], v_cache[:B]
        return (cache_to_numpy("k_cache", k_cache.transpose(1, 2)),
                cache_to_numpy("v_cache", v_cache.transpose(1, 2)), None)
    table = cache.table.to(torch.int32).contiguous().numpy()
    return cache_to_numpy("k_cache", k_cache), cache_to_numpy("v_cache", v_cache), table


def _decode(q, k_cache, v_cache, cache, starts, lengths, options, causal, left, right):
    """(out [B, Nq, H, dv], lse [B, H, Nq], -inf for a row without keys) through attnscale.decode
    (module docstring)."""
    B, Nq, H, d = q.shape
    dv = v_cache.shape[3]
    kd, vd, table = _decode_views(k_cache, v_cache, cache, B)
    q32 = q if q.dtype == torch.float32 else q.to(torch.float32)
    # decode's q [B, H, d] or [B, H, Nq, d]: views of q (each torch operation here costs about
    # 150 us when it runs right after a decode has streamed the cache; docs/performance.md).
    rows = q32.select(1, 0) if Nq == 1 else q32.transpose(1, 2)
    o, lse = _attnscale.decode(
        rows.numpy(), kd, vd, block_table=table, seq_lens=np.asarray(lengths, dtype=np.int32),
        seq_starts=np.asarray(starts, dtype=np.int32) if any(starts) else None, scale=options["scale"],
        window_left=left if left >= 0 else -1, causal=causal,
        window_right=right if right > 0 and not causal else -1, softcap=options["softcap"],
        alibi_slopes=options.get("alibi_slopes"), threads=kernel_threads(), return_lse=True,
    )
    if Nq == 1:  # [B, H, dv] is [B, 1, H, dv], in FlashAttention's order already
        return torch.from_numpy(o.reshape(B, 1, H, dv)), torch.from_numpy(lse.reshape(B, H, 1))
    return torch.from_numpy(o).transpose(1, 2), torch.from_numpy(lse)


def _per_sequence(q, k_cache, v_cache, cache, starts, lengths, options, alibi_slopes):
    """(out [B, Nq, H, dv], lse [B, H, Nq], +inf for a row without keys) with attnscale.attention per
    sequence (module docstring)."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = lengths[b] - starts[b]
        if cache.paged:
            pos = torch.arange(starts[b], lengths[b])[None, :]
            blocks, idx = cache.locate(pos, torch.tensor([b]))
            kb, vb = k_cache[blocks[0], idx[0]], v_cache[blocks[0], idx[0]]  # [n, Hkv, d], gathered
        else:
            row = int(cache.table[b, 0])
            kb, vb = k_cache[row, starts[b] : lengths[b]], v_cache[row, starts[b] : lengths[b]]  # views
        opts = dict(options)
        if alibi_slopes is not None and alibi_slopes.dim() == 2:
            opts["alibi_slopes"] = options["alibi_slopes"][b]
        if n == 0:  # no key: out 0, lse +inf (FlashAttention's, as _attend gives it)
            outs.append(torch.zeros(1, q.shape[1], q.shape[2], v_cache.shape[3], dtype=q.dtype))
            lses.append(torch.full((1, q.shape[2], q.shape[1]), math.inf))
            continue
        out, lse, _ = _attend(q[b : b + 1], kb[None], vb[None], opts)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)
