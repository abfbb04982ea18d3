"""GPU entry kernels of the factorisation ops (:mod:`tape.ops.factor`): ``solve``,
``cholesky``, ``slogdet``.

One thread per matrix of the batch (``for b in range(t0, nb, ts)``): the small dense matrices
these ops meet in a tape (covariances, Jacobian blocks) are factorised by plain loops, with
the working copies in the entry's scratch (``work``). Gaussian elimination uses partial
pivoting; a zero pivot, or a Cholesky pivot that is not positive, rejects the entry as the
CPU kernels do. Where the batch shares one matrix (a batch stride of 0), its adjoint is
accumulated with atomics.

Why the CPU code is not shared: the CPU kernels (:mod:`tape.ops.factor`) call LAPACK through
Numba's ``np.linalg`` and allocate their working arrays; a device has neither, so these are
loops of their own over the entry's scratch.
"""

from __future__ import annotations

import math

from numba import cuda

from tape.gpu._config import DEVICE_JIT
from tape.gpu._kernels import GpuKernel
from tape.gpu._loops import accumulate, active, boff, ent, goff, ip, ix, reject, woff
from tape.layout.columns import E_ATTR, E_IN0, E_IN1, E_OUT
from tape.ops.blocks import matrices as sq
from tape.ops.blocks import solve as sv
from tape.ops.factor import LOWER, UPPER

_dev = cuda.jit(**DEVICE_JIT)


@_dev
def _eliminate(A, w, r, n, k, step, base):
    """Gaussian elimination with partial pivoting of the ``n x n`` matrix at arena offset
    ``w`` (left upper triangular, the factor ``U`` of ``P W = L U``), applied to the
    ``n x k`` right-hand sides at ``r`` (``k`` may be 0). Returns ``(ok, sign, log|det|)``:
    ``ok`` False on a zero (or non-finite) pivot."""
    sign = 1.0
    lad = 0.0
    for c in range(n):
        piv = c
        best = abs(A[ix(w + c * n + c, step, base)])
        for q in range(c + 1, n):
            v = abs(A[ix(w + q * n + c, step, base)])
            if v > best:
                best = v
                piv = q
        if not (best > 0.0 and best < math.inf):
            return False, sign, lad
        if piv != c:
            sign = -sign
            for j in range(n):
                p1, p2 = ix(w + c * n + j, step, base), ix(w + piv * n + j, step, base)
                A[p1], A[p2] = A[p2], A[p1]
            for j in range(k):
                p1, p2 = ix(r + c * k + j, step, base), ix(r + piv * k + j, step, base)
                A[p1], A[p2] = A[p2], A[p1]
        d = A[ix(w + c * n + c, step, base)]
        if d < 0.0:
            sign = -sign
        lad += math.log(abs(d))
        for q in range(c + 1, n):
            f = A[ix(w + q * n + c, step, base)] / d
            if f != 0.0:
                for j in range(c + 1, n):
                    A[ix(w + q * n + j, step, base)] -= f * A[ix(w + c * n + j, step, base)]
                for j in range(k):
                    A[ix(r + q * k + j, step, base)] -= f * A[ix(r + c * k + j, step, base)]
    return True, sign, lad


@_dev
def _gauss(A, w, r, n, k, step, base):
    """Solve ``W X = R`` in place (``R`` becomes ``X``; ``W``, ``n x n`` at arena offset
    ``w``, is destroyed). False on a zero pivot."""
    ok, _, _ = _eliminate(A, w, r, n, k, step, base)
    if not ok:
        return False
    for s in range(n):
        q = n - 1 - s
        d = A[ix(w + q * n + q, step, base)]
        for j in range(k):
            acc = A[ix(r + q * k + j, step, base)]
            for m in range(q + 1, n):
                acc -= A[ix(w + q * n + m, step, base)] * A[ix(r + m * k + j, step, base)]
            A[ix(r + q * k + j, step, base)] = acc / d
    return True


@_dev
def _tri(A, a, r, n, k, lower, trans, step, base):
    """Solve ``op(T) X = R`` in place, ``T`` the ``lower`` (or upper) triangle of the
    ``n x n`` matrix at ``a``, ``op`` transposing when ``trans``."""
    down = lower != trans
    for s in range(n):
        q = s if down else n - 1 - s
        c0 = 0 if down else q + 1
        c1 = q if down else n
        d = A[ix(a + q * n + q, step, base)]
        for j in range(k):
            acc = A[ix(r + q * k + j, step, base)]
            for c in range(c0, c1):
                e = a + c * n + q if trans else a + q * n + c
                acc -= A[ix(e, step, base)] * A[ix(r + c * k + j, step, base)]
            A[ix(r + q * k + j, step, base)] = acc / d


