"""User-defined ops (``tape.custom_op``) written here, as a user would: forward and vjp as
``@njit`` functions over NumPy arrays, in eager mode, replay, batched replay and the compiled
tier, checked against finite differences and NumPy."""

import numpy as np
import pytest
from numba import njit

import tape as tp


@njit
def softclip_fwd(x, c):
    return c * np.tanh(x / c)


@njit
def softclip_vjp(gy, y, x, c):
    r = y / c
    d = 1.0 - r * r
    gx = gy * d
    # dy/dc = tanh(x/c) - (x/c) (1 - tanh^2): summed where c was broadcast (a scalar)
    return gx, np.full_like(c, np.sum(gy * (r - (x / c) * d)))


@njit
def softclip_jvp(y, x, c, tx, tc):
    r = y / c
    d = 1.0 - r * r
    return d * tx + (r - (x / c) * d) * tc


softclip = tp.custom_op("softclip", softclip_fwd, softclip_vjp, jvp=softclip_jvp)


@njit
def rowdot_fwd(a, b):  # (n, k), (n, k) -> (n,)
    return (a * b).sum(axis=1)


@njit
def rowdot_vjp(gy, y, a, b):
    return gy[:, None] * b, gy[:, None] * a


rowdot = tp.custom_op("rowdot", rowdot_fwd, rowdot_vjp, out_shape=lambda sa, sb: sa[:1])


def plain_square_vjp(gy, y, x):  # a plain Python function works too (eager and replay)
    return 2.0 * x * gy


square_py = tp.custom_op("square_py", lambda x: x * x, plain_square_vjp)


def np_softclip(x, c):
    return c * np.tanh(x / c)


def f(x, c):
    return (softclip(x, c) ** 2).sum() + rowdot(x.reshape(2, 3), x.reshape(2, 3) * 0.5).sum()


def f_np(x, c):
    return (np_softclip(x, c) ** 2).sum() + 0.5 * (x**2).sum()


@pytest.fixture
def data(rng):
    return rng.normal(size=6), np.array(1.5)


def test_eager_value_and_backward_match_numpy_and_fd(data):
    x, c = data
    xt = tp.tensor(x, requires_grad=True)
    ct = tp.tensor(c, requires_grad=True)
    y = f(xt, ct)
    np.testing.assert_allclose(y.item(), f_np(x, c), rtol=1e-13)
    y.backward()
    eps = 1e-6
    fd = np.array([(f_np(x + eps * e, c) - f_np(x - eps * e, c)) / (2 * eps) for e in np.eye(6)])
    np.testing.assert_allclose(xt.grad.numpy(), fd, rtol=1e-6, atol=1e-8)
    fdc = (f_np(x, c + eps) - f_np(x, c - eps)) / (2 * eps)
    np.testing.assert_allclose(ct.grad.item(), fdc, rtol=1e-6)
    assert repr(softclip(xt, ct).grad_fn) == "<SoftclipBackward0>"


def test_gradcheck(data):
    x, c = data
    assert tp.gradcheck(lambda x, c: softclip(x, c), x, c)
    assert tp.gradcheck(lambda a, b: rowdot(a, b), x.reshape(2, 3), x.reshape(2, 3) + 1.0)
    assert tp.gradcheck(lambda x: square_py(x), x)


def test_replay_on_new_inputs_and_compiled_tier(data, rng):
    x, c = data
    t = tp.record(f, x, c)
    assert t.tier == "interpreter"
    x2, c2 = rng.normal(size=6), np.array(0.7)
    want_v = f_np(x2, c2)
    v, (gx, gc) = t.value_and_grad(x2, c2)
    np.testing.assert_allclose(v, want_v, rtol=1e-13)
    ref = tp.tensor(x2, requires_grad=True), tp.tensor(c2, requires_grad=True)
    f(*ref).backward()
    np.testing.assert_allclose(gx, ref[0].grad.numpy(), rtol=1e-13)
    np.testing.assert_allclose(gc, ref[1].grad.numpy(), rtol=1e-13)
    assert t.compile() is t and t.tier == "compiled"
    assert "softclip (custom op)" in t.compiled_source
    v3, (gx3, gc3) = t.value_and_grad(x2, c2)
    np.testing.assert_allclose(v3, want_v, rtol=1e-12)
    np.testing.assert_allclose(gx3, gx, rtol=1e-12)
    np.testing.assert_allclose(gc3, gc, rtol=1e-12)
    # batched replay, on the compiled tape and on an interpreter one
    X = rng.normal(size=(4, 6))
    C = np.abs(rng.normal(size=4)) + 0.5
    for tape_ in (t, tp.record(f, x, c)):
        vals, (GX, GC) = tape_.gradient_batch(X, C)
        for b in range(4):
            vb, (gxb, gcb) = tp.record(f, X[b], C[b]).value_and_grad(X[b], C[b])
            np.testing.assert_allclose(vals[b], vb, rtol=1e-12)
            np.testing.assert_allclose(GX[b], gxb, rtol=1e-12)
            np.testing.assert_allclose(GC[b], gcb, rtol=1e-12)


def test_compiled_record_and_scalar_output(rng):
    x = rng.normal(size=5)
    t = tp.record(lambda x: softclip(x, 2.0).sum() * 3.0, x, compile=True)
    assert t.tier == "compiled"
    g = t.gradient(x)
    np.testing.assert_allclose(g, 3.0 / np.cosh(x / 2.0) ** 2, rtol=1e-12)


