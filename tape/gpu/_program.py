"""Host side of the GPU replay: a recorded tape packed into the two arrays a kernel takes.

A Numba kernel launch costs more with each array argument (``benchmarks/MEASURED.md``), so
the kernels take two arrays, not ten:

``prog`` : int64
    A header of :data:`HEADER` slots (the ``H_*`` names below: where each part starts), then
    the tape's ``entries`` and ``bufs`` rows (flattened), its integer pool, and per entry the
    reach mask and its :data:`PHASE_COLS` phase numbers (forward phases, reverse phases, the
    mask of reverse phases to run, the mask of forward phases after which the status must be
    read); then the lists of adjoint ranges to zero, of seeds to add and (batched replay) of
    constant ranges to copy into each instance. One slot is written by the kernels:
    ``H_STATUS``, the first entry that rejected its data (a gather index out of bounds, a failed
    guard), :data:`OK` if none.
``A`` : float (the tape's dtype)
    The arena: values ``[0, n_data)``, adjoints ``[H_GRAD, H_GRAD + n_data)`` (same layout as
    the CPU ``data`` / ``grad``), scratch for reductions ``[H_WORK, ...)``, one status flag
    (``H_FLAG``: batched replay sets it to 1 in the arena of an instance whose data an entry
    rejected) and the seed values. Batched replay stores one such arena per instance,
    interleaved (element ``e`` of instance ``b`` at ``e * n_instances + b``) so that the
    threads of a warp, one instance each, read adjacent addresses.

An entry runs as a fixed number of **phases** separated by barriers: a binary op's reverse
has one per input (two inputs may view the same memory, as in ``x[1:] * x[:-1]``: one phase
at a time, each element has one writer), a reduction gathers partial results in one phase
and combines them in the next. The phase counts come from the op records: one per input for
elementwise reverses, the ``GpuKernel`` spec (:mod:`tape.gpu._kernels`) for the others.
Entries that can reject their data (``GpuKernel.checks``: ``take``, ``guard``) mark the forward
phases after which the kernels read ``H_STATUS``; a tape without such entries never reads it.

This module needs numpy and the CPU sweeps only.
"""

from __future__ import annotations

import numpy as np

from tape.interpreter.generated import sweeps
from tape.layout.columns import (
    ACTIVE,
    B_ALIAS,
    B_KIND,
    B_OFF,
    B_SIZE,
    BUF_COLS,
    CALLBACK,
    CONST,
    E_ATTR,
    E_IN0,
    E_OP,
    E_OUT,
    ENTRY_COLS,
    LEAF,
)
from tape.ops import registry

# header slots
H_N_ENTRIES = 0
H_ENTRIES = 1  # entries rows, flattened (ENTRY_COLS ints each)
H_BUFS = 2  # buffer rows, flattened (BUF_COLS ints each)
H_IPOOL = 3  # the integer pool
H_EMASK = 4  # per entry: 1 if the roots depend on it (reverse sweep skips the others)
H_PHASES = 5  # per entry: PHASE_COLS ints (see the module docstring)
H_ZACT = 6  # (offset, size) pairs: intermediate adjoints zeroed before each reverse sweep
H_N_ZACT = 7
H_ZLEAF = 8  # (offset, size) pairs: leaf adjoints (zeroed by zero_grad / gradient)
H_N_ZLEAF = 9
H_SEEDS = 10  # (adjoint offset, seed offset, size) triples added before the reverse sweep
H_N_SEEDS = 11
H_INIT = 12  # (offset, size) pairs of constant values (batched replay copies them per instance)
H_N_INIT = 13
H_GRAD = 14  # arena offset of the adjoint region
H_WORK = 15  # arena offset of the reduction scratch
H_STATUS = 16  # written by kernels: first entry that rejected its data, OK if none
H_FLAG = 17  # arena offset of the per-instance status flag (batched replay)
H_N_WORK = 18
H_N_CHECKS = 19  # number of entries that can reject their data (0: no status to read)
HEADER = 20

PHASE_COLS = 4
"""Ints per entry in the phase table: forward phases, reverse phases, mask of the reverse
phases to run, mask of the forward phases after which the status is read."""

OK = 1 << 62
"""``prog[H_STATUS]`` when no entry rejected its data."""

# kernel modes (bits)
FWD = 1
ZERO_ACT = 2
ZERO_LEAF = 4
SEED = 8
REV = 16
INIT = 32  # batched replay: copy the constants into each instance, clear its flag
GRADIENT = FWD | ZERO_ACT | ZERO_LEAF | SEED | REV
BACKWARD = ZERO_ACT | SEED | REV