@_dev
def _copy(A, src, dst, n, step, base):
    for j in range(n):
        A[ix(dst + j, step, base)] = A[ix(src + j, step, base)]


@_dev
def _copy_t(A, src, dst, n, step, base):
    """``dst`` (``n x n``) = the transpose of ``src``."""
    for q in range(n):
        for j in range(n):
            A[ix(dst + q * n + j, step, base)] = A[ix(src + j * n + q, step, base)]


@_dev
def _has_zero_diagonal(A, a, n, step, base):
    for q in range(n):
        d = A[ix(a + q * n + q, step, base)]
        if not (d != 0.0 and abs(d) < math.inf):
            return True
    return False


# ---------------------------------------------------------------- solve


def _solve_work(n_out, parts, block):
    nb, n, k = int(block[0]), int(block[1]), int(block[2])
    return nb * (n * n + n * k)


@_dev
def solve_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = boff(prog, ent(prog, i, E_IN0))
    bo = boff(prog, ent(prog, i, E_IN1))
    y = boff(prog, ent(prog, i, E_OUT))
    p = ent(prog, i, E_ATTR)
    nb, n, k = ip(prog, p + sv.BATCH), ip(prog, p + sv.N), ip(prog, p + sv.K)
    sa, sb, mode = ip(prog, p + sv.STRIDE_A), ip(prog, p + sv.STRIDE_B), ip(prog, p + sv.MODE)
    for b in range(t0, nb, ts):
        yb = y + b * n * k
        _copy(A, bo + b * sb, yb, n * k, step, base)
        if mode == LOWER or mode == UPPER:
            if _has_zero_diagonal(A, a + b * sa, n, step, base):
                reject(i, prog, A, base, step, solo)
                return
            _tri(A, a + b * sa, yb, n, k, mode == LOWER, False, step, base)
        else:
            w = woff(prog) + b * n * n
            _copy(A, a + b * sa, w, n * n, step, base)
            if not _gauss(A, w, yb, n, k, step, base):
                reject(i, prog, A, base, step, solo)
                return


@_dev
def solve_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    ia, ib, io = ent(prog, i, E_IN0), ent(prog, i, E_IN1), ent(prog, i, E_OUT)
    act_a, act_b = active(prog, ia), active(prog, ib)
    a, x = boff(prog, ia), boff(prog, io)
    g0 = goff(prog)
    p = ent(prog, i, E_ATTR)
    nb, n, k = ip(prog, p + sv.BATCH), ip(prog, p + sv.N), ip(prog, p + sv.K)
    sa, sb, mode = ip(prog, p + sv.STRIDE_A), ip(prog, p + sv.STRIDE_B), ip(prog, p + sv.MODE)
    at_a = sa == 0 and nb > 1 and not solo
    at_b = sb == 0 and nb > 1 and not solo
    for b in range(t0, nb, ts):
        w = woff(prog) + b * (n * n + n * k)
        g = w + n * n  # G = A^-T gX
        _copy(A, g0 + x + b * n * k, g, n * k, step, base)
        if mode == LOWER or mode == UPPER:
            _tri(A, a + b * sa, g, n, k, mode == LOWER, True, step, base)
        else:
            _copy_t(A, a + b * sa, w, n, step, base)
            _gauss(A, w, g, n, k, step, base)
        if act_b:
            for j in range(n * k):
                accumulate(A, ix(g0 + boff(prog, ib) + b * sb + j, step, base), A[ix(g + j, step, base)], at_b)  # fmt: skip
        if act_a:
            for q in range(n):
                for c in range(n):
                    if (mode == LOWER and c > q) or (mode == UPPER and c < q):
                        continue
                    acc = 0.0
                    for j in range(k):
                        acc += A[ix(g + q * k + j, step, base)] * A[ix(x + b * n * k + c * k + j, step, base)]  # fmt: skip
                    accumulate(A, ix(g0 + a + b * sa + q * n + c, step, base), -acc, at_a)


# ---------------------------------------------------------------- cholesky


def _square_work(n_out, parts, block):
    nb, n = int(block[0]), int(block[1])
    return nb * n * n


@_dev
def cholesky_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    p = ent(prog, i, E_ATTR)
    nb, n = ip(prog, p + sq.BATCH), ip(prog, p + sq.N)
    for b in range(t0, nb, ts):
        a = boff(prog, ent(prog, i, E_IN0)) + b * n * n
        y = boff(prog, ent(prog, i, E_OUT)) + b * n * n
        for j in range(n):
            s = A[ix(a + j * n + j, step, base)]
            for m in range(j):
                v = A[ix(y + j * n + m, step, base)]
                s -= v * v
            if not (s > 0.0 and s < math.inf):
                reject(i, prog, A, base, step, solo)
                return
            d = math.sqrt(s)
            A[ix(y + j * n + j, step, base)] = d
            for c in range(j + 1, n):
                A[ix(y + j * n + c, step, base)] = 0.0
            for q in range(j + 1, n):
                acc = A[ix(a + q * n + j, step, base)]
                for m in range(j):
                    acc -= A[ix(y + q * n + m, step, base)] * A[ix(y + j * n + m, step, base)]
                A[ix(y + q * n + j, step, base)] = acc / d


