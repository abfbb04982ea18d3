"""Compiled loops shared by the op kernels.

The elementwise loops take the op's scalar rule as their first argument; Numba compiles one
specialisation per rule and LLVM inlines the rule, so each loop is as fast as a hand-written
one. Inside each loop, slice views come first and the loop indexes the views (indexing the
arena with ``data[a + j]`` blocks vectorisation).

A zero output adjoint contributes exactly zero (the rule's value is discarded by a select,
which keeps the loop vectorised): ``0 * inf`` in an
unused branch, such as ``where(x > 0, sqrt(x), 0)`` at ``x = 0``, never becomes a NaN gradient.
A NaN adjoint still propagates.
"""

import numpy as np
from numba import njit

from tape.layout.calls import compiled_only
from tape.layout.columns import (
    B_KIND,
    B_NDIM,
    B_OFF,
    B_SHAPE,
    B_SIZE,
    CLASS_BASE,
    COL,
    CONST,
    E_ATTR,
    E_IN0,
    E_IN1,
    E_IN2,
    E_OUT,
    ONE,
    ROW,
    SAME,
)
from tape.layout.config import UNCACHED_JIT
from tape.layout.views import span, table
from tape.ops import masked as _masked
from tape.ops.blocks import broadcast

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)
# Loops that take a rule as an argument are inlined into the sweep at Numba-IR level: a
# function passed as a run-time argument to a separately compiled loop would make the sweep
# uncacheable (Numba embeds the dispatcher's address).
_loop = njit(inline="always", **UNCACHED_JIT)
masked = _jit(_masked.masked)
# the broadcast block's positions (tape.ops.blocks.broadcast), as the GPU loops compile them
# too: inlined in Numba IR (a function compiled on its own costs each first kernel a compile)
_position = njit(inline="always", **UNCACHED_JIT)
ndim_at = _position(broadcast.ndim_at)
dims_at = _position(broadcast.dims_at)
row_length_at = _position(broadcast.row_length_at)
strides_at = _position(broadcast.strides_at)
inner_stride_at = _position(broadcast.inner_stride_at)


@compiled_only(fastmath={"reassoc"})
def total(x):
    """The sum of the 1-D array ``x``, vectorised: LLVM may add in any order (several partial
    sums at once), not one element after the other, which is a chain of dependent adds."""
    s = 0.0
    for j in range(x.shape[0]):
        s += x[j]
    return s


@_jit
def strided_offsets(ipool, p_shape, p_strides, nd, base):
    """Offsets ``base + sum_k idx_k * strides_k`` for every multi-index of ``shape``, in
    C order. ``shape`` and ``strides`` are ``nd`` ints at ``p_shape`` / ``p_strides`` in
    ``ipool``."""
    n = 1
    for k in range(nd):
        n *= ipool[p_shape + k]
    off = np.empty(n, np.int64)
    if n == 0:
        return off
    idx = np.empty(nd + 1, np.int64)  # (np.zeros would compile its own fill: 0.1 s cold)
    for k in range(nd + 1):
        idx[k] = 0
    cur = base
    for j in range(n):
        off[j] = cur
        k = nd - 1
        while k >= 0:
            idx[k] += 1
            cur += ipool[p_strides + k]
            if idx[k] < ipool[p_shape + k]:
                break
            cur -= ipool[p_strides + k] * ipool[p_shape + k]
            idx[k] = 0
            k -= 1
    return off


@_jit
def bcast_offsets(ipool, p, k):
    """Offsets into input ``k`` for each output element of a GENERAL broadcast block at ``p``."""
    nd = ipool[ndim_at(p)]
    return strided_offsets(ipool, dims_at(p), strides_at(p, nd, k), nd, np.int64(0))


@_jit
def view(bufs, data, b):
    """Buffer ``b`` of the arena ``data`` (a view holding no reference: see
    :mod:`tape.layout.views`)."""
    return span(data, bufs[b, B_OFF], bufs[b, B_SIZE])


@_jit
def active(bufs, b):
    return bufs[b, B_KIND] != CONST


@_jit
def mat(flat, off, r, c):
    """Elements ``off`` to ``off + r * c`` of the 1-d array ``flat`` as an ``r x c`` matrix (a
    view holding no reference): one compiled function for every kernel's reshapes, not a
    reshape's code at each."""
    return table(flat, off, r, c)


# Copies and sums of matrices as loops, for the matrix kernels: Numba's array slice assignment
# compiles a shape-mismatch message (2.3-3.5 s, once per process and number of axes) and its
# np.tril 2.1 s; the shapes here agree by construction.
@_jit
def put2(dst, src):
    """``dst[:] = src`` for 2-d arrays of one shape."""
    for r in range(dst.shape[0]):
        for c in range(dst.shape[1]):
            dst[r, c] = src[r, c]


@_jit
def add2(dst, src):
    """``dst += src`` for 2-d arrays of one shape."""
    for r in range(dst.shape[0]):
        for c in range(dst.shape[1]):
            dst[r, c] += src[r, c]


@_jit
def tri(m, lower, k):
    """``np.tril(m, k)`` (``lower``) or ``np.triu(m, k)`` of a 2-d array, as a new C-ordered
    array."""
    out = np.zeros(m.shape, m.dtype)
    for r in range(m.shape[0]):
        for c in range(m.shape[1]):
            if (c - r <= k) if lower else (c - r >= k):
                out[r, c] = m[r, c]
    return out


@_jit
def shape_of(bufs, ipool, b):
    nd = bufs[b, B_NDIM]
    p = bufs[b, B_SHAPE]
    return ipool[p : p + nd]


# ---------------------------------------------------------------- unary


@_loop
def unary_fwd(f, i, entries, bufs, data):
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    for j in range(y.shape[0]):
        y[j] = f(x[j])


