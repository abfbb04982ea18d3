"""Linear algebra: batched matrix product through BLAS.

``matmul`` attribute block: ``[batch, m, k, n, stride_a, stride_b]``: output matrix ``b`` is
``A[b] @ B[b]`` with ``A[b]`` starting at ``b * stride_a`` (``0``: one matrix shared by the whole
batch, whose adjoint then sums over the batch). One- and two-dimensional operands are reshaped
to this form by the front end (reshapes are free aliases).
"""

import numpy as np
from numba import njit

import tape
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
    nb, m, k, n, sa, sb = ipool[p], ipool[p + 1], ipool[p + 2], ipool[p + 3], ipool[p + 4], ipool[p + 5]
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
    nb, m, k, n, sa, sb = ipool[p], ipool[p + 1], ipool[p + 2], ipool[p + 3], ipool[p + 4], ipool[p + 5]
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


registry.kernel(
    "matmul", matmul_fwd, matmul_rev, module=__name__, n_inputs=2, differentiable=(True, True),
    check=check,
)  # fmt: skip


# ---------------------------------------------------------------- front end


def matmul(a, b):
    """Matrix product with NumPy's ``matmul`` rules for 1-D, 2-D and batched 3-D operands
    (a 2-D operand is shared by every matrix of the other's batch)."""
    T = tape._tensor
    a, b = T.as_tensor(a), T.as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must be at least 1-D, got shapes {a.shape} and {b.shape}")
    if a.ndim > 3 or b.ndim > 3:
        raise ValueError(f"matmul: operands of more than 3 dimensions are not supported, got {a.shape} and {b.shape}")
    a2 = T.view(a, (1,) + a.shape, 0) if a.ndim == 1 else a
    b2 = T.view(b, b.shape + (1,), 0) if b.ndim == 1 else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ValueError(
            f"matmul: shapes {a.shape} and {b.shape} are not aligned: "
            f"{k} (last dim of the first) != {k2} ({'first' if b.ndim == 1 else 'second-to-last'} dim of the second)"
        )
    ba = a2.shape[0] if a2.ndim == 3 else None
    bb = b2.shape[0] if b2.ndim == 3 else None
    if ba is not None and bb is not None and ba != bb:
        if 1 not in (ba, bb):
            raise ValueError(f"matmul: batch dimensions {ba} and {bb} of shapes {a.shape} and {b.shape} do not broadcast")
    nb = max(ba or 1, bb or 1)
    sa = 0 if (ba is None or ba == 1) else m * k
    sb = 0 if (bb is None or bb == 1) else k * n
    batched = ba is not None or bb is not None
    out = T.apply("matmul", [a2, b2], ((nb,) if batched else ()) + (m, n), [nb, m, k, n, sa, sb])
    shape = out.shape
    if a.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if b.ndim == 1:
        shape = shape[:-1]
    return out if shape == out.shape else T.view(out, shape, 0)


def dot(a, b):
    """Inner product of two 1-D tensors (and ``matmul`` otherwise, as ``numpy.dot`` for <= 2-D)."""
    return matmul(a, b)


def outer(a, b):
    """Outer product of two vectors (flattened first, as ``numpy.outer``)."""
    T = tape._tensor
    a, b = T.as_tensor(a), T.as_tensor(b)
    return matmul(T.view(a, (a.numel(), 1), 0), T.view(b, (1, b.numel()), 0))
