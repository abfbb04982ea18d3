"""The compiled tier (``t.compile()``, :mod:`tape.compiled`) against the interpreter.

Every registry op (elementwise over every shape of ``tests/test_ops.py``, every kernel case) is
recorded once, replayed on both tiers at new arguments, and must agree to 1e-12 relative in
float64; the conformance table runs the tier as its ``compiled`` backends
(``tests/test_conformance.py``). The interpreter is itself checked against NumPy and finite
differences by ``tests/test_ops.py``; here a gradient check is repeated on the compiled tier
for the fused paths.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit

import tape as tp
from tape.compiler import compiled, params
from tape.frontend.testing import sample_inputs as sample
from tape.ops.registry import OPS

sys.path.insert(0, os.path.dirname(__file__))
from test_ops import KERNEL_CASES, shapes_for  # noqa: E402
from test_properties import build  # noqa: E402

RTOL = 1e-12


def unit_text(src, name):
    """The code of unit ``name`` in a compiled tape's listing: its unit module (``# ---- name
    = tape_unit_...``), or its function in the tape's module (inlined tapes)."""
    if f"# ---- {name} = " in src:
        return src.split(f"# ---- {name} = ")[1].split("# ---- ")[0]
    return src.split(f"def {name}(")[1].split("\n@njit")[0]


def both(fn, *args, wrt=None):
    """The same function recorded twice: interpreter and compiled."""
    ti = tp.record(fn, *args, wrt=wrt, compile=False)
    tc = tp.record(fn, *args, wrt=wrt, compile=True)
    assert ti.tier == "interpreter" and tc.tier == "compiled"
    return ti, tc


def close(a, b, rtol=RTOL):
    a, b = np.asarray(a, float), np.asarray(b, float)
    np.testing.assert_allclose(
        a, b, rtol=rtol, atol=rtol * max(1.0, float(np.abs(b).max(initial=0)))
    )


def agree(ti, tc, *args):
    vi, gi = ti.value_and_grad(*args)
    vc, gc = tc.value_and_grad(*args)
    close(vc, vi)
    gi = gi if isinstance(gi, tuple) else (gi,)
    gc = gc if isinstance(gc, tuple) else (gc,)
    gd = tc.gradient(*args)  # the one-call path of a compiled tape
    gd = gd if isinstance(gd, tuple) else (gd,)
    for _ in range(2):  # the second, a compiled tape's one-call forward
        vf = tc.forward(*args)
        assert type(vf) is type(vi)
        close(vf, vi)
    for a, d, b in zip(gc, gd, gi):
        assert a.dtype == d.dtype == b.dtype and a.shape == d.shape == b.shape
        close(a, b)
        close(d, b)


ELEMENTWISE = [op for op in OPS if op.kind != "structural"]

# The compiled tier emits one loop skeleton per broadcast pattern and inlines the op's rules
# into it; what else changes with the op is its record's facts (cheap: recomputed in the
# reverse loop; vectorises: blocked loops). So every op runs here with a same-shape, a scalar
# and an outer-product pattern, and the first op of each (kind, cheap, vectorises) class with
# every pattern of tests/test_ops.py.
FEW_SHAPES = {
    "unary": [((),), ((3, 4),)],
    "binary": [((3, 4), (3, 4)), ((), (3, 4)), ((3, 1), (1, 4))],
}
EVERY_SHAPE = {}
for _op in ELEMENTWISE:
    EVERY_SHAPE.setdefault((_op.kind, _op.cheap, _op.vectorises, any(_op.differentiable)), _op.name)
EVERY_SHAPE = set(EVERY_SHAPE.values())


def compiled_shapes(op):
    """The shape groups ``op`` runs with on both tiers (see FEW_SHAPES)."""
    if op.name in EVERY_SHAPE or op.kind not in FEW_SHAPES:
        return shapes_for(op)
    return FEW_SHAPES[op.kind]


def test_every_class_of_elementwise_op_runs_every_broadcast_pattern():
    classes = {(op.kind, op.cheap, op.vectorises, any(op.differentiable)) for op in ELEMENTWISE}
    covered = {
        (op.kind, op.cheap, op.vectorises, any(op.differentiable))
        for op in ELEMENTWISE
        if compiled_shapes(op) == shapes_for(op)
    }
    assert covered == classes


@pytest.mark.parametrize("op", ELEMENTWISE, ids=lambda o: o.name)
def test_elementwise_op_on_both_tiers(op):
    """The op's shape groups (:func:`compiled_shapes`) in one tape (one compile): values and
    outputs of every shape, and the gradient of a weighted sum."""
    rng = np.random.default_rng(7)
    groups = compiled_shapes(op)
    arity = len(groups[0])
    flat = [x for shapes in groups for x in sample(op, shapes, rng)]
    weights = [rng.uniform(0.5, 1.5, np.broadcast_shapes(*s)) for s in groups]
    fn = getattr(tp, op.name)

    def f(*xs):
        total = 0.0
        for k in range(len(groups)):
            y = fn(*xs[k * arity : (k + 1) * arity])
            total = total + (y * weights[k]).sum()
        return total

    wrt = [k for k in range(len(flat)) if op.differentiable[k % arity]]
    if not wrt:  # comparisons: the values must agree
        ti, tc = both(
            lambda *xs: [fn(*xs[k * arity : (k + 1) * arity]) for k in range(len(groups))], *flat
        )
        new = [x for shapes in groups for x in sample(op, shapes, rng)]
        for a, b in zip(tc.forward(*new), ti.forward(*new)):
            close(a, b)
        return
    ti, tc = both(f, *flat, wrt=wrt)
    new = [x for shapes in groups for x in sample(op, shapes, rng)]
    agree(ti, tc, *new)


CASES = [(n, k, c) for n, cases in KERNEL_CASES.items() for k, c in enumerate(cases)]


@pytest.mark.parametrize("name,k,case", CASES, ids=[f"{n}-{k}" for n, k, _ in CASES])
def test_kernel_op_on_both_tiers(name, k, case):
    fn, _, xs = case
    w = np.random.default_rng(k).uniform(0.5, 1.5, np.shape(fn(*[tp.tensor(x) for x in xs])))
    f = lambda *a: (tp.tanh(fn(*a)) * w).sum()  # noqa: E731  (feeds a fused loop too)
    ti, tc = both(f, *xs)
    agree(ti, tc, *xs)


def rosenbrock(x):
    return tp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rosenbrock_grad(x):
    g = np.zeros_like(x)
    a = x[1:] - x[:-1] ** 2
    g[:-1] = -400 * a * x[:-1] - 2 * (1 - x[:-1])
    g[1:] += 200 * a
    return g


def test_rosenbrock_is_one_fused_loop_and_its_sum():
    x = np.random.default_rng(0).uniform(-1, 2, 50)
    t = tp.record(rosenbrock, x, compile=True)
    src = t.compiled_source
    # one loop forward, one reverse; short, so its length comes from its table row
    assert src.count("for j in range(P[0])") == 2 and "range(49)" not in src
    assert "_k_sum" not in src and "_sum_reassoc(" in src  # the sum: with the loop
    x2 = x[::-1].copy()
    close(t.gradient(x2), rosenbrock_grad(x2))
    close(t.forward(x2), np.sum(100 * (x2[1:] - x2[:-1] ** 2) ** 2 + (1 - x2[:-1]) ** 2))


def test_long_fused_reverse_runs_in_blocks():
    # 2,499 elements: two full blocks and a partial one; x[1:] and x[:-1] add to one leaf
    x = np.random.default_rng(1).uniform(-1, 2, 2500)
    t = tp.record(rosenbrock, x, compile=True)
    src = t.compiled_source
    # forward (summed block by block, the summed values never stored) and reverse: in blocks
    assert src.count("for j0 in range(0, P[0], 1024)") == 2 and "bs[jj] = " in src
    ti = tp.record(rosenbrock, x, compile=False)
    for x2 in (x, np.cos(x), x[::-1].copy()):
        g = t.gradient(x2)
        close(g, rosenbrock_grad(x2))
        np.testing.assert_allclose(g, ti.gradient(x2), rtol=1e-12, atol=1e-300)


