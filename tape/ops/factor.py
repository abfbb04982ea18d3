"""Matrix factorisations and the solves built on them: ``solve`` (general, lower or upper
triangular), ``cholesky`` and ``slogdet``, batched over square ``n x n`` matrices.

Every rule is the matrix-calculus result for the whole factorisation (no differentiation
through its loops). Cholesky factors come from LAPACK ``potrf``, triangular systems (and
``L^-1``) from BLAS ``trsm``, general systems from LAPACK ``gesv`` (:mod:`tape.ops.blas`), and
``slogdet`` from Numba's ``np.linalg``.

``solve`` attribute block: ``[batch, n, k, stride_a, stride_b, mode]``: output matrix ``b``
(``n x k``) is ``X[b] = op(A[b])^-1 B[b]`` with ``A[b]`` starting at ``b * stride_a`` and
``B[b]`` at ``b * stride_b`` (``0``: one matrix shared by the batch). ``mode`` 0 reads all of
``A``; 1 (``LOWER``) and 2 (``UPPER``) read only that triangle of ``A``, whose adjoint is
then that triangle too. Reverse: ``G = A^-T gX``, ``gB += G``, ``gA += mask(-G X^T)``.

``cholesky`` attribute block: ``[batch, n]``. As ``numpy.linalg.cholesky``, only the lower
triangle of ``A`` is read (the matrix factorised is ``tril(A) + tril(A, -1)^T``), so the
adjoint is lower triangular: ``gA = Phi(S + S^T)`` with ``S = L^-T Phi(L^T gL) L^-1`` and
``Phi`` the lower triangle with its diagonal halved. The reverse computes it block by block
(:func:`_cholesky_adjoint`: ``trsm`` and ``gemm`` on blocks of ``L``, the formula on each
diagonal block alone), at about twice the factorisation's flops. A matrix that is not positive
definite stops the sweep.

``slogdet`` attribute block: ``[batch, n]``; the output is ``batch x 2``: the sign (no
gradient) and ``log|det A|``, whose adjoint is ``g A^-T``. A singular matrix stops the sweep:
its log-determinant is ``-inf`` and has no derivative.
"""

import numpy as np

from tape.layout.calls import compiled_only
from tape.layout.columns import B_SIZE, E_ATTR, E_IN0, E_IN1, E_OUT
from tape.ops import registry, validate
from tape.ops.blas import gemm_acc, gesv, potrf, trsm, trsm_lower_right
from tape.ops.blocks import matrices as sq
from tape.ops.blocks import solve as sv
from tape.ops.loops import active, add2, mat, put2, tri, view

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)

GENERAL, LOWER, UPPER = 0, 1, 2
"""``solve`` modes: which part of ``A`` is read."""


# ---------------------------------------------------------------- dense helpers


@_jit
def _dot(a, b):
    """``a @ b`` through BLAS (``gemm_acc``: ``np.dot`` costs a kernel a second of compile),
    on contiguous copies of transposed operands."""
    if a.shape[0] * a.shape[1] * b.shape[1] == 0:
        return np.zeros((a.shape[0], b.shape[1]), a.dtype)
    out = np.empty((a.shape[0], b.shape[1]), a.dtype)
    gemm_acc(np.ascontiguousarray(a), False, np.ascontiguousarray(b), False, out, 0.0)
    return out


@_jit
def _mask(m, mode):
    """The part of ``m`` a ``solve`` of this mode reads (a copy)."""
    if mode == GENERAL:
        return m.copy()
    return tri(m, mode == LOWER, 0)


@_jit
def _tri_solve(a, b, lower, trans):
    """``op(a)^-1 b``, ``op(a)`` = ``a`` or ``a^T``, reading only the ``lower`` (or upper)
    triangle of ``a``: BLAS ``trsm`` (a blocked level-3 solve)."""
    return trsm(a, b, lower, trans)


@_jit
def _solve(a, b, mode, trans):
    """``op(a)^-1 b`` for a ``solve`` of ``mode`` (``a`` must be nonsingular)."""
    if mode == GENERAL:
        return gesv(a, trans, b)[0]
    return _tri_solve(a, b, mode == LOWER, trans)


