"""GPU entry kernels of the spectral factorisations (:mod:`tape.ops.spectral`): ``eigh`` and
``qr``.

One thread per matrix of the batch (``for b in range(t0, nb, ts)``), working copies in the
entry's scratch (``work``), as in :mod:`tape.gpu._factor_kernels`. ``eigh`` runs cyclic
Jacobi (row by row over the upper triangle; a rotation is skipped where the off-diagonal
element is negligible next to its two diagonal elements), sorts the eigenvalues ascending
(stable) and normalises the eigenvector signs exactly as the CPU kernel does; ``qr`` uses
Householder reflections (LAPACK's ``dlarfg`` convention), forms ``Q`` explicitly and makes the
diagonal of ``R`` positive. The rejections (non-finite data, a rank-deficient ``qr``) and the
treatment of repeated eigenvalues in the reverse rule follow the CPU kernels; the arena's
machine epsilon is read back from a rounding test in the scratch (the kernels are compiled
for float64 and float32 arenas alike).

Why the CPU code is not shared: the CPU kernels (:mod:`tape.ops.spectral`) call LAPACK
(``np.linalg.eigh``, ``np.linalg.qr``); a device has no LAPACK, so it runs these algorithms,
whose results agree with LAPACK's up to rounding.
"""

from __future__ import annotations

import math

from numba import cuda

from tape.gpu._config import DEVICE_JIT
from tape.gpu._kernels import GpuKernel
from tape.gpu._loops import active, boff, ent, goff, ip, ix, reject, woff
from tape.layout.columns import E_ATTR, E_IN0, E_OUT
from tape.ops.blocks import matrices as sq
from tape.ops.blocks import qr as qr_block

_dev = cuda.jit(**DEVICE_JIT)

MAX_SWEEPS = 100
"""Jacobi sweeps before giving up (quadratic convergence takes about ten)."""


@_dev
def _eps(A, s, step, base):
    """Machine epsilon of the arena's dtype: ``1 + 2^-40`` stored in scratch element ``s``
    reads back as 1 in float32."""
    A[ix(s, step, base)] = 1.0 + 9.094947017729282e-13
    if A[ix(s, step, base)] != 1.0:
        return 2.220446049250313e-16
    return 1.1920928955078125e-07


@_dev
def _finite(A, a, n, step, base):
    for j in range(n):
        v = A[ix(a + j, step, base)]
        if not abs(v) < math.inf:
            return False
    return True


# ---------------------------------------------------------------- eigh


def _eigh_work(n_out, parts, block):
    nb, n = int(block[0]), int(block[1])
    return nb * (2 * n * n + 1)


@_dev
def _jacobi(A, s, v, n, eps, step, base):
    """Diagonalise the symmetric ``n x n`` matrix at ``s`` (both triangles, overwritten) by
    cyclic Jacobi rotations, accumulated into ``v`` (set to the identity first)."""
    for r in range(n):
        for c in range(n):
            A[ix(v + r * n + c, step, base)] = 1.0 if r == c else 0.0
    norm = 0.0
    for j in range(n * n):
        x = A[ix(s + j, step, base)]
        norm += x * x
    tiny = eps * eps * math.sqrt(norm)
    for _ in range(MAX_SWEEPS):
        rotated = False
        for p in range(n - 1):
            for q in range(p + 1, n):
                apq = A[ix(s + p * n + q, step, base)]
                app = A[ix(s + p * n + p, step, base)]
                aqq = A[ix(s + q * n + q, step, base)]
                if abs(apq) <= eps * math.sqrt(abs(app) * abs(aqq)) or abs(apq) <= tiny:
                    continue
                rotated = True
                theta = (aqq - app) / (2.0 * apq)
                if abs(theta) > 1e8:  # t = 1 / (2 theta) to rounding; theta^2 may overflow
                    t = 0.5 / theta
                else:
                    t = 1.0 / (abs(theta) + math.sqrt(theta * theta + 1.0))
                    if theta < 0.0:
                        t = -t
                c = 1.0 / math.sqrt(t * t + 1.0)
                sn = t * c
                A[ix(s + p * n + p, step, base)] = app - t * apq
                A[ix(s + q * n + q, step, base)] = aqq + t * apq
                A[ix(s + p * n + q, step, base)] = 0.0
                A[ix(s + q * n + p, step, base)] = 0.0
                for k in range(n):
                    if k != p and k != q:
                        akp = A[ix(s + k * n + p, step, base)]
                        akq = A[ix(s + k * n + q, step, base)]
                        x = c * akp - sn * akq
                        y = sn * akp + c * akq
                        A[ix(s + k * n + p, step, base)] = x
                        A[ix(s + p * n + k, step, base)] = x
                        A[ix(s + k * n + q, step, base)] = y
                        A[ix(s + q * n + k, step, base)] = y
                    vkp = A[ix(v + k * n + p, step, base)]
                    vkq = A[ix(v + k * n + q, step, base)]
                    A[ix(v + k * n + p, step, base)] = c * vkp - sn * vkq
                    A[ix(v + k * n + q, step, base)] = sn * vkp + c * vkq
        if not rotated:
            return True
    return False


