"""Analysis, the compiled tier's first pass: a tape cut into units (fused loops and the entries
the interpreter runs), with dead and constant entries dropped and common subexpressions
merged (:class:`Plan`). It reads the tape's arrays only: no Numba."""

from __future__ import annotations

import bisect
import hashlib

import numpy as np

from tape.compiler.params import OPEN_GROUPS
from tape.layout.columns import (
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
    SAME,
)
from tape.ops import registry
from tape.ops.blocks import broadcast
from tape.ops.blocks import reduce as reduce_block
from tape.ops.reduce import SUM
from tape.program import callbacks

CALLBACK_OP = registry.Op(name="callback", kind="structural", fwd=None, rev=(None,))
"""Stands in for the op of a callback entry (a :func:`tape.custom_op` application: its unit
calls the user's functions, see :meth:`Gen.custom_forward`)."""


# ---------------------------------------------------------------- analysis


class Group:
    """Consecutive elementwise entries over ``n`` elements, and an optional folded sum. With
    ``rows`` > 1 the loop runs over ``rows`` rows of ``n // rows`` elements, and an input may
    also be one row read by every row, or one value per row (a broadcasting entry; see
    :meth:`Plan.fusable`)."""

    def __init__(self, n):
        self.n = n
        self.rows = 1
        self.seq = 0  # order of creation, while the group is open (see Plan._group)
        self.entries: list[int] = []
        self.fold = -1  # a sum of a value of the group, taken with its loop
        self.fold_rows = 0  # 0: the fold is a full sum; D: a sum over blocks of D rows
        self.stops = 0  # once placed: how many units that can stop the sweep precede it

    @property
    def m(self):
        """The length of the inner loop: a row."""
        return self.n // self.rows


class Call:
    """One entry replayed by the interpreter's kernel for its op."""

    def __init__(self, i):
        self.entries = [i]


class Plan:
    """What the generator needs to know about a tape: live entries, fused groups, which
    values and adjoints live in registers."""

    def __init__(self, t):
        n = t.n_entries
        self.t = t
        self._fusable: dict[int, tuple | None] = {}  # entry -> fusable(entry)
        E = self.E = t.entries[:n]
        B = self.B = t.bufs[: t.n_bufs]
        self.ops = [CALLBACK_OP if c == CALLBACK else registry.OPS[c] for c in E[:, E_OP]]
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
                op is CALLBACK_OP or op.guard or o < 0 or Bl[o][B_ALIAS] >= 0
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
        open_: list[Group] = []  # open groups, oldest first
        producer: dict[int, Group] = {}  # owner -> the open group that makes it
        placed: dict[int, tuple[int, Group]] = {}  # owner -> (entry, placed group) making it
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
                    g = Group(size)
                    g.entries.append(i)
                    units.append(g)
                    n_read[[owner[b] for b in self.ins[i]]] += 1
                    continue
                f = None  # over rows: the interpreter's kernel
            if f is not None:
                rows = f[0]
                cur = None
                for g in reversed(open_[-OPEN_GROUPS:]):
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
                    if len(open_) >= OPEN_GROUPS:
                        place(open_[0].seq)
                    cur = Group(size)
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
                units.append(Call(i))
                stops += stop
            for b in self.ins[i]:
                n_read[owner[b]] += 1
        place(np.inf)
        made_by: dict[int, int] = {}  # value -> unit that produces it
        for u, unit in enumerate(units):
            for i in unit.entries + (
                [unit.fold] if isinstance(unit, Group) and unit.fold >= 0 else []
            ):
                made_by[int(E[i, E_OUT])] = u
        self.units = units
        self.made_by = made_by
        # which units read each value (through any view of it)
        self.uses: dict[int, set] = {}
        for u, unit in enumerate(units):
            ents = unit.entries + (
                [unit.fold] if isinstance(unit, Group) and unit.fold >= 0 else []
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
