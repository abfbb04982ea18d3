"""Gaussian-process regression: the negative log marginal likelihood (NLML) of an RBF kernel and
its gradient with respect to the three log-hyperparameters (``gp``), and also with respect to
the inputs ``x`` (``gp-x``).

    theta = (log l, log s2, log noise2)
    K     = s2 exp(-0.5 ||x_i - x_j||^2 / l^2) + (noise2 + JITTER) I
    L     = cholesky(K),  z = L^-1 y                           (lower-triangular solve)
    NLML  = 0.5 z.z + sum(log diag L) + n/2 log(2 pi)

Every tool runs this formula with its own factorisation: ``tape.linalg`` (``cholesky``,
``solve_triangular``, ``logdet_cholesky``), ``jax.scipy.linalg`` (jitted, float64),
``torch.linalg`` and HIPS autograd's ``numpy.linalg``/``scipy.linalg``. For ``gp`` the squared
distances are data (computed once, passed to every tool like ``y``); for ``gp-x`` they are part
of the differentiated formula.

"numpy (hand)" is the analytic gradient in NumPy/SciPy (LAPACK ``potrf``, ``potri``, no AD)::

    a = K^-1 y,  W = 0.5 (K^-1 - a a^T),  dNLML/dtheta_k = tr(W dK/dtheta_k)
    dK/dlog l = K_f * D / l^2,  dK/dlog s2 = K_f,  dK/dlog noise2 = noise2 I
    dNLML/dx_i = -(2 / l^2) sum_j W_ij K_f,ij (x_i - x_j)

(``K_f`` the RBF part, ``D`` the squared distances). Its value and gradient are also the
case's reference values (``Case.ref_value``/``ref_grad``): every tool, tape included, is checked
against them to 1e-8, besides the usual check against tape.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import scipy.linalg

from tape.bench.common import (
    autograd_grad,
    backend,
    jax_jit,
    tape_eager,
    tape_replay,
    torch_eager,
)
from tape.bench.harness import Case, Impl, Problem

JITTER = 1e-6
D_IN = 3
SIZES = (100, 1000)
THETA = np.log([0.5, 1.0, 0.05])  # log l, log s2, log noise2
LOG_2PI = math.log(2.0 * math.pi)


def make_data(n, d=D_IN, seed=0):
    """Inputs ``x`` (n, d) uniform on the unit cube and noisy smooth targets ``y`` (n,)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, (n, d))
    y = np.sin(3.0 * x[:, 0]) + x[:, 1] * np.cos(2.0 * x[:, -1]) + 0.1 * rng.standard_normal(n)
    return x, y - y.mean()


def sqdist(x):
    """``D[i, j] = ||x_i - x_j||^2`` (exactly 0 on the diagonal)."""
    diff = x[:, None, :] - x[None, :, :]
    return np.einsum("ijk,ijk->ij", diff, diff)


# ------------------------------------------------------------------ the formula, once


@functools.cache
def _linalg(name):
    """``(cholesky, lower-triangular solve, sum(log(diag(L))))`` of a backend."""
    if name == "tape":
        import tape as tp

        return (
            tp.linalg.cholesky,
            lambda L, b: tp.linalg.solve_triangular(L, b, lower=True),
            lambda L: 0.5 * tp.linalg.logdet_cholesky(L),
        )
    if name == "jax":
        B = backend("jax")
        import jax.scipy.linalg as jsl

        return (
            lambda K: jsl.cholesky(K, lower=True),
            lambda L, b: jsl.solve_triangular(L, b, lower=True),
            lambda L: B.jnp.sum(B.jnp.log(B.jnp.diagonal(L))),
        )
    if name == "torch":
        torch = backend("torch").torch

        return (
            torch.linalg.cholesky,
            lambda L, b: torch.linalg.solve_triangular(L, b, upper=False),
            lambda L: torch.log(torch.diagonal(L)).sum(),
        )
    if name == "autograd":
        import autograd.numpy as anp
        import autograd.scipy.linalg as asl

        return (
            anp.linalg.cholesky,
            lambda L, b: asl.solve_triangular(L, b, lower=True),
            lambda L: anp.sum(anp.log(anp.diag(L))),
        )
    raise ValueError(name)


def _nlml(B, theta, D, y, eye):
    """The NLML from the squared distances ``D``; ``y`` is a column ``(n, 1)``."""
    cholesky, solve_lower, logdiag = _linalg(B.name)
    ell2 = B.exp(2.0 * theta[0])
    s2 = B.exp(theta[1])
    noise2 = B.exp(theta[2])
    K = s2 * B.exp(-0.5 * D / ell2) + (noise2 + JITTER) * eye
    L = cholesky(K)
    z = solve_lower(L, y)
    n = y.shape[0]
    return 0.5 * B.sum(z * z) + logdiag(L) + 0.5 * n * LOG_2PI


def nlml_theta(B, params, consts):
    """``gp``: differentiate ``theta`` only; ``consts = (D, y column, I)``."""
    (theta,) = params
    D, y, eye = consts
    return _nlml(B, theta, D, y, eye)


def nlml_theta_x(B, params, consts):
    """``gp-x``: differentiate ``theta`` and ``x``; ``consts = (y column, I)``."""
    theta, x = params
    y, eye = consts
    n, d = x.shape
    diff = x.reshape((n, 1, d)) - x.reshape((1, n, d))
    D = B.sum(diff * diff, 2)
    return _nlml(B, theta, D, y, eye)


