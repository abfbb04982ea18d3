"""Spectral and orthogonal factorisations: ``eigh`` (eigendecomposition of a symmetric
matrix) and ``qr`` (reduced QR), batched over ``batch`` matrices.

As in :mod:`tape.ops.factor`, every rule is the matrix-calculus result for the whole
factorisation (no differentiation through its loops); the forward kernels call LAPACK through
Numba's ``np.linalg``. Both outputs of a factorisation live in one output buffer, the first
factor of every matrix before the second, so that the front end (:mod:`tape.linalg`) hands
them out as two contiguous views.

``eigh`` attribute block: ``[batch, n]``. As ``numpy.linalg.eigh`` (``UPLO='L'``), only the
lower triangle of ``A`` is read: the matrix factorised is ``S = tril(A) + tril(A, -1)^T =
V diag(w) V^T``. The output is ``batch * n`` eigenvalues ``w`` (ascending), then ``batch``
``n x n`` matrices ``V`` whose columns are the eigenvectors. Each eigenvector is normalised
to a deterministic sign: its largest-magnitude component is positive (the first such
component on ties), on the CPU and on the GPU (whose Jacobi solver lands on other signs than
LAPACK). Reverse, with ``F_ij = 1 / (w_j - w_i)`` off the diagonal and ``M = V^T gV``:
``G = V (diag(gw) + F o (M - M^T) / 2) V^T`` (symmetric) is the adjoint of ``S``, and the
adjoint of the lower triangle that built ``S`` is ``gA = Phi(G + G^T)`` (``Phi``: the lower
triangle, diagonal halved; :func:`tape.ops.factor._phi`). Tangent: ``P = V^T tS V``,
``tw = diag(P)``, ``tV = V (F o P)``.

Repeated eigenvalues (a gap ``|w_i - w_j| <= n eps max|w|``, below which the computed
eigenvectors carry no digits of their own): the eigenvectors of a repeated eigenvalue are
not unique (any rotation within the eigenspace), so neither is their derivative. The
eigenvalues stay differentiable (the ``diag(gw)`` term needs no ``F``); a matrix whose
eigenvector adjoint ``gV`` is nonzero in a column of a repeated eigenvalue gets a NaN
gradient (a reverse rule cannot stop the sweep; ``tape.detect_anomaly()`` names the entry).
Tangents likewise: ``tV`` is NaN in a column whose repeated partner's coupling ``P_ij`` is
nonzero (0 where it is exactly zero). Second order through a repeated eigenvalue needs the
divided differences of the function applied to the spectrum, which the tape does not know:
NaN wherever a tangent or adjoint reaches such a column.

``qr`` attribute block: ``[batch, m, n]`` with ``m >= n``. The reduced factorisation
``A = Q R`` (``Q``: ``m x n`` with orthonormal columns, ``R``: ``n x n`` upper triangular)
with the diagonal of ``R`` made positive, which makes it unique (LAPACK's raw signs are
arbitrary); the output is ``batch`` ``Q`` then ``batch`` ``R``. A (numerically) rank-deficient
matrix, ``R_kk <= max(m, n) eps max|R_jj|`` (``numpy.linalg.matrix_rank``'s tolerance, on
the diagonal of ``R``), or a non-finite one stops the sweep: ``Q`` is not unique and ``R`` has
no inverse. Reverse: ``M = R gR^T - gQ^T Q``, ``gA = (gQ + Q copyltu(M)) R^-T`` with
``copyltu(M) = tril(M) + tril(M, -1)^T``. Tangent: ``C = Q^T tA R^-1``, ``O = tril(C, -1) -
tril(C, -1)^T`` (``Q^T tQ``, antisymmetric), ``tR = (C - O) R``, ``tQ = tA R^-1 - Q (C - O)``.
"""

import numpy as np

from tape.layout.calls import compiled_only
from tape.layout.columns import B_SIZE, E_ATTR, E_IN0, E_OUT
from tape.ops import registry, validate
from tape.ops.blocks import matrices as sq
from tape.ops.blocks import qr as qr_block
from tape.ops.factor import _dot, _finite, _from_lower, _phi, _tri_solve
from tape.ops.loops import active, add2, mat, put2, tri, view

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)

EPS64, EPS32 = 2.0**-52, 2.0**-23


# ---------------------------------------------------------------- helpers


