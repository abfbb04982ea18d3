"""Forward mode and Hessians on the compiled tier (:mod:`tape.compiler.second`) against the
interpreter's drivers and finite differences.

Each tape is recorded twice, on the interpreter and compiled; ``jvp``, ``jacobian(mode="fwd")``,
``hvp`` and ``hessian`` of the compiled one run the generated passes and must agree with the
interpreter's to 1e-12 relative in float64. The shapes cover every way a fused loop reads an
input (full, one value, a row per row, a value per row, tiles and blocks of rows), folded sums
(full and over blocks of rows), loops in blocks (flat and over rows) and element by element, entries the tier
leaves to the interpreter's kernels (matrix products, ``max``), merged duplicates, ``where``
and integer powers.
"""

from __future__ import annotations

import numpy as np
import pytest

import tape as tp
from tape.compiler import second

RTOL = 1e-12

# after the main process's other tests: the interpreter's second-order kernels these compare
# against are in Numba's cache by then (the background test_derivatives.py compiles them all)
pytestmark = pytest.mark.late


def close(a, b, rtol=RTOL):
    a, b = np.asarray(a, float), np.asarray(b, float)
    np.testing.assert_allclose(
        a, b, rtol=rtol, atol=rtol * max(1.0, float(np.abs(b).max(initial=0)))
    )


def pairs(x):
    return x if isinstance(x, tuple) else (x,)


def both(fn, *args):
    ti = tp.record(fn, *args, compile=False)
    tc = tp.record(fn, *args, compile=True)
    assert ti.tier == "interpreter" and tc.tier == "compiled"
    return ti, tc


def rosenbrock(x):
    return tp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def gmm_rows(q, xc, y):
    return tp.sum(tp.sum((tp.exp(q) * xc + y) ** 2, 1) * 0.5)


def three_axis(xT, mu, z):
    xc = xT - mu[:, :, None]
    u = xc * z[:, None, :] + xc
    return tp.sum(tp.sum(u * u, 1) * tp.sin(z))


def mlp(h, W, b):
    z = h @ W
    return tp.sum(tp.tanh(z + b) * tp.log(1.0 + z * z))


def mixed(x, y):
    a, b = tp.sin(x * y), tp.sin(x * y)  # merged duplicates
    w = tp.where(x > 0.0, tp.sqrt(tp.abs(x) + 1.0), x**3)
    return tp.sum(a * b + w * tp.exp(-y)) + tp.max(tp.cos(x * y)) + tp.sum(tp.sum(x * x, 0) * y)


RNG = np.random.default_rng(5)
CASES = {
    "flat blocked": (rosenbrock, (RNG.uniform(-1, 1, 300),)),
    "flat elements": (rosenbrock, (RNG.uniform(-1, 1, 9),)),
    "value per row": (gmm_rows, (RNG.normal(size=(3, 2, 1)), RNG.normal(size=(3, 2, 70)),
                                 RNG.normal(size=(3, 2, 70)))),
    "tiles and blocks": (three_axis, (RNG.normal(size=(2, 20)), RNG.normal(size=(3, 2)),
                                      RNG.normal(size=(3, 20)))),
    "row per row": (mlp, (RNG.normal(size=(6, 3)), RNG.normal(size=(3, 5)), RNG.normal(size=5))),
    "long rows": (mlp, (RNG.normal(size=(4, 3)), RNG.normal(size=(3, 70)), RNG.normal(size=70))),
    "long tiles and blocks": (three_axis, (RNG.normal(size=(2, 70)), RNG.normal(size=(3, 2)),
                                           RNG.normal(size=(3, 70)))),
    "mixed": (mixed, (RNG.normal(size=(4, 5)), RNG.normal(size=5))),
}  # fmt: skip

TAPES: dict = {}


def tapes(name):
    if name not in TAPES:
        fn, args = CASES[name]
        TAPES[name] = (*both(fn, *args), args)
    return TAPES[name]


@pytest.mark.parametrize("name", list(CASES))
def test_hvp_and_jvp_agree_with_the_interpreter(name):
    ti, tc, args = tapes(name)
    rng = np.random.default_rng(len(name))
    x = tuple(a + 0.1 * rng.normal(size=np.shape(a)) for a in args)
    v = tuple(rng.normal(size=np.shape(a)) for a in args)
    v1 = v if len(v) > 1 else v[0]
    for a, b in zip(pairs(tc.hvp(*x, v=v1)), pairs(ti.hvp(*x, v=v1))):
        assert a.shape == b.shape
        close(a, b)
    assert second.derivative_module(tc) is not None  # the generated passes ran
    (yc, jc), (yi, ji) = tc.jvp(*x, tangents=v1), ti.jvp(*x, tangents=v1)
    close(yc, yi)
    close(jc, ji)
    # again at other arguments: nothing stale in the arenas
    x2 = tuple(-a for a in x)
    for a, b in zip(pairs(tc.hvp(*x2, v=v1)), pairs(ti.hvp(*x2, v=v1))):
        close(a, b)


