"""attnscale.torch's thread count: threads=N, else $ATTNSCALE_THREADS, else torch.get_num_threads()
(python/attnscale/torch_threads.py). The observable is the threads keyword each kernel call receives
(a spy around the extension's functions), and results that do not depend on it."""
import pytest

import torch

import attnscale.torch as at
from attnscale import _attnscale, torch_threads


@pytest.fixture
def calls(monkeypatch):
    """[(kernel, threads keyword)] of every kernel call; torch's count and $ATTNSCALE_THREADS
    restored afterwards, and the machine's cores (torch_threads._CORES) made many, so that a torch count of 2 or 3 passes
    through as it is on any machine."""
    seen = []

    def spy(name):
        real = getattr(_attnscale, name)

        def call(*args, **kwargs):
            seen.append((name, kwargs.get("threads", 0)))
            return real(*args, **kwargs)

        return call

    for name in ("attention", "attention_backward", "decode"):
        monkeypatch.setattr(_attnscale, name, spy(name))
    monkeypatch.delenv("ATTNSCALE_THREADS", raising=False)
    monkeypatch.setattr(torch_threads, "_CORES", 64)
    before = torch.get_num_threads()
    yield seen
    torch.set_num_threads(before)


def _qkv(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 37, 4, 16, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(2, 41, 2, 16, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(2, 41, 2, 16, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def test_drop_ins_and_their_backward_honour_set_num_threads(calls):
    torch.set_num_threads(1)
    q, k, v = _qkv()
    at.flash_attn_func(q, k, v, causal=True).sum().backward()
    qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    at.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True).sum().backward()
    at.flash_attn_func(q, k, v, dropout_p=0.1, return_attn_probs=True)  # the probabilities' second pass
    kc, vc = torch.randn(2, 64, 2, 16), torch.randn(2, 64, 2, 16)
    at.flash_attn_with_kvcache(q.detach()[:, :1], kc, vc, cache_seqlens=40)
    assert [n for n, _ in calls] == ["attention", "attention_backward"] * 2 + ["attention"] * 2 + ["decode"]
    assert {t for _, t in calls} == {1}


def test_the_backward_reads_the_count_when_it_runs(calls):
    torch.set_num_threads(1)
    q, k, v = _qkv()
    out = at.flash_attn_func(q, k, v)
    torch.set_num_threads(3)
    out.sum().backward()
    assert calls == [("attention", 1), ("attention_backward", 3)]


def test_threads_keyword_then_environment_take_precedence(calls, monkeypatch):
    torch.set_num_threads(1)
    q, k, v = _qkv()
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # attnscale.torch.attention's [B, H, N, d]
    at.attention(qh, kh, vh, threads=2).sum().backward()  # attnscale's keyword, forward and backward
    monkeypatch.setenv("ATTNSCALE_THREADS", "3")
    at.flash_attn_func(q, k, v).sum().backward()  # 0: the library reads $ATTNSCALE_THREADS
    monkeypatch.setenv("ATTNSCALE_THREADS", "")  # empty is unset, as for the library
    at.flash_attn_func(q, k, v)
    assert calls == [("attention", 2), ("attention_backward", 2), ("attention", 0), ("attention_backward", 0),
                     ("attention", 1)]


def test_a_count_of_every_core_is_the_librarys_default(calls, monkeypatch):
    monkeypatch.setattr(torch_threads, "_CORES", 2)
    torch.set_num_threads(2)
    kc, vc = torch.randn(1, 8, 1, 16), torch.randn(1, 8, 1, 16)
    at.flash_attn_with_kvcache(torch.randn(1, 1, 2, 16), kc, vc)  # decode keeps its one-thread rule
    torch.set_num_threads(1)
    at.flash_attn_with_kvcache(torch.randn(1, 1, 2, 16), kc, vc)
    assert calls == [("decode", 0), ("decode", 1)]


def test_an_explicit_bad_threads_is_still_refused_by_name(calls):
    q, k, v = (t.transpose(1, 2) for t in _qkv())
    with pytest.raises(ValueError, match="threads: must be >= 0, got -1"):
        at.attention(q, k, v, threads=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_are_the_same_bits_for_1_2_and_3_torch_threads(calls, dtype):
    """Causal GQA with a window and ALiBi, forward and gradients, on 1, 2 and 3 threads."""
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    results = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        q, k, v = _qkv(dtype, seed=5)
        out = at.flash_attn_func(q, k, v, causal=True, window_size=(9, -1), alibi_slopes=slopes)
        (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        results.append([out.detach(), q.grad, k.grad, v.grad])
    assert {t for _, t in calls} == {1, 2, 3}
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
