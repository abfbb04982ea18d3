"""BLAS and LAPACK calls for the op kernels: ``C += op(A) @ op(B)`` through ``gemm`` with
``beta = 1`` (:func:`gemm_acc`), ``op(A) X = B`` through ``gesv`` (:func:`gesv`) and, for a
triangular ``A``, ``trsm`` (:func:`trsm`; ``trsv`` for one right-hand side), and Cholesky
factors through ``potrf`` (:func:`potrf`).

``c += np.dot(a, b)`` inside ``@njit`` makes a temporary for the product, then adds it in a
second pass over ``c``. A matmul's reverse does this twice per matrix of the batch; for GMM's 25
products of ``(10, 10) @ (10, 1000)`` the temporaries and the extra passes took half the
reverse's time. ``gemm`` adds into ``c`` itself. A product whose output is one column or one
row (a matrix times a vector, forward or reverse) calls ``gemv`` instead: OpenBLAS's ``gemm``
with one column took 6.3 us for a ``(100, 100)`` matrix against ``gemv``'s 2.5 us (2-core AMD
EPYC Zen 3, one thread), and 55 against 16 us at ``(300, 300)``.

The call goes through Numba's own BLAS entry point (``numba_xxgemm`` in its C helpers, which
calls SciPy's ``cython_blas``), the one ``np.dot`` uses, so nothing new is linked. BLAS is
column-major: a row-major ``C = op(A) op(B)`` is the column-major ``C^T = op(B)^T op(A)^T``,
and a row-major array's column-major view is its transpose, with its row length as the
leading dimension.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.core.errors import TypingError
from numba.extending import overload
from numba.np import linalg as _nplinalg


def _gemm_sig(t):
    p = types.CPointer(t)
    return types.intc(
        types.char, types.char, types.char,  # kind, transa, transb
        types.intp, types.intp, types.intp,  # m, n, k
        p, p, types.intp, p, types.intp,  # alpha, a, lda, b, ldb
        p, p, types.intp,  # beta, c, ldc
    )  # fmt: skip


_GEMM = {
    types.float64: (types.ExternalFunction("numba_xxgemm", _gemm_sig(types.float64)), ord("d")),
    types.float32: (types.ExternalFunction("numba_xxgemm", _gemm_sig(types.float32)), ord("s")),
}


def _gemv_sig(t):
    p = types.CPointer(t)
    return types.intc(
        types.char, types.char,  # kind, trans
        types.intp, types.intp,  # m, n
        p, p, types.intp,  # alpha, a, lda
        p, p, p,  # x, beta, y (both with increment 1)
    )  # fmt: skip


_GEMV = {
    types.float64: types.ExternalFunction("numba_xxgemv", _gemv_sig(types.float64)),
    types.float32: types.ExternalFunction("numba_xxgemv", _gemv_sig(types.float32)),
}
_N, _T = ord("n"), ord("t")


def gemm_acc(a, ta, b, tb, c, beta=1.0, alpha=1.0):
    """``c += op(a) @ op(b)``, ``op(x)`` being ``x.T`` where its flag (``ta``, ``tb``) is set;
    with ``beta`` and ``alpha`` given, ``c = beta * c + alpha * op(a) @ op(b)`` (``beta = 0``:
    ``c``'s old values, NaN or not, are not read).

    All three are 2-d arrays of one dtype (float32 or float64) whose rows are contiguous:
    C-contiguous arrays, or blocks sliced from them (``x[r0:r1, c0:c1]``, the row stride as
    BLAS's leading dimension). ``c`` is ``(m, n)``, ``op(a)`` ``(m, k)``, ``op(b)`` ``(k, n)``,
    none of the three sizes zero (BLAS refuses a leading dimension of 0); the caller checks.
    (Python version, for ``NUMBA_DISABLE_JIT``; compiled code calls BLAS.)"""
    p = (a.T if ta else a) @ (b.T if tb else b)
    if beta == 0.0:
        c[...] = alpha * p
    else:
        c *= beta
        c += alpha * p


def _row_stride(x):
    """The leading dimension BLAS reads a row-major 2-d array with (its row stride in
    elements); ``-1`` where its rows are not contiguous."""


@overload(_row_stride)
def _row_stride_impl(x):
    if x.layout == "C":
        return lambda x: x.shape[1]
    size = x.dtype.bitwidth // 8

    def impl(x):
        if x.strides[1] != size or x.strides[0] % size != 0 or x.strides[0] < x.shape[1] * size:
            return -1
        return x.strides[0] // size

    return impl


@overload(gemm_acc, jit_options={"nogil": True})
def _gemm_acc(a, ta, b, tb, c, beta=1.0, alpha=1.0):
    arrays = (a, b, c)
    if not all(isinstance(x, types.Array) and x.ndim == 2 and x.layout in "CA" for x in arrays):
        raise TypingError("gemm_acc: a, b and c must be 2-d arrays with contiguous rows")
    if not (a.dtype == b.dtype == c.dtype and a.dtype in _GEMM):
        raise TypingError(
            f"gemm_acc: one float dtype for all three (got {a.dtype}, {b.dtype}, {c.dtype})"
        )
    fn, kind = _GEMM[a.dtype]
    gemv = _GEMV[a.dtype]
    dt = np.float32 if a.dtype == types.float32 else np.float64

    def impl(a, ta, b, tb, c, beta=1.0, alpha=1.0):
        m, n = c.shape
        k = a.shape[0] if ta else a.shape[1]
        lda, ldb, ldc = _row_stride(a), _row_stride(b), _row_stride(c)
        if min(lda, ldb, ldc) < 1:
            raise ValueError("gemm_acc: an operand's rows are not contiguous")
        alp = np.empty(1, dt)
        alp[0] = alpha
        bet = np.empty(1, dt)
        bet[0] = beta
        # a matrix times a vector (c one column or one row, its vector operand contiguous)
        # through gemv, which OpenBLAS runs 2-3x faster than gemm with one column
        if n == 1 and ldc == 1 and (tb or ldb == 1):  # c = op(a) v, v = op(b)'s column
            if beta == 0.0:  # (gemv's beta = 0 may read c: NaN stays NaN in some builds)
                for r in range(m):
                    c[r, 0] = 0.0
            # a row-major (m, k) array is the column-major (k, m) a^T
            st = gemv(kind, _N if ta else _T, m if ta else k, k if ta else m, alp.ctypes,
                      a.ctypes, lda, b.ctypes, bet.ctypes, c.ctypes)  # fmt: skip
        elif m == 1 and (not ta or lda == 1):  # c = u op(b), u = op(a)'s row
            if beta == 0.0:
                for j in range(n):
                    c[0, j] = 0.0
            st = gemv(kind, _T if tb else _N, k if tb else n, n if tb else k, alp.ctypes,
                      b.ctypes, ldb, a.ctypes, bet.ctypes, c.ctypes)  # fmt: skip
        else:
            st = fn(kind, _T if tb else _N, _T if ta else _N, n, m, k, alp.ctypes, b.ctypes,
                    ldb, a.ctypes, lda, bet.ctypes, c.ctypes, ldc)  # fmt: skip
        # (the operands read after the call: alive through it)
        if st != 0 or alp.shape[0] + bet.shape[0] != 2:
            raise RuntimeError("gemm_acc: the BLAS call failed (is SciPy installed?)")

    return impl


def _gesv_sig(t):
    p, ip = types.CPointer(t), types.CPointer(_nplinalg.F_INT_nbtype)
    return types.intc(
        types.char, types.intp, types.intp,  # kind, n, nrhs
        p, types.intp, ip, p, types.intp,  # a, lda, ipiv, b, ldb
    )  # fmt: skip


_GESV = {
    types.float64: (types.ExternalFunction("numba_xgesv", _gesv_sig(types.float64)), ord("d")),
    types.float32: (types.ExternalFunction("numba_xgesv", _gesv_sig(types.float32)), ord("s")),
}


def gesv(a, trans, b):
    """``(x, ok)``: the solution of ``op(a) x = b`` (``op(a)`` = ``a.T`` if ``trans``) by LU
    with partial pivoting (LAPACK ``gesv``, the routine ``np.linalg.solve`` calls), and whether
    ``a`` was nonsingular (``ok`` False: a zero pivot, ``x`` is not a solution). ``a`` is
    ``(n, n)``, ``b`` ``(n, k)``, both 2-d arrays of one float dtype (any layout); neither is
    written. No test for non-finite values (the caller's). Inside ``@njit`` this costs a
    fraction of ``np.linalg.solve``'s compile (4.2 s, measured with Numba 0.68). (Python
    version, for ``NUMBA_DISABLE_JIT``.)"""
    try:
        return np.linalg.solve(a.T if trans else a, b), True
    except np.linalg.LinAlgError:
        return b.copy(), False


@overload(gesv, jit_options={"nogil": True})
def _gesv(a, trans, b):
    if not all(isinstance(x, types.Array) and x.ndim == 2 for x in (a, b)):
        raise TypingError("gesv: a and b must be 2-d arrays")
    if not (a.dtype == b.dtype and a.dtype in _GESV):
        raise TypingError(f"gesv: one float dtype for both (got {a.dtype}, {b.dtype})")
    _nplinalg.ensure_lapack()
    fn, kind = _GESV[a.dtype]
    dt = np.float32 if a.dtype == types.float32 else np.float64
    ipiv_dt = _nplinalg.F_INT_nptype

    def impl(a, trans, b):
        n, k = b.shape
        # column-major copies: row c of `af` is column c of op(a), row j of `bf` column j of b
        af = np.empty((n, n), dt)
        for r in range(n):
            for c in range(n):
                if trans:
                    af[r, c] = a[r, c]
                else:
                    af[c, r] = a[r, c]
        bf = np.empty((k, n), dt)
        for r in range(n):
            for j in range(k):
                bf[j, r] = b[r, j]
        ipiv = np.empty(max(n, 1), ipiv_dt)
        st = 0
        if n > 0 and k > 0:
            st = fn(kind, n, k, af.ctypes, n, ipiv.ctypes, bf.ctypes, n)
        x = np.empty((n, k), dt)
        for r in range(n):
            for j in range(k):
                x[r, j] = bf[j, r]
        # af and ipiv are read after the call, so they live through it
        return x, st == 0 and af.shape[0] == n and ipiv.shape[0] >= n

    return impl


def _potrf_sig(t):
    return types.intc(types.char, types.char, types.intp, types.CPointer(t), types.intp)


_POTRF = {
    types.float64: (types.ExternalFunction("numba_xxpotrf", _potrf_sig(types.float64)), ord("d")),
    types.float32: (types.ExternalFunction("numba_xxpotrf", _potrf_sig(types.float32)), ord("s")),
}


def potrf(a):
    """``(low, ok)``: the lower Cholesky factor of the symmetric positive definite ``a``
    (LAPACK ``potrf``, the routine ``np.linalg.cholesky`` calls), reading ``a``'s lower
    triangle only, and whether it succeeded (``ok`` False: ``a`` is not positive definite,
    ``low`` is not a factor). ``a`` is an ``(n, n)`` 2-d array of a float dtype (any layout),
    not written. (Python version, for ``NUMBA_DISABLE_JIT``.)"""
    try:
        return np.linalg.cholesky(np.tril(a) + np.tril(a, -1).T).astype(a.dtype), True
    except np.linalg.LinAlgError:
        return np.array(a, copy=True), False


@overload(potrf, jit_options={"nogil": True})
def _potrf(a):
    if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype in _POTRF):
        raise TypingError("potrf: a must be a 2-d float64 or float32 array")
    _nplinalg.ensure_lapack()
    fn, kind = _POTRF[a.dtype]
    dt = np.float32 if a.dtype == types.float32 else np.float64

    def impl(a):
        n = a.shape[0]
        # row-major lower triangle = column-major upper: potrf's A = U^T U there is L L^T
        low = np.zeros((n, n), dt)
        for r in range(n):
            for c in range(r + 1):
                low[r, c] = a[r, c]
        st = 0
        if n > 0:
            st = fn(kind, ord("U"), n, low.ctypes, n)
        for r in range(n):  # potrf leaves the other triangle as it was: zeros
            for c in range(r + 1, n):
                low[r, c] = 0.0
        return low, st == 0

    return impl


# trsm is not among Numba's C helpers: SciPy's cython_blas exports it, and the address is bound
# to a symbol of our own at import, in every process, so kernels that call it stay cacheable
# (Numba links cached code against the running process's symbols; a ctypes pointer would be
# frozen into the cache)
def _bind_trsm():
    import llvmlite.binding as ll
    from numba.extending import get_cython_function_address

    for name in ("dtrsm", "strsm", "dtrsv", "strsv"):
        ll.add_symbol(f"tape_{name}", get_cython_function_address("scipy.linalg.cython_blas", name))


_bind_trsm()


def _trsm_sig(t):
    c, i, p = types.CPointer(types.char), types.CPointer(types.intc), types.CPointer(t)
    return types.void(c, c, c, c, i, i, p, p, i, p, i)


_TRSM = {
    types.float64: types.ExternalFunction("tape_dtrsm", _trsm_sig(types.float64)),
    types.float32: types.ExternalFunction("tape_strsm", _trsm_sig(types.float32)),
}


def _trsv_sig(t):
    c, i, p = types.CPointer(types.char), types.CPointer(types.intc), types.CPointer(t)
    return types.void(c, c, c, i, p, i, p, i)


_TRSV = {
    types.float64: types.ExternalFunction("tape_dtrsv", _trsv_sig(types.float64)),
    types.float32: types.ExternalFunction("tape_strsv", _trsv_sig(types.float32)),
}


def trsm(a, b, lower, trans):
    """``op(a)^-1 b`` for a triangular ``a`` (BLAS ``trsm``: blocked, level 3; ``trsv`` for
    one right-hand side, which OpenBLAS runs 2-3x faster), ``op(a)`` =
    ``a`` or ``a.T`` (``trans``), reading only ``a``'s lower (``lower``) or upper triangle,
    into a new C-contiguous array. ``a`` is ``(n, n)``, ``b`` ``(n, k)``, 2-d arrays of one
    float dtype, any layout; neither is written. No test for a zero pivot (the caller's).
    (Python version, for ``NUMBA_DISABLE_JIT``.)"""
    import scipy.linalg

    tri = np.tril(a) if lower else np.triu(a)
    if b.size == 0:
        return np.array(b, copy=True)
    x = scipy.linalg.solve_triangular(tri, b, lower=lower, trans=1 if trans else 0)
    return np.ascontiguousarray(x, dtype=b.dtype)


@overload(trsm, jit_options={"nogil": True})
def _trsm(a, b, lower, trans):
    if not all(isinstance(x, types.Array) and x.ndim == 2 for x in (a, b)):
        raise TypingError("trsm: a and b must be 2-d arrays")
    if not (a.dtype == b.dtype and a.dtype in _TRSM):
        raise TypingError(f"trsm: one float dtype for both (got {a.dtype}, {b.dtype})")
    fn = _TRSM[a.dtype]
    trsv = _TRSV[a.dtype]
    dt = np.float32 if a.dtype == types.float32 else np.float64

    def impl(a, b, lower, trans):
        n, k = b.shape
        x = np.empty((n, k), dt)
        for r in range(n):
            for j in range(k):
                x[r, j] = b[r, j]
        if n == 0 or k == 0:
            return x
        ac = np.ascontiguousarray(a)
        if k == 1:  # one right-hand side: trsv, which OpenBLAS runs 2-3x faster than trsm
            # column-major, a is a^T: op(a) x = b is a^T^T x = b (or a^T x = b), with the
            # triangle flipped
            uplo = np.full(1, ord("U") if lower else ord("L"), np.int8)
            ta = np.full(1, ord("N") if trans else ord("T"), np.int8)
            diag = np.full(1, ord("N"), np.int8)
            n_ = np.full(1, n, np.intc)
            one = np.ones(1, np.intc)
            trsv(uplo.ctypes, ta.ctypes, diag.ctypes, n_.ctypes, ac.ctypes, n_.ctypes, x.ctypes,
                 one.ctypes)  # fmt: skip
            # the arguments are read after the call, so they live through it
            if uplo[0] + ta[0] + diag[0] + n_[0] + one[0] + ac.shape[0] < 0:
                raise RuntimeError("trsv")
            return x
        # column-major: x^T is (k, n) with leading dimension k, a^T (n, n); op(a) x = b is
        # x^T op(a)^T = b^T, a solve from the right with a^T (or its transpose), whose
        # triangle is the other one
        side = np.full(1, ord("R"), np.int8)
        uplo = np.full(1, ord("U") if lower else ord("L"), np.int8)
        ta = np.full(1, ord("T") if trans else ord("N"), np.int8)
        diag = np.full(1, ord("N"), np.int8)
        m_ = np.full(1, k, np.intc)
        n_ = np.full(1, n, np.intc)
        one = np.ones(1, dt)
        fn(side.ctypes, uplo.ctypes, ta.ctypes, diag.ctypes, m_.ctypes, n_.ctypes, one.ctypes,
           ac.ctypes, n_.ctypes, x.ctypes, m_.ctypes)  # fmt: skip
        # the arguments are read after the call, so they live through it
        if side[0] + uplo[0] + ta[0] + diag[0] + m_[0] + n_[0] + one.shape[0] + ac.shape[0] < 0:
            raise RuntimeError("trsm")
        return x

    return impl


def trsm_lower_right(d, x):
    """``x <- x @ d^-1`` in place, for a lower triangular ``d`` (BLAS ``trsm``, reading only
    ``d``'s lower triangle). ``d`` is ``(k, k)``, ``x`` ``(m, k)``, 2-d arrays of one float
    dtype whose rows are contiguous (C-contiguous, or blocks sliced from such arrays, as
    :func:`gemm_acc` takes them), neither size zero. No test for a zero pivot (the caller's).
    (Python version, for ``NUMBA_DISABLE_JIT``.)"""
    import scipy.linalg

    x[...] = scipy.linalg.solve_triangular(np.tril(d), x.T, lower=True, trans=1).T


@overload(trsm_lower_right, jit_options={"nogil": True})
def _trsm_lower_right(d, x):
    if not all(isinstance(v, types.Array) and v.ndim == 2 and v.layout in "CA" for v in (d, x)):
        raise TypingError("trsm_lower_right: d and x must be 2-d arrays with contiguous rows")
    if not (d.dtype == x.dtype and d.dtype in _TRSM):
        raise TypingError(f"trsm_lower_right: one float dtype for both (got {d.dtype}, {x.dtype})")
    fn = _TRSM[d.dtype]
    dt = np.float32 if d.dtype == types.float32 else np.float64

    def impl(d, x):
        m, k = x.shape
        ldd, ldx = _row_stride(d), _row_stride(x)
        if min(ldd, ldx) < 1:
            raise ValueError("trsm_lower_right: an operand's rows are not contiguous")
        # column-major: x^T (k x m, leading dimension ldx) and d^T (upper triangular); y d = x
        # is d^T y^T = x^T, a solve from the left with d^T as it lies in memory
        side = np.full(1, ord("L"), np.int8)
        uplo = np.full(1, ord("U"), np.int8)
        ta = np.full(1, ord("N"), np.int8)
        diag = np.full(1, ord("N"), np.int8)
        m_ = np.full(1, k, np.intc)
        n_ = np.full(1, m, np.intc)
        lda = np.full(1, ldd, np.intc)
        ldb = np.full(1, ldx, np.intc)
        one = np.ones(1, dt)
        fn(side.ctypes, uplo.ctypes, ta.ctypes, diag.ctypes, m_.ctypes, n_.ctypes, one.ctypes,
           d.ctypes, lda.ctypes, x.ctypes, ldb.ctypes)  # fmt: skip
        # the arguments are read after the call, so they live through it
        if side[0] + uplo[0] + ta[0] + diag[0] + m_[0] + n_[0] + lda[0] + ldb[0] + one[0] < 0:
            raise RuntimeError("trsm_lower_right")

    return impl