@pytest.mark.parametrize(
    "name", ["flat elements", "flat blocked", "row per row", "long tiles and blocks", "mixed"]
)
def test_hessian_and_forward_jacobian_agree_with_the_interpreter(name):
    ti, tc, args = tapes(name)
    Hc, Hi = tc.hessian(*args), ti.hessian(*args)
    for a, b in zip(np.ravel(np.array(Hc, dtype=object)), np.ravel(np.array(Hi, dtype=object))):
        close(a, b)
    for a, b in zip(pairs(tc.jacobian(*args, mode="fwd")), pairs(ti.jacobian(*args, mode="fwd"))):
        close(a, b)


def test_hvp_against_finite_differences_of_the_gradient():
    ti, tc, args = tapes("tiles and blocks")
    rng = np.random.default_rng(1)
    v = tuple(rng.normal(size=np.shape(a)) for a in args)
    eps = 1e-6
    plus = tc.gradient(*(a + eps * d for a, d in zip(args, v)))
    minus = tc.gradient(*(a - eps * d for a, d in zip(args, v)))
    for h, p, m in zip(tc.hvp(*args, v=v), plus, minus):
        close(h, (p - m) / (2 * eps), rtol=1e-6)


def test_several_directions_per_pass_match_one_at_a_time():
    # the dense Hessian runs every direction in one pass (vector mode): the first-order
    # adjoints are added once, the tangent adjoints per direction
    ti, tc, args = tapes("value per row")
    n = sum(np.size(a) for a in args)
    from tape.transforms import derivatives as D

    plan, data = D._forward(tc, args)
    V = np.random.default_rng(3).normal(size=(4, n))
    rows = D._hvp_rows(plan, data, V)
    for k in range(4):
        parts, c = [], 0
        for a in args:
            parts.append(V[k, c : c + np.size(a)].reshape(np.shape(a)))
            c += np.size(a)
        want = np.concatenate([np.ravel(g) for g in ti.hvp(*args, v=tuple(parts))])
        close(rows[k], want)


def test_float32_tape():
    x = np.random.default_rng(2).uniform(-1, 1, 200).astype(np.float32)
    tc = tp.record(rosenbrock, x, compile=True)
    ti = tp.record(rosenbrock, x.astype(np.float64), compile=False)
    v = np.ones_like(x)
    for _ in range(2):  # the checked path, then the one call
        h = tc.hvp(x, v=v)
        assert h.dtype == np.float32
        np.testing.assert_allclose(h, ti.hvp(x.astype(np.float64), v=v.astype(np.float64)),
                                   rtol=1e-4, atol=1e-3)  # fmt: skip


def test_tapes_the_generator_leaves_use_the_interpreter(monkeypatch):
    monkeypatch.setattr(second, "MAX_GROUPS", 0)
    x = np.linspace(-1, 1, 7)
    tc = tp.record(rosenbrock, x * 1.5, compile=True)
    ti = tp.record(rosenbrock, x * 1.5, compile=False)
    close(tc.hvp(x, v=x), ti.hvp(x, v=x))
    assert second.derivative_module(tc) is None


@pytest.mark.parametrize("n", [9, 300])
def test_hvp_leaves_out_the_final_sums_forward_and_tangent(n):
    """A final sum that the reverse loop takes (the one-call gradient skips its forward) is
    skipped by the HVP too: no forward loop, no tangent loop; its tangent-of-reverse loop
    computes what it needs. The result is Rosenbrock's Hessian times v, and the half-run
    forward is not one ``backward()`` may go back through."""
    ti, tc, args = tapes("flat elements" if n == 9 else "flat blocked")
    x = args[0]
    v = np.random.default_rng(n).normal(size=n)
    tc.hvp(x, v=v)
    mod = second.derivative_module(tc)
    assert mod.prog[4] == mod.prog[2] - 1  # the sum's tangent row is not run
    hv = np.zeros(n)
    hv[:-1] += (1200.0 * x[:-1] ** 2 - 400.0 * x[1:] + 2.0) * v[:-1] - 400.0 * x[:-1] * v[1:]
    hv[1:] += 200.0 * v[1:] - 400.0 * x[:-1] * v[:-1]
    close(tc.hvp(x, v=v), hv, rtol=1e-10)
    with pytest.raises(RuntimeError, match="no complete forward"):
        tc.backward()
    close(tc.forward(x), ti.forward(x))
    tc.zero_grad()
    tc.backward()
    close(tc.grads[0], ti.gradient(x))


M = np.random.default_rng(8).normal(size=(6, 5))


