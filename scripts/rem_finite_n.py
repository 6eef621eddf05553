#!/usr/bin/python3
"""Monte Carlo of the Random Energy Model at finite N against the lab's hot-phase formulas.

Rows of N i.i.d. N(0, 1) z, weights softmax(sigma z): mean entropy, top_p_95 count and 1/sum p^2,
next to ln N - sigma^2/2 (above sigma_c: the N = inf frozen law psi(1) - psi(1 - sigma_c/sigma)), N Phi(Phi^-1(0.95) - sigma) + 1/2 and N e^(-sigma^2) (src/lab/theory.h).
Usage: /usr/bin/python3 scripts/rem_finite_n.py   (numpy only; seed fixed)
"""
import math

import numpy as np

Z95 = 1.6448536269514722


def phi_cdf(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def digamma(x):
    r = 0.0
    while x < 10:
        r -= 1 / x
        x += 1
    f = 1 / (x * x)
    return r + math.log(x) - 0.5 / x - f * (1 / 12 - f * (1 / 120 - f / 252))


def metrics(rng, n, sigma, rows):
    x = rng.standard_normal((rows, n)) * sigma
    x -= x.max(1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(1, keepdims=True)
    h = -(p * np.log(np.where(p > 0, p, 1))).sum(1)
    top = (np.cumsum(-np.sort(-p, 1), 1) < 0.95).sum(1) + 1
    return h.mean(), top.mean(), (1 / (p * p).sum(1)).mean()


def main():
    rng = np.random.default_rng(1)
    print("N      s/sc  sigma | entropy  hot/frozen | top_p_95  theory+1/2 | 1/sum p^2  N e^-s^2")
    for n in [8, 50, 256, 4096]:
        sc = math.sqrt(2 * math.log(n))
        for f in [0.25, 0.4, 0.5, 0.7, 1.5, 2, 4]:
            s = f * sc
            h_th = math.log(n) - s * s / 2 if f < 1 else digamma(1) - digamma(1 - 1 / f)
            h, top, part = metrics(rng, n, s, 4000 if n < 1000 else 500)
            print(f"{n:<6d} {f:4.2f} {s:6.2f} | {h:7.3f} {h_th:11.3f} | "
                  f"{top:8.2f} {n * phi_cdf(Z95 - s) + 0.5:11.2f} | {part:9.2f} {n * math.exp(-s * s):9.2f}")


if __name__ == "__main__":
    main()
