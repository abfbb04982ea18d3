"""Reductions over any set of axes: ``sum``, ``max``, ``min``, ``prod``.

Attribute block: ``[nd, in_shape[nd], out_strides[nd]]`` (:mod:`tape.ops.blocks.reduce`):
input element ``j`` adds into output element ``offsets[j]``. ``mean``, ``var``, ``std``, ``norm`` and
``logsumexp`` are built from these in :mod:`tape.functional`.
"""

import numpy as np
from numba import njit

from tape.layout.calls import compiled_only
from tape.layout.columns import ALL, E_ATTR, E_IN0, E_OUT
from tape.layout.config import UNCACHED_JIT
from tape.ops import registry, validate
from tape.ops.blocks import reduce as block
from tape.ops.loops import active, span, strided_offsets, total, view

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)
# the block's positions, as the GPU kernels compile them too (inlined in Numba IR: see
# tape.ops.loops)
_position = njit(inline="always", **UNCACHED_JIT)
ndim_at = _position(block.ndim_at)
dims_at = _position(block.dims_at)
row_length_at = _position(block.row_length_at)
strides_at = _position(block.strides_at)
inner_stride_at = _position(block.inner_stride_at)


@_jit
def _out_offsets(ipool, p):
    nd = ipool[ndim_at(p)]
    return strided_offsets(ipool, dims_at(p), strides_at(p, nd), nd, np.int64(0))


@_jit
def _rows(ipool, p):
    """The input as rows of its innermost axis: ``(row length, output stride along the row
    (1: kept axis, 0: reduced), output offset of each row's start)``."""
    nd = ipool[ndim_at(p)]
    m = ipool[row_length_at(p, nd)] if nd else 1
    inner = ipool[inner_stride_at(p, nd)] if nd else 0
    starts = strided_offsets(ipool, dims_at(p), strides_at(p, nd), nd - 1 if nd else 0, np.int64(0))
    return m, inner, starts


@_jit
def sum_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    if y.shape[0] == 1:
        y[0] = total(x)
        return -1
    m, inner, starts = _rows(ipool, entries[i, E_ATTR])
    y[:] = 0.0
    for r in range(starts.shape[0]):
        xr = span(x, r * m, m)
        b = starts[r]
        if inner == 1:
            yr = span(y, b, m)
            for j in range(m):
                yr[j] += xr[j]
        elif inner == 0:
            y[b] += total(xr)
        else:
            for j in range(m):
                y[b + j * inner] += xr[j]
    return -1


@_jit
def sum_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, entries[i, E_OUT])
    if gy.shape[0] == 1:
        g = gy[0]
        for j in range(gx.shape[0]):
            gx[j] += g
        return
    m, inner, starts = _rows(ipool, entries[i, E_ATTR])
    for r in range(starts.shape[0]):
        gxr = span(gx, r * m, m)
        b = starts[r]
        if inner == 1:
            gyr = span(gy, b, m)
            for j in range(m):
                gxr[j] += gyr[j]
        elif inner == 0:
            g = gy[b]
            for j in range(m):
                gxr[j] += g
        else:
            for j in range(m):
                gxr[j] += gy[b + j * inner]


@_jit
def sum_fwd_all(i, entries, bufs, ipool, data):
    """:func:`sum_fwd` of an entry whose output has one element: the total."""
    x = view(bufs, data, entries[i, E_IN0])
    view(bufs, data, entries[i, E_OUT])[0] = total(x)
    return -1


@_jit
def sum_rev_all(i, entries, bufs, ipool, data, grad):
    """:func:`sum_rev` of an entry whose output has one element."""
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    gx = view(bufs, grad, a)
    g = view(bufs, grad, entries[i, E_OUT])[0]
    for j in range(gx.shape[0]):
        gx[j] += g


@_jit
def _extreme_fwd(is_max, i, entries, bufs, ipool, data):
    # by rows of the innermost axis, as sum_fwd: a kept inner axis updates a row of the output
    # in one loop that vectorises (the select below has no branch)
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    y[:] = -np.inf if is_max else np.inf
    m, inner, starts = _rows(ipool, entries[i, E_ATTR])
    for r in range(starts.shape[0]):
        xr = span(x, r * m, m)
        b = starts[r]
        if inner == 1:
            yr = span(y, b, m)
            for j in range(m):
                yr[j] = _pick(is_max, yr[j], xr[j])
        elif inner == 0:
            c = y[b]
            for j in range(m):
                c = _pick(is_max, c, xr[j])
            y[b] = c
        else:
            for j in range(m):
                o = b + j * inner
                y[o] = _pick(is_max, y[o], xr[j])
    return -1