@_jit
def _eps(x):
    """Machine epsilon of ``x``'s dtype (float64 or float32), from a rounding test that reads
    the same in the GPU kernels (:mod:`tape.gpu._spectral_kernels`)."""
    t = np.empty(1, x.dtype)
    t[0] = 1.0 + 2.0**-40
    return EPS64 if t[0] != 1.0 else EPS32


@_jit
def _normalise_signs(v):
    """Flip each column of ``v`` so that its largest-magnitude component (the first on ties)
    is positive."""
    n = v.shape[0]
    for k in range(v.shape[1]):
        best = 0.0
        p = 0
        for r in range(n):
            a = abs(v[r, k])
            if a > best:
                best = a
                p = r
        if v[p, k] < 0.0:
            for r in range(n):
                v[r, k] = -v[r, k]


@_jit
def _gaps(w):
    """``F_ij = 1 / (w_j - w_i)`` off the diagonal (0 on it and on repeated pairs), and the
    mask of the repeated pairs (``|w_i - w_j| <= n eps max|w|``)."""
    n = w.shape[0]
    tol = n * _eps(w) * max(abs(w[0]), abs(w[n - 1]))
    F = np.zeros((n, n), w.dtype)
    rep = np.zeros((n, n), np.bool_)
    for r in range(n):
        for c in range(n):
            if r != c:
                d = w[c] - w[r]
                if abs(d) <= tol:
                    rep[r, c] = True
                else:
                    F[r, c] = 1.0 / d
    return F, rep


@_jit
def _poison(ga):
    """NaN into the lower triangle of ``ga``: the gradient of the triangle ``eigh`` reads is
    undefined (the upper one stays zero: it is never read)."""
    for r in range(ga.shape[0]):
        for c in range(r + 1):
            ga[r, c] += np.nan


@_jit
def _nonzero_columns(g):
    out = np.zeros(g.shape[1], np.bool_)
    for r in range(g.shape[0]):
        for c in range(g.shape[1]):
            if g[r, c] != 0.0:
                out[c] = True
    return out


@_jit
def _eigh_core(w, v, gw, gv):
    """``C = diag(gw) + F o (M - M^T) / 2`` (``M = V^T gV``), ``F``, ``M``, the repeated
    pairs, and whether a nonzero eigenvector adjoint meets a repeated eigenvalue."""
    n = w.shape[0]
    F, rep = _gaps(w)
    M = _dot(v.T, gv)
    nz = _nonzero_columns(gv)
    C = np.zeros((n, n), w.dtype)
    bad = False
    for r in range(n):
        C[r, r] = gw[r]
        for c in range(n):
            if r != c:
                if rep[r, c]:
                    bad = bad or nz[r] or nz[c]
                else:
                    C[r, c] = 0.5 * F[r, c] * (M[r, c] - M[c, r])
    return C, F, M, rep, nz, bad


# ---------------------------------------------------------------- eigh


@_jit
def _try_eigh(s):
    try:
        w, v = np.linalg.eigh(s)
        return w, np.ascontiguousarray(v), True
    except Exception:  # noqa: BLE001  (LAPACK: no convergence)
        return np.zeros(s.shape[0], s.dtype), s.copy(), False


@_jit
def eigh_fwd(i, entries, bufs, ipool, data):
    A = view(bufs, data, entries[i, E_IN0])
    Y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    if n == 0:
        return -1
    for b in range(nb):
        s = _from_lower(mat(A, b * n * n, n, n))
        if not _finite(s):
            return i
        w, v, ok = _try_eigh(s)
        if not (ok and _finite(w) and _finite(v)):
            return i
        v = np.ascontiguousarray(v)
        _normalise_signs(v)
        for r in range(n):
            Y[b * n + r] = w[r]
        put2(mat(Y, nb * n + b * n * n, n, n), v)
    return -1


@_jit
def eigh_rev(i, entries, bufs, ipool, data, grad):
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    if not active(bufs, a):
        return
    Y, gY, gA = view(bufs, data, o), view(bufs, grad, o), view(bufs, grad, a)
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    if n == 0:
        return
    for b in range(nb):
        w = Y[b * n : (b + 1) * n]
        v = mat(Y, nb * n + b * n * n, n, n)
        gw = gY[b * n : (b + 1) * n]
        gv = mat(gY, nb * n + b * n * n, n, n)
        C, _, _, _, _, bad = _eigh_core(w, v, gw, gv)
        g = _dot(_dot(v, C), v.T)
        ga = mat(gA, b * n * n, n, n)
        if bad:
            _poison(ga)
        else:
            add2(ga, _phi(g + g.T))


