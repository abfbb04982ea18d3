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
  value of the loop is taken with it: in the loop over at most ``SHORT_SUM`` elements (no
  value stored), right after it, vectorised, or, in a loop of
  ``BLOCK_MIN`` elements or more (or over rows), block by block while the block is in the
  L1 cache (then the summed values are not stored unless read elsewhere). A sum over the
  middle axis of ``(A, D, m)`` (GMM's ``sum(Qxc ** 2, axis=1)``) is taken in a loop over its
  ``A * D`` rows, each row added into its block's output row; its reverse reads that row's
  adjoint in the reverse loop.
- **Adjoints in registers.** Inside a run, adjoints are local variables: they are never zeroed
  or stored. An intermediate whose adjoint memory is written first by a fused run (through
  one view, or views a few elements apart that together cover it) is assigned, not zeroed and
  accumulated; so is a leaf's, in a gradient (where the leaves' adjoints start from zero), by
  a vectorised reverse loop.
- **Vectorised reverse loops.** A reverse run of ``BLOCK_MIN`` elements or more, of ops
  whose rules are plain arithmetic (``Op.vectorises``), goes in blocks: the loop over a block writes each input's adjoint contribution to a scratch array
  and ORs a NaN test, and the adds into the adjoint arena follow in loops of their own. The
  main loop then has neither a store that may alias its loads (``x[1:]`` and ``x[:-1]`` add
  to one leaf) nor a branch, so LLVM vectorises it; a block that met a NaN (``0 * inf``
  where an adjoint is zero) redoes those elements with the selects. Views of one buffer a
  few elements apart add their adjoints in one pass per block (``Gen.shifted_adds``).