@njit(inline="always", **UNCACHED_JIT)
def _pick(is_max, cur, v):
    """The extremum so far after element ``v``: NaN from the first NaN on."""
    better = v > cur if is_max else v < cur
    return v if (v != v or better) else cur


@_jit
def _ties(x, y, off):
    """How many input elements equal their output element (the arg-extrema; ties count
    each)."""
    count = np.zeros(y.shape[0], np.int64)
    for j in range(x.shape[0]):
        if x[j] == y[off[j]]:
            count[off[j]] += 1
    return count


@_jit
def _extreme_rev(i, entries, bufs, ipool, data, grad):
    # The adjoint goes to the arg-extremum; ties share it evenly.
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    y = view(bufs, data, o)
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, o)
    off = _out_offsets(ipool, entries[i, E_ATTR])
    count = _ties(x, y, off)
    for j in range(x.shape[0]):
        k = off[j]
        if x[j] == y[k]:
            gx[j] += gy[k] / count[k]


@_jit
def max_fwd(i, entries, bufs, ipool, data):
    return _extreme_fwd(True, i, entries, bufs, ipool, data)


@_jit
def min_fwd(i, entries, bufs, ipool, data):
    return _extreme_fwd(False, i, entries, bufs, ipool, data)


@_jit
def max_rev(i, entries, bufs, ipool, data, grad):
    _extreme_rev(i, entries, bufs, ipool, data, grad)


@_jit
def min_rev(i, entries, bufs, ipool, data, grad):
    _extreme_rev(i, entries, bufs, ipool, data, grad)


@_jit
def prod_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    off = _out_offsets(ipool, entries[i, E_ATTR])
    y[:] = 1.0
    for j in range(x.shape[0]):
        y[off[j]] *= x[j]
    return -1


@_jit
def prod_rev(i, entries, bufs, ipool, data, grad):
    # d prod / d x_j is the product of the others: exact with zeros among them (no y / x_j).
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, o)
    off = _out_offsets(ipool, entries[i, E_ATTR])
    zeros, nz_prod, _, _ = _prod_groups(x, x, off, gy.shape[0])
    for j in range(x.shape[0]):
        k = off[j]
        if zeros[k] == 0 or (zeros[k] == 1 and x[j] == 0.0):
            gx[j] += gy[k] * _prod_others(zeros[k], nz_prod[k], x[j])


@_jit
def extreme_jvp(i, entries, bufs, ipool, data, T):
    # the tangent of the arg-extremum (ties: their mean), as the reverse shares the adjoint
    a = entries[i, E_IN0]
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    y = view(bufs, data, o)
    off = _out_offsets(ipool, entries[i, E_ATTR])
    count = _ties(x, y, off)
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], a)
        ty = view(bufs, T[d], o)
        ty[:] = 0.0
        for j in range(x.shape[0]):
            if x[j] == y[off[j]]:
                ty[off[j]] += tx[j]
        for k in range(y.shape[0]):
            if count[k] > 1:
                ty[k] /= count[k]


@_jit
def _prod_groups(x, t, off, ny):
    """Per output element: the number of zero factors, the product of the others, the sum of
    ``t / x`` over the nonzero factors and the sum of ``t`` over the zero ones."""
    zeros = np.zeros(ny, np.int64)
    nz_prod = np.ones(ny, x.dtype)
    s_nz = np.zeros(ny, x.dtype)
    t_zero = np.zeros(ny, x.dtype)
    for j in range(x.shape[0]):
        k = off[j]
        if x[j] == 0.0:
            zeros[k] += 1
            t_zero[k] += t[j]
        else:
            nz_prod[k] *= x[j]
            s_nz[k] += t[j] / x[j]
    return zeros, nz_prod, s_nz, t_zero


@_jit
def _prod_others(zeros, nz_prod, xj):
    """The product of the other factors of one element (``xj`` its own)."""
    if zeros == 0:
        return nz_prod / xj
    if zeros == 1 and xj == 0.0:
        return nz_prod
    return 0.0


@_jit
def prod_jvp(i, entries, bufs, ipool, data, T):
    for d in range(T.shape[0]):
        _prod_jvp(i, entries, bufs, ipool, data, T[d])


@_jit
def prod_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    for d in range(T.shape[0]):
        _prod_hvp(i, entries, bufs, ipool, data, grad, T[d], GT[d])


