"""Front ends of the movement ops (:mod:`tape.ops.movement`): transpose, broadcast_to,
concatenate, stack, take and indexing (``x[key]``), each recording ``copy`` or ``take`` entries
(or none: contiguous results are free views).

The NumPy shape functions (flip, roll, tile, repeat, split, array_split, moveaxis, swapaxes, pad,
take_along_axis) are composites of the same entries, so they need no derivative rules of their
own."""

import itertools
import math
import operator

import numpy as np

from tape.frontend import tensor
from tape.ops.blocks import rows as rows_block
from tape.ops.blocks.copy import c_strides
from tape.ops.blocks.copy import encode as copy_block
from tape.ops.movement import COPY, TAKE


def strided(x, shape, offset, strides):
    """Copy of the strided view ``(shape, offset, strides)`` of ``x``'s memory (C order)."""
    shape = tuple(int(s) for s in shape)
    if _is_contiguous(shape, strides):
        return tensor.view(x, shape, offset)
    block = copy_block(shape, offset, strides, 0, c_strides(shape))
    out = tensor.apply(COPY, [x], shape, block)
    out._copied = True  # a copy where PyTorch has a view: in-place writes to it are refused
    return out


def _is_contiguous(shape, strides):
    expect = c_strides(shape)
    return all(n == 1 or s == e for n, s, e in zip(shape, strides, expect))


def transpose(x, axes=None, dim1=None, *, dim0=None):
    """Permute the axes of ``x``: ``transpose(x)`` reverses them and ``transpose(x, axes)``
    takes a permutation, as ``numpy.transpose``; ``transpose(x, dim0, dim1)`` (two ints, or
    ``dim0=`` / ``dim1=``) swaps two axes, as ``torch.transpose``."""
    x = tensor.as_tensor(x)
    if dim0 is not None:
        if axes is not None:
            raise TypeError("transpose: pass the first axis once, positionally or as dim0")
        axes = dim0
    if dim1 is not None or (axes is not None and not isinstance(axes, (tuple, list, np.ndarray))):
        if axes is None or dim1 is None:
            raise TypeError(
                "transpose: two axes to swap (transpose(x, dim0, dim1)) or one permutation "
                f"(transpose(x, axes)), got axes={axes!r}, dim1={dim1!r}"
            )
        return swapaxes(x, axes, dim1)
    nd = x.ndim
    if axes is None:
        axes = tuple(range(nd - 1, -1, -1))
    else:
        axes = tuple(int(a) % nd if nd else int(a) for a in axes)
        if sorted(axes) != list(range(nd)):
            raise ValueError(
                f"transpose: axes {axes} are not a permutation of a {nd}-D tensor's axes"
            )
    if axes == tuple(range(nd)):
        return x
    st = c_strides(x.shape)
    return strided(x, [x.shape[a] for a in axes], 0, [st[a] for a in axes])