def through_product(x):
    return tp.sum(tp.tanh(x @ tp.tensor(M)) * 2.0) + tp.sum(x * x * x)


def branching(x):
    if tp.sum(x) > 0.0:  # a guard: the tape retraces where the branch changes
        return tp.sum(tp.sin(x) * x)
    return tp.sum(x**4)


def test_hvp_in_one_call_matches_the_interpreter():
    """The one-argument HVP of a compiled tape runs in one compiled call (the forward by its
    address, then the passes) from its second call on: a forward with an entry the
    interpreter runs (a matrix product) before the fused loops, several calls at other
    arguments (nothing stale in the arenas), and a failed guard, which takes the checked
    path and retraces; a strided argument and direction."""
    x = np.linspace(-1.0, 1.0, 6)
    ti, tc = both(through_product, x)
    rng = np.random.default_rng(4)
    for k in range(3):
        x2, v = x + 0.3 * k, rng.normal(size=6)
        close(tc.hvp(x2, v=v), ti.hvp(x2, v=v))
    assert tc.extension_state.get("hvp") is not None  # the one call ran
    # strided argument and direction: the one call's entry takes any layout
    xs, vs = np.linspace(-1.0, 1.4, 12)[::2], rng.normal(size=(6, 3))[:, 1]
    close(tc.hvp(xs, v=vs), ti.hvp(xs.copy(), v=vs.copy()))
    xp = np.array([0.5, 1.0, -0.2, 0.3])
    tb = tp.record(branching, xp, compile=True)
    v = rng.normal(size=4)
    for x2 in (xp, xp * 1.5, -xp, xp):  # positive sum, positive, negative (retrace), positive
        want = (-np.sin(x2) * x2 + 2.0 * np.cos(x2)) * v if x2.sum() > 0 else 12.0 * x2**2 * v
        close(tb.hvp(x2, v=v), want)


def test_dense_hessian_in_one_call_matches_the_interpreter(monkeypatch):
    """The dense Hessian of a compiled tape with one 1-d argument runs in one compiled call
    from its second call on: in one pass and, with the pass size forced down, in passes of
    3, 3, 3 and 1 directions (scratch reused across passes and calls); a strided argument;
    a failed guard, which takes the checked path and retraces. Against the interpreter's
    Hessian and finite differences of the gradient. A pattern that colouring compresses
    (Rosenbrock's tridiagonal one, over COMPRESS_MIN elements) keeps the colouring."""
    from tape.transforms import derivatives as D

    x = np.linspace(-1.0, 1.0, 6)
    for per_pass in (None, 3):
        if per_pass is not None:  # chunk(): max(CHUNK_BYTES // per, CHUNK_MIN) directions
            monkeypatch.setattr(D, "CHUNK_BYTES", 1)
            monkeypatch.setattr(D, "CHUNK_MIN", per_pass)
        xr = np.linspace(-1.0, 1.5, 10)
        for fn, x0 in ((through_product, x), (rosenbrock, xr)):
            ti, tc = both(fn, x0)
            for k in range(3):
                x2 = x0 + 0.3 * k
                close(tc.hessian(x2), ti.hessian(x2))
            call = tc.extension_state.get("hessian")[1]  # the one call ran
            assert call.k == (len(x0) if per_pass is None else per_pass)
    wide = np.linspace(-1.0, 1.5, 20)
    close(tc.hessian(wide[::2]), ti.hessian(wide[::2].copy()))
    eps, g = 1e-6, tc.gradient
    fd = np.array([(g(xr + eps * e) - g(xr - eps * e)) / (2 * eps) for e in np.eye(10)])
    close(tc.hessian(xr), fd, rtol=1e-6)
    xp = np.array([0.5, 1.0, -0.2, 0.3])
    tb = tp.record(branching, xp, compile=True)
    for x2 in (xp, xp * 1.5, -xp, xp):  # positive sum, positive, negative (retrace), positive
        d2 = -np.sin(x2) * x2 + 2.0 * np.cos(x2) if x2.sum() > 0 else 12.0 * x2**2
        close(tb.hessian(x2), np.diag(d2))
    monkeypatch.undo()
    x100 = np.linspace(-1.0, 1.5, 100)
    ti, tc = both(rosenbrock, x100)
    close(tc.hessian(x100), ti.hessian(x100))
    close(tc.hessian(x100), ti.hessian(x100))
    assert tc.extension_state.get("hessian") is None


def vector_out(x):
    return tp.tanh(x @ tp.tensor(M @ M.T)) * tp.sum(x * x) + tp.sin(x)


def matrix_out(x):
    return tp.exp(x[:, None] * x[None, :] * 0.1)