@_jit
def _prod_jvp(i, entries, bufs, ipool, data, t):
    a = entries[i, E_IN0]
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    tx = view(bufs, t, a)
    ty = view(bufs, t, o)
    off = _out_offsets(ipool, entries[i, E_ATTR])
    zeros, nz_prod, _, _ = _prod_groups(x, tx, off, ty.shape[0])
    ty[:] = 0.0
    for j in range(x.shape[0]):
        k = off[j]
        ty[k] += tx[j] * _prod_others(zeros[k], nz_prod[k], x[j])


@_jit
def _prod_hvp(i, entries, bufs, ipool, data, grad, t, gt):
    # d/dx_j of gy * prod_{i != j} x_i along t: gt_y * P_-j + gy * sum_{i != j} t_i P_-ij,
    # exact with zero factors (no division by a zero x).
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    o = entries[i, E_OUT]
    x = view(bufs, data, a)
    tx = view(bufs, t, a)
    gtx = view(bufs, gt, a)
    gy = view(bufs, grad, o)
    gty = view(bufs, gt, o)
    off = _out_offsets(ipool, entries[i, E_ATTR])
    zeros, nz_prod, s_nz, t_zero = _prod_groups(x, tx, off, gy.shape[0])
    for j in range(x.shape[0]):
        k = off[j]
        z = zeros[k]
        xj = x[j]
        second = 0.0
        if z == 0:
            second = nz_prod[k] / xj * (s_nz[k] - tx[j] / xj)
        elif z == 1:
            second = nz_prod[k] * s_nz[k] if xj == 0.0 else t_zero[k] * nz_prod[k] / xj
        elif z == 2 and xj == 0.0:
            second = (t_zero[k] - tx[j]) * nz_prod[k]
        gtx[j] += gty[k] * _prod_others(z, nz_prod[k], xj) + gy[k] * second


def _py_out_offsets(t, i):
    """Output offset of every input element (the block decoded in NumPy)."""
    shape, strides = block.decode(t.ipool, int(t.entries[i, E_ATTR]))
    nd = len(shape)
    strides = np.asarray(strides, np.int64)
    if nd == 0:
        return np.zeros(1, np.int64)
    idx = np.indices(shape).reshape(nd, -1)
    return strides @ idx


def _sparsity(nonlinear):
    def sparsity(t, i, data):
        off = _py_out_offsets(t, i)
        elems = np.arange(off.shape[0])
        pairs = [(0, off, elems, 0, off, elems)] if nonlinear else []
        return [(0, off, elems)], pairs

    return sparsity


def check(t, i, e):
    """Validation of a reduction entry (see :func:`tape.ops.validate.check_tape`), read off the
    kernels above: input element ``idx`` (C order over ``in_shape``, so the input must hold
    exactly that many) goes to output offset ``idx . out_strides``; ``sum`` walks rows of the
    innermost axis and, when the output stride along them is 0, touches each row's output
    offset even if the rows are empty."""
    x, y = e[E_IN0], e[E_OUT]
    (nd,) = validate.block(t, i, block.ndim_at(0), 1, "the number of axes")
    validate.count(t, i, nd, "the number of axes")
    validate.block(t, i, block.dims_at(0), 2 * nd, f"{nd} input extents and {nd} output strides")
    ds, st = (list(v) for v in block.decode(t.ipool, int(e[E_ATTR])))  # inside: checked above
    n = validate.dims(t, i, ds, "the input shape")
    validate.equal_sizes(t, i, "the input", x, n, f"the block's input shape is {tuple(ds)}")
    validate.inside(t, i, "the output", y, validate.span(ds, st))
    if nd and st[-1] == 0:
        validate.inside(t, i, "the output", y, validate.span(ds[:-1], st[:-1]))


# jvp / hvp: sum is linear; max and min follow their selection (a tangent of their own,
# the reverse kernel on tangents for the second order); prod has both kernels.
LINEAR = registry.LINEAR
SUM, MAX, MIN, PROD = (
    registry.structural(
        name, f, r, module=__name__, n_inputs=1, differentiable=(True,), check=check, gpu=name,
        method=True, jvp=jvp, hvp=hvp, sparsity=_sparsity(name == "prod"), may_stop=False,
        classes=classes,
    )
    for name, f, r, jvp, hvp, classes in (
        ("sum", sum_fwd, sum_rev, LINEAR, LINEAR, ((ALL, sum_fwd_all, sum_rev_all),)),
        ("max", max_fwd, max_rev, extreme_jvp, LINEAR, ()),
        ("min", min_fwd, min_rev, extreme_jvp, LINEAR, ()),
        ("prod", prod_fwd, prod_rev, prod_jvp, prod_hvp, ()),
    )
)  # fmt: skip