SHORT_RHS = 8
"""Right-hand sides up to this many columns: :func:`_sub_outer` adds ``-G X^T`` in one loop."""


@_jit
def _sub_outer(ga, g, x, mode):
    """``ga -= mask(g @ x.T)``, ``mask`` the part of an ``n x n`` matrix a ``solve`` of this
    mode reads: one BLAS ``gemm`` into ``ga`` for a general matrix; for a triangular one a
    loop over the triangle (``g``, ``x`` of at most :data:`SHORT_RHS` columns), else a
    ``gemm`` into a scratch matrix whose triangle is then subtracted."""
    n, k = g.shape
    if mode == GENERAL:
        gemm_acc(np.ascontiguousarray(g), False, np.ascontiguousarray(x), True, ga, 1.0, -1.0)
        return
    lower = mode == LOWER
    if k <= SHORT_RHS:
        for r in range(n):
            c0, c1 = (0, r + 1) if lower else (r, n)
            for c in range(c0, c1):
                acc = 0.0
                for j in range(k):
                    acc += g[r, j] * x[c, j]
                ga[r, c] -= acc
        return
    p = np.empty((n, n), ga.dtype)
    gemm_acc(np.ascontiguousarray(g), False, np.ascontiguousarray(x), True, p, 0.0)
    for r in range(n):
        c0, c1 = (0, r + 1) if lower else (r, n)
        for c in range(c0, c1):
            ga[r, c] -= p[r, c]


@_jit
def _singular(a, mode):
    """Whether ``solve`` cannot solve with ``a``: a zero (or non-finite) pivot of a
    triangular matrix; a general matrix is tested by LAPACK in :func:`_try_solve`."""
    for r in range(a.shape[0]):
        d = a[r, r]
        if d == 0.0 or not np.isfinite(d):
            return True
    return False


@_jit
def _finite(a):
    """Whether every value of ``a`` is finite."""
    for v in a.ravel():
        if not np.isfinite(v):
            return False
    return True


@_jit
def _try_solve(a, b):
    """``(a^-1 b, True)``, or ``False`` second where ``a`` is exactly singular or either
    holds a non-finite value."""
    if not (_finite(a) and _finite(b)):
        return b.copy(), False
    return gesv(a, False, b)


@_jit
def _solve_block(ipool, p):
    return (
        ipool[p + sv.BATCH], ipool[p + sv.N], ipool[p + sv.K], ipool[p + sv.STRIDE_A],
        ipool[p + sv.STRIDE_B], ipool[p + sv.MODE],
    )  # fmt: skip


# ---------------------------------------------------------------- solve


@_jit
def solve_fwd(i, entries, bufs, ipool, data):
    A = view(bufs, data, entries[i, E_IN0])
    B = view(bufs, data, entries[i, E_IN1])
    Y = view(bufs, data, entries[i, E_OUT])
    nb, n, k, sa, sb, mode = _solve_block(ipool, entries[i, E_ATTR])
    if n * k == 0:
        return -1
    for b in range(nb):
        a = mat(A, b * sa, n, n)
        rhs = mat(B, b * sb, n, k)
        y = mat(Y, b * n * k, n, k)
        if mode == GENERAL:
            x, ok = _try_solve(a, rhs)
            if not ok:
                return i
        else:
            if _singular(a, mode):
                return i
            x = _tri_solve(a, rhs, mode == LOWER, False)
        put2(y, x)
    return -1


@_jit
def solve_rev(i, entries, bufs, ipool, data, grad):
    ia, ib = entries[i, E_IN0], entries[i, E_IN1]
    act_a, act_b = active(bufs, ia), active(bufs, ib)
    A, X = view(bufs, data, ia), view(bufs, data, entries[i, E_OUT])
    gA, gB, gX = view(bufs, grad, ia), view(bufs, grad, ib), view(bufs, grad, entries[i, E_OUT])
    nb, n, k, sa, sb, mode = _solve_block(ipool, entries[i, E_ATTR])
    if n * k == 0:
        return
    for b in range(nb):
        a = mat(A, b * sa, n, n)
        g = _solve(a, mat(gX, b * n * k, n, k), mode, True)  # A^-T gX
        if act_b:
            add2(mat(gB, b * sb, n, k), g)
        if act_a:
            _sub_outer(mat(gA, b * sa, n, n), g, mat(X, b * n * k, n, k), mode)