def test_dense_jacobian_in_one_call_matches_the_interpreter(monkeypatch):
    """The forward-mode Jacobian of a compiled tape with one 1-d argument and one output
    runs in one compiled call from its second call on (``mode="fwd"``, and ``"auto"`` where
    that chooses forward mode), in one pass or in passes of 4 directions: a vector output,
    a matrix output (shape ``out.shape + arg.shape``), a strided argument. A scalar output
    with ``mode="auto"`` takes reverse mode, not the one call."""
    from tape.transforms import derivatives as D

    x = np.linspace(-1.0, 1.0, 6)
    for per_pass in (None, 4):
        if per_pass is not None:
            monkeypatch.setattr(D, "CHUNK_BYTES", 1)
            monkeypatch.setattr(D, "CHUNK_MIN", per_pass)
        for fn in (vector_out, matrix_out):
            ti, tc = both(fn, x)
            for k, mode in enumerate(("fwd", "fwd", "auto", "fwd")):
                x2 = x + 0.2 * k
                want = ti.jacobian(x2, mode="rev")
                got = tc.jacobian(x2, mode=mode)
                assert got.shape == want.shape
                close(got, want)
            fast = tc.extension_state.get("jacobian")
            assert fast is not None and fast[1].k == (6 if per_pass is None else 3)
            assert fast[3] == ("fwd", "auto")
    wide = np.linspace(-1.0, 1.5, 12)
    close(tc.jacobian(wide[::2], mode="fwd"), ti.jacobian(wide[::2].copy(), mode="rev"))
    ti, tc = both(through_product, x)
    for _ in range(2):
        close(tc.jacobian(x, mode="auto"), ti.gradient(x))
    assert tc.extension_state.get("jacobian") is None


def test_jvp_and_vjp_in_one_call_match_the_interpreter(monkeypatch):
    """``jvp`` and ``vjp`` of a compiled tape with one 1-d argument and one output run in one
    compiled call from their second call on (``tape.compiler.second.jvp_args`` and
    ``vjp_args``): a scalar, a vector and a matrix output, at several arguments, against the
    interpreter's results (the same types and shapes) and central differences; with the
    checked paths made to fail, the calls still answer (the one calls ran). A strided
    argument, tangent and cotangent; a float cotangent for a scalar output; a failed
    guard, which takes the checked path and retraces; a tangent of the wrong shape, which
    the checked path refuses."""
    from tape.transforms import derivatives as D

    x = np.linspace(-1.0, 1.0, 6)
    rng = np.random.default_rng(11)
    for fn in (through_product, vector_out, matrix_out):
        ti, tc = both(fn, x)
        shape = np.shape(ti.forward(x))
        for k in range(3):
            x2, v, u = x + 0.2 * k, rng.normal(size=6), rng.normal(size=shape)
            for got, want in ((tc.jvp(x2, tangents=v), ti.jvp(x2, tangents=v)),
                              (tc.vjp(x2, cotangent=u), ti.vjp(x2, cotangent=u))):  # fmt: skip
                assert [type(a) for a in got] == [type(a) for a in want]
                assert [np.shape(a) for a in got] == [np.shape(a) for a in want]
                close(got[0], want[0])
                close(got[1], want[1])
            eps = 1e-6
            fd = (ti.forward(x2 + eps * v) - ti.forward(x2 - eps * v)) / (2 * eps)
            close(tc.jvp(x2, tangents=v)[1], fd, rtol=1e-6)
            J = np.array([(ti.forward(x2 + eps * e) - ti.forward(x2 - eps * e)) / (2 * eps)
                          for e in np.eye(6)])  # fmt: skip
            close(tc.vjp(x2, cotangent=u)[1], J.reshape(6, -1) @ np.ravel(u), rtol=1e-6)
        assert tc.extension_state.get("jvp") is not None
        assert tc.extension_state.get("vjp") is not None
        # any layout: a strided argument, tangent and cotangent
        v, u = rng.normal(size=6), rng.normal(size=shape)
        xs, vs = np.linspace(-1.0, 1.4, 12)[::2], rng.normal(size=(6, 3))[:, 1]
        us = rng.normal(size=(6, 2))[:, 0] if shape == (6,) else u
        want = [ti.jvp(x, tangents=v)[1], ti.vjp(x, cotangent=u)[1],
                ti.jvp(xs.copy(), tangents=vs.copy())[1], ti.vjp(xs.copy(), cotangent=us.copy())[1],
                ti.gradient(x) if shape == () else None]  # fmt: skip
        with monkeypatch.context() as m:  # only the one calls can answer now

            def checked(*a):
                raise AssertionError("the checked path ran")

            m.setattr(D, "_jvp", checked)
            m.setattr(D, "_vjp", checked)
            close(tc.jvp(x, tangents=v)[1], want[0])
            close(tc.vjp(x, cotangent=u)[1], want[1])
            close(tc.jvp(xs, tangents=vs)[1], want[2])
            close(tc.vjp(xs, cotangent=us)[1], want[3])
            if shape == ():
                close(tc.vjp(x, cotangent=2.5)[1], 2.5 * want[4])
                close(tc.vjp(x, cotangent=np.array(-1.5))[1], -1.5 * want[4])
        with pytest.raises(ValueError, match="jvp: tangents"):
            tc.jvp(x, tangents=np.ones(5))
        with pytest.raises(ValueError, match="vjp: cotangent"):
            tc.vjp(x, cotangent=np.ones(np.size(u) + 1))
    # backward() after the one calls (they ran the whole forward); a NumPy scalar cotangent
    ti, tc = both(through_product, x)
    for _ in range(2):
        tc.vjp(x, cotangent=np.float64(2.0))
        tc.jvp(x, tangents=v)
    tc.zero_grad()
    tc.backward()
    close(tc.grads[0], ti.gradient(x))
    close(tc.vjp(x, cotangent=np.float64(2.0))[1], 2.0 * ti.gradient(x))
    # an output returned in a 1-tuple stays in one, on every call (no one call takes it)
    ti, tc = both(lambda x: (tp.sin(x) * x,), x)
    for _ in range(3):
        for got, want in ((tc.jvp(x, tangents=v), ti.jvp(x, tangents=v)),
                          (tc.vjp(x, cotangent=np.ones(6)), ti.vjp(x, cotangent=np.ones(6))),
                          (tc.jacobian(x, mode="fwd"), ti.jacobian(x, mode="fwd"))):  # fmt: skip
            assert type(got) is type(want) and type(got[0]) is type(want[0])
            close(got[0], want[0])
    xp = np.array([0.5, 1.0, -0.2, 0.3])
    tb = tp.record(branching, xp, compile=True)
    v = rng.normal(size=4)
    for x2 in (xp, xp * 1.5, -xp, xp, -xp):  # positive sum, positive, negative (retrace), ...
        d = np.sin(x2) + x2 * np.cos(x2) if x2.sum() > 0 else 4.0 * x2**3
        y = np.sum(np.sin(x2) * x2) if x2.sum() > 0 else np.sum(x2**4)
        val, tan = tb.jvp(x2, tangents=v)
        close(val, y)
        close(tan, d @ v)
        val, g = tb.vjp(x2, cotangent=2.0)
        close(val, y)
        close(g, 2.0 * d)


