"""attnscale.torch in PyTorch's __torch_function__ protocol (torch.overrides), as torch.nn.functional's
functions take part in it: every public function (and Attention.apply) offers a call to a tensor
subclass that overrides __torch_function__, in any of its tensor arguments (optional ones too), and
to a TorchFunctionMode, before computing anything; plain tensors never reach handle_torch_function;
a subclass that does not override it runs the function through torch.Tensor.__torch_function__ and
gets the float64 reference's result (and gradients) back as that subclass.

Each case below is one call with every tensor argument its function takes, and its float64
reference (None where it would restate the implementation: the rotary embedding's case, checked
against the plain call instead).
"""
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

import attnscale.torch as at
from attnscale import torch_flash, torch_flash_packed, torch_function, torch_kvcache, torch_sdpa
import torch_reference


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1618)


def randn(gen, *shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, generator=gen)


def ints(*values):
    return torch.tensor(values, dtype=torch.int32)


def attention_reference(q, k, v, mask, sinks, causal):
    """softmax over [scores + mask, sink] with the sink's column dropped, GQA by repeat_interleave."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
    scores = scores.masked_fill(~torch_reference.keep_matrix(q.shape[-2], k.shape[-2], causal), -math.inf)
    column = sinks[:, None, None].expand(scores.shape[:-1] + (1,))
    return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1] @ v


def varlen_reference(q, k, v, cu_q, cu_k, alibi_slopes, **options):
    """flash_attn_varlen_func's semantics: each sequence by itself through torch_reference.flash."""
    outs = []
    for b in range(len(cu_q) - 1):
        rows = lambda t, cu: t[None, int(cu[b]) : int(cu[b + 1])]
        slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        outs.append(torch_reference.flash(rows(q, cu_q), rows(k, cu_k), rows(v, cu_k), alibi_slopes=slopes, **options)[0][0])
    return torch.cat(outs)


def kvcache_reference(q, k_cache, v_cache, rows, cache_leftpad, ends, alibi_slopes):
    """Sequence b's keys [cache_leftpad[b], ends[b]) of its cache rows `rows(cache, b)`, through
    torch_reference.flash (causal), from the caches after the call's update."""
    outs = []
    for b in range(q.shape[0]):
        start, end = int(cache_leftpad[b]), int(ends[b])
        kb, vb = (rows(c, b)[start:end][None].double() for c in (k_cache, v_cache))
        outs.append(torch_reference.flash(q[b : b + 1].double(), kb, vb, causal=True, alibi_slopes=alibi_slopes)[0])
    return torch.cat(outs)


class Case:
    """A call `func(**kwargs)`, its float64 reference `reference(kwargs)` (of out, the first output)
    or None, and the arguments that get gradients (none: flash_attn_with_kvcache)."""

    def __init__(self, func, kwargs, reference, grads=()):
        self.func, self.kwargs, self.reference, self.grads = func, kwargs, reference, grads

    def tensors(self):
        """The names of its tensor arguments: the ones a __torch_function__ override is offered."""
        return [name for name, value in self.kwargs.items() if isinstance(value, torch.Tensor)]

    def arguments(self, **replaced):
        """Its keyword arguments on fresh copies of its tensors (a KV cache is updated in place), with
        `replaced` ones instead."""
        kwargs = {name: t.clone() if isinstance(t, torch.Tensor) else t for name, t in self.kwargs.items()}
        return dict(kwargs, **replaced)

    def call(self, **replaced):
        """The call on arguments(**replaced); its outputs as a tuple."""
        return outputs(self.func(**self.arguments(**replaced)))


def outputs(out):
    return out if isinstance(out, tuple) else (out,)


