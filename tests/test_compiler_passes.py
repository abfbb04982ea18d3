"""The compiled tier's passes on hand-built programs, without Numba.

A program here is a :class:`tape.program.core.Tape` built entry by entry (``new_buffer``,
``add_entry``: nothing runs), so each test states exactly what the pass sees. The analysis
(:class:`tape.compiler.analyse.Plan`: liveness, constants, common subexpressions, fusion and
scheduling into units) and the code generator (:class:`tape.compiler.emit.Gen`, source text)
must not compile anything: a Numba compile event during these tests fails them.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba.core import event

from tape.compiler.analyse import Call, Group, Plan
from tape.compiler.compiled import generate
from tape.layout.columns import ACTIVE, CONST, LEAF
from tape.ops.blocks import broadcast
from tape.ops.blocks import reduce as reduce_block
from tape.ops.registry import BY_NAME
from tape.program.core import Tape


class _Compiles(event.Listener):
    def __init__(self):
        self.names = []

    def on_start(self, ev):
        py = getattr(ev.data.get("dispatcher"), "py_func", None)
        self.names.append(getattr(py, "__qualname__", "?"))

    def on_end(self, ev):
        pass


@pytest.fixture(autouse=True)
def no_numba_compile():
    listener = _Compiles()
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)
    assert not listener.names, f"a pass compiled with Numba: {listener.names}"


class Program:
    """A tape built by hand: ``x = p.leaf(n)``, ``y = p.op("sin", x)``, ``p.out(y)``."""

    def __init__(self):
        self.t = Tape()

    def leaf(self, n):
        b = self.t.new_buffer((n,), LEAF, np.linspace(0.5, 1.5, n))
        self.t.inputs.append(b)
        self.t.wrt.append(b)
        return b

    def const(self, n, value):
        return self.t.new_buffer((n,), CONST, np.full(n, value))

    def op(self, name, *ins):
        t = self.t
        shapes = [t.shapes[b] for b in ins]
        out_shape, block = broadcast.encode(name, shapes)
        y = t.new_buffer(out_shape, ACTIVE)
        t.add_entry(BY_NAME[name].code, ins, y, block)
        return y

    def sum(self, x):
        t = self.t
        shape = t.shapes[x]
        y = t.new_buffer((), ACTIVE)
        t.add_entry(
            BY_NAME["sum"].code, (x,), y, reduce_block.encode(shape, tuple(range(len(shape))))
        )
        return y

    def out(self, y):
        self.t.outputs.append(y)
        return self.t


def test_elementwise_chain_and_its_sum_fuse_into_one_unit():
    p = Program()
    x = p.leaf(256)
    y = p.op("mul", x, x)
    z = p.op("sin", y)
    t = p.out(p.sum(z))
    plan = Plan(t)
    assert plan.live == [0, 1, 2]
    assert len(plan.units) == 1
    (g,) = plan.units
    assert isinstance(g, Group) and g.entries == [0, 1] and g.fold == 2 and g.n == 256


def test_dead_entries_are_dropped():
    p = Program()
    x = p.leaf(8)
    y = p.op("exp", x)
    p.op("cos", x)  # read by nothing
    t = p.out(p.sum(y))
    plan = Plan(t)
    assert 1 not in plan.live
    assert plan.live == [0, 2]


def test_entries_on_constants_only_are_not_replayed():
    p = Program()
    x = p.leaf(8)
    c = p.op("exp", p.const(8, 2.0))  # depends on no argument: computed once, at record time
    y = p.op("mul", x, c)
    t = p.out(p.sum(y))
    plan = Plan(t)
    assert 0 not in plan.live and plan.live == [1, 2]


def test_common_subexpressions_merge():
    p = Program()
    x = p.leaf(32)
    a = p.op("sin", x)
    b = p.op("sin", x)  # the same op on the same memory: a duplicate of entry 0
    y = p.op("mul", a, b)
    t = p.out(p.sum(y))
    plan = Plan(t)
    assert plan.dup_of == {1: 0}
    assert 1 not in plan.live
    # the product now reads the survivor twice
    assert plan.ins[2] == [a, a]


def test_a_matrix_product_is_a_call_between_fused_groups():
    p = Program()
    t = p.t
    x = p.leaf(6)  # a 2 x 3 matrix, seen as (1, 2, 3)
    w = t.new_buffer((3,), CONST, np.ones(3))
    y = t.new_buffer((2,), ACTIVE)
    from tape.ops.blocks import matmul as mm

    t.add_entry(BY_NAME["matmul"].code, (x, w), y, mm.encode(1, 2, 3, 1, 6, 3))
    z = p.op("tanh", y)
    plan = Plan(p.out(p.sum(z)))
    kinds = [type(u).__name__ for u in plan.units]
    assert kinds == ["Call", "Group"]
    assert isinstance(plan.units[0], Call) and plan.units[0].entries == [0]


def test_the_generator_writes_source_without_compiling():
    p = Program()
    x = p.leaf(128)
    y = p.op("mul", x, p.op("exp", x))
    t = p.out(p.sum(y))
    gen = generate(t)
    # one fused loop, forward and reverse, as unit modules for the shared runtime
    assert gen.table_calls is not None and len(gen.units) == 2
    text = "\n".join(gen.units.values())
    assert "def unit(" in text and "exp" in text
