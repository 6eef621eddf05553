"""attnscale.torch.flash_attn_func / flash_attn_varlen_func against FlashAttention's semantics in float64."""
import math
import re

import numpy as np
import pytest
import torch

import attnscale
import attnscale.torch as at
import torch_reference


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(31337)


def randn(gen, *shape, dtype=torch.float64, grad=False):
    return torch.randn(*shape, dtype=dtype, generator=gen).requires_grad_(grad)


# (B, Nq, Nkv, H, Hkv, d, dv, options): Nq < Nkv (a cache), Nq > Nkv (first rows see no key under a
# bottom-right causal mask), windows, ALiBi per head and per (batch, head), GQA, awkward sizes.
CASES = [
    (1, 1, 1, 1, 1, 1, 1, {}),
    (2, 7, 13, 4, 2, 8, 5, dict(causal=True)),
    (2, 13, 7, 3, 3, 8, 8, dict(causal=True, softmax_scale=0.5)),
    (1, 17, 17, 6, 1, 16, 16, dict(window_size=(3, 2))),
    (2, 9, 11, 4, 4, 8, 8, dict(window_size=(4, -1), causal=True)),
    (2, 5, 19, 4, 2, 8, 8, dict(alibi_slopes="per-head")),
    (3, 11, 11, 2, 1, 4, 4, dict(alibi_slopes="per-batch", causal=True)),
    (2, 6, 9, 4, 2, 8, 8, dict(softcap=0.8, softmax_scale=1.0)),
    (1, 10, 10, 2, 2, 8, 3, dict(softcap=2.0, alibi_slopes="per-head", window_size=(3, 3))),
]


def operands(gen, case, dtype=torch.float64, grad=False):
    B, nq, nkv, h, hkv, d, dv, _ = case
    return randn(gen, B, nq, h, d, dtype=dtype, grad=grad), randn(gen, B, nkv, hkv, d, dtype=dtype, grad=grad), randn(
        gen, B, nkv, hkv, dv, dtype=dtype, grad=grad
    )


@pytest.mark.parametrize("case", CASES, ids=[str(c[:7]) for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_flash_attention_semantics(gen, case, dtype):
    q, k, v = operands(gen, case, dtype)
    opts = torch_reference.case_options(gen, case)
    out, lse, probs = at.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    want, want_lse, want_probs = torch_reference.flash(q, k, v, probs=True, **opts)
    assert out.shape == want.shape and out.dtype == dtype and out.is_contiguous() and probs.shape == want_probs.shape
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), want_lse, rtol=tol, atol=tol)
    torch.testing.assert_close(probs.double(), want_probs, rtol=tol, atol=tol)  # no dropout: no negated entries


@pytest.mark.parametrize("case", CASES[1:], ids=[str(c[:7]) for c in CASES[1:]])
def test_gradcheck(gen, case):
    small = (case[0], min(case[1], 4), min(case[2], 5), case[3], case[4], 3, 2, case[7])
    q, k, v = operands(gen, small, grad=True)
    opts = torch_reference.case_options(gen, small)
    assert torch.autograd.gradcheck(lambda q, k, v: at.flash_attn_func(q, k, v, **opts), (q, k, v))


def test_bfloat16(gen):
    case = (2, 33, 40, 4, 2, 64, 64, dict(causal=True))
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in operands(gen, case))
    out = at.flash_attn_func(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    want, _ = torch_reference.flash(q.detach(), k.detach(), v.detach(), causal=True)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-2)
    out.float().square().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


@pytest.mark.parametrize("varlen", [False, True])
def test_float16_is_float32_rounded_back(gen, varlen):
    # FlashAttention's usual dtype: computed as the float32 of the same values, out and gradients
    # returned as float16, softmax_lse float32.
    case = (2, 9, 12, 4, 2, 16, 16, dict(causal=True))
    q, k, v = (t.to(torch.float16) for t in operands(gen, case))
    if varlen:
        lens = torch.tensor([0, 9, 18], dtype=torch.int32), torch.tensor([0, 12, 24], dtype=torch.int32)
        f = lambda q, k, v: at.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), *lens, 9, 12,
                                                      causal=True, return_attn_probs=True)
    else:
        f = lambda q, k, v: at.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    half = [t.clone().requires_grad_() for t in (q, k, v)]
    single = [t.float().requires_grad_() for t in (q, k, v)]
    out, lse, _ = f(*half)
    want, want_lse, _ = f(*single)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert torch.equal(out, want.half()) and torch.equal(lse, want_lse)
    dout = torch.randn(out.shape, generator=gen).to(torch.float16)
    out.backward(dout)
    want.backward(dout.float())
    for h, s in zip(half, single):
        assert h.grad.dtype == torch.float16 and torch.equal(h.grad, s.grad.half())


