"""tape.kernels: the one-value replay drivers, called from the user's own @njit code."""

import numpy as np
import pytest
from numba import njit

import tape as tp


def rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def rosen_grad(x):
    g = np.zeros_like(x)
    d = x[1:] - x[:-1] ** 2
    g[:-1] += -400 * x[:-1] * d - 2 * (1 - x[:-1])
    g[1:] += 200 * d
    return g


@njit
def _grad_at(ka, off, x):
    ka.data[off : off + x.shape[0]] = x
    status = tp.kernels.gradient(ka)
    return status, ka.grad[off : off + x.shape[0]].copy()


@njit
def _descend(ka, off, n, lr, steps):
    for _ in range(steps):
        status = tp.kernels.gradient(ka)
        if status >= 0:
            return status
        for j in range(n):
            ka.data[off + j] -= lr * ka.grad[off + j]
    return -1


def test_gradient_matches_the_reference_and_python_replay():
    rng = np.random.default_rng(0)
    t = tp.record(rosen, np.zeros(6))
    ka = t.workspace()
    off, _ = t.input_slice(0)
    for _ in range(3):
        x = rng.standard_normal(6)
        status, g = _grad_at(ka, off, x)
        assert status == -1
        np.testing.assert_allclose(g, rosen_grad(x), rtol=1e-13)
        np.testing.assert_array_equal(g, t.gradient(x))


def test_forward_and_backward_accumulate_like_the_tape_methods():
    x = np.array([0.5, -1.0, 2.0])
    t = tp.record(rosen, x)
    ka = t.workspace()
    off, n = t.input_slice(0)
    ka.data[off : off + n] = x
    assert tp.kernels.forward(ka) == -1
    o, _ = t.output_slice()
    assert ka.data[o] == pytest.approx(rosen(x))
    tp.kernels.backward(ka)
    tp.kernels.backward(ka)
    np.testing.assert_allclose(ka.grad[off : off + n], 2 * rosen_grad(x), rtol=1e-13)


def test_descent_loop_runs_in_njit():
    t = tp.record(rosen, np.zeros(3))
    ka = t.workspace()
    off, n = t.input_slice(0)
    assert _descend(ka, off, n, 1e-3, 200) == -1
    x = ka.data[off : off + n]
    assert rosen(x) < rosen(np.zeros(3))


def test_status_reports_a_failed_guard():
    def branchy(x):
        if x.sum() > 0:
            return (x * x).sum()
        return (x * x * x).sum()

    t = tp.record(branchy, np.ones(3))
    ka = t.workspace()
    off, _ = t.input_slice(0)
    status, _ = _grad_at(ka, off, -np.ones(3))
    assert status >= 0 and t.is_guard(status)
    status, g = _grad_at(ka, off, np.ones(3))
    assert status == -1
    np.testing.assert_array_equal(g, 2 * np.ones(3))


def test_drivers_reuse_the_sweeps_python_compiled():
    # the one-value drivers pass np.int64 / np.bool_ where Python passes ints and bools: a
    # literal would make Numba compile the whole interpreter sweep a second time
    from tape.interpreter.generated import sweeps

    x = np.array([0.5, -1.0, 2.0])
    t = tp.record(rosen, x)
    t.gradient(x)
    fns = (sweeps.forward_sweep, sweeps.forward_backward, sweeps.backward)
    # user code run earlier in this process may have passed literals itself (a literal True
    # in an @njit loop): only what the drivers add counts
    before = [{str(s) for s in fn.signatures} for fn in fns]
    ka = t.workspace()
    assert tp.kernels.forward(ka) == -1
    tp.kernels.backward(ka)
    assert tp.kernels.gradient(ka) == -1
    for fn, old in zip(fns, before):
        new = [str(s) for s in fn.signatures if str(s) not in old]
        assert not any("Literal" in s for s in new), (fn, new)