@_jit
def solve_jvp(i, entries, bufs, ipool, data, T):
    # tX = A^-1 (tB - mask(tA) X), per direction
    ia, ib, io = entries[i, E_IN0], entries[i, E_IN1], entries[i, E_OUT]
    act_a, act_b = active(bufs, ia), active(bufs, ib)
    A, X = view(bufs, data, ia), view(bufs, data, io)
    nb, n, k, sa, sb, mode = _solve_block(ipool, entries[i, E_ATTR])
    for d in range(T.shape[0]):
        tY = view(bufs, T[d], io)
        tY[:] = 0.0
        if n * k == 0:
            continue
        for b in range(nb):
            a = mat(A, b * sa, n, n)
            r = np.zeros((n, k), A.dtype)
            if act_b:
                add2(r, mat(view(bufs, T[d], ib), b * sb, n, k))
            if act_a:
                ta = _mask(mat(view(bufs, T[d], ia), b * sa, n, n), mode)
                add2(r, -_dot(ta, mat(X, b * n * k, n, k)))
            put2(mat(tY, b * n * k, n, k), _solve(a, r, mode, False))


@_jit
def solve_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    # the reverse rule is G = A^-T gX, gB += G, gA += mask(-G X^T); its tangent:
    # tG = A^-T (tgX - mask(tA)^T G), tgB += tG, tgA += mask(-tG X^T - G tX^T)
    ia, ib, io = entries[i, E_IN0], entries[i, E_IN1], entries[i, E_OUT]
    act_a, act_b = active(bufs, ia), active(bufs, ib)
    A, X, gX = view(bufs, data, ia), view(bufs, data, io), view(bufs, grad, io)
    nb, n, k, sa, sb, mode = _solve_block(ipool, entries[i, E_ATTR])
    if n * k == 0:
        return
    for d in range(T.shape[0]):
        for b in range(nb):
            a = mat(A, b * sa, n, n)
            x = mat(X, b * n * k, n, k)
            g = _solve(a, mat(gX, b * n * k, n, k), mode, True)
            r = mat(view(bufs, GT[d], io), b * n * k, n, k).copy()
            if act_a:
                ta = _mask(mat(view(bufs, T[d], ia), b * sa, n, n), mode)
                r -= _dot(ta.T, g)
            tg = _solve(a, r, mode, True)
            if act_b:
                add2(mat(view(bufs, GT[d], ib), b * sb, n, k), tg)
            if act_a:
                tx = mat(view(bufs, T[d], io), b * n * k, n, k)
                gta = mat(view(bufs, GT[d], ia), b * sa, n, n)
                add2(gta, -_mask(_dot(tg, x.T) + _dot(g, tx.T), mode))


# ---------------------------------------------------------------- cholesky


@_jit
def _from_lower(a):
    """The symmetric matrix whose lower triangle is ``a``'s."""
    n = a.shape[0]
    out = np.empty((n, n), a.dtype)
    for r in range(n):
        for c in range(r + 1):
            out[r, c] = a[r, c]
            out[c, r] = a[r, c]
    return out


@_jit
def _phi(m):
    """Lower triangle of ``m`` with the diagonal halved."""
    out = tri(m, True, 0)
    for r in range(m.shape[0]):
        out[r, r] *= 0.5
    return out


@_jit
def _inv_lower(low):
    """``L^-1`` by ``trsm`` against the identity (a substitution loop is ten times slower at
    n = 1000); ``L`` is a nonsingular Cholesky factor."""
    n = low.shape[0]
    eye = np.zeros((n, n), low.dtype)
    for r in range(n):
        eye[r, r] = 1.0
    return tri(trsm(low, eye, True, False), True, 0)


@_jit
def cholesky_fwd(i, entries, bufs, ipool, data):
    A = view(bufs, data, entries[i, E_IN0])
    Y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        low, ok = potrf(mat(A, b * n * n, n, n))  # (reads the lower triangle)
        if not ok:
            return i
        for r in range(n):
            if not (low[r, r] > 0.0 and np.isfinite(low[r, r])):
                return i
        put2(mat(Y, b * n * n, n, n), low)
    return -1


