"""Rosenbrock, two MLP losses and the lesson's linear regression."""

from __future__ import annotations

import numpy as np
from numba import njit

from tape.bench.common import scalar_builders
from tape.bench.harness import Case, Impl, Problem

# ------------------------------------------------------------------ Rosenbrock


def rosenbrock(B, params, consts):
    (x,) = params
    return B.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


@njit(cache=True, error_model="numpy")
def rosenbrock_grad_njit(x):
    """Value and gradient in one fused loop."""
    n = x.shape[0]
    g = np.zeros(n)
    f = 0.0
    for i in range(n - 1):
        a = x[i + 1] - x[i] * x[i]
        b = 1.0 - x[i]
        f += 100.0 * a * a + b * b
        g[i] += -400.0 * a * x[i] - 2.0 * b
        g[i + 1] += 200.0 * a
    return f, g


@njit(cache=True, error_model="numpy")
def rosenbrock_njit(x):
    f = 0.0
    for i in range(x.shape[0] - 1):
        a = x[i + 1] - x[i] * x[i]
        b = 1.0 - x[i]
        f += 100.0 * a * a + b * b
    return f


def rosenbrock_cases(opts):
    sizes = (10, 1000, 100_000) if opts.quick else (10, 100, 1000, 10_000, 100_000)
    out = []
    for n in sizes:
        x = np.random.default_rng(0).uniform(-1.0, 2.0, n)

        def hand(x=x):
            return Impl(grad=lambda: rosenbrock_grad_njit(x)[1], value=lambda: rosenbrock_njit(x))

        tools = scalar_builders(rosenbrock, [x], hand=hand, vector_peers=True)
        out.append(Case("rosenbrock", f"n={n}", n, tools))
    return out


# ------------------------------------------------------------------ MLPs


def mlp_tanh_mse(B, params, consts):
    W1, b1, W2, b2 = params
    X, y = consts
    h = B.tanh(X @ W1 + b1)
    r = h @ W2 + b2 - y
    return B.sum(r * r) / r.shape[0]


@njit(cache=True, error_model="numpy")
def mlp_tanh_mse_grad_njit(W1, b1, W2, b2, X, y):
    h = np.tanh(X @ W1 + b1)
    r = h @ W2 + b2 - y
    nb = X.shape[0]
    dr = (2.0 / nb) * r
    gW2 = h.T @ dr
    gb2 = dr.sum(axis=0)
    dh = (dr @ W2.T) * (1.0 - h * h)
    gW1 = X.T @ dh
    gb1 = dh.sum(axis=0)
    return (r * r).sum() / nb, gW1, gb1, gW2, gb2


def _mlp_params(rng, sizes):
    out = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        out += [rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b)]
    return out


def mlp_cases(opts):
    rng = np.random.default_rng(1)
    params = _mlp_params(rng, (32, 64, 1))
    X = rng.normal(size=(64, 32))
    y = rng.normal(size=(64, 1))

    def hand():
        return Impl(
            grad=lambda: mlp_tanh_mse_grad_njit(*params, X, y)[1:],
            value=lambda: mlp_tanh_mse_grad_njit(*params, X, y)[0],
            note="hand-written forward+backward, also used as objective",
        )

    return [
        Case(
            "mlp",
            "batch 64, 32-64-1 tanh, MSE",
            64 * 32 * 64,
            scalar_builders(mlp_tanh_mse, params, (X, y), hand=hand),
        )
    ]


def mlp_softmax_ce(B, params, consts):
    W1, b1, W2, b2 = params
    X, onehot = consts
    h = B.tanh(X @ W1 + b1)
    z = h @ W2 + b2
    logp = z - B.lse(z, 1).reshape((z.shape[0], 1))
    return -B.sum(onehot * logp) / z.shape[0]


@njit(cache=True, error_model="numpy")
def mlp_softmax_ce_grad_njit(W1, b1, W2, b2, X, onehot):
    h = np.tanh(X @ W1 + b1)
    z = h @ W2 + b2
    nb, nc = z.shape
    p = np.empty_like(z)
    loss = 0.0
    for i in range(nb):
        m = z[i].max()
        s = 0.0
        for j in range(nc):
            p[i, j] = np.exp(z[i, j] - m)
            s += p[i, j]
        lse = np.log(s) + m
        for j in range(nc):
            loss -= onehot[i, j] * (z[i, j] - lse)
            p[i, j] /= s
    dz = (p - onehot) / nb
    gW2 = h.T @ dz
    gb2 = dz.sum(axis=0)
    dh = (dz @ W2.T) * (1.0 - h * h)
    gW1 = X.T @ dh
    gb1 = dh.sum(axis=0)
    return loss / nb, gW1, gb1, gW2, gb2


def mlp_large_cases(opts):
    rng = np.random.default_rng(2)
    params = _mlp_params(rng, (256, 256, 10))
    X = rng.normal(size=(256, 256))
    onehot = np.eye(10)[rng.integers(0, 10, 256)]

    def hand():
        return Impl(
            grad=lambda: mlp_softmax_ce_grad_njit(*params, X, onehot)[1:],
            value=lambda: mlp_softmax_ce_grad_njit(*params, X, onehot)[0],
            note="hand-written forward+backward, also used as objective",
        )

    return [
        Case(
            "mlp-large", "batch 256, 256-256-10 tanh, softmax CE", 256 * 256 * 266,
            scalar_builders(mlp_softmax_ce, params, (X, onehot), hand=hand),
        )
    ]  # fmt: skip


# ------------------------------------------------------------------ linear regression (the lesson)


def linreg(B, params, consts):
    w, b = params
    x, target = consts
    e = x @ w + b - target
    return B.sum(e * e) / e.shape[0]


LINREG = dict(
    params=[np.array([1.0, -1.0]), np.array(0.0)],
    consts=(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.0, 2.0])),
    value=5.0,
    grad=np.array([-10.0, -14.0, -4.0]),
)


@njit(cache=True, error_model="numpy")
def linreg_grad_njit(w, b, x, target):
    e = x @ w + b - target
    n = e.shape[0]
    de = (2.0 / n) * e
    return (e * e).sum() / n, x.T @ de, de.sum()


def linreg_cases(opts):
    p, c = LINREG["params"], LINREG["consts"]

    def hand():
        return Impl(
            grad=lambda: linreg_grad_njit(p[0], float(p[1]), *c)[1:],
            value=lambda: linreg_grad_njit(p[0], float(p[1]), *c)[0],
        )

    return [
        Case(
            "linreg", "the lesson's 2x2 example", 4, scalar_builders(linreg, p, c, hand=hand),
            ref_value=LINREG["value"], ref_grad=LINREG["grad"],
        )
    ]  # fmt: skip


PROBLEMS = [
    Problem(
        "rosenbrock", "gradient of sum(100 (x[i+1]-x[i]^2)^2 + (1-x[i])^2)", "n", rosenbrock_cases
    ),
    Problem("mlp", "MLP loss gradient, batch 64, 32 -> 64 -> 1, tanh, MSE", "flops", mlp_cases),
    Problem(
        "mlp-large",
        "MLP loss gradient, batch 256, 256 -> 256 -> 10, tanh, softmax cross-entropy",
        "flops",
        mlp_large_cases,
    ),
    Problem(
        "linreg",
        "the lesson's linear regression, mean((x @ w + b - t)^2) (per-call overhead)",
        "n",
        linreg_cases,
    ),
]