@_loop
def unary_rev(r, i, entries, bufs, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    gx = view(bufs, grad, a)
    for j in range(y.shape[0]):
        v = r(x[j], y[j], gy[j])
        gx[j] += masked(v, gy[j])


# ---------------------------------------------------------------- binary


@_loop
def binary_fwd(f, i, entries, bufs, ipool, data):
    # Binary entries always carry a GENERAL block (one row of n for equal shapes and
    # scalars): rows of the innermost axis, along which each input moves with stride 1 (a
    # contiguous run), 0 (one value) or another stride.
    x0 = view(bufs, data, entries[i, E_IN0])
    x1 = view(bufs, data, entries[i, E_IN1])
    y = view(bufs, data, entries[i, E_OUT])
    nd, m, s0, s1, o0, o1 = _rows(ipool, entries[i, E_ATTR])
    for r in range(o0.shape[0]):
        yr = span(y, r * m, m)
        b0 = o0[r] if nd > 1 else 0
        b1 = o1[r] if nd > 1 else 0
        if s0 == 1 and s1 == 1:
            a0 = span(x0, b0, m)
            a1 = span(x1, b1, m)
            for j in range(m):
                yr[j] = f(a0[j], a1[j])
        elif s0 == 1 and s1 == 0:
            a0 = span(x0, b0, m)
            c1 = x1[b1]
            for j in range(m):
                yr[j] = f(a0[j], c1)
        elif s0 == 0 and s1 == 1:
            c0 = x0[b0]
            a1 = span(x1, b1, m)
            for j in range(m):
                yr[j] = f(c0, a1[j])
        else:
            for j in range(m):
                yr[j] = f(x0[b0 + j * s0], x1[b1 + j * s1])


@_loop
def binary_rev(r0, r1, d0, d1, i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    act0 = d0 and active(bufs, a)
    act1 = d1 and active(bufs, b)
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    g0 = view(bufs, grad, a)
    g1 = view(bufs, grad, b)
    nd, m, s0, s1, o0, o1 = _rows(ipool, entries[i, E_ATTR])
    # each input's adjoint over every row in one call (a call per row, its array arguments
    # counted in and out, cost more than the row's arithmetic for rows of a few elements)
    if act0:
        _bcast_rev_rows(r0, True, x0, x1, g0, y, gy, nd, m, s0, s1, o0, o1)
    if act1:
        _bcast_rev_rows(r1, False, x0, x1, g1, y, gy, nd, m, s0, s1, o0, o1)


@_jit
def _rows(ipool, p):
    """Row view of a GENERAL block: ``(nd, row length, inner stride of input 0, of input 1,
    row starts in input 0, in input 1)``."""
    nd = ipool[ndim_at(p)]
    m = ipool[row_length_at(p, nd)]
    s0 = ipool[inner_stride_at(p, nd, 0)]
    s1 = ipool[inner_stride_at(p, nd, 1)]
    if nd == 1:  # one row starting at 0 in both inputs: no offsets to allocate
        return nd, m, s0, s1, ipool[p : p + 1], ipool[p : p + 1]
    o0 = strided_offsets(ipool, dims_at(p), strides_at(p, nd, 0), nd - 1, np.int64(0))
    o1 = strided_offsets(ipool, dims_at(p), strides_at(p, nd, 1), nd - 1, np.int64(0))
    return nd, m, s0, s1, o0, o1


SHORT_ROW = 4
"""Rows shorter than this take :func:`_bcast_rev_rows`' loop without views (below its four
running sums, so with the same results)."""


@_loop
def _bcast_rev_rows(r, first, x0, x1, g, y, gy, nd, m, s0, s1, o0, o1):
    # The rows of a GENERAL reverse for input 0 (first) or 1; `g` is that input's adjoint.
    sk = s0 if first else s1
    if m < SHORT_ROW:
        # short rows (a bias of a few classes): no views, which cost more than such a row's
        # arithmetic; a row reducing into one value sums in order, as the tail loop below
        for q in range(o0.shape[0]):
            b0 = o0[q] if nd > 1 else 0
            b1 = o1[q] if nd > 1 else 0
            bk = b0 if first else b1
            e = q * m
            if sk == 0:
                acc = 0.0
                for j in range(m):
                    gj = gy[e + j]
                    acc += masked(r(x0[b0 + j * s0], x1[b1 + j * s1], y[e + j], gj), gj)
                g[bk] += acc
            else:
                for j in range(m):
                    gj = gy[e + j]
                    v = r(x0[b0 + j * s0], x1[b1 + j * s1], y[e + j], gj)
                    g[bk + j * sk] += masked(v, gj)
        return
    for q in range(o0.shape[0]):
        b0 = o0[q] if nd > 1 else 0
        b1 = o1[q] if nd > 1 else 0
        bk = b0 if first else b1
        yr = span(y, q * m, m)
        gyr = span(gy, q * m, m)
        if s0 <= 1 and s1 <= 1 and sk == 1:
            gk = span(g, bk, m)
            if s0 == 1 and s1 == 1:
                a0 = span(x0, b0, m)
                a1 = span(x1, b1, m)
                for j in range(m):
                    v = r(a0[j], a1[j], yr[j], gyr[j])
                    gk[j] += masked(v, gyr[j])
            elif s1 == 0:
                a0 = span(x0, b0, m)
                c1 = x1[b1]
                for j in range(m):
                    v = r(a0[j], c1, yr[j], gyr[j])
                    gk[j] += masked(v, gyr[j])
            else:
                c0 = x0[b0]
                a1 = span(x1, b1, m)
                for j in range(m):
                    v = r(c0, a1[j], yr[j], gyr[j])
                    gk[j] += masked(v, gyr[j])
        elif sk == 0:
            # the row's contributions to one value, in four running sums: one chain of adds
            # waits for each add (benchmarks/MEASURED.md)
            p0 = p1 = p2 = p3 = 0.0
            j = 0
            while j + 4 <= m:
                p0 += _bcast_rev_at(r, x0, x1, b0, b1, s0, s1, yr, gyr, j)
                p1 += _bcast_rev_at(r, x0, x1, b0, b1, s0, s1, yr, gyr, j + 1)
                p2 += _bcast_rev_at(r, x0, x1, b0, b1, s0, s1, yr, gyr, j + 2)
                p3 += _bcast_rev_at(r, x0, x1, b0, b1, s0, s1, yr, gyr, j + 3)
                j += 4
            acc = (p0 + p1) + (p2 + p3)
            for k in range(j, m):
                acc += _bcast_rev_at(r, x0, x1, b0, b1, s0, s1, yr, gyr, k)
            g[bk] += acc
        else:
            for j in range(m):
                g[bk + j * sk] += _bcast_rev_at(r, x0, x1, b0, b1, s0, s1, yr, gyr, j)


@_loop
def _bcast_rev_at(r, x0, x1, b0, b1, s0, s1, yr, gyr, j):
    """Element ``j`` of a GENERAL row's reverse rule ``r``, masked."""
    return masked(r(x0[b0 + j * s0], x1[b1 + j * s1], yr[j], gyr[j]), gyr[j])


# ---------------------------------------------------------------- ternary


# ---------------------------------------------------------------- binary, by entry class
# Kernels of one entry class (tape.interpreter.dispatch.entry_class), for the cases that most
# entries are: both inputs of the output's size (``same``), one of them a single value
# (``one0``, ``one1``), a row of the output (``row0``, ``row1``: a bias) or a column of it
# (``col0``, ``col1``: one value per run, as ``x - x.max(axis=1, keepdims=True)``). Each runs the loop
# that the general kernel's path for that case runs, element for element and in the same
# order (the same numbers), and compiles nothing else: a tape compiles only the paths its
# entries take. They read no attribute block: the sizes and shapes (the class) say all.


@_loop
def binary_fwd_flat(f, sc0, sc1, i, entries, bufs, ipool, data):
    # binary_fwd's loop for an entry class: input k is the output's size, or one value where
    # sck (a constant: the specialised copy has no branch on it)
    x0 = view(bufs, data, entries[i, E_IN0])
    x1 = view(bufs, data, entries[i, E_IN1])
    y = view(bufs, data, entries[i, E_OUT])
    c0 = x0[0] if sc0 else 0.0
    c1 = x1[0] if sc1 else 0.0
    for j in range(y.shape[0]):
        y[j] = f(c0 if sc0 else x0[j], c1 if sc1 else x1[j])


@_loop
def binary_rev_flat(r0, r1, d0, d1, sc0, sc1, i, entries, bufs, ipool, data, grad):
    # binary_rev's loops for an entry class (see binary_fwd_flat): an input of the output's
    # size gets an adjoint per element; a one-value input the row's contributions, summed in
    # four running sums (as _bcast_rev_row). The sums are written out for each input, not
    # called: a loop in a function of its own would compile as one more function per op.
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    c0 = x0[0] if sc0 else 0.0
    c1 = x1[0] if sc1 else 0.0
    m = y.shape[0]
    if d0 and active(bufs, a):
        g0 = view(bufs, grad, a)
        if sc0:
            p0 = p1 = p2 = p3 = 0.0
            j = 0
            while j + 4 <= m:
                p0 += masked(r0(c0, x1[j], y[j], gy[j]), gy[j])
                p1 += masked(r0(c0, x1[j + 1], y[j + 1], gy[j + 1]), gy[j + 1])
                p2 += masked(r0(c0, x1[j + 2], y[j + 2], gy[j + 2]), gy[j + 2])
                p3 += masked(r0(c0, x1[j + 3], y[j + 3], gy[j + 3]), gy[j + 3])
                j += 4
            acc = (p0 + p1) + (p2 + p3)
            for k in range(j, m):
                acc += masked(r0(c0, x1[k], y[k], gy[k]), gy[k])
            g0[0] += acc
        else:
            for j in range(m):
                v = r0(x0[j], c1 if sc1 else x1[j], y[j], gy[j])
                g0[j] += masked(v, gy[j])
    if d1 and active(bufs, b):
        g1 = view(bufs, grad, b)
        if sc1:
            q0 = q1 = q2 = q3 = 0.0
            j = 0
            while j + 4 <= m:
                q0 += masked(r1(x0[j], c1, y[j], gy[j]), gy[j])
                q1 += masked(r1(x0[j + 1], c1, y[j + 1], gy[j + 1]), gy[j + 1])
                q2 += masked(r1(x0[j + 2], c1, y[j + 2], gy[j + 2]), gy[j + 2])
                q3 += masked(r1(x0[j + 3], c1, y[j + 3], gy[j + 3]), gy[j + 3])
                j += 4
            acc = (q0 + q1) + (q2 + q3)
            for k in range(j, m):
                acc += masked(r1(x0[k], c1, y[k], gy[k]), gy[k])
            g1[0] += acc
        else:
            for j in range(m):
                v = r1(c0 if sc0 else x0[j], x1[j], y[j], gy[j])
                g1[j] += masked(v, gy[j])


@_loop
def binary_tan_flat(r0, r1, d0, d1, sc0, sc1, i, entries, bufs, ipool, data, T):
    # binary_tan for the entry classes above: input k is the output's size, or one value
    # where sck (a constant: the specialised copy has no branch on it); the same loops, in
    # the same order, as binary_tan's rows of such an entry
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    n = y.shape[0]
    if T.shape[0] > 1:
        p0 = np.zeros(n, T.dtype)
        p1 = np.zeros(n, T.dtype)
        for j in range(n):
            u, w, yv = x0[0 if sc0 else j], x1[0 if sc1 else j], y[j]
            if d0:
                p0[j] = r0(u, w, yv, 1.0)
            if d1:
                p1[j] = r1(u, w, yv, 1.0)
        for d in range(T.shape[0]):
            t0 = view(bufs, T[d], a)
            t1 = view(bufs, T[d], b)
            ty = view(bufs, T[d], o)
            for j in range(n):
                v0 = t0[0 if sc0 else j]
                v1 = t1[0 if sc1 else j]
                acc = masked(p0[j] * v0, v0) if d0 else 0.0
                if d1:
                    acc += masked(p1[j] * v1, v1)
                ty[j] = acc
        return
    t0 = view(bufs, T[0], a)
    t1 = view(bufs, T[0], b)
    ty = view(bufs, T[0], o)
    for j in range(n):
        k0 = 0 if sc0 else j
        k1 = 0 if sc1 else j
        ty[j] = _tan2(r0, r1, d0, d1, x0[k0], x1[k1], y[j], t0[k0], t1[k1])


@_loop
def binary_hrev_flat(r0, r1, h00, h01, h11, d0, d1, n00, n01, n11, sc0, sc1, i, entries, bufs,
                     ipool, data, grad, T, GT):  # fmt: skip
    # binary_hrev for the entry classes above (see binary_tan_flat)
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    act0 = d0 and active(bufs, a)
    act1 = d1 and active(bufs, b)
    if not (act0 or act1):
        return
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    n = y.shape[0]
    if T.shape[0] > 1:
        p0 = np.zeros(n, T.dtype)
        p1 = np.zeros(n, T.dtype)
        q00 = np.zeros(n, T.dtype)
        q01 = np.zeros(n, T.dtype)
        q11 = np.zeros(n, T.dtype)
        for j in range(n):
            u, w, yv, g = x0[0 if sc0 else j], x1[0 if sc1 else j], y[j], gy[j]
            if act0:
                p0[j] = r0(u, w, yv, 1.0)
            if act1:
                p1[j] = r1(u, w, yv, 1.0)
            if g != 0.0:
                if n00:
                    q00[j] = g * h00(u, w, yv)
                if n01:
                    q01[j] = g * h01(u, w, yv)
                if n11:
                    q11[j] = g * h11(u, w, yv)
        for d in range(T.shape[0]):
            t0 = view(bufs, T[d], a)
            t1 = view(bufs, T[d], b)
            g0 = view(bufs, GT[d], a)
            g1 = view(bufs, GT[d], b)
            gty = view(bufs, GT[d], o)
            for j in range(n):
                k0 = 0 if sc0 else j
                k1 = 0 if sc1 else j
                dg = gty[j]
                ta = t0[k0] if act0 else 0.0
                tb = t1[k1] if act1 else 0.0
                if act0:
                    v = masked(p0[j] * dg, dg)
                    if q00[j] != 0.0 and ta != 0.0:
                        v += q00[j] * ta
                    if q01[j] != 0.0 and tb != 0.0:
                        v += q01[j] * tb
                    g0[k0] += v
                if act1:
                    v = masked(p1[j] * dg, dg)
                    if q01[j] != 0.0 and ta != 0.0:
                        v += q01[j] * ta
                    if q11[j] != 0.0 and tb != 0.0:
                        v += q11[j] * tb
                    g1[k1] += v
        return
    t0 = view(bufs, T[0], a)
    t1 = view(bufs, T[0], b)
    g0 = view(bufs, GT[0], a)
    g1 = view(bufs, GT[0], b)
    gty = view(bufs, GT[0], o)
    if not sc0 and not sc1 and a != b:  # no aliasing: the loops vectorise
        if act0:
            for j in range(n):
                g0[j] += _hrev_one(r0, h00, h01, n00, n01, x0[j], x1[j], y[j], gy[j], gty[j],
                                   t0[j], t1[j])  # fmt: skip
        if act1:
            for j in range(n):
                g1[j] += _hrev_one(r1, h01, h11, n01, n11, x0[j], x1[j], y[j], gy[j], gty[j],
                                   t0[j], t1[j])  # fmt: skip
        return
    for j in range(n):
        k0 = 0 if sc0 else j
        k1 = 0 if sc1 else j
        u, w, yv, g, dg = x0[k0], x1[k1], y[j], gy[j], gty[j]
        if act0:
            g0[k0] += _hrev_one(r0, h00, h01, n00, n01, u, w, yv, g, dg, t0[k0], t1[k1])
        if act1:
            g1[k1] += _hrev_one(r1, h01, h11, n01, n11, u, w, yv, g, dg, t0[k0], t1[k1])


@_loop
def binary_fwd_row(f, row0, i, entries, bufs, ipool, data):
    # binary_fwd for an entry whose input 1 (input 0 where row0, a constant) is a row: its
    # s elements are every run of s in the output, which the other input has the size of.
    # The general kernel's block merges such an entry into rows of s (both inputs walk
    # them with stride 1), so this runs its loop, element for element.
    x0 = view(bufs, data, entries[i, E_IN0])
    x1 = view(bufs, data, entries[i, E_IN1])
    y = view(bufs, data, entries[i, E_OUT])
    s = x0.shape[0] if row0 else x1.shape[0]
    for r in range(y.shape[0] // s):
        yr = span(y, r * s, s)
        a0 = x0 if row0 else span(x0, r * s, s)
        a1 = span(x1, r * s, s) if row0 else x1
        for j in range(s):
            yr[j] = f(a0[j], a1[j])


@_loop
def binary_rev_row(r0, r1, d0, d1, row0, i, entries, bufs, ipool, data, grad):
    # binary_rev for the entries of binary_fwd_row: the row's adjoint gets each run's
    # contributions, run after run, as the general kernel's rows of s add them (the same
    # numbers); the other input's adjoint one per element
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    s = x0.shape[0] if row0 else x1.shape[0]
    if d0 and active(bufs, a):
        g0 = view(bufs, grad, a)
        for r in range(y.shape[0] // s):
            yr = span(y, r * s, s)
            gyr = span(gy, r * s, s)
            a0 = x0 if row0 else span(x0, r * s, s)
            a1 = span(x1, r * s, s) if row0 else x1
            h0 = g0 if row0 else span(g0, r * s, s)
            for j in range(s):
                h0[j] += masked(r0(a0[j], a1[j], yr[j], gyr[j]), gyr[j])
    if d1 and active(bufs, b):
        g1 = view(bufs, grad, b)
        for r in range(y.shape[0] // s):
            yr = span(y, r * s, s)
            gyr = span(gy, r * s, s)
            a0 = x0 if row0 else span(x0, r * s, s)
            a1 = span(x1, r * s, s) if row0 else x1
            h1 = span(g1, r * s, s) if row0 else g1
            for j in range(s):
                h1[j] += masked(r1(a0[j], a1[j], yr[j], gyr[j]), gyr[j])


@_loop
def binary_fwd_col(f, col0, i, entries, bufs, ipool, data):
    # binary_fwd for an entry whose input 1 (input 0 where col0, a constant) is a column: its
    # element q is one value over the output's run q (of n // s), and the other input has the
    # output's size. The general kernel's block merges such an entry into rows of a run (the
    # column's stride along them 0), so this runs its loop, element for element.
    x0 = view(bufs, data, entries[i, E_IN0])
    x1 = view(bufs, data, entries[i, E_IN1])
    y = view(bufs, data, entries[i, E_OUT])
    s = x0.shape[0] if col0 else x1.shape[0]
    m = y.shape[0] // s
    for q in range(s):
        yr = span(y, q * m, m)
        if col0:
            c0 = x0[q]
            a1 = span(x1, q * m, m)
            for j in range(m):
                yr[j] = f(c0, a1[j])
        else:
            a0 = span(x0, q * m, m)
            c1 = x1[q]
            for j in range(m):
                yr[j] = f(a0[j], c1)


@_loop
def binary_rev_col(r0, r1, d0, d1, col0, i, entries, bufs, ipool, data, grad):
    # binary_rev for the entries of binary_fwd_col: the column's element q gets the sum of
    # run q's contributions, added as the general kernel's rows add them (in order for runs
    # shorter than SHORT_ROW, else in four running sums), the other input one per element.
    # The sums are written out for each input, as in binary_rev_flat.
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    s = x0.shape[0] if col0 else x1.shape[0]
    m = y.shape[0] // s
    if d0 and active(bufs, a):
        g0 = view(bufs, grad, a)
        for q in range(s):
            yr = span(y, q * m, m)
            gyr = span(gy, q * m, m)
            if col0:
                c0 = x0[q]
                a1 = span(x1, q * m, m)
                if m < SHORT_ROW:
                    acc = 0.0
                    for j in range(m):
                        acc += masked(r0(c0, a1[j], yr[j], gyr[j]), gyr[j])
                else:
                    p0 = p1 = p2 = p3 = 0.0
                    j = 0
                    while j + 4 <= m:
                        p0 += masked(r0(c0, a1[j], yr[j], gyr[j]), gyr[j])
                        p1 += masked(r0(c0, a1[j + 1], yr[j + 1], gyr[j + 1]), gyr[j + 1])
                        p2 += masked(r0(c0, a1[j + 2], yr[j + 2], gyr[j + 2]), gyr[j + 2])
                        p3 += masked(r0(c0, a1[j + 3], yr[j + 3], gyr[j + 3]), gyr[j + 3])
                        j += 4
                    acc = p0 + p1 + (p2 + p3)
                    for k in range(j, m):
                        acc += masked(r0(c0, a1[k], yr[k], gyr[k]), gyr[k])
                g0[q] += acc
            else:
                a0 = span(x0, q * m, m)
                c1 = x1[q]
                h0 = span(g0, q * m, m)
                for j in range(m):
                    h0[j] += masked(r0(a0[j], c1, yr[j], gyr[j]), gyr[j])
    if d1 and active(bufs, b):
        g1 = view(bufs, grad, b)
        for q in range(s):
            yr = span(y, q * m, m)
            gyr = span(gy, q * m, m)
            if col0:
                c0 = x0[q]
                a1 = span(x1, q * m, m)
                h1 = span(g1, q * m, m)
                for j in range(m):
                    h1[j] += masked(r1(c0, a1[j], yr[j], gyr[j]), gyr[j])
            else:
                a0 = span(x0, q * m, m)
                c1 = x1[q]
                if m < SHORT_ROW:
                    acc = 0.0
                    for j in range(m):
                        acc += masked(r1(a0[j], c1, yr[j], gyr[j]), gyr[j])
                else:
                    p0 = p1 = p2 = p3 = 0.0
                    j = 0
                    while j + 4 <= m:
                        p0 += masked(r1(a0[j], c1, yr[j], gyr[j]), gyr[j])
                        p1 += masked(r1(a0[j + 1], c1, yr[j + 1], gyr[j + 1]), gyr[j + 1])
                        p2 += masked(r1(a0[j + 2], c1, yr[j + 2], gyr[j + 2]), gyr[j + 2])
                        p3 += masked(r1(a0[j + 3], c1, yr[j + 3], gyr[j + 3]), gyr[j + 3])
                        j += 4
                    acc = p0 + p1 + (p2 + p3)
                    for k in range(j, m):
                        acc += masked(r1(a0[k], c1, yr[k], gyr[k]), gyr[k])
                g1[q] += acc


BINARY_CLASSES = {
    0: ("flat", "False, False"),  # equal sizes
    ONE: ("flat", "True, False"),  # input 0 one value
    CLASS_BASE * ONE: ("flat", "False, True"),  # input 1 one value
    ROW: ("row", "True"),  # input 0 a row, input 1 of the output's size
    CLASS_BASE * ROW: ("row", "False"),
    COL: ("col", "True"),  # input 0 a column, input 1 of the output's size
    CLASS_BASE * COL: ("col", "False"),
}
"""The entry classes (:func:`tape.interpreter.dispatch.entry_class`) that binary ops have
kernels of their own for: ``class: (loops, flags)``, the kernels ``binary_fwd_<loops>`` and
``binary_rev_<loops>`` called with the class's constant flags (which input is one value, a
row or a column). The ``flat`` classes also have their tangent and forward-over-reverse
entries (``binary_tan_flat``, ``binary_hrev_flat``); rows' and columns' are the general
kernels'."""


@_loop
def ternary_fwd(f, i, entries, bufs, ipool, data):
    x0 = view(bufs, data, entries[i, E_IN0])
    x1 = view(bufs, data, entries[i, E_IN1])
    x2 = view(bufs, data, entries[i, E_IN2])
    y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    n = y.shape[0]
    if ipool[p] == SAME:
        for j in range(n):
            y[j] = f(x0[j], x1[j], x2[j])
    else:
        o0 = bcast_offsets(ipool, p, np.int64(0))
        o1 = bcast_offsets(ipool, p, np.int64(1))
        o2 = bcast_offsets(ipool, p, np.int64(2))
        for j in range(n):
            y[j] = f(x0[o0[j]], x1[o1[j]], x2[o2[j]])


@_loop
def _ternary_rev_one(r, k, x0, x1, x2, y, gy, gk, ipool, p):
    n = y.shape[0]
    if ipool[p] == SAME:
        for j in range(n):
            v = r(x0[j], x1[j], x2[j], y[j], gy[j])
            gk[j] += masked(v, gy[j])
    else:
        o0 = bcast_offsets(ipool, p, np.int64(0))
        o1 = bcast_offsets(ipool, p, np.int64(1))
        o2 = bcast_offsets(ipool, p, np.int64(2))
        ok = bcast_offsets(ipool, p, np.int64(k))
        for j in range(n):
            v = r(x0[o0[j]], x1[o1[j]], x2[o2[j]], y[j], gy[j])
            gk[ok[j]] += masked(v, gy[j])


@_loop
def ternary_rev(r0, r1, r2, d0, d1, d2, i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    c = entries[i, E_IN2]
    o = entries[i, E_OUT]
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    x2 = view(bufs, data, c)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    p = entries[i, E_ATTR]
    if d0 and active(bufs, a):
        _ternary_rev_one(r0, 0, x0, x1, x2, y, gy, view(bufs, grad, a), ipool, p)
    if d1 and active(bufs, b):
        _ternary_rev_one(r1, 1, x0, x1, x2, y, gy, view(bufs, grad, b), ipool, p)
    if d2 and active(bufs, c):
        _ternary_rev_one(r2, 2, x0, x1, x2, y, gy, view(bufs, grad, c), ipool, p)


@_jit
def no_rule4(x0, x1, y, gy):
    return 0.0


@_jit
def no_rule5(x0, x1, x2, y, gy):
    return 0.0


# ---------------------------------------------------------------- tangents (forward mode)
#
# The tangent of an elementwise entry is its reverse rules applied to the input tangents:
# ``r_k(x, y, g)`` is ``g * df/dx_k``, and a scalar partial is its own transpose, so
# ``ty = sum_k r_k(x, y, t_k)``. ``T`` holds one tangent arena per direction (rows; the value
# arena's layout); the loops run every direction of an entry while its values are at hand.
# Tangents of constants are zero in ``T`` (never written), so inactive inputs need no test.
# The same select as the reverse loops keeps a zero tangent from turning an inf partial into
# NaN. With several directions the loops evaluate each element's partials once
# (``r_k(x, y, 1)``: rules are linear in their adjoint) and scale them per direction.
#
# The tangent of a reverse entry (forward-over-reverse, for Hessian-vector products) adds to
# the tangent adjoint ``gt`` of input ``k``
#     r_k(x, y, gt_y) + g_y * sum_j H_kj(x, y) t_j
# where ``H`` are the op's second partials (``Op.hess``; ``nK`` says which are nonzero).


@_loop
def unary_tan(r, i, entries, bufs, data, T):
    a = entries[i, E_IN0]
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    y = view(bufs, data, o)
    if T.shape[0] == 1:
        tx = view(bufs, T[0], a)
        ty = view(bufs, T[0], o)
        for j in range(y.shape[0]):
            ty[j] = masked(r(x[j], y[j], tx[j]), tx[j])
        return
    # several directions: each element's partial once (rules are linear in their adjoint)
    p = np.empty(y.shape[0], T.dtype)
    for j in range(y.shape[0]):
        p[j] = r(x[j], y[j], 1.0)
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], a)
        ty = view(bufs, T[d], o)
        for j in range(y.shape[0]):
            ty[j] = masked(p[j] * tx[j], tx[j])


@_loop
def unary_hrev(r, h, nh, i, entries, bufs, data, grad, T, GT):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    n = y.shape[0]
    if T.shape[0] == 1:
        tx = view(bufs, T[0], a)
        gty = view(bufs, GT[0], o)
        gtx = view(bufs, GT[0], a)
        for j in range(n):
            v = masked(r(x[j], y[j], gty[j]), gty[j])
            if nh and gy[j] != 0.0 and tx[j] != 0.0:
                v += gy[j] * (h(x[j], y[j]) * tx[j])
            gtx[j] += v
        return
    # several directions: the partial and gy * f'' once per element
    p = np.empty(n, T.dtype)
    q = np.zeros(n, T.dtype)
    for j in range(n):
        p[j] = r(x[j], y[j], 1.0)
        if nh and gy[j] != 0.0:
            q[j] = gy[j] * h(x[j], y[j])
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], a)
        gty = view(bufs, GT[d], o)
        gtx = view(bufs, GT[d], a)
        for j in range(n):
            v = masked(p[j] * gty[j], gty[j])
            if nh and gy[j] != 0.0 and tx[j] != 0.0:
                v += q[j] * tx[j]
            gtx[j] += v


@_loop
def _tan2(r0, r1, d0, d1, u, w, y, t0, t1):
    acc = masked(r0(u, w, y, t0), t0) if d0 else 0.0
    if d1:
        acc += masked(r1(u, w, y, t1), t1)
    return acc


@_loop
def binary_tan(r0, r1, d0, d1, i, entries, bufs, ipool, data, T):
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    nd, m, s0, s1, o0, o1 = _rows(ipool, entries[i, E_ATTR])
    if T.shape[0] > 1:
        _binary_tan_partials(r0, r1, d0, d1, x0, x1, y, a, b, o, bufs, T, nd, m, s0, s1, o0, o1)
        return
    t0 = view(bufs, T[0], a)
    t1 = view(bufs, T[0], b)
    ty = view(bufs, T[0], o)
    for r in range(o0.shape[0]):
        b0 = o0[r] if nd > 1 else 0
        b1 = o1[r] if nd > 1 else 0
        yr = span(y, r * m, m)
        tyr = span(ty, r * m, m)
        if s0 == 1 and s1 == 1:
            a0, a1 = span(x0, b0, m), span(x1, b1, m)
            u0, u1 = span(t0, b0, m), span(t1, b1, m)
            for j in range(m):
                tyr[j] = _tan2(r0, r1, d0, d1, a0[j], a1[j], yr[j], u0[j], u1[j])
        elif s0 == 1 and s1 == 0:
            a0, u0 = span(x0, b0, m), span(t0, b0, m)
            c1, w1 = x1[b1], t1[b1]
            for j in range(m):
                tyr[j] = _tan2(r0, r1, d0, d1, a0[j], c1, yr[j], u0[j], w1)
        elif s0 == 0 and s1 == 1:
            c0, w0 = x0[b0], t0[b0]
            a1, u1 = span(x1, b1, m), span(t1, b1, m)
            for j in range(m):
                tyr[j] = _tan2(r0, r1, d0, d1, c0, a1[j], yr[j], w0, u1[j])
        else:
            for j in range(m):
                k0 = b0 + j * s0
                k1 = b1 + j * s1
                tyr[j] = _tan2(r0, r1, d0, d1, x0[k0], x1[k1], yr[j], t0[k0], t1[k1])


@_loop
def _binary_tan_partials(r0, r1, d0, d1, x0, x1, y, a, b, o, bufs, T, nd, m, s0, s1, o0, o1):
    # several directions: each element's two partials once, then every direction (its
    # views made once per direction)
    n = y.shape[0]
    p0 = np.zeros(n, T.dtype)
    p1 = np.zeros(n, T.dtype)
    for r in range(o0.shape[0]):
        b0 = o0[r] if nd > 1 else 0
        b1 = o1[r] if nd > 1 else 0
        for j in range(m):
            u, w, yv = x0[b0 + j * s0], x1[b1 + j * s1], y[r * m + j]
            if d0:
                p0[r * m + j] = r0(u, w, yv, 1.0)
            if d1:
                p1[r * m + j] = r1(u, w, yv, 1.0)
    for d in range(T.shape[0]):
        t0 = view(bufs, T[d], a)
        t1 = view(bufs, T[d], b)
        ty = view(bufs, T[d], o)
        for r in range(o0.shape[0]):
            b0 = o0[r] if nd > 1 else 0
            b1 = o1[r] if nd > 1 else 0
            e = r * m
            for j in range(m):
                v0 = t0[b0 + j * s0]
                v1 = t1[b1 + j * s1]
                acc = masked(p0[e + j] * v0, v0) if d0 else 0.0
                if d1:
                    acc += masked(p1[e + j] * v1, v1)
                ty[e + j] = acc


@_loop
def _hrev_one(r, ha, hb, na, nb, u, w, y, g, dg, ta, tb):
    # the tangent of one input's reverse contribution: r(.., dg) + g * (ha * ta + hb * tb)
    v = masked(r(u, w, y, dg), dg)
    if g != 0.0:
        s = 0.0
        if na and ta != 0.0:
            s += ha(u, w, y) * ta
        if nb and tb != 0.0:
            s += hb(u, w, y) * tb
        v += g * s
    return v


@_loop
def binary_hrev(r0, r1, h00, h01, h11, d0, d1, n00, n01, n11, i, entries, bufs, ipool, data,
                grad, T, GT):  # fmt: skip
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    o = entries[i, E_OUT]
    act0 = d0 and active(bufs, a)
    act1 = d1 and active(bufs, b)
    if not (act0 or act1):
        return
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    y = view(bufs, data, o)
    gy = view(bufs, grad, o)
    nd, m, s0, s1, o0, o1 = _rows(ipool, entries[i, E_ATTR])
    if T.shape[0] > 1:
        _binary_hrev_partials(r0, r1, h00, h01, h11, act0, act1, n00, n01, n11, x0, x1, y, gy,
                              a, b, o, bufs, T, GT, nd, m, s0, s1, o0, o1)  # fmt: skip
        return
    for d in range(T.shape[0]):
        t0 = view(bufs, T[d], a)
        t1 = view(bufs, T[d], b)
        g0 = view(bufs, GT[d], a)
        g1 = view(bufs, GT[d], b)
        gty = view(bufs, GT[d], o)
        for r in range(o0.shape[0]):
            b0 = o0[r] if nd > 1 else 0
            b1 = o1[r] if nd > 1 else 0
            if s0 == 1 and s1 == 1 and a != b:  # contiguous rows, no aliasing: vectorises
                a0, a1 = span(x0, b0, m), span(x1, b1, m)
                u0, u1 = span(t0, b0, m), span(t1, b1, m)
                e = r * m
                yr, gr, dgr = span(y, e, m), span(gy, e, m), span(gty, e, m)
                if act0:
                    q0 = span(g0, b0, m)
                    for j in range(m):
                        q0[j] += _hrev_one(
                            r0, h00, h01, n00, n01, a0[j], a1[j], yr[j], gr[j], dgr[j], u0[j], u1[j]
                        )
                if act1:
                    q1 = span(g1, b1, m)
                    for j in range(m):
                        q1[j] += _hrev_one(
                            r1, h01, h11, n01, n11, a0[j], a1[j], yr[j], gr[j], dgr[j], u0[j], u1[j]
                        )
                continue
            for j in range(m):
                k0 = b0 + j * s0
                k1 = b1 + j * s1
                jy = r * m + j
                u, w, yv, g, dg = x0[k0], x1[k1], y[jy], gy[jy], gty[jy]
                if act0:
                    g0[k0] += _hrev_one(r0, h00, h01, n00, n01, u, w, yv, g, dg, t0[k0], t1[k1])
                if act1:
                    g1[k1] += _hrev_one(r1, h01, h11, n01, n11, u, w, yv, g, dg, t0[k0], t1[k1])


@_loop
def _binary_hrev_partials(r0, r1, h00, h01, h11, act0, act1, n00, n01, n11, x0, x1, y, gy, a, b,
                          o, bufs, T, GT, nd, m, s0, s1, o0, o1):  # fmt: skip
    # several directions: the partials and gy times the second partials once per element,
    # then every direction (its views made once per direction)
    n = y.shape[0]
    p0 = np.zeros(n, T.dtype)
    p1 = np.zeros(n, T.dtype)
    q00 = np.zeros(n, T.dtype)
    q01 = np.zeros(n, T.dtype)
    q11 = np.zeros(n, T.dtype)
    for r in range(o0.shape[0]):
        b0 = o0[r] if nd > 1 else 0
        b1 = o1[r] if nd > 1 else 0
        for j in range(m):
            e = r * m + j
            u, w, yv, g = x0[b0 + j * s0], x1[b1 + j * s1], y[e], gy[e]
            if act0:
                p0[e] = r0(u, w, yv, 1.0)
            if act1:
                p1[e] = r1(u, w, yv, 1.0)
            if g != 0.0:
                if n00:
                    q00[e] = g * h00(u, w, yv)
                if n01:
                    q01[e] = g * h01(u, w, yv)
                if n11:
                    q11[e] = g * h11(u, w, yv)
    for d in range(T.shape[0]):
        t0 = view(bufs, T[d], a)
        t1 = view(bufs, T[d], b)
        g0 = view(bufs, GT[d], a)
        g1 = view(bufs, GT[d], b)
        gty = view(bufs, GT[d], o)
        for r in range(o0.shape[0]):
            b0 = o0[r] if nd > 1 else 0
            b1 = o1[r] if nd > 1 else 0
            for j in range(m):
                e = r * m + j
                k0 = b0 + j * s0
                k1 = b1 + j * s1
                dg = gty[e]
                ta = t0[k0] if act0 else 0.0
                tb = t1[k1] if act1 else 0.0
                if act0:
                    v = masked(p0[e] * dg, dg)
                    if q00[e] != 0.0 and ta != 0.0:
                        v += q00[e] * ta
                    if q01[e] != 0.0 and tb != 0.0:
                        v += q01[e] * tb
                    g0[k0] += v
                if act1:
                    v = masked(p1[e] * dg, dg)
                    if q01[e] != 0.0 and ta != 0.0:
                        v += q01[e] * ta
                    if q11[e] != 0.0 and tb != 0.0:
                        v += q11[e] * tb
                    g1[k1] += v


@_loop
def ternary_tan(r0, r1, r2, d0, d1, d2, i, entries, bufs, ipool, data, T):
    a = entries[i, E_IN0]
    b = entries[i, E_IN1]
    c = entries[i, E_IN2]
    x0 = view(bufs, data, a)
    x1 = view(bufs, data, b)
    x2 = view(bufs, data, c)
    y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    n = y.shape[0]
    if ipool[p] == SAME:
        o0 = o1 = o2 = np.arange(n)
    else:
        o0 = bcast_offsets(ipool, p, np.int64(0))
        o1 = bcast_offsets(ipool, p, np.int64(1))
        o2 = bcast_offsets(ipool, p, np.int64(2))
    for d in range(T.shape[0]):
        t0 = view(bufs, T[d], a)
        t1 = view(bufs, T[d], b)
        t2 = view(bufs, T[d], c)
        ty = view(bufs, T[d], entries[i, E_OUT])
        for j in range(n):
            u, v, w = x0[o0[j]], x1[o1[j]], x2[o2[j]]
            acc = 0.0
            if d0:
                acc += masked(r0(u, v, w, y[j], t0[o0[j]]), t0[o0[j]])
            if d1:
                acc += masked(r1(u, v, w, y[j], t1[o1[j]]), t1[o1[j]])
            if d2:
                acc += masked(r2(u, v, w, y[j], t2[o2[j]]), t2[o2[j]])
            ty[j] = acc


@_loop
def ternary_hrev(r0, r1, r2, d0, d1, d2, i, entries, bufs, ipool, data, GT):
    # ternary ops are piecewise linear: their reverse loop on the tangent adjoints
    for d in range(GT.shape[0]):
        ternary_rev(r0, r1, r2, d0, d1, d2, i, entries, bufs, ipool, data, GT[d])


@_jit
def no_h2(x0, y):
    return 0.0


@_jit
def no_h3(x0, x1, y):
    return 0.0
