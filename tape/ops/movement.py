"""Movement: strided copies (transpose, broadcast_to, strided slicing, concatenate, stack) and
integer-array gathers.

Reshape, squeeze, unsqueeze, flatten and contiguous slices are not here: they are aliases of
their input's memory (:func:`tape.frontend.tensor.view`) and cost no entry at all. The front ends
(transpose, indexing, concatenate, take) are in :mod:`tape.frontend.ops.movement`.

``copy`` attribute block: ``[nd, shape[nd], in_off, in_strides[nd], out_off, out_strides[nd]]``.
Element ``idx`` of ``shape`` is read at ``in_off + idx . in_strides`` of the input and written
at ``out_off + idx . out_strides`` of the output. Broadcasting is a zero input stride (the
reverse then sums), transposition is permuted strides, ``x[::-2]`` a negative one, and each
part of a concatenation is one ``copy`` entry writing its own region of a shared output.

``take`` attribute block: ``[n_rows, inner]``: the input is viewed as ``(n_rows, inner)`` and
output row ``j`` is input row ``index[j]`` (negative indices count from the end). Indices are
data, so the kernel checks them before it touches memory and stops the sweep on a bad one.
"""

import numpy as np
from numba import njit

from tape.layout.columns import B_OFF, E_ATTR, E_IN0, E_IN1, E_OP, E_OUT
from tape.layout.config import UNCACHED_JIT
from tape.ops import registry, validate
from tape.ops.loops import active, strided_offsets, view

_jit = njit(**UNCACHED_JIT)


@_jit
def _copy_offsets(ipool, p):
    nd = ipool[p]
    src = strided_offsets(ipool, p + 1, p + 2 + nd, nd, ipool[p + 1 + nd])
    dst = strided_offsets(ipool, p + 1, p + 3 + 2 * nd, nd, ipool[p + 2 + 2 * nd])
    return src, dst


@_jit
def copy_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    src, dst = _copy_offsets(ipool, entries[i, E_ATTR])
    for j in range(src.shape[0]):
        y[dst[j]] = x[src[j]]
    return -1


@_jit
def copy_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, entries[i, E_OUT])
    src, dst = _copy_offsets(ipool, entries[i, E_ATTR])
    for j in range(src.shape[0]):
        gx[src[j]] += gy[dst[j]]


@_jit
def take_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    idx = view(bufs, data, entries[i, E_IN1])
    y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    n_rows = ipool[p]
    inner = ipool[p + 1]
    for j in range(idx.shape[0]):
        v = idx[j]
        # the range first: int() of NaN, inf or a huge float is undefined behaviour
        if not (v >= -n_rows and v < n_rows):
            return i
        if int(v) != v:
            return i
    for j in range(idx.shape[0]):
        r = int(idx[j])
        if r < 0:
            r += n_rows
        y[j * inner : (j + 1) * inner] = x[r * inner : (r + 1) * inner]
    return -1


@_jit
def take_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    idx = view(bufs, data, entries[i, E_IN1])
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    n_rows = ipool[p]
    inner = ipool[p + 1]
    for j in range(idx.shape[0]):
        r = int(idx[j])
        if r < 0:
            r += n_rows
        for t in range(inner):
            gx[r * inner + t] += gy[j * inner + t]


@_jit
def take_jvp(i, entries, bufs, ipool, data, T):
    # the forward gather on tangents, with the indices read from the values (the forward
    # kernel checked them)
    idx = view(bufs, data, entries[i, E_IN1])
    p = entries[i, E_ATTR]
    n_rows = ipool[p]
    inner = ipool[p + 1]
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], entries[i, E_IN0])
        ty = view(bufs, T[d], entries[i, E_OUT])
        for j in range(idx.shape[0]):
            r = int(idx[j])
            if r < 0:
                r += n_rows
            ty[j * inner : (j + 1) * inner] = tx[r * inner : (r + 1) * inner]


def _copy_elems(t, i):
    p = int(t.entries[i, E_ATTR])
    ints = [int(v) for v in t.ipool[p : p + 1 + 3 * int(t.ipool[p]) + 2]]
    nd = ints[0]
    shape = ints[1 : 1 + nd]
    in_off, in_st = ints[1 + nd], np.asarray(ints[2 + nd : 2 + 2 * nd], np.int64)
    out_off, out_st = ints[2 + 2 * nd], np.asarray(ints[3 + 2 * nd : 3 + 3 * nd], np.int64)
    idx = np.indices(shape).reshape(nd, -1) if nd else np.zeros((0, 1), np.int64)
    return out_off + out_st @ idx, in_off + in_st @ idx


def copy_sparsity(t, i, data):
    """Each copied element depends on the element it was read from; no second partials."""
    dst, src = _copy_elems(t, i)
    return [(0, dst, src)], []