@_jit
def eigh_jvp(i, entries, bufs, ipool, data, T):
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    act = active(bufs, a)
    Y = view(bufs, data, o)
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for d in range(T.shape[0]):
        tY = view(bufs, T[d], o)
        tY[:] = 0.0
    if n == 0 or not act:
        return
    for b in range(nb):
        w = Y[b * n : (b + 1) * n]
        v = mat(Y, nb * n + b * n * n, n, n)
        F, rep = _gaps(w)
        for d in range(T.shape[0]):
            tY = view(bufs, T[d], o)
            ts = _from_lower(mat(view(bufs, T[d], a), b * n * n, n, n))
            P = _dot(_dot(v.T, ts), v)
            om = F * P
            for r in range(n):
                tY[b * n + r] = P[r, r]
                for c in range(n):
                    if rep[r, c] and P[r, c] != 0.0:
                        om[r, c] = np.nan
            put2(mat(tY, nb * n + b * n * n, n, n), _dot(v, om))


@_jit
def eigh_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    # tangent of gA = Phi(G + G^T), G = V C V^T: tG = tV C V^T + V C tV^T + V tC V^T with
    # tC = diag(tgw) + (tF o (M - M^T) + F o (tM - tM^T)) / 2, tF_ij = -(tw_j - tw_i) F_ij^2,
    # tM = tV^T gV + V^T tgV
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    if not active(bufs, a):
        return
    Y, gY = view(bufs, data, o), view(bufs, grad, o)
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    if n == 0:
        return
    for b in range(nb):
        w = Y[b * n : (b + 1) * n]
        v = mat(Y, nb * n + b * n * n, n, n)
        gw = gY[b * n : (b + 1) * n]
        gv = mat(gY, nb * n + b * n * n, n, n)
        C, F, M, rep, nz, bad = _eigh_core(w, v, gw, gv)
        used = np.any(C != 0.0)
        for d in range(T.shape[0]):
            tY, gtY = view(bufs, T[d], o), view(bufs, GT[d], o)
            tw = tY[b * n : (b + 1) * n]
            tv = mat(tY, nb * n + b * n * n, n, n)
            tgw = gtY[b * n : (b + 1) * n]
            tgv = mat(gtY, nb * n + b * n * n, n, n)
            tM = _dot(tv.T, gv) + _dot(v.T, tgv)
            tnz = _nonzero_columns(tgv)
            tc = np.zeros((n, n), w.dtype)
            worse = bad
            for r in range(n):
                tc[r, r] = tgw[r]
                for c in range(n):
                    if r == c:
                        continue
                    if rep[r, c]:
                        worse = worse or tnz[r] or tnz[c]
                    else:
                        f = F[r, c]
                        tf = -(tw[c] - tw[r]) * f * f
                        tc[r, c] = 0.5 * (tf * (M[r, c] - M[c, r]) + f * (tM[r, c] - tM[c, r]))
            tg = _dot(_dot(v, tc), v.T)
            if used:  # a NaN tangent of V reaches the gradient only through a nonzero C
                vc = _dot(v, C)
                tg += _dot(_dot(tv, C), v.T) + _dot(vc, tv.T)
            gta = mat(view(bufs, GT[d], a), b * n * n, n, n)
            if worse:
                _poison(gta)
            else:
                gta += _phi(tg + tg.T)


# ---------------------------------------------------------------- qr


@_jit
def _qr_parts(Y, b, nb, m, n):
    return mat(Y, b * m * n, m, n), mat(Y, nb * m * n + b * n * n, n, n)


@_jit
def _copyltu(m):
    """``tril(m) + tril(m, -1)^T``."""
    return _from_lower(m)


@_jit
def _right_inv_t(x, r):
    """``x R^-T`` (``R`` upper triangular): ``R y = x^T`` row by row."""
    return np.ascontiguousarray(_tri_solve(r, np.ascontiguousarray(x.T), False, False).T)


@_jit
def _right_inv(x, r):
    """``x R^-1``: ``R^T y = x^T``."""
    return np.ascontiguousarray(_tri_solve(r, np.ascontiguousarray(x.T), False, True).T)