def second_difference_grad(x):
    """NumPy's gradient of ``sum(d2 * d2)``, ``d2 = x[2:] - 2 x[1:-1] + x[:-2]``."""
    g = np.zeros_like(x)
    d2 = x[2:] - 2.0 * x[1:-1] + x[:-2]
    g[2:] += 2.0 * d2
    g[1:-1] -= 4.0 * d2
    g[:-2] += 2.0 * d2
    return g


def test_shifted_views_of_one_buffer_add_their_adjoints_in_one_pass():
    """x[2:], x[1:-1] and x[:-2] (a second difference), and y[1:] and y[:-1] of an intermediate
    y: each group adds into its buffer in one pass per block, the contributions past a block's
    end carried to the next block and those past the last block added after it. 1,027
    elements: the last block of the second difference has one element, fewer than its shift
    of 2. The zeros that sqrt meets at block edges make the redo path run too."""

    def f(x):
        d2 = x[2:] - 2.0 * x[1:-1] + x[:-2]
        y = x * x + 1.0
        p = y[1:] * y[:-1]
        return tp.sum(d2 * d2) + tp.sum(tp.where(p > 2.0, tp.sqrt(p - 2.0), 0.0))

    def grad(x):
        g = second_difference_grad(x)
        y = x * x + 1.0
        p = y[1:] * y[:-1]
        s = np.where(p > 2.0, 0.5 / np.sqrt(np.where(p > 2.0, p - 2.0, 1.0)), 0.0)
        gy = np.zeros_like(x)
        gy[1:] += s * y[:-1]
        gy[:-1] += s * y[1:]
        return g + 2.0 * x * gy

    rng = np.random.default_rng(11)
    x = rng.uniform(0.2, 1.5, 1027)
    for k in (0, 1022, 1023, 1025):  # p = 2 exactly there: sqrt's partial is inf, times 0
        x[k], x[k + 1] = 1.0, 0.0
    ti, tc = both(f, x)
    src = tc.compiled_source
    assert re.search(r"\+= b\w+\[jj\] \+ b\w+\[jj\] \+ b\w+\[jj\]", src)  # three views
    assert re.search(r"\[jj \+ 2\] = ", src) and re.search(r"\[jj \+ 1\] = ", src)
    for x2 in (x, x[::-1].copy(), np.cos(x)):
        g = tc.gradient(x2)
        assert np.all(np.isfinite(g))
        close(g, grad(x2))
        np.testing.assert_allclose(g, ti.gradient(x2), rtol=1e-12, atol=1e-12)
    close(central_differences(f, x2[:40].copy(), eps=1e-6), grad(x2[:40].copy()), rtol=1e-6)
    # backward without zeroing: the merged pass adds to what the leaf's adjoint holds
    tc.zero_grad()
    tc.forward(x)
    tc.backward()
    tc.backward()
    close(tc.grads[0], 2.0 * grad(x))


@pytest.mark.parametrize("n", [3000, 10])
def test_final_sum_is_taken_in_the_reverse_loop_and_its_forward_skipped(n):
    """A fused loop summed into the output, with no value stored: the one-call gradient skips
    its forward loop and the reverse loop sums the values, in the forward's order (a long
    loop's blocks; a short loop's elements one after the other), so value_and_grad's value is
    the forward's to the bit."""
    x = np.random.default_rng(5).uniform(-1.0, 2.0, n)
    t = tp.record(rosenbrock, x, compile=True)
    src = t.compiled_source
    assert "the one-call gradient runs the first 0 of the 1 forward units" in src
    if n > params.SHORT_SUM:
        assert "acc += _sum_reassoc(_span(bs, 0, m))" in unit_text(src, "_rev0")
    else:  # summed in both loops, element by element, and no value stored
        assert "acc += v" in unit_text(src, "_fwd0") and "acc += v" in unit_text(src, "_rev0")
        assert not re.search(r"\w+\[j\] = v\d+", unit_text(src, "_fwd0"))
    ti = tp.record(rosenbrock, x, compile=False)
    for x2 in (x, np.sin(x), -x):
        v, g = t.value_and_grad(x2)
        assert v == t.forward(x2)  # same blocks, same order: the same bits
        close(v, np.sum(100.0 * (x2[1:] - x2[:-1] ** 2) ** 2 + (1.0 - x2[:-1]) ** 2))
        close(g, rosenbrock_grad(x2))
        close(t.gradient(x2), g)
        vi, gi = ti.value_and_grad(x2)
        np.testing.assert_allclose(v, vi, rtol=1e-12)
        # forward, then backward over it: the reverse writes the same value again
        t.zero_grad()
        t.forward(x2)
        t.backward()
        close(t.grads[0], g)


def test_value_and_grad_gives_the_value_as_forward_does():
    """``value_and_grad``'s value is ``forward``'s, of the same type, dtype and shape, on both
    tiers: a 0-d output (read straight from the arena), a float32 tape, an output of shape
    ``(1,)`` and a 0-d output of another dtype than the arena's (through ``outputs_of``)."""
    x = np.linspace(-1.0, 1.0, 5)
    fns = (
        (rosenbrock, x),
        (rosenbrock, x.astype(np.float32)),
        (lambda x: tp.sum(x * x, keepdims=True), x),
        (lambda x: tp.sum(x * x).astype(np.float32), x),
    )
    for fn, x0 in fns:
        for compile in (False, True):
            t = tp.record(fn, x0, compile=compile)
            for x2 in (x0, x0 * 0.5):
                v, g = t.value_and_grad(x2)
                want = t.forward(x2)
                assert type(v) is type(want) and np.shape(v) == np.shape(want)
                assert np.asarray(v).dtype == np.asarray(want).dtype
                assert np.array_equal(v, want)
                close(g, t.gradient(x2))


def test_blocked_reverse_redoes_the_elements_that_met_zero_times_inf():
    # sqrt's partial at 0 is inf, times the zero adjoint where() sends it: the fast loop gets
    # a NaN there, and the element is redone with the selects; a is a broadcast scalar, so its
    # adjoint is summed per block
    def f(x, a):
        return tp.sum(tp.where(x > 0.0, tp.sqrt(x), 0.0) * a + a * x * x)

    rng = np.random.default_rng(2)
    x = rng.uniform(0.5, 2.0, 3000)
    x[[0, 5, 1023, 1024, 2999]] = 0.0  # in every block, and at block edges
    a = np.array(1.5)
    t = tp.record(f, x, a, compile=True)
    assert "for j0 in range(0, P[0], 1024)" in t.compiled_source
    ti = tp.record(f, x, a, compile=False)
    for xs in (x, np.where(x > 0, x * 1.1, 0.0)):
        gx, ga = t.gradient(xs, a)
        pos = xs > 0
        close(gx, np.where(pos, 1.5 / (2 * np.sqrt(np.where(pos, xs, 1.0))), 0.0) + 3.0 * xs)
        close(ga, np.sum(np.sqrt(xs)) + np.sum(xs * xs))
        assert np.all(np.isfinite(gx))
        for g, gi in zip((gx, ga), ti.gradient(xs, a)):
            np.testing.assert_allclose(g, gi, rtol=1e-12)


def test_broadcast_rows_fuse_with_their_elementwise_neighbours():
    # GMM's pattern: a value per row (q: (K, d, 1) against (K, d, n)), then a matrix
    # product's output added and squared, in one loop over K*d rows of n; the reverse adds
    # q's adjoint along each row. Sizes: rows of 100 (blocks) and of 7 (element loops).
    for K, d, n in ((3, 4, 100), (5, 2, 7)):
        rng = np.random.default_rng(n)
        q, xc, y = (
            rng.normal(size=(K, d, 1)),
            rng.normal(size=(K, d, n)),
            rng.normal(size=(K, d, n)),
        )

        def f(q, xc, y):
            return tp.sum(tp.sum((tp.exp(q) * xc + y) ** 2, 1) * 0.5)

        ti, tc = both(f, q, xc, y)
        src = tc.compiled_source
        assert f"Fused mul, add, square over {K * d} rows of {n} elements" in src
        assert re.search(r"for r in range\(P\[\d+\]\):", src)  # the rows: from the table row
        agree(ti, tc, q, xc, y)
        r = np.exp(q) * xc + y
        gq, gx, gy = tc.gradient(q, xc, y)
        close(gq, np.exp(q) * np.sum(r * xc, axis=2, keepdims=True))
        close(gx, np.exp(q) * r)
        close(gy, r)
        q2, x2, y2 = q * 0.5, xc[::-1].copy(), -y
        agree(ti, tc, q2, x2, y2)


