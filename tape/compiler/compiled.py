"""The compiled tier: Numba code specialised to one tape's structure.

:meth:`tape.Tape.compile` (or ``tape.record(..., compile=True)``) cuts a tape into units, writes
each fused loop as a module of its own, and switches the tape's replays to sweeps that run
those units. The sweeps have the interpreter's entry points with the interpreter's signatures
(``forward_sweep``, ``reverse_pass`` and the shared drivers of :mod:`tape.interpreter.drivers`:
``backward``, ``forward_backward``, ``gradient_batch_kernel``, ``ka_forward`` ...), so every
replay path (threads, workspaces, guards, batched replay, ``@njit`` embedding) runs either
tier without a second implementation.

**The shared runtime.** The sweeps know no tape: they are one module per process
(``tape_runtime``, :func:`runtime_source`, cached by Numba like any other) that reads the
tape's tables from the integer pool it is given (a header at ``ipool[ipool[-3]]``, fields
``H_*``; the pool ends with :data:`MAGIC`, so the interpreter's pool is refused) and calls
each unit through a table of addresses: a fused loop through the unit table
(:func:`tape.interpreter.dispatch.register_unit`), an entry it does not fuse through the interpreter's
op table. A new tape compiles only the fused loops that no tape compiled before, and adds no
code of its own to the process. The exception is a tape with a custom op's loop (which calls
the user's functions): it gets a module of its own, the same sweeps written for it, with a
small tape's units inlined into them (``INLINE_KINDS``).

What the generated code does differently from the interpreter:

- **Units, not entries.** The tape is cut into units: a fused loop, or one entry that keeps
  the interpreter's function for its op. A unit's code takes its offsets and its sizes
  (lengths, rows, a row's length, a block's length) from a table row. Units that differ
  only in what comes from the row (the steps of a time loop recorded unrolled, the same loop
  at several sizes) share their code, so a 46,000-entry LSTM compiles a few dozen kinds of
  unit. Each sweep is one loop over its table: one call through an address per unit.
- **Units shared across tapes.** Each fused loop's function is a module of its own (a "unit
  module", ``tape_unit_<hash>``), named by a hash of its text, which names nothing of the
  tape; every tape with the same loop calls the same compiled function, in this process
  (compiled once) and in the next (from Numba's cache). Recording the same model at another
  size, or a second model with the same loops, compiles nothing but the loops that are new.
  Loops missing from Numba's cache compile partly in helper processes (:mod:`tape.interpreter.warm`).
- **Fusion.** Elementwise entries over the same number of elements (every input either that
  long or a single value) become one loop, forward and reverse. Over the rows of a two-axis
  output, an input may also be one row that every row reads (a bias added to each row of a
  matrix product) or one value per row (``(K, d, 1)`` against ``(K, d, n)``), and over the
  rows of a three-axis output ``(A, D, m)`` one row per block of ``D`` rows (``(A, 1, m)``)
  or a ``(D, m)`` matrix that every block reads (``x.T - means[:, :, None]``): the loop then
  runs row by row, and those inputs' adjoints add up over the rows or along each row. The
  entries need not be consecutive: a loop is placed where the first entry outside it reads
  one of its values, so it takes in entries recorded after a matrix product it does not feed
  (never past an entry that can stop the sweep, as a guard). Values that never leave the
  loop stay in registers: the forward loop stores only what later entries, the outputs or
  the reverse loop read, and the reverse loop recomputes the cheap ones. A full ``sum`` of a
  value of the loop is taken with it: right after it, vectorised, or, in a loop of
  ``_BLOCK_MIN`` elements or more (or over rows), block by block while the block is in the
  L1 cache (then the summed values are not stored unless read elsewhere). A sum over the
  middle axis of ``(A, D, m)`` (GMM's ``sum(Qxc ** 2, axis=1)``) is taken in a loop over its
  ``A * D`` rows, each row added into its block's output row; its reverse reads that row's
  adjoint in the reverse loop.
- **Adjoints in registers.** Inside a run, adjoints are local variables: they are never zeroed
  or stored. An intermediate whose adjoint memory is written first by a fused run (through
  one view, or views a few elements apart that together cover it) is assigned, not zeroed and
  accumulated; so is a leaf's, in a gradient (where the leaves' adjoints start from zero), by
  a vectorised reverse loop.
- **Vectorised reverse loops.** A reverse run of ``_BLOCK_MIN`` elements or more, of ops
  whose rules are plain arithmetic (``Op.vectorises``), goes in blocks: the loop over a block writes each input's adjoint contribution to a scratch array
  and ORs a NaN test, and the adds into the adjoint arena follow in loops of their own. The
  main loop then has neither a store that may alias its loads (``x[1:]`` and ``x[:-1]`` add
  to one leaf) nor a branch, so LLVM vectorises it; a block that met a NaN (``0 * inf``
  where an adjoint is zero) redoes those elements with the selects. Views of one buffer a
  few elements apart add their adjoints in one pass per block (``_Gen.shifted_adds``).
- **Transcendental rules called in short loops.** ``exp``, ``log``, ``tanh`` and ``sigmoid``
  are inlined in Numba IR (so that long loops vectorise them); loops shorter than
  ``_BLOCK_MIN`` and the redos call them instead (:func:`outline_rule`), which cuts the
  compile of long tapes of short loops (the LSTM's) by a sixth.
- **One call from Python.** ``gradient_args`` (``gradient_args_<n>`` for ``n`` arguments)
  loads the arguments, zeroes, and runs forward and backward; :meth:`tape.Tape.gradient` and
  ``value_and_grad`` call it directly (one dispatch, no argument copies in Python) when the
  arguments are arrays of the recorded shapes and dtypes. It takes two arrays and the
  arguments: Numba's dispatch costs more with every array, so the tape's integer arrays are
  views of one (``entries``, ``bufs`` and the pool, made so by :meth:`tape.Tape.compile`) and
  a workspace's value and adjoint arenas are the two halves of one. A final sum that nothing
  else reads (a loss), taken in blocks with nothing stored, is summed again by its reverse
  loop, which recomputes the values anyway, so ``gradient_args`` skips that forward loop; an
  element loop's redo after a NaN is a function of its own (``_redo``), which keeps the short
  loop small.
- **Dead and constant entries removed.** Entries that no output or guard depends on, and
  entries that depend on no argument (their values were computed at record time and are in
  every workspace), are not replayed. ``x ** k`` with a recorded constant ``k`` of 2, 3 or 4
  is multiplied out in fused loops.
- **Common subexpressions merged.** An entry with the same op, the same attribute values and
  the same inputs as an earlier one (views compared by the memory they see, after earlier
  merges: merging ``x * y`` makes two ``sin(x * y)`` equal; values that depend on no
  argument, as an array captured twice, by their contents) is a duplicate: the fused loops
  read the earlier entry's value instead, so its adjoint gets every contribution, and the
  duplicate is not replayed once nothing else reads it. What the generated code cannot
  redirect reads the duplicate's own memory, so it stays (computed as recorded): an output,
  an entry replayed by the interpreter's function for its op (the tape's ``entries`` name
  its inputs), a value read again by the interpreter after a guard fails with
  ``on_change="warn"``. Guards, custom ops and entries whose output another entry also
  writes (the parts of a concatenation) are never merged.

Everything else (matrix products through BLAS, reductions over axes, gathers, guards,
elementwise entries that broadcast along more than two axes) calls the interpreter's own function for that entry's op
(``tape.interpreter.generated.sweeps.run_fwd``: through the address table, so the op's kernel is not
compiled again into the tape's code), so both tiers share one
implementation of every rule. Results agree with the interpreter to rounding
(the tests hold them to 1e-12 relative in float64): fused code adds an input's contributions
in another order.

After a compiled forward, the value arena holds the arguments, the outputs and the values
later entries read; other intermediates are not written (``ka.data`` in ``@njit`` code).

The sources (unit modules, the runtime, a custom-op tape's own module) are written to a cache
directory (``$TAPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tape`` or ``~/.cache/tape``), each
module named by a hash of its text, and compiled with Numba's ``cache=True``: a second process
with the same loops loads the machine code instead of compiling it. The text names the
fingerprint of every op whose scalar rules it compiles in, so an edited rule makes new
modules, never a stale cache hit. ``t.compiled_source`` lists the tape's units (or its own
module) with the unit modules' text appended.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numba import njit

from tape.interpreter import warm as _warm
from tape.interpreter.dispatch import precompile, register_unit, unit_signature_types
from tape.interpreter.generated import sweeps as _S
from tape.layout.columns import (
    ACTIVE,
    B_ALIAS,
    B_KIND,
    B_NDIM,
    B_OFF,
    B_SHAPE,
    B_SIZE,
    CALLBACK,
    CONST,
    E_ATTR,
    E_IN0,
    E_OP,
    E_OUT,
    LEAF,
    SAME,
)
from tape.layout.config import UNCACHED_JIT, UNIT_JIT
from tape.ops import registry
from tape.ops.blocks import broadcast
from tape.ops.blocks import reduce as reduce_block
from tape.ops.elementwise import POW
from tape.ops.reduce import SUM
from tape.program import callbacks
from tape.program.core import register_extension
from tape.program.replay import CompileError

GENERATOR_VERSION = 10

MAX_UNIT_KINDS = 400
"""Tapes that need more distinct kinds of unit than this are not compiled
(:func:`compile_tape` raises :class:`CompileError`; automatic promotion leaves them on the
interpreter): Numba's compile time grows with them. Repeated steps (a time loop recorded
unrolled) share their kinds, so the length of a tape does not count."""

AUTO_AFTER = 100
"""Automatic promotion: a tape recorded with ``compile="auto"`` (the default) is compiled at its
``AUTO_AFTER``-th replay."""

# What a fused loop does with an op comes from its record (:class:`tape.registry.Op`):
# ``cheap`` ops' values are recomputed by the reverse loop rather than stored by the forward
# one (a load costs more than the arithmetic); a reverse loop runs in blocks (``_block_loop``)
# only if all its ops ``vectorise``; an open fused group moves past a structural op's entry
# unless it ``may_stop`` the sweep.

_BLOCK = 1024
"""Elements per block of a fused reverse loop (``_block_loop``): its scratch arrays (one per
input adjoint) stay in the L1 cache."""

_SHIFT_MAX = 64
"""Views of one buffer whose offsets differ by at most this many elements (``x[1:]`` and
``x[:-1]``) add their adjoints in one pass per block of a fused reverse loop (see
``_Gen.shifted_adds``)."""

_BLOCK_MIN = 64
"""Fused reverse loops shorter than this run element by element (``_element_loop``): no
scratch arrays to allocate, and too short for vector code to pay. So do loops with an op
that does not vectorise (``Op.vectorises``)."""

_SHORT_SUM = 16
"""A folded sum over at most this many elements is added up in the unit itself: a call to
``_sum_reassoc`` costs more than the adds."""

INLINE_KINDS = 4
"""A tape with a module of its own (a custom op's loop) and at most this many kinds of unit
has its units and sweeps inlined
(``inline='always'``) into the functions that call them: for a small tape the calls, not the
loops, are what a replay costs. Larger tapes keep one function per unit kind (LLVM optimises
each loop on its own, and the compile stays short)."""

_FEW_RANGES = 16
"""Adjoint ranges to zero that the generated code names one by one (more: a table)."""

_AT_J = re.compile(r"\b([dg][ptq]?\d+)\[j\]")
"""Element ``j`` of a unit's view (``d3[j]``, ``g0[j]``) in generated code."""

_REDO = re.compile(r"\b_redo_[0-9a-f]{12}\b")
"""The name of a redo function (named by its text: see :meth:`_Gen.outline_redo`)."""

_CUSTOM = re.compile(r"\b_u\d+_(fwd|vjp)\b")
"""A call of a custom op's user function (set on the tape's module)."""

_TAPE_ARRAYS = re.compile(r"\b(entries|bufs|ipool)\b")
"""The tape's own arrays, which a unit module's loop does not take (see :meth:`_Gen.shared`)."""

_TAGS = {"full": "", "row": "p", "tile": "t", "block": "q"}
"""The letter after ``d``/``g``/``x``/``e`` in a view's name: how a loop over rows reads it."""


def _tag(kind):
    """The letter of an input's kind (see :meth:`_Plan.fusable`) in its names."""
    return _TAGS[kind if isinstance(kind, str) else kind[0]]


_OPEN_GROUPS = 8
"""Fused groups that stay open at once while the tape is cut into units (see
:meth:`_Plan._group`): the oldest is placed when another opens."""

_TABLES = re.compile(r"\b(entries|bufs)\b")
"""A unit's code that reads the tape's entry or buffer table."""

_LOCK = threading.Lock()
_MODULES: dict[str, types.ModuleType] = {}


STALE_POOL = (
    "compiled tape: these kernel arguments were taken before the tape was compiled (their "
    "integer pool lacks the compiled tables); take them again with t.kernel_args() or "
    "t.workspace(), or run them with tape.kernels (the interpreter)"
)


# ---------------------------------------------------------------- the shared runtime

MAGIC = 0x7A9EC0DE5EED2026
"""The last int of a compiled tape's pool (see :data:`_RUNTIME`): a pool without it (the
interpreter's, taken before the tape was compiled) is refused."""

# the header of a compiled tape's tables in its pool (at ``pool[pool[-3]]``): the positions
# of the fields in it
(H_FWD, H_FWD_ROWS, H_FWD_W, H_REV, H_REV_ROWS, H_REV_W, H_ZERO, H_ZERO_ROWS, H_LEAVES,
 H_LEAVES_ROWS, H_RUN, H_OUTS, H_N_OUTS, H_INS, H_N_INS, H_N_DATA, H_NE, H_WE, H_NB, H_WB,
 H_LEN) = range(21)  # fmt: skip

_RUNTIME = '''"""The compiled tier's runtime: GENERATED by tape.compiled. Do not edit.

The sweeps of every compiled tape whose units are fused loops of unit modules or entries
that the interpreter's kernels run. They read the tape's tables from its integer pool (a
header at ``ipool[ipool[-3]]``, see ``tape.compiled.H_*``) and call each unit through a table
of addresses, so a new tape compiles only the fused loops that are new.
"""

SWEEPS = "@SWEEPS@"  # the interpreter whose run_fwd / run_rev it calls

import numpy as np
from numba import literal_unroll, njit, prange
from numba.extending import overload

from tape.layout.config import COMPILED_JIT, SWEEP_JIT, UNIT_JIT
from tape.interpreter.dispatch import call_unit_fwd as _call_unit_fwd
from tape.interpreter.dispatch import call_unit_rev as _call_unit_rev
from tape.interpreter.dispatch import unit_address as _unit_address
from tape.interpreter.generated import sweeps as _S

MAGIC = @MAGIC@
STALE_POOL = @STALE@


def _load(data, o, x):
    """Copy argument ``x`` (any shape and layout) into ``data[o : o + x.size]``, C order."""


@overload(_load)
def _load_impl(data, o, x):
    if x.ndim == 1:  # indexed in place: no view to make, and it vectorises

        def one(data, o, x):
            d = data[o : o + x.shape[0]]  # a view first: data[o + j] would not vectorise
            for j in range(x.shape[0]):
                d[j] = x[j]

        return one

    def flat(data, o, x):
        f = x.ravel()  # a view of a C-ordered array, else a copy
        d = data[o : o + f.shape[0]]
        for j in range(f.shape[0]):
            d[j] = f[j]

    return flat


@njit(**UNIT_JIT)
def _header(ipool):
    """Where the tables' header starts; refuses a pool without them."""
    n = ipool.shape[0]
    if n < 3 or ipool[n - 1] != MAGIC or ipool[n - 2] != n:
        raise ValueError(STALE_POOL)
    return ipool[n - 3]


@njit(**UNIT_JIT)
def _forward_units(entries, bufs, ipool, data, h, n_units):
    """The first ``n_units`` forward units, in order. Returns the status."""
    off = ipool[h + @H_FWD@]
    w = ipool[h + @H_FWD_W@]
    for u in range(n_units):
        k = ipool[off + u * w]
        P = ipool[off + u * w + 1 : off + u * w + w]
        if k < 0:  # a fused loop of a unit module, through the unit table
            _call_unit_fwd(_unit_address(-k, data), (data, P))
        else:  # entry P[0], by the interpreter's kernel for its op
            st = _S.run_fwd(entries[P[0], @E_OP@], P[0], entries, bufs, ipool, data)
            if st >= 0:
                return st
    return -1


@njit(**UNIT_JIT)
def _reverse_units(entries, bufs, ipool, data, grad, h, zl):
    """The reverse units, last first (adjoints zeroed and seeded; the leaves' too if ``zl``:
    the units assign the leaves' adjoints they write first)."""
    off = ipool[h + @H_REV@]
    w = ipool[h + @H_REV_W@]
    for u in range(ipool[h + @H_REV_ROWS@]):
        k = ipool[off + u * w]
        P = ipool[off + u * w + 1 : off + u * w + w]
        if k < 0:
            _call_unit_rev(_unit_address(-k, data), (data, grad, P, zl))
        else:
            _S.run_rev(entries[P[0], @E_OP@], P[0], entries, bufs, ipool, data, grad)


@njit(**UNIT_JIT)
def _zero(grad, ipool, z, rows):
    """Zero the ``rows`` ranges ``[start, stop)`` listed at ``ipool[z:]``."""
    for r in range(rows):
        g = grad[ipool[z + 2 * r] : ipool[z + 2 * r + 1]]  # a view: grad[j] would not vectorise
        for j in range(g.shape[0]):
            g[j] = 0.0


@njit(**UNIT_JIT)
def _zero_adjoints(ipool, grad, h, zero_leaves):
    """Zero the adjoints that are accumulated (the leaves' too if ``zero_leaves``)."""
    _zero(grad, ipool, ipool[h + @H_ZERO@], ipool[h + @H_ZERO_ROWS@])
    if zero_leaves:
        _zero(grad, ipool, ipool[h + @H_LEAVES@], ipool[h + @H_LEAVES_ROWS@])


@njit(**COMPILED_JIT)
def forward_sweep(entries, bufs, ipool, data, start, stop):
    """The whole tape (a part of it, as when resuming after a guard, runs on the
    interpreter). Writes ``data``; returns the status (``-1``, or the entry that stopped
    the sweep)."""
    h = _header(ipool)
    return _forward_units(entries, bufs, ipool, data, h, ipool[h + @H_FWD_ROWS@])


@njit(**COMPILED_JIT)
def reach(entries, bufs, n_entries, roots):
    """Unused masks: the reverse pass below knows what the outputs depend on."""
    return np.zeros(0, np.bool_), np.zeros(0, np.bool_)


@njit(**COMPILED_JIT)
def reverse_pass(
    entries, bufs, ipool, data, grad, n_entries, n_bufs, emask, need, roots, seeds, zero_leaves
):
    """Zero the adjoints that are accumulated (the leaves' too if ``zero_leaves``), add
    ``seeds`` at the outputs and sweep back. Writes ``grad``."""
    h = _header(ipool)
    _zero_adjoints(ipool, grad, h, zero_leaves)
    o = ipool[h + @H_OUTS@]
    s = 0
    for r in range(ipool[h + @H_N_OUTS@]):
        a = ipool[o + 2 * r]
        m = ipool[o + 2 * r + 1]
        for j in range(m):
            grad[a + j] += seeds[s + j]
        s += m
    _reverse_units(entries, bufs, ipool, data, grad, h, zero_leaves)


@njit(**COMPILED_JIT)
def gradient_args(ints, arena, *xs):
    """Load the arguments (of the recorded shapes, any layout), zero the leaf adjoints,
    replay forward and backward. ``ints``: the tape's entry and buffer tables and its pool,
    end to end; ``arena``: the value arena, then the adjoint arena. Returns the forward
    status (``-1``: done; otherwise the gradients are untouched). ``gradient_args_<n>``
    does the same for ``n`` arguments, without the cost of a call with ``*xs``."""
    return _gradient(ints, arena, xs)


@SIZED@


@njit(**UNIT_JIT)
def _gradient(ints, arena, xs):
    n = ints.shape[0]
    if n < 3 or ints[n - 1] != MAGIC or ints[n - 2] > n:
        raise ValueError(STALE_POOL)
    ipool = ints[n - ints[n - 2] :]
    h = ipool[ipool.shape[0] - 3]
    nd = ipool[h + @H_N_DATA@]
    if arena.shape[0] != 2 * nd:
        raise ValueError(STALE_POOL)
    ne = ipool[h + @H_NE@] * ipool[h + @H_WE@]
    nb = ipool[h + @H_NB@] * ipool[h + @H_WB@]
    entries = _S.table2d(ints[0:ne], ipool[h + @H_NE@], ipool[h + @H_WE@])
    bufs = _S.table2d(ints[ne : ne + nb], ipool[h + @H_NB@], ipool[h + @H_WB@])
    data = arena[0:nd]
    grad = arena[nd:]
    at = ipool[h + @H_INS@]
    k = 0
    for x in literal_unroll(xs):
        _load(data, ipool[at + k], x)
        k += 1
    st = _forward_units(entries, bufs, ipool, data, h, ipool[h + @H_RUN@])
    if st >= 0:
        return st
    _zero_adjoints(ipool, grad, h, True)
    grad[ipool[ipool[h + @H_OUTS@]]] += 1.0
    _reverse_units(entries, bufs, ipool, data, grad, h, True)
    return -1

'''


_SIZED_ARGS = 6
"""The runtime has ``gradient_args_1`` .. ``gradient_args_6``: a call with ``*xs`` costs more
(``benchmarks/MEASURED.md``)."""


@functools.cache
def runtime_source() -> str:
    """The text of the shared runtime (:data:`_RUNTIME` and the shared drivers), made once
    per process."""
    fields = {k: str(v) for k, v in globals().items() if k.startswith("H_")}
    fields.update(SWEEPS=_S.FINGERPRINT, MAGIC=str(MAGIC), STALE=repr(STALE_POOL),
                  E_OP=str(E_OP))  # fmt: skip
    sized = []
    for n in range(1, _SIZED_ARGS + 1):
        xs = ", ".join(f"x{k}" for k in range(n))
        sized += ["@njit(**COMPILED_JIT)", f"def gradient_args_{n}(ints, arena, {xs}):",
                  f"    return _gradient(ints, arena, ({xs},))", "", ""]  # fmt: skip
    fields["SIZED"] = "\n".join(sized).strip()
    text = _RUNTIME
    for k, v in fields.items():
        text = text.replace(f"@{k}@", v)
    from tape.interpreter.codegen import drivers_text  # (not at import: `python -m` runs it)

    return text + "\n" + drivers_text(shared_only=True)


_CALLBACK_OP = registry.Op(name="callback", kind="structural", fwd=None, rev=(None,))
"""Stands in for the op of a callback entry (a :func:`tape.custom_op` application: its unit
calls the user's functions, see :meth:`_Gen.custom_forward`)."""


# ---------------------------------------------------------------- analysis


class _Group:
    """Consecutive elementwise entries over ``n`` elements, and an optional folded sum. With
    ``rows`` > 1 the loop runs over ``rows`` rows of ``n // rows`` elements, and an input may
    also be one row read by every row, or one value per row (a broadcasting entry; see
    :meth:`_Plan.fusable`)."""

    def __init__(self, n):
        self.n = n
        self.rows = 1
        self.seq = 0  # order of creation, while the group is open (see _Plan._group)
        self.entries: list[int] = []
        self.fold = -1  # a sum of a value of the group, taken with its loop
        self.fold_rows = 0  # 0: the fold is a full sum; D: a sum over blocks of D rows
        self.stops = 0  # once placed: how many units that can stop the sweep precede it

    @property
    def m(self):
        """The length of the inner loop: a row."""
        return self.n // self.rows


class _Call:
    """One entry replayed by the interpreter's kernel for its op."""

    def __init__(self, i):
        self.entries = [i]


class _Plan:
    """What the generator needs to know about a tape: live entries, fused groups, which
    values and adjoints live in registers."""

    def __init__(self, t):
        n = t.n_entries
        self.t = t
        self._fusable: dict[int, tuple | None] = {}  # entry -> fusable(entry)
        E = self.E = t.entries[:n]
        B = self.B = t.bufs[: t.n_bufs]
        self.ops = [_CALLBACK_OP if c == CALLBACK else registry.OPS[c] for c in E[:, E_OP]]
        owner = self.owner = np.where(B[:, B_ALIAS] >= 0, B[:, B_ALIAS], np.arange(len(B)))
        # views with the same memory are one operand (x[:-1] taken twice is one load)
        same: dict[tuple, int] = {}
        canon = [same.setdefault((int(owner[b]), int(B[b, B_OFF]), int(B[b, B_SIZE])), b)
                 for b in range(len(B))]  # fmt: skip
        self.ins = [[canon[b] for b in E[i, E_IN0:E_OUT] if b >= 0] for i in range(n)]

        # values that depend on an argument; the others are in every workspace already
        dyn = self.dyn = np.zeros(len(B), bool)
        dyn[list(t.inputs)] = True
        for i in range(n):
            if any(dyn[owner[b]] for b in self.ins[i]):
                dyn[E[i, E_OUT]] = True
        self.root_owners = {int(owner[r]) for r in t.outputs}
        # common subexpressions: fused entries read the first of identical entries instead
        # of the others (self.ins), which then stay live only where something still reads
        # their own memory (see the module docstring)
        live0 = self._liveness(())
        self.dup_of = self._cse(same)
        self.pinned = self._pins(live0)
        live = self._liveness(self.pinned) if self.dup_of else live0
        self.n_merged = sum(bool(live0[j] and not live[j]) for j in self.dup_of)
        self.n_kept = sum(bool(live[j]) for j in self.dup_of)
        self.live = [i for i in range(n) if live[i]]
        # the reverse sweep: entries the outputs depend on, with an adjoint to pass back
        B, owner = self.B, self.owner
        rneed = np.zeros(len(B), bool)
        rneed[list(self.root_owners)] = True
        emask = np.zeros(n, bool)
        for i in reversed(self.live):
            o = E[i, E_OUT]
            if rneed[o] and B[o, B_KIND] != CONST:
                emask[i] = True
                for b in self.ins[i]:
                    rneed[owner[b]] = True
        self.emask, self.rneed = emask, rneed
        self._group()

    def _liveness(self, pinned):
        """Live entries: an output, a guard on a value that can change, or a value in
        ``pinned`` depends on them (as the generated code reads them: ``self.ins``)."""
        E, owner, dyn = self.E, self.owner, self.dyn
        need = np.zeros(len(self.B), bool)
        need[list(self.root_owners | set(pinned))] = True
        live = np.zeros(len(E), bool)
        for i in range(len(E) - 1, -1, -1):
            o = E[i, E_OUT]
            if dyn[o] and (need[o] or self.ops[i].guard):
                live[i] = True
                for b in self.ins[i]:
                    need[owner[b]] = True
        return live

    def _cse(self, same):
        """Find entries identical to an earlier one and point the fused entries' operands at
        the earlier one's memory (``self.ins``; a view of a duplicate becomes the same view
        of the survivor, added to ``self.B`` if the tape has none). Returns ``{duplicate:
        survivor}``.

        Identical: same op, same attribute values, same inputs (each compared as the memory
        it sees: the owner after earlier merges, the offset in it and the shape; a value
        that depends on no argument, as a captured array, by its shape and contents, which
        are in every workspace), and the same output shape and kind. Only entries that alone
        write a buffer of their own, from values that can change, take part: guards, custom
        ops and the parts of a concatenation (several entries writing one output) do not."""
        t, E, B, owner = self.t, self.E, self.B, self.owner
        n = len(E)
        ip = t.ipool[: t.n_ipool].tolist()
        # an attribute block runs from its start to the next start of a block in the pool
        # (blocks are pushed whole, one after the other; identical ones usually share one)
        attrs = E[:, E_ATTR]
        starts = np.unique(np.concatenate([attrs[attrs >= 0], B[:, B_SHAPE], [t.n_ipool]]))
        starts = starts.tolist()
        blocks: dict[int, tuple] = {-1: ()}
        shapes: dict[tuple, tuple] = {}

        def block(a):
            v = blocks.get(a)
            if v is None:
                k = min(bisect.bisect_right(starts, a), len(starts) - 1)
                v = blocks[a] = tuple(ip[a : starts[k]])
            return v

        El, Bl, ow, dyn = E.tolist(), B.tolist(), owner.tolist(), self.dyn.tolist()
        values: dict[tuple, bytes] = {}

        def value(b):
            k = (Bl[b][B_OFF], Bl[b][B_SIZE])
            v = values.get(k)
            if v is None:
                x = t.data[k[0] : k[0] + k[1]]
                v = values[k] = hashlib.blake2b(x.tobytes(), digest_size=20).digest()
            return v

        def shape(b):
            k = (Bl[b][B_SHAPE], Bl[b][B_NDIM])
            v = shapes.get(k)
            if v is None:
                v = shapes[k] = tuple(ip[k[0] : k[0] + k[1]])
            return v

        outs = E[:, E_OUT]
        writers = np.bincount(owner[outs[outs >= 0]], minlength=len(B)).tolist()
        fixed = {ow[b] for b in t.inputs}
        rep = list(range(len(B)))  # owner -> the owner it is merged into
        seen: dict[tuple, int] = {}
        dup_of: dict[int, int] = {}
        for i in range(n):
            e = El[i]
            op, o = self.ops[i], e[E_OUT]
            if (
                op is _CALLBACK_OP or op.guard or o < 0 or Bl[o][B_ALIAS] >= 0
                or writers[o] != 1 or not dyn[o] or o in fixed
            ):  # fmt: skip
                continue
            ins = []
            for b in e[E_IN0:E_OUT]:
                if b < 0:
                    ins.append(None)
                    continue
                ob = ow[b]
                if ob == o:
                    break
                if dyn[ob]:
                    ins.append((rep[ob], Bl[b][B_OFF] - Bl[ob][B_OFF], shape(b)))
                else:  # a value fixed at record time (a captured array): compared by value
                    ins.append((-1, value(b), shape(b)))
            else:
                key = (e[E_OP], block(e[E_ATTR]), tuple(ins), shape(o), Bl[o][B_KIND])
                s = seen.setdefault(key, i)
                if s != i:
                    dup_of[i] = s
                    rep[o] = El[s][E_OUT]
        if not dup_of:
            return dup_of
        rows: list = []

        def moved(b):
            """The buffer that sees in the survivor what ``b`` sees in a duplicate."""
            ob = ow[b]
            r = rep[ob]
            if r == ob:
                return b
            k = (r, Bl[b][B_OFF] - Bl[ob][B_OFF] + Bl[r][B_OFF], Bl[b][B_SIZE])
            v = same.get(k)
            if v is None:
                row = B[b].copy()
                row[B_OFF], row[B_ALIAS] = k[1], r
                v = same[k] = len(B) + len(rows)
                rows.append(row)
            return v

        for i in range(n):
            if self._flat(i):
                self.ins[i] = [moved(b) for b in self.ins[i]]
        if rows:
            extra = np.array(rows, B.dtype).reshape(-1, B.shape[1])
            self.B = np.concatenate([B, extra])
            self.owner = np.concatenate([owner, extra[:, B_ALIAS]])
            self.dyn = np.concatenate([self.dyn, self.dyn[extra[:, B_ALIAS]]])
        return dup_of

    def _pins(self, live0):
        """Duplicates the interpreter reads again: after a guard fails with
        ``on_change="warn"``, the rest of the tape runs on the interpreter, which reads what
        the original entries read. A duplicate read after a guard that follows it keeps its
        value in the arena."""
        E, owner = self.E, self.owner
        guards = [i for i in range(len(E)) if self.ops[i].guard]
        if not guards or not self.dup_of:
            return set()
        last: dict[int, int] = {}  # owner -> the last entry reading it, in the tape
        for k in range(len(E)):
            for b in E[k, E_IN0:E_OUT]:
                if b >= 0:
                    last[int(owner[b])] = k
        pinned = set()
        for j in self.dup_of:
            g = bisect.bisect_right(guards, j)
            o = int(E[j, E_OUT])
            if live0[j] and g < len(guards) and last.get(o, -1) > guards[g]:
                pinned.add(o)
        return pinned

    def fusable(self, i):
        """``(rows, kinds)`` when entry ``i`` is elementwise and each input is read in one of
        the ways a fused loop reads (``kinds[k]``): ``"full"`` (as long as the output, element
        ``j``), ``"scalar"`` (one value), and over ``rows`` rows of the output (a broadcasting
        binary entry whose block has two axes), ``"row"`` (one row, read by every row: a bias
        added to each row) or ``"per_row"`` (one value per row). ``rows`` is 0 for an entry
        that reads no input by rows. Over the rows of a three-axis output ``(A, D, m)`` (rows
        ``A * D``), also ``("tile", D)`` (a ``(D, m)`` matrix: row ``r % D`` of it) or
        ``("block", D)`` (an ``(A, 1, m)`` value: row ``r // D``). ``None`` for any other
        entry."""
        f = self._fusable.get(i, ())
        if f == ():
            f = self._fusable[i] = self._reads(i)
        return f

    def _reads(self, i):
        kind = self.ops[i].kind
        if kind == "unary":
            return 0, ("full",)
        if kind not in registry.ELEMENTWISE_ARITY:
            return None
        b = broadcast.decode(self.t.ipool, int(self.E[i, E_ATTR]), registry.ELEMENTWISE_ARITY[kind])
        if kind == "ternary":
            return (0, ("full",) * 3) if b.mode == SAME else None
        if kind != "binary":
            return None
        nd = len(b.dims)
        if nd == 1:
            names = {1: "full", 0: "scalar"}
            if b.strides[0][0] in names and b.strides[1][0] in names:
                return 0, (names[b.strides[0][0]], names[b.strides[1][0]])
            return None
        if nd not in (2, 3):
            return None
        dims = list(b.dims)
        m = dims[-1]
        rows = int(np.prod(dims[:-1]))
        if nd == 2:
            names = {(m, 1): "full", (0, 1): "row", (1, 0): "per_row", (0, 0): "scalar"}
        else:
            D = dims[1]
            names = {(D * m, m, 1): "full", (0, 0, 1): "row", (D, 1, 0): "per_row",
                     (0, 0, 0): "scalar", (0, m, 1): ("tile", D), (m, 0, 1): ("block", D)}  # fmt: skip
        kinds = tuple(names.get(b.strides[k]) for k in (0, 1))
        if rows < 2 or m < 2 or None in kinds:
            return None
        return rows, kinds

    def sum_fold(self, i, g, size):
        """How ``sum`` entry ``i`` (``size`` outputs), over the value of open group ``g``,
        folds into its loop: ``(g.rows, 0)`` for a full sum; ``(rows, D)`` when it adds up
        blocks of ``D`` consecutive rows of a loop over ``rows`` rows: a sum over the middle
        axis of ``(A, D, m)``, or over the first of ``(D, m)`` (then ``A`` is 1). The group
        may run over rows already (of ``m`` elements), or be flat, rows of 16 elements or
        more; else ``None``. (The attribute block is ``[nd, shape[nd], out_strides[nd]]``,
        unit axes dropped and neighbours merged: see :mod:`tape.ops.blocks.reduce`.)"""
        if size == 1:
            return g.rows, 0
        dims, st = reduce_block.decode(self.t.ipool, int(self.E[i, E_ATTR]))
        nd = len(dims)
        if nd not in (2, 3):
            return None
        m, D = dims[-1], dims[-2]
        if st != ((m, 0, 1) if nd == 3 else (0, 1)) or D < 2:
            return None
        rows = int(np.prod(dims[:-1]))
        if rows * m != g.n or (g.rows > 1 and g.rows != rows) or (g.rows == 1 and m < 16):
            return None
        return rows, D

    def _flat(self, i):
        """The entry is elementwise with every input as long as the output or one value."""
        f = self.fusable(i)
        return f is not None and f[0] == 0

    def kind(self, i, k):
        """How fused entry ``i`` reads input ``k`` (see :meth:`fusable`)."""
        return self.fusable(i)[1][k]

    def full(self, b):
        """Buffer ``b`` is its owner's whole memory (not a partial view)."""
        o = self.owner[b]
        B = self.B
        return B[b, B_OFF] == B[o, B_OFF] and B[b, B_SIZE] == B[o, B_SIZE]

    def _group(self):
        """Cut the live entries into units, in an order that respects what each reads.

        An elementwise entry joins a fused group that is still open when the sizes (and rows)
        agree and everything it reads is placed, made by that group or by an older open one. A
        group stays open, unplaced, while the entries after it do not read it: it sinks past
        them. GMM's ``exp(q) * xc`` waits past ``L @ xc`` and takes ``+ L @ xc`` and the square
        into its loop. An entry that reads an open group places it (and the older ones) first.
        A unit that can stop the forward sweep (a guard, a checked gather, a custom op, ...)
        places every open group first: the interpreter resumes at that entry and reads all that
        was recorded before it. So does an entry that writes a part of a buffer others write
        too (a part of a concatenation)."""
        E, B, owner = self.E, self.B, self.owner
        outs = E[self.live, E_OUT] if self.live else np.zeros(0, np.int64)
        writers = np.bincount(owner[outs[outs >= 0]], minlength=len(B))
        units: list = []
        open_: list[_Group] = []  # open groups, oldest first
        producer: dict[int, _Group] = {}  # owner -> the open group that makes it
        placed: dict[int, tuple[int, _Group]] = {}  # owner -> (entry, placed group) making it
        n_read = np.zeros(len(B), np.int64)  # how many entries read each owner so far
        stops = 0  # units placed so far that can stop the forward sweep

        def place(seq):
            """Place the open groups up to ``seq`` (all: ``inf``), oldest first."""
            while open_ and open_[0].seq <= seq:
                g = open_.pop(0)
                g.stops = stops
                units.append(g)
                for i in g.entries + ([g.fold] if g.fold >= 0 else []):
                    producer.pop(int(owner[E[i, E_OUT]]), None)
                    placed[int(owner[E[i, E_OUT]])] = (i, g)

        def pull(i, cur, rows):
            """Move into ``cur`` the cheap entries of placed groups whose value only entry
            ``i`` reads (none since, nor any unit that can stop the sweep): ``xc * e`` made
            next to ``xc``, which a matrix product reads, is made where ``+ L @ xc`` reads it
            instead of being stored and loaded. Returns the rows of ``cur`` then."""
            for b in self.ins[i]:
                o = int(owner[b])
                j, src = placed.get(o, (-1, None))
                if src is None or n_read[o] or src.stops != stops or not self.full(b):
                    continue
                fj = self.fusable(j)
                if (
                    not self.ops[j].cheap or len(src.entries) < 2 or src.fold >= 0
                    or int(B[o, B_SIZE]) != cur.n or (fj[0] and rows and fj[0] != rows)
                ):  # fmt: skip
                    continue
                src.entries.remove(j)
                cur.entries.append(j)
                placed.pop(o)
                producer[o] = cur
                rows = rows or fj[0]
            return rows

        seq = 0
        for i in self.live:
            op = self.ops[i]
            o = int(E[i, E_OUT])
            size = int(B[o, B_SIZE])
            reads = [producer.get(int(owner[b])) for b in self.ins[i]]
            last = max((g.seq for g in reads if g is not None), default=-1)
            f = self.fusable(i)
            if f is not None and writers[owner[o]] > 1:
                place(np.inf)  # a part of a shared buffer: in tape order, in a loop of its own
                if f[0] == 0:
                    g = _Group(size)
                    g.entries.append(i)
                    units.append(g)
                    n_read[[owner[b] for b in self.ins[i]]] += 1
                    continue
                f = None  # over rows: the interpreter's kernel
            if f is not None:
                rows = f[0]
                cur = None
                for g in reversed(open_[-_OPEN_GROUPS:]):
                    if g.seq < last:
                        break
                    if (
                        g.n == size
                        and g.fold < 0
                        and (rows == 0 or g.rows in (1, rows))
                        and not any(r is g and not self.full(b) for r, b in zip(reads, self.ins[i]))
                    ):  # fmt: skip  (not a shifted view of a value the loop is computing)
                        cur = g
                        break
                if cur is None:
                    if len(open_) >= _OPEN_GROUPS:
                        place(open_[0].seq)
                    cur = _Group(size)
                    cur.seq = seq = seq + 1
                    open_.append(cur)
                    rows = pull(i, cur, rows)
                if rows:
                    cur.rows = rows
                cur.entries.append(i)
                producer[int(owner[o])] = cur
            elif (
                op is SUM
                and reads[0] is not None
                and reads[0].fold < 0
                and self.full(self.ins[i][0])
                and writers[owner[o]] == 1
                and (by := self.sum_fold(i, reads[0], size))
            ):
                g = reads[0]
                g.rows, g.fold_rows, g.fold = by[0], by[1], i
                producer[int(owner[o])] = g
            else:
                stop = op.kind == "structural" and op.may_stop
                place(np.inf if stop else last)
                units.append(_Call(i))
                stops += stop
            for b in self.ins[i]:
                n_read[owner[b]] += 1
        place(np.inf)
        made_by: dict[int, int] = {}  # value -> unit that produces it
        for u, unit in enumerate(units):
            for i in unit.entries + (
                [unit.fold] if isinstance(unit, _Group) and unit.fold >= 0 else []
            ):
                made_by[int(E[i, E_OUT])] = u
        self.units = units
        self.made_by = made_by
        # which units read each value (through any view of it)
        self.uses: dict[int, set] = {}
        for u, unit in enumerate(units):
            ents = unit.entries + (
                [unit.fold] if isinstance(unit, _Group) and unit.fold >= 0 else []
            )
            for i in ents:
                for b in self.ins[i]:
                    self.uses.setdefault(int(self.owner[b]), set()).add(u)

    def call_id(self, i):
        """The call a callback entry belongs to."""
        return callbacks.call_id(self.t, i)

    def part(self, i):
        return callbacks.call_part(self.t, i)

    def external(self, o, u):
        """Value ``o`` made by unit ``u`` is read outside it (or is an output)."""
        return o in self.root_owners or o in self.pinned or bool(self.uses.get(o, set()) - {u})


# ---------------------------------------------------------------- code generation


class _Code:
    """One unit's compiled function, with buffers and offsets abstracted: buffers get local
    numbers and offsets come from the parameter row ``P``, so units that differ only in where
    their buffers lie (the steps of a time loop) share one function."""

    def __init__(self, B, sized=False, length=None):
        self.B = B
        self.params: list[int] = []  # the offsets, sizes (or entry index) this unit passes in P
        # a fused loop takes its sizes from P too (see size), a flat one its length from P[0]:
        # loops that differ only in their sizes share one function, in a tape and, by their
        # text, across tapes
        self._sizes: dict[int, int] | None = {} if sized else None
        if length is not None:
            self.size(length)
        self._slot: dict[int, int] = {}
        self._local: dict[int, int] = {}
        self.views: dict[str, str] = {}  # name -> expression, at the top of the function
        self.lines: list[str] = []
        self.rows = None  # (rows, row length): the lines run once per row (see block)
        self._by_row: dict[str, str] = {}  # views the rows run along -> row index (see view)
        self._pre: list[str] = []  # over rows: lines run before the rows (see once)
        self._post: list[str] = []  # ... and after them

    def __call__(self, line, depth=1):
        self.lines.append("    " * depth + line)

    def once(self, line, after=False):
        """A line of the function's top level that runs once, not once per row: a scratch
        array or a sum's start before the rows, the sum's store ``after`` them."""
        if not self.rows:
            self(line)
        else:
            (self._post if after else self._pre).append("    " + line)

    def n(self, b):
        """Local number of buffer ``b``."""
        return self._local.setdefault(int(b), len(self._local))

    def size(self, value):
        """The text of a size ``value`` (a length, a number of rows, a block's): the parameter
        that holds it in a unit that takes its sizes from ``P``, else the literal. Equal sizes
        share a parameter, so two units share code only if their sizes are equal where the
        code relies on it (a view as long as the loop), and the text, read with each unit's
        own row, is that unit's code."""
        if self._sizes is None:
            return str(int(value))
        value = int(value)
        if value not in self._sizes:
            self._sizes[value] = len(self.params)
            self.params.append(value)
        return f"P[{self._sizes[value]}]"

    def p(self, value):
        """The parameter holding ``value`` (an offset or an entry index)."""
        if value not in self._slot:
            self._slot[value] = len(self.params)
            self.params.append(value)
        return f"P[{self._slot[value]}]"

    def view(self, arena, b, kind="full"):
        """The name of buffer ``b``'s view in ``arena``. In a loop over rows, ``kind`` says
        which row of it each row reads (see :meth:`_Plan.fusable`): row ``r`` (``"full"``,
        a buffer as long as the loop), the whole buffer (``"row"``: one row, read by each),
        row ``r % D`` (``("tile", D)``) or row ``r // D`` (``("block", D)``)."""
        name = f"{arena[0]}{_tag(kind)}{self.n(b)}"
        off = self.p(int(self.B[b, B_OFF]))
        self.views[name] = f"{arena}[{off} : {off} + {self.size(self.B[b, B_SIZE])}]"
        if self.rows and kind != "row":
            self._by_row[name] = "r" if kind == "full" else (
                f"(r {'%' if kind[0] == 'tile' else '//'} {self.size(kind[1])})")  # fmt: skip
        return name

    def at(self, arena, b, per_row=False):
        """Element 0 of buffer ``b`` (``per_row``: element ``r``, in a loop over rows)."""
        return f"{arena}[{self.p(int(self.B[b, B_OFF]))}{' + r' if per_row else ''}]"

    def block(self, tail=()):
        """The unit's code, one indent deep: views, then the lines, then ``tail``. Over rows,
        the lines run in a loop over them, with the views that run along the rows cut to the
        row; what runs once (:meth:`once`) goes before and after that loop."""
        if not self.rows:
            out = [f"    {n} = {e}" for n, e in self.views.items()]
            return out + self.lines + [f"    {x}" for x in tail]
        rows, m = self.size(self.rows[0]), self.size(self.rows[1])
        out = [f"    {n}{'_all' if n in self._by_row else ''} = {e}" for n, e in self.views.items()]
        out += self._pre + [f"    for r in range({rows}):"]
        out += [
            f"        {n} = {n}_all[{k} * {m} : {k} * {m} + {m}]" for n, k in self._by_row.items()
        ]
        out += ["    " + x for x in self.lines] + self._post
        return out + [f"    {x}" for x in tail]


def _unit_args(name):
    """The arguments of a fused loop's function: reverse ones also take the adjoint arena and
    whether the leaves' adjoints were zeroed (``zl``: see :meth:`_Gen.first_adds`)."""
    return "entries, bufs, ipool, data, grad, P, zl" if name.startswith("_rev") else (
        "entries, bufs, ipool, data, P")  # fmt: skip


def _rule_aliases(op):
    """``(alias, attribute, rule)`` of each scalar rule of elementwise ``op``: ``_f_exp``,
    ``"fwd"``; ``_r_exp_0``, ``"rev[0]"``."""
    out = [(f"_f_{op.name}", "fwd", op.fwd)]
    return out + [(f"_r_{op.name}_{k}", f"rev[{k}]", r) for k, r in enumerate(op.rev) if r]


def _rule_names(ops):
    """Module-level aliases of the scalar rules the generated loops call; for a rule inlined
    in Numba IR, also ``_o`` + its alias: the rule as a function of its own (see
    :func:`outline_rule`)."""
    lines = []
    for op in sorted({op for op in ops if op.kind != "structural"}, key=lambda op: op.code):
        # the op's fingerprint makes the text (so the module's name and Numba's cache of
        # it) change with the rules compiled in
        fp = importlib.import_module(f"tape.interpreter.generated.ops.{op.name}").FINGERPRINT
        lines.append(f"# {op.name}: rules {fp[:16]}")
        for alias, attr, _ in _rule_aliases(op):
            lines.append(f'{alias} = BY_NAME["{op.name}"].{attr}')
            if alias in _INLINED:
                lines.append(f'_o{alias} = _outline_rule(BY_NAME["{op.name}"].{attr})')
    return lines


_INLINED = frozenset(
    alias
    for op in registry.OPS
    if op.kind != "structural"
    for alias, _, rule in _rule_aliases(op)
    if getattr(rule, "targetoptions", {}).get("inline") == "always"
)
"""Aliases of the rules inlined in Numba IR where they are called (those that call
:mod:`tape.ops.vmath`: ``exp``, ``log``, ``tanh``, ``sigmoid``)."""

_OUTLINED: dict = {}


def outline_rule(rule):
    """``rule``, a scalar rule inlined in Numba IR, compiled as a function of its own, which
    LLVM inlines or calls. Loops shorter than ``_BLOCK_MIN`` (too short to vectorise) and the
    redo functions call these: every call inlined in Numba IR costs the compile time of the
    rule's code again. The LSTM's tape (46,037 entries; loops of 14 elements with 30 calls of
    ``sigmoid``, ``tanh``, ``exp`` or ``log``) compiled in 71 and 77 s with them inlined and in
    59 and 64 s with them called (two alternating runs), its gradient as fast either way."""
    d = _OUTLINED.get(rule)
    if d is None:
        d = _OUTLINED[rule] = njit(**UNCACHED_JIT)(rule.py_func)
    return d


@njit(fastmath={"reassoc"}, **UNIT_JIT)
def sum_reassoc(x):
    """A full sum of a 1-d array, vectorised (added in another order than one by one): the
    generated code's ``_sum_reassoc``."""
    s = 0.0
    for j in range(x.shape[0]):
        s += x[j]
    return s


_RULE_CALL = re.compile(r"\b(_[fr]_[a-z0-9_]+)\(")


def _outline_calls(lines):
    """``lines`` with their calls of rules inlined in Numba IR made to the ``_o`` versions
    (see :func:`outline_rule`)."""

    def sub(m):
        return f"_o{m.group(1)}(" if m.group(1) in _INLINED else m.group(0)

    return [_RULE_CALL.sub(sub, line) for line in lines]


class _Gen:
    """Turns a :class:`_Plan` into unit code (deduplicated) and the tables that run it."""

    def __init__(self, plan: _Plan):
        self.p = plan
        self.custom: dict[int, tuple] = {}  # id(custom op) -> (number, op)
        self.kinds: dict[str, str] = {}  # code text -> its name ("_fwd3")
        self.blocks: dict[str, tuple] = {}  # name -> (description, code lines, inline)
        self.unsized: dict[str, str] = {}  # name -> description without the sizes
        self.jit = "@njit(**UNIT_JIT)"  # the units' and sweeps' decorator (see INLINE_KINDS)
        self.redos: dict[str, str] = {}  # code text -> name of an element loop's redo
        self.redo_src: dict[str, list[str]] = {}  # their functions: name -> lines
        self.leaves_assigned: set[int] = set()  # leaves whose adjoint a unit assigns first

    def add(self, prefix, code, doc, tail=(), inline=False, unsized=None):
        """The name of ``code`` (shared with every identical unit). A fused loop becomes a
        function of its own (LLVM optimises each loop on its own); an entry that calls the
        interpreter's function for its op (``inline``) is that call, in the sweep itself.
        ``unsized``: ``doc`` without the sizes (a unit module's)."""
        lines = code.block(tail)
        text = "\n".join(lines)
        name = self.kinds.get(text)
        if name is None:
            k = sum(n.startswith(prefix) for n in self.blocks)
            name = self.kinds[text] = f"{prefix}{k}"
            self.blocks[name] = (doc, lines, inline)
            self.unsized[name] = unsized or doc
        return name

    def functions(self, names, sized=True):
        """The source of the fused loops ``names`` (and of the redos they call); their
        docstrings with their sizes or not (see :meth:`describe`)."""
        out = []
        for name in names:
            doc, lines, _ = self.blocks[name]
            doc = doc if sized else self.unsized[name]
            out += [self.jit, f"def {name}({_unit_args(name)}):", f'    """{doc}"""']
            out += lines + ["", ""]
        used = set(_REDO.findall("\n".join(out)))
        return [x for r, src in self.redo_src.items() if r in used for x in src] + out

    def shared(self):
        """The fused loops that go to unit modules of their own (see :func:`unit_module`):
        all but custom ops' (which call the tape's own user functions). Not called when the
        units are inlined into the sweeps (see ``INLINE_KINDS``)."""
        return [
            name for name, (_, lines, inline) in self.blocks.items()
            if not inline and not any(_CUSTOM.search(x) or _TAPE_ARRAYS.search(x) for x in lines)
        ]  # fmt: skip

    def unit_source(self, name):
        """The text of the unit module of fused loop ``name``: the loop as the function
        ``unit``, with the scalar rules and redos it calls. It names nothing of the tape
        (offsets and sizes come from ``P``), so every tape that has this loop shares the
        module, its compile and its cache."""
        _, lines, _ = self.blocks[name]
        doc = self.unsized[name]
        text = "\n".join(lines)
        ops = [
            op
            for op in registry.OPS
            if op.kind != "structural"
            and any(re.search(rf"\b(?:_o)?{alias}\(", text) for alias, _, _ in _rule_aliases(op))
        ]
        body = self.functions([name], sized=False)
        head = f"def {name}({_unit_args(name)}):"
        args = "data, grad, P, zl" if name.startswith("_rev") else "data, P"
        body = [f"def unit({args}):" if x == head else x for x in body]
        return "\n".join(
            [
                '"""One fused loop of the compiled tier: GENERATED by tape.compiled. Do not edit.',
                "",
                f'{doc}"""',
                "",
                "import numpy as np",
                "from numba import njit",
                "",
                "from tape.layout.config import UNIT_JIT",
                "from tape.ops.loops import masked as _masked",
                "from tape.compiler.compiled import outline_rule as _outline_rule",
                "from tape.compiler.compiled import sum_reassoc as _sum_reassoc",
                "from tape.ops.registry import BY_NAME",
                "",
                *_rule_names(ops),
                "",
                "",
                *body,
            ]
        )

    # -- operands of a fused entry ----------------------------------------------------
    def operand(self, u, i, k, c, loads, consts):
        """The expression for input ``k`` of entry ``i`` inside group ``u``'s loop."""
        p = self.p
        b = p.ins[i][k]
        o = int(p.owner[b])
        if p.made_by.get(o) == u and p.full(b):  # made earlier in this loop
            return f"v{c.n(o)}"
        kind = p.kind(i, k)
        if kind in ("scalar", "per_row"):
            name = f"c{c.n(b)}"
            consts[name] = c.at("data", b, kind == "per_row")
            return name
        name = f"x{_tag(kind)}{c.n(b)}"
        loads[name] = f"{c.view('data', b, kind)}[j]"
        return name

    def call_args(self, u, i, c, loads, consts):
        return [self.operand(u, i, k, c, loads, consts) for k in range(len(self.p.ins[i]))]

    def stored(self, u, i):
        """The value of entry ``i`` of group ``u`` is written to the arena."""
        p = self.p
        g = p.units[u]
        o = int(p.E[i, E_OUT])
        if p.external(o, u):
            return True
        if g.fold >= 0 and o == int(p.owner[p.ins[g.fold][0]]) and not self.sums_by_blocks(g):
            return True  # summed by a second pass over the arena (long loops sum by blocks)
        cheap = p.ops[i].cheap or self.int_power(i) is not None
        return not cheap and bool(p.emask[i])

    @staticmethod
    def sums_by_blocks(g):
        """Group ``g``'s folded sum is taken block by block with its loop (a long loop, or
        one over rows), not by a second pass over the stored values."""
        return g.n >= _BLOCK_MIN or g.rows > 1

    def int_power(self, i):
        """``k`` when entry ``i`` is ``x ** k`` with ``k`` a recorded constant 2, 3 or 4 (the
        fused code multiplies instead of calling ``pow``), else ``None``."""
        p = self.p
        if p.ops[i] is not POW or p.kind(i, 1) != "scalar":
            return None
        b = p.ins[i][1]
        if p.dyn[int(p.owner[b])]:
            return None
        k = float(p.t.data[int(p.B[b, B_OFF])])
        return int(k) if k in (2.0, 3.0, 4.0) else None

    def vectorises(self, i):
        """Entry ``i``'s rules are plain arithmetic, which LLVM vectorises (a call to ``exp``,
        ``tanh`` or ``pow`` is a call per element: a loop that makes one gains nothing from
        running in blocks, and its vector code costs compile time)."""
        return self.p.ops[i].vectorises or self.int_power(i) is not None

    def value(self, i, args):
        """The expression of entry ``i``'s value from its operands ``args``."""
        k = self.int_power(i)
        if k is None:
            return f"_f_{self.p.ops[i].name}({', '.join(args)})"
        x = args[0]
        return {2: f"{x} * {x}", 3: f"{x} * {x} * {x}", 4: f"({x} * {x}) * ({x} * {x})"}[k]

    def rule(self, i, k, args, v, a):
        """The expression of entry ``i``'s reverse rule for input ``k``."""
        n = self.int_power(i)
        if n is None or k != 0:
            return f"_r_{self.p.ops[i].name}_{k}({', '.join(args)}, {v}, {a})"
        x = args[0]
        return {2: f"{a} * 2.0 * {x}", 3: f"{a} * 3.0 * ({x} * {x})",
                4: f"{a} * 4.0 * ({x} * {x} * {x})"}[n]  # fmt: skip

    def describe(self, g, sized=True):
        """What group ``g``'s loop does; with its sizes (for the tape's module) or not (for
        a unit module, which every tape with the loop shares)."""
        names = ", ".join(self.p.ops[i].name for i in g.entries)
        fold = "; then their sum" if g.fold >= 0 else ""
        if g.fold_rows:
            fold += f" over blocks of {g.fold_rows if sized else 'D'} rows"
        if not sized:
            return f"Fused {names}, {'over rows' if g.rows > 1 else 'flat'}{fold} (sizes: P)."
        over = f"{g.rows} rows of {g.m}" if g.rows > 1 else f"{g.n}"
        return f"Fused {names} over {over} elements{fold}."

    # -- forward ---------------------------------------------------------------------
    def forward(self):
        """Rows ``[function, parameters...]`` of the forward table, and the number of rows
        at its end that the one-call gradient need not run (see :meth:`sum_in_reverse`)."""
        rows, units = [], []
        for u, unit in enumerate(self.p.units):
            if isinstance(unit, _Call) and self.p.ops[unit.entries[0]] is _CALLBACK_OP:
                if self.p.part(unit.entries[0]) == 0:  # the group's first entry runs the call
                    rows.append(self.custom_forward(unit.entries[0]))
            elif isinstance(unit, _Call):
                rows.append(self.forward_call(unit.entries[0]))
            else:
                rows.append(self.forward_group(u, unit))
            units += [u] * (len(rows) - len(units))  # the unit of each row
        tail = 0
        while tail < len(units) and self.sum_in_reverse(units[-1 - tail]):
            tail += 1
        return rows, tail

    def sum_in_reverse(self, u):
        """Unit ``u`` is a long fused loop summed into the output, which nothing else reads,
        and stores no value: its reverse loop, which recomputes every value anyway, also
        sums them (in the same blocks and order as the forward loop, so to the same bits),
        and the one-call gradient skips its forward loop."""
        p = self.p
        g = p.units[u]
        if (
            not isinstance(g, _Group) or g.fold < 0 or g.fold_rows or g.m < _BLOCK_MIN
            or not p.emask[g.fold]
        ):  # fmt: skip
            return False
        o = int(p.E[g.fold, E_OUT])
        if o not in p.root_owners or o in p.pinned or p.uses.get(o):
            return False
        return all(self.vectorises(i) and not self.stored(u, i) for i in g.entries)

    def forward_call(self, i):
        op = self.p.ops[i]
        c = _Code(self.p.B)
        c.p(i)
        doc = f"Entry P[0]: {op.name}{', broadcasting' if op.kind != 'structural' else ''}."
        call = f"st = _S.run_fwd({op.code}, P[0], entries, bufs, ipool, data)  # {op.name}"
        return self.add("_fwd", c, doc, [call], inline=True), c.params

    @staticmethod
    def length(g):
        """The length of group ``g``'s loop if it is flat (it then comes from ``P[0]``), else
        ``None`` (a loop over rows)."""
        return g.m if g.rows == 1 else None

    @staticmethod
    def block_of(c, g):
        """The text of the block length of group ``g``'s loop in blocks: ``_BLOCK``, or the
        loop's length if shorter."""
        return str(_BLOCK) if g.m >= _BLOCK else c.size(g.m)

    def forward_group(self, u, g):
        p = self.p
        c = _Code(p.B, True, self.length(g))
        c.rows = (g.rows, g.m) if g.rows > 1 else None
        body, loads, consts = [], {}, {}
        for i in g.entries:
            o = int(p.E[i, E_OUT])
            args = self.call_args(u, i, c, loads, consts)
            body.append(f"v{c.n(o)} = {self.value(i, args)}")
            if self.stored(u, i):
                body.append(f"{c.view('data', o)}[j] = v{c.n(o)}")
        if g.fold_rows:  # each row added into its block's row of the sum, zeroed first
            src = int(p.owner[p.ins[g.fold][0]])
            out = c.view("data", int(p.E[g.fold, E_OUT]), ("block", g.fold_rows))
            c.once(f"{out}_all[:] = 0.0")
            body.append(f"{out}[j] += v{c.n(src)}")
        for name, expr in consts.items():
            c(f"{name} = {expr}")
        lines = [f"{n} = {e}" for n, e in loads.items()] + body
        if g.fold >= 0 and self.sums_by_blocks(g) and not g.fold_rows:
            self.folded_in_blocks(u, g, c, lines)
        else:
            c(f"for j in range({c.size(g.m)}):")
            for line in lines:
                c(line, 2)
        if g.fold >= 0 and not self.sums_by_blocks(g):
            # a second, vectorised pass over the stored values: twice as fast as adding them up
            # in the loop, where every add waits for the one before
            o = int(p.E[g.fold, E_OUT])
            src = int(p.owner[p.ins[g.fold][0]])
            if g.n <= _SHORT_SUM:
                c("acc = 0.0")
                c(f"for j in range({c.size(g.n)}):")
                c(f"acc += {c.view('data', src)}[j]", 2)
                c(f"{c.at('data', o)} = acc")
            else:
                c(f"{c.at('data', o)} = _sum_reassoc({c.view('data', src)})")
        if g.m < _BLOCK_MIN:
            c.lines = _outline_calls(c.lines)
        return self.add("_fwd", c, self.describe(g), unsized=self.describe(g, False)), c.params

    def folded_in_blocks(self, u, g, c, lines):
        """A long forward loop whose full sum is taken with it: block by block, each block's
        values summed (vectorised) while they are in the L1 cache. The summed value goes to a
        scratch block, not the arena, unless something else reads it there."""
        p = self.p
        o = int(p.E[g.fold, E_OUT])
        src = int(p.owner[p.ins[g.fold][0]])
        stored = any(self.stored(u, i) for i in g.entries if int(p.E[i, E_OUT]) == src)
        blk, n = self.block_of(c, g), c.size(g.m)
        if not stored:
            lines = lines + [f"bs[jj] = v{c.n(src)}"]
            c.once(f"bs = np.empty({blk})")
        used = sorted({m for line in lines for m in _AT_J.findall(line)})
        lines = [_AT_J.sub(r"\1_[jj]", x) for x in lines]
        c.once("acc = 0.0")
        c(f"for j0 in range(0, {n}, {blk}):")
        c(f"m = min({blk}, {n} - j0)", 2)
        for name in used:
            c(f"{name}_ = {name}[j0 : j0 + m]", 2)
        c("for jj in range(m):", 2)
        for line in lines:
            c(line, 3)
        c(f"acc += _sum_reassoc({c.view('data', src) + '_' if stored else 'bs[:m]'})", 2)
        c.once(f"{c.at('data', o)} = acc", after=True)

    # -- reverse ---------------------------------------------------------------------
    def reverse(self):
        """Rows of the reverse table (in the order they run), and the intermediates whose
        adjoint a fused loop assigns first (they need no zeroing)."""
        p = self.p
        rows = []
        assigned: set[int] = set()
        touched = set(p.root_owners)  # adjoint memory written so far, in reverse order
        aliased = {int(p.owner[b]) for b in range(len(p.B)) if p.B[b, B_ALIAS] >= 0}
        for u in range(len(p.units) - 1, -1, -1):
            unit = p.units[u]
            if isinstance(unit, _Call) and p.ops[unit.entries[0]] is _CALLBACK_OP:
                i = unit.entries[0]
                if p.part(i) == 0 and p.emask[i]:
                    rows.append(self.custom_reverse(i))
                    call = p.t.callbacks[p.call_id(i)]
                    touched.update(int(p.owner[b]) for b in call.ins)
            elif isinstance(unit, _Call):
                i = unit.entries[0]
                if p.emask[i]:
                    rows.append(self.reverse_call(i))
                    touched.update(int(p.owner[b]) for b in p.ins[i])
            elif any(p.emask[i] for i in unit.entries):
                rows.append(self.reverse_group(u, unit, touched, assigned, aliased))
        return rows, assigned

    def reverse_call(self, i):
        op = self.p.ops[i]
        c = _Code(self.p.B)
        c.p(i)
        call = f"_S.run_rev({op.code}, P[0], entries, bufs, ipool, data, grad)  # {op.name}"
        return self.add(
            "_rev", c, f"Entry P[0]: {op.name} (reverse).", [call], inline=True
        ), c.params

    # -- custom ops ------------------------------------------------------------------
    def custom_name(self, i):
        """The module-level names of the call's functions (``_u<k>_fwd``, ``_u<k>_vjp``)."""
        fn = self.p.t.callbacks[self.p.call_id(i)].fn
        k = self.custom.setdefault(id(fn), (len(self.custom), fn))[0]
        return f"_u{k}"

    def _custom_args(self, c, call):
        return [
            f"{c.view('data', b)}.reshape({tuple(s)!r})" for b, s in zip(call.ins, call.in_shapes)
        ]

    def custom_forward(self, i):
        call = self.p.t.callbacks[self.p.call_id(i)]
        u = self.custom_name(i)
        c = _Code(self.p.B)
        args = self._custom_args(c, call)
        c(f"_c_store({c.view('data', call.outs[0])}, {u}_fwd({', '.join(args)}))")
        return self.add("_fwd", c, f"{call.fn.name} (custom op)."), c.params

    def custom_reverse(self, i):
        p = self.p
        call = p.t.callbacks[p.call_id(i)]
        u = self.custom_name(i)
        c = _Code(p.B)
        args = self._custom_args(c, call)
        o = call.outs[0]
        shape = tuple(call.out_shapes[0])
        gy, y = f"{c.view('grad', o)}.reshape({shape!r})", f"{c.view('data', o)}.reshape({shape!r})"
        c(f"gs = _c_as_tuple({u}_vjp({gy}, {y}, {', '.join(args)}))")
        c(f"_c_check(gs, {len(call.ins)})")
        for k, b in enumerate(call.ins):
            if p.B[b, B_KIND] != CONST and p.rneed[int(p.owner[b])]:
                c(f"_c_add({c.view('grad', b)}, gs[{k}])")
        return self.add("_rev", c, f"{call.fn.name} (custom op, reverse)."), c.params

    def outline_redo(self, loads, consts, vals, adj, targets, slow):
        """The line that redoes an element of an element loop: a call to a function of its
        own (``_redo``, shared by identical ones), never inlined. Written in the loop, the
        rarely run redo doubles the loop's code and slows the sweep of a small tape
        (``benchmarks/MEASURED.md``)."""
        names, args, body = _outlined(loads, consts, vals, adj, targets, slow)
        body = _outline_calls(body)  # rarely run: a call costs nothing here
        text = "\n".join([", ".join(names)] + body)
        name = self.redos.get(text)
        if name is None:
            # named by its text, so that a unit that calls it reads the same in every tape
            name = self.redos[text] = "_redo_" + hashlib.sha256(text.encode()).hexdigest()[:12]
            self.redo_src[name] = [
                "@njit(**UNIT_JIT)",
                f"def {name}({', '.join(names)}):",
                '    """An element with NaN in its adjoints, redone with the selects."""',
            ] + ["    " + line for line in body] + ["", ""]  # fmt: skip
        return f"{', '.join(targets)} = {name}({', '.join(args)})"

    def shifted_adds(self, c, full, out, n):
        """A flat block loop's adds into views of one buffer at nearby offsets (``x[1:]`` and
        ``x[:-1]`` of one leaf), merged into one pass over the lowest view: ``(out, shift,
        tails)``. The contribution to a view ``d`` elements further on is kept in its scratch
        array ``d`` places further on (``shift``: name -> ``d``), so that index ``jj`` of every
        scratch array is one element of the buffer; the last ``d`` of a block go to the next
        block's pass, and those of the last block to the buffer by the lines in ``tails``.
        One pass for all views is faster than a pass per view (``benchmarks/MEASURED.md``)."""
        p, B = self.p, self.p.B
        groups: dict[int, list] = {}
        for view, op, names in out:
            b, kind = full[names[0]]
            if op == "+=" and kind == "full":
                groups.setdefault(int(p.owner[b]), []).append((int(B[b, B_OFF]), view, names[0]))
        shift, tails, into = {}, [], {}  # into: view -> the lowest view of its group
        for o, views in groups.items():
            views.sort()
            low, lowest = views[0][0], views[0][1]
            if len(views) < 2 or views[-1][0] - low > _SHIFT_MAX:
                continue
            for off, view, name in views:
                into[view] = lowest
                if off > low:
                    shift[name] = off - low
                    at = f"{c.view('grad', o)}[{low - int(B[o, B_OFF])} + {c.size(n)} + i]"
                    tails += [f"for i in range({off - low}):", f"    {at} += b{name}[i]"]
        merged = {}
        for view, op, names in out:
            merged.setdefault(into.get(view, view), (op, []))[1].extend(names)
        return [(v, op, names) for v, (op, names) in merged.items()], shift, tails

    def first_adds(self, c, u, g, blocks, full, out, shift, tails, touched, assigned, aliased):
        """``(out, tails)`` with the adds that are an adjoint's first contribution made
        assignments, so that its zeroing goes: where this loop's views of one buffer (one view,
        or views a few elements apart merged by :meth:`shifted_adds`) cover the whole buffer
        and no unit that runs earlier in the reverse sweep wrote its adjoint (``touched``). An
        intermediate's adjoint is then assigned (``"="``, and it joins ``assigned``); a leaf's
        is assigned where the leaves' adjoints are zeroed (``"=?"``: in a gradient, not in a
        ``backward`` that accumulates into them), and leaves the zeroing of the leaves
        (``leaves_assigned``). Only a flat block loop assigns a leaf's adjoint: its adds are
        loops of their own, one per ``zl``. Assigning beats zeroing and adding
        (``benchmarks/MEASURED.md``)."""
        p, B = self.p, self.p.B
        flat = not c.rows
        owners = [int(p.owner[full[names[0]][0]]) for _, _, names in out]
        res, zero = [], []
        for (view, op, names), o in zip(out, owners):
            b, kind = full[names[0]]
            d = max(shift.get(n, 0) for n in names)
            covers = (
                op == "+=" and kind == "full" and o not in touched and owners.count(o) == 1
                and p.made_by.get(o) != u and int(B[b, B_OFF]) == int(B[o, B_OFF])
                and g.n + d == int(B[o, B_SIZE])
                and (flat or (b == o and o not in aliased))
            )  # fmt: skip
            if covers and B[o, B_KIND] == ACTIVE:
                assigned.add(o)
                op = "="
            elif covers and B[o, B_KIND] == LEAF and flat and blocks:
                self.leaves_assigned.add(o)
                op = "=?"
            if op != "+=" and d:  # the tails add to the last d elements: zero them first
                at = f"{c.view('grad', o)}[{c.size(g.n)} + i]"
                zero += ([f"for i in range({d}):", f"    {at} = 0.0"] if op == "=" else
                         ["if zl:", f"    for i in range({d}):", f"        {at} = 0.0"])  # fmt: skip
            res.append((view, op, names))
        return res, zero + tails

    def reverse_group(self, u, g, touched, assigned, aliased):
        p = self.p
        B = p.B
        c = _Code(B, True, self.length(g))
        c.rows = (g.rows, g.m) if g.rows > 1 else None
        loads, consts = {}, {}
        vals, adj, fast, slow = [], [], [], []
        # adjoint of a broadcast input: summed over the loop (over the row: per_row)
        scalar: dict[str, tuple[int, bool]] = {}  # name -> (buffer, per_row)
        full: dict[str, tuple[int, object]] = {}  # read elementwise: name -> (buffer, kind)
        for i in g.entries:
            o = int(p.E[i, E_OUT])
            args = self.call_args(u, i, c, loads, consts)
            if self.stored(u, i):
                loads[f"v{c.n(o)}"] = f"{c.view('data', o)}[j]"
            else:
                vals.append(f"v{c.n(o)} = {self.value(i, args)}")
            if p.emask[i]:
                init = f"{c.view('grad', o)}[j]" if p.external(o, u) else "0.0"
                adj.append(f"a{c.n(o)} = {init}")
        if g.fold >= 0 and p.emask[g.fold]:
            src = int(p.owner[p.ins[g.fold][0]])
            so = int(p.E[g.fold, E_OUT])
            if g.fold_rows:  # the adjoint of the row's block of the sum
                loads[f"y{c.n(so)}"] = f"{c.view('grad', so, ('block', g.fold_rows))}[j]"
                adj.append(f"a{c.n(src)} += y{c.n(so)}")
            else:
                consts["gs"] = c.at("grad", so)
                adj.append(f"a{c.n(src)} += gs")
        for i in reversed(g.entries):
            if not p.emask[i]:
                continue
            op = p.ops[i]
            o = c.n(int(p.E[i, E_OUT]))
            args = self.call_args(u, i, c, loads, consts)
            for k, b in enumerate(p.ins[i]):
                if not op.differentiable[k] or B[b, B_KIND] == CONST:
                    continue
                rule = self.rule(i, k, args, f"v{o}", f"a{o}")
                ob = int(p.owner[b])
                if p.made_by.get(ob) == u and p.full(b):
                    target = f"a{c.n(ob)}"
                elif (kind := p.kind(i, k)) in ("scalar", "per_row"):
                    target = f"t{c.n(b)}"
                    scalar[target] = (b, kind == "per_row")
                else:
                    target = f"e{_tag(kind)}{c.n(b)}"
                    full[target] = (b, kind)
                fast.append(f"{target} += {rule}")
                slow.append(f"{target} += _masked({rule}, a{o})")
        # (adjoint view, "+=", "=" or "=?" (= where the leaves are zeroed), [contribution])
        out = [(c.view("grad", b, kind), "+=", [name]) for name, (b, kind) in full.items()]
        shift, tails = {}, []
        blocks = g.m >= _BLOCK_MIN and all(self.vectorises(i) for i in g.entries)
        if blocks and not c.rows:
            out, shift, tails = self.shifted_adds(c, full, out, g.m)
        out, tails = self.first_adds(c, u, g, blocks, full, out, shift, tails, touched,
                                     assigned, aliased)  # fmt: skip
        for b, _ in list(full.values()) + list(scalar.values()):
            touched.add(int(p.owner[b]))
        for name in scalar:
            c(f"s{name[1:]} = 0.0")
        for name, expr in consts.items():
            c(f"{name} = {expr}")
        targets = list(full) + list(scalar)
        pre = [f"{n} = {e}" for n, e in loads.items()] + vals
        main = pre + adj + [f"{n} = 0.0" for n in targets] + fast
        redo = adj + [f"{n} = 0.0" for n in targets] + slow  # after pre
        # A rule's value where the output adjoint is zero is discarded, not added: 0 * inf
        # there (where(x > 0, sqrt(x), 0) at 0) would be a NaN. Without the selects the loop
        # is faster and gives the same numbers unless such a NaN appeared, and any such NaN
        # reaches an input's adjoint: then the element is redone with them.
        if not blocks:
            call = self.outline_redo(loads, consts, vals, adj, targets, slow)
            _element_loop(c, c.size(g.m), targets, main, [call], out, scalar)
        else:
            fold = None
            if self.sum_in_reverse(u):
                fold = (f"v{c.n(int(p.owner[p.ins[g.fold][0]]))}",
                        c.at("data", int(p.E[g.fold, E_OUT])))  # fmt: skip
            _block_loop(c, g, targets, pre, main, redo, out, scalar, fold, shift, tails)
        for name, (b, per_row) in scalar.items():
            c(f"{c.at('grad', b, per_row)} += s{name[1:]}")
        if g.m < _BLOCK_MIN:
            c.lines = _outline_calls(c.lines)
        doc, unsized = (self.describe(g, k)[:-1] + " (reverse)." for k in (True, False))
        return self.add("_rev", c, doc, unsized=unsized), c.params


def _outlined(loads, consts, vals, adj, targets, slow):
    """``(parameters, arguments, body)`` of a function that redoes one element of an element
    loop with the selects: it takes the element's loads, constants and values, and the
    adjoints that start from the arena (their values, read by the caller), and returns the
    targets."""
    names = list(loads) + list(consts) + [v.split(" = ")[0] for v in vals]
    args = list(names)
    body = []
    for line in adj:
        name, op, init = line.split(" ", 2)
        if op == "=" and init != "0.0":  # a3 = g3[j]: an adjoint the arena holds
            names.append(name)
            args.append(init)
        else:
            body.append(line)
    body += [f"{t} = 0.0" for t in targets] + slow
    return names, args, body + [f"return {', '.join(targets)}"]


def _element_loop(c, n, targets, main, redo, out, scalar):
    """A short fused reverse loop, element by element, adding to the adjoint arenas as it goes
    (no scratch to allocate). ``redo``: the lines that redo an element with NaN."""
    c(f"for j in range({n}):")
    for line in main:
        c(line, 2)
    c(f"if {' or '.join(f'{t} != {t}' for t in targets)}:", 2)
    for line in redo:
        c(line, 3)
    for view, op, (name,) in out:
        c(f"{view}[j] {op} {name}", 2)
    for name in scalar:
        c(f"s{name[1:]} += {name}", 2)


def _block_loop(c, g, targets, pre, main, redo, out, scalar, fold=None, shift=None, tails=()):
    """A fused reverse loop in blocks of ``_BLOCK`` elements: the loop over a block computes
    the inputs' adjoint contributions into scratch arrays (one per input, in the L1 cache), and
    the adds into the adjoint arenas follow in loops of their own (one per view, or per group
    of views of one buffer: ``shift`` and ``tails``, see :meth:`_Gen.shifted_adds`). With no
    store that may alias a load (``x[1:]`` and ``x[:-1]`` add to the same leaf) and no branch
    (the NaN test is an OR over the block), the main loop vectorises."""
    blk, n = _Gen.block_of(c, g), c.size(g.m)
    shift = shift or {}
    at = {t: f"b{t}[jj + {shift[t]}]" if t in shift else f"b{t}[jj]" for t in targets}
    keep = [f"{at[t]} = {t}" for t in targets]
    if fold is not None:  # (value summed, where the sum goes): as the forward loop sums
        keep.append(f"bs[jj] = {fold[0]}")
        c.once(f"bs = np.empty({blk})")
        c.once("acc = 0.0")
    redo = pre + redo  # the element's values again: the block loop kept only its results
    adds = [
        (f"{view}[j] {{}} {' + '.join(f'b{t}[jj]' for t in names)}", op) for view, op, names in out
    ]  # "{}": the operator, "=" or "+=" (both for "=?")
    # element j of a view is element jj of the view's block: indexed by a range variable
    # (never negative, so no wraparound test) the loads and stores vectorise
    used = sorted({m for line in main + redo + [a for a, _ in adds] for m in _AT_J.findall(line)})
    main, redo = ([_AT_J.sub(r"\1_[jj]", x) for x in xs] for xs in (main, redo))
    adds = [(_AT_J.sub(r"\1_[jj]", a), op) for a, op in adds]
    for t in targets:
        # a shifted one's first places hold the previous block's last contributions
        c.once(f"b{t} = np.zeros({blk} + {shift[t]})" if t in shift else f"b{t} = np.empty({blk})")
    c(f"for j0 in range(0, {n}, {blk}):")
    c(f"m = min({blk}, {n} - j0)", 2)
    for name in used:
        c(f"{name}_ = {name}[j0 : j0 + m]", 2)
    c("bad = False", 2)
    c("for jj in range(m):", 2)
    for line in main + keep:
        c(line, 3)
    c(f"bad |= {' | '.join(f'({t} != {t})' for t in targets)}", 3)
    c("if bad:", 2)
    c("for jj in range(m):", 3)
    c(f"if {' or '.join(f'{at[t]} != {at[t]}' for t in targets)}:", 4)
    for line in redo + keep:
        c(line, 5)
    for line, op in adds:
        if op == "=?":  # assigned where the leaves were zeroed (zl), added to otherwise
            c("if zl:", 2)
            c("for jj in range(m):", 3)
            c(line.format("="), 4)
            c("else:", 2)
            c("for jj in range(m):", 3)
            c(line.format("+="), 4)
        else:
            c("for jj in range(m):", 2)
            c(line.format(op), 3)
    for t, d in shift.items():  # forward copy: element m + i is read before it is written
        c(f"for i in range({d}):", 2)
        c(f"b{t}[i] = b{t}[m + i]", 3)
    for name in scalar:
        c(f"s{name[1:]} += _sum_reassoc(b{name}[:m])", 2)
    if fold is not None:
        c("acc += _sum_reassoc(bs[:m])", 2)
        c.once(f"{fold[1]} = acc", after=True)
    for line in tails:
        c(line)


def _gradient_args(t, B, n_ints, tables_read, n_run):
    """``gradient_args``: :meth:`Tape.gradient`'s whole call in one compiled function (load
    the arguments at their offsets, then what ``forward_backward`` does), so a replay from
    Python pays one dispatch, with few array arguments (each adds to the call's cost): the
    tape's integer arrays as one (``ints``, made by :meth:`tape.Tape.compile`) and its value and adjoint
    arenas as one (``arena``: ``data`` then ``grad``). The arguments' shapes and dtypes are the
    caller's to check. Without ``tables_read`` (the sweeps are inlined and no unit reads the
    entry or buffer table) the two tables are not made: each ``reshape`` calls into Numba's C
    helpers, a large share of a small tape's whole sweep (``benchmarks/MEASURED.md``)."""
    xs = [f"x{k}" for k in range(len(t.inputs))]
    we, wb = t.entries.shape[1], t.bufs.shape[1]
    ne, nb, nd = t.n_entries * we, t.n_bufs * wb, t.n_data
    if not tables_read:
        tables = ["    entries = bufs = ints  # unread: the inlined units take them, unused"]
    else:
        tables = [
            f"    entries = _S.table2d(ints[0 : {ne}], {t.n_entries}, {we})",
            f"    bufs = _S.table2d(ints[{ne} : {ne + nb}], {t.n_bufs}, {wb})",
        ]
    out = [
        "@njit(**COMPILED_JIT)",
        f"def gradient_args(ints, arena, {', '.join(xs)}):",
        '    """Load the arguments (of the recorded shapes, any layout), zero the leaf',
        "    adjoints, replay forward and backward. Returns the forward status (``-1``: done;",
        '    otherwise the gradients are untouched)."""',
        f"    if ints.shape[0] != {n_ints} or arena.shape[0] != {2 * nd}:",
        f"        raise ValueError({STALE_POOL!r})",
        *tables,
        f"    ipool = ints[{ne + nb} :]",
        f"    data = arena[0 : {nd}]",
        f"    grad = arena[{nd} :]",
    ]
    for x, b in zip(xs, t.inputs):
        off, size = int(B[b, B_OFF]), int(B[b, B_SIZE])
        if B[b, B_NDIM] == 1:  # element by element: no view to make, and it vectorises
            out += [f"    for j in range({size}):", f"        data[{off} + j] = {x}[j]"]
        else:  # a loop, not a slice assignment (whose shape check takes 2 s to compile)
            out += [
                f"    {x}f = {x}.ravel()",
                f"    for j in range({size}):",
                f"        data[{off} + j] = {x}f[j]",
            ]
    out += [
        f"    st = _forward_units(entries, bufs, ipool, data, {n_run})",
        "    if st >= 0:",
        "        return st",
        "    _zero_adjoints(ipool, grad, True)",
        f"    grad[{int(B[t.outputs[0], B_OFF])}] += 1.0",
        "    _reverse_units(entries, bufs, ipool, data, grad, True)",
        "    return -1",
        "",
        "",
    ]
    return out


def _zeroing(ranges, table, depth):
    """Lines that zero the adjoint ranges ``ranges``: one loop over each when there are few
    (constants: no table to read), else a loop over their ``table`` in the pool (``(flat
    slice, rows, 2)``)."""
    pad = "    " * depth
    if len(ranges) <= _FEW_RANGES:
        out = [f"{pad}for j in range({a}, {z}):\n{pad}    grad[j] = 0.0" for a, z in ranges]
        return out or [f"{pad}pass"]
    flat, rows, _ = table
    return [
        f"{pad}Z = {flat}",
        f"{pad}for r in range({rows}):",
        f"{pad}    grad[Z[2 * r] : Z[2 * r + 1]] = 0.0",
    ]


def _ranges(B, bufs):
    """Merged ``[start, stop)`` arena ranges covering the buffers ``bufs``, as an array."""
    spans = sorted((int(B[b, B_OFF]), int(B[b, B_OFF] + B[b, B_SIZE])) for b in bufs)
    out: list[list[int]] = []
    for a, z in spans:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], z)
        else:
            out.append([a, z])
    return np.array([(a, z) for a, z in out if z > a], np.int64).reshape(-1, 2)


