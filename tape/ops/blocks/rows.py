"""The rows block of ``take`` and ``scatter_add`` entries, defined once::

    [n_rows, inner]

The indexed array is viewed as ``n_rows`` rows of ``inner`` elements; the index input holds
row numbers (as floats; negative ones count from the end). :func:`encode` serves the front
ends, :func:`decode` validation, sparsity and failure messages, and the position functions
the CPU kernels (:mod:`tape.ops.movement`, :mod:`tape.ops.scatter`) and the GPU kernels.
"""

from __future__ import annotations

from typing import NamedTuple


def n_rows_at(p):
    """Position of ``n_rows``."""
    return p


def inner_at(p):
    """Position of ``inner``."""
    return p + 1


SIZE = 2
"""Ints in the block."""


class Rows(NamedTuple):
    n_rows: int
    inner: int


def encode(n_rows, inner) -> list:
    return [int(n_rows), int(inner)]


def decode(ipool, p) -> Rows:
    """The block at ``p``. The reader must know the block lies inside ``ipool``."""
    return Rows(int(ipool[n_rows_at(p)]), int(ipool[inner_at(p)]))