def test_a_fused_loop_sinks_past_a_matrix_product_it_does_not_feed():
    # a = exp(q) * xc is recorded before L @ xc, which does not read it; the loop waits and
    # takes in a + L @ xc, its square and their sum (GMM's order of recording)
    K, d, n = 3, 4, 80
    rng = np.random.default_rng(8)
    q, L, xc = rng.normal(size=(K, d, 1)), rng.normal(size=(K, d, d)), rng.normal(size=(K, d, n))

    def f(q, L, xc):
        a = tp.exp(q) * xc
        b = L @ xc
        return tp.sum((a + b) ** 2)

    ti, tc = both(f, q, L, xc)
    src = tc.compiled_source
    assert f"Fused mul, add, square over {K * d} rows of {n} elements; then their sum." in src
    agree(ti, tc, q, L, xc)
    r = 2.0 * (np.exp(q) * xc + L @ xc)
    gq, gL, gx = tc.gradient(q, L, xc)
    close(gq, np.exp(q) * np.sum(r * xc, axis=2, keepdims=True))
    close(gL, r @ np.swapaxes(xc, 1, 2))
    close(gx, np.exp(q) * r + np.swapaxes(L, 1, 2) @ r)


def test_three_axis_broadcasts_and_sums_over_blocks_of_rows_fuse():
    # GMM's xc = x.T - means[:, :, None]: a (d, n) matrix read by each block of d rows (row
    # r % d) and a value per row; x[:, None, :] a row per block (r // d); and the sum over
    # the middle axis taken in the loop, each row added into its block's output row. Rows of
    # 100 (blocks) and 7 (element loops); the matrices are leaves, so their adjoints add up
    # over the blocks.
    for A, D, n in ((3, 4, 100), (5, 2, 7)):
        rng = np.random.default_rng(n)
        xT, mu = rng.normal(size=(D, n)), rng.normal(size=(A, D))
        z, w = rng.normal(size=(A, n)), rng.normal(size=(A, n))

        def f(xT, mu, z):
            xc = xT - mu[:, :, None]
            u = xc * z[:, None, :] + xc
            return tp.sum(tp.sum(u * u, 1) * w)

        ti, tc = both(f, xT, mu, z)
        src = tc.compiled_source
        assert f"over {A * D} rows of {n} elements; then their sum over blocks of {D} rows" in src
        assert re.search(r"\(r % P\[\d+\]\) \* P\[\d+\]", src)  # row r % D of a (D, n) input
        assert re.search(r"\(r // P\[\d+\]\) \* P\[\d+\]", src)  # row r // D of an (A, n) one
        assert "Entry P[0]: sub" not in src and "Entry P[0]: sum" not in src
        agree(ti, tc, xT, mu, z)
        xc = xT[None] - mu[:, :, None]
        u = xc * (z[:, None, :] + 1.0)
        gu = 2.0 * u * w[:, None, :]
        gxc = gu * (z[:, None, :] + 1.0)
        gx, gm, gz = tc.gradient(xT, mu, z)
        close(gx, gxc.sum(axis=0))
        close(gm, -gxc.sum(axis=2))
        close(gz, (gu * xc).sum(axis=1))
        agree(ti, tc, xT * 2.0, -mu, z[::-1].copy())


def test_a_column_sum_folds_into_a_flat_loop_over_rows():
    # sum over axis 0 of (D, m): a flat loop becomes D rows of m, added into one output row;
    # rows shorter than 16 stay a sum of their own
    for D, m, folded in ((30, 40, True), (30, 5, False)):
        rng = np.random.default_rng(m)
        x, w = rng.normal(size=(D, m)), rng.normal(size=m)
        ti, tc = both(lambda x: tp.sum(tp.sum(tp.tanh(x) * x, 0) * w), x)
        src = tc.compiled_source
        assert (
            f"over {D} rows of {m} elements; then their sum over blocks of {D} rows" in src
        ) == folded
        agree(ti, tc, x)
        th = np.tanh(x)
        close(tc.gradient(x), w * ((1.0 - th * th) * x + th))


def test_a_cheap_entry_moves_to_the_loop_that_reads_it():
    # a = exp(q) * xc joins xc's loop, which L @ xc reads; only a + L @ xc reads a, so the
    # multiply moves into that later loop (recomputed there from xc, not stored and loaded).
    # A guard between them keeps it where it was (the interpreter may resume at the guard).
    K, d, n = 3, 4, 80
    rng = np.random.default_rng(9)
    x, mu, q, L = (rng.normal(size=s) for s in ((d, n), (K, d), (K, d, 1), (K, d, d)))

    def f(x, mu, q, L, guard=False):
        e = tp.exp(q)
        xc = x - mu[:, :, None]
        a = e * xc
        b = L @ xc
        if guard and tp.sum(q) > -1e9:
            b = b * 1.0
        return tp.sum((a + b) ** 2)

    args = (x, mu, q, L)
    ti, tc = both(f, *args)
    src = tc.compiled_source
    assert f"Fused sub over {K * d} rows of {n} elements." in src
    assert f"Fused mul, add, square over {K * d} rows of {n} elements; then their sum." in src
    agree(ti, tc, *args)
    xc = x - mu[:, :, None]
    r = 2.0 * (np.exp(q) * xc + L @ xc)
    gxc = np.exp(q) * r + np.swapaxes(L, 1, 2) @ r
    gx, gm, gq, gL = tc.gradient(*args)
    close(gx, gxc.sum(axis=0))
    close(gm, -gxc.sum(axis=2))
    close(gq, np.exp(q) * np.sum(r * xc, axis=2, keepdims=True))
    close(gL, r @ np.swapaxes(xc, 1, 2))
    tg = tp.record(lambda *a: f(*a, guard=True), *args, compile=True, on_change="warn")
    assert f"Fused sub, mul over {K * d} rows of {n} elements." in tg.compiled_source
    for g, want in zip(tg.gradient(*args), (gx, gm, gq, gL)):
        close(g, want)
    with pytest.warns(tp.GuardWarning):
        g2 = tg.gradient(x, mu, np.full_like(q, -1e9), L)  # fails the guard: resumes there
    for g, want in zip(g2, ti.gradient(x, mu, np.full_like(q, -1e9), L)):
        close(g, want)


def test_a_fused_loop_never_sinks_past_a_guard():
    # on_change="warn": when the guard fails, the interpreter resumes at it and reads a,
    # which the compiled forward must have computed before the guard
    def f(x, y):
        a = x * 3.0
        if tp.sum(y) > 0:
            return tp.sum((a + y) * y)
        return tp.sum(a - y)

    x, y = np.linspace(-1.0, 1.0, 5), np.linspace(0.5, 1.5, 5)
    t = tp.record(f, x, y, compile=True, on_change="warn")
    close(t.gradient(x, y)[1], 3.0 * x + 2.0 * y)
    with pytest.warns(tp.GuardWarning):
        gx, gy = t.gradient(x, -y)  # the recorded branch, at the new values
    close(gx, 3.0 * -y)
    close(gy, 3.0 * x + 2.0 * -y)


def test_bias_rows_fuse_and_their_adjoint_sums_over_the_rows():
    # an MLP layer: h @ W + b, b one row that every row reads, then tanh and a weighted sum;
    # b's adjoint is the column sums of the rows' contributions
    rng = np.random.default_rng(4)
    h, W, b = rng.normal(size=(90, 5)), rng.normal(size=(5, 70)), rng.normal(size=70)
    w = rng.normal(size=(90, 70))

    def f(h, W, b):
        return tp.sum(tp.tanh(h @ W + b) * w)

    ti, tc = both(f, h, W, b)
    assert "over 90 rows of 70 elements" in tc.compiled_source
    agree(ti, tc, h, W, b)
    a = np.tanh(h @ W + b)
    gz = (1.0 - a * a) * w
    gh, gW, gb = tc.gradient(h, W, b)
    close(gb, gz.sum(axis=0))
    close(gW, h.T @ gz)
    close(gh, gz @ W.T)
    # float32: the same loops in the arena's dtype
    w32 = w.astype(np.float32)
    args32 = [x.astype(np.float32) for x in (h, W, b)]
    t32 = tp.record(lambda h, W, b: tp.sum(tp.tanh(h @ W + b) * w32), *args32, compile=True)
    assert t32.dtype == np.float32 and "over 90 rows of 70 elements" in t32.compiled_source
    g32 = t32.gradient(*args32)
    assert g32[2].dtype == np.float32
    np.testing.assert_allclose(g32[2], gz.sum(axis=0), rtol=1e-3, atol=1e-3)