# ------------------------------------------------------------------ hand-written (NumPy/SciPy)


def nlml_grad_numpy(theta, x, y, D=None, wrt_x=False):
    """NLML and its analytic gradient with respect to ``theta`` (and ``x`` when ``wrt_x``):
    ``(value, g_theta)`` or ``(value, g_theta, g_x)``. ``D``: the squared distances of ``x``
    (computed when not given)."""
    if D is None:
        D = sqdist(x)
    n = y.shape[0]
    ell2, s2, noise2 = np.exp(2.0 * theta[0]), np.exp(theta[1]), np.exp(theta[2])
    Kf = s2 * np.exp(-0.5 * D / ell2)
    K = Kf + (noise2 + JITTER) * np.eye(n)
    L = scipy.linalg.cholesky(K, lower=True)
    z = scipy.linalg.solve_triangular(L, y, lower=True)
    a = scipy.linalg.solve_triangular(L, z, lower=True, trans="T")  # K^-1 y
    value = 0.5 * z @ z + np.log(np.diag(L)).sum() + 0.5 * n * LOG_2PI
    Kinv = kinv_from_cholesky(L)
    W = 0.5 * (Kinv - np.outer(a, a))
    WKf = W * Kf
    g = np.array([(WKf * D).sum() / ell2, WKf.sum(), noise2 * np.trace(W)])
    if not wrt_x:
        return value, g
    gx = -(2.0 / ell2) * (WKf.sum(axis=1)[:, None] * x - WKf @ x)
    return value, g, gx


def kinv_from_cholesky(L):
    """``K^-1`` (full, symmetric) from the lower Cholesky factor of ``K`` (LAPACK ``potri``)."""
    inv, info = scipy.linalg.lapack.dpotri(L, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"dpotri failed (info={info})")
    low = np.tril(inv)
    return low + np.tril(inv, -1).T


def nlml_numpy(theta, D, y):
    """The NLML alone (the hand tool's objective)."""
    n = y.shape[0]
    K = np.exp(theta[1]) * np.exp(-0.5 * D / np.exp(2.0 * theta[0]))
    K[np.diag_indices(n)] += np.exp(theta[2]) + JITTER
    L = scipy.linalg.cholesky(K, lower=True)
    z = scipy.linalg.solve_triangular(L, y, lower=True)
    return 0.5 * z @ z + np.log(np.diag(L)).sum() + 0.5 * n * LOG_2PI


# ------------------------------------------------------------------ cases


def builders(f, params, consts, hand):
    return {
        "tape": lambda: tape_replay(f, params, consts),
        "tape compiled": lambda: tape_replay(f, params, consts, compile=True),
        "tape eager": lambda: tape_eager(f, params, consts),
        "numpy (hand)": hand,
        "jax jit": lambda: jax_jit(f, params, consts),
        "torch": lambda: torch_eager(f, params, consts),
        "autograd": lambda: autograd_grad(f, params, consts),
    }


def gp_cases(opts):
    out = []
    for n in SIZES:
        x, y = make_data(n)
        D = sqdist(x)
        theta = THETA.copy()
        consts = (D, y[:, None], np.eye(n))

        def hand(theta=theta, x=x, y=y, D=D):
            return Impl(
                grad=lambda: nlml_grad_numpy(theta, x, y, D)[1],
                value=lambda: nlml_numpy(theta, D, y),
                note="analytic, SciPy potrf/potri",
            )

        v, g = nlml_grad_numpy(theta, x, y, D)
        out.append(
            Case(
                "gp", f"n={n}", n, builders(nlml_theta, [theta], consts, hand), ratio=True,
                ref_value=v, ref_grad=g, max_repeats=None if n < 1000 else 9,
            )
        )  # fmt: skip
    return out


def gp_x_cases(opts):
    out = []
    for n in (100,) if opts.quick else SIZES:
        x, y = make_data(n)
        theta = THETA.copy()
        consts = (y[:, None], np.eye(n))

        def hand(theta=theta, x=x, y=y):
            return Impl(
                grad=lambda: nlml_grad_numpy(theta, x, y, wrt_x=True)[1:],
                value=lambda: nlml_numpy(theta, sqdist(x), y),
                note="analytic, SciPy potrf/potri",
            )

        v, g, gx = nlml_grad_numpy(theta, x, y, wrt_x=True)
        out.append(
            Case(
                "gp-x", f"n={n}", n, builders(nlml_theta_x, [theta, x], consts, hand),
                ratio=True, ref_value=v, ref_grad=np.concatenate([g, gx.ravel()]),
                max_repeats=None if n < 1000 else 9,
            )
        )  # fmt: skip
    return out


PROBLEMS = [
    Problem(
        "gp",
        "Gaussian-process NLML (RBF, Cholesky), gradient w.r.t. (log l, log s2, log noise2), d=3",
        "n (points)",
        gp_cases,
        ratio=True,
    ),
    Problem(
        "gp-x",
        "Gaussian-process NLML (RBF, Cholesky), gradient w.r.t. the hyperparameters and x, d=3",
        "n (points)",
        gp_x_cases,
        ratio=True,
    ),
]
