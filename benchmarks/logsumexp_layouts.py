"""``tp.logsumexp`` as one entry against the same function composed of its parts.

``python benchmarks/logsumexp_layouts.py``

The composed form is what ``tp.logsumexp`` recorded before it was one entry: the maximum
(without gradient), ``exp`` of the shifted values, ``sum``, ``log`` and the shift added back.
Each case is recorded on the interpreter (``compile=False``) and its forward replay and
gradient are timed (best of 5 batches, microseconds per call, Python's call included):

- rows across an inner axis: a (25, 1000) array over axis 0 (GMM's shape);
- long rows along the last axis: (1000, 25) over axis 1;
- short rows along the last axis: (256, 10) over axis 1 (taken 256 at a time, side by side).

Both forms are checked against ``scipy.special.logsumexp`` first.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.special import logsumexp as sp_logsumexp

import tape as tp


def composed(a, axis):
    m = a.max(axis=axis, keepdims=True).detach()
    return (tp.log(tp.exp(a - m).sum(axis=axis)) + tp.squeeze(m, axis)).sum()


def clock(f, n=300):
    f()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main():
    rng = np.random.default_rng(0)
    cases = [
        ("(25, 1000) over axis 0", rng.normal(size=(25, 1000)), 0),
        ("(1000, 25) over axis 1", rng.normal(size=(1000, 25)), 1),
        ("(256, 10) over axis 1", rng.normal(size=(256, 10)), 1),
    ]
    print(f"{'case':24s} {'form':9s} {'forward us':>11s} {'gradient us':>12s}")
    for name, x, axis in cases:
        forms = (
            ("one entry", lambda a, axis=axis: tp.logsumexp(a, axis=axis).sum()),
            ("composed", lambda a, axis=axis: composed(a, axis)),
        )
        want = sp_logsumexp(x, axis=axis).sum()
        for form, fn in forms:
            t = tp.record(fn, x, compile=False)
            got = float(np.asarray(t.forward(x)))
            assert abs(got - want) <= 1e-12 * abs(want), (name, form, got, want)
            print(f"{name:24s} {form:9s} {clock(lambda: t.forward(x)):11.1f} "
                  f"{clock(lambda: t.gradient(x)):12.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