@_jit
def qr_fwd(i, entries, bufs, ipool, data):
    A = view(bufs, data, entries[i, E_IN0])
    Y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, m, n = ipool[p + qr_block.BATCH], ipool[p + qr_block.M], ipool[p + qr_block.N]
    if n == 0:
        return -1
    eps = _eps(A)
    for b in range(nb):
        a = mat(A, b * m * n, m, n)
        if not _finite(a):
            return i
        q, r = np.linalg.qr(a)
        q = np.ascontiguousarray(q)
        r = tri(r, False, 0)
        big = 0.0
        for k in range(n):
            if r[k, k] < 0.0:
                for c in range(n):
                    r[k, c] = -r[k, c]
                for c in range(m):
                    q[c, k] = -q[c, k]
            big = max(big, r[k, k])
        tol = max(m, n) * eps * big
        for k in range(n):
            if not r[k, k] > tol:
                return i
        yq, yr = _qr_parts(Y, b, nb, m, n)
        put2(yq, q)
        put2(yr, r)
    return -1


@_jit
def _qr_grad(q, r, gq, gr):
    """``gA = (gQ + Q copyltu(M)) R^-T`` and ``copyltu(M)``."""
    cm = _copyltu(_dot(r, gr.T) - _dot(gq.T, q))
    return _right_inv_t(gq + _dot(q, cm), r), cm


@_jit
def qr_rev(i, entries, bufs, ipool, data, grad):
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    if not active(bufs, a):
        return
    Y, gY, gA = view(bufs, data, o), view(bufs, grad, o), view(bufs, grad, a)
    p = entries[i, E_ATTR]
    nb, m, n = ipool[p + qr_block.BATCH], ipool[p + qr_block.M], ipool[p + qr_block.N]
    if n == 0:
        return
    for b in range(nb):
        q, r = _qr_parts(Y, b, nb, m, n)
        gq, gr = _qr_parts(gY, b, nb, m, n)
        g, _ = _qr_grad(q, r, gq, gr)
        add2(mat(gA, b * m * n, m, n), g)


@_jit
def qr_jvp(i, entries, bufs, ipool, data, T):
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    act = active(bufs, a)
    Y = view(bufs, data, o)
    p = entries[i, E_ATTR]
    nb, m, n = ipool[p + qr_block.BATCH], ipool[p + qr_block.M], ipool[p + qr_block.N]
    for d in range(T.shape[0]):
        tY = view(bufs, T[d], o)
        tY[:] = 0.0
    if n == 0 or not act:
        return
    for b in range(nb):
        q, r = _qr_parts(Y, b, nb, m, n)
        for d in range(T.shape[0]):
            tY = view(bufs, T[d], o)
            ta = mat(view(bufs, T[d], a), b * m * n, m, n)
            x = _right_inv(ta, r)  # tA R^-1
            c = _dot(q.T, x)
            low = tri(c, True, -1)
            u = c - low + low.T  # C - O, upper triangular
            tq, tr = _qr_parts(tY, b, nb, m, n)
            put2(tr, tri(_dot(u, r), False, 0))
            put2(tq, x - _dot(q, u))


@_jit
def qr_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    # tangent of gA = B R^-T, B = gQ + Q copyltu(M), M = R gR^T - gQ^T Q:
    # tgA = (tB - gA tR^T) R^-T, tB = tgQ + tQ copyltu(M) + Q copyltu(tM),
    # tM = tR gR^T + R tgR^T - tgQ^T Q - gQ^T tQ
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    if not active(bufs, a):
        return
    Y, gY = view(bufs, data, o), view(bufs, grad, o)
    p = entries[i, E_ATTR]
    nb, m, n = ipool[p + qr_block.BATCH], ipool[p + qr_block.M], ipool[p + qr_block.N]
    if n == 0:
        return
    for b in range(nb):
        q, r = _qr_parts(Y, b, nb, m, n)
        gq, gr = _qr_parts(gY, b, nb, m, n)
        g, cm = _qr_grad(q, r, gq, gr)
        for d in range(T.shape[0]):
            tq, tr = _qr_parts(view(bufs, T[d], o), b, nb, m, n)
            tgq, tgr = _qr_parts(view(bufs, GT[d], o), b, nb, m, n)
            tm = _dot(tr, gr.T) + _dot(r, tgr.T) - _dot(tgq.T, q) - _dot(gq.T, tq)
            tb = tgq + _dot(tq, cm) + _dot(q, _copyltu(tm))
            add2(mat(view(bufs, GT[d], a), b * m * n, m, n), _right_inv_t(tb - _dot(g, tr.T), r))


# ---------------------------------------------------------------- sparsity and checks


def _block(t, i, k):
    p = int(t.entries[i, E_ATTR])
    return [int(v) for v in t.ipool[p : p + k]]


