"""Code generation, the compiled tier's second pass: the source of each unit (fused loops,
forward and reverse) and of the sweeps over them, from a :class:`tape.compiler.analyse.Plan`."""

from __future__ import annotations

import hashlib
import importlib.util
import re

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from tape.compiler.analyse import CALLBACK_OP, Call, Group, Plan
from tape.compiler.args import ARGS_DIFFER
from tape.compiler.params import BLOCK, BLOCK_MIN, FEW_RANGES, SHIFT_MAX, SHORT_SUM, tag
from tape.compiler.runtime import STALE_POOL
from tape.layout.calls import compiled_only
from tape.layout.columns import (
    ACTIVE,
    B_ALIAS,
    B_KIND,
    B_OFF,
    B_SIZE,
    CONST,
    E_OUT,
    LEAF,
)
from tape.layout.config import UNIT_JIT
from tape.ops import registry
from tape.ops.elementwise import POW

AT_J = re.compile(r"\b([dg][ptq]?\d+)\[j\]")
"""Element ``j`` of a unit's view (``d3[j]``, ``g0[j]``) in generated code."""

REDO = re.compile(r"\b_redo_[0-9a-f]{12}\b")
"""The name of a redo function (named by its text: see :meth:`Gen.outline_redo`)."""

CUSTOM = re.compile(r"\b_u\d+_(fwd|vjp)\b")
"""A call of a custom op's user function (set on the tape's module)."""

TAPE_ARRAYS = re.compile(r"\b(entries|bufs|ipool)\b")
"""The tape's own arrays, which a unit module's loop does not take (see :meth:`Gen.shared`)."""

TABLES = re.compile(r"\b(entries|bufs)\b")
"""A unit's code that reads the tape's entry or buffer table."""

# ---------------------------------------------------------------- code generation


class Code:
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
        which row of it each row reads (see :meth:`Plan.fusable`): row ``r`` (``"full"``,
        a buffer as long as the loop), the whole buffer (``"row"``: one row, read by each),
        row ``r % D`` (``("tile", D)``) or row ``r // D`` (``("block", D)``)."""
        name = f"{arena[0]}{tag(kind)}{self.n(b)}"
        off = self.p(int(self.B[b, B_OFF]))
        self.views[name] = f"_span({arena}, {off}, {self.size(self.B[b, B_SIZE])})"
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
        out += [f"        {n} = _span({n}_all, {k} * {m}, {m})" for n, k in self._by_row.items()]
        out += ["    " + x for x in self.lines] + self._post
        return out + [f"    {x}" for x in tail]


def _unit_args(name):
    """The arguments of a fused loop's function: reverse ones also take the adjoint arena and
    whether the leaves' adjoints were zeroed (``zl``: see :meth:`Gen.first_adds`)."""
    return "entries, bufs, ipool, data, grad, P, zl" if name.startswith("_rev") else (
        "entries, bufs, ipool, data, P")  # fmt: skip


def _rule_aliases(op):
    """``(alias, attribute, rule)`` of each scalar rule of elementwise ``op``: ``_f_exp``,
    ``"fwd"``; ``_r_exp_0``, ``"rev[0]"``."""
    out = [(f"_f_{op.name}", "fwd", op.fwd)]
    return out + [(f"_r_{op.name}_{k}", f"rev[{k}]", r) for k, r in enumerate(op.rev) if r]


def rule_names(ops):
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


@intrinsic
def opaque(typingctx, n):
    """``n`` itself, passed through an empty inline assembly statement the optimiser cannot
    see through, for the bound of a generated loop. LLVM unrolls a loop of a short fixed
    length (a row of 16 elements) into straight-line code before its loop vectoriser runs,
    and leaves that code scalar where its arrays may overlap, as arena views always may:
    the vector-mode tangent loop of a small MLP's hidden layer (rows of 16) ran as 80 scalar
    multiplies. With the bound ``opaque(16)`` the loop stays a loop and is vectorised behind
    LLVM's runtime overlap checks."""
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.intp)
        return builder.asm(ir.FunctionType(v.type, [v.type]), "", "=r,0", [v], side_effect=False)

    return types.intp(n), codegen


_OUTLINED: dict = {}


