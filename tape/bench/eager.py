"""Eager training loops, written once and run by tape and by PyTorch (the same code: ``T`` is
the ``tape`` module or the ``torch`` module).

- ``polynomial``: a cubic fitted to ``sin`` on 2,000 points by plain gradient descent with
  the update under ``no_grad`` (``a -= lr * a.grad``; ``a.grad = None``): ten elementwise ops
  and a sum per step, on 2,000-element tensors.
- ``mlp_adam``: a 2-layer MLP classifier (``linear``, ``relu``, ``cross_entropy``) trained with
  ``optim.Adam`` on 256 fixed points.
- ``scalar_chain``: 100-op chains of scalar ops and their ``backward``: the cost of one op.

Both run in float64 under both libraries (``set_default_dtype``), so their losses agree and
the timings compare the same arithmetic. ``python benchmarks/eager_loops.py`` times them side
by side; ``benchmarks/test_bench.py`` runs them under pytest-benchmark.
"""

from __future__ import annotations

import math
import time

import numpy as np

POLY_N = 2000
MLP_SHAPE = (256, 8, 64, 3)  # samples, features, hidden, classes


def polynomial(T, steps=2000, n=POLY_N):
    """The polynomial fit; returns the final loss."""
    x = T.linspace(-math.pi, math.pi, n, dtype=T.float64)
    y = T.sin(x)
    a, b, c, d = (T.tensor(v, dtype=T.float64, requires_grad=True) for v in (0.1, -0.2, 0.05, 0.01))
    lr = 1e-6
    loss = None
    for _ in range(steps):
        y_pred = a + b * x + c * x**2 + d * x**3
        loss = (y_pred - y).pow(2).sum()
        loss.backward()
        with T.no_grad():
            a -= lr * a.grad
            b -= lr * b.grad
            c -= lr * c.grad
            d -= lr * d.grad
            a.grad = None
            b.grad = None
            c.grad = None
            d.grad = None
    return loss.item()


def _mlp_data(shape=MLP_SHAPE):
    n, f, h, k = shape
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, f))
    labels = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5).astype(np.int64)
    W1 = rng.standard_normal((h, f)) / math.sqrt(f)
    W2 = rng.standard_normal((k, h)) / math.sqrt(h)
    return X, labels, W1, W2


def mlp_adam(T, steps=200, shape=MLP_SHAPE):
    """The MLP training loop; returns the final loss."""
    X, labels, W1, W2 = _mlp_data(shape)
    F = T.nn.functional
    x = T.tensor(X, dtype=T.float64)
    t = T.tensor(labels)
    w1 = T.tensor(W1, dtype=T.float64, requires_grad=True)
    b1 = T.zeros(shape[2], dtype=T.float64, requires_grad=True)
    w2 = T.tensor(W2, dtype=T.float64, requires_grad=True)
    b2 = T.zeros(shape[3], dtype=T.float64, requires_grad=True)
    opt = T.optim.Adam([w1, b1, w2, b2], lr=1e-2)
    loss = None
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), t)
        loss.backward()
        opt.step()
    return loss.item()


def polynomial_recorded(T, steps=2000, n=POLY_N):
    """The same fit with the loss recorded once (``tape.record``) and its gradient replayed
    every step: tape's way for a hot loop (PyTorch has no counterpart; returns None there)."""
    if not hasattr(T, "record"):
        return None
    x = np.linspace(-math.pi, math.pi, n)
    y = np.sin(x)

    def loss_fn(p):
        return ((p[0] + p[1] * x + p[2] * x**2 + p[3] * x**3 - y) ** 2).sum()

    p = np.array([0.1, -0.2, 0.05, 0.01])
    t = T.record(loss_fn, p, compile=True)
    lr = 1e-6
    loss = None
    for _ in range(steps):
        loss, g = t.value_and_grad(p)
        p -= lr * g
    return float(loss)


CHAIN = 50  # links of the scalar chain: 2 ops each


def scalar_chain(T, steps=1000, length=CHAIN):
    """Per-op overhead: a chain of ``length`` scalar links ``y = y * 1.0001 + 0.5`` (two ops
    each) and its ``backward``, ``steps`` times; returns the last value. Time / (steps *
    2 * length) is the cost of one eager op, its backward included."""
    w = T.tensor(0.5, dtype=T.float64, requires_grad=True)
    y = w
    for _ in range(steps):
        y = w
        for _ in range(length):
            y = y * 1.0001 + 0.5
        y.backward()
        w.grad = None
    return y.item()


LOOPS = {"polynomial": polynomial, "mlp_adam": mlp_adam, "scalar_chain": scalar_chain}
PER_OP = {"scalar_chain": 1000 * 2 * CHAIN}  # ops per run, to report a time per op
RECORDED = {"polynomial": polynomial_recorded}


def peers():
    """``{name: module}`` of the libraries to time: tape, and torch when installed."""
    import tape

    out = {"tape": tape}
    try:
        import torch
    except ImportError:
        return out
    torch.set_num_threads(1)  # one core each: the same as tape's eager mode
    out["torch"] = torch
    return out


def time_loop(loop, T, repeats=3):
    """Best wall time of ``repeats`` runs (after one warm-up run) and the final loss."""
    loss = loop(T)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = loop(T)
        best = min(best, time.perf_counter() - t0)
    return best, loss