def test_vector_mode_tangent_loops_of_short_rows_are_vectorised():
    """A Hessian's or a Jacobian's tangent loops over rows of 16 elements (a small MLP's
    hidden layer) compile to vector code. With their bounds written as numbers, LLVM unrolled
    the rows into straight-line code that stayed scalar (the arena views may overlap): no
    vector multiply in either loop of this tape; the generated loops pass their bounds
    through ``tape.compiler.emit.opaque``."""
    import re
    import types as pytypes

    def f(h, W, b, w2):
        return tp.sum((tp.tanh(h @ W + b) @ w2) ** 2)

    x = (RNG.normal(size=(32, 8)), RNG.normal(size=(8, 16)), RNG.normal(size=16),
         RNG.normal(size=(16, 1)))  # fmt: skip
    t = tp.record(f, *x, compile=True)
    g = second.generate(t)
    mod = pytypes.ModuleType("tape_second_vector_check")  # compiled here, not cached
    exec(compile(g.source.replace("**UNIT_JIT", "nogil=True"), mod.__name__, "exec"), mod.__dict__)
    data, T = np.ones(t.n_data), np.zeros((3, t.n_data))
    assert g.many_units
    for name in g.many_units:
        loop = getattr(mod, name)
        loop(data, T)
        (ir,) = loop.inspect_llvm().values()
        assert re.search(r"fmul[^\n]*<\d+ x double>", ir), f"{name}: no vector multiply"


