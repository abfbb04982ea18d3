"""``t.njit_gradient``: a tape's gradient as a plain ``@njit`` function of its arguments, from
Python and from ``@njit`` code, against the interpreter and finite differences; and
``t.gradient(x, out=g)`` on the compiled tier's one-call path. No timings here
(``benchmarks/njit_overhead.py`` measures them)."""

import numpy as np
import pytest
from numba import njit

import tape as tp

N, M = 10, 3


def f(x, W):
    """Two arguments (one 2-D), a matrix product (an entry the fused loops do not take), fused
    elementwise loops, and a guard (a Python ``if`` on a value)."""
    s = tp.sum(tp.tanh(W @ x) ** 2) + tp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    if x[0] > 0:
        s = s + tp.sum(x * x)
    return s


def f_np(x, W):
    s = np.sum(np.tanh(W @ x) ** 2) + np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    return s + np.sum(x * x) if x[0] > 0 else s


def point(seed):
    r = np.random.default_rng(seed)
    x = r.uniform(0.1, 1.5, N)  # x[0] > 0: the recorded branch
    W = r.standard_normal((M, N))
    return x, W


@pytest.fixture(scope="module")
def tape_fn():
    """One tape (on the interpreter, the reference) and its njit_gradient, compiled once."""
    t = tp.record(f, *point(0), compile=False)
    return t, t.njit_gradient


def fd_grad(x, W, h=1e-6):
    out = []
    for a in (x, W):
        g = np.empty(a.shape)
        for i in np.ndindex(a.shape):
            a0 = a[i]
            a[i] = a0 + h
            fp = f_np(x, W)
            a[i] = a0 - h
            fm = f_np(x, W)
            a[i] = a0
            g[i] = (fp - fm) / (2 * h)
        out.append(g)
    return out


def test_from_python_matches_interpreter_and_fd(tape_fn):
    t, g = tape_fn
    assert t.tier == "interpreter"  # njit_gradient compiles a module of its own regardless
    for seed in (1, 2, 3):
        x, W = point(seed)
        gx, gW = np.full(N, np.nan), np.full((M, N), np.nan)
        assert g(x, W, gx, gW) is None
        rx, rW = t.gradient(x, W)
        np.testing.assert_allclose(gx, rx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gW, rW, rtol=1e-12, atol=1e-12)
        fx, fW = fd_grad(x.copy(), W.copy())
        np.testing.assert_allclose(gx, fx, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(gW, fW, rtol=1e-6, atol=1e-6)


def test_inside_njit_loop(tape_fn):
    t, g = tape_fn

    @njit
    def many(xs, W, gxs, gW):
        for k in range(xs.shape[0]):
            g(xs[k], W, gxs[k], gW)
        return gW[0, 0]

    xs = np.stack([point(s)[0] for s in range(4, 9)])
    W = point(4)[1]
    gxs = np.full_like(xs, np.nan)
    gW = np.full((M, N), np.nan)
    many(xs, W, gxs, gW)
    for k in range(xs.shape[0]):
        rx, rW = t.gradient(xs[k], W)
        np.testing.assert_allclose(gxs[k], rx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gW, rW, rtol=1e-12, atol=1e-12)  # the last call's


def test_any_layout(tape_fn):
    t, g = tape_fn
    x, W = point(10)
    xs = np.zeros(2 * N)
    xs[::2] = x
    Wf = np.asfortranarray(W)
    gx, gW = np.zeros(2 * N), np.asfortranarray(np.zeros((M, N)))
    g(xs[::2], Wf, gx[::2], gW)
    rx, rW = t.gradient(x, W)
    np.testing.assert_allclose(gx[::2], rx, rtol=1e-12, atol=1e-12)
    assert not gx[1::2].any()  # nothing written between the strided elements
    np.testing.assert_allclose(gW, rW, rtol=1e-12, atol=1e-12)


def test_wrong_shapes_raise_before_running(tape_fn):
    _, g = tape_fn
    x, W = point(11)
    gx, gW = np.empty(N), np.empty((M, N))
    with pytest.raises(ValueError, match="argument 0 must have shape"):
        g(x[:5], W, gx, gW)
    with pytest.raises(ValueError, match="argument 1 must have shape"):
        g(x, W[:, :4], gx, gW)
    with pytest.raises(ValueError, match="gradient 1 must have shape"):
        g(x, W, gx, np.empty((N, M)))
    small = np.full(N - 1, 7.0)
    with pytest.raises(ValueError, match="gradient 0 must have shape"):
        g(x, W, small, gW)
    assert (small == 7.0).all()

    @njit
    def inside(x, W, gx, gW):
        g(x, W, gx, gW)

    with pytest.raises(ValueError, match="argument 0 must have shape"):
        inside(np.empty(N + 1), W, gx, gW)


def test_failed_guard_raises(tape_fn):
    _, g = tape_fn
    x, W = point(12)
    x[0] = -1.0  # the other branch
    gx = np.full(N, 5.0)
    with pytest.raises(RuntimeError, match="stopped"):
        g(x, W, gx, np.empty((M, N)))


def test_refuses_what_it_cannot_run():
    t = tp.record(lambda x: x * 2.0, np.ones(3))
    with pytest.raises(Exception, match="scalar"):
        t.njit_gradient


def test_gradient_out_on_the_one_call_path():
    def rosen(x):
        return tp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    x = np.random.default_rng(13).uniform(-1.0, 2.0, N)
    t = tp.record(rosen, x, compile=True)
    ref = tp.record(rosen, x, compile=False).gradient(x)
    out = np.full(N, np.nan)
    assert t.gradient(x, out=out) is out
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        t.gradient(x, out=np.empty((2, N)))  # would broadcast
    with pytest.raises(ValueError, match="shape"):
        t.gradient(x, out=np.empty(N - 1))


def test_a_caching_caller_is_not_cached(tape_fn):
    """The function names this process's arena: Numba must refuse to cache a caller of it (the
    next process would write to an address it does not own)."""
    import warnings

    _, g = tape_fn

    @njit(cache=True)
    def caller(x, W, gx, gW):
        g(x, W, gx, gW)
        return gx[0]

    x, W = point(14)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        caller(x, W, np.empty(N), np.empty((M, N)))
    assert any("Cannot cache" in str(m.message) for m in w)
