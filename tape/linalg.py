"""``tape.linalg``: NumPy's ``numpy.linalg`` (and SciPy's ``solve_triangular``) on tensors,
differentiable to every order, eagerly and in recorded tapes, batched over leading axes.

========================  ==================================================================
``solve(a, b)``           ``x`` with ``a @ x = b``; ``b`` is a vector when it is 1-D
``solve_triangular``      the same with only the lower (``lower=True``) or upper triangle of
                          ``a`` read (SciPy's default is ``lower=False``)
``cholesky(a)``           lower-triangular ``L`` with ``L @ L.T = a``; reads the lower
                          triangle of ``a`` only, as NumPy does, so the gradient with respect
                          to ``a`` is lower triangular (symmetrise it for a symmetric one)
``slogdet(a)``            ``(sign, logabsdet)``; the sign has a zero gradient
``det(a)``                ``sign * exp(logabsdet)``
``inv(a)``                ``solve(a, I)``
``logdet_cholesky(l)``    ``log det(L @ L.T) = 2 sum(log(diag(L)))`` for a Cholesky factor
``norm``, ``matmul``      as :func:`tape.norm`, :func:`tape.matmul`
========================  ==================================================================

The rules are the standard matrix-calculus results for the whole factorisation (no
differentiation through its loops): see :mod:`tape.ops.factor`. Data with no answer raise
instead of returning a number: a singular matrix in ``solve``, ``slogdet``, ``det`` and
``inv`` (its log-determinant is ``-inf``, without a derivative), and a matrix that is not
positive definite in ``cholesky``. Both raise ``numpy.linalg.LinAlgError``
(``tape.linalg.LinAlgError``): eagerly at the call, and from a replay of a recorded tape
whose new data hit the case, naming the entry and the line that recorded it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tape import _tensor as T
from tape._front.linalg import matmul
from tape._front.movement import broadcast_to, strided
from tape.functional import exp, log, norm, stop_gradient
from tape.functional import sum as _sum
from tape.ops.factor import CHOLESKY, GENERAL, LOWER, SLOGDET, SOLVE, UPPER

__all__ = [
    "solve", "solve_triangular", "cholesky", "slogdet", "det", "inv", "logdet_cholesky",
    "SlogdetResult", "LinAlgError", "norm", "matmul",
]  # fmt: skip

LinAlgError = np.linalg.LinAlgError


class SlogdetResult(NamedTuple):
    """What :func:`slogdet` returns, as NumPy names it."""

    sign: T.Tensor
    logabsdet: T.Tensor


def _float(x):
    x = T.as_tensor(x)
    if x.dtype.kind != "f":
        x = (
            T.tensor(x.numpy().astype(T.get_default_dtype()))
            if x._tape is None
            else x.to(np.float64)
        )
    return x


def _square(x, name):
    x = _float(x)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{name}: expected a square matrix or a batch of them (shape (..., n, n)), "
            f"got shape {x.shape}"
        )
    return x


def _batched(x, batch, n_rows, n_cols):
    """``x`` (batch shape ``x.shape[:-2]``) as ``(nb, rows, cols)`` against the broadcast
    batch ``batch``: its own memory with a batch stride (``0``: one matrix for all), or a
    broadcast copy."""
    own = x.shape[:-2]
    per = n_rows * n_cols
    if own == batch:
        return x, per
    if math.prod(own) == 1:
        return x, 0
    return broadcast_to(x, batch + (n_rows, n_cols)), per


def _solve(a, b, mode, name):
    a = _square(a, name)
    b = _float(b)
    n = a.shape[-1]
    vec = b.ndim == 1
    b2 = T.view(b, b.shape + (1,), 0) if vec else b
    if b2.ndim < 2 or b2.shape[-2] != n:
        raise ValueError(
            f"{name}: b of shape {b.shape} does not match a of shape {a.shape}: expected "
            f"(n,) or (..., n, k) with n = {n}"
        )
    k = b2.shape[-1]
    try:
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b2.shape[:-2]))
    except ValueError:
        raise ValueError(
            f"{name}: batch shapes {a.shape[:-2]} and {b2.shape[:-2]} do not broadcast"
        ) from None
    a3, sa = _batched(a, batch, n, n)
    b3, sb = _batched(b2, batch, n, k)
    nb = math.prod(batch)
    out = T.apply(SOLVE, [a3, b3], batch + (n, k), [nb, n, k, sa, sb, mode])
    return T.view(out, batch + (n,), 0) if vec else out


def solve(a, b):
    """Solve ``a @ x = b`` (``numpy.linalg.solve``): ``a`` is ``(..., n, n)``, ``b`` is
    ``(n,)`` or ``(..., n, k)``, batch axes broadcast. Differentiable in both; raises
    ``LinAlgError`` for a singular ``a``."""
    return _solve(a, b, GENERAL, "solve")


def solve_triangular(a, b, lower=False):
    """Solve ``a @ x = b`` reading only the lower (``lower=True``) or upper triangle of ``a``
    (``scipy.linalg.solve_triangular``, batched like :func:`solve`). The gradient with respect
    to ``a`` lies in that triangle. A zero on the diagonal raises ``LinAlgError``."""
    return _solve(a, b, LOWER if lower else UPPER, "solve_triangular")


def cholesky(a):
    """Lower-triangular ``L`` with ``L @ L.T = a`` (``numpy.linalg.cholesky``), batched.

    Only the lower triangle of ``a`` is read, as in NumPy, so the gradient with respect to
    ``a`` is lower triangular; when ``a`` is built symmetrically (``X @ X.T + c I``) every
    gradient upstream is the same as with a symmetric convention. A matrix that is not
    positive definite raises ``LinAlgError``."""
    a = _square(a, "cholesky")
    n = a.shape[-1]
    nb = math.prod(a.shape[:-2])
    return T.apply(CHOLESKY, [a], a.shape, [nb, n])


def slogdet(a):
    """``(sign, logabsdet)`` of the determinant (``numpy.linalg.slogdet``), batched. The
    gradient of ``logabsdet`` is ``inv(a).T``; the sign's is zero. A singular matrix raises
    ``LinAlgError`` (its log-determinant is ``-inf`` and has no derivative)."""
    a = _square(a, "slogdet")
    n = a.shape[-1]
    batch = a.shape[:-2]
    nb = math.prod(batch)
    out = T.apply(SLOGDET, [a], (nb, 2), [nb, n])
    sign = strided(out, batch, 0, _batch_strides(batch))
    lad = strided(out, batch, 1, _batch_strides(batch))
    return SlogdetResult(stop_gradient(sign), lad)


def _batch_strides(batch, per=2):
    """C-order strides of the batch axes of matrices (or results) of ``per`` elements."""
    st, acc = [], per
    for s in reversed(batch):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def det(a):
    """Determinant (``numpy.linalg.det``), as ``sign * exp(logabsdet)`` of :func:`slogdet`;
    a singular matrix raises ``LinAlgError`` (no gradient of ``log|det|`` exists there)."""
    sign, lad = slogdet(a)
    return sign * exp(lad)


def inv(a):
    """Inverse (``numpy.linalg.inv``), as ``solve(a, I)``; batched; a singular matrix
    raises ``LinAlgError``."""
    a = _square(a, "inv")
    n = a.shape[-1]
    return solve(a, np.eye(n, dtype=a.dtype))


def logdet_cholesky(low):
    """``log det(L @ L.T)`` from a Cholesky factor ``L`` (batched): ``2 sum(log(diag(L)))``.
    With :func:`cholesky`, the log-determinant of a symmetric positive definite matrix (a
    Gaussian likelihood's normaliser)."""
    low = _square(low, "logdet_cholesky")
    n = low.shape[-1]
    batch = low.shape[:-2]
    diag = strided(low, batch + (n,), 0, _batch_strides(batch, n * n) + (n + 1,))
    return 2.0 * _sum(log(diag), axis=-1)