@_dev
def _sort_and_sign(A, w, v, n, step, base):
    """Sort the eigenvalues at ``w`` ascending (stable), permuting the columns of ``v``, then
    flip every column so that its largest-magnitude component (the first on ties) is
    positive: the CPU kernel's convention (:func:`tape.ops.spectral._normalise_signs`)."""
    for k in range(1, n):
        j = k
        while j > 0 and A[ix(w + j - 1, step, base)] > A[ix(w + j, step, base)]:
            p1, p2 = ix(w + j - 1, step, base), ix(w + j, step, base)
            A[p1], A[p2] = A[p2], A[p1]
            for r in range(n):
                p1, p2 = ix(v + r * n + j - 1, step, base), ix(v + r * n + j, step, base)
                A[p1], A[p2] = A[p2], A[p1]
            j -= 1
    for k in range(n):
        best = 0.0
        p = 0
        for r in range(n):
            x = abs(A[ix(v + r * n + k, step, base)])
            if x > best:
                best = x
                p = r
        if A[ix(v + p * n + k, step, base)] < 0.0:
            for r in range(n):
                A[ix(v + r * n + k, step, base)] = -A[ix(v + r * n + k, step, base)]


@_dev
def eigh_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    p = ent(prog, i, E_ATTR)
    nb, n = ip(prog, p + sq.BATCH), ip(prog, p + sq.N)
    a0 = boff(prog, ent(prog, i, E_IN0))
    y0 = boff(prog, ent(prog, i, E_OUT))
    for b in range(t0, nb, ts):
        a = a0 + b * n * n
        s = woff(prog) + b * (2 * n * n + 1)
        eps = _eps(A, s + 2 * n * n, step, base)
        for r in range(n):
            for c in range(n):
                e = a + r * n + c if c <= r else a + c * n + r  # the lower triangle
                A[ix(s + r * n + c, step, base)] = A[ix(e, step, base)]
        if not _finite(A, s, n * n, step, base):
            reject(i, prog, A, base, step, solo)
            return
        w = y0 + b * n
        v = y0 + nb * n + b * n * n
        if not _jacobi(A, s, v, n, eps, step, base):
            reject(i, prog, A, base, step, solo)
            return
        for k in range(n):
            A[ix(w + k, step, base)] = A[ix(s + k * n + k, step, base)]
        _sort_and_sign(A, w, v, n, step, base)