def test_gradient_from_python_is_one_compiled_call_for_any_layout():
    x = np.random.default_rng(3).uniform(-1, 2, 40)
    t = tp.record(rosenbrock, x, compile=True)
    assert t._direct is not None
    for x2 in (x, x[::-1], np.concatenate([x, x])[::2]):  # contiguous, reversed, strided
        close(t.gradient(x2), rosenbrock_grad(np.ascontiguousarray(x2)))
    ro = x.copy()
    ro.flags.writeable = False
    close(t.gradient(ro), rosenbrock_grad(x))
    with pytest.raises((ValueError, TypeError)):
        t.gradient(x[:10])  # a wrong shape takes the checked path and its error


def test_gradient_of_several_arguments_of_mixed_layouts():
    """The one-call path with several arguments: its entry point, compiled for any layout,
    whether they are C-ordered, strided or reversed (no compile for a new layout), the
    checked path for another dtype or shape; every call against NumPy's gradient."""
    rng = np.random.default_rng(11)
    A, b = rng.standard_normal((6, 5)), rng.standard_normal(6)

    def f(x, y):
        r = A @ x - b * y
        return (r * r).sum()

    def grads(x, y):
        r = A @ x - b * y
        return 2 * A.T @ r, -2 * b * r

    x, y = rng.standard_normal(5), rng.standard_normal(6)
    t = tp.record(f, x, y, compile=True)
    assert t._direct is not None and t._direct[2] is None  # several arguments
    wide = rng.standard_normal(12)
    fn = t.run_with[0].gradient_args
    n_compiled = len(fn.overloads)
    for x2, y2 in ((x, y), (x, wide[::2]), (x[::-1], wide[1::2]), (x, y[::-1])):
        for got, want in zip(t.gradient(x2, y2), grads(x2, y2)):
            close(got, want)
    assert len(fn.overloads) == n_compiled  # every layout took the one entry
    for got, want in zip(t.gradient(x.astype(np.float32), y), grads(x.astype(np.float32), y)):
        close(got, want, rtol=1e-6)
    with pytest.raises((ValueError, TypeError)):
        t.gradient(x, y[:5])


