"""ADBench GMM: objective and full gradient (alphas, means, icf), vectorised over points.

Formula: ``shared/adbench/README.md`` §1.1. The same vectorised formula runs in every tool,
with points along the last axis so that ``Q_k (x_i - mu_k)`` is one batched matmul
``(K, d, d) @ (K, d, n)``:

    xc   = x^T - mu[:, :, None]                          (K, d, n)
    Qxc  = exp(q)[:, :, None] * xc + L @ xc              L strictly lower, gathered from icf
    main = (alpha + sum(q))[:, None] - 0.5 * sum(Qxc^2, axis=1)          (K, n)
    E    = const + sum_i logsumexp_k(main) - n logsumexp(alpha) + prior

The hand-written gradient is a per-point Numba loop (ADBench's "Manual" derivation).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from scipy.special import multigammaln

from tape.bench import adbench
from tape.bench.common import scalar_builders
from tape.bench.harness import Case, Impl, Problem, Skip

# shared/adbench/README.md §3 (independent NumPy transcription, checked against ADBench's tests)
REFERENCE = {
    ("1k", 2): (-5.240590562550e03, -3.484552366348e03, -3.448405753455e03, -2.814238089690e03),
    ("1k", 10): (-3.130254091091e04, -3.029294195924e04, -2.564965262120e04, -1.915598085378e04),
    ("1k", 20): (-1.214085665026e05, -1.122019157422e05, -9.079862270073e04, -6.562950687127e04),
    ("1k", 32): (-3.383977255264e05, -2.746175857847e05, -2.258163101841e05, -1.766865222231e05),
    ("1k", 64): (-1.304563985381e06, -1.171496287285e06, -9.441885418660e05, -7.149169877011e05),
    ("10k", 2): (-5.251230605452e04, -3.559862177429e04, -3.593516488195e04, -3.263525611295e04),
    ("10k", 10): (-3.159263210426e05, -3.215765461222e05, -2.901933879750e05, -2.569175653759e05),
    ("10k", 20): (-1.238552791706e06, -1.177169641180e06, -1.016960247700e06, -8.993344738808e05),
    ("10k", 32): (-3.489581189896e06, -2.887580074211e06, -2.560311186668e06, -2.363921719032e06),
}
TEST_VALUE = 8.07380408004975791  # gmm/test.txt, ADBench GmmTests.cpp
TEST_GRAD = np.array([
    0.108662855508652456, -0.741270039523898472, 0.632607184015246071, 1.11692576532787013,
    0.163333013551455269, -0.0219989824071193142, 0.227778292254236098, 1.20963025612832187,
    -0.0606375920733956339, 2.58529994051162237, 0.112632694524213789, 0.385744309849611777,
    0.0735180573182305508, 5.41836362715595232, -0.321494409677446469, 1.71892309775004937,
    0.860091090790866875, -0.994640930466322848,
])  # fmt: skip


def reference_value(subset, d, K):
    vals = REFERENCE.get((subset, d))
    ks = (5, 10, 25, 50)
    return vals[ks.index(K)] if vals and K in ks else None


def constant_term(d, K, n, gamma, m):
    """``-n d/2 log(2 pi) - K C(d, gamma, m)`` (the part of E that depends on no parameter)."""
    nw = d + m + 1
    C = nw * d * (math.log(gamma) - 0.5 * math.log(2.0)) - multigammaln(0.5 * nw, d)
    return -0.5 * n * d * math.log(2.0 * math.pi) - K * C


def lower_index(d):
    """Column of icf holding L[r, c] for each flat (r, c) (0 outside the strict lower
    triangle), and the strict-lower mask. l is packed column-wise: for c, for r > c."""
    idx = np.zeros((d, d), np.int64)
    mask = np.zeros((d, d))
    k = d
    for c in range(d):
        for r in range(c + 1, d):
            idx[r, c] = k
            mask[r, c] = 1.0
            k += 1
    return idx.ravel(), mask


def make_objective(d, K, n, gamma, m):
    const = constant_term(d, K, n, gamma, m)

    def gmm(B, params, consts):
        alphas, means, icf = params
        xT, lidx, mask = consts
        q = icf[:, :d]
        qdiag = B.exp(q)
        sum_qs = B.sum(q, 1)
        L = B.take_cols(icf, lidx).reshape((K, d, d)) * mask
        xc = xT - means.reshape((K, d, 1))
        qxc = qdiag.reshape((K, d, 1)) * xc + L @ xc
        main = (alphas + sum_qs).reshape((K, 1)) - 0.5 * B.sum(qxc * qxc, 1)
        prior = 0.5 * gamma * gamma * (B.sum(qdiag * qdiag) + B.sum(icf[:, d:] ** 2)) - m * B.sum(
            sum_qs
        )
        return const + B.sum(B.lse(main, 0)) - n * B.lse(alphas) + prior

    return gmm


def consts_for(data):
    lidx, mask = lower_index(data.d)
    return (np.ascontiguousarray(data.x.T), lidx, mask)


# ------------------------------------------------------------------ hand-written (Numba)


@njit(cache=True, error_model="numpy")
def _qx(icf, means, x, i, k, d, qdiag, xc, z):
    for j in range(d):
        xc[j] = x[i, j] - means[k, j]
        z[j] = qdiag[k, j] * xc[j]
    idx = d
    for c in range(d):
        for r in range(c + 1, d):
            z[r] += icf[k, idx] * xc[c]
            idx += 1
    s = 0.0
    for j in range(d):
        s += z[j] * z[j]
    return s


@njit(cache=True, error_model="numpy")
def _lse(v):
    mx = v.max()
    return np.log(np.exp(v - mx).sum()) + mx


@njit(cache=True, error_model="numpy")
def gmm_objective_njit(alphas, means, icf, x, gamma, m, const):
    K, d = means.shape
    n = x.shape[0]
    qdiag = np.exp(icf[:, :d])
    sum_qs = icf[:, :d].sum(axis=1)
    xc = np.empty(d)
    z = np.empty(d)
    beta = np.empty(K)
    total = 0.0
    for i in range(n):
        for k in range(K):
            beta[k] = alphas[k] + sum_qs[k] - 0.5 * _qx(icf, means, x, i, k, d, qdiag, xc, z)
        total += _lse(beta)
    prior = (
        0.5 * gamma * gamma * ((qdiag * qdiag).sum() + (icf[:, d:] ** 2).sum()) - m * sum_qs.sum()
    )
    return const + total - n * _lse(alphas) + prior


@njit(cache=True, error_model="numpy")
def gmm_grad_njit(alphas, means, icf, x, gamma, m, const):
    """Value and gradient (alphas, means, icf) by the hand derivation, one pass over points."""
    K, d = means.shape
    n = x.shape[0]
    qdiag = np.exp(icf[:, :d])
    sum_qs = icf[:, :d].sum(axis=1)
    ga = np.zeros(K)
    gm = np.zeros((K, d))
    gi = np.zeros(icf.shape)
    xcs = np.empty((K, d))
    zs = np.empty((K, d))
    beta = np.empty(K)
    total = 0.0
    for i in range(n):
        for k in range(K):
            beta[k] = (
                alphas[k] + sum_qs[k] - 0.5 * _qx(icf, means, x, i, k, d, qdiag, xcs[k], zs[k])
            )
        lse = _lse(beta)
        total += lse
        for k in range(K):
            p = np.exp(beta[k] - lse)
            ga[k] += p
            xc = xcs[k]
            z = zs[k]
            for j in range(d):
                gi[k, j] += p * (1.0 - z[j] * qdiag[k, j] * xc[j])
                gm[k, j] += p * qdiag[k, j] * z[j]
            idx = d
            for c in range(d):
                for r in range(c + 1, d):
                    gi[k, idx] -= p * z[r] * xc[c]
                    gm[k, c] += p * icf[k, idx] * z[r]
                    idx += 1
    lse_a = _lse(alphas)
    ga -= n * np.exp(alphas - lse_a)
    g2 = gamma * gamma
    gi[:, :d] += g2 * qdiag * qdiag - m
    gi[:, d:] += g2 * icf[:, d:]
    prior = 0.5 * g2 * ((qdiag * qdiag).sum() + (icf[:, d:] ** 2).sum()) - m * sum_qs.sum()
    return const + total - n * lse_a + prior, ga, gm, gi


def hand_builder(data):
    const = constant_term(data.d, data.K, data.n, data.gamma, data.m)
    a = (data.alphas, data.means, data.icf, data.x, data.gamma, float(data.m), const)

    def build():
        return Impl(grad=lambda: gmm_grad_njit(*a)[1:], value=lambda: gmm_objective_njit(*a))

    return build


def builders(data, eager=True):
    f = make_objective(data.d, data.K, data.n, data.gamma, data.m)
    out = scalar_builders(
        f,
        [data.alphas, data.means, data.icf],
        consts_for(data),
        hand=hand_builder(data),
        eager=eager,
    )
    return out


QUICK = (("1k", 2, 5), ("1k", 10, 25), ("10k", 10, 25))


def gmm_cases(opts):
    root = adbench.find_data_dir(opts.data_dir)
    if root is None:
        raise Skip(f"no ADBench data (set ${adbench.ENV_VAR} or --adbench)")
    out = []
    for subset in ("1k", "10k"):
        for label, path in adbench.gmm_files(root, subset):
            _, dtok, ktok = label.split()
            d, K = int(dtok[1:]), int(ktok[1:])
            if opts.quick and (subset, d, K) not in QUICK:
                continue
            data = adbench.read_gmm(path)  # sizes from the header
            big = data.n * data.K * data.d > 4_000_000
            case = Case(
                "gmm", f"{subset} d{data.d} K{data.K}", data.n_params, builders(data, eager=not big),
                ratio=True, ref_value=reference_value(subset, data.d, data.K),
            )  # fmt: skip
            if big:
                case.notes.append(
                    "tape eager left out (n*K*d > 4e6: it measures the same sweeps as replay, plus recording)"
                )
            out.append(case)
    return out


PROBLEMS = [
    Problem(
        "gmm",
        "ADBench GMM objective gradient (vectorised; 1k and 10k points)",
        "parameters",
        gmm_cases,
        ratio=True,
    ),
]
