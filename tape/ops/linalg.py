"""Linear algebra: batched matrix product through BLAS.

``matmul`` attribute block: ``[batch, m, k, n, stride_a, stride_b]``: output matrix ``b`` is
``A[b] @ B[b]`` with ``A[b]`` starting at ``b * stride_a`` (``0``: one matrix shared by the whole
batch, whose adjoint then sums over the batch). One- and two-dimensional operands are reshaped
to this form by the front end, :mod:`tape._front.linalg` (reshapes are free aliases).
"""

import numpy as np
from numba import njit

from tape import _validate as V
from tape import registry
from tape._config import KERNEL_JIT
from tape._layout import E_ATTR, E_IN0, E_IN1, E_OUT
from tape._loops import active, view

_jit = njit(**KERNEL_JIT)


@_jit
def matmul_fwd(i, entries, bufs, ipool, data):
    A = view(bufs, data, entries[i, E_IN0])
    B = view(bufs, data, entries[i, E_IN1])
    Y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, m, k, n, sa, sb = ipool[p], ipool[p + 1], ipool[p + 2], ipool[p + 3], ipool[p + 4], ipool[p + 5]  # fmt: skip
    if m * n == 0:
        return -1
    for b in range(nb):
        y = Y[b * m * n : (b + 1) * m * n].reshape((m, n))
        if k == 0:
            y[:] = 0.0
            continue
        a = A[b * sa : b * sa + m * k].reshape((m, k))
        bb = B[b * sb : b * sb + k * n].reshape((k, n))
        np.dot(a, bb, y)
    return -1