def test_gradient_out_of_any_layout_and_the_refused_ones():
    """``gradient(out=)`` on a compiled tape's one-call path: ``out`` filled and returned (a
    strided one: nothing written between its elements), another dtype filled by a cast, a
    wrong shape refused; fresh results are each call's own, not views of the workspace."""
    x = np.random.default_rng(5).uniform(-1, 2, 12)
    t = tp.record(rosenbrock, x, compile=True)
    assert t._direct is not None
    g1, g2 = t.gradient(x), t.gradient(x + 0.5)
    assert not np.shares_memory(g1, g2) and not np.shares_memory(g1, t.grads[0])
    close(g1, rosenbrock_grad(x))
    close(g2, rosenbrock_grad(x + 0.5))
    out = np.full(12, np.nan)
    assert t.gradient(x, out=out) is out
    close(out, rosenbrock_grad(x))
    strided = np.full(24, np.nan)
    t.gradient(x, out=strided[::2])
    close(strided[::2], rosenbrock_grad(x))
    assert np.isnan(strided[1::2]).all()
    o32 = np.zeros(12, np.float32)
    t.gradient(x, out=o32)
    close(o32, rosenbrock_grad(x), rtol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        t.gradient(x, out=np.empty(13))


def test_dead_and_constant_entries_are_not_replayed():
    c = np.arange(4.0)

    def f(x):
        unused = tp.exp(x) * 3.0  # noqa: F841  (dead: no output depends on it)
        k = tp.tensor(c) * 2.0 + 1.0  # depends on no argument: computed once, at record time
        return tp.sum(x * k)

    x = np.ones(4)
    ti, tc = both(f, x)
    src = tc.compiled_source
    assert "_f_exp" not in src and src.count("_f_add(") == 0
    agree(ti, tc, np.array([1.0, -2.0, 3.0, 0.5]))
    close(tc.gradient(x), 2 * c + 1)


def test_mixed_program_matches_interpreter_and_finite_differences():
    rng = np.random.default_rng(3)
    W1, b1, W2 = rng.normal(size=(5, 8)), rng.normal(size=8), rng.normal(size=(8, 1))
    X = rng.normal(size=(6, 5))
    idx = np.array([0, 2, 2, 5])

    def f(W1, b1, W2):
        h = tp.tanh(X @ W1 + b1)
        r = (h @ W2)[:, 0]
        z = tp.where(r > 0, tp.sqrt(tp.abs(r)), r * r) + tp.maximum(r, 0.1)
        return tp.sum(z[idx] ** 2) + tp.max(h, axis=1).sum() / 3.0 + (h * h).mean()

    ti, tc = both(f, W1, b1, W2)
    for _ in range(3):
        args = [a + rng.normal(scale=0.1, size=a.shape) for a in (W1, b1, W2)]
        agree(ti, tc, *args)
    assert tp.gradcheck(f, W1, b1, W2)  # the function itself; tiers already agree


def test_element_loop_redo_takes_values_and_the_adjoints_the_arena_holds():
    """A short reverse loop redoes an element with NaN in a function of its own (``_redo``):
    it gets the element's values, the broadcast scalar, and the adjoint of an intermediate that
    another unit (a gather) added to first."""
    idx = np.array([0, 1, 1, 4])

    def f(x, a):
        y = tp.where(x > 0.0, tp.sqrt(x), 0.0) * a
        return tp.sum(y * y) + tp.sum(y[idx])  # y: read by the gather, its adjoint in the arena

    x = np.array([0.0, 1.0, 4.0, 0.0, 9.0])
    a = np.array(2.0)
    ti, tc = both(f, x, a)
    assert "def _redo_" in tc.compiled_source
    for xs in (x, np.array([1.0, 0.0, 0.0, 2.0, 0.25])):
        pos = xs > 0
        r = np.sqrt(np.where(pos, xs, 1.0))
        y = np.where(pos, r, 0.0) * 2.0
        dy = 2 * y + np.bincount(idx, minlength=5)
        gx, ga = tc.gradient(xs, a)
        close(gx, np.where(pos, dy * 2.0 / (2 * r), 0.0))
        close(ga, np.sum(dy * np.where(pos, r, 0.0)))
        agree(ti, tc, xs, a)


def test_nan_safe_where_on_the_fused_path():
    """The reverse loop runs without the zero-adjoint selects and redoes an element with them
    when a NaN appears: the unused branch's inf must not poison the gradient, and a real NaN
    must still come through."""
    f = lambda x: tp.sum(tp.where(x > 0, tp.sqrt(x), 0.0 * x) + x)  # noqa: E731
    x0 = np.array([1.0, 2.0, 3.0])
    ti, tc = both(f, x0)
    x = np.array([0.0, 4.0, -1.0])
    g = tc.gradient(x)
    np.testing.assert_array_equal(g, [1.0, 1.25, 1.0])
    agree(ti, tc, x)
    h = lambda x: tp.sum(tp.log(x) * x)  # noqa: E731
    ti, tc = both(h, x0)
    gi, gc = ti.gradient(np.array([np.nan, 1.0, 2.0])), tc.gradient(np.array([np.nan, 1.0, 2.0]))
    np.testing.assert_array_equal(np.isnan(gc), np.isnan(gi))
    close(gc[1:], gi[1:])


def test_intermediate_assigned_by_its_first_adjoint_and_leaves_accumulate():
    """An intermediate whose adjoint memory a fused loop writes first is assigned (not zeroed
    then added): a second replay must not see the first one's adjoints, and ``backward()``
    twice after one forward doubles leaf gradients only."""

    def f(x):
        y = tp.exp(x)  # fused loop 1
        s = tp.sum(y.reshape(2, 3), axis=0)  # kernel between two loops
        return tp.sum(tp.tanh(s) * y[:3])

    x = np.linspace(-1, 1, 6)
    ti, tc = both(f, x)
    for k in range(3):
        agree(ti, tc, x * (k + 1))
    for t in (ti, tc):
        t.forward(x)
        t.zero_grad()
        t.backward()
        t.backward()
    close(tc.grads[0], ti.grads[0])
    close(tc.grads[0], 2 * ti.gradient(x))


def test_leaf_adjoint_assigned_in_a_gradient_and_added_to_in_a_backward():
    """A vectorised reverse loop whose views of a leaf cover it (``x[2:]``, ``x[1:-1]``,
    ``x[:-2]``: the last two elements through the tails) assigns the leaf's adjoint in a
    gradient, where the leaf is then not zeroed first; ``backward()`` after ``forward()`` adds
    to what is there. ``w`` is read by a loop that covers it, after a matrix product that also
    reads it has written its adjoint in the reverse sweep: the loop adds, and ``w`` is zeroed.
    Checked against NumPy's gradients, at arguments that change between calls."""

    def fx(x):
        d2 = x[2:] - 2.0 * x[1:-1] + x[:-2]
        return tp.sum(d2 * d2)

    def fw(w):
        y = w * w * 0.5  # a loop the matmul reads: it runs after the matmul in the reverse
        return tp.sum(w.reshape(1, 300) @ y.reshape(300, 1))

    def gw(w):
        return 1.5 * w * w

    rng = np.random.default_rng(5)
    for f, g, arg, zeroed in ((fx, second_difference_grad, rng.normal(size=2500), False),
                              (fw, gw, rng.normal(size=300), True)):  # fmt: skip
        ti, tc = both(f, arg)
        src = tc.compiled_source
        leaves = re.search(r"# leaves' adjoints zeroed first in a gradient: (.*)", src)[1]
        assert (leaves != "none") == zeroed, leaves
        assert ("if zl:" in src) != zeroed
        for k in range(3):
            a = arg * (1 + 0.5 * k) - k
            close(tc.gradient(a), g(a))
            agree(ti, tc, a)
        tc.zero_grad()
        tc.forward(arg)
        tc.backward()
        tc.backward()
        close(tc.grads[0], 2 * g(arg))
        tc.gradient(arg)  # starts again from zero
        close(tc.grads[0], g(arg))


def test_float32_tape():
    x = np.linspace(-1, 1, 9).astype(np.float32)
    ti, tc = both(rosenbrock, x)
    gi, gc = ti.gradient(x), tc.gradient(x)
    assert gc.dtype == np.float32
    np.testing.assert_allclose(gc, gi, rtol=1e-5, atol=1e-4)


def test_guards_on_a_compiled_tape_retrace_raise_and_warn():
    def f(x):
        if x.sum() > 0:
            return tp.sum(x * x)
        return tp.sum(tp.exp(x))

    pos, neg = np.array([1.0, 2.0]), np.array([-1.0, -2.0])
    t = tp.record(f, pos, compile=True)
    close(t.gradient(neg), np.exp(neg))  # retraced, compiled too
    assert t.retraces == 1 and all(v.tier == "compiled" for v in t._variants)
    close(t.gradient(pos), 2 * pos)
    t = tp.record(f, pos, compile=True, on_change="raise")
    with pytest.raises(tp.GuardError):
        t.gradient(neg)
    t = tp.record(f, pos, compile=True, on_change="warn")
    with pytest.warns(tp.GuardWarning):
        g = t.gradient(neg)
    close(g, 2 * neg)  # the recorded path
    # value_and_grad's one-call path, when a guard fails: retraced, raised, or warned
    t = tp.record(f, pos, compile=True)
    v, g = t.value_and_grad(neg)
    close(v, np.sum(np.exp(neg)))
    close(g, np.exp(neg))
    with pytest.raises(tp.GuardError):
        tp.record(f, pos, compile=True, on_change="raise").value_and_grad(neg)
    with pytest.warns(tp.GuardWarning):
        v, g = tp.record(f, pos, compile=True, on_change="warn").value_and_grad(neg)
    close(v, np.sum(neg * neg))
    close(g, 2 * neg)


def test_forward_in_one_call_from_its_second_call(monkeypatch):
    """``forward`` of a compiled tape replayed by the shared runtime loads its arguments and
    runs the whole forward in one compiled call (``forward_args_<n>``) from its second call
    on: values as the interpreter's, two arguments, a strided one, ``backward`` after it;
    with the checked path made to fail, the calls still answer (the one call ran). An
    argument of another shape takes the checked path, which says what differs; a failed
    guard retraces, raises or warns as ``on_change`` says."""
    x = np.random.default_rng(3).uniform(-1.0, 2.0, 9)
    w = np.linspace(0.5, 1.5, 8)

    def two(x, w):
        return tp.sum(w * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    ti, tc = both(two, x, w)
    # a final sum, which the one-call gradient leaves to its reverse loop: forward runs it
    assert "the one-call gradient runs the first 0 of the 1 forward units" in tc.compiled_source
    assert tc._direct_fwd is not None and tc._direct_fwd[2] is None
    for k in range(3):
        x2 = x + 0.1 * k
        v = tc.forward(x2, w)
        assert type(v) is type(ti.forward(x2, w))
        close(v, ti.forward(x2, w))
    assert tc._direct_fwd[2] is not None  # made at the second call
    tc.zero_grad()
    tc.forward(x, w)
    tc.backward()
    close(tc.grads[0], ti.gradient(x, w)[0])
    xs = np.linspace(-1.0, 1.0, 18)[::2]
    want = ti.forward(xs.copy(), w)
    with monkeypatch.context() as m:  # only the one call can answer now

        def checked(*a, **k):
            raise AssertionError("the checked path ran")

        m.setattr(tc, "run_replay", checked)
        close(tc.forward(xs, w), want)
        close(tc.forward(x, w), ti.forward(x, w))
    with pytest.raises(ValueError, match="shape"):
        tc.forward(np.ones(8), w)

    def f(x):
        if x.sum() > 0:
            return tp.sum(x * x)
        return tp.sum(tp.exp(x))

    pos, neg = np.array([1.0, 2.0]), np.array([-1.0, -2.0])
    for policy in ("retrace", "raise", "warn"):
        t = tp.record(f, pos, compile=True, on_change=policy)
        t.forward(pos)
        close(t.forward(pos), 5.0)
        if policy == "raise":
            with pytest.raises(tp.GuardError):
                t.forward(neg)
        elif policy == "warn":
            with pytest.warns(tp.GuardWarning):
                close(t.forward(neg), 5.0)  # the recorded path
        else:
            close(t.forward(neg), np.sum(np.exp(neg)))
            close(t.forward(pos), 5.0)


def test_gather_index_out_of_range_raises_on_the_compiled_tier():
    t = tp.record(lambda x, i: tp.sum(x[i] * 2.0), np.ones(4), np.array([0, 3]), compile=True)
    close(t.gradient(np.ones(4), np.array([1, 1])), [0, 4, 0, 0])
    with pytest.raises(IndexError):
        t.gradient(np.ones(4), np.array([0, 7]))


def test_threads_and_batched_replay():
    x = np.random.default_rng(1).uniform(-1, 2, (16, 12))
    ti, tc = both(rosenbrock, x[0])
    want = np.stack([ti.gradient(r) for r in x])
    out = [None] * len(x)

    def work(k):
        for _ in range(20):
            out[k] = tc.gradient(x[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(x))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    close(np.stack(out), want)
    vals, grads = tc.gradient_batch(x)
    close(grads, want)
    close(vals, [ti.forward(r) for r in x])


def test_anomaly_mode_on_a_compiled_tape():
    t = tp.record(lambda x: tp.sum(tp.log(x) * 2.0), np.ones(3), compile=True)
    t.forward(np.array([1.0, 2.0, 3.0]))
    with tp.detect_anomaly():
        t.backward()  # intermediates the compiled forward left unwritten are recomputed
        with pytest.raises(tp.AnomalyError, match="log"):
            t.gradient(np.array([1.0, -1.0, 2.0]))
    close(t.gradient(np.array([1.0, 2.0, 4.0])), 2 / np.array([1.0, 2.0, 4.0]))


def test_njit_embedding_through_t_kernels():
    x0 = np.random.default_rng(2).uniform(-1, 2, 10)
    t = tp.record(rosenbrock, x0, compile=True)
    K = t.kernels

    @njit
    def grad_in_njit(ka, x):
        ka.data[0 : x.shape[0]] = x
        status = K.gradient(ka)
        return status, ka.grad[0 : x.shape[0]].copy()

    ka = t.workspace()
    off, n = t.input_slice(0)
    assert off == 0 and n == 10
    status, g = grad_in_njit(ka, x0)
    assert status == -1
    close(g, rosenbrock_grad(x0))
    # tape.kernels (the interpreter) replays a compiled tape's arguments correctly too
    ka2 = t.workspace()
    ka2.data[0:10] = x0
    assert tp.kernels.gradient(ka2) == -1
    close(ka2.grad[0:10], rosenbrock_grad(x0))


def test_automatic_promotion_after_k_replays():
    x = np.ones(5)
    t = tp.record(rosenbrock, x)  # compile="auto"
    assert t.tier == "interpreter" and t.compile_after == compiled.AUTO_AFTER
    t.compile_after = 3  # promote sooner than the default
    t.compile_cost = 0.0  # whatever the compile is estimated to cost (see below)
    for _ in range(3):
        g = t.gradient(x)
    assert t.tier == "compiled"
    close(g, rosenbrock_grad(x))
    close(t.gradient(x), rosenbrock_grad(x))
    t = tp.record(rosenbrock, x, compile=False)
    assert t.compile_after is None


def test_promotion_by_time_compiles_in_the_background_while_replays_go_on():
    x = np.linspace(-1.0, 1.5, 9)
    t = tp.record(rosenbrock, x)
    assert t.compile_after_seconds == compiled.AUTO_SECONDS and compiled.AUTO_MIN == 3
    t.compile_after_seconds = 0.0  # any time spent promotes, from the AUTO_MIN-th replay
    t.compile_cost = 0.0
    for _ in range(compiled.AUTO_MIN - 1):
        close(t.gradient(x), rosenbrock_grad(x))
    assert t.compiling is None and t.tier == "interpreter"
    close(t.value_and_grad(x)[1], rosenbrock_grad(x))  # the checked path counts too
    th = t.compiling
    assert th is not None and t.compile_after is None and t.compile_after_seconds is None
    seen = set()
    while th.is_alive():  # replays go on, on whichever tier is installed
        seen.add(t.tier)
        close(t.gradient(x), rosenbrock_grad(x))
    th.join()
    assert t.tier == "compiled" and "interpreter" in seen
    close(t.gradient(x), rosenbrock_grad(x))


def test_compile_waits_for_a_background_promotion():
    x = np.linspace(-1.0, 1.5, 11)
    t = tp.record(lambda v: (tp.exp(v[1:]) * v[:-1] ** 2).sum(), x)
    t.compile_after_seconds = t.compile_cost = 0.0
    for _ in range(compiled.AUTO_MIN):
        t.gradient(x)
    assert t.compiling is not None
    assert t.compile() is t and t.tier == "compiled"
    g = np.zeros_like(x)
    g[:-1] += 2 * x[:-1] * np.exp(x[1:])
    g[1:] += np.exp(x[1:]) * x[:-1] ** 2
    close(t.gradient(x), g)


def test_a_tape_replayed_twice_never_compiles_by_time():
    t = tp.record(rosenbrock, np.ones(4))
    t.compile_after_seconds = 0.0
    t.gradient(np.ones(4))
    t.gradient(np.ones(4))
    assert t.compiling is None and t.tier == "interpreter"


def test_promotion_waits_while_the_compile_is_estimated_to_cost_more_than_the_replays():
    x = np.linspace(-1.0, 1.5, 7)
    t = tp.record(rosenbrock, x)
    assert t.compile_cost is None  # estimated at the first rule that fires
    t.compile_after, t.compile_cost = 3, 1e9  # as a compile that no replays here repay
    for _ in range(5):
        close(t.gradient(x), rosenbrock_grad(x))
    # the count rule fired at the 3rd replay and gave way to promotion by time, which now
    # waits for the replays to have taken the estimated time
    assert t.tier == "interpreter" and t.compiling is None
    assert t.compile_after is None and t.compile_after_seconds == 1e9
    assert 0.0 < t._replay_s < 1e9
    t.compile_cost = t.compile_after_seconds = t._replay_s  # the replays have repaid it
    close(t.gradient(x), rosenbrock_grad(x))  # promotes in the background
    assert t.compile() is t and t.tier == "compiled"
    close(t.gradient(x), rosenbrock_grad(x))
    # replays that are not timed (promotion by time off) are not weighed: the count decides
    t = tp.record(rosenbrock, x)
    t.compile_after, t.compile_after_seconds, t.compile_cost = 2, None, 1e9
    t.gradient(x)
    t.gradient(x)
    assert t.tier == "compiled"


def test_compile_estimate_counts_what_numbas_cache_lacks(monkeypatch):
    x = np.linspace(-1.0, 1.5, 6)
    tp.record(rosenbrock, x, compile=True).gradient(x)  # its loops and entry are cached now
    t = tp.record(rosenbrock, x)
    est = compiled.compile_estimate(t)
    assert "generated" in t.extensions()  # compile() takes the generated code from here
    if compiled._in_cache(compiled.runtime().gradient_args_1):  # (Numba caches: as in CI)
        assert est == 0.0
    monkeypatch.setattr(compiled, "_in_cache", lambda fn: False)  # as with empty caches
    n_units = len(compiled.generate(t).units)
    assert n_units >= 1
    assert compiled.compile_estimate(t) == pytest.approx(
        n_units * compiled.AUTO_COLD_UNIT + compiled.AUTO_COLD_RUNTIME
    )
    monkeypatch.undo()
    assert t.compile() is t and "generated" not in t.extensions()
    close(t.gradient(x), rosenbrock_grad(x))


def test_too_many_kinds_of_unit_raises_or_stays_on_the_interpreter(monkeypatch):
    monkeypatch.setattr(compiled, "MAX_UNIT_KINDS", 1)
    with pytest.raises(tp.CompileError, match="MAX_UNIT_KINDS"):
        tp.record(rosenbrock, np.ones(5), compile=True)
    t = tp.record(rosenbrock, np.ones(5))
    t.compile_after = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        close(t.gradient(np.ones(5)), rosenbrock_grad(np.ones(5)))
    assert t.tier == "interpreter"


def test_unrecorded_tapes_cannot_compile():
    with pytest.raises(RuntimeError, match="record"):
        tp.Tape().compile()
    with pytest.raises(ValueError, match="compile"):
        tp.record(rosenbrock, np.ones(3), compile="yes")


def test_second_process_loads_the_compiled_tape_from_the_disk_cache(tmp_path):
    code = (
        "import numpy as np, tape as tp\n"
        "def f(x):\n"
        "    return tp.sum(tp.exp(x[1:]) * x[:-1] ** 3 - x[:-1])\n"
        "t = tp.record(f, np.linspace(0, 1, 7), compile=True)\n"
        "m = t.run_with[0]\n"
        # gradient_args: what compile() compiles for a scalar output (gradient()'s path)
        "hits = sum(m.gradient_args.stats.cache_hits.values())\n"
        "miss = sum(m.gradient_args.stats.cache_misses.values())\n"
        "print(hits, miss, m.module.__file__)\n"
    )
    env = dict(os.environ, TAPE_CACHE_DIR=str(tmp_path))
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
        )
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    first, second = (r.stdout.split() for r in runs)
    assert first[:2] == ["0", "1"]  # compiled, and written to the cache
    assert second[:2] == ["1", "0"]  # loaded: no compile
    assert first[2] == second[2] and first[2].startswith(str(tmp_path))


SMOOTH = [
    "neg",
    "square",
    "exp",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "softplus",
    "arctan",
    "abs",
    "relu",
]
step = st.one_of(
    st.tuples(st.just(1), st.sampled_from(SMOOTH), st.integers(0, 20), st.integers(0, 20)),
    st.tuples(
        st.just(2),
        st.sampled_from(["add", "sub", "mul", "maximum", "minimum"]),
        st.integers(0, 20),
        st.integers(0, 20),
    ),
)
shapes = st.sampled_from([((), ()), ((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((4,), ())])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(step, min_size=1, max_size=12), sh=shapes, seed=st.integers(0, 2**16))
def test_random_programs_agree_across_tiers(program, sh, seed):
    program_agrees(program, sh, seed)


def program_agrees(program, sh, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-1, 1, sh[0]), rng.uniform(-1, 1, sh[1])
    f = build(program, sh)
    ti, tc = both(f, a, b)
    agree(ti, tc, rng.uniform(-1, 1, sh[0]), rng.uniform(-1, 1, sh[1]))


# long enough (>= params.BLOCK_MIN elements) for the reverse loops to run in blocks,
# with partial blocks, broadcast (per-block summed) and strided operands
long_shapes = st.sampled_from(
    [((70,), (70,)), ((3, 700), (700,)), ((1100,), ()), ((2, 1), (1, 1500)), ((1030, 1), (1, 3))]
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(step, min_size=1, max_size=8), sh=long_shapes, seed=st.integers(0, 2**16))
def test_random_long_programs_agree_across_tiers(program, sh, seed):
    program_agrees(program, sh, seed)


def test_blocked_reverse_in_float32():
    x = np.random.default_rng(4).uniform(-1, 2, 3000).astype(np.float32)
    t = tp.record(rosenbrock, x, compile=True)
    assert t.dtype == np.float32 and "for j0 in range(0, P[0], 1024)" in t.compiled_source
    ti = tp.record(rosenbrock, x, compile=False)
    g, gi = t.gradient(x), ti.gradient(x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, gi, rtol=1e-5, atol=1e-5 * float(np.abs(gi).max()))
    close(g, rosenbrock_grad(x.astype(np.float64)), rtol=1e-4)


def test_kernel_args_taken_before_compile_are_refused_by_the_compiled_kernels():
    x0 = np.linspace(-1, 1, 6)
    t = tp.record(rosenbrock, x0, compile=False)
    old = t.workspace()
    t.compile()
    with pytest.raises(ValueError, match="before the tape was compiled"):
        t.kernels.gradient(old)
    assert tp.kernels.gradient(old) == -1  # the interpreter takes them
    close(old.grad[:6], rosenbrock_grad(x0))
    new = t.workspace()
    assert t.kernels.gradient(new) == -1
    close(new.grad[:6], rosenbrock_grad(x0))


def test_promotion_while_threads_replay():
    """Threads replaying while the tape promotes itself: every result is right on the tier it
    ran on (the code and its integer pool are swapped together)."""
    X = np.random.default_rng(5).uniform(-1, 2, (8, 30))
    t = tp.record(rosenbrock, X[0])
    t.compile_after, t.compile_cost = 50, 0.0
    bad = []

    def work(k):
        for j in range(60):
            x = X[(k + j) % len(X)]
            g = t.gradient(x)
            if not np.allclose(g, rosenbrock_grad(x), rtol=1e-12, atol=1e-12):
                bad.append((k, j))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.tier == "compiled" and not bad


EDGE_CASES = {
    "size zero": (lambda x: tp.sum(tp.exp(x) * 2.0) + 1.0, [np.zeros(0)]),
    "output read again": (lambda x: tp.sum(tp.exp(x)) * tp.sum(tp.exp(x)), [np.linspace(-1, 1, 5)]),
    "scalar argument broadcast": (
        lambda a, x: tp.sum(tp.tanh(a * x + a)),
        [np.array(0.7), np.linspace(-1, 1, 6)],
    ),
    "shifted views of a fused value": (
        lambda x: tp.sum(tp.exp(x)[1:] * tp.exp(x)[:-1] + tp.sin(x)[1:]),
        [np.linspace(-1, 1, 8)],
    ),
    "reshape and transpose between loops": (
        lambda x: tp.sum((tp.exp(x).reshape(2, 3).T * 2.0) ** 2),
        [np.linspace(-1, 1, 6)],
    ),
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_cases_agree(name):
    f, args = EDGE_CASES[name]
    ti, tc = both(f, *args)
    agree(ti, tc, *[a * 1.1 for a in args])


def test_several_outputs_forward_and_seeded_backward():
    f = lambda x: (tp.exp(x), tp.sum(x * x))  # noqa: E731
    ti, tc = both(f, np.ones(3))
    x = np.arange(3.0)
    for a, b in zip(tc.forward(x), ti.forward(x)):
        close(a, b)
    for t in (ti, tc):
        t.forward(x)
        t.zero_grad()
        t.backward([np.ones(3), 2.0])
    close(tc.grads[0], ti.grads[0])
    close(tc.grads[0], np.exp(x) + 4 * x)


def test_integer_powers_are_multiplied_out():
    f = lambda x: tp.sum(x**3 - 2.0 * x**4 + tp.power(x, 2.0) + x**2.5)  # noqa: E731
    x = np.linspace(0.1, 1.5, 7)
    ti, tc = both(f, x)
    src = tc.compiled_source
    assert src.count("_f_pow(") == 1  # x ** 2.5 stays a pow; 2, 3 and 4 are multiplied out
    assert "x0 * x0 * x0" in src and "(x0 * x0) * (x0 * x0)" in src
    agree(ti, tc, x * 0.9)
    close(tc.gradient(x), 3 * x**2 - 8 * x**3 + 2 * x + 2.5 * x**1.5)


def test_short_loops_call_the_transcendental_rules_and_long_ones_inline_them():
    """exp, log, tanh and sigmoid are inlined in Numba IR where a loop is long enough to
    vectorise; a loop shorter than params.BLOCK_MIN calls them as functions of their own (``_o_``),
    which compiles faster. Both give the interpreter's numbers."""

    def f(a, b):
        return tp.sum(tp.tanh(a) * tp.sigmoid(a)) + tp.sum(tp.exp(-b * b) + tp.log(1.0 + b * b))

    rng = np.random.default_rng(3)
    a = rng.normal(size=params.BLOCK_MIN - 1)
    b = rng.normal(size=4 * params.BLOCK_MIN)
    ti, tc = both(f, a, b)
    src = tc.compiled_source
    units = re.split(r"\n(?=@njit|# ---- )", src)
    long_ = [u for u in units if "for j0 in range(0, P[0], " in u]  # in blocks
    short = [u for u in units if "for j in range(P[0])" in u and u not in long_]
    assert short and long_
    assert any("_o_f_tanh(" in u and "_o_f_sigmoid(" in u for u in short)
    assert all(" _f_tanh(" not in u and " _f_sigmoid(" not in u for u in short)
    assert all("_o_f_" not in u for u in long_)
    assert any(" _f_exp(" in u and " _f_log(" in u for u in long_)
    for k in range(2):
        agree(ti, tc, a * (k + 1), b - k)
    ga, gb = tc.gradient(a, b)
    s = 1.0 / (1.0 + np.exp(-a))
    close(ga, (1.0 - np.tanh(a) ** 2) * s + np.tanh(a) * s * (1.0 - s))
    close(gb, -2.0 * b * np.exp(-b * b) + 2.0 * b / (1.0 + b * b))


# ---------------------------------------------------------------- common subexpressions


def merges(t):
    """``(merged, kept)`` as the compiled source's header reports them."""
    m = re.search(r"(\d+) merged into an identical earlier entry, (\d+) kept", t.compiled_source)
    return int(m[1]), int(m[2])


def central_differences(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = eps
        g[k] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def test_common_subexpressions_are_merged():
    """``x * y`` three times, then ``sin`` of it twice: one product and one sine are replayed
    (merging the products makes the sines identical), and the sine's adjoint gets both
    uses. A product with an array captured twice (two constants, equal) is one product."""
    rng = np.random.default_rng(11)
    C = rng.normal(size=(7, 7))

    def f(x, y):
        a, b = tp.sin(x * y), tp.sin(x * y)
        return (a * b + tp.exp(x * y) + tp.tanh(x @ C) * tp.cos(x @ C)).sum()

    x, y = rng.normal(size=7), rng.normal(size=7)
    ti, tc = both(f, x, y)
    assert merges(tc) == (4, 0) and tc.compiled_source.count("_f_sin(") == 1
    x, y = rng.normal(size=7), rng.normal(size=7)
    agree(ti, tc, x, y)
    z, w = x * y, x @ C
    dz = 2 * np.sin(z) * np.cos(z) + np.exp(z)
    dw = (1 - np.tanh(w) ** 2) * np.cos(w) - np.tanh(w) * np.sin(w)
    close(tc.forward(x, y), np.sum(np.sin(z) ** 2 + np.exp(z) + np.tanh(w) * np.cos(w)))
    gx, gy = tc.gradient(x, y)
    close(gx, dz * y + C @ dw)
    close(gy, dz * x)


def test_duplicates_that_are_outputs_or_read_by_kernels_keep_their_values():
    """A survivor that is an output gets its seed and the merged duplicate's uses; a
    duplicate that is an output, or that a kernel (``max``) reads, stays; after a guard fails
    with ``on_change="warn"`` the interpreter reads a duplicate computed before the guard."""

    def f(x, y):
        first = tp.sin(x * y)
        s = (tp.sin(x * y) * tp.exp(x * y)).sum() + tp.max(tp.sin(x * y))
        return first, s, tp.sin(x * y)

    rng = np.random.default_rng(12)
    x, y = rng.normal(size=5), rng.normal(size=5)
    ti, tc = both(f, x, y)
    assert merges(tc) == (5, 2)  # the products and the second sine; two sines stay
    x, y = rng.normal(size=5), rng.normal(size=5)
    seeds = [rng.normal(size=5), 1.0, rng.normal(size=5)]
    z = x * y
    want = (np.sin(z), np.sum(np.sin(z) * np.exp(z)) + np.max(np.sin(z)), np.sin(z))
    for a, b, c in zip(tc.forward(x, y), ti.forward(x, y), want):
        close(a, b)
        close(a, c)
    for t in (ti, tc):
        t.forward(x, y)
        t.zero_grad()
        t.backward(seeds)
    dz = (seeds[0] + seeds[2]) * np.cos(z) + (np.cos(z) + np.sin(z)) * np.exp(z)
    dz[np.argmax(np.sin(z))] += np.cos(z[np.argmax(np.sin(z))])
    for a, b, c in zip(tc.grads, ti.grads, (dz * y, dz * x)):
        close(a, b)
        close(a, c)

    def g(x):
        u, v = tp.exp(x) * x, tp.exp(x)
        if x.sum() > 0:  # a guard between the duplicate and its use
            return (u * v).sum()
        return x.sum()

    ti, tc = both(g, np.linspace(0.1, 1.0, 4))
    ti.on_change = tc.on_change = "warn"
    assert merges(tc) == (0, 1)
    x = -np.linspace(0.2, 1.3, 4)
    with pytest.warns(tp.GuardWarning):
        vc, gc = tc.value_and_grad(x)
    close(vc, np.sum(x * np.exp(2 * x)))
    close(gc, (2 * x + 1) * np.exp(2 * x))


def test_common_subexpressions_through_views():
    """Two slices ``x[1:]`` are one operand; a slice of a merged duplicate becomes the same
    slice of the survivor (``v[:-1]``, which the tape has only for ``v``)."""

    def f(x):
        u, v = tp.exp(x[1:] * 2.0), tp.exp(x[1:] * 2.0)
        return (u[1:] * v[:-1] * tp.sin(v[1:])).sum()

    def f_np(x):
        u = np.exp(x[1:] * 2.0)
        return np.sum(u[1:] * u[:-1] * np.sin(u[1:]))

    rng = np.random.default_rng(13)
    x = rng.normal(size=8)
    ti, tc = both(f, x)
    assert merges(tc) == (2, 0)
    x = rng.normal(size=8)
    agree(ti, tc, x)
    close(tc.forward(x), f_np(x))
    close(tc.gradient(x), central_differences(f_np, x), rtol=1e-7)


def test_fused_loops_are_shared_across_tapes_and_lengths():
    """A short flat loop takes its length from its table row, and each fused loop is a module
    of its own named by its text (which names no offset, length or tape): the same model
    recorded at another length calls the very same compiled loops, and both lengths agree
    with the interpreter and with the formula."""

    def f(x, w):
        a = tp.sum(tp.sin(x) * w)
        b = tp.sum(tp.exp(x[1:] - x[:-1]) * w[1:])
        return a * b + tp.sum(x @ tp.tensor(np.eye(len(x))) * x)  # a product: two more loops

    def grad(x, w):
        s, e = np.sum(np.sin(x) * w), np.exp(x[1:] - x[:-1]) * w[1:]
        gx = np.cos(x) * w * np.sum(e) + 4.0 * x * 0.5
        gx[1:] += s * e
        gx[:-1] -= s * e
        return gx

    from tape.interpreter import dispatch as _dispatch

    mods, registered = [], []
    for n in (10, 14):  # both short (element loops), both summed in the loop (< params.SHORT_SUM)
        rng = np.random.default_rng(n)
        x, w = rng.uniform(-1.0, 1.0, n), rng.uniform(0.5, 1.5, n)
        ti, tc = both(f, x, w, wrt=[0])
        src = tc.compiled_source
        names = re.findall(r"# ---- (_\w+) = (tape_unit_\w+)\.unit", src)
        assert len(names) >= 4, src[:2000]  # not inlined: the loops are unit modules
        assert "# sin: rules " in src and "# exp: rules " in src  # the rules' fingerprints
        mods.append({u for _, u in names})
        registered.append(len(_dispatch._UNITS))
        x2 = rng.uniform(-1.0, 1.0, n)
        agree(ti, tc, x2, w)
        close(tc.gradient(x2, w), grad(x2, w), rtol=1e-12)
    assert mods[0] == mods[1]
    assert registered[1] == registered[0]  # the second tape compiled no loop of its own


def test_tapes_share_one_runtime_and_add_no_module_of_their_own():
    """Compiled tapes without custom ops replay through the one shared runtime, which reads
    each tape's tables from its pool: a second tape adds no module to the process, and a pool
    without the tables (the interpreter's) is refused, not misread."""
    import sys as _sys

    def f(x):
        return tp.sum(tp.tanh(x) * x)

    def g(x):
        return tp.sum(tp.exp(x[1:]) * x[:-1]) + tp.sum(x @ tp.tensor(np.ones((6, 2))))

    x = np.linspace(-1.0, 1.0, 6)
    t1 = tp.record(f, x, compile=True)
    before = {m for m in _sys.modules if m.startswith("tape_")}
    t2 = tp.record(g, x, compile=True)
    new = {m for m in _sys.modules if m.startswith("tape_")} - before
    assert t1.run_with[0].module is t2.run_with[0].module
    assert t1.run_with[0].module.__name__.startswith("tape_runtime_")
    assert all(m.startswith("tape_unit_") for m in new), new  # only g's new fused loops
    assert "#   entry 3: matmul.\n" in t2.compiled_source  # an entry the interpreter runs
    close(t2.gradient(x), tp.record(g, x, compile=False).gradient(x))
    close(t1.gradient(x), np.tanh(x) + x * (1.0 - np.tanh(x) ** 2))
    ka = t1.kernel_args()
    with pytest.raises(ValueError, match="taken before the tape was compiled"):
        t1.run_with[0].forward_sweep(ka.entries, ka.bufs, t1.ipool[: t1.n_ipool], ka.data,
                                      np.int64(0), ka.n_entries)  # fmt: skip


def test_a_unit_table_that_names_no_compiled_loop_raises():
    """The pool names a unit module's loop by its id in this process's unit table; an id out
    of range, or one no loop was compiled under, raises instead of calling an address."""
    from tape.interpreter import dispatch as _dispatch

    def f(x, w):
        a = tp.sum(tp.sin(x) * w)
        b = tp.sum(tp.exp(x[1:] - x[:-1]) * w[1:])
        return a * b + tp.sum(x @ tp.tensor(np.eye(len(x))) * x)

    x, w = np.linspace(-1.0, 1.0, 10), np.linspace(0.5, 1.5, 10)
    t = tp.record(f, x, w, compile=True)
    ws = t.workspace()
    cells = np.flatnonzero(ws.ipool[t.n_ipool :] < 0) + t.n_ipool  # the loops' -id
    assert len(cells) >= 4
    assert t.kernels.gradient(ws) == -1  # the pool as made: runs
    g = ws.grad[: x.size].copy()
    for bad, err, match in ((-_dispatch.UNIT_CAP - 3, ValueError, "names no fused loop"),
                            (-(_dispatch.UNIT_CAP - 1), RuntimeError, "has not compiled")):  # fmt: skip
        forged = ws._replace(ipool=ws.ipool.copy())
        forged.ipool[cells[0]] = bad
        with pytest.raises(err, match=match):
            t.kernels.gradient(forged)
    assert t.kernels.gradient(ws) == -1
    np.testing.assert_array_equal(ws.grad[: x.size], g)