def swapaxes(x, axis1, axis2):
    """Interchange two axes of ``x`` (``numpy.swapaxes``; negative axes count from the end).

    Parameters
    ----------
    x : Tensor or array_like
    axis1, axis2 : int

    Returns
    -------
    Tensor
    """
    x = tensor.as_tensor(x)
    a = _axis(axis1, x.ndim, "swapaxes")
    b = _axis(axis2, x.ndim, "swapaxes")
    axes = list(range(x.ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return transpose(x, axes)


def broadcast_to(x, shape):
    """Broadcast ``x`` to ``shape`` (NumPy rules); the gradient sums over the broadcast axes."""
    x = tensor.as_tensor(x)
    shape = tuple(int(s) for s in shape)
    if x.shape == shape:
        return x
    try:
        if np.broadcast_shapes(x.shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"broadcast_to: a tensor of shape {tuple(x.shape)} cannot be broadcast to {shape}"
        ) from None
    lead = len(shape) - x.ndim
    st = c_strides(x.shape)
    strides = [0] * lead + [
        0 if n == 1 and m != 1 else s for n, m, s in zip(x.shape, shape[lead:], st)
    ]
    block = copy_block(shape, 0, strides, 0, c_strides(shape))
    out = tensor.apply(COPY, [x], shape, block)
    out._copied = True  # a copy where PyTorch has a view: in-place writes to it are refused
    return out


def concatenate(tensors, axis=0, *, dim=None):
    """Join tensors along an existing axis (``numpy.concatenate``; ``torch.cat``)."""
    axis = axis if dim is None else dim
    ts = [tensor.as_tensor(t) for t in tensors]
    if not ts:
        raise ValueError("concatenate: need at least one tensor")
    nd = ts[0].ndim
    if nd == 0:
        raise ValueError("concatenate: zero-dimensional tensors cannot be concatenated; use stack")
    if not -nd <= axis < nd:
        raise ValueError(f"concatenate: axis {axis} is out of range for {nd}-D tensors")
    axis %= nd
    for t in ts:
        if t.ndim != nd or any(
            a != b for k, (a, b) in enumerate(zip(t.shape, ts[0].shape)) if k != axis
        ):
            raise ValueError(
                "concatenate: all shapes must match except along axis "
                f"{axis}; got {[t.shape for t in ts]}"
            )
    out_shape = list(ts[0].shape)
    out_shape[axis] = sum(t.shape[axis] for t in ts)
    out_shape = tuple(out_shape)
    ost = c_strides(out_shape)
    parts = []
    start = 0
    for k, t in enumerate(ts):
        parts.append(([k], copy_block(t.shape, 0, c_strides(t.shape), start * ost[axis], ost)))
        start += t.shape[axis]
    return tensor.apply(COPY, ts, out_shape, parts=parts)


def stack(tensors, axis=0, *, dim=None):
    """Join tensors along a new axis (``numpy.stack``)."""
    axis = axis if dim is None else dim
    ts = [tensor.as_tensor(t) for t in tensors]
    if not ts:
        raise ValueError("stack: need at least one tensor")
    if any(t.shape != ts[0].shape for t in ts):
        raise ValueError(
            f"stack: all tensors must have the same shape; got {[t.shape for t in ts]}"
        )
    nd = ts[0].ndim + 1
    if not -nd <= axis < nd:
        raise ValueError(f"stack: axis {axis} is out of range for the {nd}-D result")
    axis %= nd
    return concatenate([tensor.unsqueeze(t, axis) for t in ts], axis)


def take(x, index, axis=0):
    """Gather along ``axis`` with an integer index array (``numpy.take``); the reverse is a
    scatter-add, so repeated indices accumulate."""
    x = tensor.as_tensor(x)
    if x.ndim == 0:
        raise IndexError("take: cannot index a zero-dimensional tensor")
    axis = _axis(axis, x.ndim, "take")
    idx = _index_tensor(index, x.shape[axis], axis)
    moved = x if axis == 0 else transpose(x, [axis] + [a for a in range(x.ndim) if a != axis])
    rest = moved.shape[1:]
    inner = int(np.prod(rest, dtype=np.int64))
    flat_idx = tensor.view(idx, (idx.numel(),), 0)
    rows = tensor.view(moved, (moved.shape[0], inner), 0)
    out = tensor.apply(
        TAKE, [rows, flat_idx], (idx.numel(), inner), rows_block.encode(moved.shape[0], inner)
    )
    out = tensor.view(out, idx.shape + rest, 0)
    if axis == 0:
        return out
    k = idx.ndim
    perm = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, k + len(rest)))
    return transpose(out, perm)


def _axis(axis, nd, op):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: an axis must be an int, got {axis!r}")
    if not -nd <= axis < nd:
        raise ValueError(f"{op}: axis {axis} is out of range for a {nd}-D tensor")
    return int(axis) % nd


def _index_tensor(index, n, axis):
    """The index as a tensor, checked now against an axis of size ``n`` (and again by the
    kernel at every replay, since a traced index is data)."""
    if isinstance(index, tensor.Tensor):
        if index.dtype.kind not in "iu":
            raise IndexError(f"tensors used as indices must be integer tensors, got {index.dtype}")
        vals = index._peek()  # a check now, not an escape: the kernel checks at every replay
        idx = index
    else:
        vals = np.asarray(index)
        if vals.dtype == object or (vals.size and vals.dtype.kind not in "iu"):
            raise IndexError(f"arrays used as indices must be of integer type, got {vals.dtype}")
        vals = vals.astype(np.int64)
        idx = tensor.tensor(vals)
    bad = (vals < -n) | (vals >= n)
    if bad.any():
        raise IndexError(
            f"index {int(vals[bad].flat[0])} is out of bounds for axis {axis} with size {n}"
        )
    return idx