def gpu_spec(op):
    """Phase counts of ``op`` on the GPU: ``(fwd_phases, rev_phases, rev_inputs, work,
    checks)``.

    ``rev_inputs[p]`` is the input whose adjoint reverse phase ``p`` writes (the phase is
    skipped when that input has no adjoint) or ``-1`` (always run); ``work(n_out, parts,
    block)`` the scratch an entry needs; ``checks`` the forward phases that may reject the entry's data.
    """
    if op.kind != "structural":
        n = op.arity
        rev = tuple(k if op.differentiable[k] else None for k in range(n))
        return 1, n, rev, None, ()
    from tape.gpu._kernels import GPU_KERNELS

    g = GPU_KERNELS.get(op.gpu)
    if g is None:
        raise NotImplementedError(
            f"op {op.name!r} has no GPU kernel: add a GpuKernel for it to "
            "tape/gpu/_kernels.py, name its key in the op's record (gpu=) and run "
            "`python -m tape.gpu._codegen`"
        )
    return g.fwd_phases, g.rev_phases, g.rev_inputs, g.work, g.checks


def _ranges(bufs, ids):
    out = []
    for b in ids:
        out.extend((int(bufs[b, B_OFF]), int(bufs[b, B_SIZE])))
    return out


class Program:
    """A tape packed for the kernels (see the module docstring).

    Parameters
    ----------
    t : tape.Tape
        A recorded tape (or any tape with ``outputs`` set).
    roots : sequence of int
        Buffers the reverse sweep starts from (default: the tape's outputs).
    n_blocks : int
        The largest grid the kernels will be launched with (reductions size their scratch by
        it); 1 for batched replay.
    """

    def __init__(self, t, roots=None, n_blocks=1):
        ne, nb = t.n_entries, t.n_bufs
        entries = t.entries[:ne]
        bufs = t.bufs[:nb]
        self.n_entries, self.n_bufs, self.n_data = ne, nb, t.n_data
        self.roots = np.asarray(t.outputs if roots is None else roots, np.int64)
        emask, need = sweeps.reach(t.entries, t.bufs, ne, self.roots)
        phases = np.zeros((ne, PHASE_COLS), np.int64)
        work = 0
        n_checks = 0
        for i in range(ne):
            if entries[i, E_OP] == CALLBACK:
                continue  # no phases: the replay launches the call's own kernels (pieces)
            op = registry.OPS[entries[i, E_OP]]
            fwd, rev, rev_inputs, wfn, checks = gpu_spec(op)
            mask = 0
            for p in range(rev):
                k = rev_inputs[p] if rev_inputs is not None else -1
                if k is None:
                    continue
                if k >= 0 and bufs[entries[i, E_IN0 + k], B_KIND] == CONST:
                    continue
                mask |= 1 << p
            check = sum(1 << p for p in checks)
            n_checks += check != 0
            phases[i] = fwd, rev, mask, check
            if wfn is not None:
                n_out = int(bufs[entries[i, E_OUT], B_SIZE])
                parts = max(1, n_blocks // max(n_out, 1))
                block = t.ipool[int(entries[i, E_ATTR]) :]
                work = max(work, int(wfn(n_out, parts, block)))
        owners = [b for b in range(nb) if bufs[b, B_ALIAS] < 0]
        zact = [b for b in owners if need[b] and bufs[b, B_KIND] == ACTIVE]
        zleaf = [b for b in owners if bufs[b, B_KIND] == LEAF]
        outs = set(int(o) for o in entries[:, E_OUT])
        inputs = set(int(b) for b in getattr(t, "inputs", []))
        init = [b for b in owners if b not in outs and b not in inputs and bufs[b, B_SIZE] > 0]
        self.n_work = work
        self.n_checks = n_checks
        self.grad_off = t.n_data
        self.work_off = 2 * t.n_data
        self.flag_off = 2 * t.n_data + work
        self.seed_off = self.flag_off + 1
        self.n_seed = int(sum(bufs[r, B_SIZE] for r in self.roots))
        self.n_arena = self.seed_off + self.n_seed
        seeds = []
        s = self.seed_off
        for r in self.roots:
            n = int(bufs[r, B_SIZE])
            seeds.extend((int(bufs[r, B_OFF]), s, n))
            s += n
        parts = [
            ("entries", entries.ravel()),
            ("bufs", bufs.ravel()),
            ("ipool", t.ipool[: t.n_ipool]),
            ("emask", emask[:ne].astype(np.int64)),
            ("phases", phases.ravel()),
            ("zact", np.array(_ranges(bufs, zact), np.int64)),
            ("zleaf", np.array(_ranges(bufs, zleaf), np.int64)),
            ("seeds", np.array(seeds, np.int64)),
            ("init", np.array(_ranges(bufs, init), np.int64)),
        ]
        size = HEADER + sum(len(a) for _, a in parts)
        prog = np.zeros(size, np.int64)
        pos = HEADER
        where = {}
        for name, a in parts:
            where[name] = pos
            prog[pos : pos + len(a)] = a
            pos += len(a)
        prog[H_N_ENTRIES] = ne
        prog[H_ENTRIES] = where["entries"]
        prog[H_BUFS] = where["bufs"]
        prog[H_IPOOL] = where["ipool"]
        prog[H_EMASK] = where["emask"]
        prog[H_PHASES] = where["phases"]
        prog[H_ZACT], prog[H_N_ZACT] = where["zact"], len(zact)
        prog[H_ZLEAF], prog[H_N_ZLEAF] = where["zleaf"], len(zleaf)
        prog[H_SEEDS], prog[H_N_SEEDS] = where["seeds"], len(self.roots)
        prog[H_INIT], prog[H_N_INIT] = where["init"], len(init)
        prog[H_GRAD] = self.grad_off
        prog[H_WORK] = self.work_off
        prog[H_N_WORK] = work
        prog[H_N_CHECKS] = n_checks
        prog[H_STATUS] = OK
        prog[H_FLAG] = self.flag_off
        self.prog = prog
        self.emask = emask[:ne]
        self.need = need
        # largest buffer each entry touches: decides which launch runs it
        self.entry_size = np.array(
            [
                max(int(bufs[b, B_SIZE]) for b in entries[i, E_IN0 : E_OUT + 1] if b >= 0)
                for i in range(ne)
            ],
            np.int64,
        )

    def zero_only(self, bufs, owners):
        """Zero before each reverse sweep only the adjoints of the buffers ``owners``
        (buffers that own their memory), intermediates and leaves: the GPU's compiled tier
        keeps most adjoints in registers and assigns some where they are first written.
        Rewrites the ``zact`` and ``zleaf`` lists in place."""
        prog = self.prog
        offs = {int(bufs[b, B_OFF]) for b in owners}
        for h_at, h_n in ((H_ZACT, H_N_ZACT), (H_ZLEAF, H_N_ZLEAF)):
            at, n = int(prog[h_at]), int(prog[h_n])
            pairs = prog[at : at + 2 * n].reshape(n, 2).copy()
            kept = [row for row in pairs if int(row[0]) in offs]
            prog[at : at + 2 * len(kept)] = np.array(kept, np.int64).reshape(-1)
            prog[h_n] = len(kept)

    def arena(self, t):
        """A fresh host arena: the tape's values, zero adjoints, scratch and flag, seeds of
        one."""
        A = np.zeros(self.n_arena, t.dtype)
        A[: self.n_data] = t.data[: self.n_data]
        A[self.seed_off :] = 1.0
        return A


def segments(entry_size, small, min_run):
    """Split entries ``0..n-1`` into launches ``[(start, stop, large), ...]``: maximal runs of
    small entries (all buffers at most ``small`` elements: one block) and of large ones (a full
    cooperative grid), with runs of fewer than ``min_run`` small entries folded into their large
    neighbours (a launch costs about as much as several grid barriers)."""
    n = len(entry_size)
    if n == 0:
        return []
    large = [bool(s > small) for s in entry_size]
    runs = []
    start = 0
    for i in range(1, n + 1):
        if i == n or large[i] != large[start]:
            runs.append([start, i, large[start]])
            start = i
    if any(r[2] for r in runs):
        for r in runs:
            if not r[2] and r[1] - r[0] < min_run:
                r[2] = True
    merged = []
    for r in runs:
        if merged and merged[-1][2] == r[2]:
            merged[-1][1] = r[1]
        else:
            merged.append(list(r))
    return [tuple(r) for r in merged]


def pieces(runs, groups):
    """The launch plan of a tape with callback groups: ``runs`` (from :func:`segments`, or
    one run of the whole tape) cut at the groups ``[(start, stop, call), ...]``, as
    ``[("run", start, stop, large) | ("call", call), ...]`` in entry order. A callback
    entry has no phases, so a run that spans one would skip it: the cut makes the replay
    launch the call's own kernels there."""
    cuts = sorted(
        {c for a, b, _ in runs for c in (a, b)} | {c for s, e, _ in groups for c in (s, e)}
    )
    out = []
    for p, q in zip(cuts, cuts[1:]):
        group = next(((s, call) for s, e, call in groups if s <= p < e), None)
        if group is not None:
            if group[0] == p:
                out.append(("call", group[1]))
            continue
        large = next(lg for a, b, lg in runs if a <= p < b)
        out.append(("run", p, q, large))
    return out


__all__ = [
    "Program",
    "segments",
    "pieces",
    "gpu_spec",
    "OK",
    "PHASE_COLS",
    "FWD",
    "ZERO_ACT",
    "ZERO_LEAF",
    "SEED",
    "REV",
    "INIT",
    "GRADIENT",
    "BACKWARD",
    "ENTRY_COLS",
    "BUF_COLS",
]
