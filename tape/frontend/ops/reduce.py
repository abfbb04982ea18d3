"""Front ends of the reductions (:mod:`tape.ops.reduce`): ``axis`` handling and the attribute
block (unit axes dropped, neighbouring axes merged)."""

import builtins

import numpy as np

from tape.frontend import tensor
from tape.layout.columns import ACTIVE
from tape.ops.blocks import reduce as reduce_block
from tape.ops.reduce import MAX, MIN, PROD, SUM


def normalize_axes(op, axis, ndim):
    """``axis`` (None, int or tuple) as a sorted tuple of non-negative ints, validated; ``op``
    names the caller in messages."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)):
            raise TypeError(f"{op}: axis must be an int or a tuple of ints, got {axis!r}")
        if not -ndim <= a < builtins.max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise ValueError(f"{op}: axis {a} is out of range for a tensor with {ndim} dimensions")
        out.append(int(a) % builtins.max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axis in {axis!r}")
    return tuple(sorted(a for a in out if a < ndim))


def reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if k in axes else s for k, s in enumerate(shape))
    return tuple(s for k, s in enumerate(shape) if k not in axes)


_blocks: dict = {}  # (op code, shape, axis, keepdims) -> (output shape, attribute block)


def _reduce(op, x, axis, keepdims):
    x = tensor.as_tensor(x)
    key = (op.code, x.shape, axis, keepdims) if axis is None or axis.__class__ is int else None
    hit = _blocks.get(key) if key is not None else None
    if hit is None:
        hit = _block(op, x.shape, axis, keepdims)
        if key is not None:
            _blocks[key] = hit
    if x._rg:
        tp = tensor._direct_tape(x, op)
        if tp is not None:  # apply's eager case for one input, without its loops
            out = tp.emit(op.code, (x._buf,), hit[0], ACTIVE, hit[1])
            return tensor.Tensor._traced(tp, out, hit[0], x.dtype, True, op.name)
    return tensor.apply(op, [x], hit[0], hit[1])


def _block(op, shape, axis, keepdims):
    """The reduction's output shape and attribute block (validating ``axis``)."""
    ndim = len(shape)
    axes = normalize_axes(op.name, axis, ndim)
    if op in (MAX, MIN) and any(shape[a] == 0 for a in axes):
        raise ValueError(
            f"{op.name}: cannot reduce over a zero-size axis of a tensor of shape {tuple(shape)}"
        )
    return reduced_shape(shape, axes, keepdims), reduce_block.encode(shape, axes)


def sum(x, axis=None, keepdims=False):  # noqa: A001
    """Sum over ``axis`` (None: all axes; int or tuple). Like ``numpy.sum``."""
    return _reduce(SUM, x, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    """Maximum over ``axis``. The gradient goes to the maximal elements, split evenly on ties."""
    return _reduce(MAX, x, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    """Minimum over ``axis``. The gradient goes to the minimal elements, split evenly on ties."""
    return _reduce(MIN, x, axis, keepdims)


def prod(x, axis=None, keepdims=False):
    """Product over ``axis``; its gradient is exact when inputs contain zeros."""
    return _reduce(PROD, x, axis, keepdims)