def _table(rows, names, shared=()):
    """``rows`` (function name, parameters) as an int64 array ``[function number, P...]``; a
    loop of a unit module (in ``shared``) numbered ``-1 - k`` for the ``k``-th of them, until
    :func:`compile_tape` puts the loop's id in the unit table there (as ``-id``). ``names``
    ``None``: every other row is an interpreter entry, ``0`` (the shared runtime's tables)."""
    width = 1 + max((len(ps) for _, ps in rows), default=0)
    t = np.zeros((len(rows), width), np.int64)
    for r, (name, ps) in enumerate(rows):
        if name in shared:
            t[r, 0] = -1 - shared.index(name)
        elif names is not None:
            t[r, 0] = names.index(name)
        t[r, 1 : 1 + len(ps)] = ps
    return t


def _dispatch(table, names, blocks, status, count=None, shared=()):
    """The loop over a table (``(flat slice of the pool, rows, width)``) that runs each row's
    unit (the first ``count``, an expression, if given): one dispatch per unit. The loops of
    unit modules (``shared``) are called through the unit table (:mod:`tape.interpreter.dispatch`): the
    tape's code does not compile them in."""
    flat, rows, w = table  # row u: the unit's kind, then its parameters
    lines = [f"    T = {flat}", f"    for u in range({count or rows}):", f"        k = T[u * {w}]",
             f"        P = T[u * {w} + 1 : u * {w} + {w}]"]  # fmt: skip
    if status:
        lines.append("        st = -1")
    first = True
    if any(name in shared for name in names):
        rev = not status
        call, args = ("_call_unit_rev", "data, grad, P, zl") if rev else (
            "_call_unit_fwd", "data, P")  # fmt: skip
        lines += [
            "        if k < 0:  # a fused loop of a unit module, through the unit table",
            f"            {call}(_unit_address(-k, data), ({args}))",
        ]
        first = False
    for k, name in enumerate(names):
        if name in shared:
            continue
        doc, block, inline = blocks[name]
        lines += [f"        {'if' if first else 'elif'} k == {k}:  # {doc}"]
        first = False
        if inline:
            lines += ["        " + line for line in block]
        else:
            lines += [f"            {name}({_unit_args(name)})"]
    if status and names:
        lines += ["        if st >= 0:", "            return st"]
    return lines