def test_inputs_are_read_in_place_with_alibi(gen):
    case = (2, 9, 12, 4, 2, 8, 8, {})
    q, k, v = operands(gen, case, grad=True)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    before = attnscale._attnscale._copy_count()
    out = at.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    out.sum().backward()
    assert attnscale._attnscale._copy_count() == before
    torch.testing.assert_close(out, torch_reference.flash(q, k, v, causal=True, alibi_slopes=slopes)[0])


def varlen_operands(gen, lengths_q, lengths_k, h=4, hkv=2, d=8, grad=False):
    cu = lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0)), dtype=torch.int32)
    q = randn(gen, sum(lengths_q), h, d, grad=grad)
    k, v = randn(gen, sum(lengths_k), hkv, d, grad=grad), randn(gen, sum(lengths_k), hkv, d, grad=grad)
    return q, k, v, cu(lengths_q), cu(lengths_k)


@pytest.mark.parametrize("opts", [dict(causal=True), dict(window_size=(2, 1)), dict(alibi_slopes="per-batch")])
def test_varlen_equals_a_loop_over_the_sequences(gen, opts):
    lq, lk = [3, 1, 7, 0, 5], [3, 4, 9, 2, 5]
    q, k, v, cq, ck = varlen_operands(gen, lq, lk)
    if opts.get("alibi_slopes") == "per-batch":
        opts = dict(alibi_slopes=torch.rand(len(lq), 4, generator=gen))
    out, lse, probs = at.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), return_attn_probs=True, **opts)
    assert out.shape == q.shape and lse.shape == (4, sum(lq)) and probs.shape == (len(lq), 4, max(lq), max(lk))
    for b in range(len(lq)):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        per = dict(opts, alibi_slopes=opts["alibi_slopes"][b : b + 1]) if "alibi_slopes" in opts else opts
        want, want_lse, want_probs = torch_reference.flash(q[None, rows], k[None, keys], v[None, keys], probs=True, **per)
        torch.testing.assert_close(out[rows], want[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, rows], want_lse[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(probs[b, :, : lq[b], : lk[b]], want_probs[0], rtol=1e-12, atol=1e-12)
        assert (probs[b, :, lq[b] :] == 0).all() and (probs[b, :, :, lk[b] :] == 0).all()


# (window_size, the window FlashAttention's kernels apply) for seqlen_k = 3: mha_fwd sets a side of
# seqlen_k or more to -1, and set_params_fprop gives a left side alone seqlen_k on its right.
KERNEL_WINDOWS = [((-1, 3), (-1, -1)), ((3, 3), (-1, -1)), ((-1, 5), (-1, -1)), ((1, -1), (1, 3)), ((2, 1), (2, 1))]


@pytest.mark.parametrize("window,applied", KERNEL_WINDOWS, ids=[str(w) for w, _ in KERNEL_WINDOWS])
def test_windows_are_those_flash_attention_kernels_apply(gen, window, applied):
    """Where a query row sits more than seqlen_k keys before the last key (Nq > Nkv + 1) the window
    FlashAttention applies is not its docstring's formula on window_size: (-1, Nkv) shows every key
    to every row, (1, -1) none to the first rows."""
    q, k, v = operands(gen, (2, 10, 3, 4, 2, 8, 8, {}))
    out, lse, probs = at.flash_attn_func(q, k, v, window_size=window, return_attn_probs=True)
    want, want_lse, want_probs = torch_reference.flash(q, k, v, window_size=applied, probs=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(probs, want_probs, rtol=1e-12, atol=1e-12)
    # Packed sequences take max_seqlen_k (here 3, the longest) as seqlen_k, for every sequence.
    lq, lk = [10, 2], [3, 2]
    qp, kp, vp, cq, ck = varlen_operands(gen, lq, lk)
    out = at.flash_attn_varlen_func(qp, kp, vp, cq, ck, 10, 3, window_size=window)
    for b in range(2):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        want, _ = torch_reference.flash(qp[None, rows], kp[None, keys], vp[None, keys], window_size=applied)
        torch.testing.assert_close(out[rows], want[0], rtol=1e-12, atol=1e-12)


def test_a_softcap_of_zero_or_less_is_off(gen):
    # FlashAttention's docstring: "softcap: float. <= 0.0 means deactivate" (a negative one too).
    q, k, v = operands(gen, (2, 5, 7, 4, 2, 8, 8, {}))
    want = at.flash_attn_func(q, k, v, causal=True)
    for cap in (-1.0, -0.0, -1e30):
        assert torch.equal(at.flash_attn_func(q, k, v, causal=True, softcap=cap), want)
    kc, vc = k.clone(), v.clone()
    want = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5)
    assert torch.equal(at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5, softcap=-2.0), want)


def test_slopes_and_offsets_changed_after_the_forward_leave_its_gradients_alone(gen):
    # The backward reads copies of the alibi slopes and cu_seqlens the forward used (float64 and
    # int64 tensors that a conversion would otherwise share).
    q, k, v, cq, ck = varlen_operands(gen, [2, 3], [4, 2], grad=True)
    cq, ck = cq.long(), ck.long()
    slopes = torch.rand(2, 4, dtype=torch.float64, generator=gen)
    f = lambda: at.flash_attn_varlen_func(q, k, v, cq, ck, 3, 4, causal=True, alibi_slopes=slopes)
    want = torch.autograd.grad(f().square().sum(), (q, k, v))
    out = f()
    slopes.mul_(5)
    cq.copy_(torch.tensor([0, 3, 5]))
    ck.copy_(torch.tensor([0, 1, 6]))
    for g, w in zip(torch.autograd.grad(out.square().sum(), (q, k, v)), want):
        assert torch.equal(g, w)


def test_varlen_gradcheck_and_empty_key_sets(gen):
    q, k, v, cq, ck = varlen_operands(gen, [2, 3, 1], [3, 0, 2], h=2, hkv=1, d=3, grad=True)
    f = lambda q, k, v: at.flash_attn_varlen_func(q, k, v, cq, ck, 3, 3, causal=True)
    assert torch.autograd.gradcheck(f, (q, k, v))
    out = f(q, k, v)
    assert (out[2:5] == 0).all()  # the second sequence has no key


def test_varlen_paged_keys_equal_packed_ones_with_gradients(gen):
    """block_table: k, v a paged cache [num_blocks, block_size, Hkv, d]; the same keys packed give
    the same bits, and the cache rows get the packed rows' gradients (unused rows none)."""
    lq, lk, size = [3, 1, 6], [5, 0, 11], 4
    q, k, v, cq, ck = varlen_operands(gen, lq, lk, grad=True)
    table = torch.tensor([[6, 1, -1], [-1, -1, -1], [0, 5, 3]], dtype=torch.int32)  # -1: never read
    kc = torch.zeros(7, size, *k.shape[1:], dtype=k.dtype)
    vc = torch.zeros(7, size, *v.shape[1:], dtype=v.dtype)
    for b in range(3):
        for j in range(lk[b]):
            kc[table[b, j // size], j % size] = k[ck[b] + j].detach()
            vc[table[b, j // size], j % size] = v[ck[b] + j].detach()
    kc.requires_grad_(), vc.requires_grad_()
    want = at.flash_attn_varlen_func(q, k, v, cq, ck, 6, 11, causal=True)
    got = at.flash_attn_varlen_func(q, kc, vc, cq, ck, 6, 11, causal=True, block_table=table)
    assert torch.equal(got, want)
    dout = torch.randn(want.shape, dtype=want.dtype, generator=gen)
    gk, gv = torch.autograd.grad(want, (k, v), dout)
    gkc, gvc = torch.autograd.grad(got, (kc, vc), dout)
    used = torch.zeros(7, size, dtype=torch.bool)
    for b in range(3):
        for j in range(lk[b]):
            assert torch.equal(gkc[table[b, j // size], j % size], gk[ck[b] + j])
            assert torch.equal(gvc[table[b, j // size], j % size], gv[ck[b] + j])
            used[table[b, j // size], j % size] = True
    assert (gkc[~used] == 0).all() and (gvc[~used] == 0).all()  # rows no sequence uses get nothing
    with pytest.raises(ValueError, match=r"^block_table\[2\]\[1\] = 9: outside 0..6, the cache's blocks$"):
        bad = table.clone()
        bad[2, 1] = 9
        at.flash_attn_varlen_func(q, kc, vc, cq, ck, 6, 11, block_table=bad)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: sequence 2 has 11 keys, more than its 2 blocks of 4 hold$"):
        at.flash_attn_varlen_func(q, kc, vc, cq, ck, 6, 11, block_table=table[:, :2])
    with pytest.raises(ValueError, match=r"^block_table: expected an integer tensor \[3, max_blocks\]"):
        at.flash_attn_varlen_func(q, kc, vc, cq, ck, 6, 11, block_table=table[:2])
    with pytest.raises(ValueError, match=r"^k: expected a \[num_blocks, block_size, heads_k, headdim\] tensor"):
        at.flash_attn_varlen_func(q, k, v, cq, ck, 6, 11, block_table=table)


def test_errors(gen):
    q, k, v, cq, ck = varlen_operands(gen, [2, 3], [2, 3])
    with pytest.raises(ValueError, match=r"^max_seqlen_q: 2 is shorter than a sequence of cu_seqlens_q \(3\)$"):
        at.flash_attn_varlen_func(q, k, v, cq, ck, 2, 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected non-decreasing offsets from 0 to 5"):
        at.flash_attn_varlen_func(q, k, v, cq, torch.tensor([0, 3, 2], dtype=torch.int32), 3, 3)
    with pytest.raises(ValueError, match=r"^q: expected a \[batch, seqlen, heads, headdim\] tensor, got \[5, 4, 8\]$"):
        at.flash_attn_func(q, k, v)
    qb, kb, vb = q[None], k[None], v[None]
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected a tensor of shape \(4,\) or \(batch, 4\)"):
        at.flash_attn_func(qb, kb, vb, alibi_slopes=torch.ones(3))
    # FlashAttention asks float32 slopes ("ALiBi slopes must have dtype fp32"): integers are refused
    # by name, not read as numbers (other float dtypes are taken).
    for dtype in (torch.int64, torch.bool):
        with pytest.raises(TypeError, match=rf"^alibi_slopes: dtype must be float32 \(or another float dtype\), got {dtype}$"):
            at.flash_attn_func(qb, kb, vb, alibi_slopes=torch.ones(4, dtype=dtype))
        with pytest.raises(RuntimeError, match="alibi_slopes: dtype"):
            at.flash_attn_varlen_func(q, k, v, cq, ck, 3, 3, alibi_slopes=torch.ones(4, dtype=dtype))
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'casual'"):
        at.flash_attn_func(qb, kb, vb, casual=True)
    assert at.flash_attn_func(qb, kb, vb, deterministic=True).shape == qb.shape
    empty_rows = at.flash_attn_func(qb[:, :4], kb[:, :2], vb[:, :2], causal=True, return_attn_probs=True)[1]
    assert (empty_rows[..., :2] == math.inf).all() and torch.isfinite(empty_rows[..., 2:]).all()


def test_errors_name_the_arguments_in_flash_attention_s_layout(gen):
    """Shapes are shown as the caller passed them ([B, N, H, d], packed [total, H, d]), options
    under FlashAttention's names; window_size takes ints only (1.7 is not cut to 1)."""
    q, k, v = randn(gen, 2, 5, 4, 8), randn(gen, 2, 7, 2, 8), randn(gen, 2, 7, 2, 8)
    shown = lambda q, k, v: r"\(q %s, k %s, v %s\)$" % tuple(re_list(t) for t in (q, k, v))
    bad = [
        ((q, k[:1], v[:1]), {}, ValueError, r"^k, v: batch 1 differs from q's 2 " + shown(q, k[:1], v[:1])),
        ((q, k[..., :3], v), {}, ValueError, r"^k: headdim 3 differs from q's 8 " + shown(q, k[..., :3], v)),
        ((q, k, v[:, :6]), {}, ValueError, r"^v: expected the batch, seqlen and heads of k " + shown(q, k, v[:, :6])),
        ((q[:, :, :3], k, v), {}, ValueError, r"^k, v: 2 heads do not divide q's 3 heads " + shown(q[:, :, :3], k, v)),
        ((q.half(), k, v), {}, ValueError, r"^q, k, v: dtypes differ \(q float16, k float64, v float64\)$"),
        ((q, k, v), dict(softmax_scale=math.nan), ValueError, r"^softmax_scale: must be finite, got nan$"),
        ((q, k, v), dict(softmax_scale="x"), TypeError, r"^softmax_scale: expected a number, got str$"),
        ((q, k, v), dict(softcap="x"), TypeError, r"^softcap: expected a number, got str$"),
        ((q, k, v), dict(dropout_p=1.0), ValueError, r"^dropout_p: must be in \[0, 1\), got 1.0$"),
        ((q, k, v), dict(window_size=(1.7, 0.2)), TypeError, r"^window_size: expected \(left, right\), two ints"),
        ((q, k, v), dict(window_size=(True, -1)), TypeError, r"^window_size: expected \(left, right\), two ints"),
        ((q, k, v), dict(window_size=(3,)), TypeError, r"^window_size: expected \(left, right\), two ints"),
    ]
    for args, kwargs, error, message in bad:
        with pytest.raises(error, match=message):
            at.flash_attn_func(*args, **kwargs)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    pq, pk = q[0], k[0, :, :, :3]  # [total, H, d]
    with pytest.raises(ValueError, match=r"^k: headdim 3 differs from q's 8 " + shown(pq, pk, pk)):
        at.flash_attn_varlen_func(pq, pk, pk, cu_q, cu_k, 3, 4)
    # Integers of other types are ints (numpy's, 0-d integer tensors).
    want = at.flash_attn_func(q, k, v, window_size=(2, 1))
    assert torch.equal(at.flash_attn_func(q, k, v, window_size=(torch.tensor(2), np.int64(1))), want)


def re_list(t):
    return re.escape(str(list(t.shape)))


def test_no_key_gives_zero_and_infinite_lse(gen):
    # FlashAttention's mha_fwd on seqlen_k = 0: out 0, softmax_lse +inf; the gradients are 0.
    q, k, v = randn(gen, 2, 5, 4, 8, grad=True), randn(gen, 2, 0, 2, 8, grad=True), randn(gen, 2, 0, 2, 3, grad=True)
    out, lse, probs = at.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 5, 4, 3) and (out == 0).all() and probs.shape == (2, 4, 5, 0)
    assert lse.shape == (2, 4, 5) and (lse == math.inf).all()
    out.sum().backward()
    assert (q.grad == 0).all()


def test_lse_of_keyless_rows_is_inf_beside_nan_and_infinite_inputs(gen):
    """softmax_lse is +inf for every row without a visible key (attnscale's -inf turned), found past a
    NaN row, whose NaN would hide it from a minimum; a row whose every score is -inf (an infinite
    input, no mask) gives +inf too, as FlashAttention's kernels give it."""
    q, k, v = (randn(gen, *s, dtype=torch.float32) for s in ((1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)))
    q[0, 2, 1, 0] = math.nan
    _, lse, _ = at.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert lse[0, :, 0].eq(math.inf).all() and lse[0, 1, 2].isnan() and torch.isfinite(lse[0, 0, 1:]).all()
    k = k.abs() + 1
    q = torch.zeros(1, 2, 1, 4)
    q[0, 0, 0, 0] = -math.inf
    _, lse, _ = at.flash_attn_func(q, k[:, :, :1], v[:, :, :1], return_attn_probs=True)
    assert lse[0, 0, 0] == math.inf and torch.isfinite(lse[0, 0, 1])


def test_dropout_is_a_pure_function_of_the_seed_and_unbiased(gen):
    q, k, v = operands(gen, (1, 5, 7, 2, 1, 4, 4, {}), grad=True)
    torch.manual_seed(3)
    a = at.flash_attn_func(q, k, v, dropout_p=0.4, causal=True)
    torch.manual_seed(3)
    assert torch.equal(a, at.flash_attn_func(q, k, v, dropout_p=0.4, causal=True))
    assert not torch.equal(a, at.flash_attn_func(q, k, v, dropout_p=0.4, causal=True))
    # E[dropout(P) / (1 - p)] = P: the mean over 2000 seeds approaches the output without dropout.
    torch.manual_seed(0)
    mean = sum(at.flash_attn_func(q, k, v, dropout_p=0.4, causal=True) for _ in range(2000)) / 2000
    torch.testing.assert_close(mean, at.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0.12)


def reseeded(f, seed=7):
    """f with torch's generator reset before each call: the same dropout mask every time."""

    def call(*args):
        torch.manual_seed(seed)
        return f(*args)

    return call


def test_gradcheck_with_dropout_and_softcap(gen):
    q, k, v = operands(gen, (2, 4, 5, 2, 1, 3, 2, {}), grad=True)
    f = reseeded(lambda q, k, v: at.flash_attn_func(q, k, v, dropout_p=0.3, softcap=1.5, causal=True))
    assert torch.autograd.gradcheck(f, (q, k, v))
    q, k, v, cq, ck = varlen_operands(gen, [2, 3], [3, 2], h=2, hkv=1, d=3, grad=True)
    g = reseeded(lambda q, k, v: at.flash_attn_varlen_func(q, k, v, cq, ck, 3, 3, dropout_p=0.25, softcap=2.0))
    assert torch.autograd.gradcheck(g, (q, k, v))


def softmax_reference(q, k, causal):
    """P [B, H, Nq, Nkv] of q [B, Nq, H, d], k [B, Nkv, Hkv, d] in float64, causal aligned bottom-right
    (a row with no visible key: 0)."""
    nq, h, d, nkv, hkv = q.shape[1], q.shape[2], q.shape[3], k.shape[1], k.shape[2]
    s = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(h // hkv, dim=2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.arange(nkv)[None, :] > torch.arange(nq)[:, None] + nkv - nq, -math.inf)
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def test_attn_probs_under_dropout_carry_the_mask_in_their_sign(gen):
    q, k, v = operands(gen, (2, 7, 13, 4, 2, 8, 5, {}))
    torch.manual_seed(5)
    out, lse, s_dmask = at.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 7, 13) and s_dmask.dtype == torch.float64
    # The magnitude is the softmax before dropout; the kept (non-negative) entries / (1 - p) give out.
    torch.testing.assert_close(s_dmask.abs(), softmax_reference(q, k, True), rtol=1e-12, atol=1e-15)
    want = torch.einsum("bhij,bjhd->bihd", s_dmask.clamp(min=0) / 0.7, v.repeat_interleave(2, dim=2))
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    visible = softmax_reference(q, k, True) > 0
    assert 0.2 < ((s_dmask < 0) & visible).sum() / visible.sum() < 0.4
    torch.manual_seed(5)  # asking for the probabilities does not change the output
    assert torch.equal(out, at.flash_attn_func(q, k, v, dropout_p=0.3, causal=True))


def test_varlen_attn_probs_under_dropout(gen):
    lq, lk = [3, 1, 7, 0, 5], [3, 4, 9, 2, 5]
    q, k, v, cq, ck = varlen_operands(gen, lq, lk)
    torch.manual_seed(9)
    out, lse, s_dmask = at.flash_attn_varlen_func(
        q, k, v, cq, ck, max(lq), max(lk), dropout_p=0.25, causal=True, return_attn_probs=True
    )
    assert s_dmask.shape == (5, 4, 7, 9)
    for b in range(len(lq)):
        nq, nk = lq[b], lk[b]
        assert (s_dmask[b, :, nq:] == 0).all() and (s_dmask[b, :, :, nk:] == 0).all()
        if nq == 0:
            continue
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        block = s_dmask[b, :, :nq, :nk]
        torch.testing.assert_close(block.abs(), softmax_reference(q[None, rows], k[None, keys], True)[0], rtol=1e-12, atol=1e-15)
        want = torch.einsum("hij,jhd->ihd", block.clamp(min=0) / 0.75, v[keys].repeat_interleave(2, dim=1))
        torch.testing.assert_close(out[rows], want, rtol=1e-12, atol=1e-12)


def test_arguments_of_the_wrong_type_are_named(gen):
    """float16 is taken (in float32), so a dtype's message lists it; alibi_slopes that is no tensor
    and a max_seqlen that is no int (FlashAttention's binding takes an int) are told so by name."""
    q, k, v, cq, ck = varlen_operands(gen, [2, 3], [2, 3])
    with pytest.raises(TypeError, match=r"^q: dtype must be float32, float64, bfloat16 or float16, got torch.int64$"):
        at.flash_attn_func(q[None].long(), k[None].long(), v[None].long())
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected a tensor of shape \(4,\) or \(batch, 4\), got list$"):
        at.flash_attn_varlen_func(q, k, v, cq, ck, 3, 3, alibi_slopes=[0.5] * 4)
    for bound in (3.0, True, "3"):
        with pytest.raises(TypeError, match=r"^max_seqlen_q: expected an int, got " + type(bound).__name__):
            at.flash_attn_varlen_func(q, k, v, cq, ck, bound, 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected a 1-D integer tensor"):
        at.flash_attn_varlen_func(q, k, v, cq, ck.bool(), 3, 3)
    want = at.flash_attn_varlen_func(q, k, v, cq, ck, 3, 3)
    assert torch.equal(at.flash_attn_varlen_func(q, k, v, cq, ck, np.int64(3), torch.tensor(3)), want)
