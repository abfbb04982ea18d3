"""The reduce block of ``sum``, ``max``, ``min`` and ``prod``, defined once.

A reduction entry carries, at ``p = entries[i, E_ATTR]``::

    [nd, in_shape[nd], out_strides[nd]]

``out_strides`` are the C-order strides of the kept-dims output, with 0 on reduced axes, so
input element ``j`` (multi-index ``idx``) adds into output element ``idx . out_strides``.
Unit axes are dropped and neighbouring axes merged when it is encoded (``(25, 10, 1000)``
summed over axis 2 is ``(250, 1000)`` with strides ``(1, 0)``). A reduction of a 0-d input has
``nd = 0``.

Everything that reads or writes the block goes through this module: :func:`encode` (the front
end, :mod:`tape.frontend.ops.reduce`), :func:`decode` (validation, the compiled tier, NumPy
references) and the position functions, which the CPU kernels (:mod:`tape.ops.reduce`) and
the GPU kernels (:mod:`tape.gpu._kernels`) compile.
"""

from __future__ import annotations

from typing import NamedTuple

from tape.ops.blocks.broadcast import coalesce

# ---------------------------------------------------------------- positions (CPU and GPU)


def ndim_at(p):
    """Position of ``nd``."""
    return p


def dims_at(p):
    """Position of ``in_shape[0]``."""
    return p + 1


def row_length_at(p, nd):
    """Position of the innermost extent (``nd >= 1``): the length of a row."""
    return p + nd


def strides_at(p, nd):
    """Position of ``out_strides[0]``."""
    return p + 1 + nd


def inner_stride_at(p, nd):
    """Position of the output stride along a row (``nd >= 1``): 1 on a kept axis, 0 on a
    reduced one."""
    return p + 2 * nd


# ---------------------------------------------------------------- Python side


class Reduce(NamedTuple):
    """A decoded block: the merged input ``dims`` and the output ``strides`` along them."""

    dims: tuple
    strides: tuple


def encode(shape, axes) -> tuple:
    """The block of a reduction of an input of ``shape`` over ``axes`` (sorted, non-negative,
    validated by the caller)."""
    kept = [1 if k in axes else d for k, d in enumerate(shape)]
    strides = []
    acc = 1
    for k in range(len(kept) - 1, -1, -1):
        strides.append(0 if k in axes else acc)
        acc *= kept[k]
    dims, ostrides = [], []
    if shape:
        dims, (ostrides,) = coalesce(list(shape), [list(reversed(strides))])
    return (len(dims), *dims, *ostrides)


def decode(ipool, p) -> Reduce:
    """The block at ``p``. The reader must know the block lies inside ``ipool``."""
    nd = int(ipool[ndim_at(p)])
    d, s = dims_at(p), strides_at(p, nd)
    return Reduce(
        tuple(int(v) for v in ipool[d : d + nd]), tuple(int(v) for v in ipool[s : s + nd])
    )
