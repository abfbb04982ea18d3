"""GPU entry kernels of the scan and selection ops (:mod:`tape.ops.scan`).

The input is viewed as ``(outer, n, inner)`` (attribute block ``[outer, n, inner, ...]``) and
one thread owns each row ``(o, q)`` (``t0`` / ``ts`` over the ``outer * inner`` rows): a
sequential scan, a stable insertion sort, a sequential search.

The scans (``cumsum``, ``cumprod``, and any op whose record gives element loops, ``lanes``)
have no code here: :func:`lanes_kernel` compiles the CPU's element loops for the device. The
selection ops keep their own: the CPU's ``argsort`` is a merge sort on scratch rows of ``n``
elements, which a thread does not have (it sorts into its output row by insertion), and
``argmax`` / ``argmin`` are short searches whose output drops the axis. Each output element and each
input adjoint element has one writer, so there are no atomics and one phase each. Rows are
walked in the order of the CPU kernels, so the results are the same bits.
"""

from __future__ import annotations

import math

from numba import cuda, float64, int64

import tape.ops  # noqa: F401  (fills the registry)
from tape.gpu._config import DEVICE_JIT
from tape.gpu._kernels import GpuKernel
from tape.gpu._loops import active, boff, bsize, ent, goff, ip, ix, reject, udiv
from tape.gpu._rules import device_rule
from tape.layout.columns import E_ATTR, E_IN0, E_IN1, E_OUT
from tape.ops.blocks import scan as sc
from tape.ops.registry import OPS

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


# ---------------------------------------------------------------- ops with element loops


def lanes_kernel(op):
    """The GPU path of an op whose record gives its element loops (``Op.lanes``: cumsum,
    cumprod): the CPU's loops compiled as device functions, one thread per row (one lane,
    ``w = 1``, strided by the arena layout), so the results are the same bits."""
    fwd_lanes, rev_lanes = op.lanes
    f = device_rule(fwd_lanes)

    @_dev
    def fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
        b = int64(base)
        st = int64(step)
        x = boff(prog, ent(prog, i, E_IN0))
        y = boff(prog, ent(prog, i, E_OUT))
        for r in range(t0, _n_rows(prog, i), ts):
            n, inner, s = _start(prog, i, r)
            if n > 0:
                f(A, b + (x + s) * st, b + (y + s) * st, inner * st, n, 1)

    if rev_lanes is None:
        return GpuKernel(fwd, None, 1, 0)
    g_ = device_rule(rev_lanes)

    @_dev
    def rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
        a = ent(prog, i, E_IN0)
        if not active(prog, a):
            return
        b = int64(base)
        st = int64(step)
        x = boff(prog, a)
        y = boff(prog, ent(prog, i, E_OUT))
        g = goff(prog)
        acc = cuda.local.array(1, float64)
        for r in range(t0, _n_rows(prog, i), ts):
            n, inner, s = _start(prog, i, r)
            if n > 0:
                e = x + s
                o = y + s
                g_(A, A, b + e * st, b + o * st, b + (g + e) * st, b + (g + o) * st,
                   inner * st, n, 1, acc)  # fmt: skip

    return GpuKernel(fwd, rev, 1, 1)


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


# ---------------------------------------------------------------- cross_entropy
# tape.ops.nn: one thread per row (its logits strided by inner, its class index at the
# row's position in input 1); phase 0 checks every index first, as the CPU kernel does.


@_dev
def _shift_sum(A, x, s, n, inner, step, base):
    m = A[ix(x + s, step, base)]
    for j in range(1, n):
        v = A[ix(x + s + j * inner, step, base)]
        if v > m or v != v:
            m = v
    if not abs(m) < math.inf:
        m = 0.0
    total = 0.0
    for j in range(n):
        total += math.exp(A[ix(x + s + j * inner, step, base)] - m)
    return m, total


@_dev
def cross_entropy_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    ib = ent(prog, i, E_IN1)
    idx = boff(prog, ib)
    y = boff(prog, ent(prog, i, E_OUT))
    n = ip(prog, ent(prog, i, E_ATTR) + sc.N)
    if ph == 0:
        for r in range(t0, bsize(prog, ib), ts):
            v = A[ix(idx + r, step, base)]
            ok = v == v and v >= -n and v < n
            if ok:
                ok = int(v) == v
            if not ok:
                reject(i, prog, A, base, step, solo)
        return
    for r in range(t0, _n_rows(prog, i), ts):
        n, inner, s = _start(prog, i, r)
        m, total = _shift_sum(A, x, s, n, inner, step, base)
        t = int(A[ix(idx + r, step, base)])
        if t < 0:
            t += n
        A[ix(y + r, step, base)] = math.log(total) - (A[ix(x + s + t * inner, step, base)] - m)


@_dev
def cross_entropy_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    x = boff(prog, a)
    idx = boff(prog, ent(prog, i, E_IN1))
    gx = goff(prog) + x
    gy = goff(prog) + boff(prog, ent(prog, i, E_OUT))
    for r in range(t0, _n_rows(prog, i), ts):
        g = A[ix(gy + r, step, base)]
        if g == 0.0:
            continue
        n, inner, s = _start(prog, i, r)
        m, total = _shift_sum(A, x, s, n, inner, step, base)
        w = g / total
        t = int(A[ix(idx + r, step, base)])
        if t < 0:
            t += n
        for j in range(n):
            e = s + j * inner
            v = math.exp(A[ix(x + e, step, base)] - m) * w
            if j == t:
                v -= g
            A[ix(gx + e, step, base)] += v


# ---------------------------------------------------------------- logsumexp
# tape.ops.nn: one thread per row, as cross_entropy (the same shift and sum).


@_dev
def logsumexp_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    y = boff(prog, ent(prog, i, E_OUT))
    for r in range(t0, _n_rows(prog, i), ts):
        n, inner, s = _start(prog, i, r)
        if n == 0:
            A[ix(y + r, step, base)] = -math.inf
            continue
        m, total = _shift_sum(A, x, s, n, inner, step, base)
        A[ix(y + r, step, base)] = math.log(total) + m


@_dev
def logsumexp_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    x = boff(prog, a)
    gx = goff(prog) + x
    gy = goff(prog) + boff(prog, ent(prog, i, E_OUT))
    for r in range(t0, _n_rows(prog, i), ts):
        g = A[ix(gy + r, step, base)]
        n, inner, s = _start(prog, i, r)
        if g == 0.0 or n == 0:
            continue
        m, total = _shift_sum(A, x, s, n, inner, step, base)
        w = g / total
        for j in range(n):  # p_j = exp(x_j - m) / total, as the CPU kernel
            e = s + j * inner
            A[ix(gx + e, step, base)] += math.exp(A[ix(x + e, step, base)] - m) * w


KERNELS = {
    **{op.gpu: lanes_kernel(op) for op in OPS if op.lanes is not None},
    "argsort": GpuKernel(argsort_fwd, None, 1, 0),
    "argmax": GpuKernel(argmax_fwd, None, 1, 0),
    "argmin": GpuKernel(argmin_fwd, None, 1, 0),
    "cross_entropy": GpuKernel(cross_entropy_fwd, cross_entropy_rev, 2, 1, checks=(0,)),
    "logsumexp": GpuKernel(logsumexp_fwd, logsumexp_rev, 1, 1),
}
"""The GPU paths of the scan and selection ops, merged into
:data:`tape.gpu._kernels.GPU_KERNELS`."""
