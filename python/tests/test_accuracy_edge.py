"""Accuracy at the edge: FlashAttention's rule against a plain float32 implementation.

For every scaling and d_k up to 4096, the error of attnscale's float32 forward and backward against
the float64 reference must be at most twice the error of matmul, softmax, matmul in float32 PyTorch
(and its autograd) on the same inputs; where d_k <= 256 it must also stay within 1e-5 relative.
Errors are norm-wise, ||x - ref|| / ||ref||, pooled over eight random inputs so that one lucky
draw of the float32 baseline does not decide: the baseline's error depends on the BLAS kernel the
CPU gets (OpenBLAS's AVX-512 kernels on an Intel Xeon err less than its AVX2 ones on AMD), and with
three inputs a ratio that pools to 1.2-1.6 on this size came out at 2.06 on one case there
(dq, d_k = 256, unscaled, causal). Over 108 other seeded cases with eight inputs the largest ratio
was 1.93 (dv with linear scaling, 1.65-1.9 throughout: the backward's P = e^(t - lse)).
"""
import numpy as np
import pytest
import torch

import attnscale
import torch_reference

SCALES = ["none", "sqrt", "linear"]


def float32_torch(q, k, v, dout, scale, causal):
    """out and (dq, dk, dv) of the plain float32 composition, with torch's autograd."""
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    s = torch_reference.scale_value(scale, q.shape[-1])
    scores = (tq @ tk.transpose(-1, -2)) * s
    if causal:
        keep = torch_reference.keep_matrix(q.shape[-2], k.shape[-2], causal=True)
        scores = scores.masked_fill(~keep, -float("inf"))
    out = torch.softmax(scores, dim=-1) @ tv
    out.backward(torch.from_numpy(dout))
    return out.detach().numpy(), (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())


def float64_reference(q, k, v, dout, scale, causal):
    tq, tk, tv = (torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v))
    out, _, _ = torch_reference.attention(tq, tk, tv, scale=scale, causal=causal or None)
    out.backward(torch.from_numpy(dout.astype(np.float64)))
    return out.detach().numpy(), (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())


def errors(rng, dk, scale, causal, trials=8, nq=24, nkv=40, heads=2):
    """Pooled relative errors {name: (ours, torch float32)} for out, dq, dk, dv."""
    num = {}
    den = {}
    for _ in range(trials):
        q, k, v = (rng.standard_normal((heads, n, dk)).astype(np.float32) for n in (nq, nkv, nkv))
        dout = rng.standard_normal((heads, nq, dk)).astype(np.float32)
        options = dict(scale=scale, causal=True if causal else None)
        out, lse = attnscale.attention(q, k, v, return_lse=True, **options)
        grads = attnscale.attention_backward(q, k, v, out, lse, dout, **options)
        base_out, base_grads = float32_torch(q, k, v, dout, scale, causal)
        ref_out, ref_grads = float64_reference(q, k, v, dout, scale, causal)
        for name, ours, theirs, ref in zip(("out", "dq", "dk", "dv"), (out, *grads), (base_out, *base_grads),
                                           (ref_out, *ref_grads)):
            n = num.setdefault(name, [0.0, 0.0])
            n[0] += float(np.sum((ours - ref) ** 2))
            n[1] += float(np.sum((theirs - ref) ** 2))
            den[name] = den.get(name, 0.0) + float(np.sum(ref**2))
    return {name: (np.sqrt(n[0] / den[name]), np.sqrt(n[1] / den[name])) for name, n in num.items()}


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dk", [64, 256, 1024, 4096])
@pytest.mark.parametrize("causal", [False, True])
def test_within_twice_plain_float32(rng, dk, scale, causal):
    for name, (ours, theirs) in errors(rng, dk, scale, causal).items():
        # A floor of a few float32 ulps for the rare case where the baseline's error is ~0.
        assert ours <= max(2 * theirs, 4e-7), f"{name}: {ours:.3g} vs float32 torch {theirs:.3g}"
        if dk <= 256:
            assert ours <= 1e-5, f"{name}: {ours:.3g} relative at d_k = {dk}"


if __name__ == "__main__":
    # The ratios the test bounds by 2, as a table:
    #   PYTHONPATH=build/python /usr/bin/python3 python/tests/test_accuracy_edge.py
    table_rng = np.random.default_rng(5)
    print("d_k  scale   causal  " + "  ".join(f"{n:>5}" for n in ("out", "dq", "dk", "dv")) + "   (ours / float32 torch)")
    for dk in (64, 128, 256, 1024, 4096):
        for scale in SCALES:
            for causal in (False, True):
                e = errors(table_rng, dk, scale, causal, trials=6, nq=64, nkv=200)
                print(f"{dk:<4} {scale:<7} {str(causal):<7} " + "  ".join(f"{a / b:5.2f}" for a, b in e.values()))
