"""The broadcast block of binary and ternary entries, defined once.

An elementwise entry with two or three inputs carries, at ``p = entries[i, E_ATTR]``::

    [mode, nd, dims[nd], strides_0[nd], ..., strides_{n_in - 1}[nd]]

``mode`` is ``GENERAL`` (or ``SAME``, ternary only: every input has the output's size, and the
block is ``[SAME]``). ``dims`` is the output's shape with unit axes dropped and neighbouring
axes merged wherever every input walks them contiguously; ``strides_k`` are input ``k``'s
element strides along those axes (0 where it is broadcast). Binary entries always use
``GENERAL``, with at least one axis: equal shapes are one row of stride 1, a one-element input
has stride 0, and the kernels loop over the innermost axis as rows.

Everything that reads or writes the block goes through this module: :func:`encode` (the
recording), :func:`decode` (validation, the compiled tier), and the position functions below,
plain functions of ints that the CPU loops (:mod:`tape.ops.loops`) compile inline and the GPU
loops (:mod:`tape.gpu._loops`) compile as device functions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tape.layout.columns import GENERAL, SAME

# ---------------------------------------------------------------- positions (CPU and GPU)


def ndim_at(p):
    """Position of ``nd``."""
    return p + 1


def dims_at(p):
    """Position of ``dims[0]``."""
    return p + 2


def row_length_at(p, nd):
    """Position of the innermost extent, the length of a row."""
    return p + 1 + nd


def strides_at(p, nd, k):
    """Position of input ``k``'s first stride."""
    return p + 2 + nd * (1 + k)


def inner_stride_at(p, nd, k):
    """Position of input ``k``'s stride along a row (the innermost axis)."""
    return p + 1 + nd * (2 + k)


# ---------------------------------------------------------------- Python side


class Broadcast(NamedTuple):
    """A decoded block: ``mode``, the merged ``dims`` and one stride tuple per input (empty
    for ``SAME``)."""

    mode: int
    dims: tuple
    strides: tuple


def encode(name, shapes):
    """``(output shape, block)`` for an elementwise op ``name`` over inputs of ``shapes``;
    the block is None for one input. Raises ValueError, naming the op, for shapes that do not
    broadcast."""
    try:
        out = np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(
            f"{name}: operands could not be broadcast together with shapes "
            + " and ".join(str(s) for s in shapes)
        ) from None
    n = math.prod(out)
    if len(shapes) == 1:
        return out, None
    sizes = [math.prod(s) for s in shapes]
    if len(shapes) == 2:
        # binary entries always use the row form; equal shapes and scalars are one row
        if all(s == n for s in sizes):
            return out, [GENERAL, 1, n, 1, 1]
        if sizes[0] == 1 and sizes[1] == n:
            return out, [GENERAL, 1, n, 0, 1]
        if sizes[1] == 1 and sizes[0] == n:
            return out, [GENERAL, 1, n, 1, 0]
    elif all(s == n for s in sizes):
        return out, [SAME]
    nd = len(out)
    strides = []
    for s in shapes:
        st = [0] * nd
        acc = 1
        for k in range(len(s) - 1, -1, -1):
            st[nd - len(s) + k] = 0 if s[k] == 1 and out[nd - len(s) + k] != 1 else acc
            acc *= s[k]
        strides.append(st)
    dims, strides = coalesce(list(out), strides)
    ints = [GENERAL, len(dims), *dims]
    for st in strides:
        ints.extend(st)
    return out, ints


def is_row(shape, out):
    """Whether an input of ``shape`` is a *row* of an elementwise output of shape ``out``: its
    shape, less leading unit axes, is ``out``'s trailing shape, so that it repeats along
    ``out``'s leading axes (:data:`tape.layout.columns.ROW`; the sweeps' compiled test is
    :func:`tape.interpreter.dispatch._shape_class`)."""
    shape = list(shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    return len(shape) <= len(out) and list(out[len(out) - len(shape) :]) == shape


def is_col(shape, out):
    """Whether an input of ``shape`` is a *column* of an elementwise output of shape ``out``:
    its shape, with leading unit axes up to ``out``'s number of axes and less trailing unit
    axes, is ``out``'s leading shape, so that each of its elements repeats over a run of
    ``out`` (:data:`tape.layout.columns.COL`; the sweeps' compiled test is
    :func:`tape.interpreter.dispatch._shape_class`)."""
    if len(shape) > len(out):
        return False
    shape = [1] * (len(out) - len(shape)) + list(shape)
    while shape and shape[-1] == 1:
        shape.pop()
    return list(out[: len(shape)]) == shape


def col_strides(dims, size, n):
    """The strides that a column of ``size`` elements of an output of ``n`` has along the
    merged axes ``dims`` of a block: 0 along the trailing axes that hold its runs of
    ``n // size``, its elements along the rest (``None`` if no trailing axes hold exactly a
    run)."""
    run, ax = n // size, len(dims) - 1
    tail = 1
    while ax >= 0 and tail < run:
        tail *= dims[ax]
        ax -= 1
    if tail != run:
        return None
    st, step = [0] * len(dims), 1
    for k in range(ax, -1, -1):
        st[k] = step
        step *= dims[k]
    return st


def row_strides(dims, size):
    """The strides that a row of ``size`` elements has along the merged axes ``dims`` of a
    block: its elements along the trailing axes that hold ``size`` elements, 0 along the rest
    (``None`` if no trailing axes hold exactly ``size``)."""
    st, step = [0] * len(dims), 1
    for ax in range(len(dims) - 1, -1, -1):
        if step >= size:
            break
        st[ax] = step
        step *= dims[ax]
    return st if step == size else None


def coalesce(dims, strides):
    """Drop unit axes and merge neighbours that every operand walks contiguously, so the
    kernels' innermost rows are as long as possible: (25, 10, 1000) - (25, 10, 1) becomes
    (250, 1000) with inner strides 1 and 0. (The reduce block merges its axes the same way.)"""
    keep = [k for k, n in enumerate(dims) if n != 1] or [len(dims) - 1]
    dims = [dims[k] for k in keep]
    strides = [[st[k] for k in keep] for st in strides]
    k = len(dims) - 2
    while k >= 0:
        if all(st[k] == st[k + 1] * dims[k + 1] for st in strides):
            dims[k : k + 2] = [dims[k] * dims[k + 1]]
            for st in strides:
                st[k : k + 2] = [st[k + 1]]
        k -= 1
    return dims, strides


def decode(ipool, p, n_in) -> Broadcast:
    """The block at ``p`` of an entry with ``n_in`` inputs. The reader must know the block
    lies inside ``ipool`` (:func:`tape.ops.validate.check_broadcast` checks a loaded tape's)."""
    mode = int(ipool[p])
    if mode == SAME:
        return Broadcast(mode, (), ())
    nd = int(ipool[ndim_at(p)])
    d = dims_at(p)
    dims = tuple(int(v) for v in ipool[d : d + nd])
    strides = tuple(
        tuple(int(v) for v in ipool[strides_at(p, nd, k) : strides_at(p, nd, k) + nd])
        for k in range(n_in)
    )
    return Broadcast(mode, dims, strides)
