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
``eigh(a, UPLO='L')``     ``(eigenvalues, eigenvectors)`` of a symmetric matrix, eigenvalues
                          ascending, each eigenvector's largest-magnitude component positive;
                          reads one triangle of ``a`` (the lower by default, as NumPy)
``eigvalsh(a)``           the eigenvalues of :func:`eigh` alone
``qr(a)``                 reduced ``(Q, R)`` of an ``m x n`` matrix, ``m >= n``, with the
                          diagonal of ``R`` positive (unique; LAPACK's signs are arbitrary)
``det(a)``                ``sign * exp(logabsdet)``
``inv(a)``                ``solve(a, I)``
``logdet_cholesky(l)``    ``log det(L @ L.T) = 2 sum(log(diag(L)))`` for a Cholesky factor
``norm``, ``matmul``      as :func:`tape.norm`, :func:`tape.matmul`
========================  ==================================================================

The rules are the standard matrix-calculus results for the whole factorisation (no
differentiation through its loops): see :mod:`tape.ops.factor` and :mod:`tape.ops.spectral`.
Data with no answer raise instead of returning a number: a singular matrix in ``solve``,
``slogdet``, ``det`` and ``inv`` (its log-determinant is ``-inf``, without a derivative), a
matrix that is not positive definite in ``cholesky``, a rank-deficient matrix in ``qr`` and a
non-finite one in ``eigh`` and ``qr``. They raise ``numpy.linalg.LinAlgError``
(``tape.linalg.LinAlgError``): eagerly at the call, and from a replay of a recorded tape
whose new data hit the case, naming the entry and the line that recorded it. The one case
found only by a reverse sweep, which cannot stop, gives NaN instead: the derivative of an
eigenvector of a repeated eigenvalue (see :func:`eigh`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tape.frontend import tensor
from tape.frontend.functional import exp, log, norm, stop_gradient
from tape.frontend.functional import sum as _sum
from tape.frontend.ops.linalg import matmul
from tape.frontend.ops.movement import broadcast_to, strided, swapaxes
from tape.ops.blocks import matrices as sq
from tape.ops.blocks import qr as qr_block
from tape.ops.blocks import solve as sv
from tape.ops.factor import CHOLESKY, GENERAL, LOWER, SLOGDET, SOLVE, UPPER
from tape.ops.spectral import EIGH, QR

__all__ = [
    "solve", "solve_triangular", "cholesky", "slogdet", "det", "inv", "logdet_cholesky",
    "eigh", "eigvalsh", "qr", "SlogdetResult", "EighResult", "QRResult", "LinAlgError", "norm",
    "matmul",
]  # fmt: skip

LinAlgError = np.linalg.LinAlgError


class SlogdetResult(NamedTuple):
    """What :func:`slogdet` returns, as NumPy names it."""

    sign: tensor.Tensor
    logabsdet: tensor.Tensor


class EighResult(NamedTuple):
    """What :func:`eigh` returns, as NumPy names it."""

    eigenvalues: tensor.Tensor
    eigenvectors: tensor.Tensor


class QRResult(NamedTuple):
    """What :func:`qr` returns, as NumPy names it."""

    Q: tensor.Tensor
    R: tensor.Tensor


def _float(x):
    x = tensor.as_tensor(x)
    if x.dtype.kind != "f":
        x = (
            tensor.tensor(x.numpy().astype(tensor.get_default_dtype()))
            if x._tape is None
            else x.to(np.float64)
        )
    return x


def _square(x, name):
    x = _float(x)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{name}: expected a square matrix or a batch of them (shape (..., n, n)), "
            f"got shape {tuple(x.shape)}"
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
    b2 = tensor.view(b, b.shape + (1,), 0) if vec else b
    if b2.ndim < 2 or b2.shape[-2] != n:
        raise ValueError(
            f"{name}: b of shape {tuple(b.shape)} does not match a of shape {tuple(a.shape)}: expected "
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
    out = tensor.apply(SOLVE, [a3, b3], batch + (n, k), sv.encode(nb, n, k, sa, sb, mode))
    return tensor.view(out, batch + (n,), 0) if vec else out


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
    return tensor.apply(CHOLESKY, [a], a.shape, sq.encode(nb, n))


def slogdet(a):
    """``(sign, logabsdet)`` of the determinant (``numpy.linalg.slogdet``), batched. The
    gradient of ``logabsdet`` is ``inv(a).T``; the sign's is zero. A singular matrix raises
    ``LinAlgError`` (its log-determinant is ``-inf`` and has no derivative)."""
    a = _square(a, "slogdet")
    n = a.shape[-1]
    batch = a.shape[:-2]
    nb = math.prod(batch)
    out = tensor.apply(SLOGDET, [a], (nb, 2), sq.encode(nb, n))
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


def eigh(a, UPLO="L"):
    """Eigenvalues and eigenvectors of a symmetric matrix (``numpy.linalg.eigh``), batched:
    ``(eigenvalues, eigenvectors)``, the eigenvalues ascending (``(..., n)``), the
    eigenvectors the columns of ``(..., n, n)``.

    Only one triangle of ``a`` is read, the lower (``UPLO='L'``, NumPy's default) or the upper
    (``'U'``), as in NumPy; the gradient with respect to ``a`` lies in that triangle (as with
    :func:`cholesky`: when ``a`` is built symmetrically every gradient upstream is the same as
    with a symmetric convention). Each eigenvector is normalised so that its largest-magnitude
    component is positive (the first such component on ties), the same on the CPU and the GPU
    (NumPy's signs are LAPACK's, arbitrary).

    The eigenvectors of a repeated eigenvalue are not unique, and neither is their derivative:
    where two eigenvalues lie within ``n * eps * max|w|`` of each other, the gradient with
    respect to ``a`` is NaN if the eigenvector outputs of those eigenvalues receive a nonzero
    adjoint (the eigenvalues' own gradient, and the other eigenvectors', stay defined; use
    :func:`eigvalsh` when only the eigenvalues are needed). Forward-mode tangents of those
    eigenvectors and second derivatives through them are NaN likewise. A non-finite ``a``
    raises ``LinAlgError``."""
    a = _square(a, "eigh")
    if UPLO not in ("L", "U"):
        raise ValueError(f"eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    if UPLO == "U":
        a = swapaxes(a, -1, -2)  # its lower triangle is a's upper one
    n = a.shape[-1]
    batch = a.shape[:-2]
    nb = math.prod(batch)
    out = tensor.apply(EIGH, [a], (nb * (n + n * n),), sq.encode(nb, n))
    return EighResult(tensor.view(out, batch + (n,), 0), tensor.view(out, batch + (n, n), nb * n))


def eigvalsh(a, UPLO="L"):
    """The eigenvalues of a symmetric matrix, ascending (``numpy.linalg.eigvalsh``): those of
    :func:`eigh`, whose gradient ``V diag(g) V^T`` stays defined for repeated eigenvalues."""
    return eigh(a, UPLO).eigenvalues


def qr(a, mode="reduced"):
    """Reduced QR factorisation (``numpy.linalg.qr``, ``mode='reduced'``), batched: ``a`` of
    shape ``(..., m, n)`` with ``m >= n`` gives ``Q`` of ``(..., m, n)`` with orthonormal
    columns and upper-triangular ``R`` of ``(..., n, n)``, ``Q @ R = a``.

    The diagonal of ``R`` is made positive, which makes the factorisation unique and
    differentiable; NumPy returns LAPACK's signs, which may differ (a column of ``Q`` and a
    row of ``R`` negated). A rank-deficient ``a`` (a diagonal element of ``R`` at most
    ``max(m, n) * eps * max|diag(R)|``, the tolerance of ``numpy.linalg.matrix_rank``) or a
    non-finite one raises ``LinAlgError``: ``Q`` is not unique there."""
    if mode != "reduced":
        raise ValueError(
            f"qr: mode {mode!r} is not supported; only mode='reduced' (Q of shape (..., m, n), "
            "R of shape (..., n, n))"
        )
    a = _float(a)
    if a.ndim < 2:
        raise ValueError(
            f"qr: expected a matrix or a batch of them (shape (..., m, n)), got shape {tuple(a.shape)}"
        )
    m, n = a.shape[-2:]
    if m < n:
        raise ValueError(
            f"qr: a of shape {tuple(a.shape)} has more columns than rows (m = {m} < n = {n}); only "
            "m >= n is supported (factorise the transpose for an LQ factorisation)"
        )
    batch = a.shape[:-2]
    nb = math.prod(batch)
    out = tensor.apply(QR, [a], (nb * (m * n + n * n),), qr_block.encode(nb, m, n))
    return QRResult(
        tensor.view(out, batch + (m, n), 0), tensor.view(out, batch + (n, n), nb * m * n)
    )