- **Transcendental rules called in short loops.** ``exp``, ``log``, ``tanh`` and ``sigmoid``
  are inlined in Numba IR (so that long loops vectorise them); loops shorter than
  ``BLOCK_MIN`` and the redos call them instead (:func:`outline_rule`), which cuts the
  compile of long tapes of short loops (the LSTM's) by a sixth.
- **One call from Python.** ``gradient_args`` (``gradient_args_<n>`` for ``n`` arguments)
  loads the arguments, zeroes, and runs forward and backward; :meth:`tape.Tape.gradient` and
  ``value_and_grad`` call its entry point directly (no dispatch, no argument copies in
  Python) when the arguments are arrays of the recorded dtypes and numbers of axes, in any
  layout: it is compiled for arrays of layout ``A``, checks their shapes and copies them in
  with a contiguous loop where they are contiguous (:mod:`tape.compiler.args`), so a strided
  argument compiles nothing new. It takes two arrays and the
  arguments: Numba's dispatch costs more with every array, so the tape's integer arrays are
  views of one (``entries``, ``bufs`` and the pool, made so by :meth:`tape.Tape.compile`) and
  a workspace's value and adjoint arenas are the two halves of one. The views the runtime
  and the fused loops make of the arenas and the tables hold no reference
  (:mod:`tape.layout.views`). :meth:`tape.Tape.forward` calls the runtime's
  ``forward_args_<n>`` in the same way from its second call on (the arguments loaded, then
  the whole forward). A final sum that nothing
  else reads (a loss), taken in blocks with nothing stored (or, over at most ``SHORT_SUM``
  elements, element by element in its loop), is summed again by its reverse loop, in the
  same order, which recomputes the values anyway, so ``gradient_args``, ``t.njit_gradient``
  and the HVP (its forward and tangent loops) skip that forward loop; an
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

import hashlib
import os
import re
import sys
import types
from pathlib import Path
from typing import NamedTuple

import llvmlite.binding as ll
import numpy as np
from llvmlite import ir as llir
from numba import types as nbtypes
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.numpy_support import as_dtype

from tape.compiler.analyse import Group, Plan
from tape.compiler.cache import load_module, module_name, unit_module
from tape.compiler.emit import (
    TABLES,
    Gen,
    adjoint_ranges,
    dispatch_text,
    gradient_args_text,
    njit_gradient_text,
    rule_names,
    table_text,
    zeroing_text,
)
from tape.compiler.params import (
    AUTO_AFTER,  # noqa: F401  (public: tape.compiled.AUTO_AFTER)
    AUTO_COLD_RUNTIME,
    AUTO_COLD_UNIT,
    AUTO_MIN,  # noqa: F401  (public)
    AUTO_SECONDS,  # noqa: F401  (public)
    INLINE_KINDS,
    MAX_UNIT_KINDS,
)
from tape.compiler.runtime import (
    H_FWD,
    H_FWD_ROWS,
    H_FWD_W,
    H_INS,
    H_LEAVES,
    H_LEAVES_ROWS,
    H_LEN,
    H_N_DATA,
    H_N_INS,
    H_N_OUTS,
    H_NB,
    H_NE,
    H_OUTS,
    H_REV,
    H_REV_ROWS,
    H_REV_W,
    H_RUN,
    H_WB,
    H_WE,
    H_ZERO,
    H_ZERO_ROWS,
    MAGIC,
    STALE_POOL,
    runtime_source,
)
from tape.interpreter import warm as _warm
from tape.interpreter.dispatch import prepare, register_unit, unit_signature_types
from tape.interpreter.generated import sweeps as interp_sweeps
from tape.layout.calls import gradient_signature
from tape.layout.columns import (
    ACTIVE,
    B_ALIAS,
    B_KIND,
    B_OFF,
    B_SIZE,
    E_OP,
    E_OUT,
    LEAF,
)
from tape.layout.config import UNCACHED_JIT
from tape.program.core import register_extension
from tape.program.replay import CompileError


def generate(t, own=False):
    """The source of the compiled module for tape ``t`` (see the module docstring), the
    integer pool its sweeps take (the tape's, with the unit tables appended), the globals to
    set on the module (custom ops' functions), the sources of its unit modules (name in
    the module -> text; see :func:`unit_module`) and the pool cells that name them (``(index,
    name, reverse)``: :func:`compile_tape` puts the loops' ids there). ``own``: a module of
    the tape's own even where the shared runtime would replay it, with ``njit_gradient_impl``
    (the body of :func:`njit_gradient`)."""
    if not t.inputs and not t.outputs:
        raise CompileError("only tapes made by tape.record() can be compiled")
    plan = Plan(t)
    gen = Gen(plan)
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
        if isinstance(plan.units[u], Group) and not plan.external(o, u)
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
    if not own and all(inline or name in shareable for name, (_, _, inline) in gen.blocks.items()):
        # fused loops of unit modules and interpreter entries only: the shared runtime
        pool, cells, calls = _generic_tables(t, plan, gen, frows, rrows, tail, zero, leaves,
                                             shareable)  # fmt: skip
        units = {name: gen.unit_source(name) for name in shareable}
        listing = _listing(t, plan, gen, frows, rrows, tail, units,
                           adjoint_ranges(B, zero), adjoint_ranges(B, leaves))  # fmt: skip
        return Generated(listing, pool, {}, units, cells, calls)
    inlined = len(gen.blocks) <= INLINE_KINDS
    if inlined:
        gen.jit = "@njit(inline='always', **UNIT_JIT)"
    fnames = list(dict.fromkeys(n for n, _ in frows))
    rnames = list(dict.fromkeys(n for n, _ in rrows))
    shared = [] if inlined else gen.shared()
    tables = dict(
        fwd=table_text(frows, fnames, shared), rev=table_text(rrows, rnames, shared),
        zero=adjoint_ranges(B, zero), leaves=adjoint_ranges(B, leaves),
    )  # fmt: skip
    # the tables travel appended to the integer pool (its first n_ipool ints are the tape's
    # own): global arrays would be frozen into the code, and large ones make it uncacheable
    at, pos = {}, t.n_ipool
    for k, a in tables.items():
        # flat, read row by row: a reshape costs a call into Numba's C helpers per sweep
        at[k] = (f"_span(ipool, {pos}, {a.size})", a.shape[0], a.shape[1])
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
        f'SWEEPS = "{interp_sweeps.FINGERPRINT}"  # the interpreter whose run_fwd / run_rev it calls',
        "",
        "import numpy as np",
        "from numba import njit, prange",
        "",
        "from tape.layout.config import COMPILED_JIT, SWEEP_JIT, UNIT_JIT",
        "from tape.interpreter.generated import sweeps as interp_sweeps",
        "from tape.ops.loops import masked as _masked",
        "from tape.layout.views import borrow as _borrow",
        "from tape.layout.views import span as _span",
        "from tape.layout.views import table as _table",
        "from tape.compiler.args import load as _load",
        "from tape.compiler.emit import outline_rule as _outline_rule",
        "from tape.compiler.emit import sum_reassoc as _sum_reassoc",
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
    src += rule_names(plan.ops[i] for i in plan.live) + ["", ""]
    units = {name: gen.unit_source(name) for name in shared}
    if units:
        src += ["# the fused loops in unit modules of their own, called through the unit table"]
        src += [
            "# (tape.interpreter.dispatch.register_unit puts them there; their ids are in the pool)"
        ]
        src += [f"# {name} = {module_name(text, 'tape_unit')}.unit: {gen.blocks[name][0]}"
                for name, text in units.items()]  # fmt: skip
        src += ["", ""]
    src += gen.functions([n for n, b in gen.blocks.items() if not b[2] and n not in units])
    src += [
        # not inlined itself: the batched replay calls it inside a prange loop, which Numba
        # runs serially if the loop body has more than one exit
        "@njit(**COMPILED_JIT)",
        "def forward_sweep(entries, bufs, ipool, data, start, stop):",
        f'    """The whole tape (``start`` and ``stop`` must be 0 and {n_ent}: a part of it, as',
        "    when resuming after a guard, runs on the interpreter); with ``stop`` negative, the",
        "    units the one-call gradient runs (the final sums that its reverse loops take are",
        "    left out, and their values unwritten). Writes ``data``; returns the status",
        '    (``-1``, or the entry that stopped the sweep)."""',
        f"    if ipool.shape[0] != {pool.shape[0]}:",
        f"        raise ValueError({STALE_POOL!r})",
        f"    n = {len(frows)} if stop >= 0 else {len(frows) - tail}",
        "    return _forward_units(entries, bufs, ipool, data, n)",
        "",
        "",
        gen.jit,
        "def _forward_units(entries, bufs, ipool, data, n_units):",
        '    """The first ``n_units`` forward units, in order. Returns the status."""',
    ]
    src += dispatch_text(at["fwd"], fnames, gen.blocks, True, "n_units", shared)
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
    src += zeroing_text(tables["zero"], at["zero"], 1)
    src += ["    if zero_leaves:"] + zeroing_text(tables["leaves"], at["leaves"], 2) + ["", ""]
    src += [
        gen.jit,
        "def _reverse_units(entries, bufs, ipool, data, grad, zl):",
        '    """The reverse units, last first (adjoints zeroed and seeded; the leaves\' too if',
        '    ``zl``: the units assign the leaves\' adjoints they write first)."""',
    ]
    src += dispatch_text(at["rev"], rnames, gen.blocks, False, shared=shared)
    src += ["    return", "", ""]
    if s == 1:
        n_ints = t.n_entries * t.entries.shape[1] + t.n_bufs * t.bufs.shape[1] + pool.shape[0]
        reads = any(TABLES.search(line) for _, lines, _ in gen.blocks.values() for line in lines)
        src += gradient_args_text(t, B, n_ints, reads or not inlined, len(frows) - tail)
        if own:
            src += njit_gradient_text(t, B, n_ints, reads or not inlined, len(frows) - tail)
    from tape.interpreter.codegen import drivers_text

    src.append(drivers_text(shared_only=True))
    text = "\n".join(src)
    calls = sorted(
        {(0, int(c)) for c in re.findall(r"interp_sweeps\.run_fwd\((\d+)", text)}
        | {(1, int(c)) for c in re.findall(r"interp_sweeps\.run_rev\((\d+)", text)}
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
    n_fused = sum(isinstance(u, Group) for u in plan.units)
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
            "Replayed by the shared runtime (tape_runtime: tape.compiler.runtime.runtime_source()), from",
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
            *rule_names(plan.ops[i] for i in plan.live),
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

    fwd, rev = table_text(frows, None, shared), table_text(rrows, None, shared)
    outs = np.array([(B[b, B_OFF], B[b, B_SIZE]) for b in t.outputs], np.int64).reshape(-1, 2)
    parts, at = [t.ipool[: t.n_ipool]], {}
    pos = t.n_ipool
    for k, a in dict(fwd=fwd, rev=rev, zero=adjoint_ranges(B, zero), leaves=adjoint_ranges(B, leaves),
                     outs=outs).items():  # fmt: skip
        at[k] = pos
        parts.append(a.ravel())
        pos += a.size
    # the inputs: rows [data offset, where its shape is listed], then the shapes
    shapes = [np.array(t.shapes[b], np.int64) for b in t.inputs]
    at["ins"] = pos
    starts = pos + 2 * len(t.inputs) + np.cumsum([0] + [len(d) for d in shapes[:-1]])
    parts.append(np.array([(B[b, B_OFF], s) for b, s in zip(t.inputs, starts)], np.int64).ravel())
    parts += shapes
    pos += 2 * len(t.inputs) + sum(len(d) for d in shapes)
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
    """What a compiled tape replays through (``Tape.run_with``): the entry points of its
    module (the shared runtime, or a module of the tape's own: see :func:`compile_tape`),
    with the tape's ``TABLE_CALLS`` (the interpreter kernels its units call) and ``SOURCE``
    (``t.compiled_source``)."""

    ENTRY_POINTS = (
        "forward_sweep", "reach", "reverse_pass", "backward", "forward_backward",
        "gradient_batch_kernel", "gradient_args", "ka_forward", "ka_backward", "ka_gradient",
        "vjp_rows",
    )  # fmt: skip

    def __init__(self, module, table_calls, source, n_args=0):
        self.module = module
        self.__name__ = module.__name__
        for name in self.ENTRY_POINTS:
            if hasattr(module, name):
                setattr(self, name, getattr(module, name))
        if hasattr(module, f"gradient_args_{n_args}"):  # the runtime's, for n arguments
            self.gradient_args = getattr(module, f"gradient_args_{n_args}")
            self.forward_args = getattr(module, f"forward_args_{n_args}")
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
        where = getattr(f, "__module__", None)
        if where is None or where not in sys.modules:
            # code run by exec() without a module (Numba names it "<dynamic>"): another
            # process cannot import it, so Numba's cache of a module that calls it cannot
            # be loaded there (ModuleNotFoundError); the name is this process's own
            parts.append(f"process {os.getpid()}, function {id(f)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def compile_tape(t, own=False):
    """``(sweeps, pool)``: what tape ``t`` replays through (a :class:`CompiledSweeps`: the
    shared runtime, or, for a tape whose units call custom ops' functions, a module of its
    own, generated, written and loaded; Numba compiles them on first call) and the integer
    pool its sweeps take in place of ``t.ipool``. ``own``: a module of the tape's own (see
    :func:`generate`)."""
    g = None if own else t.extensions().pop("generated", None)  # made by compile_estimate
    if g is None:
        g = generate(t, own)
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

    scalar = len(t.outputs) == 1 and int(t.bufs[t.outputs[0], B_SIZE]) == 1
    job = runtime_job(t)

    def meanwhile():  # the runtime's one-call gradient for this tape's arguments, unless a
        # helper is at it (see tape.record): then the fused loops first, and it at the end
        _warm.locked(job, lambda: _build_runtime(*job.split(" ", 2)[1:]), wait=False)

    # loops missing from Numba's cache compile partly in helper processes (tape.interpreter.warm); this
    # process compiles the runtime's gradient meanwhile
    _warm.compile_all(
        list(mods), lambda name: _warm.unit_job(mods[name].__file__, rev_of[name], t.dtype),
        build, meanwhile=meanwhile if rt is not None and scalar else None,
    )  # fmt: skip
    if rt is not None and scalar:  # built above, by a helper, or now
        _warm.locked(job, lambda: _build_runtime(*job.split(" ", 2)[1:]))
    for at, name, _ in g.cells:
        pool[at] = -ids[name]
    listing = "\n\n\n".join(
        [g.source] + [f"# ---- {n} = {module_name(x, 'tape_unit')}.unit\n\n{x}"
                      for n, x in g.units.items()])  # fmt: skip
    if rt is not None:
        return CompiledSweeps(rt, g.table_calls, listing, len(t.inputs)), pool
    mod = load_module(g.source, "tape_compiled", g.extra)
    return CompiledSweeps(mod, mod.TABLE_CALLS, listing), pool


def _in_cache(fn) -> bool | None:
    """Whether Numba's cache holds compiled code of dispatcher ``fn`` (its index file exists:
    for some signature, not necessarily the one the tape calls it with); ``None`` where Numba
    keeps no cache of it (caching off, or another Numba)."""
    try:
        return os.path.exists(fn._cache._cache_file._index_path)
    except AttributeError:
        return None


def compile_estimate(t) -> float:
    """Seconds :func:`compile_tape` is estimated to take for tape ``t`` in this process (for
    automatic promotion: ``t.compile_cost``): :data:`AUTO_COLD_UNIT` for each fused loop
    Numba's cache does not hold, and :data:`AUTO_COLD_RUNTIME` where it does not hold the
    runtime's one-call gradient for the tape's arguments (or the tape's own module). What
    the cache holds loads in a fraction of a second and is not counted. Generates the tape's
    code and loads its unit modules (which :func:`compile_tape` then reuses: Numba compiles
    nothing here). Raises :class:`CompileError` for a tape the tier does not take."""
    g = t.extensions()["generated"] = generate(t)  # compile_tape takes it
    cost = AUTO_COLD_UNIT * sum(not _in_cache(unit_module(x).unit) for x in g.units.values())
    if g.table_calls is None:  # a module of the tape's own
        mod = load_module(g.source, "tape_compiled", g.extra)
        fn = getattr(mod, "gradient_args", None) or mod.forward_backward
    else:
        fn = getattr(runtime(), f"gradient_args_{len(t.inputs)}", None)
    if fn is not None and not _in_cache(fn):  # (the runtime's generic one is not counted)
        cost += AUTO_COLD_RUNTIME
    return cost


def runtime() -> types.ModuleType:
    """The shared runtime (:func:`runtime_source`), loaded once per process."""
    return load_module(runtime_source(), "tape_runtime")


def runtime_job(t) -> str:
    """The :mod:`tape.interpreter.warm` job that compiles the runtime's one-call gradient for the
    arguments of tape ``t`` (their dtypes and dimensions; any layout)."""
    args = ",".join(
        f"{np.dtype(d).name}:{len(t.shapes[b])}" for b, d in zip(t.inputs, t.input_dtypes)
    )
    return f"runtime {np.dtype(t.dtype).name} {args or '-'}"


def start_runtime_compile(t):
    """Hand the runtime's gradient for tape ``t``'s arguments (:func:`runtime_job`) to a
    helper process now, where Numba's cache has no entry of it yet (a recording with
    ``compile=True`` calls this before its first op, so that the helper compiles it while
    this process compiles the ops and the fused loops)."""
    if _warm.compile_helpers() == 0:
        return
    fn = getattr(runtime(), f"gradient_args_{len(t.inputs)}", None)
    if fn is None:  # many arguments: the generic one compiles at its first call
        return
    if _in_cache(fn) is False:  # (no cache of it at all: nothing to hand over)
        _warm.submit([runtime_job(t)])


def _build_runtime(dtype, args):
    """Compile (or load) the runtime's ``gradient_args_<n>`` for arguments ``args``
    (``dtype:ndim`` comma-separated, ``-`` for none) and arenas of ``dtype``."""
    rt = runtime()
    specs = [a.split(":") for a in args.split(",")] if args != "-" else []
    fn = getattr(rt, f"gradient_args_{len(specs)}", None)
    if fn is not None:  # (the generic one, with *xs, compiles at its first call)
        fn.compile(gradient_signature(dtype, [((1,) * int(nd), d) for d, nd in specs]))


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
register_extension("compile_estimate", compile_estimate)
register_extension("compiled_kernels", kernels_of)


# ---------------------------------------------------------------- t.njit_gradient


def _work_ok(work, like):
    """``work`` if it can be ``t.njit_gradient``'s workspace by its type (a writable 1-D
    C-contiguous array of ``like``'s dtype), else ``ValueError`` (compiled: see the overload
    below)."""
    if not (isinstance(work, np.ndarray) and work.ndim == 1 and work.dtype == like.dtype
            and work.flags.c_contiguous and work.flags.writeable):  # fmt: skip
        raise ValueError(f"t.njit_gradient: work must be {_WORK_IS.format(like.dtype)}")
    return work


_WORK_IS = "a writable 1-D C-contiguous {} array made by t.njit_workspace()"


@overload(_work_ok, jit_options=dict(UNCACHED_JIT))
def _work_ok_impl(work, like):
    """Typed ``_work_ok``, decided when Numba types the call: ``work`` itself, or code that
    raises ``ValueError`` and is typed as returning an empty array of the right type (so the
    rest of the caller types, and never runs)."""
    ok = (isinstance(work, nbtypes.Array) and work.ndim == 1 and work.layout == "C"
          and work.mutable and work.dtype == like.dtype)  # fmt: skip
    if ok:
        return lambda work, like: work
    msg = f"t.njit_gradient: work must be {_WORK_IS.format(like.dtype)}, got {work}"
    dt = as_dtype(like.dtype)

    def bad(work, like):
        if like.shape[0] == 0:
            raise ValueError(msg)
        return np.empty(0, dt)

    return bad


@intrinsic
def _part(typingctx, work, start, n, like):
    """``work``'s cells from ``start`` on, as a 1-D C-contiguous array of ``n`` items of
    ``like``'s dtype (``start`` counts ``work``'s items; the part must be aligned for
    ``like``'s dtype), borrowed: no meminfo, so no reference counts in the caller's loop (a
    slice would increment and decrement ``work``'s, atomically, on every call). The caller
    keeps ``work`` alive for the call: it is an argument of the function that takes the
    part."""
    if not (isinstance(work, nbtypes.Array) and work.layout == "C" and work.ndim == 1
            and isinstance(start, nbtypes.Integer) and isinstance(n, nbtypes.Integer)):  # fmt: skip
        return None
    arr = nbtypes.Array(like.dtype, 1, "C")
    sig = arr(work, start, n, like)

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        first = builder.gep(src.data, [args[1]])
        out = context.make_array(arr)(context, builder)
        ty = context.get_data_type(arr.dtype)
        item = context.get_constant(nbtypes.intp, context.get_abi_sizeof(ty))
        n_ = context.cast(builder, args[2], sig.args[2], nbtypes.intp)
        context.populate_array(
            out, data=builder.bitcast(first, ty.as_pointer()), shape=cgutils.pack_array(builder, [n_]),
            strides=cgutils.pack_array(builder, [item]), itemsize=item, meminfo=None,
        )  # fmt: skip
        return out._getvalue()

    return sig, codegen


_TOKEN = np.array([int.from_bytes(os.urandom(8), "little") >> 2 | 1], np.int64)
"""A random number of this process (odd: never 0), which compiled code reads through the
external symbol ``tape_njit_token`` (bound here at import, in every process: code cached by
Numba links to the running process's): a workspace whose tables hold this process's unit ids
carries it, and ``t.njit_gradient`` refuses one made in another process."""
ll.add_symbol("tape_njit_token", _TOKEN.ctypes.data)


@intrinsic
def _process_token(typingctx):
    """:data:`_TOKEN` of the process running the code."""

    def codegen(context, builder, sig, args):
        mod = builder.module
        gv = mod.globals.get("tape_njit_token")
        if gv is None:
            gv = llir.GlobalVariable(mod, llir.IntType(64), "tape_njit_token")
            gv.linkage = "external"
        return builder.load(gv)

    return nbtypes.int64(), codegen


NJIT_DOC = """The compiled tape's gradient as a plain ``@njit`` function of its arguments
(``t.njit_gradient``): ``fn(x0, .., g0, .., work)`` loads the arguments ``x0, ..`` (arrays of
the recorded shapes, any layout), replays forward and backward in ``work`` and writes the
gradient of the scalar output with respect to each differentiated argument into ``g0, ..``
(arrays of the same shapes). Returns nothing. ``work = t.njit_workspace()`` is the caller's:
a 1-D array of the tape's dtype holding the value arena (with the tape's constants), the
adjoint arena and, last, two cells that mark it as this tape's. Call it from your own
``@njit`` code (Numba compiles it into the caller, with no dispatch) or from Python; the
example is in :attr:`tape.Tape.njit_gradient`.

One ``work`` per thread: two calls running at once must not share one (each Python thread,
and each chunk of a ``prange`` loop, makes its own with ``t.njit_workspace()``, or takes a
row of a 2-D array of copies allocated before the loop, ``np.stack([w] * n)``). Nothing else
is shared: the tape's tables are constants of the code (or, for a tape whose entries call
the interpreter's kernels or fused loops through the address tables, copied into ``work``
too, with this process's loop ids), so calls with their own ``work`` run in parallel (the
function takes no GIL). Do not write into ``work``.

Checked first, before anything is written (``ValueError``): ``work``'s type, size and
marker (a workspace of another tape is refused), for a workspace holding the tables the
process it was made in (one made in another process, as by unpickling, is refused: its loop
ids are that process's), and every argument's and gradient's shape. A sweep that stops (a
failed guard: the arguments take another path than the recording) raises ``RuntimeError``
rather than leave stale gradients.

The function names no address of this process, so an ``@njit(cache=True)`` function that
calls it is cached by Numba and loaded by the next process. The function itself lives in a
generated module named by a hash of its text (the tape's frozen tables and marker are in it),
which Numba caches too: a later process calling it from Python loads it. Numba keys a caller's
cache on the caller's own source file only: when the tape changes and the caller's file
does not, the next process loads the caller compiled for the old tape. The marker is a hash
of the tape's tables, its constants and its generated code, so a workspace of the new tape
is then refused (``ValueError``) rather than read by stale code: delete Numba's cache (or
touch the caller's file) after changing the tape.
"""

NJIT_MODULE = """\"\"\"t.njit_gradient of one tape: GENERATED by tape.compiler.compiled.njit_gradient (the
module's name is a hash of this text; Numba caches the function beside it).\"\"\"

import numpy as np
from numba import njit

from tape.compiler.compiled import OTHER_PROCESS as _OTHER_PROCESS
from tape.compiler.compiled import WRONG_WORK as _WRONG_WORK
from tape.compiler.compiled import _part, _process_token, _work_ok
from tape.layout.config import COMPILED_JIT
from tape.layout.views import borrow as _borrow

# _impl: the body, njit_gradient_impl of the tape's own module (set when this one is loaded)
_LIKE = np.empty(0, np.{dtype})
_LIKE_I = np.empty(0, np.int64)
_INTS = {ints_const}


@njit(inline="always", **COMPILED_JIT)
{wrapper}"""

NJIT_WRAPPER = """def njit_gradient({args}, work):
{borrows}    w = _work_ok(_borrow(work), _LIKE)
    if w.shape[0] != {size} or w[{size} - 2] != {tag0!r} or w[{size} - 1] != {tag1!r}:
        raise ValueError(_WRONG_WORK)
{token}    _impl({ints}, _part(w, 0, {arena}, _LIKE), {args})
"""

NJIT_TOKEN = """    if _part(w, {at}, 1, _LIKE_I)[0] != _process_token():
        raise ValueError(_OTHER_PROCESS)
"""

OTHER_PROCESS = (
    "t.njit_gradient: work was made in another process (its tables name that process's "
    "compiled loops): make one with t.njit_workspace() in this process"
)

WRONG_WORK = (
    "t.njit_gradient: work is not this tape's workspace (its size or its marker differs): make "
    "it with t.njit_workspace() of the tape whose t.njit_gradient is called. If it was, the "
    "caller is stale: Numba loaded an @njit(cache=True) caller compiled for an earlier version "
    "of the tape (delete Numba's cache, or touch the caller's file)"
)


def _marker(t, sw, dtype):
    """Two numbers in [1, 2) exact in ``dtype``, from a hash of what the function computes:
    the tape's tables (entries, buffers, integer pool), the values of its constants (the value arena's cells that no argument
    and no entry writes), its generated code (its module's and units' source) and the
    interpreter's fingerprint. The same in every process for the same tape (the ids of the
    loops a workspace's tables name are this process's: the process token checks them)."""
    ne, nb, n = t.n_entries, t.n_bufs, t.n_data
    written = np.zeros(n, bool)
    B = t.bufs[:nb]
    for b in list(t.inputs) + [int(o) for o in t.entries[:ne, E_OUT]]:
        if b >= 0:
            off, size = int(B[b, B_OFF]), int(B[b, B_SIZE])
            written[off : off + size] = True
    h = hashlib.sha256()
    for part in (np.dtype(dtype).str, sw.SOURCE, interp_sweeps.FINGERPRINT, str(n)):
        h.update(part.encode() + b"\0")
    for a in (t.entries[:ne], B, t.ipool[: t.n_ipool], t.data[:n][~written]):
        h.update(np.ascontiguousarray(a).tobytes())
    bits = 52 if np.dtype(dtype).itemsize == 8 else 23
    d = h.digest()
    return tuple(1.0 + (int.from_bytes(d[8 * k : 8 * k + 8], "little") % (1 << bits)) / (1 << bits)
                 for k in (0, 1))  # fmt: skip


def njit_gradient(t):
    """``t.njit_gradient`` and its workspace (see :attr:`tape.Tape.njit_gradient`): ``(fn,
    work)``, a plain ``@njit`` function ``(x0, .., g0, .., work) -> None`` of the tape's
    arguments, its differentiated arguments' gradients and a workspace laid out like
    ``work`` (which ``t.njit_workspace()`` copies). Compiles a module of the tape's own
    (:func:`generate` with ``own=True``: small tapes' units inlined into its sweeps), cached by
    Numba, and the wrapper (a generated module of its own, cached by Numba). The integer tables
    are frozen into the code as constants where only the inlined units read them (LLVM folds
    the reads); where entries call kernels through the address tables (which take writable
    arrays, and the pool names this process's unit ids) they are copied into ``work``, after
    the arenas. Nothing is kept outside the tape (``t.extensions()``)."""
    r = t.replay_state()
    if r["sig"].n_seed != 1:
        r["sig"].require_scalar("njit_gradient")
    if not r["simple"]:
        raise ValueError("t.njit_gradient: the differentiated arguments must have the tape's "
                         f"dtype ({np.dtype(t.dtype).name}); use t.gradient()")  # fmt: skip
    for b in t.inputs:
        if len(t.shapes[b]) == 0:
            raise ValueError("t.njit_gradient takes array arguments: this tape has a 0-d "
                             "argument; use t.gradient() or tape.kernels")  # fmt: skip
    sw, pool = compile_tape(t, own=True)
    for kind, code in sw.TABLE_CALLS:  # the interpreter kernels its unfused entries call
        prepare((code,), t.dtype, (kind,))
    ne, nb = t.n_entries, t.n_bufs
    ints = np.concatenate([t.entries[:ne].ravel(), t.bufs[:nb].ravel(), pool]).astype(np.int64)
    n = t.n_data
    dt = np.dtype(t.dtype)
    # the tables as a constant array where only the inlined units read them; else in work
    frozen = not sw.TABLE_CALLS and "_call_unit_" not in Path(sw.module.__file__).read_text()
    per = 8 // dt.itemsize  # cells per int64 (the arenas' 2n cells keep it 8-byte aligned)
    n_int = 0 if frozen else (ints.shape[0] + 1) * per  # and the process token
    size = 2 * n + n_int + 2
    work = np.zeros(size, dt)
    work[:n] = t.data[:n]
    if not frozen:
        work[2 * n : 2 * n + n_int].view(np.int64)[:] = np.append(ints, _TOKEN)
    tag = _marker(t, sw, dt)
    work[size - 2 :] = tag
    work.setflags(write=False)  # the template: t.njit_workspace() hands out copies
    args = ", ".join([f"x{k}" for k in range(len(t.inputs))] + [f"g{k}" for k in range(len(t.wrt))])
    ints_at = "_INTS" if frozen else f"_part(w, {2 * n}, {ints.shape[0]}, _LIKE_I)"
    token = "" if frozen else NJIT_TOKEN.format(at=2 * n + ints.shape[0] * per)
    # each array argument rebound to a view holding no reference (tape.layout.views.borrow)
    borrows = "".join(f"    {v} = _borrow({v})\n" for v in args.split(", "))
    wrapper = NJIT_WRAPPER.format(args=args, size=size, tag0=tag[0], tag1=tag[1], ints=ints_at,
                                  arena=2 * n, token=token, borrows=borrows)  # fmt: skip
    # a module of its own, named by a hash of its text (the frozen tables and the marker are
    # in it): Numba caches the function, so a later process loads what this one compiles
    ints_const = f"np.array({ints.tolist()!r}, np.int64)" if frozen else "None"
    src = NJIT_MODULE.format(dtype=dt.name, ints_const=ints_const, wrapper=wrapper)
    fn = load_module(src, "tape_njit", dict(_impl=sw.module.njit_gradient_impl)).njit_gradient
    fn.__doc__ = NJIT_DOC
    return fn, work


register_extension("njit_gradient", njit_gradient)