def generate(t):
    """The source of the compiled module for tape ``t`` (see the module docstring), the
    integer pool its sweeps take (the tape's, with the unit tables appended), the globals to
    set on the module (custom ops' functions), the sources of its unit modules (name in
    the module -> text; see :func:`unit_module`) and the pool cells that name them (``(index,
    name, reverse)``: :func:`compile_tape` puts the loops' ids there)."""
    if not t.inputs and not t.outputs:
        raise CompileError("only tapes made by tape.record() can be compiled")
    plan = _Plan(t)
    gen = _Gen(plan)
    frows, tail = gen.forward()
    rrows, assigned = gen.reverse()
    if len(gen.blocks) > MAX_UNIT_KINDS:
        raise CompileError(
            f"this tape needs {len(gen.blocks)} distinct kinds of unit; the compiled tier "
            f"compiles at most {MAX_UNIT_KINDS} (tape.compiled.MAX_UNIT_KINDS): Numba's compile "
            "time grows with them. It stays on the interpreter."
        )
    B = plan.B
    # adjoint memory the reverse units read or add to: zeroed first, unless assigned first
    in_regs = {
        o for o, u in plan.made_by.items()
        if isinstance(plan.units[u], _Group) and not plan.external(o, u)
    }  # fmt: skip
    zero = [
        o for o in range(len(B))
        if plan.rneed[o] and B[o, B_ALIAS] < 0 and B[o, B_KIND] == ACTIVE
        and o not in in_regs and o not in assigned
    ]  # fmt: skip
    leaves = [
        o for o in range(len(B)) if plan.rneed[o] and B[o, B_ALIAS] < 0 and B[o, B_KIND] == LEAF
        and o not in gen.leaves_assigned
    ]  # fmt: skip
    shareable = gen.shared()
    if all(inline or name in shareable for name, (_, _, inline) in gen.blocks.items()):
        # fused loops of unit modules and interpreter entries only: the shared runtime
        pool, cells, calls = _generic_tables(t, plan, gen, frows, rrows, tail, zero, leaves,
                                             shareable)  # fmt: skip
        units = {name: gen.unit_source(name) for name in shareable}
        listing = _listing(t, plan, gen, frows, rrows, tail, units,
                           _ranges(B, zero), _ranges(B, leaves))  # fmt: skip
        return Generated(listing, pool, {}, units, cells, calls)
    inlined = len(gen.blocks) <= INLINE_KINDS
    if inlined:
        gen.jit = "@njit(inline='always', **UNIT_JIT)"
    fnames = list(dict.fromkeys(n for n, _ in frows))
    rnames = list(dict.fromkeys(n for n, _ in rrows))
    shared = [] if inlined else gen.shared()
    tables = dict(
        fwd=_table(frows, fnames, shared), rev=_table(rrows, rnames, shared),
        zero=_ranges(B, zero), leaves=_ranges(B, leaves),
    )  # fmt: skip
    # the tables travel appended to the integer pool (its first n_ipool ints are the tape's
    # own): global arrays would be frozen into the code, and large ones make it uncacheable
    at, pos = {}, t.n_ipool
    for k, a in tables.items():
        # flat, read row by row: a reshape costs a call into Numba's C helpers per sweep
        at[k] = (f"ipool[{pos} : {pos + a.size}]", a.shape[0], a.shape[1])
        pos += a.size
    pool = np.concatenate([t.ipool[: t.n_ipool]] + [a.ravel() for a in tables.values()])
    # the pool cells that name a unit module's loop: (index, loop, reverse)
    cells, pos = [], t.n_ipool
    for k in ("fwd", "rev"):
        a = tables[k]
        cells += [(pos + r * a.shape[1], shared[-1 - int(a[r, 0])], k == "rev")
                  for r in range(a.shape[0]) if a[r, 0] < 0]  # fmt: skip
        pos += a.size
    n_ent = t.n_entries
    src = [
        *_summary(t, plan, frows, rrows),
        "The tables that say which kind each unit is and where its buffers lie are appended",
        'to the integer pool the sweeps get (``t.kernel_args().ipool``)."""',
        "",
        f'SWEEPS = "{_S.FINGERPRINT}"  # the interpreter whose run_fwd / run_rev it calls',
        "",
        "import numpy as np",
        "from numba import njit, prange",
        "",
        "from tape.layout.config import COMPILED_JIT, SWEEP_JIT, UNIT_JIT",
        "from tape.interpreter.generated import sweeps as _S",
        "from tape.ops.loops import masked as _masked",
        "from tape.compiler.compiled import outline_rule as _outline_rule",
        "from tape.compiler.compiled import sum_reassoc as _sum_reassoc",
        "from tape.ops.registry import BY_NAME",
    ]
    if shared:
        src += [
            "from tape.interpreter.dispatch import call_unit_fwd as _call_unit_fwd",
            "from tape.interpreter.dispatch import call_unit_rev as _call_unit_rev",
            "from tape.interpreter.dispatch import unit_address as _unit_address",
        ]
    if gen.custom:
        src += [
            "from tape.compiler.custom_calls import add as _c_add, as_tuple as _c_as_tuple",
            "from tape.compiler.custom_calls import check as _c_check, store as _c_store",
            "",
        ]
        src += [f"# {k} = user functions {fn.name!r} (set on loading; source {_source_key(fn)})"
                for k, fn in _custom_globals(gen)]  # fmt: skip
    src += [""]
    src += _rule_names(plan.ops[i] for i in plan.live) + ["", ""]
    units = {name: gen.unit_source(name) for name in shared}
    if units:
        src += ["# the fused loops in unit modules of their own, called through the unit table"]
        src += [
            "# (tape.interpreter.dispatch.register_unit puts them there; their ids are in the pool)"
        ]
        src += [f"# {name} = {_module_name(text, 'tape_unit')}.unit: {gen.blocks[name][0]}"
                for name, text in units.items()]  # fmt: skip
        src += ["", ""]
    src += gen.functions([n for n, b in gen.blocks.items() if not b[2] and n not in units])
    src += [
        # not inlined itself: the batched replay calls it inside a prange loop, which Numba
        # runs serially if the loop body has more than one exit
        "@njit(**COMPILED_JIT)",
        "def forward_sweep(entries, bufs, ipool, data, start, stop):",
        f'    """The whole tape (``start`` and ``stop`` must be 0 and {n_ent}: a part of it, as',
        "    when resuming after a guard, runs on the interpreter). Writes ``data``; returns",
        '    the status (``-1``, or the entry that stopped the sweep)."""',
        f"    if ipool.shape[0] != {pool.shape[0]}:",
        f"        raise ValueError({STALE_POOL!r})",
        f"    return _forward_units(entries, bufs, ipool, data, {len(frows)})",
        "",
        "",
        gen.jit,
        "def _forward_units(entries, bufs, ipool, data, n_units):",
        '    """The first ``n_units`` forward units, in order. Returns the status."""',
    ]
    src += _dispatch(at["fwd"], fnames, gen.blocks, True, "n_units", shared)
    src += ["    return -1", "", ""]
    src += [
        "@njit(**COMPILED_JIT)",
        "def reach(entries, bufs, n_entries, roots):",
        '    """Unused masks: the reverse pass below knows what the outputs depend on."""',
        "    return np.zeros(0, np.bool_), np.zeros(0, np.bool_)",
        "",
        "",
        "@njit(**COMPILED_JIT)",
        "def reverse_pass(",
        "    entries, bufs, ipool, data, grad, n_entries, n_bufs, emask, need, roots, seeds, zero_leaves",
        "):",
        '    """Zero the adjoints that are accumulated (the leaves\' too if ``zero_leaves``), add',
        '    ``seeds`` at the outputs and sweep back. Writes ``grad``."""',
        f"    if ipool.shape[0] != {pool.shape[0]}:",
        f"        raise ValueError({STALE_POOL!r})",
    ]
    src += ["    _zero_adjoints(ipool, grad, zero_leaves)"]
    s = 0
    for r in t.outputs:
        off, size = int(B[r, B_OFF]), int(B[r, B_SIZE])
        src += [f"    for j in range({size}):", f"        grad[{off} + j] += seeds[{s} + j]"]
        s += size
    src += ["    _reverse_units(entries, bufs, ipool, data, grad, zero_leaves)", "", ""]
    src += [
        gen.jit,
        "def _zero_adjoints(ipool, grad, zero_leaves):",
        '    """Zero the adjoints that are accumulated (the leaves\' too if ``zero_leaves``)."""',
    ]
    src += _zeroing(tables["zero"], at["zero"], 1)
    src += ["    if zero_leaves:"] + _zeroing(tables["leaves"], at["leaves"], 2) + ["", ""]
    src += [
        gen.jit,
        "def _reverse_units(entries, bufs, ipool, data, grad, zl):",
        '    """The reverse units, last first (adjoints zeroed and seeded; the leaves\' too if',
        '    ``zl``: the units assign the leaves\' adjoints they write first)."""',
    ]
    src += _dispatch(at["rev"], rnames, gen.blocks, False, shared=shared)
    src += ["    return", "", ""]
    if s == 1:
        n_ints = t.n_entries * t.entries.shape[1] + t.n_bufs * t.bufs.shape[1] + pool.shape[0]
        reads = any(_TABLES.search(line) for _, lines, _ in gen.blocks.values() for line in lines)
        src += _gradient_args(t, B, n_ints, reads or not inlined, len(frows) - tail)
    from tape.interpreter.codegen import drivers_text

    src.append(drivers_text(shared_only=True))
    text = "\n".join(src)
    calls = sorted(
        {(0, int(c)) for c in re.findall(r"_S\.run_fwd\((\d+)", text)}
        | {(1, int(c)) for c in re.findall(r"_S\.run_rev\((\d+)", text)}
    )
    src += [
        "",
        "",
        f"TABLE_CALLS = {tuple(calls)!r}",
        '"""(sweep kind, op code) of the interpreter kernels this module calls through the',
        'dispatch table (tape.interpreter.dispatch.prepare puts them there first)."""',
    ]
    extra = {}
    for k, fn in _custom_globals(gen):
        extra[f"{k}_fwd"], extra[f"{k}_vjp"] = fn.fwd, fn.vjp
    return Generated("\n".join(src), pool, extra, units, cells, None)