def take_sparsity(t, i, data):
    """Output row ``j`` depends on input row ``index[j]`` (the indices in the value arena
    ``data``: a pattern holds for these indices only)."""
    p = int(t.entries[i, E_ATTR])
    n_rows, inner = int(t.ipool[p]), int(t.ipool[p + 1])
    idx = t.view(data, int(t.entries[i, E_IN1])).ravel().astype(np.int64) % max(n_rows, 1)
    j = np.arange(idx.shape[0] * inner)
    return [(0, j, idx[j // inner] * inner + j % inner)], []


def check_copy(t, i, e):
    """Validation of a ``copy`` entry: element ``idx`` of ``shape`` moves from input offset
    ``in_off + idx . in_strides`` to output offset ``out_off + idx . out_strides``; a copy
    writes distinct output elements, so no more than the output holds."""
    x, y = e[E_IN0], e[E_OUT]
    (nd,) = validate.block(t, i, 0, 1, "the number of axes")
    validate.count(t, i, nd, "the number of axes")
    ints = validate.block(t, i, 1, 3 * nd + 2, f"a shape, 2 offsets and 2 x {nd} strides")
    ds = ints[:nd]
    in_off, in_st = ints[nd], ints[nd + 1 : 2 * nd + 1]
    out_off, out_st = ints[2 * nd + 1], ints[2 * nd + 2 :]
    n = validate.dims(t, i, ds, "the copied shape")
    if n > validate.size(t, y):
        validate.fail(
            t, i, f"copies {n} elements into an output (buffer {y}) of {validate.size(t, y)}"
        )
    validate.inside(t, i, "the input", x, validate.span(ds, in_st, in_off))
    validate.inside(t, i, "the output", y, validate.span(ds, out_st, out_off))


def check_take(t, i, e):
    """Validation of a ``take`` entry: the input is ``n_rows`` rows of ``inner``, the output
    one row per index. The forward kernel checks the indices it reads; the reverse kernel
    reads them again unchecked, so they must be the values the forward checked (no later
    entry may write them) and, since a reverse sweep may run on the arena as loaded, the
    saved values must be in range too."""
    x, idx, y = e[E_IN0], e[E_IN1], e[E_OUT]
    n_rows, inner = validate.block(t, i, 0, 2, "n_rows and inner")
    validate.count(t, i, n_rows, "n_rows", hi=1 << 62)
    validate.count(t, i, inner, "inner", hi=1 << 62)
    validate.equal_sizes(
        t, i, "input 0", x, n_rows * inner, f"it is read as {n_rows} rows of {inner}"
    )
    n_idx = validate.size(t, idx)
    validate.equal_sizes(t, i, "the output", y, n_idx * inner, f"{n_idx} indices, rows of {inner}")
    j = validate.later_writer(t, i, idx)
    if j >= 0:
        validate.fail(
            t, i,
            f"entry {j} writes the memory of its index buffer {idx} after the indices are "
            "checked (the reverse sweep reads them unchecked)",
        )  # fmt: skip
    off = int(t.bufs[idx, B_OFF])
    v = t.data[off : off + n_idx]
    with np.errstate(invalid="ignore"):
        ok = (v == np.floor(v)) & (v >= -n_rows) & (v < n_rows)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        validate.fail(
            t, i, f"index {v[k]:g} (element {k} of buffer {idx}) is out of range for {n_rows} rows"
        )  # fmt: skip


def take_failure(t, i, read, at):
    """Why a ``take`` (or ``scatter_add``) entry stopped the sweep: the first index out of
    range (or not an integer), as the kernel checks them."""
    rows = int(t.ipool[t.entries[i, E_ATTR]])
    idx = np.asarray(read(int(t.entries[i, E_IN1]))).ravel()
    bad = [v for v in idx if not -rows <= v < rows or v != int(v)]
    if not bad:
        return None
    name = registry.OPS[int(t.entries[i, E_OP])].name
    return (
        f"entry {i} ({name}){at}: index {bad[0]:g} is out of bounds for an axis of size {rows} "
        "(indices are checked at every replay)"
    )


COPY = registry.structural(
    "copy", copy_fwd, copy_rev, module=__name__, n_inputs=1, differentiable=(True,),
    check=check_copy, gpu="copy", jvp=registry.LINEAR, hvp=registry.LINEAR,
    sparsity=copy_sparsity,
    may_stop=False,
)  # fmt: skip
TAKE = registry.structural(
    "take", take_fwd, take_rev, module=__name__, n_inputs=2, differentiable=(True, False),
    check=check_take, gpu="take", method=True, describe_failure=take_failure, jvp=take_jvp,
    hvp=registry.LINEAR, sparsity=take_sparsity,
)  # fmt: skip


# ---------------------------------------------------------------- attribute blocks


def c_strides(shape):
    """C-order strides (in elements) of ``shape``."""
    out = []
    acc = 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def copy_block(shape, in_off, in_strides, out_off, out_strides):
    """The ``copy`` attribute block (see the module docstring)."""
    return [len(shape), *shape, in_off, *in_strides, out_off, *out_strides]