def _factor_sparsity(nb, per_in, out_pers, size):
    """Every output element of matrix ``b`` (the output is one section per factor, each
    ``nb`` blocks of ``out_pers[s]``) depends on all of input matrix ``b``, nonlinearly."""
    rows, cols, base = [], [], 0
    for per in out_pers:
        rows.append(base + np.arange(nb * per))
        cols.append(np.repeat(np.arange(nb), per))
        base += nb * per
    spread = (np.concatenate(rows), np.concatenate(cols), (base, nb))
    b = np.repeat(np.arange(nb), per_in)
    e = b * per_in + np.tile(np.arange(per_in), nb)
    return [(0, (spread, (b, e, (nb, size))))], [(0, b, e, 0, b, e)]


def eigh_sparsity(t, i, data):
    """Each eigenvalue and eigenvector of matrix ``b`` depends on all of ``A[b]`` (a
    superset: the upper triangle is not read), nonlinearly."""
    nb, n = _block(t, i, 2)
    size = int(t.bufs[t.entries[i, E_IN0], B_SIZE])
    return _factor_sparsity(nb, n * n, (n, n * n), size)


def qr_sparsity(t, i, data):
    """``Q[b]`` and ``R[b]`` depend on all of ``A[b]``, nonlinearly."""
    nb, m, n = _block(t, i, 3)
    size = int(t.bufs[t.entries[i, E_IN0], B_SIZE])
    return _factor_sparsity(nb, m * n, (m * n, n * n), size)


def check_eigh(t, i, e):
    """Validation of an ``eigh`` entry: ``batch`` ``n x n`` input matrices, an output of
    ``batch * (n + n * n)`` (eigenvalues, then eigenvectors)."""
    nb, n = validate.block(t, i, 0, sq.SIZE, "batch, n")
    validate.count(t, i, nb, "batch", hi=1 << 62)
    validate.count(t, i, n, "n", hi=1 << 31)
    validate.equal_sizes(t, i, "input 0", e[E_IN0], nb * n * n, f"{nb} matrices of {n} x {n}")
    validate.equal_sizes(t, i, "the output", e[E_OUT], nb * (n + n * n),
                  f"{nb} eigenvalue vectors of {n} and eigenvector matrices of {n} x {n}")  # fmt: skip


def check_qr(t, i, e):
    """Validation of a ``qr`` entry: ``batch`` ``m x n`` input matrices with ``m >= n``, an
    output of ``batch * (m * n + n * n)`` (``Q``, then ``R``)."""
    nb, m, n = validate.block(t, i, 0, qr_block.SIZE, "batch, m, n")
    validate.count(t, i, nb, "batch", hi=1 << 62)
    validate.count(t, i, m, "m", hi=1 << 31)
    validate.count(t, i, n, "n", hi=1 << 31)
    if n > m:
        validate.fail(t, i, f"n = {n} exceeds m = {m}: the reduced QR needs m >= n")
    validate.equal_sizes(t, i, "input 0", e[E_IN0], nb * m * n, f"{nb} matrices of {m} x {n}")
    validate.equal_sizes(t, i, "the output", e[E_OUT], nb * (m * n + n * n),
                  f"{nb} Q of {m} x {n} and R of {n} x {n}")  # fmt: skip


def _describe(name, what):
    def describe(t, i, read, at):
        return f"entry {i} ({name}){at}: {what}"

    describe.__doc__ = f"Why a ``{name}`` entry stopped the sweep."
    return describe


EIGH = registry.structural(
    "eigh", eigh_fwd, eigh_rev, module=__name__, n_inputs=1, differentiable=(True,),
    check=check_eigh, gpu="eigh", jvp=eigh_jvp, hvp=eigh_hvp, sparsity=eigh_sparsity,
    error=np.linalg.LinAlgError, describe_failure=_describe(
        "eigh", "the matrix is not finite (or the eigensolver did not converge)"
    ),
)  # fmt: skip
QR = registry.structural(
    "qr", qr_fwd, qr_rev, module=__name__, n_inputs=1, differentiable=(True,),
    check=check_qr, gpu="qr", jvp=qr_jvp, hvp=qr_hvp, sparsity=qr_sparsity,
    error=np.linalg.LinAlgError, describe_failure=_describe(
        "qr", "the matrix is rank deficient (a zero on the diagonal of R) or not finite: "
        "Q is not unique and R has no inverse"
    ),
)  # fmt: skip