class Generated(NamedTuple):
    """What :func:`generate` makes of a tape."""

    source: str
    """The tape's own module, or (``table_calls`` not ``None``) the listing of a tape that
    the shared runtime replays."""
    pool: np.ndarray
    """The integer pool its sweeps take: the tape's, with its tables appended."""
    extra: dict
    """Globals to set on the tape's module (custom ops' functions)."""
    units: dict
    """The sources of its unit modules (name in the listing -> text; :func:`unit_module`)."""
    cells: list
    """The pool cells that name unit loops: ``(index, name, reverse)``."""
    table_calls: tuple | None
    """For the shared runtime: ``(sweep kind, op code)`` of the interpreter kernels that the
    units call (a module of the tape's own says so itself, ``TABLE_CALLS``)."""


def _summary(t, plan, frows, rrows):
    """The first lines of a compiled tape's source or listing: what became of its entries."""
    n_fused = sum(isinstance(u, _Group) for u in plan.units)
    return [
        '"""Compiled tier of one tape: GENERATED by tape.compiled. Do not edit.',
        "",
        f"{t.n_entries} entries, {len(plan.live)} replayed (the others are dead or constant, "
        "or merged), in",
        f"{len(plan.units)} units ({n_fused} fused loops) of {len({n for n, _ in frows})} "
        f"forward and {len({n for n, _ in rrows})} reverse kinds.",
        f"Common subexpressions: {plan.n_merged} merged into an identical earlier entry, "
        f"{plan.n_kept} kept",
        "(an output, or read by code that cannot be redirected).",
    ]