def cases(gen):
    """One case for each public function of attnscale.torch (and Attention.apply)."""
    q, k, v = randn(gen, 2, 4, 5, 8), randn(gen, 2, 2, 7, 8), randn(gen, 2, 2, 7, 3)  # [B, H, N, d], GQA
    bias, sinks = randn(gen, 5, 7), randn(gen, 4)
    keep = torch.rand(5, 7, generator=gen) < 0.7
    options = dict(scale=None, causal="bottom-right", window=None, align=None, threads=0, compute=None)
    fq, fk, fv = randn(gen, 2, 5, 4, 8), randn(gen, 2, 7, 2, 8), randn(gen, 2, 7, 2, 8)  # [B, N, H, d]
    slopes = torch.rand(4, generator=gen)
    pq, pk, pv = randn(gen, 10, 4, 8), randn(gen, 12, 2, 8), randn(gen, 12, 2, 8)  # packed: 3 + 7 rows, 5 + 7 keys
    cu_q, cu_k = ints(0, 3, 10), ints(0, 5, 12)
    blocks_k, blocks_v, table = randn(gen, 5, 4, 2, 8), randn(gen, 5, 4, 2, 8), ints(2, 0, 4, 3, 1, 0).reshape(2, 3)
    paged_rows = lambda c, b: c[table[b].long()].flatten(0, 1)  # sequence b's keys, in its blocks' order
    qkv, kv = randn(gen, 2, 6, 3, 4, 8), randn(gen, 2, 7, 2, 2, 8)
    cq = randn(gen, 2, 2, 4, 8, dtype=torch.float32)  # two new tokens of 2 sequences
    kc, vc = randn(gen, 3, 9, 2, 8, dtype=torch.float32), randn(gen, 3, 9, 2, 8, dtype=torch.float32)
    kn, vn = randn(gen, 2, 2, 2, 8, dtype=torch.float32), randn(gen, 2, 2, 2, 8, dtype=torch.float32)
    cos, sin = torch.rand(16, 2, generator=gen), torch.rand(16, 2, generator=gen)
    lens, batch_idx, leftpad = ints(3, 5), ints(2, 0), ints(1, 0)
    cache_rows = lambda c, b: c[int(batch_idx[b])]
    flash_options = dict(causal=True, alibi_slopes=slopes)
    return {
        "attention": Case(at.attention, dict(q=q, k=k, v=v, mask=bias, sinks=sinks, causal="bottom-right"),
                          lambda a: attention_reference(a["q"], a["k"], a["v"], a["mask"], a["sinks"], "bottom-right"),
                          ("q", "k", "v", "mask", "sinks")),
        "Attention.apply": Case(
            at.Attention.apply,
            dict(q=q, k=k, v=v, mask=bias.expand(2, 4, 5, 7), forward_options=options, options=options, sinks=sinks),
            lambda a: attention_reference(a["q"], a["k"], a["v"], a["mask"], a["sinks"], "bottom-right"),
            ("q", "k", "v", "mask", "sinks")),
        "scaled_dot_product_attention": Case(
            at.scaled_dot_product_attention, dict(query=q, key=k, value=v, attn_mask=keep, enable_gqa=True),
            lambda a: torch_reference.sdpa(a["query"], a["key"], a["value"], a["attn_mask"], enable_gqa=True),
            ("query", "key", "value")),
        "flash_attn_func": Case(at.flash_attn_func, dict(q=fq, k=fk, v=fv, **flash_options),
                                lambda a: torch_reference.flash(a["q"], a["k"], a["v"], **flash_options)[0],
                                ("q", "k", "v")),
        "flash_attn_varlen_func": Case(
            at.flash_attn_varlen_func,
            dict(q=pq, k=pk, v=pv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=7, **flash_options),
            lambda a: varlen_reference(a["q"], a["k"], a["v"], cu_q, cu_k, **flash_options), ("q", "k", "v")),
        "flash_attn_varlen_func paged": Case(
            at.flash_attn_varlen_func,
            dict(q=pq, k=blocks_k, v=blocks_v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=7,
                 block_table=table, **flash_options),
            lambda a: varlen_reference(a["q"], torch.cat([paged_rows(a["k"], 0)[:5], paged_rows(a["k"], 1)[:7]]),
                                       torch.cat([paged_rows(a["v"], 0)[:5], paged_rows(a["v"], 1)[:7]]), cu_q, cu_k,
                                       **flash_options),
            ("q", "k", "v")),
        "flash_attn_qkvpacked_func": Case(at.flash_attn_qkvpacked_func, dict(qkv=qkv, **flash_options),
                                          lambda a: torch_reference.flash(*a["qkv"].unbind(2), **flash_options)[0],
                                          ("qkv",)),
        "flash_attn_kvpacked_func": Case(at.flash_attn_kvpacked_func, dict(q=fq, kv=kv, **flash_options),
                                         lambda a: torch_reference.flash(a["q"], *a["kv"].unbind(2), **flash_options)[0],
                                         ("q", "kv")),
        "flash_attn_varlen_qkvpacked_func": Case(
            at.flash_attn_varlen_qkvpacked_func, dict(qkv=randn(gen, 10, 3, 4, 8), cu_seqlens=cu_q, max_seqlen=7,
                                                      **flash_options),
            lambda a: varlen_reference(*a["qkv"].unbind(1), cu_q, cu_q, **flash_options), ("qkv",)),
        "flash_attn_varlen_kvpacked_func": Case(
            at.flash_attn_varlen_kvpacked_func,
            dict(q=pq, kv=torch.stack([pk, pv], 1), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=7,
                 **flash_options),
            lambda a: varlen_reference(a["q"], *a["kv"].unbind(1), cu_q, cu_k, **flash_options), ("q", "kv")),
        "flash_attn_with_kvcache": Case(
            at.flash_attn_with_kvcache,
            dict(q=cq, k_cache=kc, v_cache=vc, k=kn, v=vn, cache_seqlens=lens, cache_batch_idx=batch_idx,
                 cache_leftpad=leftpad, alibi_slopes=slopes, causal=True),
            lambda a: kvcache_reference(a["q"], a["k_cache"], a["v_cache"], cache_rows, leftpad, lens + 2, slopes)),
        "flash_attn_with_kvcache paged": Case(
            at.flash_attn_with_kvcache,
            dict(q=cq, k_cache=blocks_k.float(), v_cache=blocks_v.float(), k=kn, v=vn, cache_seqlens=lens,
                 block_table=table, alibi_slopes=slopes, causal=True),
            lambda a: kvcache_reference(a["q"], a["k_cache"], a["v_cache"], paged_rows, ints(0, 0), lens + 2, slopes)),
        "flash_attn_with_kvcache rotary": Case(
            at.flash_attn_with_kvcache,
            dict(q=cq, k_cache=kc, v_cache=vc, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                 cache_batch_idx=batch_idx, cache_leftpad=leftpad, alibi_slopes=slopes, causal=True,
                 return_softmax_lse=True),
            None),
    }


