"""attnscale.torch.scaled_dot_product_attention against PyTorch 2's math, written out in float64."""
import math

import pytest
import torch

import attnscale
import attnscale.torch as at
import torch_reference

sdpa = at.scaled_dot_product_attention


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(20240611)


def randn(gen, *shape, dtype=torch.float64, grad=False):
    return torch.randn(*shape, dtype=dtype, generator=gen).requires_grad_(grad)


# (query, key, value, mask shape or None, mask kind, is_causal, enable_gqa): awkward sizes, ranks 2..5,
# broadcast leading dimensions, the [B, 1, 1, S] padding mask, L > S and L < S under a causal mask.
CASES = [
    ((1, 1), (1, 1), (1, 1), None, None, False, False),
    ((7, 5), (13, 5), (13, 3), None, None, True, False),
    ((3, 13, 8), (3, 5, 8), (3, 5, 2), None, None, True, False),
    ((2, 4, 11, 16), (2, 4, 17, 16), (2, 4, 17, 16), (2, 1, 1, 17), "bool", False, False),
    ((2, 6, 9, 8), (2, 2, 9, 8), (2, 2, 9, 5), (9, 9), "float", False, True),
    ((2, 3, 5, 7), (3, 11, 7), (3, 11, 4), (2, 1, 1, 1, 11), "bool", False, False),
    ((5, 4), (2, 3, 6, 4), (2, 3, 6, 4), (3, 1, 6), "float", False, False),
    ((1, 8, 31, 32), (1, 1, 31, 32), (1, 1, 31, 32), (31, 1), "float", False, False),
]


def make_mask(gen, shape, kind):
    if shape is None:
        return None
    if kind == "bool":
        return torch.rand(*shape, generator=gen) < 0.75
    return torch.randn(*shape, dtype=torch.float64, generator=gen)


@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_pytorch_math(gen, case, dtype):
    qs, ks, vs, ms, kind, causal, gqa = case
    q, k, v = randn(gen, *qs, dtype=dtype), randn(gen, *ks, dtype=dtype), randn(gen, *vs, dtype=dtype)
    mask = make_mask(gen, ms, kind)
    for scale in (None, 0.3):
        got = sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
        want = torch_reference.sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
        assert got.dtype == dtype and got.shape == want.shape
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


# Small versions of the cases above: gradcheck perturbs every input element twice.
GRAD_CASES = [
    ((3, 2), (5, 2), (5, 3), None, None, True, False),
    ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 2), (2, 1, 1, 5), "bool", False, False),
    ((1, 4, 3, 2), (1, 2, 3, 2), (1, 2, 3, 3), (3, 3), "float", False, True),
    ((2, 1, 2, 3, 2), (2, 5, 2), (2, 5, 1), (2, 1, 1, 1, 5), "bool", False, False),
    ((3, 2), (2, 3, 4, 2), (2, 3, 4, 2), (3, 1, 4), "float", False, False),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[str(c[0]) for c in GRAD_CASES])
def test_gradcheck(gen, case):
    qs, ks, vs, ms, kind, causal, gqa = case
    q, k, v = randn(gen, *qs, grad=True), randn(gen, *ks, grad=True), randn(gen, *vs, grad=True)
    mask = make_mask(gen, ms, kind)
    f = lambda q, k, v: sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=0.7, enable_gqa=gqa)
    assert torch.autograd.gradcheck(f, (q, k, v))