@_jit
def _cholesky_s(low, gl):
    """``S = L^-T Phi(L^T gL) L^-1`` and ``L^-1``."""
    li = _inv_lower(low)
    return _dot(_dot(li.T, _phi(_dot(low.T, gl))), li), li


CHOLESKY_BLOCK = 64
"""Block size of the Cholesky adjoint (:func:`_cholesky_adjoint`)."""


@_jit
def _cholesky_adjoint(low, gl):
    """``gA`` (lower triangular, a new array) from ``L`` and ``gL``: the blocked reverse of
    the left-looking blocked Cholesky (I. Murray, "Differentiation of the Cholesky
    decomposition", 2016, arXiv:1602.07527). Going back over the blocks ``j:k`` of
    ``L[j:k, j:k] = chol(A[j:k, j:k] - R R^T)``, ``L[k:, j:k] = (A[k:, j:k] - B R^T) D^-T``
    (``R = L[j:k, :j]``, ``B = L[k:, :j]``, ``D = L[j:k, j:k]``), each block costs a
    ``trsm``, three ``gemm`` updates of the adjoints below and left of it, and the formula of
    :func:`_cholesky_s` on its ``D`` alone: about ``2 n^3 / 3`` flops in all, where the
    whole-matrix formula (``L^-1`` and three products) costs ``7 n^3``."""
    n = low.shape[0]
    ab = tri(gl, True, 0)
    k = n
    while k > 0:
        j = max(0, k - CHOLESKY_BLOCK)
        nb = k - j
        d = low[j:k, j:k]
        if k < n:
            cb = ab[k:, j:k]  # the adjoint of L[k:, j:k], then of A[k:, j:k]
            trsm_lower_right(d, cb)
            if j > 0:
                gemm_acc(cb, False, low[j:k, :j], False, ab[k:, :j], 1.0, -1.0)  # B's
                gemm_acc(cb, True, low[k:, :j], False, ab[j:k, :j], 1.0, -1.0)  # R's
            ct = np.empty((nb, nb), low.dtype)
            gemm_acc(cb, True, low[k:, j:k], False, ct, 0.0)
            for r in range(nb):
                for c in range(r + 1):
                    ab[j + r, j + c] -= ct[r, c]
        s, _ = _cholesky_s(np.ascontiguousarray(d), np.ascontiguousarray(ab[j:k, j:k]))
        gd = _phi(s + s.T)
        put2(ab[j:k, j:k], gd)
        if j > 0:
            gemm_acc(gd + gd.T, False, low[j:k, :j], False, ab[j:k, :j], 1.0, -1.0)  # R's
        k = j
    return ab


@_jit
def cholesky_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    L, gL, gA = (
        view(bufs, data, entries[i, E_OUT]),
        view(bufs, grad, entries[i, E_OUT]),
        view(bufs, grad, a),
    )
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        add2(mat(gA, b * n * n, n, n), _cholesky_adjoint(mat(L, b * n * n, n, n),
                                                         mat(gL, b * n * n, n, n)))


@_jit
def cholesky_jvp(i, entries, bufs, ipool, data, T):
    # tL = L Phi(L^-1 tA_s L^-T), tA_s the symmetric matrix of tA's lower triangle
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    act = active(bufs, a)
    L = view(bufs, data, o)
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        low = mat(L, b * n * n, n, n)
        li = _inv_lower(low)
        for d in range(T.shape[0]):
            ty = mat(view(bufs, T[d], o), b * n * n, n, n)
            if not act:
                ty[:] = 0.0
                continue
            ta = _from_lower(mat(view(bufs, T[d], a), b * n * n, n, n))
            put2(ty, _dot(low, _phi(_dot(_dot(li, ta), li.T))))


@_jit
def cholesky_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    # tangent of gA = Phi(S + S^T): tS = -L^-T tL^T S - S tL L^-1 + L^-T Phi(tL^T gL + L^T tgL) L^-1
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    if not active(bufs, a):
        return
    L, gL = view(bufs, data, o), view(bufs, grad, o)
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        low = mat(L, b * n * n, n, n)
        gl = mat(gL, b * n * n, n, n)
        s, li = _cholesky_s(low, gl)
        for d in range(T.shape[0]):
            tl = mat(view(bufs, T[d], o), b * n * n, n, n)
            tgl = mat(view(bufs, GT[d], o), b * n * n, n, n)
            inner = _phi(_dot(tl.T, gl) + _dot(low.T, tgl))
            ts = _dot(_dot(li.T, inner), li)
            ts -= _dot(li.T, _dot(tl.T, s))
            ts -= _dot(_dot(s, tl), li)
            add2(mat(view(bufs, GT[d], a), b * n * n, n, n), _phi(ts + ts.T))


