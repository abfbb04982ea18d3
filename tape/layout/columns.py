"""Column layout of the tape's integer arrays, and the small enums stored in them.

A tape is five arrays (see :class:`tape.core.Tape`):

``entries`` : int64[n, 6]
    One row per Wengert-list entry: ``op, in0, in1, in2, out, attr``. Inputs and the output
    are buffer indices (``-1`` where unused); ``attr`` is the start of the entry's attribute
    block in ``ipool`` (``-1`` if none).
``bufs`` : int64[m, 6]
    One row per buffer: ``offset, size, ndim, shape, kind, alias``. ``offset`` is into the
    value arena (and, at the same place, the adjoint arena); ``shape`` is the start of the
    shape in ``ipool``; ``alias`` is the buffer whose memory this one views (``-1`` if it
    owns its memory). Views (reshape, squeeze, contiguous slices) are aliases: they cost no
    entry, and their adjoints land in the owner's adjoint memory directly.
``ipool`` : int64[k]
    Shapes and attribute blocks.
``data``, ``grad`` : float64[a] or float32[a]
    Value arena and adjoint arena, same layout.

This module imports no Numba; the sweeps read these names as compile-time constants.
"""

# entries columns
E_OP, E_IN0, E_IN1, E_IN2, E_OUT, E_ATTR = range(6)
ENTRY_COLS = 6

# bufs columns
B_OFF, B_SIZE, B_NDIM, B_SHAPE, B_KIND, B_ALIAS = range(6)
BUF_COLS = 6

# op code of a callback entry (tape.program.callbacks: Python code run between sweep segments); the
# sweeps skip it, and it is never a registry op's code
CALLBACK = -2

# buffer kinds
CONST = 0  # no adjoint: constants, inputs without gradient, values that depend on neither
ACTIVE = 1  # intermediate with an adjoint; zeroed at the start of every reverse sweep
LEAF = 2  # differentiated input: its adjoint accumulates until zeroed explicitly

# broadcasting modes of elementwise entries (first int of their attribute block)
SAME = 0  # every input has the output's size: one flat loop (ternary entries)
SCALAR0 = 1  # reserved (input 0 has one element); the recorder no longer emits it
SCALAR1 = 2  # reserved (input 1 has one element); the recorder no longer emits it
GENERAL = 3  # strided: block is [mode, nd, shape[nd], strides_0[nd], strides_1[nd], ...]
# Binary entries always use GENERAL with axes merged as far as possible (equal shapes are
# one row of stride 1, a scalar operand has stride 0); the kernels loop over the innermost
# axis, so broadcasting costs no index arithmetic per element.

# entry classes: how each input compares with its entry's output (the dispatch tables of
# tape.interpreter.dispatch have a slot per op and class; an op may have a kernel of its own
# for a class). Per input: the output's size (an elementwise operand; also an unused input),
# one element broadcast over a larger output, a larger input going to a one-element output (a
# full reduction), a row: an input whose shape (less leading unit axes) is the output's
# trailing shape, repeated along the output's leading axes (a bias added to every row), a
# column: an input whose shape (with leading unit axes up to the output's number of axes,
# less trailing unit axes) is the output's leading shape, each element repeated over a run of
# the output (``x - x.max(axis=1, keepdims=True)``), or anything else. An entry's class is c0 + CLASS_BASE * c1 + CLASS_BASE**2 * c2.
SAME_SIZE, ONE, ALL, OTHER, ROW, COL = range(6)
CLASS_BASE = 6
N_CLASSES = CLASS_BASE**3