@_dev
def eigh_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # G = V C V^T, C = diag(gw) + F o (M - M^T) / 2, M = V^T gV; gA += Phi(G + G^T)
    ia = ent(prog, i, E_IN0)
    if not active(prog, ia):
        return
    g0 = goff(prog)
    p = ent(prog, i, E_ATTR)
    nb, n = ip(prog, p + sq.BATCH), ip(prog, p + sq.N)
    if n == 0:
        return
    y0 = boff(prog, ent(prog, i, E_OUT))
    for b in range(t0, nb, ts):
        w = y0 + b * n
        v = y0 + nb * n + b * n * n
        gw = g0 + w
        gv = g0 + v
        cm = woff(prog) + b * (2 * n * n + 1)
        vc = cm + n * n
        eps = _eps(A, vc + n * n, step, base)
        big = max(abs(A[ix(w, step, base)]), abs(A[ix(w + n - 1, step, base)]))
        tol = n * eps * big
        bad = False
        for r in range(n):
            for c in range(n):
                if r == c:
                    A[ix(cm + r * n + c, step, base)] = A[ix(gw + r, step, base)]
                    continue
                d = A[ix(w + c, step, base)] - A[ix(w + r, step, base)]
                x = 0.0
                if abs(d) <= tol:
                    for k in range(n):
                        if A[ix(gv + k * n + r, step, base)] != 0.0:
                            bad = True
                        if A[ix(gv + k * n + c, step, base)] != 0.0:
                            bad = True
                else:
                    mrc = 0.0
                    mcr = 0.0
                    for k in range(n):
                        vr = A[ix(v + k * n + r, step, base)]
                        vcc = A[ix(v + k * n + c, step, base)]
                        mrc += vr * A[ix(gv + k * n + c, step, base)]
                        mcr += vcc * A[ix(gv + k * n + r, step, base)]
                    x = 0.5 * (mrc - mcr) / d
                A[ix(cm + r * n + c, step, base)] = x
        for r in range(n):
            for c in range(n):
                acc = 0.0
                for k in range(n):
                    acc += A[ix(v + r * n + k, step, base)] * A[ix(cm + k * n + c, step, base)]
                A[ix(vc + r * n + c, step, base)] = acc
        ga = g0 + boff(prog, ia) + b * n * n
        for r in range(n):
            for c in range(r + 1):
                grc = 0.0
                gcr = 0.0
                for k in range(n):
                    grc += A[ix(vc + r * n + k, step, base)] * A[ix(v + c * n + k, step, base)]
                    gcr += A[ix(vc + c * n + k, step, base)] * A[ix(v + r * n + k, step, base)]
                x = grc if c == r else grc + gcr
                if bad:
                    x = math.nan
                A[ix(ga + r * n + c, step, base)] += x


# ---------------------------------------------------------------- qr


def _qr_work(n_out, parts, block):
    nb, m, n = int(block[0]), int(block[1]), int(block[2])
    return nb * (m * n + n * n + n + 1)


@_dev
def qr_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    p = ent(prog, i, E_ATTR)
    nb, m, n = ip(prog, p + qr_block.BATCH), ip(prog, p + qr_block.M), ip(prog, p + qr_block.N)
    a0 = boff(prog, ent(prog, i, E_IN0))
    y0 = boff(prog, ent(prog, i, E_OUT))
    for b in range(t0, nb, ts):
        a = a0 + b * m * n
        h = woff(prog) + b * (m * n + n * n + n + 1)  # the reflectors below R, as LAPACK
        tau = h + m * n
        eps = _eps(A, tau + n, step, base)
        if not _finite(A, a, m * n, step, base):
            reject(i, prog, A, base, step, solo)
            return
        for j in range(m * n):
            A[ix(h + j, step, base)] = A[ix(a + j, step, base)]
        for k in range(n):
            alpha = A[ix(h + k * n + k, step, base)]
            sigma = 0.0
            for r in range(k + 1, m):
                x = A[ix(h + r * n + k, step, base)]
                sigma += x * x
            t = 0.0
            if sigma > 0.0:
                beta = math.sqrt(alpha * alpha + sigma)
                if alpha >= 0.0:
                    beta = -beta
                t = (beta - alpha) / beta
                f = 1.0 / (alpha - beta)
                for r in range(k + 1, m):
                    A[ix(h + r * n + k, step, base)] *= f
                A[ix(h + k * n + k, step, base)] = beta
                for j in range(k + 1, n):  # H_k = I - t u u^T on the columns to the right
                    acc = A[ix(h + k * n + j, step, base)]
                    for r in range(k + 1, m):
                        acc += A[ix(h + r * n + k, step, base)] * A[ix(h + r * n + j, step, base)]
                    acc *= t
                    A[ix(h + k * n + j, step, base)] -= acc
                    for r in range(k + 1, m):
                        A[ix(h + r * n + j, step, base)] -= acc * A[ix(h + r * n + k, step, base)]
            A[ix(tau + k, step, base)] = t
        q = y0 + b * m * n
        rr = y0 + nb * m * n + b * n * n
        for r in range(m):  # Q = H_0 ... H_{n-1} [I; 0]
            for c in range(n):
                A[ix(q + r * n + c, step, base)] = 1.0 if r == c else 0.0
        for s in range(n):
            k = n - 1 - s
            t = A[ix(tau + k, step, base)]
            for j in range(k, n):
                acc = A[ix(q + k * n + j, step, base)]
                for r in range(k + 1, m):
                    acc += A[ix(h + r * n + k, step, base)] * A[ix(q + r * n + j, step, base)]
                acc *= t
                A[ix(q + k * n + j, step, base)] -= acc
                for r in range(k + 1, m):
                    A[ix(q + r * n + j, step, base)] -= acc * A[ix(h + r * n + k, step, base)]
        big = 0.0
        for k in range(n):
            sg = 1.0
            if A[ix(h + k * n + k, step, base)] < 0.0:
                sg = -1.0
                for r in range(m):
                    A[ix(q + r * n + k, step, base)] = -A[ix(q + r * n + k, step, base)]
            for c in range(n):
                x = sg * A[ix(h + k * n + c, step, base)] if c >= k else 0.0
                A[ix(rr + k * n + c, step, base)] = x
            big = max(big, A[ix(rr + k * n + k, step, base)])
        tol = max(m, n) * eps * big
        for k in range(n):
            if not A[ix(rr + k * n + k, step, base)] > tol:
                reject(i, prog, A, base, step, solo)
                return


