"""GPU entry kernels of the scan and selection ops (:mod:`tape.ops.scan`).

The input is viewed as ``(outer, n, inner)`` (attribute block ``[outer, n, inner, ...]``) and
one thread owns each row ``(o, q)`` (``t0`` / ``ts`` over the ``outer * inner`` rows): a
sequential scan, a stable insertion sort, a sequential search. Each output element and each
input adjoint element has one writer, so there are no atomics and one phase each. Rows are
walked in the order of the CPU kernels, so the results are the same bits.
"""

from __future__ import annotations

from numba import cuda

from tape.gpu._config import DEVICE_JIT
from tape.gpu._kernels import GpuKernel
from tape.gpu._loops import active, boff, ent, goff, ip, ix, udiv
from tape.layout.columns import E_ATTR, E_IN0, E_OUT
from tape.ops.blocks import scan as sc

_dev = cuda.jit(**DEVICE_JIT)


@_dev
def _start(prog, i, r):
    """``(n, inner, offset of row r's first element)`` for the entry's ``(outer, n, inner)``
    view."""
    p = ent(prog, i, E_ATTR)
    n = ip(prog, p + sc.N)
    inner = ip(prog, p + sc.INNER)
    o = udiv(r, inner)
    return n, inner, o * n * inner + (r - o * inner)


@_dev
def _n_rows(prog, i):
    p = ent(prog, i, E_ATTR)
    return ip(prog, p + sc.OUTER) * ip(prog, p + sc.INNER)


# ---------------------------------------------------------------- cumsum, cumprod


@_dev
def _scan_fwd(is_prod, i, prog, A, base, step, t0, ts):
    x = boff(prog, ent(prog, i, E_IN0))
    y = boff(prog, ent(prog, i, E_OUT))
    for r in range(t0, _n_rows(prog, i), ts):
        n, inner, s = _start(prog, i, r)
        if n == 0:
            continue
        acc = A[ix(x + s, step, base)]
        A[ix(y + s, step, base)] = acc
        for j in range(1, n):
            v = A[ix(x + s + j * inner, step, base)]
            acc = acc * v if is_prod else acc + v
            A[ix(y + s + j * inner, step, base)] = acc


@_dev
def cumsum_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _scan_fwd(False, i, prog, A, base, step, t0, ts)


@_dev
def cumprod_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _scan_fwd(True, i, prog, A, base, step, t0, ts)


@_dev
def cumsum_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # dL/dx_j = sum_{k >= j} gy_k
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    gx = goff(prog) + boff(prog, a)
    gy = goff(prog) + boff(prog, ent(prog, i, E_OUT))
    for r in range(t0, _n_rows(prog, i), ts):
        n, inner, s = _start(prog, i, r)
        acc = 0.0
        for j in range(n - 1, -1, -1):
            e = s + j * inner
            acc += A[ix(gy + e, step, base)]
            A[ix(gx + e, step, base)] += acc


@_dev
def cumprod_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # dL/dx_j = y_{j-1} S_j, S_j = gy_j + x_{j+1} S_{j+1}: no division, exact with zeros
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    o_ = ent(prog, i, E_OUT)
    x = boff(prog, a)
    y = boff(prog, o_)
    gx = goff(prog) + x
    gy = goff(prog) + y
    for r in range(t0, _n_rows(prog, i), ts):
        n, inner, s = _start(prog, i, r)
        acc = 0.0
        for j in range(n - 1, -1, -1):
            e = s + j * inner
            if j == n - 1:
                acc = A[ix(gy + e, step, base)]
            else:
                acc = A[ix(gy + e, step, base)] + A[ix(x + e + inner, step, base)] * acc
            if j > 0:
                A[ix(gx + e, step, base)] += A[ix(y + e - inner, step, base)] * acc
            else:
                A[ix(gx + e, step, base)] += acc


# ---------------------------------------------------------------- argsort


@_dev
def _before(a, b, descending):
    # tape.ops.scan.before: NaN last ascending, first descending; ties keep their order
    if descending:
        return a > b or (a != a and b == b)
    return a < b or (a == a and b != b)


@_dev
def argsort_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # a stable insertion sort of each row's positions, in the output itself: the same
    # permutation as the CPU's merge sort (a stable order is unique)
    x = boff(prog, ent(prog, i, E_IN0))
    y = boff(prog, ent(prog, i, E_OUT))
    descending = ip(prog, ent(prog, i, E_ATTR) + sc.DESCENDING) != 0
    for r in range(t0, _n_rows(prog, i), ts):
        n, inner, s = _start(prog, i, r)
        for j in range(n):
            v = A[ix(x + s + j * inner, step, base)]
            k = j
            while k > 0:
                prev = A[ix(y + s + (k - 1) * inner, step, base)]
                if not _before(v, A[ix(x + s + int(prev) * inner, step, base)], descending):
                    break
                A[ix(y + s + k * inner, step, base)] = prev
                k -= 1
            A[ix(y + s + k * inner, step, base)] = j


# ---------------------------------------------------------------- argmax, argmin


@_dev
def _arg_extreme(is_max, i, prog, A, base, step, t0, ts):
    x = boff(prog, ent(prog, i, E_IN0))
    y = boff(prog, ent(prog, i, E_OUT))
    for r in range(t0, _n_rows(prog, i), ts):
        n, inner, s = _start(prog, i, r)
        if n == 0:
            continue
        best = A[ix(x + s, step, base)]
        at = 0
        if best == best:
            for j in range(1, n):
                v = A[ix(x + s + j * inner, step, base)]
                if v != v:  # the first NaN wins, as in NumPy
                    at = j
                    break
                if (is_max and v > best) or (not is_max and v < best):
                    best = v
                    at = j
        A[ix(y + r, step, base)] = at


@_dev
def argmax_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _arg_extreme(True, i, prog, A, base, step, t0, ts)


@_dev
def argmin_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _arg_extreme(False, i, prog, A, base, step, t0, ts)


KERNELS = {
    "cumsum": GpuKernel(cumsum_fwd, cumsum_rev, 1, 1),
    "cumprod": GpuKernel(cumprod_fwd, cumprod_rev, 1, 1),
    "argsort": GpuKernel(argsort_fwd, None, 1, 0),
    "argmax": GpuKernel(argmax_fwd, None, 1, 0),
    "argmin": GpuKernel(argmin_fwd, None, 1, 0),
}
"""The GPU paths of the scan and selection ops, merged into
:data:`tape.gpu._kernels.GPU_KERNELS`."""