def getitem(x, key):
    """``x[key]``: ints, slices (any step), ``None``, ``...``, and one integer-array (or boolean
    mask) index; a tuple of integer arrays on the leading axes indexes those axes jointly."""
    if not isinstance(key, tuple):
        key = (key,)
    key = tuple(_as_index(k) for k in key)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 if not (k is None or k is Ellipsis) else 0 for k in key)
    n_real += sum(k.ndim - 1 for k in key if _is_bool_array(k))
    if n_real > x.ndim:
        raise IndexError(f"too many indices for a tensor of dimension {x.ndim}: {key!r}")
    if n_ell:
        e = key.index(Ellipsis)
        key = key[:e] + (slice(None),) * (x.ndim - n_real) + key[e + 1 :]
    else:
        key = key + (slice(None),) * (x.ndim - n_real)
    # boolean masks become integer arrays (their shape decides the result's, so they are constant)
    expanded = []
    for k in key:
        if _is_bool_array(k):
            expanded.extend(np.nonzero(k.numpy() if isinstance(k, tensor.Tensor) else k))
        else:
            expanded.append(k)
    key = tuple(expanded)
    arrays = [j for j, k in enumerate(key) if _is_array(k)]
    if not arrays:
        return _basic(x, key)
    if len(arrays) == 1:
        j = arrays[0]
        basic_key = key[:j] + (slice(None),) + key[j + 1 :]
        axis = sum(1 for k in key[:j] if not isinstance(k, (int, np.integer)))
        return take(_basic(x, basic_key), key[j], axis)
    if arrays != list(range(len(arrays))):
        raise IndexError(
            "several integer-array indices are supported only on the leading axes, together "
            f"(x[i, j, ...]); got arrays at positions {arrays}"
        )
    # x[i, j, ...] with constant index arrays: index the flattened leading axes with the
    # raveled multi-index. (Traced index tensors are supported one at a time: a per-axis
    # negative index could otherwise land in bounds of the flattened axis, silently wrong.)
    lead = tuple(x.shape[a] for a in arrays)
    vals = []
    for a in arrays:
        k = key[a]
        if isinstance(k, tensor.Tensor) and k._tape is not None:
            raise IndexError(
                "several integer-array indices must be constant (NumPy arrays or tensors that "
                "do not depend on the tape's inputs); index one axis at a time instead"
            )
        vals.append(_index_tensor(k, x.shape[a], a).numpy())
    try:
        vals = np.broadcast_arrays(*vals)
    except ValueError:
        raise IndexError(
            f"shape mismatch: index arrays of shapes {[v.shape for v in vals]} do not broadcast"
        ) from None
    flat = np.ravel_multi_index(tuple(v % n for v, n in zip(vals, lead)), lead)
    merged = tensor.view(x, (int(np.prod(lead)),) + x.shape[len(arrays) :], 0)
    return getitem(take(merged, flat, 0), (slice(None),) * flat.ndim + key[len(arrays) :])


def _as_index(k):
    if isinstance(k, (list, tuple)):
        return np.asarray(k)
    if isinstance(k, tensor.Tensor) and k.ndim == 0 and k.dtype.kind in "iu" and k._tape is None:
        return int(k.item())
    if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
        return int(k)
    if (
        k is None
        or k is Ellipsis
        or isinstance(k, (slice, int, np.integer, np.ndarray, tensor.Tensor))
    ):
        if isinstance(k, bool):
            raise IndexError("boolean scalars are not supported as indices")
        return k
    raise IndexError(
        f"only integers, slices, None, Ellipsis and integer or boolean arrays are valid indices, got {k!r}"
    )


def _is_array(k):
    return isinstance(k, (np.ndarray, tensor.Tensor))


def _is_bool_array(k):
    return _is_array(k) and k.dtype == np.bool_