@_dev
def qr_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # gA += (gQ + Q copyltu(M)) R^-T, M = R gR^T - gQ^T Q
    ia = ent(prog, i, E_IN0)
    if not active(prog, ia):
        return
    g0 = goff(prog)
    p = ent(prog, i, E_ATTR)
    nb, m, n = ip(prog, p + qr_block.BATCH), ip(prog, p + qr_block.M), ip(prog, p + qr_block.N)
    y0 = boff(prog, ent(prog, i, E_OUT))
    for b in range(t0, nb, ts):
        q = y0 + b * m * n
        rr = y0 + nb * m * n + b * n * n
        gq = g0 + q
        gr = g0 + rr
        mm = woff(prog) + b * (m * n + n * n + n + 1)
        bb = mm + n * n
        for r in range(n):
            for c in range(n):
                acc = 0.0
                for k in range(n):
                    acc += A[ix(rr + r * n + k, step, base)] * A[ix(gr + c * n + k, step, base)]
                for k in range(m):
                    acc -= A[ix(gq + k * n + r, step, base)] * A[ix(q + k * n + c, step, base)]
                A[ix(mm + r * n + c, step, base)] = acc
        for r in range(m):
            for c in range(n):
                acc = A[ix(gq + r * n + c, step, base)]
                for k in range(n):
                    e = mm + k * n + c if k >= c else mm + c * n + k  # copyltu(M)[k, c]
                    acc += A[ix(q + r * n + k, step, base)] * A[ix(e, step, base)]
                A[ix(bb + r * n + c, step, base)] = acc
        ga = g0 + boff(prog, ia) + b * m * n
        for r in range(m):  # row r of B R^-T: R x = B[r]^T, back substitution
            for s in range(n):
                c = n - 1 - s
                acc = A[ix(bb + r * n + c, step, base)]
                for j in range(c + 1, n):
                    acc -= A[ix(rr + c * n + j, step, base)] * A[ix(bb + r * n + j, step, base)]
                x = acc / A[ix(rr + c * n + c, step, base)]
                A[ix(bb + r * n + c, step, base)] = x
                A[ix(ga + r * n + c, step, base)] += x


KERNELS = {
    "eigh": GpuKernel(eigh_fwd, eigh_rev, 1, 1, rev_inputs=(0,), work=_eigh_work, checks=(0,)),
    "qr": GpuKernel(qr_fwd, qr_rev, 1, 1, rev_inputs=(0,), work=_qr_work, checks=(0,)),
}
"""The GPU paths of the spectral ops, merged into :data:`tape.gpu._kernels.GPU_KERNELS`."""