def test_one_call_gradient_of_matrices_in_any_layout(rng):
    """A compiled tape's one-call ``gradient`` with a matrix and a 0-d argument, on a module
    of the tape's own (a custom op) and on the shared runtime: C-ordered, Fortran-ordered,
    strided and reversed matrices give NumPy's gradient without a compile for the new layout;
    a matrix of another shape or number of axes is refused by the checked path."""
    a, b = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    s = np.array(0.7)

    def own(a, s):
        return rowdot(a, b).sum() * s + (a * a).sum()

    def runtime(a, s):
        return (a * b).sum() * s + (a * a).sum()

    def grads(a, s):
        return b * s + 2 * a, np.array((a * b).sum())

    big = rng.normal(size=(8, 6))
    layouts = [a, np.asfortranarray(a), big[::2, ::2], big[:4, :3][::-1, ::-1]]
    for fn in (own, runtime):
        t = tp.record(fn, a, s, compile=True)
        assert t._direct is not None
        entry = t.run_with[0].gradient_args
        n_compiled = len(entry.overloads)
        for m in layouts:
            for got, want in zip(t.gradient(m, s), grads(m, s)):
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert len(entry.overloads) == n_compiled
        for bad in (a.T.copy(), a.ravel(), a[:3]):
            with pytest.raises(ValueError, match="argument 0"):
                t.gradient(bad, s)
        for got, want in zip(t.gradient(a, s), grads(a, s)):  # nothing half-run by the refusals
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_errors(rng):
    with pytest.raises(TypeError, match="fwd must be callable"):
        tp.custom_op("bad", 3, softclip_vjp)
    bad_shape = tp.custom_op("bad_shape", lambda x: x[:2], lambda gy, y, x: (gy,))
    with pytest.raises(ValueError, match=r"bad_shape.*fwd returned shape \(2,\)"):
        bad_shape(tp.ones(3))
    few = tp.custom_op("few", lambda a, b: a + b, lambda gy, y, a, b: (gy,))
    a = tp.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match="few.*1 cotangents for 2 inputs"):
        few(a, tp.ones(3)).sum().backward()
    t = tp.record(lambda x: softclip(x, 1.0).sum(), np.ones(3))
    with pytest.raises(NotImplementedError, match="softclip"):
        t.hessian(np.ones(3))  # second order needs rules the custom op does not give
    with pytest.raises(NotImplementedError, match="'softclip' has no CUDA device functions"):
        t.to("cuda")


def test_gpu_refusals_are_clear():
    """What GPU replay cannot run is refused before any device work, naming the op (the
    device runs themselves are in test_cuda_sim.py)."""
    with pytest.raises(TypeError, match="cuda_fwd and cuda_vjp together"):
        tp.custom_op("half", softclip_fwd, softclip_vjp, cuda_fwd=lambda x, c: x)
    with pytest.raises(TypeError, match="cuda_vjp must be callable"):
        tp.custom_op("bad", softclip_fwd, softclip_vjp, cuda_fwd=lambda x: x, cuda_vjp=3)
    rows = tp.custom_op(
        "rowdot_gpu", rowdot_fwd, rowdot_vjp, out_shape=lambda sa, sb: sa[:1],
        cuda_fwd=lambda a, b: a * b, cuda_vjp=lambda gy, y, a, b: (gy * b, gy * a),
    )  # fmt: skip
    a = np.ones((3, 2))
    t = tp.record(lambda a, b: rows(a, b).sum(), a, a)
    with pytest.raises(NotImplementedError, match=r"rowdot_gpu.*broadcast shape.*\(3,\)"):
        t.to("cuda")

    class Twice(tp.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    t = tp.record(lambda x: Twice.apply(x).sum(), np.ones(3))
    with pytest.raises(NotImplementedError, match=r"Twice\.apply.*custom ops made with CUDA"):
        t.to("cuda")
    with tp.detect_anomaly(), pytest.raises(NotImplementedError, match="detect_anomaly"):
        t.gradient(np.ones(3))


def test_forward_mode_and_reverse_jacobians(data):
    """jvp and forward Jacobians through the op's jvp (the tangent sweep in segments), vjp
    and reverse Jacobians through its vjp; against the same function from registry ops."""
    x, c = data

    def with_op(x, c):
        return softclip(x, c) * x

    def plain(x, c):
        return c * tp.tanh(x / c) * x

    t, ref = tp.record(with_op, x, c), tp.record(plain, x, c)
    want = ref.jacobian(x, c, mode="rev")
    for mode in ("fwd", "rev", "auto"):
        for got, w in zip(t.jacobian(x, c, mode=mode), want):
            np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-14)
    tan = (np.linspace(0.0, 1.0, 6), np.array(0.3))
    np.testing.assert_allclose(
        t.jvp(x, c, tangents=tan)[1], ref.jvp(x, c, tangents=tan)[1], rtol=1e-12
    )
    cot = np.linspace(-1.0, 1.0, 6)
    for got, w in zip(t.vjp(x, c, cotangent=cot)[1], ref.vjp(x, c, cotangent=cot)[1]):
        np.testing.assert_allclose(got, w, rtol=1e-12)
    no_jvp = tp.custom_op("no_jvp", softclip_fwd, softclip_vjp)
    t2 = tp.record(lambda x, c: no_jvp(x, c).sum(), x, c)
    with pytest.raises(NotImplementedError, match="no_jvp.*without jvp"):
        t2.jvp(x, c, tangents=tan)


def test_gradcheck_points_at_a_wrong_vjp():
    wrong = tp.custom_op("wrong", lambda x: x * x, lambda gy, y, x: 3.0 * x * gy)
    with pytest.raises(tp.GradcheckError, match=r"calls Python.*wrong"):
        tp.gradcheck(lambda x: wrong(x).sum(), np.ones(3))
