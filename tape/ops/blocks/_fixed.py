"""Blocks of a fixed number of named ints (a batch of matrices, a scan's view of its input).

A block module names the offsets of its fields as module constants (``M = 1``), which the
CPU kernels and the GPU device functions read as ``ipool[p + M]`` (Numba freezes module
integers into the code), and gets its Python side from :func:`fixed`.
"""

from __future__ import annotations

from collections import namedtuple


def fixed(name, fields):
    """``(Record, encode, decode)`` for a block holding the ints ``fields``, in order:
    ``encode(*values)`` gives the block's ints, ``decode(ipool, p)`` a ``Record`` of the
    block at ``p`` (the reader must know it lies inside ``ipool``)."""
    record = namedtuple(name, fields)
    n = len(fields)

    def encode(*values) -> list:
        if len(values) != n:
            raise TypeError(
                f"a {name} block holds {n} ints ({', '.join(fields)}), got {len(values)}"
            )
        return [int(v) for v in values]

    def decode(ipool, p):
        return record(*(int(v) for v in ipool[p : p + n]))

    encode.__doc__ = f"The {name} block of ``{', '.join(fields)}``."
    decode.__doc__ = f"The {name} block at ``p`` of ``ipool``, as a ``{name}`` record."
    return record, encode, decode