@pytest.mark.parametrize("name", list(CASES))
def test_adjoints_written_whole_first_are_assigned_not_zeroed(name):
    """Forward-over-reverse assigns the adjoint and the tangent adjoints of an intermediate
    that a fused loop writes whole before anything else does (``h @ W``, read by the loop of
    ``tanh(z + b) * log(1 + z * z)``), instead of zeroing them and adding: the pass zeroes
    what it reads and does not write first, so adjoint arenas full of NaN give the
    interpreter's numbers, and the product's output is left out of the zeroing."""
    from tape.layout.columns import B_OFF, E_OP, E_OUT
    from tape.ops.registry import BY_NAME
    from tape.transforms import derivatives as D

    ti, tc, args = tapes(name)
    n = sum(np.size(a) for a in args)
    plan, data = D._forward(tc, args)
    V = np.random.default_rng(4).normal(size=(3, n))
    T, GT, grad = plan.arenas(3)
    T[:] = 0.0
    plan.seed_inputs(T, V)
    GT[:], grad[:] = np.nan, np.nan
    D._hvp_pass(plan, data, grad, T, GT)
    got = plan.read_inputs(GT)
    for k in range(3):
        parts, c = [], 0
        for a in args:
            parts.append(V[k, c : c + np.size(a)].reshape(np.shape(a)))
            c += np.size(a)
        close(got[k], np.concatenate([np.ravel(g) for g in pairs(ti.hvp(*args, v=tuple(parts)))]))
    if name in ("row per row", "long rows"):  # h @ W: its output is assigned, not zeroed
        code = BY_NAME["matmul"].code
        (z,) = [int(tc.bufs[tc.entries[i, E_OUT], B_OFF]) for i in range(tc.n_entries)
                if tc.entries[i, E_OP] == code]  # fmt: skip
        p = second.derivative_module(tc).prog
        ranges = p[5 : 5 + 2 * p[0]].reshape(-1, 2)
        assert not any(a <= z < a + s for a, s in ranges), (z, ranges)


@pytest.mark.parametrize("compile", [False, True])
def test_matmul_tangents_of_many_directions_are_written_whole(compile):
    """In vector mode the product's first term assigns its output's tangent, and zeroes it
    for the directions whose operand tangent is zero (here the directions of the other
    argument, for both operands): whatever the tangent arena held there before is never
    read."""
    from tape.layout.columns import B_OFF, B_SIZE, E_OP, E_OUT
    from tape.ops.registry import BY_NAME
    from tape.transforms import derivatives as D

    args = (RNG.normal(size=(4, 3)), RNG.normal(size=(3, 5)))
    t = tp.record(lambda A, B: tp.sum(tp.sin(A @ B)), *args, compile=compile)
    want = t.jacobian(*args, mode="fwd")
    plan, data = D._forward(t, args)
    code = BY_NAME["matmul"].code
    (i,) = [i for i in range(t.n_entries) if t.entries[i, E_OP] == code]
    o = t.entries[i, E_OUT]
    T = plan.arenas(27)[0]
    T[:, t.bufs[o, B_OFF] : t.bufs[o, B_OFF] + t.bufs[o, B_SIZE]] = np.nan
    got = plan.read_outputs(D._tangents(plan, data, np.eye(27)))
    close(got.ravel(), np.concatenate([np.ravel(w) for w in want]))


def gmm_like(L0, xT, mu):
    # the product's operands come from the arguments through linear entries only (a product
    # with a constant mask, a difference): no second-order rule reads their adjoints
    mask = np.tril(np.ones((3, 3)), -1)
    return tp.sum(tp.sum(((L0 * mask) @ (xT - mu[:, :, None])) ** 2, 1) * 0.5)


IDX = np.array([[0, 2, 4], [1, 3, 5], [5, 0, 2]])


def two_readers(w, B):
    # X's tangent adjoint gets contributions from the product's tangent-of-reverse kernel and
    # from the fused loop of exp(X), which a reduction over an axis reads before the product:
    # that loop runs after the product's kernel in the reverse pass, and adds to X's
    X = w[IDX]
    return tp.sum(tp.sum(tp.exp(X), 1) ** 2) + tp.sum((X @ B) ** 2)


def sin_product(A, B):
    # sin's tangent-of-reverse rule reads its output's adjoint: the product's reverse runs
    return tp.sum(tp.tanh(tp.sin(A) @ B))