def _listing(t, plan, gen, frows, rrows, tail, units, zero, leaves):
    """``t.compiled_source`` of a tape that the shared runtime replays: what the units are,
    in the order the sweeps run them (the unit modules' text follows)."""

    def rows(rs):
        return [f"#   {name}: {gen.blocks[name][0]}" if name in units else
                "#   " + gen.blocks[name][0].replace("Entry P[0]", f"entry {ps[0]}")
                for name, ps in rs]  # fmt: skip

    return "\n".join(
        [
            *_summary(t, plan, frows, rrows),
            "Replayed by the shared runtime (tape_runtime: tape.compiled.runtime_source()), from",
            'the tables appended to the integer pool (``t.kernel_args().ipool``)."""',
            "",
            "# forward units, in order:",
            *rows(frows),
            f"# the one-call gradient runs the first {len(frows) - tail} of the {len(frows)} forward "
            "units",
            "# reverse units, in order:",
            *rows(rrows),
            f"# adjoints zeroed before a reverse sweep: {_spans(zero)}",
            f"# leaves' adjoints zeroed first in a gradient: {_spans(leaves)}",
            "",
            "# the rules the fused loops call:",
            *_rule_names(plan.ops[i] for i in plan.live),
        ]
    )


def _spans(ranges):
    return ", ".join(f"[{a}, {z})" for a, z in ranges.tolist()) or "none"