CASES = list(cases(torch.Generator().manual_seed(0)))
SENTINEL = object()


class Recorder(torch.Tensor):
    """A subclass that takes over every attnscale function it is offered: records the call, returns
    SENTINEL. torch's own functions and methods on it run as on its parent (torch.Tensor's)."""

    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if (getattr(func, "__module__", None) or "").startswith("attnscale"):
            cls.calls.append((func, types, args, kwargs or {}))
            return SENTINEL
        return super().__torch_function__(func, types, args, kwargs)


class Calls(TorchFunctionMode):
    """A mode that records each function it sees, then runs it."""

    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


class Tagged(torch.Tensor):
    """A subclass that does not override __torch_function__ (torch.Tensor's runs the call)."""


def test_every_public_function_has_a_case(gen):
    public = {getattr(at, name) for name in at.__all__ if name not in ("bert_padding", "Attention")} | {at.Attention.apply}
    assert public == {case.func for case in cases(gen).values()}


@pytest.mark.parametrize("name", CASES)
def test_a_subclass_in_any_tensor_argument_gets_the_call(gen, name):
    """Each tensor argument in turn is a Recorder: the call comes to its __torch_function__ (func is
    the public function, the Recorder among types), whose args and kwargs run as the call itself."""
    case = cases(gen)[name]
    want = case.call()
    for arg in case.tensors():
        Recorder.calls = []
        wrapped = case.kwargs[arg].as_subclass(Recorder)
        assert case.call(**{arg: wrapped}) == (SENTINEL,), arg
        ((func, types, args, kwargs),) = Recorder.calls
        assert func == case.func and Recorder in types, arg
        # The arguments handed over are the call's: run with the plain tensor in the Recorder's place.
        plain = lambda x: case.kwargs[arg] if x is wrapped else x.clone() if isinstance(x, torch.Tensor) else x
        got = func(*map(plain, args), **{name: plain(x) for name, x in kwargs.items()})
        for g, w in zip(got if isinstance(got, tuple) else (got,), want):
            assert torch.equal(g, w), arg