@pytest.mark.parametrize(
    "fn, args, reverse_runs",
    [
        (gmm_like, (RNG.normal(size=(2, 3, 3)), RNG.normal(size=(3, 40)),
                    RNG.normal(size=(2, 3))), False),
        (sin_product, (RNG.normal(size=(4, 3)), RNG.normal(size=(3, 5))), True),
        (two_readers, (RNG.normal(size=6), RNG.normal(size=(3, 4))), False),
        (mlp, (RNG.normal(size=(6, 3)), RNG.normal(size=(3, 5)), RNG.normal(size=5)), False),
    ],
)  # fmt: skip
def test_reverse_rules_whose_adjoints_nothing_reads_are_left_out(fn, args, reverse_runs):
    """Forward-over-reverse runs a matrix product's reverse kernel only where a
    tangent-of-reverse rule reads the adjoints it makes (:func:`second.adjoints_read`): not
    for operands made from the arguments by linear entries alone (``gmm_like``, ``h @ W`` of
    the arguments themselves, and ``two_readers``, where a fused loop that runs after the
    product's kernel must add to the tangent adjoints that kernel wrote, not assign them),
    but for ``sin(A) @ B``. The HVPs match the interpreter's (which runs every reverse
    kernel) and central differences of the gradient, with the adjoint arenas full of NaN
    before the pass."""
    from tape.layout.columns import E_OP
    from tape.ops.registry import BY_NAME
    from tape.transforms import derivatives as D

    ti, tc = both(fn, *args)
    code = BY_NAME["matmul"].code
    rows = second.generate(tc).rev_rows
    (what,) = [w for w, op, i in rows if w and op == code and tc.entries[i, E_OP] == code]
    assert what == (1 if reverse_runs else 2)
    rng = np.random.default_rng(2)
    v = tuple(rng.normal(size=np.shape(a)) for a in args)
    plan, data = D._forward(tc, args, compiled=True)
    T, GT, grad = plan.arenas(1)
    T[:] = 0.0
    for a, o, n in zip(v, plan.in_off, plan.in_size):
        T[0, o : o + n] = a.ravel()
    GT[:], grad[:] = np.nan, np.nan
    D._hvp_pass(plan, data, grad, T, GT)
    got = [
        GT[0, o : o + n].reshape(np.shape(a)) for a, o, n in zip(args, plan.in_off, plan.in_size)
    ]
    want = ti.hvp(*args, v=v)
    eps = 1e-6
    plus = tc.gradient(*(a + eps * d for a, d in zip(args, v)))
    minus = tc.gradient(*(a - eps * d for a, d in zip(args, v)))
    for g, w, p, m in zip(got, want, plus, minus):
        close(g, w)
        close(g, (p - m) / (2 * eps), rtol=1e-6)
    for g, w in zip(pairs(tc.hvp(*args, v=v)), want):
        close(g, w)


def test_second_order_of_a_function_linear_in_its_argument_is_zero():
    """``x * (c * c)`` with ``c`` an argument left out of ``wrt``: the product's second
    partial pairs ``x`` with a value that carries no tangent, so no rule reads an adjoint and
    the fused loops take them as zero; the HVP is exactly zero, as the interpreter's, with
    the adjoint arenas full of NaN before the pass."""
    from tape.transforms import derivatives as D

    def f(x, c):
        return tp.sum(x * (c * c)) + tp.sum(tp.sin(c) * x)

    x, c = RNG.normal(size=50), RNG.normal(size=50)
    ti = tp.record(f, x, c, wrt=[0], compile=False)
    tc = tp.record(f, x, c, wrt=[0], compile=True)
    v = RNG.normal(size=50)
    plan, data = D._forward(tc, (x, c), compiled=True)
    T, GT, grad = plan.arenas(1)
    T[:] = 0.0
    T[0, plan.in_off[0] : plan.in_off[0] + 50] = v
    GT[:], grad[:] = np.nan, np.nan
    D._hvp_pass(plan, data, grad, T, GT)
    assert second.derivative_module(tc) is not None
    np.testing.assert_array_equal(GT[0, plan.in_off[0] : plan.in_off[0] + 50], 0.0)
    np.testing.assert_array_equal(tc.hvp(x, c, v=v), 0.0)
    np.testing.assert_array_equal(ti.hvp(x, c, v=v), 0.0)
    close(tc.gradient(x, c), c * c + np.sin(c))


# ---------------------------------------------------------------- reverse mode, promotion


def two_outputs(h, W, b):
    z = h @ W
    return tp.tanh(z + b) * tp.log(1.0 + z * z), tp.sum(tp.exp(-h), 1)


REVERSE = {
    "two outputs, three arguments": (two_outputs, (RNG.normal(size=(6, 3)), RNG.normal(size=(3, 5)),
                                                   RNG.normal(size=5))),
    "vector output": (vector_out, (np.linspace(-1.0, 1.0, 6),)),
    "scalar output": (rosenbrock, (RNG.uniform(-1, 1, 9),)),
}  # fmt: skip


def forward_values(t, args):
    """The tape's outputs at ``args``, flattened and concatenated."""
    return np.concatenate([np.ravel(o) for o in pairs(t.forward(*args))])


def leaves(x):
    """The arrays of a nested tuple of results, in order."""
    return [v for y in x for v in leaves(y)] if isinstance(x, tuple) else [np.asarray(x)]


def flat_jacobian(J, outs, args):
    """A Jacobian in JAX's nesting (a tuple over several outputs of tuples over several
    arguments) as one matrix over the flattened, concatenated outputs and arguments."""
    rows = J if len(outs) > 1 else (J,)
    return np.block([
        [np.reshape(c, (int(np.prod(s)), a.size)) for c, a in zip(r if len(args) > 1 else (r,), args)]
        for r, s in zip(rows, outs)
    ])  # fmt: skip