# ---------------------------------------------------------------- slogdet


@_jit
def slogdet_fwd(i, entries, bufs, ipool, data):
    A = view(bufs, data, entries[i, E_IN0])
    Y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        a = mat(A, b * n * n, n, n)
        if not np.all(np.isfinite(a)):
            return i
        sign, lad = np.linalg.slogdet(a)
        if sign == 0.0 or not np.isfinite(lad):
            return i
        Y[2 * b] = sign
        Y[2 * b + 1] = lad
    return -1


@_jit
def _inv_t(a):
    return np.ascontiguousarray(np.linalg.inv(a).T)


@_jit
def slogdet_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    A, gA, gY = view(bufs, data, a), view(bufs, grad, a), view(bufs, grad, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        g = gY[2 * b + 1]
        if g != 0.0:
            ga = mat(gA, b * n * n, n, n)
            ga += g * _inv_t(mat(A, b * n * n, n, n))


@_jit
def slogdet_jvp(i, entries, bufs, ipool, data, T):
    # t(log|det A|) = tr(A^-1 tA) = sum(A^-T * tA); the sign's tangent is 0
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    act = active(bufs, a)
    A = view(bufs, data, a)
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        it = _inv_t(mat(A, b * n * n, n, n)) if act else np.zeros((n, n), A.dtype)
        for d in range(T.shape[0]):
            ty = view(bufs, T[d], o)
            ty[2 * b] = 0.0
            ty[2 * b + 1] = np.sum(it * mat(view(bufs, T[d], a), b * n * n, n, n)) if act else 0.0


@_jit
def slogdet_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    # tangent of gA = g A^-T: tg A^-T - g A^-T tA^T A^-T
    a, o = entries[i, E_IN0], entries[i, E_OUT]
    if not active(bufs, a):
        return
    A, gY = view(bufs, data, a), view(bufs, grad, o)
    p = entries[i, E_ATTR]
    nb, n = ipool[p + sq.BATCH], ipool[p + sq.N]
    for b in range(nb):
        it = _inv_t(mat(A, b * n * n, n, n))
        g = gY[2 * b + 1]
        for d in range(T.shape[0]):
            ta = mat(view(bufs, T[d], a), b * n * n, n, n)
            gta = mat(view(bufs, GT[d], a), b * n * n, n, n)
            gta += view(bufs, GT[d], o)[2 * b + 1] * it - g * _dot(_dot(it, ta.T), it)


# ---------------------------------------------------------------- sparsity and checks


def _dense_sparsity(t, i, inputs, nb, out_per, nonlinear):
    """Each output matrix depends on the whole of its inputs' matrices (a superset for the
    triangular modes): ``inputs`` is ``[(k, per_matrix, batch_stride)]``; ``nonlinear`` lists
    the pairs ``(k, l)`` of inputs whose elements interact within a matrix."""
    deps = []
    out = np.arange(nb * out_per)
    spread = (out, out // out_per, (nb * out_per, nb))
    elems = {}
    for k, per, stride in inputs:
        size = int(t.bufs[t.entries[i, E_IN0 + k], B_SIZE])
        b = np.repeat(np.arange(nb), per)
        e = b * stride + np.tile(np.arange(per), nb)
        elems[k] = (b, e)
        deps.append((k, (spread, (b, e, (nb, size)))))
    pairs = []
    for k, l in nonlinear:
        bk, ek = elems[k]
        bl, el = elems[l]
        pairs.append((k, bk, ek, l, bl, el))
    return deps, pairs


def solve_sparsity(t, i, data):
    """``X[b]`` depends on all of ``A[b]`` and ``B[b]``; ``A`` interacts with itself and
    with ``B`` (``X`` is linear in ``B``)."""
    nb, n, k, sa, sb, _ = sv.decode(t.ipool, int(t.entries[i, E_ATTR]))
    return _dense_sparsity(t, i, [(0, n * n, sa), (1, n * k, sb)], nb, n * k, [(0, 0), (0, 1)])


def _square_sparsity(out_per):
    def sparsity(t, i, data):
        nb, n = sq.decode(t.ipool, int(t.entries[i, E_ATTR]))
        return _dense_sparsity(t, i, [(0, n * n, n * n)], nb, out_per(n), [(0, 0)])

    sparsity.__doc__ = "Each output matrix depends on all of its input matrix, nonlinearly."
    return sparsity


def check_solve(t, i, e):
    """Validation of a ``solve`` entry: ``batch`` outputs of ``n x k``; ``A`` read as
    ``batch`` ``n x n`` matrices ``stride_a`` apart, ``B`` as ``n x k`` matrices ``stride_b``
    apart; ``mode`` 0, 1 or 2."""
    a, b, y = e[E_IN0], e[E_IN1], e[E_OUT]
    names = sv.Solve._fields
    ints = validate.block(t, i, 0, sv.SIZE, ", ".join(names))
    for name, v in zip(names, ints):
        validate.count(t, i, v, name, hi=1 << 62)
    nb, n, k, sa, sb, mode = ints
    if mode not in (GENERAL, LOWER, UPPER):
        validate.fail(t, i, f"mode {mode} is not 0 (general), 1 (lower) or 2 (upper)")
    validate.equal_sizes(t, i, "the output", y, nb * n * k, f"{nb} matrices of {n} x {k}")
    if nb and n:
        validate.inside(t, i, "input 0", a, (0, (nb - 1) * sa + n * n - 1))
    if nb and n * k:
        validate.inside(t, i, "input 1", b, (0, (nb - 1) * sb + n * k - 1))


def _check_square(out_per):
    def check(t, i, e):
        a, y = e[E_IN0], e[E_OUT]
        nb, n = validate.block(t, i, 0, sq.SIZE, "batch, n")
        validate.count(t, i, nb, "batch", hi=1 << 62)
        validate.count(t, i, n, "n", hi=1 << 31)
        validate.equal_sizes(t, i, "input 0", a, nb * n * n, f"{nb} matrices of {n} x {n}")
        validate.equal_sizes(
            t, i, "the output", y, nb * out_per(n), f"{nb} results of {out_per(n)}"
        )

    check.__doc__ = (
        "Validation of a square-matrix entry: the input is ``batch`` ``n x n`` matrices."
    )
    return check


def _describe(name, what):
    def describe(t, i, read, at):
        return f"entry {i} ({name}){at}: {what}"

    describe.__doc__ = f"Why a ``{name}`` entry stopped the sweep."
    return describe


SOLVE = registry.structural(
    "solve", solve_fwd, solve_rev, module=__name__, n_inputs=2, differentiable=(True, True),
    check=check_solve, gpu="solve", jvp=solve_jvp, hvp=solve_hvp, sparsity=solve_sparsity,
    error=np.linalg.LinAlgError, describe_failure=_describe("solve", "the matrix is singular (a zero pivot): the system has no unique solution"),
)  # fmt: skip
CHOLESKY = registry.structural(
    "cholesky", cholesky_fwd, cholesky_rev, module=__name__, n_inputs=1, differentiable=(True,),
    check=_check_square(lambda n: n * n), gpu="cholesky", jvp=cholesky_jvp, hvp=cholesky_hvp,
    sparsity=_square_sparsity(lambda n: n * n),
    error=np.linalg.LinAlgError, describe_failure=_describe("cholesky", "the matrix is not positive definite (Cholesky failed)"),
)  # fmt: skip
SLOGDET = registry.structural(
    "slogdet", slogdet_fwd, slogdet_rev, module=__name__, n_inputs=1, differentiable=(True,),
    check=_check_square(lambda n: 2), gpu="slogdet", jvp=slogdet_jvp, hvp=slogdet_hvp,
    sparsity=_square_sparsity(lambda n: 2), error=np.linalg.LinAlgError, describe_failure=_describe(
        "slogdet", "the matrix is singular (or not finite): log|det| is -inf and has no derivative"
    ),
)  # fmt: skip
