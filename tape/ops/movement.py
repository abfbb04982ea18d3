"""Movement: strided copies (transpose, broadcast_to, strided slicing, concatenate, stack) and
integer-array gathers.

Reshape, squeeze, unsqueeze, flatten and contiguous slices are not here: they are aliases of
their input's memory (:func:`tape.frontend.tensor.view`) and cost no entry at all. The front ends
(transpose, indexing, concatenate, take) are in :mod:`tape.frontend.ops.movement`.

``copy`` attribute block (:mod:`tape.ops.blocks.copy`): element ``idx`` of a shape is read
at ``in_off + idx . in_strides`` of the input and written at ``out_off + idx . out_strides``
of the output. Broadcasting is a zero input stride (the reverse then sums), transposition is
permuted strides, ``x[::-2]`` a negative one, and each part of a concatenation is one ``copy``
entry writing its own region of a shared output.

``take`` attribute block (:mod:`tape.ops.blocks.rows`): the input is viewed as
``(n_rows, inner)`` and output row ``j`` is input row ``index[j]`` (negative indices count
from the end). Indices are data, so the kernel checks them before it touches memory and stops
the sweep on a bad one.
"""

import numpy as np
from numba import njit

from tape.layout.calls import compiled_only
from tape.layout.columns import B_OFF, E_ATTR, E_IN0, E_IN1, E_OP, E_OUT
from tape.layout.config import UNCACHED_JIT
from tape.ops import registry, validate
from tape.ops.blocks import copy as copy_block_codec
from tape.ops.blocks import rows as rows_block
from tape.ops.loops import active, strided_offsets, view

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)
# the blocks' positions, as the GPU kernels compile them too (inlined in Numba IR: see
# tape.ops.loops)
_position = njit(inline="always", **UNCACHED_JIT)
_c_ndim_at = _position(copy_block_codec.ndim_at)
_c_dims_at = _position(copy_block_codec.dims_at)
_c_in_off_at = _position(copy_block_codec.in_off_at)
_c_in_strides_at = _position(copy_block_codec.in_strides_at)
_c_out_off_at = _position(copy_block_codec.out_off_at)
_c_out_strides_at = _position(copy_block_codec.out_strides_at)
n_rows_at = _position(rows_block.n_rows_at)
inner_at = _position(rows_block.inner_at)


@_jit
def _copy_offsets(ipool, p):
    nd = ipool[_c_ndim_at(p)]
    d = _c_dims_at(p)
    src = strided_offsets(ipool, d, _c_in_strides_at(p, nd), nd, ipool[_c_in_off_at(p, nd)])
    dst = strided_offsets(ipool, d, _c_out_strides_at(p, nd), nd, ipool[_c_out_off_at(p, nd)])
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
    n_rows = ipool[n_rows_at(p)]
    inner = ipool[inner_at(p)]
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
        for k in range(inner):  # (a loop: Numba's slice assignment compiles in 2-3 s)
            y[j * inner + k] = x[r * inner + k]
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
    n_rows = ipool[n_rows_at(p)]
    inner = ipool[inner_at(p)]
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
    n_rows = ipool[n_rows_at(p)]
    inner = ipool[inner_at(p)]
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], entries[i, E_IN0])
        ty = view(bufs, T[d], entries[i, E_OUT])
        for j in range(idx.shape[0]):
            r = int(idx[j])
            if r < 0:
                r += n_rows
            for k in range(inner):
                ty[j * inner + k] = tx[r * inner + k]


def _copy_elems(t, i):
    shape, in_off, in_st, out_off, out_st = copy_block_codec.decode(
        t.ipool, int(t.entries[i, E_ATTR])
    )
    nd = len(shape)
    in_st, out_st = np.asarray(in_st, np.int64), np.asarray(out_st, np.int64)
    idx = np.indices(shape).reshape(nd, -1) if nd else np.zeros((0, 1), np.int64)
    return out_off + out_st @ idx, in_off + in_st @ idx


def copy_sparsity(t, i, data):
    """Each copied element depends on the element it was read from; no second partials."""
    dst, src = _copy_elems(t, i)
    return [(0, dst, src)], []


def take_sparsity(t, i, data):
    """Output row ``j`` depends on input row ``index[j]`` (the indices in the value arena
    ``data``: a pattern holds for these indices only)."""
    n_rows, inner = rows_block.decode(t.ipool, int(t.entries[i, E_ATTR]))
    idx = t.view(data, int(t.entries[i, E_IN1])).ravel().astype(np.int64) % max(n_rows, 1)
    j = np.arange(idx.shape[0] * inner)
    return [(0, j, idx[j // inner] * inner + j % inner)], []


def check_copy(t, i, e):
    """Validation of a ``copy`` entry: element ``idx`` of ``shape`` moves from input offset
    ``in_off + idx . in_strides`` to output offset ``out_off + idx . out_strides``; a copy
    writes distinct output elements, so no more than the output holds."""
    x, y = e[E_IN0], e[E_OUT]
    (nd,) = validate.block(t, i, copy_block_codec.ndim_at(0), 1, "the number of axes")
    validate.count(t, i, nd, "the number of axes")
    validate.block(t, i, 0, copy_block_codec.size(nd), f"a shape, 2 offsets and 2 x {nd} strides")
    ds, in_off, in_st, out_off, out_st = copy_block_codec.decode(t.ipool, int(e[E_ATTR]))
    ds = list(ds)
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
    validate.block(t, i, 0, rows_block.SIZE, "n_rows and inner")
    n_rows, inner = rows_block.decode(t.ipool, int(e[E_ATTR]))
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
    rows = rows_block.decode(t.ipool, int(t.entries[i, E_ATTR])).n_rows
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