@pytest.mark.parametrize("name", list(REVERSE))
def test_vjp_and_reverse_jacobian_run_the_compiled_reverse(name, monkeypatch):
    """``vjp`` and ``jacobian(mode="rev")`` of a compiled tape run its own reverse pass after
    its own forward (the interpreter's sweeps and kernels are not used): the same as the
    interpreter's, and the Jacobian against central differences of the outputs; called
    twice at other arguments (nothing stale in the adjoint arena), and with a cotangent of
    zeros (zero gradients, whatever the arena held)."""
    from tape.transforms import derivatives as D

    fn, args = REVERSE[name]
    ti, tc = both(fn, *args)
    rng = np.random.default_rng(len(name))
    outs = [np.shape(o) for o in pairs(ti.forward(*args))]
    cases = []
    for k in range(2):
        x = tuple(a + 0.1 * (k + 1) * rng.normal(size=np.shape(a)) for a in args)
        u = tuple(rng.normal(size=s) for s in outs)
        cases.append((x, u if len(u) > 1 else u[0]))
    want = [(ti.vjp(*x, cotangent=u), ti.jacobian(*x, mode="rev")) for x, u in cases]

    def interpreter_sweeps(*a, **k):
        raise AssertionError("the interpreter's reverse sweeps ran for a compiled tape")

    monkeypatch.setattr(D.sweeps, "vjp_rows", interpreter_sweeps)
    for (x, u), (vjp_i, jac_i) in zip(cases, want):
        got = tc.vjp(*x, cotangent=u)
        assert len(leaves(got)) == len(leaves(vjp_i))
        for a, b in zip(leaves(got), leaves(vjp_i)):
            assert a.shape == b.shape
            close(a, b)
        J = tc.jacobian(*x, mode="rev")
        assert len(leaves(J)) == len(leaves(jac_i))
        for a, b in zip(leaves(J), leaves(jac_i)):
            assert a.shape == b.shape
            close(a, b)
    zero = tuple(np.zeros(s) for s in outs)
    for g in leaves(tc.vjp(*args, cotangent=zero if len(zero) > 1 else zero[0])[1]):
        assert not np.any(g)
    assert not tc._interp_ready  # no interpreter kernel was prepared for the compiled tape
    # the Jacobian against central differences of the outputs, column by column
    x = cases[0][0]
    Jf = flat_jacobian(tc.jacobian(*x, mode="rev"), outs, x)
    col, h = 0, 1e-6
    for k, a in enumerate(x):
        for j in range(a.size):
            xp = [np.array(v, copy=True) for v in x]
            xm = [np.array(v, copy=True) for v in x]
            xp[k].flat[j] += h
            xm[k].flat[j] -= h
            fd = (forward_values(ti, xp) - forward_values(ti, xm)) / (2 * h)
            np.testing.assert_allclose(Jf[:, col], fd, rtol=1e-6, atol=1e-6)
            col += 1


PROMOTED_BY = {
    "vjp": lambda t, x: t.vjp(x, cotangent=np.array(1.0)),
    "jvp": lambda t, x: t.jvp(x, tangents=x),
    "hvp": lambda t, x: t.hvp(x, v=x),
    "hessian": lambda t, x: t.hessian(x),
    "jacobian rev": lambda t, x: t.jacobian(x, mode="rev"),
    "jacobian fwd": lambda t, x: t.jacobian(x, mode="fwd"),
}


@pytest.mark.parametrize("what", list(PROMOTED_BY))
def test_derivative_calls_count_toward_promotion(what):
    """On a tape with ``compile="auto"``, the derivative transforms (which run compiled code
    once the tape is promoted) count as replays: by the count rule (the ``compile_after``-th
    call compiles the tape) and by the time they take (not their first call, which prepares
    their kernels); the results stay the interpreter's, to rounding."""
    call = PROMOTED_BY[what]
    x = RNG.uniform(-1, 1, 9)
    ti = tp.record(rosenbrock, x, compile=False)
    want = call(ti, x)
    t = tp.record(rosenbrock, x)  # compile="auto"
    t.compile_cost = 0.0  # the compile is not weighed: the rules alone decide
    t.compile_after, t.compile_after_seconds = 4, None
    for _ in range(4):
        assert t.tier == "interpreter"
        got = call(t, x)
    assert t.tier == "compiled"  # the 4th call compiled the tape, then ran compiled
    assert len(leaves(got)) == len(leaves(want))
    for a, b in zip(leaves(got), leaves(want)):
        close(a, b)
    # by time: the first call is not timed, the second takes longer than the limit
    t = tp.record(rosenbrock, x)
    t.compile_cost = 0.0
    t.compile_after, t.compile_after_seconds, t.compile_min_replays = None, 1e-12, 0
    call(t, x)
    assert t.tier == "interpreter" and t.compiling is None
    call(t, x)
    assert t.compiling is not None
    t.compiling.join()
    assert t.tier == "compiled"