def outline_rule(rule):
    """``rule``, a scalar rule inlined in Numba IR, compiled as a function of its own, which
    LLVM inlines or calls. Loops shorter than ``BLOCK_MIN`` (too short to vectorise) and the
    redo functions call these: every call inlined in Numba IR costs the compile time of the
    rule's code again. The LSTM's tape (46,037 entries; loops of 14 elements with 30 calls of
    ``sigmoid``, ``tanh``, ``exp`` or ``log``) compiled in 71 and 77 s with them inlined and in
    59 and 64 s with them called (two alternating runs), its gradient as fast either way."""
    d = _OUTLINED.get(rule)
    if d is None:
        d = _OUTLINED[rule] = compiled_only(rule.py_func)
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


class Gen:
    """Turns a :class:`Plan` into unit code (deduplicated) and the tables that run it."""

    def __init__(self, plan: Plan):
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
        used = set(REDO.findall("\n".join(out)))
        return [x for r, src in self.redo_src.items() if r in used for x in src] + out

    def shared(self):
        """The fused loops that go to unit modules of their own (see :func:`unit_module`):
        all but custom ops' (which call the tape's own user functions). Not called when the
        units are inlined into the sweeps (see ``INLINE_KINDS``)."""
        return [
            name for name, (_, lines, inline) in self.blocks.items()
            if not inline and not any(CUSTOM.search(x) or TAPE_ARRAYS.search(x) for x in lines)
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
                "from tape.layout.views import span as _span",
                "from tape.compiler.emit import outline_rule as _outline_rule",
                "from tape.compiler.emit import sum_reassoc as _sum_reassoc",
                "from tape.ops.registry import BY_NAME",
                "",
                *rule_names(ops),
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
        name = f"x{tag(kind)}{c.n(b)}"
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
        if (
            g.fold >= 0 and o == int(p.owner[p.ins[g.fold][0]]) and not self.sums_by_blocks(g)
            and not self.sums_in_loop(g)
        ):  # fmt: skip
            return True  # summed by a second pass over the arena (long loops sum by blocks)
        cheap = p.ops[i].cheap or self.int_power(i) is not None
        return not cheap and bool(p.emask[i])

    @staticmethod
    def sums_by_blocks(g):
        """Group ``g``'s folded sum is taken block by block with its loop (a long loop, or
        one over rows), not by a second pass over the stored values."""
        return g.n >= BLOCK_MIN or g.rows > 1

    def sums_in_loop(self, g):
        """Group ``g``'s folded sum is over at most ``SHORT_SUM`` elements of a flat loop and
        of a value the loop makes: it is added up in the loop itself, element after element
        (the order a second pass would take, with no store), so a reverse loop that recomputes
        the values can take the same sum to the same bits (:meth:`sum_in_reverse`)."""
        if g.fold < 0 or g.rows > 1 or g.n > SHORT_SUM:
            return False
        src = int(self.p.owner[self.p.ins[g.fold][0]])
        return any(int(self.p.E[i, E_OUT]) == src for i in g.entries)

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
            if isinstance(unit, Call) and self.p.ops[unit.entries[0]] is CALLBACK_OP:
                if self.p.part(unit.entries[0]) == 0:  # the group's first entry runs the call
                    rows.append(self.custom_forward(unit.entries[0]))
            elif isinstance(unit, Call):
                rows.append(self.forward_call(unit.entries[0]))
            else:
                rows.append(self.forward_group(u, unit))
            units += [u] * (len(rows) - len(units))  # the unit of each row
        tail = 0
        while tail < len(units) and self.sum_in_reverse(units[-1 - tail]):
            tail += 1
        return rows, tail

    def sum_in_reverse(self, u):
        """Unit ``u`` is a fused loop summed into the output, which nothing else reads, and
        stores no value: its reverse loop, which recomputes every value anyway, also sums them
        (in the same blocks and order as the forward loop, so to the same bits), and the
        one-call gradient skips its forward loop. A long loop (blocks, vectorised) or a short
        one whose sum is taken element by element (:meth:`sums_in_loop`)."""
        p = self.p
        g = p.units[u]
        if not isinstance(g, Group) or g.fold < 0 or g.fold_rows or not p.emask[g.fold]:
            return False
        short = self.sums_in_loop(g)
        if g.m < BLOCK_MIN and not short:
            return False
        o = int(p.E[g.fold, E_OUT])
        if o not in p.root_owners or o in p.pinned or p.uses.get(o):
            return False
        return all((short or self.vectorises(i)) and not self.stored(u, i) for i in g.entries)

    def forward_call(self, i):
        op = self.p.ops[i]
        c = Code(self.p.B)
        c.p(i)
        doc = f"Entry P[0]: {op.name}{', broadcasting' if op.kind != 'structural' else ''}."
        call = (
            f"st = interp_sweeps.run_fwd({op.code}, P[0], entries, bufs, ipool, data)  # {op.name}"
        )
        return self.add("_fwd", c, doc, [call], inline=True), c.params

    @staticmethod
    def length(g):
        """The length of group ``g``'s loop if it is flat (it then comes from ``P[0]``), else
        ``None`` (a loop over rows)."""
        return g.m if g.rows == 1 else None

    @staticmethod
    def block_of(c, g):
        """The text of the block length of group ``g``'s loop in blocks: ``BLOCK``, or the
        loop's length if shorter."""
        return str(BLOCK) if g.m >= BLOCK else c.size(g.m)

    def forward_group(self, u, g):
        p = self.p
        c = Code(p.B, True, self.length(g))
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
        elif self.sums_in_loop(g):
            c("acc = 0.0")
            c(f"for j in range({c.size(g.m)}):")
            for line in lines + [f"acc += v{c.n(int(p.owner[p.ins[g.fold][0]]))}"]:
                c(line, 2)
            c(f"{c.at('data', int(p.E[g.fold, E_OUT]))} = acc")
        else:
            c(f"for j in range({c.size(g.m)}):")
            for line in lines:
                c(line, 2)
        if g.fold >= 0 and not self.sums_by_blocks(g) and not self.sums_in_loop(g):
            # a second, vectorised pass over the stored values: twice as fast as adding them up
            # in the loop, where every add waits for the one before
            o = int(p.E[g.fold, E_OUT])
            src = int(p.owner[p.ins[g.fold][0]])
            if g.n <= SHORT_SUM:  # a value the loop does not make (summed as it is loaded)
                c("acc = 0.0")
                c(f"for j in range({c.size(g.n)}):")
                c(f"acc += {c.view('data', src)}[j]", 2)
                c(f"{c.at('data', o)} = acc")
            else:
                c(f"{c.at('data', o)} = _sum_reassoc({c.view('data', src)})")
        if g.m < BLOCK_MIN:
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
        used = sorted({m for line in lines for m in AT_J.findall(line)})
        lines = [AT_J.sub(r"\1_[jj]", x) for x in lines]
        c.once("acc = 0.0")
        c(f"for j0 in range(0, {n}, {blk}):")
        c(f"m = min({blk}, {n} - j0)", 2)
        for name in used:
            c(f"{name}_ = _span({name}, j0, m)", 2)
        c("for jj in range(m):", 2)
        for line in lines:
            c(line, 3)
        c(f"acc += _sum_reassoc({c.view('data', src) + '_' if stored else '_span(bs, 0, m)'})", 2)
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
            if isinstance(unit, Call) and p.ops[unit.entries[0]] is CALLBACK_OP:
                i = unit.entries[0]
                if p.part(i) == 0 and p.emask[i]:
                    rows.append(self.custom_reverse(i))
                    call = p.t.callbacks[p.call_id(i)]
                    touched.update(int(p.owner[b]) for b in call.ins)
            elif isinstance(unit, Call):
                i = unit.entries[0]
                if p.emask[i]:
                    rows.append(self.reverse_call(i))
                    touched.update(int(p.owner[b]) for b in p.ins[i])
            elif any(p.emask[i] for i in unit.entries):
                rows.append(self.reverse_group(u, unit, touched, assigned, aliased))
        return rows, assigned

    def reverse_call(self, i):
        op = self.p.ops[i]
        c = Code(self.p.B)
        c.p(i)
        call = (
            f"interp_sweeps.run_rev({op.code}, P[0], entries, bufs, ipool, data, grad)  # {op.name}"
        )
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
        c = Code(self.p.B)
        args = self._custom_args(c, call)
        c(f"_c_store({c.view('data', call.outs[0])}, {u}_fwd({', '.join(args)}))")
        return self.add("_fwd", c, f"{call.fn.name} (custom op)."), c.params

    def custom_reverse(self, i):
        p = self.p
        call = p.t.callbacks[p.call_id(i)]
        u = self.custom_name(i)
        c = Code(p.B)
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
            if len(views) < 2 or views[-1][0] - low > SHIFT_MAX:
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
        c = Code(B, True, self.length(g))
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
                    target = f"e{tag(kind)}{c.n(b)}"
                    full[target] = (b, kind)
                fast.append(f"{target} += {rule}")
                slow.append(f"{target} += _masked({rule}, a{o})")
        # (adjoint view, "+=", "=" or "=?" (= where the leaves are zeroed), [contribution])
        out = [(c.view("grad", b, kind), "+=", [name]) for name, (b, kind) in full.items()]
        shift, tails = {}, []
        blocks = g.m >= BLOCK_MIN and all(self.vectorises(i) for i in g.entries)
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
        fold = None
        if self.sum_in_reverse(u):  # (value summed, where the sum goes)
            fold = (f"v{c.n(int(p.owner[p.ins[g.fold][0]]))}",
                    c.at("data", int(p.E[g.fold, E_OUT])))  # fmt: skip
        if not blocks:
            call = self.outline_redo(loads, consts, vals, adj, targets, slow)
            _element_loop(c, c.size(g.m), targets, main, [call], out, scalar, fold)
        else:
            _block_loop(c, g, targets, pre, main, redo, out, scalar, fold, shift, tails)
        for name, (b, per_row) in scalar.items():
            c(f"{c.at('grad', b, per_row)} += s{name[1:]}")
        if g.m < BLOCK_MIN:
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


def _element_loop(c, n, targets, main, redo, out, scalar, fold=None):
    """A short fused reverse loop, element by element, adding to the adjoint arenas as it goes
    (no scratch to allocate). ``redo``: the lines that redo an element with NaN. ``fold``:
    ``(value, where its sum goes)``, summed element by element as the forward loop sums it
    (:meth:`Gen.sum_in_reverse`)."""
    if fold is not None:
        c("acc = 0.0")
    c(f"for j in range({n}):")
    for line in main:
        c(line, 2)
    if fold is not None:
        c(f"acc += {fold[0]}", 2)
    c(f"if {' or '.join(f'{t} != {t}' for t in targets)}:", 2)
    for line in redo:
        c(line, 3)
    for view, op, (name,) in out:
        c(f"{view}[j] {op} {name}", 2)
    for name in scalar:
        c(f"s{name[1:]} += {name}", 2)
    if fold is not None:
        c(f"{fold[1]} = acc")


def _block_loop(c, g, targets, pre, main, redo, out, scalar, fold=None, shift=None, tails=()):
    """A fused reverse loop in blocks of ``BLOCK`` elements: the loop over a block computes
    the inputs' adjoint contributions into scratch arrays (one per input, in the L1 cache), and
    the adds into the adjoint arenas follow in loops of their own (one per view, or per group
    of views of one buffer: ``shift`` and ``tails``, see :meth:`Gen.shifted_adds`). With no
    store that may alias a load (``x[1:]`` and ``x[:-1]`` add to the same leaf) and no branch
    (the NaN test is an OR over the block), the main loop vectorises."""
    blk, n = Gen.block_of(c, g), c.size(g.m)
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
    used = sorted({m for line in main + redo + [a for a, _ in adds] for m in AT_J.findall(line)})
    main, redo = ([AT_J.sub(r"\1_[jj]", x) for x in xs] for xs in (main, redo))
    adds = [(AT_J.sub(r"\1_[jj]", a), op) for a, op in adds]
    for t in targets:
        # a shifted one's first places hold the previous block's last contributions
        c.once(f"b{t} = np.zeros({blk} + {shift[t]})" if t in shift else f"b{t} = np.empty({blk})")
    c(f"for j0 in range(0, {n}, {blk}):")
    c(f"m = min({blk}, {n} - j0)", 2)
    for name in used:
        c(f"{name}_ = _span({name}, j0, m)", 2)
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
        c(f"s{name[1:]} += _sum_reassoc(_span(b{name}, 0, m))", 2)
    if fold is not None:
        c("acc += _sum_reassoc(_span(bs, 0, m))", 2)
        c.once(f"{fold[1]} = acc", after=True)
    for line in tails:
        c(line)


def _views_text(t, n_ints, tables_read):
    """The lines that make the entry and buffer tables, the pool (parts of ``ints``) and the
    value and adjoint arenas (parts of ``arena``) as views holding no reference (``_span``,
    ``_table``: a Numba slice or reshape takes an atomic reference count, a large share of a
    small tape's call). Without ``tables_read`` (the sweeps are inlined and no unit reads
    the entry or buffer table) the two tables are not made."""
    we, wb = t.entries.shape[1], t.bufs.shape[1]
    ne, nb, nd = t.n_entries * we, t.n_bufs * wb, t.n_data
    if not tables_read:
        lines = ["    entries = bufs = ints  # unread: the inlined units take them, unused"]
    else:
        lines = [f"    entries = _table(ints, 0, {t.n_entries}, {we})",
                 f"    bufs = _table(ints, {ne}, {t.n_bufs}, {wb})"]  # fmt: skip
    return lines + [
        f"    ipool = _span(ints, {ne + nb}, {n_ints - ne - nb})",
        f"    data = _span(arena, 0, {nd})",
        f"    grad = _span(arena, {nd}, {nd})",
    ]


def gradient_args_text(t, B, n_ints, tables_read, n_run):
    """``gradient_args``: :meth:`Tape.gradient`'s whole call in one compiled function (load
    the arguments at their offsets, then what ``forward_backward`` does), so a replay from
    Python pays one dispatch, with few array arguments (each adds to the call's cost): the
    tape's integer arrays as one (``ints``, made by :meth:`tape.Tape.compile`) and its value and adjoint
    arenas as one (``arena``: ``data`` then ``grad``). The arguments' dtypes and numbers of
    axes are the caller's to check (:mod:`tape.compiler.args`), their shapes are checked here
    (``ARGS_DIFFER``). The tables and arenas are views (:func:`_views_text`)."""
    xs = [f"x{k}" for k in range(len(t.inputs))]
    nd = t.n_data
    out = [
        "@njit(**COMPILED_JIT)",
        f"def gradient_args(ints, arena, {', '.join(xs)}):",
        '    """Load the arguments (of the recorded shapes, any layout), zero the leaf',
        "    adjoints, replay forward and backward. Returns the forward status (``-1``: done;",
        f"    {ARGS_DIFFER}: an argument is not of its recorded shape, and nothing ran;",
        '    otherwise the gradients are untouched)."""',
        # views holding no reference (tape.layout.views.borrow): the check below can raise,
        # and Numba then keeps an atomic reference count per array and call
        "    " + ", ".join(["ints", "arena", *xs]) + " = "
        + ", ".join(f"_borrow({v})" for v in ["ints", "arena", *xs]),
        f"    if ints.shape[0] != {n_ints} or arena.shape[0] != {2 * nd}:",
        f"        raise ValueError({STALE_POOL!r})",
        *_views_text(t, n_ints, tables_read),
    ]
    for x, b in zip(xs, t.inputs):  # every shape checked before anything is written
        dims = [f"{x}.shape[{i}] != {d}" for i, d in enumerate(t.shapes[b])]
        if dims:
            out += [f"    if {' or '.join(dims)}:", f"        return {ARGS_DIFFER}"]
    out += [f"    _load(data, {int(B[b, B_OFF])}, {x})" for x, b in zip(xs, t.inputs)]
    out += [
        f"    st = _forward_units(entries, bufs, ipool, data, {n_run})",
        "    if st >= 0:",
        "        return st",
        "    _zero_adjoints(ipool, grad, np.bool_(True))",
        f"    grad[{int(B[t.outputs[0], B_OFF])}] += 1.0",
        "    _reverse_units(entries, bufs, ipool, data, grad, np.bool_(True))",
        "    return -1",
        "",
        "",
    ]
    return out


NJIT_STOPPED = (
    "tape: t.njit_gradient: the sweep stopped (a failed guard: these arguments take another "
    "path than the recording, or an op rejected its data, as a gather index out of bounds); "
    "call t.gradient() from Python with the same arguments for the details"
)


def njit_gradient_text(t, B, n_ints, tables_read, n_run):
    """``njit_gradient_impl(ints, arena, x0, .., g0, ..)``: the body of ``t.njit_gradient``
    (:func:`tape.compiler.compiled.njit_gradient`), which passes the tape's integer arrays (a
    constant array, or a view of the caller's workspace) and the value and adjoint arenas
    (the first cells of the caller's workspace, ``work``). Checks every argument's shape first (Numba checks no bounds),
    loads the arguments, runs what :func:`gradient_args_text`'s function runs and writes the
    differentiated arguments' gradients into the ``g`` arrays (any layout). A sweep that
    stops (a guard, a gather out of bounds) raises: its gradients would be stale."""
    xs = [f"x{k}" for k in range(len(t.inputs))]
    gs = [f"g{k}" for k in range(len(t.wrt))]
    nd = t.n_data
    out = [
        # inlined (Numba IR) into t.njit_gradient, where the tables are constants (for
        # tapes whose units are all inlined): LLVM folds the table reads away
        "@njit(inline='always', **UNIT_JIT)",
        f"def njit_gradient_impl(ints, arena, {', '.join(xs + gs)}):",
        '    """t.njit_gradient\'s body (see tape.compiler.emit.njit_gradient_text)."""',
        f"    if ints.shape[0] != {n_ints} or arena.shape[0] != {2 * nd}:",
        f"        raise ValueError({STALE_POOL!r})",
    ]
    for names, bs, what in ((xs, t.inputs, "argument"), (gs, [t.inputs[k] for k in t.wrt], "gradient")):
        for k, (v, b) in enumerate(zip(names, bs)):
            shape = tuple(t.shapes[b])
            test = " or ".join(f"{v}.shape[{d}] != {s}" for d, s in enumerate(shape))
            out += [f"    if {test}:",
                    f"        raise ValueError('t.njit_gradient: {what} {k} must have shape {shape}')"]
    out += _views_text(t, n_ints, tables_read)

    def nest(v, b, store):  # a loop over every element of v (any layout), C order
        shape = tuple(t.shapes[b])
        off = int(B[b, B_OFF])
        lines, flat = [], []
        for d, s in enumerate(shape):
            lines.append("    " * (d + 1) + f"for i{d} in range({s}):")
            stride = int(np.prod(shape[d + 1 :], dtype=np.int64))
            flat.append(f"i{d} * {stride}" if stride != 1 else f"i{d}")
        at = f"{v}[{', '.join(f'i{d}' for d in range(len(shape)))}]"
        cell = f"{'grad' if store else 'data'}[{off} + {' + '.join(flat)}]"
        pad = "    " * (len(shape) + 1)
        lines.append(pad + (f"{at} = {cell}" if store else f"{cell} = {at}"))
        return lines

    for x, b in zip(xs, t.inputs):
        out += nest(x, b, False)
    out += [
        f"    st = _forward_units(entries, bufs, ipool, data, {n_run})",
        "    if st >= 0:",
        f"        raise RuntimeError({NJIT_STOPPED!r})",
        "    _zero_adjoints(ipool, grad, np.bool_(True))",
        f"    grad[{int(B[t.outputs[0], B_OFF])}] += 1.0",
        "    _reverse_units(entries, bufs, ipool, data, grad, np.bool_(True))",
    ]
    for g, k in zip(gs, t.wrt):
        out += nest(g, t.inputs[k], True)
    out += ["", ""]
    return out


def zeroing_text(ranges, table, depth):
    """Lines that zero the adjoint ranges ``ranges``: one loop over each when there are few
    (constants: no table to read), else a loop over their ``table`` in the pool (``(flat
    slice, rows, 2)``)."""
    pad = "    " * depth
    if len(ranges) <= FEW_RANGES:
        out = [f"{pad}for j in range({a}, {z}):\n{pad}    grad[j] = 0.0" for a, z in ranges]
        return out or [f"{pad}pass"]
    flat, rows, _ = table
    return [
        f"{pad}Z = {flat}",
        f"{pad}for r in range({rows}):",
        f"{pad}    grad[Z[2 * r] : Z[2 * r + 1]] = 0.0",
    ]


def adjoint_ranges(B, bufs):
    """Merged ``[start, stop)`` arena ranges covering the buffers ``bufs``, as an array."""
    spans = sorted((int(B[b, B_OFF]), int(B[b, B_OFF] + B[b, B_SIZE])) for b in bufs)
    out: list[list[int]] = []
    for a, z in spans:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], z)
        else:
            out.append([a, z])
    return np.array([(a, z) for a, z in out if z > a], np.int64).reshape(-1, 2)


def table_text(rows, names, shared=()):
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


def dispatch_text(table, names, blocks, status, count=None, shared=()):
    """The loop over a table (``(flat slice of the pool, rows, width)``) that runs each row's
    unit (the first ``count``, an expression, if given): one dispatch per unit. The loops of
    unit modules (``shared``) are called through the unit table (:mod:`tape.interpreter.dispatch`): the
    tape's code does not compile them in."""
    flat, rows, w = table  # row u: the unit's kind, then its parameters
    lines = [f"    T = {flat}", f"    for u in range({count or rows}):", f"        k = T[u * {w}]",
             f"        P = _span(T, u * {w} + 1, {w - 1})"]  # fmt: skip
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