@_jit
def matmul_rev(i, entries, bufs, ipool, data, grad):
    ia = entries[i, E_IN0]
    ib = entries[i, E_IN1]
    act_a = active(bufs, ia)
    act_b = active(bufs, ib)
    A = view(bufs, data, ia)
    B = view(bufs, data, ib)
    gA = view(bufs, grad, ia)
    gB = view(bufs, grad, ib)
    gY = view(bufs, grad, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, m, k, n, sa, sb = ipool[p], ipool[p + 1], ipool[p + 2], ipool[p + 3], ipool[p + 4], ipool[p + 5]  # fmt: skip
    if m * n * k == 0:
        return
    for b in range(nb):
        gy = gY[b * m * n : (b + 1) * m * n].reshape((m, n))
        a = A[b * sa : b * sa + m * k].reshape((m, k))
        bb = B[b * sb : b * sb + k * n].reshape((k, n))
        if act_a:
            ga = gA[b * sa : b * sa + m * k].reshape((m, k))
            ga += np.dot(gy, bb.T)
        if act_b:
            gb = gB[b * sb : b * sb + k * n].reshape((k, n))
            gb += np.dot(a.T, gy)


@_jit
def matmul_jvp(i, entries, bufs, ipool, data, t):
    # tY = tA @ B + A @ tB
    ia = entries[i, E_IN0]
    ib = entries[i, E_IN1]
    act_a = active(bufs, ia)
    act_b = active(bufs, ib)
    A = view(bufs, data, ia)
    B = view(bufs, data, ib)
    tA = view(bufs, t, ia)
    tB = view(bufs, t, ib)
    tY = view(bufs, t, entries[i, E_OUT])
    nb, m, k, n, sa, sb = _block(ipool, entries[i, E_ATTR])
    tY[:] = 0.0
    if m * n * k == 0:
        return
    for b in range(nb):
        y = tY[b * m * n : (b + 1) * m * n].reshape((m, n))
        if act_a:
            y += np.dot(
                tA[b * sa : b * sa + m * k].reshape((m, k)),
                B[b * sb : b * sb + k * n].reshape((k, n)),
            )
        if act_b:
            y += np.dot(
                A[b * sa : b * sa + m * k].reshape((m, k)),
                tB[b * sb : b * sb + k * n].reshape((k, n)),
            )


@_jit
def matmul_hvp(i, entries, bufs, ipool, data, grad, t, gt):
    # the tangent of gA += gY B^T and gB += A^T gY
    ia = entries[i, E_IN0]
    ib = entries[i, E_IN1]
    act_a = active(bufs, ia)
    act_b = active(bufs, ib)
    A = view(bufs, data, ia)
    B = view(bufs, data, ib)
    tA = view(bufs, t, ia)
    tB = view(bufs, t, ib)
    gtA = view(bufs, gt, ia)
    gtB = view(bufs, gt, ib)
    gY = view(bufs, grad, entries[i, E_OUT])
    gtY = view(bufs, gt, entries[i, E_OUT])
    nb, m, k, n, sa, sb = _block(ipool, entries[i, E_ATTR])
    if m * n * k == 0:
        return
    for b in range(nb):
        gy = gY[b * m * n : (b + 1) * m * n].reshape((m, n))
        gty = gtY[b * m * n : (b + 1) * m * n].reshape((m, n))
        a = A[b * sa : b * sa + m * k].reshape((m, k))
        bb = B[b * sb : b * sb + k * n].reshape((k, n))
        if act_a:
            ga = gtA[b * sa : b * sa + m * k].reshape((m, k))
            ga += np.dot(gty, bb.T)
            if act_b:
                ga += np.dot(gy, tB[b * sb : b * sb + k * n].reshape((k, n)).T)
        if act_b:
            gb = gtB[b * sb : b * sb + k * n].reshape((k, n))
            gb += np.dot(a.T, gty)
            if act_a:
                gb += np.dot(tA[b * sa : b * sa + m * k].reshape((m, k)).T, gy)


@_jit
def _block(ipool, p):
    return ipool[p], ipool[p + 1], ipool[p + 2], ipool[p + 3], ipool[p + 4], ipool[p + 5]


def sparsity(t, i, data):
    """Output ``(b, r, c)`` depends on row ``r`` of ``A[b]`` and column ``c`` of ``B[b]``;
    ``A[b][r, j]`` and ``B[b][j, c]`` interact (group ``(b, j)``)."""
    p = int(t.entries[i, E_ATTR])
    nb, m, k, n, sa, sb = (int(v) for v in t.ipool[p : p + 6])
    b, r, c, j = np.meshgrid(np.arange(nb), np.arange(m), np.arange(n), np.arange(k), indexing="ij")
    out = ((b * m + r) * n + c).ravel()
    ea = (b * sa + r * k + j).ravel()
    eb = (b * sb + j * n + c).ravel()
    g = (b * k + j).ravel()
    return [(0, out, ea), (1, out, eb)], [(0, g, ea, 1, g, eb)]


def check(t, i, e):
    """Validation of a ``matmul`` entry: the output is ``batch`` matrices of ``m x n``;
    input 0 is read as ``batch`` matrices of ``m x k`` starting ``stride_a`` apart, input 1
    as ``k x n`` matrices ``stride_b`` apart. (The CPU kernels skip empty products; the GPU's
    reverse still visits every element of the input adjoints, so both extents are checked
    whenever they are nonempty.)"""
    a, b, y = e[E_IN0], e[E_IN1], e[E_OUT]
    names = ("batch", "m", "k", "n", "stride_a", "stride_b")
    ints = V.block(t, i, 0, 6, ", ".join(names))
    for name, v in zip(names, ints):
        V.count(t, i, v, name, hi=1 << 62)
    nb, m, k, n, sa, sb = ints
    V.equal_sizes(t, i, "the output", y, nb * m * n, f"{nb} matrices of {m} x {n}")
    if nb and m * k:
        V.inside(t, i, "input 0", a, (0, (nb - 1) * sa + m * k - 1))
    if nb and k * n:
        V.inside(t, i, "input 1", b, (0, (nb - 1) * sb + k * n - 1))


MATMUL = registry.kernel(
    "matmul", matmul_fwd, matmul_rev, module=__name__, n_inputs=2, differentiable=(True, True),
    check=check, gpu="matmul", method=True, jvp=matmul_jvp, hvp=matmul_hvp, sparsity=sparsity, operators=("__matmul__",), reflected=("__rmatmul__",),
)  # fmt: skip
