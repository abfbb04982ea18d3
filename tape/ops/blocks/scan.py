"""The scan block of ``cumsum``, ``cumprod``, ``argmax`` and ``argmin``: ``[outer, n, inner]``,
and of ``argsort``: ``[outer, n, inner, descending]``.

The input is viewed as ``(outer, n, inner)`` with ``n`` the length of the scanned axis, so
element ``j`` of row ``(o, q)`` is at ``o * n * inner + j * inner + q``. Read by
:mod:`tape.ops.scan` and the GPU kernels; written by :mod:`tape.frontend.ops.scan`.
"""

from tape.ops.blocks._fixed import fixed

OUTER, N, INNER, DESCENDING = range(4)
SIZE = 3
"""Ints in the block (``argsort``'s has one more: ``DESCENDING``)."""
Scan, encode, decode = fixed("Scan", ("outer", "n", "inner"))
