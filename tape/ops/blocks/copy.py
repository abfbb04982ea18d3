"""The copy block of ``copy`` entries (transpose, broadcast_to, strided slicing, the parts of a
concatenation), defined once::

    [nd, shape[nd], in_off, in_strides[nd], out_off, out_strides[nd]]

Element ``idx`` of ``shape`` is read at ``in_off + idx . in_strides`` of the input and written
at ``out_off + idx . out_strides`` of the output. Broadcasting is a zero input stride,
transposition permuted strides, ``x[::-2]`` a negative one.

:func:`encode` serves the front end (:mod:`tape.frontend.ops.movement`), :func:`decode`
validation and sparsity, and the position functions the CPU kernels (:mod:`tape.ops.movement`)
and the GPU kernels (:mod:`tape.gpu._kernels`).
"""

from __future__ import annotations

from typing import NamedTuple

# ---------------------------------------------------------------- positions (CPU and GPU)


def ndim_at(p):
    """Position of ``nd``."""
    return p


def dims_at(p):
    """Position of ``shape[0]``."""
    return p + 1


def in_off_at(p, nd):
    """Position of ``in_off``."""
    return p + 1 + nd


def in_strides_at(p, nd):
    """Position of ``in_strides[0]``."""
    return p + 2 + nd


def out_off_at(p, nd):
    """Position of ``out_off``."""
    return p + 2 + 2 * nd


def out_strides_at(p, nd):
    """Position of ``out_strides[0]``."""
    return p + 3 + 2 * nd


def size(nd):
    """Ints in a block of ``nd`` axes."""
    return 3 + 3 * nd


# ---------------------------------------------------------------- Python side


class Copy(NamedTuple):
    shape: tuple
    in_off: int
    in_strides: tuple
    out_off: int
    out_strides: tuple


def encode(shape, in_off, in_strides, out_off, out_strides) -> list:
    """The block of a copy of ``shape`` (see the module docstring)."""
    return [len(shape), *shape, in_off, *in_strides, out_off, *out_strides]


def decode(ipool, p) -> Copy:
    """The block at ``p``. The reader must know the block lies inside ``ipool``."""
    nd = int(ipool[ndim_at(p)])

    def ints(at, n):
        return tuple(int(v) for v in ipool[at : at + n])

    return Copy(
        ints(dims_at(p), nd),
        int(ipool[in_off_at(p, nd)]),
        ints(in_strides_at(p, nd), nd),
        int(ipool[out_off_at(p, nd)]),
        ints(out_strides_at(p, nd), nd),
    )


def c_strides(shape):
    """C-order strides (in elements) of ``shape``."""
    out = []
    acc = 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))
