"""Eager mode's fast paths (tape.frontend.tensor.binary, apply, Tape.copy_in, the int blocks a new
step's tape shares with the previous one) give the gradients of the general path: checked
against analytic gradients, finite differences and NumPy in float64."""

import math
import warnings

import numpy as np
import pytest

import tape


def fd(f, x, h=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        g.flat[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def test_requires_grad_set_after_a_tape_copied_the_tensor_as_a_constant():
    x = tape.tensor([1.0, 2.0, 3.0])
    w = tape.tensor(2.0, requires_grad=True)
    y = x * w  # x copied in as a constant
    x.requires_grad_(True)
    z = (x * y).sum()  # y was made before x required grad: as in PyTorch, dz/dx = y
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * np.array([1.0, 2.0, 3.0]))
    assert w.grad.item() == pytest.approx(14.0)


def test_requires_grad_cleared_before_backward_leaves_no_gradient():
    # as PyTorch: a leaf that no longer requires grad gets none
    w = tape.tensor(2.0, requires_grad=True)
    v = tape.tensor(3.0, requires_grad=True)
    y = w * v
    w.requires_grad_(False)
    y.backward()
    assert w.grad is None
    assert v.grad.item() == pytest.approx(2.0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tensor_and_float_operators_on_one_tape(dtype):
    dt = getattr(tape, dtype)
    x0 = np.array([0.3, -1.2, 2.5])

    def f_np(x):
        y = x
        for _ in range(3):
            y = y * 1.5 + 0.25
            y = 2.0 - y
            y = y / 3.0
        return float(np.sum(y * y))

    x = tape.tensor(x0, dtype=dt, requires_grad=True)
    y = x
    for _ in range(3):
        y = y * 1.5 + 0.25
        y = 2.0 - y
        y = y / 3.0
    loss = (y * y).sum()
    assert loss.dtype == np.dtype(dtype)
    loss.backward()
    tol = 1e-9 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(x.grad.numpy(), fd(f_np, x0), rtol=tol, atol=tol)
    assert x.grad.dtype == np.dtype(dtype)


def test_training_steps_whose_shapes_change_share_int_blocks_safely():
    # each step's new tape starts with the previous tape's int blocks; shapes that differ from
    # step to step must still get their own blocks
    rng = np.random.default_rng(0)
    w = tape.tensor(rng.standard_normal(4), requires_grad=True)
    for step in range(6):
        n = 3 + step % 3
        a = rng.standard_normal((n, 4))
        A = tape.tensor(a)
        loss = ((A * w).sum(dim=1) ** 2).sum() + (w * w).sum()
        loss.backward()
        wv = w.detach().numpy().copy()
        expect = 2 * a.T @ (a @ wv) + 2 * wv
        np.testing.assert_allclose(w.grad.numpy(), expect, rtol=1e-12)
        w.grad = None


def test_polynomial_loop_matches_numpy():
    # the eager benchmark's loop against the same update written in NumPy
    x = np.linspace(-np.pi, np.pi, 50)
    y = np.sin(x)
    p = np.array([0.1, -0.2, 0.05, 0.01])
    X = tape.tensor(x)
    Y = tape.tensor(y)
    a, b, c, d = (tape.tensor(v, requires_grad=True) for v in p)
    lr = 1e-4
    for _ in range(5):
        r = p[0] + p[1] * x + p[2] * x**2 + p[3] * x**3 - y
        g = np.array([2 * r.sum(), 2 * (r * x).sum(), 2 * (r * x**2).sum(), 2 * (r * x**3).sum()])
        loss = (a + b * X + c * X**2 + d * X**3 - Y).pow(2).sum()
        assert loss.item() == pytest.approx(float((r * r).sum()), rel=1e-13)
        loss.backward()
        got = np.array([t.grad.item() for t in (a, b, c, d)])
        np.testing.assert_allclose(got, g, rtol=1e-10)  # summation orders differ
        with tape.no_grad():
            for t in (a, b, c, d):
                t -= lr * t.grad
                t.grad = None
        p = p - lr * g
    np.testing.assert_allclose([t.item() for t in (a, b, c, d)], p, rtol=1e-10)


def test_constant_ops_do_not_warn_and_keep_numpy_error_state():
    x = tape.tensor([1e308, 0.0, -1.0])
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big = x * 10.0
        q = x / 0.0
    assert np.isinf(big.numpy()[0]) and np.isnan(q.numpy()[1])
    assert np.geterr() == before
    with pytest.warns(RuntimeWarning):
        np.array([1.0]) / 0.0  # the user's own NumPy still warns


@pytest.mark.parametrize("name", ["polynomial", "mlp_adam", "scalar_chain"])
def test_benchmark_loops_agree_with_pytorch(name):
    # the eager benchmark's loops (tape.bench.eager) under tape, and under PyTorch when it is
    # installed (the same code): the final losses agree
    from tape.bench.eager import LOOPS

    loop = LOOPS[name]
    got = loop(tape, steps=5)
    assert np.isfinite(got)
    torch = pytest.importorskip("torch")
    assert got == pytest.approx(loop(torch, steps=5), rel=1e-10)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_unary_ops_on_one_tape(dtype):
    dt = getattr(tape, dtype)
    x0 = np.array([0.3, -1.2, 2.5, 0.7])

    def f_np(x):
        y = np.tanh(np.exp(-x) * 0.5)
        y = np.sqrt(np.square(y) + 1.0)
        return float(np.sum(np.maximum(y - 1.01, 0.0) + np.abs(-y)))

    x = tape.tensor(x0, dtype=dt, requires_grad=True)
    y = tape.tanh(tape.exp(-x) * 0.5)
    y = tape.sqrt(tape.square(y) + 1.0)
    loss = (tape.relu(y - 1.01) + tape.abs(-y)).sum()
    assert loss.dtype == np.dtype(dtype)
    assert loss.item() == pytest.approx(f_np(x0), rel=1e-12 if dtype == "float64" else 1e-5)
    loss.backward()
    tol = 1e-8 if dtype == "float64" else 1e-3
    np.testing.assert_allclose(x.grad.numpy(), fd(f_np, x0), rtol=tol, atol=tol)


def test_leaves_and_constants_copied_into_an_open_tape_by_the_operators():
    # binary's direct path: two tensors with no graph (a leaf and a constant), a tensor on the
    # tape and a leaf, a constant written in place between two uses (copied again)
    rng = np.random.default_rng(3)
    xv, cv, av = rng.standard_normal(7), 0.7, rng.standard_normal(7)
    x = tape.tensor(xv)
    c = tape.tensor(cv, requires_grad=True)
    a = tape.tensor(av, requires_grad=True)
    cx = c * x  # both without a graph
    y = a - cx  # a leaf and a tensor on the tape
    with tape.no_grad():
        x.mul_(2.0)  # a new version: the next use copies it again
    z = (y * x).sum()
    z.backward()
    x2 = 2.0 * xv

    def f(p):
        return np.sum((p[1:] - p[0] * xv) * x2)

    p = np.concatenate([[cv], av])
    g = fd(f, p)
    np.testing.assert_allclose(c.grad.item(), g[0], rtol=1e-7)
    np.testing.assert_allclose(a.grad.numpy(), g[1:], rtol=1e-7)
    assert z.item() == pytest.approx(f(p), rel=1e-12)


def test_direct_paths_leave_mixed_dtypes_and_views_to_the_general_path():
    # a float32 leaf with a float64 tensor promotes (as PyTorch); a view of a leaf reaches
    # its base's gradient
    w64 = tape.tensor(np.arange(4.0), requires_grad=True)
    w32 = tape.tensor(np.ones(4, np.float32), requires_grad=True)
    y = (w64 * 2.0) * w32
    assert y.dtype == np.float64
    y.sum().backward()
    assert w32.grad.dtype == np.float32
    np.testing.assert_allclose(w32.grad.numpy(), 2.0 * np.arange(4.0))
    base = tape.tensor(np.arange(6.0), requires_grad=True)
    v = base[1:4]
    k = tape.tensor(np.array([1.0, 2.0, 3.0]))
    (v * k).sum().backward()
    np.testing.assert_allclose(base.grad.numpy(), [0.0, 1.0, 2.0, 3.0, 0.0, 0.0])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_full_sums_are_accurate_and_propagate_nan_and_inf(dtype):
    # the sum kernel adds in blocks (tape.ops.loops.total): compare with an exact sum; the
    # inputs require grad, so the sum runs on a tape (a constant's sum is NumPy's)
    rng = np.random.default_rng(5)
    tol = 1e-13 if dtype == "float64" else 1e-6
    for n in (1, 7, 64, 1001, 20000):
        v = rng.standard_normal(n).astype(dtype)
        x = tape.tensor(v, requires_grad=True)
        s = x.sum()
        exact = float(np.sum(v.astype(np.float64)))
        assert abs(s.item() - exact) <= tol * np.abs(v).sum()
        s.backward()
        np.testing.assert_array_equal(x.grad.numpy(), np.ones(n, dtype))
        m = tape.tensor(v[: (n // 7) * 7].reshape(-1, 7).T.copy(), requires_grad=True)
        if m.shape[1]:  # along contiguous rows
            want = v[: (n // 7) * 7].reshape(-1, 7).astype(np.float64).sum(0)
            np.testing.assert_allclose(m.sum(dim=1).numpy(), want, rtol=10 * tol, atol=tol * n)

    def total(v):
        return tape.tensor(np.asarray(v, dtype), requires_grad=True).sum().item()

    v = np.ones(100)
    for bad in (np.inf, -np.inf):
        v[37] = bad
        assert total(v) == bad
    v[37] = np.nan
    assert np.isnan(total(v))
    v[37], v[3], v[80] = 1.0, np.inf, -np.inf
    assert np.isnan(total(v))


def test_eager_steps_pass_the_types_their_entry_point_was_compiled_for(monkeypatch, tmp_path):
    """Eager mode's step calls ``sweeps.emit`` through the entry point compiled for the first
    call's argument types (``tape.program.core._EMIT``), which trusts them: every later call
    must pass arrays of exactly those types (C-ordered, writeable, int64 tables, the arena's
    dtype) and integers, through growth of every array, float32 tapes, promotion to float64,
    merged graphs, steps that share the previous step's int pool, recordings, compiled tapes
    and loaded ones."""
    from numba import typeof
    from numba.core.typing.typeof import Purpose

    import tape.program.core as core
    from tape.interpreter.generated import sweeps

    calls = []

    def checked(entry):
        (sig,) = [s for s, o in sweeps.emit.overloads.items() if o.entry_point is entry]

        def call(*args):
            got = tuple(
                typeof(a, Purpose.argument) if isinstance(a, np.ndarray) else a for a in args
            )
            for a, want in zip(got, sig):
                if isinstance(a, int) or isinstance(a, np.integer):
                    assert str(want) == "int64", (want, a)
                else:
                    assert a == want, (a, want)
            calls.append(sig[3].dtype)
            return entry(*args)

        return call

    class Checked(dict):
        def get(self, key, default=None):
            e = dict.get(self, key, default)
            return None if e is None else checked(e)

        def __setitem__(self, key, entry):
            dict.__setitem__(self, key, entry)

    monkeypatch.setattr(core, "_EMIT", Checked())
    rng = np.random.default_rng(0)

    # growth of every array: many ops, many shapes and attribute blocks, a large arena
    def chain(xp, y):
        for k in range(60):
            y = xp.sin(y) * 1.01 + y[: 50 - k % 7].sum() * 0.001 if k % 2 else y * 0.99 + 0.01
        return y.sum()

    x0 = rng.standard_normal(50)
    x = tape.tensor(x0, requires_grad=True)
    z = tape.tensor(rng.standard_normal((300, 40)), requires_grad=True)
    s = (tape.exp(z * 0.1) @ z.T).sum() + chain(tape, x)
    s.backward()
    assert z.grad.shape == (300, 40)
    fd_x = fd(lambda u: chain(np, u), x0)
    np.testing.assert_allclose(x.grad.numpy(), fd_x, rtol=1e-6, atol=1e-8)
    # float32, then joined by a float64 value (promotion by astype), then merged graphs
    a32 = tape.tensor(rng.standard_normal(20).astype(np.float32), requires_grad=True)
    b = (a32 * 2.0).sum()
    c64 = tape.tensor(rng.standard_normal(20), requires_grad=True)
    d = a32 * 3.0 + c64 * c64
    (d.sum() + b).backward()
    np.testing.assert_allclose(c64.grad.numpy(), 2 * c64.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(a32.grad.numpy(), np.full(20, 5.0), rtol=1e-6)
    # training steps: each step's tape shares the previous one's int pool
    w = tape.tensor(rng.standard_normal((8, 3)), requires_grad=True)
    xs = tape.tensor(rng.standard_normal((16, 8)))
    for _ in range(4):
        loss = tape.tanh(xs @ w).pow(2).mean()
        loss.backward()
        w.grad = None
    # a recording, its compiled tier, and a saved and loaded copy replayed
    v = rng.uniform(-1, 2, 30)
    t = tape.record(lambda u: (100 * (u[1:] - u[:-1] ** 2) ** 2 + (1 - u[:-1]) ** 2).sum(), v)
    g = t.gradient(v)
    t.save(tmp_path / "t.npz")
    t2 = tape.load(tmp_path / "t.npz")
    np.testing.assert_allclose(t2.gradient(v), g, rtol=1e-12)
    np.testing.assert_allclose(t.compile().gradient(v), g, rtol=1e-12)
    assert {np.dtype(np.float64), np.dtype(np.float32)} <= {np.dtype(str(d)) for d in calls}


def _broadcasting_objective(x, b, w):
    z = (x - b) * w.reshape((1, -1)) + tape.exp(b / 4.0)
    z = z - z.mean(axis=1, keepdims=True)
    return tape.logsumexp(z, axis=1).sum() + (z**2).mean(axis=0).sum()


def test_recording_from_an_empty_cache_puts_entries_as_eager_steps_do(monkeypatch):
    """A recording whose process lacks eager mode's compiled step (an empty cache) puts its
    entries and runs their kernels from Python (Tape._emit_cold): the same tape, values and
    gradients as the compiled step, and gradients that match finite differences."""
    from tape.program import core

    rng = np.random.default_rng(4)
    args = [rng.standard_normal((6, 5)), rng.standard_normal(5), rng.standard_normal(5)]
    warm = tape.record(_broadcasting_objective, *args, compile=False)
    calls = []
    real = core.Tape._emit_cold
    monkeypatch.setattr(core, "_emit_cached", lambda: False)
    monkeypatch.setattr(core, "_EMIT", {})  # as in a process that has not compiled it
    monkeypatch.setattr(core.Tape, "_emit_cold", lambda t, a: calls.append(1) or real(t, a))
    cold = tape.record(_broadcasting_objective, *args, compile=False)
    assert len(calls) == cold.n_entries > 10
    n, m = cold.n_entries, cold.n_bufs
    np.testing.assert_array_equal(cold.entries[:n], warm.entries[:n])
    np.testing.assert_array_equal(cold.bufs[:m], warm.bufs[:m])
    np.testing.assert_array_equal(cold.data[: cold.n_data], warm.data[: warm.n_data])
    for gc, gw in zip(cold.gradient(*args), warm.gradient(*args)):
        np.testing.assert_array_equal(gc, gw)
    for k in range(3):

        def f(v, k=k):
            a = list(args)
            a[k] = v
            return float(_broadcasting_objective(*[tape.tensor(u) for u in a]).item())

        np.testing.assert_allclose(cold.gradient(*args)[k], fd(f, args[k]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "a, b",
    [((3, 4), (4,)), ((3, 4), (1, 4)), ((2, 3, 4), (3, 4)), ((3, 4, 1), (4, 1)),
     ((3, 4), (3, 1)), ((2, 3, 4), (2, 1, 1)), ((2, 3, 4), (2, 3, 1)), ((1, 3, 4), (3, 1)),
     ((2, 3, 4), (3, 1)), ((2, 3, 4), (1, 3, 1)), ((3, 1, 4), (1, 5, 1)), ((6,), (2, 6)),
     ((5, 1), (1, 5)), ((3, 4), ()), ((3, 4), (3, 4))],
)  # fmt: skip
def test_entry_classes_say_how_each_input_maps_onto_the_output(a, b):
    """An input's class, from NumPy and from the compiled sweeps' code, is what broadcasting
    makes of it: output element j reads element j (same size), 0 (one value), j % s (a row:
    the kernels of ROW read it so), j // (n / s) (a column: COL's kernels), or anything else."""
    from tape.interpreter import dispatch
    from tape.layout.columns import COL, ONE, OTHER, ROW, SAME_SIZE

    for x, y in ((a, b), (b, a)):
        t = tape.record(lambda u, v: (u * v).sum(), np.ones(x), np.ones(y), compile=False)
        (i,) = np.flatnonzero(t.entries[: t.n_entries, 0] == tape.ops.registry.BY_NAME["mul"].code)
        out = np.broadcast_shapes(x, y)
        n = math.prod(out)
        want = 0
        for k, shape in enumerate((x, y)):
            s = math.prod(shape)
            j = np.broadcast_to(np.arange(s).reshape(shape), out).ravel()
            if s == n:
                c = SAME_SIZE
            elif s == 1:
                c = ONE
            elif np.array_equal(j, np.arange(n) % s):
                c = ROW
            elif np.array_equal(j, np.arange(n) // (n // s)):
                c = COL
            else:
                c = OTHER
            want += dispatch.CLASS_BASE**k * c
        rows = np.array([i])
        assert dispatch.classes_of(t.entries, t.bufs, t.ipool, rows)[0] == want, (x, y)
        assert dispatch.entry_classes(t.entries, t.bufs, t.ipool, rows)[0] == want, (x, y)


def test_entry_classes_from_numpy_match_the_compiled_ones():
    """``dispatch.classes_of`` (NumPy, for the Python paths) gives every entry the class that
    the sweeps' compiled ``entry_class`` gives it."""
    from tape.interpreter import dispatch
    from tape.layout.columns import ALL, COL, ONE, OTHER, ROW, SAME_SIZE

    rng = np.random.default_rng(5)
    args = [rng.standard_normal((6, 5)), rng.standard_normal(5), rng.standard_normal(5)]
    t = tape.record(_broadcasting_objective, *args, compile=False)
    rows = np.arange(t.n_entries)
    got = dispatch.classes_of(t.entries, t.bufs, t.ipool, rows)
    np.testing.assert_array_equal(got, dispatch.entry_classes(t.entries, t.bufs, t.ipool, rows))
    # same-size, one-value, whole, row, column and other inputs all occur
    inputs = {int(c) // dispatch.CLASS_BASE**k % dispatch.CLASS_BASE for c in got for k in range(3)}
    assert inputs == {SAME_SIZE, ONE, ALL, OTHER, ROW, COL}, inputs