def test_bfloat16_forward_and_backward(gen):
    q, k, v = (randn(gen, 2, 4, 37, 64).to(torch.bfloat16).requires_grad_() for _ in range(3))
    mask = torch.rand(2, 1, 1, 37, generator=gen) < 0.8
    out = sdpa(q, k, v, attn_mask=mask)
    assert out.dtype == torch.bfloat16
    dout = randn(gen, *out.shape).to(torch.bfloat16)
    out.backward(dout)
    # The float64 reference on the same (bfloat16-rounded) inputs.
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch_reference.sdpa(q64, k64, v64, attn_mask=mask)
    want.backward(dout.double())
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-2)
    for got, ref in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got.dtype == torch.bfloat16
        assert (got.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


def test_float16_is_float32_rounded_back(gen):
    # PyTorch 2 takes float16 on CPU too: here the float32 call on the same values, out and
    # gradients rounded to float16.
    q, k, v = (randn(gen, 2, 4, 37, 32).to(torch.float16) for _ in range(3))
    mask = torch.rand(2, 1, 1, 37, generator=gen) < 0.8
    half = [t.clone().requires_grad_() for t in (q, k, v)]
    single = [t.float().requires_grad_() for t in (q, k, v)]
    out, want = sdpa(*half, attn_mask=mask), sdpa(*single, attn_mask=mask)
    assert out.dtype == torch.float16 and torch.equal(out, want.half())
    dout = randn(gen, *out.shape).to(torch.float16)
    out.backward(dout)
    want.backward(dout.float())
    for h, s in zip(half, single):
        assert h.grad.dtype == torch.float16 and torch.equal(h.grad, s.grad.half())


def test_padding_mask_and_permuted_inputs_are_not_copied(gen):
    x = randn(gen, 2, 9, 4, 8, grad=True)  # [B, N, H, d] viewed as [B, H, N, d]
    q = x.permute(0, 2, 1, 3)
    pad = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    pad[1, ..., 6:] = False
    before = attnscale._attnscale._copy_count()
    out = sdpa(q, q, q, attn_mask=pad)
    out.sum().backward()
    assert attnscale._attnscale._copy_count() == before
    torch.testing.assert_close(out, torch_reference.sdpa(q, q, q, attn_mask=pad))


def test_empty_key_set_gives_zero(gen):
    q, k, v = randn(gen, 2, 3, 5, 4, grad=True), randn(gen, 2, 3, 0, 4, grad=True), randn(gen, 2, 3, 0, 6, grad=True)
    out = sdpa(q, k, v)
    assert out.shape == (2, 3, 5, 6) and (out == 0).all()
    out.sum().backward()
    assert (q.grad == 0).all()


@pytest.mark.parametrize("nkv", [0, 3])
def test_empty_calls_meet_the_checks_of_others(gen, nkv):
    """No key (or no query) leaves nothing to compute, but the arguments are checked as in a call
    with work to do, with the same messages."""
    q, kv = randn(gen, 2, 4, 5, 8), randn(gen, 2, 4, nkv, 8)
    bad = [
        (lambda: sdpa(q, kv.float(), kv.float()), ValueError, r"^query, key, value: dtypes differ \(query float64, key float32, value float32\)$"),
        (lambda: sdpa(q.long(), kv.long(), kv.long()), TypeError, r"^query: dtype must be float32, float64, bfloat16 or float16, got torch.int64$"),
        (lambda: sdpa(q, kv, kv, scale=math.nan), ValueError, r"^scale: must be finite, got nan$"),
        (lambda: sdpa(q, kv, kv, dropout_p=2.0), ValueError, r"^dropout_p: must be in \[0, 1\], got 2.0$"),
        (lambda: sdpa(q, kv, kv, attn_mask=torch.zeros(5, nkv, dtype=torch.int64)), TypeError, r"^attn_mask: dtype must be"),
        (lambda: sdpa(q, kv, kv, attn_mask=torch.zeros(5, 2)), ValueError, r"^attn_mask: shape \[5, 2\] does not broadcast"),
        (lambda: sdpa(q, kv, randn(gen, 2, 4, nkv + 1, 8)), ValueError,
         r"^value: heads and keys must match key's \(key \[2, 4, %d, 8\], value \[2, 4, %d, 8\]\)$" % (nkv, nkv + 1)),
        (lambda: sdpa(q[:, :, :0], kv[..., :3], kv[..., :3]),
         ValueError, r"^key: last dimension dk = 3 must equal query's dk = 8 \(query \[2, 4, 0, 8\], key \[2, 4, %d, 3\]\)$" % nkv),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
    assert sdpa(q, kv, kv, scale=0.5, dropout_p=0.25).shape == (2, 4, 5, 8)
    assert sdpa(q[:, :, :0], kv, kv).shape == (2, 4, 0, 8)


@pytest.mark.parametrize("shape", [(7,), ()], ids=["[S]", "0-d"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_mask_of_rank_0_or_1_broadcasts_as_in_pytorch(gen, shape, kind):
    # PyTorch's masks broadcast to the scores' shape: an [S] key mask, or a 0-d one, too.
    q, k, v = randn(gen, 2, 3, 5, 4, grad=True), randn(gen, 2, 3, 7, 4, grad=True), randn(gen, 2, 3, 7, 3, grad=True)
    if kind == "bool":
        mask = torch.rand(7, generator=gen) < 0.6
        mask[0] = True
        mask = mask[0] if shape == () else mask
    else:
        mask = torch.randn(shape, dtype=torch.float64, generator=gen).requires_grad_()
    want = torch_reference.sdpa(q, k, v, attn_mask=mask)
    for got in (sdpa(q, k, v, attn_mask=mask), at.attention(q, k, v, mask=mask)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if kind == "float":  # the bias's gradient, summed back to its own shape
        dout = randn(gen, *want.shape)
        (dbias,) = torch.autograd.grad(sdpa(q, k, v, attn_mask=mask), mask, dout)
        (ref,) = torch.autograd.grad(want, mask, dout)
        assert dbias.shape == mask.shape
        torch.testing.assert_close(dbias, ref, rtol=1e-10, atol=1e-12)
        assert torch.autograd.gradcheck(lambda q, m: sdpa(q, k, v, attn_mask=m), (q, mask))


def test_messages_name_the_arguments_as_pytorch_does(gen):
    """PyTorch's signature says query, key, value, attn_mask: so do the messages, those of the
    kernels included (a dk that differs, heads that do not match), never attnscale's q, k, v."""
    q, kv = randn(gen, 2, 4, 5, 8), randn(gen, 2, 4, 3, 8)
    bad = [
        (lambda: sdpa([1.0], kv, kv), TypeError, r"^query: expected a torch.Tensor, got list$"),
        (lambda: sdpa(q, kv.int(), kv), TypeError, r"^key: dtype must be float32, float64, bfloat16 or float16, got torch.int32$"),
        (lambda: sdpa(q, kv, randn(gen, 3)), ValueError, r"^value: expected \[\.\.\., N, d\], got rank 1 \[3\]$"),
        (lambda: sdpa(q, kv[..., :3], kv), ValueError,
         r"^key: last dimension dk = 3 must equal query's dk = 8 \(query \[2, 4, 5, 8\], key \[2, 4, 3, 3\]\)$"),
        (lambda: sdpa(q, kv, randn(gen, 2, 4, 4, 8)), ValueError,
         r"^value: heads and keys must match key's \(key \[2, 4, 3, 8\], value \[2, 4, 4, 8\]\)$"),
        (lambda: sdpa(q, randn(gen, 2, 3, 3, 8), randn(gen, 2, 3, 3, 8)), ValueError,
         r"^query, key: leading dimensions \[4\], \[3\] do not broadcast \(key/value with fewer heads than query "
         r"need enable_gqa=True\)$"),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
    # With enable_gqa=True, heads that do not divide are told so (as attnscale.attention tells them).
    with pytest.raises(ValueError, match=r"^key: query heads Hq = 4 must be a multiple of key/value heads Hkv = 3 "
                                         r"\(query \[2, 4, 5, 8\], key \[2, 3, 3, 8\]\)$"):
        sdpa(q, randn(gen, 2, 3, 3, 8), randn(gen, 2, 3, 3, 8), enable_gqa=True)


def test_errors(gen):
    q, k = randn(gen, 4, 5, 8, grad=True), randn(gen, 2, 5, 8, grad=True)
    with pytest.raises(ValueError, match=r"need enable_gqa=True\)$"):
        sdpa(q, k, k)
    with pytest.raises(ValueError, match=r"^attn_mask: must be None when is_causal=True"):
        sdpa(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match=r"^attn_mask: shape \[4, 5\] does not broadcast to \[4, 5, 5\]$"):
        sdpa(q, q, q, attn_mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'casual'"):
        sdpa(q, q, q, casual=True)
    # Messages name the caller's arguments: attn_mask, scale, dropout_p; float16 is supported, so a
    # float16 query among float64 key and value is told that the dtypes differ.
    with pytest.raises(ValueError, match=r"^query, key, value: dtypes differ \(query float16, key float64, value float64\)$"):
        sdpa(q.half(), q, q)
    # PyTorch 2 takes bool and float masks only: a uint8 one meant True = masked to
    # nn.MultiheadAttention, True = kept to attnscale.attention, so it is refused rather than guessed.
    for dtype in (torch.int32, torch.uint8):
        with pytest.raises(TypeError, match=rf"^attn_mask: dtype must be bool or a float dtype \(as in PyTorch 2\), got {dtype}$"):
            sdpa(q, q, q, attn_mask=torch.ones(5, 5, dtype=dtype))
    with pytest.raises(ValueError, match=r"^query, key, value, attn_mask: leading dimensions .* do not broadcast$"):
        sdpa(randn(gen, 3, 4, 5, 8), q, q, attn_mask=torch.ones(2, 4, 5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"^scale: expected a number, got str$"):
        sdpa(q, q, q, scale="x")
    with pytest.raises(ValueError, match=r"^dropout_p: must be in \[0, 1\], got -0.5$"):
        sdpa(q, q, q, dropout_p=-0.5)
    out = sdpa(q, k, k, enable_gqa=True)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        dq.sum().backward()


def test_a_model_written_for_pytorch_2_trains_the_same(monkeypatch, gen):
    """A small pre-LN Transformer calls F.scaled_dot_product_attention as PyTorch 2 code does; with
    attnscale patched in, its losses and gradients over a few Adam steps equal those of PyTorch's
    own math (float32), step for step."""

    class Block(torch.nn.Module):
        def __init__(self, d=32, heads=4, kv_heads=2):
            super().__init__()
            self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
            self.norm = torch.nn.LayerNorm(d)
            self.q = torch.nn.Linear(d, d)
            self.kv = torch.nn.Linear(d, 2 * kv_heads * self.hd)
            self.o = torch.nn.Linear(d, d)
            self.head = torch.nn.Linear(d, 11)

        def forward(self, x, pad):
            B, N, _ = x.shape
            h = self.norm(x)
            q = self.q(h).view(B, N, self.heads, self.hd).transpose(1, 2)
            k, v = self.kv(h).view(B, N, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
            causal = torch.ones(N, N, dtype=torch.bool).tril()
            a = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=causal & pad[:, None, None, :], dropout_p=0.0, enable_gqa=True
            )
            return self.head(x + self.o(a.transpose(1, 2).reshape(B, N, -1)))

    def reference(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return torch_reference.sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa).to(query.dtype)

    x = torch.randn(3, 13, 32, generator=gen)
    y = torch.randint(0, 11, (3, 13), generator=gen)
    pad = torch.ones(3, 13, dtype=torch.bool)
    pad[2, 9:] = False
    runs = {}
    for name, fn in (("attnscale", sdpa), ("torch", reference)):
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", fn, raising=False)
        torch.manual_seed(0)
        model = Block()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses, grads = [], []
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(model(x, pad).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            losses.append(loss.item())
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
            opt.step()
        runs[name] = losses, grads
    (la, ga), (lt, gt) = runs["attnscale"], runs["torch"]
    assert la[-1] < la[0]
    for step in range(5):
        assert math.isclose(la[step], lt[step], rel_tol=1e-5)
        torch.testing.assert_close(ga[step], gt[step], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(2, 3, 5, 7), (1, 3, 1, 7), (5, 7)])
def test_gradient_with_respect_to_a_float_mask(gen, mask_shape):
    # A learned additive bias: its gradient is dS, summed over the mask's broadcast dimensions.
    q, k, v = randn(gen, 2, 3, 5, 4, grad=True), randn(gen, 2, 1, 7, 4, grad=True), randn(gen, 2, 1, 7, 3, grad=True)
    bias = randn(gen, *mask_shape, grad=True)
    f = lambda q, k, v, bias: sdpa(q, k, v, attn_mask=bias, enable_gqa=True)
    assert torch.autograd.gradcheck(f, (q, k, v, bias))
    out = f(q, k, v, bias)
    dout = randn(gen, *out.shape)
    (dbias,) = torch.autograd.grad(out, bias, dout)
    bias64 = bias.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(torch_reference.sdpa(q, k, v, attn_mask=bias64, enable_gqa=True), bias64, dout)
    torch.testing.assert_close(dbias, want, rtol=1e-10, atol=1e-12)


def test_gradient_with_respect_to_a_float_mask_in_float32_and_bfloat16(gen):
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        q, k, v = (randn(gen, 2, 2, 9, 16).to(dtype).requires_grad_() for _ in range(3))
        bias = randn(gen, 1, 2, 9, 9).to(dtype).requires_grad_()
        out = sdpa(q, k, v, attn_mask=bias, is_causal=False)
        (dbias,) = torch.autograd.grad(out.float().square().sum(), bias)
        assert dbias.dtype == dtype and dbias.shape == bias.shape
        b64 = bias.detach().double().requires_grad_()
        ref = torch_reference.sdpa(q.detach(), k.detach(), v.detach(), attn_mask=b64)
        (want,) = torch.autograd.grad(ref.square().sum(), b64)
        assert (dbias.double() - want).abs().max() <= tol * want.abs().max()


def test_dropout_follows_torch_manual_seed_and_has_gradients(gen):
    q, k, v = randn(gen, 2, 2, 4, 3, grad=True), randn(gen, 2, 2, 6, 3, grad=True), randn(gen, 2, 2, 6, 2, grad=True)
    bias = randn(gen, 1, 2, 4, 6, grad=True)

    def f(q, k, v, bias):
        torch.manual_seed(11)  # the same dropout mask on every call
        return sdpa(q, k, v, attn_mask=bias, dropout_p=0.35)

    assert torch.equal(f(q, k, v, bias), f(q, k, v, bias))
    assert torch.autograd.gradcheck(f, (q, k, v, bias))
    torch.manual_seed(0)
    mean = sum(sdpa(q, k, v, attn_mask=bias, dropout_p=0.35) for _ in range(2000)) / 2000
    torch.testing.assert_close(mean, sdpa(q, k, v, attn_mask=bias), rtol=0, atol=0.15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fully_masked_rows_as_pytorch_gives_them(gen, dtype):
    """A row whose every key is masked (False, or -inf added) is 0, as PyTorch's _safe_softmax gives
    it from 2.5 on; a row masked by torch.finfo(dtype).min, as Hugging Face's models build their
    masks, is finite there: the softmax of equal scores, the mean of the values."""
    q, k, v = (randn(gen, 2, 3, 5, 8).to(dtype) for _ in range(3))
    low = torch.finfo(dtype).min
    bias = torch.zeros(2, 1, 5, 5, dtype=dtype)
    bias[..., 3:] = low  # padding
    bias[1, :, 2] = low  # a row of padding only
    out = sdpa(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out[1, :, 2].double(), v[1].double().mean(-2), rtol=0, atol=2e-2 if dtype == torch.bfloat16 else 1e-6)
    want = torch_reference.sdpa(q, k, v, attn_mask=bias.double().clamp(min=-1e30))
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-2 if dtype == torch.bfloat16 else 1e-5)
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[1, :, 2] = False
    minus_inf = torch.zeros(2, 1, 5, 5, dtype=dtype).masked_fill(~keep, -math.inf)
    for mask in (keep, minus_inf):
        assert (sdpa(q, k, v, attn_mask=mask)[1, :, 2] == 0).all()


@pytest.mark.parametrize("hk,hv", [(2, 4), (3, 2), (1, 3)])
def test_enable_gqa_takes_key_and_value_of_different_head_counts(gen, hk, hv):
    """PyTorch's enable_gqa repeats key and value each to query's heads (query head h reads key
    head h // (Hq / Hk) and value head h // (Hq / Hv)), so their counts may differ when both divide Hq."""
    q = randn(gen, 2, 12, 5, 4, grad=True)
    k, v = randn(gen, 2, hk, 7, 4, grad=True), randn(gen, 2, hv, 7, 3, grad=True)
    mask = torch.rand(5, 7, generator=gen) < 0.7
    mask[:, 0] = True
    got = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    want = torch_reference.sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    dout = randn(gen, *want.shape)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), dout), torch.autograd.grad(want, (q, k, v), dout)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_enable_gqa_refuses_heads_that_do_not_divide_query_s(gen):
    # PyTorch: "Number of heads in key and value must divide the number of heads in query"; one query
    # head under four key heads included, which broadcasting alone (enable_gqa=False) takes.
    q, kv = randn(gen, 2, 1, 5, 4), randn(gen, 2, 4, 7, 4)
    with pytest.raises(ValueError, match=r"^key: query heads Hq = 1 must be a multiple of key/value heads Hkv = 4 "
                                         r"\(query \[2, 1, 5, 4\], key \[2, 4, 7, 4\]\)$"):
        sdpa(q, kv, kv, enable_gqa=True)
    with pytest.raises(ValueError, match=r"^value: query heads Hq = 6 must be a multiple of key/value heads Hkv = 4 "):
        sdpa(randn(gen, 2, 6, 5, 4), randn(gen, 2, 2, 7, 4), kv, enable_gqa=True)
    torch.testing.assert_close(sdpa(q, kv, kv), torch_reference.sdpa(q, kv, kv), rtol=1e-12, atol=1e-12)


def test_dropout_of_one_drops_everything_as_pytorch_does(gen):
    # torch.dropout with p = 1 zeroes every probability: out is 0 and so are the gradients.
    q, k, v = randn(gen, 2, 3, 5, 4, grad=True), randn(gen, 2, 3, 7, 4, grad=True), randn(gen, 2, 3, 7, 3, grad=True)
    out = sdpa(q, k, v, dropout_p=1.0)
    assert out.shape == (2, 3, 5, 3) and (out == 0).all()
    out.backward(randn(gen, *out.shape))
    assert all((t.grad == 0).all() for t in (q, k, v))
    half = sdpa(q.detach().half(), k.detach().half(), v.detach().half(), dropout_p=1)
    assert half.dtype == torch.float16 and (half == 0).all()


def test_keys_a_row_does_not_see_are_never_read_for_it(gen):
    """docs/python.md's parity table: a NaN in a masked key or value does not reach the rows that
    do not see it, nor their gradients (PyTorch's math path reads it: NaN + (-inf) is NaN)."""
    q, k, v = randn(gen, 2, 3, 5, 4), randn(gen, 2, 3, 7, 4), randn(gen, 2, 3, 7, 3)
    k[:, :, 6, 0], v[:, :, 6, 1] = math.nan, math.nan
    keep = torch.ones(5, 7, dtype=torch.bool)
    keep[:, 6] = False
    leaves = [t.requires_grad_() for t in (q, k, v)]
    for mask in (keep, torch.zeros(5, 7, dtype=torch.float64).masked_fill(~keep, -math.inf)):
        out = sdpa(*leaves, attn_mask=mask)
        torch.testing.assert_close(out, torch_reference.sdpa(q, k[:, :, :6], v[:, :, :6]), rtol=1e-12, atol=1e-12)
        dq, dk, dv = torch.autograd.grad(out.sum(), leaves)
        assert torch.isfinite(dq).all() and torch.isfinite(dk[:, :, :6]).all() and torch.isfinite(dv[:, :, :6]).all()
    causal = sdpa(q.detach(), k.detach(), v.detach(), is_causal=True)  # rows 0..4 see keys 0..4 only
    assert torch.isfinite(causal).all()


def test_autocast_casts_the_operands_as_pytorch_s_cpu_policy(gen):
    """Under torch.autocast("cpu"), PyTorch casts scaled_dot_product_attention's floating operands
    (a float mask too; float64 ones not) to the autocast dtype: float32 query and key after a rotary
    embedding meet a bfloat16 value, and out is bfloat16."""
    q, k = randn(gen, 2, 3, 5, 8, dtype=torch.float32, grad=True), randn(gen, 2, 3, 7, 8, dtype=torch.float32)
    v, bias = randn(gen, 2, 3, 7, 4).to(torch.bfloat16), randn(gen, 5, 7, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa(q, k, v, attn_mask=bias)
        wide = sdpa(q.double(), k.double(), v.double())  # float64 is not cast
    assert out.dtype == torch.bfloat16 and wide.dtype == torch.float64
    assert torch.equal(out, sdpa(q.bfloat16(), k.bfloat16(), v, attn_mask=bias.bfloat16()))
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()


class CausalBias(torch.Tensor):
    """What PyTorch 2's torch.nn.attention.bias.causal_upper_left / causal_lower_right return (PyTorch
    1.13 has none): a tensor subclass whose values mean nothing, with variant, seq_len_q, seq_len_kv,
    and a __torch_function__ that computes torch.nn.functional.scaled_dot_product_attention itself and
    hands every other function to torch.Tensor's (which would return out as a CausalBias)."""

    class Variant:
        def __init__(self, name):
            self.name = name

    def __new__(cls, variant, seq_len_q, seq_len_kv):
        t = torch.Tensor._make_subclass(cls, torch.full((1, seq_len_q, seq_len_kv), 1e30))  # no mask's values
        t.variant, t.seq_len_q, t.seq_len_kv = CausalBias.Variant(variant), seq_len_q, seq_len_kv
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is getattr(torch.nn.functional, "scaled_dot_product_attention", None):
            raise AssertionError("PyTorch's own function computes it here (CausalBias._dispatch)")
        return super().__torch_function__(func, types, args, kwargs)


@pytest.mark.parametrize("L,S", [(5, 9), (9, 5), (6, 6)])
def test_causal_bias_objects_are_the_causal_masks_they_stand_for(gen, L, S):
    """causal_upper_left(L, S) is is_causal=True; causal_lower_right(L, S) keeps keys
    j <= i + S - L (tril with diagonal S - L): the tensor's own values are never read, nor is its
    __torch_function__ offered the call (out is a plain tensor)."""
    q, k, v = randn(gen, 2, 3, L, 4, grad=True), randn(gen, 2, 3, S, 4, grad=True), randn(gen, 2, 3, S, 3, grad=True)
    lower = torch.ones(L, S, dtype=torch.bool).tril(S - L)
    for variant, want in (("UPPER_LEFT", torch_reference.sdpa(q, k, v, is_causal=True)),
                          ("LOWER_RIGHT", torch_reference.attention(q, k, v, mask=lower)[0])):  # rows of no key: 0
        got = sdpa(q, k, v, attn_mask=CausalBias(variant, L, S))
        assert type(got) is torch.Tensor
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        dout = randn(gen, *want.shape)
        for a, b in zip(torch.autograd.grad(got, (q, k, v), dout), torch.autograd.grad(want, (q, k, v), dout)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"^attn_mask: a CausalBias must not be used with is_causal=True"):
        sdpa(q, k, v, attn_mask=CausalBias("LOWER_RIGHT", L, S), is_causal=True)
    if L != S:  # a lower-right bias of other lengths is its mask, which must broadcast
        with pytest.raises(ValueError, match=r"^attn_mask: shape \[%d, %d\] does not broadcast" % (L + 1, S)):
            sdpa(q, k, v, attn_mask=CausalBias("LOWER_RIGHT", L + 1, S))