def _generic_tables(t, plan, gen, frows, rrows, tail, zero, leaves, shared):
    """The pool of a tape that the shared runtime (:data:`_RUNTIME`) replays: the tape's own
    ints, then its tables (forward and reverse units: ``[kind, P...]`` rows, a unit module's
    loop numbered ``-1 - k`` until :func:`compile_tape` puts its id there, an interpreter
    entry ``0`` with ``P[0]`` its index; adjoint ranges to zero; outputs; inputs), the header
    and the trailer ``[header, pool length, MAGIC]``. Also returns the pool cells that name
    unit loops (as :func:`generate`) and the interpreter kernels the units call."""
    B = plan.B

    fwd, rev = _table(frows, None, shared), _table(rrows, None, shared)
    outs = np.array([(B[b, B_OFF], B[b, B_SIZE]) for b in t.outputs], np.int64).reshape(-1, 2)
    ins = np.array([B[b, B_OFF] for b in t.inputs], np.int64)
    parts, at = [t.ipool[: t.n_ipool]], {}
    pos = t.n_ipool
    for k, a in dict(fwd=fwd, rev=rev, zero=_ranges(B, zero), leaves=_ranges(B, leaves),
                     outs=outs, ins=ins).items():  # fmt: skip
        at[k] = pos
        parts.append(a.ravel())
        pos += a.size
    head = np.zeros(H_LEN, np.int64)
    head[[H_FWD, H_FWD_ROWS, H_FWD_W]] = at["fwd"], fwd.shape[0], fwd.shape[1]
    head[[H_REV, H_REV_ROWS, H_REV_W]] = at["rev"], rev.shape[0], rev.shape[1]
    head[[H_ZERO, H_ZERO_ROWS]] = at["zero"], parts[3].size // 2
    head[[H_LEAVES, H_LEAVES_ROWS]] = at["leaves"], parts[4].size // 2
    head[[H_RUN, H_OUTS, H_N_OUTS, H_INS, H_N_INS]] = (
        len(frows) - tail, at["outs"], len(t.outputs), at["ins"], len(t.inputs))  # fmt: skip
    head[[H_N_DATA, H_NE, H_WE, H_NB, H_WB]] = (
        t.n_data, t.n_entries, t.entries.shape[1], t.n_bufs, t.bufs.shape[1])  # fmt: skip
    parts.append(head)
    parts.append(np.array([pos, pos + H_LEN + 3, MAGIC], np.int64))
    pool = np.concatenate(parts)
    cells = [(at[k] + r * a.shape[1], shared[-1 - int(a[r, 0])], k == "rev")
             for k, a in (("fwd", fwd), ("rev", rev))
             for r in range(a.shape[0]) if a[r, 0] < 0]  # fmt: skip
    E = plan.E
    calls = sorted({(kind, int(E[int(a[r, 1]), E_OP]))
                    for kind, a in ((0, fwd), (1, rev))
                    for r in range(a.shape[0]) if a[r, 0] == 0})  # fmt: skip
    return pool, cells, tuple(calls)