@pytest.mark.parametrize("name", CASES)
def test_a_torch_function_mode_sees_the_call(gen, name):
    """A TorchFunctionMode sees the public function, once, and none of the torch operations under
    it (as for torch.nn.functional's functions); what it runs is the plain call's result."""
    case = cases(gen)[name]
    want, kwargs = case.call(), case.arguments()
    with Calls() as mode:
        got = outputs(case.func(**kwargs))
    assert mode.funcs == [case.func]
    for g, w in zip(got, want):
        assert type(g) is torch.Tensor and torch.equal(g, w)


@pytest.mark.parametrize("name", CASES)
def test_plain_tensors_never_reach_handle_torch_function(gen, monkeypatch, name):
    def refuse(*args, **kwargs):
        raise AssertionError("handle_torch_function called for plain tensors")

    for module in (at, torch_sdpa, torch_flash, torch_flash_packed, torch_kvcache, torch_function):
        monkeypatch.setattr(module, "handle_torch_function", refuse)
    case = cases(gen)[name]
    out = outputs(case.func(**case.kwargs))  # a KV cache updated in place, then read by the reference
    assert all(type(t) is torch.Tensor for t in out)
    if case.reference is not None:
        torch.testing.assert_close(out[0].double(), case.reference(case.kwargs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_a_subclass_that_does_not_override_gets_the_reference_result(gen, name):
    """Every tensor argument a Tagged (torch.Tensor's __torch_function__): out is a Tagged holding
    the plain call's values, which are the float64 reference's, and gradients reach the Tagged
    leaves, equal to the reference's; a Tagged KV cache is updated as a plain one."""
    case = cases(gen)[name]
    fresh = lambda n, t, cls: t.detach().clone().as_subclass(cls).requires_grad_(n in case.grads)
    plain = {n: fresh(n, t, torch.Tensor) if n in case.tensors() else t for n, t in case.kwargs.items()}
    tagged = {n: fresh(n, t, Tagged) if n in case.tensors() else t for n, t in case.kwargs.items()}
    want, got = outputs(case.func(**plain)), outputs(case.func(**tagged))
    for g, w in zip(got, want):
        assert type(g) is Tagged and type(w) is torch.Tensor and torch.equal(g, w)
    for n in case.tensors():  # the caches' update, and nothing else changed
        assert torch.equal(tagged[n], plain[n]), n
    if case.reference is None:
        return
    as_float64 = lambda n, t: t.detach().double().requires_grad_(n in case.grads) if t.is_floating_point() else t
    reference_inputs = {n: as_float64(n, t) if n in case.tensors() else t for n, t in plain.items()}
    reference = case.reference(reference_inputs)
    float32 = want[0].dtype == torch.float32
    torch.testing.assert_close(want[0].double(), reference, rtol=1e-5 if float32 else 1e-10, atol=1e-6 if float32 else 1e-12)
    if not case.grads:
        return
    dout = randn(gen, *reference.shape)
    got_grads = torch.autograd.grad(got[0], [tagged[n] for n in case.grads], dout.to(got[0].dtype))
    want_grads = torch.autograd.grad(reference, [reference_inputs[n] for n in case.grads], dout)
    for n, g, w in zip(case.grads, got_grads, want_grads):
        assert type(g) is Tagged, n
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=n)


def test_an_override_s_errors_pass_unchanged(gen):
    """An override's own exception reaches the caller as it raised it (the drop-ins' RuntimeError
    forms are for attnscale's checks), as from torch.nn.functional's."""

    class Refuses(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if (getattr(func, "__module__", None) or "").startswith("attnscale"):
                raise ValueError("Refuses: no attention on this tensor")
            return super().__torch_function__(func, types, args, kwargs)

    for name, case in cases(gen).items():
        first = case.tensors()[0]
        with pytest.raises(ValueError, match="^Refuses: no attention on this tensor$") as caught:
            case.call(**{first: case.kwargs[first].as_subclass(Refuses)})
        assert type(caught.value) is ValueError, name