def _basic(x, key):
    """Ints, slices and None: a strided view of ``x``, materialised only if not contiguous."""
    st = c_strides(x.shape)
    shape, strides = [], []
    offset = 0
    dim = 0
    for k in key:
        if k is None:
            shape.append(1)
            strides.append(0)
            continue
        n = x.shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            m = len(range(start, stop, step))
            shape.append(m)
            strides.append(st[dim] * step)
            if m:
                offset += start * st[dim]
        else:
            i = operator.index(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
            offset += (i % n) * st[dim]
        dim += 1
    if (
        tuple(shape) == x.shape
        and offset == 0
        and all(s == e for s, e, m in zip(strides, st, shape) if m != 1)
    ):
        return x
    return strided(x, shape, offset, strides)


# ---------------------------------------------------------------- NumPy shape functions
# Composites of ``copy`` and ``take`` entries (and free views): their derivatives, sparsity
# and GPU kernels are those of the entries they record.


def _axes(op, axis, nd):
    """``axis`` (an int or a sequence of ints) as a tuple of non-negative ints, checked."""
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = tuple(_axis(a, nd, op) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axis in {axis!r}")
    return out


def _int(op, what, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{op}: {what} must be an int, got {v!r}")
    return int(v)


def _ints(op, what, v):
    """``v`` (an int or a sequence of ints) as a tuple of ints."""
    if isinstance(v, tensor.Tensor):
        if v._tape is not None:
            raise TypeError(f"{op}: {what} decide the result's shape, so they must be constant")
        v = v.numpy()
    if isinstance(v, np.ndarray):
        if v.ndim > 1 or (v.size and v.dtype.kind not in "iu"):
            raise TypeError(f"{op}: {what} must be an int or a sequence of ints, got {v!r}")
        v = v.tolist()
    seq = (v,) if isinstance(v, (int, np.integer)) else v
    try:
        return tuple(_int(op, what, s) for s in seq)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an int or a sequence of ints, got {v!r}") from None


def _pick(op, a, a_name, b, b_name):
    """NumPy's argument ``a`` or PyTorch's spelling ``b`` of it, not both."""
    if b is None:
        return a
    if a is not None:
        raise TypeError(f"{op}: pass {a_name}= or {b_name}=, not both")
    return b


def _blocks(inputs, shape, blocks):
    """One output of ``shape`` written by one ``copy`` entry per block. ``blocks`` lists
    ``(input_position, block_shape, in_offset, in_strides, out_start)``; together they must
    write every output element (no entry relies on untouched output memory)."""
    shape = tuple(int(s) for s in shape)
    ost = c_strides(shape)
    parts = []
    for k, bshape, in_off, in_st, start in blocks:
        if math.prod(bshape):
            out_off = sum(s * o for s, o in zip(start, ost))
            parts.append(([k], copy_block(bshape, in_off, in_st, out_off, ost)))
    if not parts:  # an empty result (the blocks cover the output)
        return tensor.view(inputs[0], shape, 0)
    return tensor.apply(COPY, inputs, shape, parts=parts)


def flip(x, axis=None, *, dims=None):
    """Reverse the order of elements along ``axis`` (``numpy.flip``; ``torch.flip``'s ``dims=``).

    Parameters
    ----------
    x : Tensor or array_like
    axis : None, int or tuple of ints
        The axes to reverse; None reverses all of them.

    Returns
    -------
    Tensor
        A strided copy of ``x`` (one ``copy`` entry).
    """
    x = tensor.as_tensor(x)
    axis = _pick("flip", axis, "axis", dims, "dims")
    axes = range(x.ndim) if axis is None else _axes("flip", axis, x.ndim)
    st = list(c_strides(x.shape))
    offset = 0
    for a in axes:
        n = x.shape[a]
        if n > 1:
            offset += (n - 1) * st[a]
            st[a] = -st[a]
    if offset == 0:
        return x
    return strided(x, x.shape, offset, st)


def torch_flip(x, *dims):
    """PyTorch's ``x.flip(dims)`` (``dims`` a sequence or several ints)."""
    if len(dims) == 1 and not isinstance(dims[0], (int, np.integer)):
        dims = dims[0]
    if not dims:
        raise TypeError("flip() missing the dims to flip")
    return flip(x, tuple(dims))


def roll(x, shift=None, axis=None, *, shifts=None, dims=None):
    """Roll elements along ``axis`` by ``shift`` places, those falling off one end coming back
    at the other (``numpy.roll``; ``torch.roll``'s ``shifts=`` and ``dims=``).

    Parameters
    ----------
    x : Tensor or array_like
    shift : int or tuple of ints
        Places to roll (negative: towards the start); one per axis, or one for all.
    axis : None, int or tuple of ints
        None rolls the flattened tensor and restores the shape.

    Returns
    -------
    Tensor
        A copy of ``x``: one ``copy`` entry per contiguous block moved (up to ``2**len(axis)``).
    """
    x = tensor.as_tensor(x)
    shift = _pick("roll", shift, "shift", shifts, "shifts")
    axis = _pick("roll", axis, "axis", dims, "dims")
    if shift is None:
        raise TypeError("roll: missing the shift")
    if axis is None:
        flat = tensor.view(x, (x.numel(),), 0)
        return tensor.view(roll(flat, shift, 0), x.shape, 0)
    sh = _ints("roll", "shift", shift)
    ax = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if len(sh) != len(ax) and 1 not in (len(sh), len(ax)):
        raise ValueError(
            f"roll: shift {shift!r} and axis {axis!r} must have the same length (or one be an int)"
        )
    total = [0] * x.ndim
    for s, a in zip(sh * len(ax) if len(sh) == 1 else sh, ax * len(sh) if len(ax) == 1 else ax):
        total[_axis(a, x.ndim, "roll")] += s
    total = [s % n if n else 0 for s, n in zip(total, x.shape)]
    if not any(total):
        return x
    # along each axis, at most two segments: (out_start, in_start, length)
    segs = [
        [(0, 0, n)] if s == 0 else [(0, n - s, s), (s, 0, n - s)] for s, n in zip(total, x.shape)
    ]
    st = c_strides(x.shape)
    blocks = []
    for combo in itertools.product(*segs):
        blocks.append(
            (
                0,
                [c[2] for c in combo],
                sum(c[1] * s for c, s in zip(combo, st)),
                st,
                [c[0] for c in combo],
            )
        )
    return _blocks([x], x.shape, blocks)


def tile(x, reps):
    """Repeat the whole of ``x`` ``reps`` times along each axis (``numpy.tile``; PyTorch's
    ``x.repeat(*sizes)`` and ``x.tile``).

    Parameters
    ----------
    x : Tensor or array_like
    reps : int or tuple of ints
        Repetitions per axis; the shorter of ``reps`` and ``x.shape`` is padded with leading 1s.

    Returns
    -------
    Tensor
        One strided ``copy`` entry (zero strides over the repetitions).
    """
    x = tensor.as_tensor(x)
    reps = _ints("tile", "reps", reps)
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: reps must be non-negative, got {reps}")
    d = max(len(reps), x.ndim)
    shape = (1,) * (d - x.ndim) + x.shape
    reps = (1,) * (d - len(reps)) + reps
    if all(r == 1 for r in reps):
        return tensor.view(x, shape, 0)
    st = c_strides(shape)
    big, strides = [], []
    for r, n, s in zip(reps, shape, st):
        big += [r, n]
        strides += [0, s]
    out = strided(x, big, 0, strides)
    return tensor.view(out, tuple(r * n for r, n in zip(reps, shape)), 0)


def torch_repeat(x, *sizes):
    """PyTorch's ``x.repeat(*sizes)``: NumPy's :func:`tile` (not :func:`repeat`), with at
    least as many sizes as ``x`` has dimensions."""
    if len(sizes) == 1 and not isinstance(sizes[0], (int, np.integer)):
        sizes = tuple(sizes[0])
    if len(sizes) < x.ndim:
        raise ValueError(
            f"repeat: the number of repeat sizes ({len(sizes)}) can not be smaller than the "
            f"number of dimensions of the tensor (shape {tuple(x.shape)}); for NumPy's repeat use "
            "tape.repeat or x.repeat_interleave"
        )
    return tile(x, sizes)


def repeat(x, repeats, axis=None):
    """Repeat each element of ``x`` (``numpy.repeat``; ``torch.repeat_interleave``).

    Parameters
    ----------
    x : Tensor or array_like
    repeats : int or 1-D array of ints
        Repetitions of each element (or of each slice along ``axis``); an array gives one
        count per element. Constant: they decide the result's shape.
    axis : int, optional
        None repeats the elements of the flattened tensor.

    Returns
    -------
    Tensor
        One strided ``copy`` entry for an int, one ``take`` for an array of counts.
    """
    x = tensor.as_tensor(x)
    if axis is None:
        x = tensor.view(x, (x.numel(),), 0)
        axis = 0
    else:
        axis = _axis(axis, x.ndim, "repeat")
    if isinstance(repeats, tensor.Tensor):
        if repeats._tape is not None:
            raise TypeError(
                "repeat: the repeats decide the result's shape, so they must be constant"
            )
        repeats = repeats.numpy()
    r = np.asarray(repeats)
    if r.dtype == object or (r.size and r.dtype.kind not in "iu"):
        raise TypeError(f"repeat: repeats must be ints, got {repeats!r}")
    if (r < 0).any():
        raise ValueError(f"repeat: repeats must be non-negative, got {repeats!r}")
    n = x.shape[axis]
    if r.ndim > 1 or (r.ndim == 1 and r.size not in (1, n)):
        raise ValueError(
            f"repeat: repeats of shape {tuple(r.shape)} do not match axis {axis} (of size {n}) of a "
            f"tensor of shape {tuple(x.shape)}: expected an int or {n} counts"
        )
    if r.size == 1:
        k = int(r.reshape(-1)[0])
        if k == 1:
            return x
        st = c_strides(x.shape)
        shape = x.shape[: axis + 1] + (k,) + x.shape[axis + 1 :]
        strides = st[: axis + 1] + (0,) + st[axis + 1 :]
        out = strided(x, shape, 0, strides)
        return tensor.view(out, x.shape[:axis] + (n * k,) + x.shape[axis + 1 :], 0)
    return take(x, np.repeat(np.arange(n, dtype=np.int64), r.astype(np.int64)), axis)


def _pieces(x, axis, bounds):
    """``x`` sliced along ``axis`` between consecutive ``bounds`` (Python slice rules)."""
    nd = x.ndim
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        key = (slice(None),) * axis + (slice(a, b),) + (slice(None),) * (nd - axis - 1)
        out.append(_basic(x, key))
    return out


def array_split(x, indices_or_sections, axis=0):
    """Split ``x`` into pieces along ``axis`` (``numpy.array_split``): an int ``N`` gives ``N``
    pieces, the first ``size % N`` one longer; a sequence of ints gives the split points.

    Returns
    -------
    list of Tensor
        Views or strided copies of ``x``.
    """
    x = tensor.as_tensor(x)
    return _split("array_split", x, indices_or_sections, axis, False)


def split(x, indices_or_sections, axis=0):
    """Split ``x`` into pieces along ``axis`` (``numpy.split``): an int ``N`` gives ``N`` equal
    pieces (the axis must divide evenly); a sequence of ints gives the split points, as
    Python slices take them (``[2, 5]``: ``x[:2], x[2:5], x[5:]``).

    The method ``x.split(size_or_sizes, dim=0)`` follows PyTorch instead (piece sizes).

    Returns
    -------
    list of Tensor
        Views or strided copies of ``x``.
    """
    x = tensor.as_tensor(x)
    return _split("split", x, indices_or_sections, axis, True)


def _split(op, x, ios, axis, equal):
    axis = _axis(axis, x.ndim, op)
    n = x.shape[axis]
    if isinstance(ios, (int, np.integer)) and not isinstance(ios, bool):
        sections = int(ios)
        if sections <= 0:
            raise ValueError(f"{op}: the number of sections must be positive, got {sections}")
        if equal and n % sections:
            raise ValueError(
                f"{op}: array split does not result in an equal division: axis {axis} of "
                f"shape {tuple(x.shape)} (size {n}) into {sections} sections; use array_split"
            )
        q, r = divmod(n, sections)
        sizes = [q + 1] * r + [q] * (sections - r)
        bounds = [0] + list(itertools.accumulate(sizes))
    else:
        bounds = [0, *_ints(op, "indices_or_sections", ios), n]
    return _pieces(x, axis, bounds)


def torch_split(x, split_size_or_sections, dim=0):
    """PyTorch's ``x.split(split_size_or_sections, dim=0)``: an int is the size of every piece
    (the last may be shorter), a sequence gives each piece's size (they must add up to the
    axis). NumPy's :func:`split` takes the number of pieces or the split points instead."""
    axis = _axis(dim, x.ndim, "split")
    n = x.shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = _int("split", "split_size", split_size_or_sections)
        if size <= 0 and n:
            raise ValueError(f"split: split_size must be positive, got {size}")
        bounds = list(range(0, n, size)) + [n] if n else [0, 0]
    else:
        sizes = _ints("split", "split sizes", split_size_or_sections)
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(
                f"split: split sizes {list(sizes)} must be non-negative and add up to {n}, the "
                f"size of dimension {axis} of shape {tuple(x.shape)}"
            )
        bounds = [0] + list(itertools.accumulate(sizes))
    return tuple(_pieces(x, axis, bounds))


def moveaxis(x, source, destination):
    """Move axes of ``x`` to new positions, the others keeping their order (``numpy.moveaxis``,
    ``torch.movedim``).

    Parameters
    ----------
    x : Tensor or array_like
    source, destination : int or sequence of ints
        Original and new positions (negative count from the end), the same number of each.

    Returns
    -------
    Tensor
    """
    x = tensor.as_tensor(x)
    src = _axes("moveaxis", source, x.ndim)
    dst = _axes("moveaxis", destination, x.ndim)
    if len(src) != len(dst):
        raise ValueError(
            f"moveaxis: source {source!r} and destination {destination!r} must have the same "
            "number of elements"
        )
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


def _pairs(op, what, v, nd, integral):
    """NumPy's ``(before, after)`` pairs for each of ``nd`` axes from an int, a pair, or one
    pair per axis."""
    a = np.asarray(v)
    if a.dtype == object or (integral and a.size and a.dtype.kind not in "iu"):
        kind = "integers" if integral else "numbers"
        raise TypeError(f"{op}: {what} must be {kind}, got {v!r}")
    if a.size == 1:
        return [(a.reshape(-1)[0],) * 2] * nd
    if a.size == 2 and a.shape != (2, 1):
        return [tuple(a.reshape(-1))] * nd
    try:
        return [tuple(p) for p in np.broadcast_to(a, (nd, 2))]
    except ValueError:
        raise ValueError(
            f"{op}: {what} of shape {tuple(a.shape)} does not fit a {nd}-D tensor: expected an int, "
            f"a (before, after) pair, or {nd} such pairs"
        ) from None


def pad(x, pad_width, mode="constant", constant_values=0):
    """Pad ``x`` with a constant (``numpy.pad`` with ``mode="constant"``).

    Parameters
    ----------
    x : Tensor or array_like
    pad_width : int, (before, after), or ((before, after),) per axis
        How many elements to add at each end of each axis.
    mode : str
        Only ``"constant"`` is supported; other modes raise ``NotImplementedError``.
    constant_values : number, pair or pairs of numbers, or a 0-d Tensor
        The value(s) of the padding, per axis and end as ``pad_width``; where two axes' pads
        meet, the later axis's value wins (as NumPy). A tensor value gets a gradient.

    Returns
    -------
    Tensor
        One output written by ``copy`` entries: ``x`` into the interior and each constant into
        its slab of the padding (every element is written).
    """
    if mode != "constant":
        raise NotImplementedError(
            f"pad: mode={mode!r} is not supported; only mode='constant' is implemented"
        )
    x = tensor.as_tensor(x)
    nd = x.ndim
    widths = [(int(b), int(a)) for b, a in _pairs("pad", "pad_width", pad_width, nd, True)]
    if any(b < 0 or a < 0 for b, a in widths):
        raise ValueError(f"pad: pad_width must be non-negative, got {pad_width!r}")
    if not any(b or a for b, a in widths):
        return x
    if isinstance(constant_values, tensor.Tensor):
        if constant_values.ndim != 0:
            raise ValueError(
                "pad: a tensor constant_values must be 0-d (pass numbers for per-axis values), "
                f"got shape {tuple(constant_values.shape)}"
            )
        values = [(constant_values, constant_values)] * nd
    else:
        values = _pairs("pad", "constant_values", constant_values, nd, False)
    out_shape = tuple(n + b + a for n, (b, a) in zip(x.shape, widths))
    inputs = [x]
    consts = {}  # value -> input position

    def const(v):
        key = id(v) if isinstance(v, tensor.Tensor) else float(v)
        if key not in consts:
            if isinstance(v, tensor.Tensor):
                inputs.append(v)
            else:
                inputs.append(tensor.tensor(np.asarray(v).astype(x.dtype)))
            consts[key] = len(inputs) - 1
        return consts[key]

    blocks = [(0, x.shape, 0, c_strides(x.shape), [b for b, _ in widths])]
    zero = (0,) * nd
    for k in range(nd):
        # the slabs of axis k: outside the interior on axis k, inside it on later axes, any
        # position on earlier axes (so the later axis's value wins on the corners, as NumPy)
        lo = [0] * k + [None] + [b for b, _ in widths[k + 1 :]]
        ext = list(out_shape[:k]) + [None] + list(x.shape[k + 1 :])
        b, a = widths[k]
        for start, length, v in ((0, b, values[k][0]), (b + x.shape[k], a, values[k][1])):
            if length and math.prod(ext[:k] + ext[k + 1 :]):
                lo[k], ext[k] = start, length
                blocks.append((const(v), list(ext), 0, zero, list(lo)))
    out = _blocks(inputs, out_shape, blocks)
    return out


def take_along_axis(x, indices, axis=-1, *, dim=None):
    """Pick values of ``x`` at ``indices`` along ``axis`` (``numpy.take_along_axis``;
    ``torch.take_along_dim``'s ``dim=``).

    Parameters
    ----------
    x : Tensor or array_like
    indices : int array or int64 Tensor
        As many dimensions as ``x``; the other axes broadcast against ``x``'s. A tensor traced
        inside ``tape.record`` is data: replays pick at the new indices (computed on the tape
        with integer arithmetic; an index out of range stops the replay).
    axis : int or None
        None takes along the flattened ``x`` (then ``indices`` is 1-D).

    Returns
    -------
    Tensor
        One ``take`` entry on the flattened ``x``; its reverse is a scatter-add.
    """
    x = tensor.as_tensor(x)
    if dim is not None:
        axis = dim
    if axis is None:
        x = tensor.view(x, (x.numel(),), 0)
        axis = 0
    nd = x.ndim
    axis = _axis(axis, nd, "take_along_axis")
    traced = isinstance(indices, tensor.Tensor) and indices._tape is not None
    if isinstance(indices, tensor.Tensor):
        if indices.dtype.kind not in "iu":
            raise IndexError(
                f"take_along_axis: indices must be an integer tensor, got {indices.dtype}"
            )
        vals = indices._peek()  # checked now; a traced index is checked again at each replay
    else:
        vals = np.asarray(indices)
        if vals.dtype == object or (vals.size and vals.dtype.kind not in "iu"):
            raise IndexError(f"take_along_axis: indices must be integers, got {vals.dtype}")
    if vals.ndim != nd:
        raise ValueError(
            f"take_along_axis: indices of shape {tuple(vals.shape)} must have as many dimensions as "
            f"the tensor of shape {tuple(x.shape)} ({nd})"
        )
    xs, ishape = list(x.shape), list(vals.shape)
    xs[axis] = ishape[axis] = 1
    try:
        out = list(np.broadcast_shapes(tuple(xs), tuple(ishape)))
    except ValueError:
        raise ValueError(
            f"take_along_axis: the tensor's shape {tuple(x.shape)} and the indices' shape {tuple(vals.shape)} "
            f"do not broadcast outside axis {axis}"
        ) from None
    out[axis] = vals.shape[axis]
    out = tuple(out)
    n = x.shape[axis]
    bad = (vals < -n) | (vals >= n)
    if bad.any():
        raise IndexError(
            f"take_along_axis: index {int(vals[bad].flat[0])} is out of bounds for axis {axis} "
            f"with size {n} (tensor of shape {tuple(x.shape)})"
        )
    st = c_strides(x.shape)
    base = np.zeros(out, np.int64)  # the flat offset of each output element's other axes
    for d in range(nd):
        if d != axis and x.shape[d] != 1:
            shp = [1] * nd
            shp[d] = out[d]
            base = base + np.arange(out[d], dtype=np.int64).reshape(shp) * st[d]
    flat_x = tensor.view(x, (x.numel(),), 0)
    if not traced:
        v = np.broadcast_to(vals.astype(np.int64), out)
        flat = base + (v % n if n else v) * st[axis]
        return take(flat_x, flat, 0)
    # on the tape: an index out of range maps to one past the end, which the take kernel
    # refuses at replay (wrapping it per axis could land in range, silently wrong)
    ew = tensor.elementwise
    i = indices
    pos = ew("where", ew("less", i, 0), ew("add", i, n), i)
    flat = ew("add", ew("mul", pos, st[axis]), base)
    flat = ew("where", ew("less", i, -n), x.numel(), flat)
    flat = ew("where", ew("greater_equal", i, n), x.numel(), flat)
    return take(flat_x, flat, 0)