class CompiledSweeps:
    """What a compiled tape replays through (``Tape._run_with``): the entry points of its
    module (the shared runtime, or a module of the tape's own: see :func:`compile_tape`),
    with the tape's ``TABLE_CALLS`` (the interpreter kernels its units call) and ``SOURCE``
    (``t.compiled_source``)."""

    ENTRY_POINTS = (
        "forward_sweep", "reach", "reverse_pass", "backward", "forward_backward",
        "gradient_batch_kernel", "gradient_args", "ka_forward", "ka_backward", "ka_gradient",
    )  # fmt: skip

    def __init__(self, module, table_calls, source, n_args=0):
        self.module = module
        self.__name__ = module.__name__
        for name in self.ENTRY_POINTS:
            if hasattr(module, name):
                setattr(self, name, getattr(module, name))
        if hasattr(module, f"gradient_args_{n_args}"):  # the runtime's, for n arguments
            self.gradient_args = getattr(module, f"gradient_args_{n_args}")
        self.TABLE_CALLS = tuple(table_calls)
        self.SOURCE = source


def _custom_globals(gen):
    return [(f"_u{k}", fn) for k, fn in sorted(gen.custom.values(), key=lambda v: v[0])]


def _source_key(fn):
    """A hash of a custom op's functions' source: the module text (its name, and Numba's cache
    of it) changes when the user's code does."""
    import inspect

    parts = []
    for f in (fn.fwd, fn.vjp):
        f = getattr(f, "py_func", f)
        try:
            parts.append(inspect.getsource(f))
        except (OSError, TypeError):
            parts.append(f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', repr(f))}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- cache and loading


def cache_dir() -> Path:
    """Where generated modules (and Numba's cache of them) live."""
    env = os.environ.get("TAPE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tape"


def _module_name(source, prefix):
    """The name of the generated module ``source``: ``prefix`` and a hash of the text (and of
    the generator's version)."""
    key = hashlib.sha256(f"{GENERATOR_VERSION}\n{source}".encode()).hexdigest()[:24]
    return f"{prefix}_{key}"


def unit_module(source: str) -> types.ModuleType:
    """The unit module ``source`` (one fused loop, made by :meth:`_Gen.unit_source`), loaded
    once per process and cached by Numba beside its file: every tape with this loop calls
    the same compiled function, in this process and the next."""
    return load_module(source, "tape_unit")


def load_module(source: str, prefix: str, extra=None) -> types.ModuleType:
    """The generated module ``source``, written to the cache directory under a name made of
    ``prefix`` and a hash of the text, and imported (once per process): Numba's cache of its
    functions lives beside it. ``extra``: globals to add (read when Numba compiles)."""
    name = _module_name(source, prefix)
    with _LOCK:
        mod = _MODULES.get(name)
        if mod is not None:
            return mod
        path = _write(name, source)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mod.__dict__.update(extra or {})  # custom ops' functions, read when Numba compiles
        mod.SOURCE = source
        _MODULES[name] = mod
        return mod


def _write(name, source) -> Path:
    """Write the module (atomically), unless the same module is there already."""
    for d in (cache_dir() / "compiled", Path(tempfile.gettempdir()) / f"tape-{os.getuid()}"):
        try:
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"{name}.py"
            if path.exists() and path.read_text() == source:
                return path  # unchanged: Numba's cache of it stays valid
            tmp = d / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(source)
            os.replace(tmp, path)
            return path
        except OSError:
            continue
    raise CompileError(f"no writable cache directory for compiled tapes (tried {cache_dir()})")


def compile_tape(t):
    """``(sweeps, pool)``: what tape ``t`` replays through (a :class:`CompiledSweeps`: the
    shared runtime, or, for a tape whose units call custom ops' functions, a module of its
    own, generated, written and loaded; Numba compiles them on first call) and the integer
    pool its sweeps take in place of ``t.ipool``."""
    g = generate(t)
    pool = g.pool
    mods = {name: unit_module(text) for name, text in g.units.items()}
    rev_of = {name: rev for _, name, rev in g.cells}
    ids = {}

    def build(name):  # the loop's id in this process's unit table; whether Numba compiled it
        fn = mods[name].unit
        misses = sum(fn.stats.cache_misses.values())
        ids[name] = register_unit(fn, rev_of[name], t.dtype)
        return sum(fn.stats.cache_misses.values()) > misses

    rt = runtime() if g.table_calls is not None else None

    def meanwhile():  # the runtime's one-call gradient for this tape's arguments
        if len(t.outputs) == 1 and int(t.bufs[t.outputs[0], B_SIZE]) == 1:
            job = runtime_job(t)  # a helper may be at it (see tape.record): wait for it then
            _warm.locked(job, lambda: _build_runtime(*job.split(" ", 2)[1:]))

    # loops missing from Numba's cache compile partly in helper processes (tape.interpreter.warm); this
    # process compiles the runtime's gradient meanwhile
    _warm.compile_all(
        list(mods), lambda name: _warm.unit_job(mods[name].__file__, rev_of[name], t.dtype),
        build, meanwhile=None if rt is None else meanwhile,
    )  # fmt: skip
    for at, name, _ in g.cells:
        pool[at] = -ids[name]
    listing = "\n\n\n".join(
        [g.source] + [f"# ---- {n} = {_module_name(x, 'tape_unit')}.unit\n\n{x}"
                      for n, x in g.units.items()])  # fmt: skip
    if rt is not None:
        return CompiledSweeps(rt, g.table_calls, listing, len(t.inputs)), pool
    mod = load_module(g.source, "tape_compiled", g.extra)
    return CompiledSweeps(mod, mod.TABLE_CALLS, listing), pool


def runtime() -> types.ModuleType:
    """The shared runtime (:func:`runtime_source`), loaded once per process."""
    return load_module(runtime_source(), "tape_runtime")


def runtime_job(t) -> str:
    """The :mod:`tape.interpreter.warm` job that compiles the runtime's one-call gradient for the
    arguments of tape ``t`` (their dtypes and dimensions; C-ordered arrays)."""
    args = ",".join(
        f"{np.dtype(d).name}:{len(t.shapes[b])}" for b, d in zip(t.inputs, t.input_dtypes)
    )
    return f"runtime {np.dtype(t.dtype).name} {args or '-'}"


def _build_runtime(dtype, args):
    """Compile (or load) the runtime's ``gradient_args_<n>`` for arguments ``args``
    (``dtype:ndim`` comma-separated, ``-`` for none) and arenas of ``dtype``."""
    rt = runtime()
    specs = [a.split(":") for a in args.split(",")] if args != "-" else []
    xs = [np.empty((1,) * int(nd), np.dtype(d)) for d, nd in specs]
    fn = getattr(rt, f"gradient_args_{len(xs)}", None) or rt.gradient_args
    precompile(fn, [np.empty(0, np.int64), np.empty(0, np.dtype(dtype)), *xs])


def _build_unit(dtype, rest):
    """Compile (or load) the fused loop of the unit module file in ``rest`` (``REV PATH``)
    for arenas of ``dtype``: a helper's ``unit`` job."""
    rev, path = rest.split(" ", 1)
    fn = unit_module(Path(path).read_text()).unit
    fn.compile(unit_signature_types(rev == "1", np.dtype(dtype)))


_warm.register("runtime", _build_runtime)
_warm.register("unit", _build_unit)


def kernels_of(mod) -> types.ModuleType:
    """``forward``, ``backward`` and ``gradient`` of a compiled module, as a module (so that
    ``@njit`` code can call them as ``K.gradient(ka)``)."""
    k = getattr(mod, "_kernels", None)
    if k is None:
        k = types.ModuleType(mod.__name__ + ".kernels")
        k.forward, k.backward, k.gradient = mod.ka_forward, mod.ka_backward, mod.ka_gradient
        mod._kernels = k
    return k


register_extension("compile", compile_tape)
register_extension("compiled_kernels", kernels_of)
