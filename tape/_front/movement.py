"""Front ends of the movement ops (:mod:`tape.ops.movement`): transpose, broadcast_to,
concatenate, stack, take and indexing (``x[key]``), each recording ``copy`` or ``take`` entries
(or none: contiguous results are free views)."""

import operator

import numpy as np

from tape import _tensor as T
from tape.ops.movement import COPY, TAKE, c_strides, copy_block


def strided(x, shape, offset, strides):
    """Copy of the strided view ``(shape, offset, strides)`` of ``x``'s memory (C order)."""
    shape = tuple(int(s) for s in shape)
    if _is_contiguous(shape, strides):
        return T.view(x, shape, offset)
    block = copy_block(shape, offset, strides, 0, c_strides(shape))
    return T.apply(COPY, [x], shape, block)


def _is_contiguous(shape, strides):
    expect = c_strides(shape)
    return all(n == 1 or s == e for n, s, e in zip(shape, strides, expect))


def transpose(x, axes=None):
    """Permute the axes of ``x`` (reverse them when ``axes`` is None), like ``numpy.transpose``."""
    x = T.as_tensor(x)
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


def swapaxes(x, a, b):
    x = T.as_tensor(x)
    axes = list(range(x.ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return transpose(x, axes)


def broadcast_to(x, shape):
    """Broadcast ``x`` to ``shape`` (NumPy rules); the gradient sums over the broadcast axes."""
    x = T.as_tensor(x)
    shape = tuple(int(s) for s in shape)
    if x.shape == shape:
        return x
    try:
        if np.broadcast_shapes(x.shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"broadcast_to: a tensor of shape {x.shape} cannot be broadcast to {shape}"
        ) from None
    lead = len(shape) - x.ndim
    st = c_strides(x.shape)
    strides = [0] * lead + [
        0 if n == 1 and m != 1 else s for n, m, s in zip(x.shape, shape[lead:], st)
    ]
    block = copy_block(shape, 0, strides, 0, c_strides(shape))
    return T.apply(COPY, [x], shape, block)


def concatenate(tensors, axis=0, *, dim=None):
    """Join tensors along an existing axis (``numpy.concatenate``; ``torch.cat``)."""
    axis = axis if dim is None else dim
    ts = [T.as_tensor(t) for t in tensors]
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
    return T.apply(COPY, ts, out_shape, parts=parts)


def stack(tensors, axis=0, *, dim=None):
    """Join tensors along a new axis (``numpy.stack``)."""
    axis = axis if dim is None else dim
    ts = [T.as_tensor(t) for t in tensors]
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
    return concatenate([T.unsqueeze(t, axis) for t in ts], axis)


def take(x, index, axis=0):
    """Gather along ``axis`` with an integer index array (``numpy.take``); the reverse is a
    scatter-add, so repeated indices accumulate."""
    x = T.as_tensor(x)
    if x.ndim == 0:
        raise IndexError("take: cannot index a zero-dimensional tensor")
    axis = _axis(axis, x.ndim, "take")
    idx = _index_tensor(index, x.shape[axis], axis)
    moved = x if axis == 0 else transpose(x, [axis] + [a for a in range(x.ndim) if a != axis])
    rest = moved.shape[1:]
    inner = int(np.prod(rest, dtype=np.int64))
    flat_idx = T.view(idx, (idx.numel(),), 0)
    rows = T.view(moved, (moved.shape[0], inner), 0)
    out = T.apply(TAKE, [rows, flat_idx], (idx.numel(), inner), [moved.shape[0], inner])
    out = T.view(out, idx.shape + rest, 0)
    if axis == 0:
        return out
    k = idx.ndim
    perm = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, k + len(rest)))
    return transpose(out, perm)


def _axis(axis, nd, op):
    if not -nd <= axis < nd:
        raise ValueError(f"{op}: axis {axis} is out of range for a {nd}-D tensor")
    return axis % nd


def _index_tensor(index, n, axis):
    """The index as a tensor, checked now against an axis of size ``n`` (and again by the
    kernel at every replay, since a traced index is data)."""
    if isinstance(index, T.Tensor):
        if index.dtype.kind not in "iu":
            raise IndexError(f"tensors used as indices must be integer tensors, got {index.dtype}")
        vals = index._peek()  # a check now, not an escape: the kernel checks at every replay
        idx = index
    else:
        vals = np.asarray(index)
        if vals.dtype == object or (vals.size and vals.dtype.kind not in "iu"):
            raise IndexError(f"arrays used as indices must be of integer type, got {vals.dtype}")
        vals = vals.astype(np.int64)
        idx = T.tensor(vals)
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
            expanded.extend(np.nonzero(k.numpy() if isinstance(k, T.Tensor) else k))
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
        if isinstance(k, T.Tensor) and k._tape is not None:
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
    merged = T.view(x, (int(np.prod(lead)),) + x.shape[len(arrays) :], 0)
    return getitem(take(merged, flat, 0), (slice(None),) * flat.ndim + key[len(arrays) :])


def _as_index(k):
    if isinstance(k, (list, tuple)):
        return np.asarray(k)
    if isinstance(k, T.Tensor) and k.ndim == 0 and k.dtype.kind in "iu" and k._tape is None:
        return int(k.item())
    if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
        return int(k)
    if k is None or k is Ellipsis or isinstance(k, (slice, int, np.integer, np.ndarray, T.Tensor)):
        if isinstance(k, bool):
            raise IndexError("boolean scalars are not supported as indices")
        return k
    raise IndexError(
        f"only integers, slices, None, Ellipsis and integer or boolean arrays are valid indices, got {k!r}"
    )


def _is_array(k):
    return isinstance(k, (np.ndarray, T.Tensor))


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