@_dev
def cholesky_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    ia = ent(prog, i, E_IN0)
    if not active(prog, ia):
        return
    g0 = goff(prog)
    p = ent(prog, i, E_ATTR)
    nb, n = ip(prog, p + sq.BATCH), ip(prog, p + sq.N)
    for b in range(t0, nb, ts):
        low = boff(prog, ent(prog, i, E_OUT)) + b * n * n
        gl = g0 + low
        w = woff(prog) + b * n * n
        # W = Phi(L^T gL)
        for q in range(n):
            for c in range(n):
                acc = 0.0
                if c <= q:
                    for m in range(q, n):
                        acc += A[ix(low + m * n + q, step, base)] * A[ix(gl + m * n + c, step, base)]  # fmt: skip
                    if c == q:
                        acc *= 0.5
                A[ix(w + q * n + c, step, base)] = acc
        # W = L^-T W (columns), then W = W L^-1 (rows): S
        _tri(A, low, w, n, n, True, True, step, base)
        for q in range(n):
            for s in range(n):
                j = n - 1 - s
                acc = A[ix(w + q * n + j, step, base)]
                for m in range(j + 1, n):
                    acc -= A[ix(w + q * n + m, step, base)] * A[ix(low + m * n + j, step, base)]
                A[ix(w + q * n + j, step, base)] = acc / A[ix(low + j * n + j, step, base)]
        ga = g0 + boff(prog, ia) + b * n * n
        for q in range(n):
            for c in range(q + 1):
                v = A[ix(w + q * n + c, step, base)]
                if c < q:
                    v += A[ix(w + c * n + q, step, base)]
                A[ix(ga + q * n + c, step, base)] += v


# ---------------------------------------------------------------- slogdet


def _slogdet_work(n_out, parts, block):
    nb, n = int(block[0]), int(block[1])
    return 2 * nb * n * n


@_dev
def slogdet_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    p = ent(prog, i, E_ATTR)
    nb, n = ip(prog, p + sq.BATCH), ip(prog, p + sq.N)
    for b in range(t0, nb, ts):
        a = boff(prog, ent(prog, i, E_IN0)) + b * n * n
        y = boff(prog, ent(prog, i, E_OUT)) + 2 * b
        w = woff(prog) + 2 * b * n * n
        _copy(A, a, w, n * n, step, base)
        ok, sign, lad = _eliminate(A, w, w, n, 0, step, base)
        if not (ok and abs(lad) < math.inf):
            reject(i, prog, A, base, step, solo)
            return
        A[ix(y, step, base)] = sign
        A[ix(y + 1, step, base)] = lad


@_dev
def slogdet_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    ia = ent(prog, i, E_IN0)
    if not active(prog, ia):
        return
    g0 = goff(prog)
    p = ent(prog, i, E_ATTR)
    nb, n = ip(prog, p + sq.BATCH), ip(prog, p + sq.N)
    for b in range(t0, nb, ts):
        a = boff(prog, ia) + b * n * n
        g = A[ix(g0 + boff(prog, ent(prog, i, E_OUT)) + 2 * b + 1, step, base)]
        w = woff(prog) + 2 * b * n * n
        r = w + n * n  # A^-1, by solving A R = I
        _copy(A, a, w, n * n, step, base)
        for q in range(n):
            for j in range(n):
                A[ix(r + q * n + j, step, base)] = 1.0 if q == j else 0.0
        _gauss(A, w, r, n, n, step, base)
        for q in range(n):
            for c in range(n):
                A[ix(g0 + a + q * n + c, step, base)] += g * A[ix(r + c * n + q, step, base)]


KERNELS = {
    "solve": GpuKernel(solve_fwd, solve_rev, 1, 1, work=_solve_work, checks=(0,)),
    "cholesky": GpuKernel(
        cholesky_fwd, cholesky_rev, 1, 1, rev_inputs=(0,), work=_square_work, checks=(0,)
    ),  # fmt: skip
    "slogdet": GpuKernel(
        slogdet_fwd, slogdet_rev, 1, 1, rev_inputs=(0,), work=_slogdet_work, checks=(0,)
    ),  # fmt: skip
}
"""The GPU paths of the factorisation ops, merged into :data:`tape.gpu._kernels.GPU_KERNELS`."""
