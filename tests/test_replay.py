"""Record once, replay many: replay equals eager, accumulation semantics, persistence, and the
sweeps called from the user's own @njit code."""

import pickle

import numpy as np
import pytest
from numba import njit

import tape as tp


def rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def rosen_grad_np(x):
    g = np.zeros_like(x)
    d = x[1:] - x[:-1] ** 2
    g[:-1] += -400 * x[:-1] * d - 2 * (1 - x[:-1])
    g[1:] += 200 * d
    return g


def test_replay_matches_reference_on_new_inputs(rng):
    t = tp.record(rosen, np.zeros(6))
    for _ in range(3):
        x = rng.standard_normal(6)
        v, g = t.value_and_grad(x)
        assert v == pytest.approx(
            np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2), rel=1e-14
        )
        np.testing.assert_allclose(g, rosen_grad_np(x), rtol=1e-13)
        np.testing.assert_allclose(t.forward(x), v, rtol=0)


def test_replay_equals_eager(rng):
    W = rng.standard_normal((4, 3))
    x = rng.standard_normal((5, 4))

    def mlp(W, x):
        h = tp.tanh(x @ W)
        return tp.log_softmax(h, axis=1)[:, 0].mean() + tp.norm(W)

    t = tp.record(mlp, W, x)
    gW, gx = t.gradient(W, x)
    Wt, xt = tp.tensor(W, requires_grad=True), tp.tensor(x, requires_grad=True)
    out = mlp(Wt, xt)
    out.backward()
    assert t.forward(W, x) == pytest.approx(out.item(), rel=1e-15)
    np.testing.assert_allclose(gW, Wt.grad.numpy(), rtol=1e-14)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-14)


def test_backward_accumulates_until_zeroed(rng):
    x = rng.standard_normal(4)
    t = tp.record(rosen, x)
    t.forward(x)
    t.backward()
    g1 = t.grads[0].copy()
    t.backward()
    np.testing.assert_allclose(t.grads[0], 2 * g1)
    t.zero_grad()
    assert not t.grads[0].any()
    t.backward()
    np.testing.assert_allclose(t.grads[0], g1)
    # gradient() zeroes first, whatever was accumulated
    np.testing.assert_allclose(t.gradient(x), g1)
    np.testing.assert_allclose(t.gradient(x), g1)


def test_gradient_fills_out_buffers(rng):
    x = rng.standard_normal(4)
    t = tp.record(rosen, x)
    out = np.empty(4)
    res = t.gradient(x, out=out)
    assert res is out
    np.testing.assert_allclose(out, rosen_grad_np(x))


def test_wrt_and_integer_arguments(rng):
    x = rng.standard_normal(5)
    idx = np.array([4, 0, 0])

    def f(x, a, i):
        return (x[i] * a).sum()

    t = tp.record(f, x, 2.0, idx, wrt=0)
    assert t.wrt == [0]
    np.testing.assert_allclose(t.gradient(x, 2.0, idx), [4.0, 0, 0, 0, 2.0])
    np.testing.assert_allclose(t.gradient(x, 3.0, np.array([1, 1, 2])), [0, 6.0, 3.0, 0, 0])
    t2 = tp.record(f, x, 2.0, idx)  # default: every floating argument
    gx, ga = t2.gradient(x, 2.0, idx)
    assert ga == pytest.approx(x[4] + 2 * x[0])


def test_multiple_outputs_and_seeds(rng):
    x = rng.standard_normal(3)
    t = tp.record(lambda x: (x * 2, (x**3).sum()), x)
    a, b = t.forward(x)
    np.testing.assert_allclose(a, 2 * x)
    t.zero_grad()
    t.backward(seed=(np.ones(3), 1.0))
    np.testing.assert_allclose(t.grads[0], 2 + 3 * x**2)
    with pytest.raises(RuntimeError, match="scalar"):
        t.gradient(x)


def test_nonscalar_output_needs_seed(rng):
    x = rng.standard_normal(3)
    t = tp.record(lambda x: x * x, x)
    t.forward(x)
    with pytest.raises(RuntimeError, match="seed"):
        t.backward()
    t.backward(seed=np.array([1.0, 0.0, 2.0]))
    np.testing.assert_allclose(t.grads[0], [2 * x[0], 0, 4 * x[2]])


def test_closure_constants_are_captured():
    W = np.array([[1.0, 2.0], [3.0, 4.0]])
    t = tp.record(lambda x: (tp.tensor(W) @ x).sum(), np.ones(2))
    W[0, 0] = 100.0  # later changes to the closure do not reach the tape
    np.testing.assert_allclose(t.gradient(np.ones(2)), [4.0, 6.0])


def test_print_len_nbytes(rng):
    t = tp.record(rosen, rng.standard_normal(4))
    s = str(t)
    assert len(t) == len(s.splitlines()) - 3  # header, input, outputs
    assert "square" in s and "sum" in s and "input 0 x" in s
    assert t.nbytes > 0
    assert repr(t).startswith("<Tape 8 entries")


def test_save_load_and_pickle(tmp_path, rng):
    x = rng.standard_normal(5)
    t = tp.record(rosen, x)
    g = t.gradient(x)
    path = tmp_path / "rosen.npz"
    t.save(path)
    t2 = tp.load(path)
    np.testing.assert_array_equal(t2.gradient(x), g)
    t3 = pickle.loads(pickle.dumps(t))
    np.testing.assert_array_equal(t3.gradient(x), g)
    assert str(t3) == str(t2)


def test_recorded_control_flow_is_guarded():
    def f(x):
        if x.sum() > 0:  # Python branch: a guard entry checks it at every replay
            return (x * 2).sum()
        return (x * 3).sum()

    t = tp.record(f, np.ones(2))
    np.testing.assert_allclose(t.gradient(-np.ones(2)), [3.0, 3.0])  # retraced
    np.testing.assert_allclose(t.gradient(np.ones(2)), [2.0, 2.0])
    assert t.retraces == 1
    strict = tp.record(f, np.ones(2), on_change="raise")
    with pytest.raises(tp.GuardError, match="truth value"):
        strict.gradient(-np.ones(2))


def test_where_is_nan_safe():
    def f(x):
        safe = tp.where(x > 0, x, 1.0)
        return tp.where(x > 0, tp.log(safe), 0.0).sum()

    t = tp.record(f, np.array([1.0, -1.0, 0.0, 2.0]))
    g = t.gradient(np.array([1.0, -1.0, 0.0, 2.0]))
    np.testing.assert_allclose(g, [1.0, 0.0, 0.0, 0.5])
    # a plain where still guards the unselected branch's inf * 0
    x = tp.tensor([0.0, 4.0], requires_grad=True)
    tp.where(x > 0, tp.sqrt(x), 0.0).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


def test_float32_end_to_end(rng):
    x = rng.standard_normal(6).astype(np.float32)
    t = tp.record(rosen, x)
    assert t.dtype == np.float32
    g = t.gradient(x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, rosen_grad_np(x.astype(float)), rtol=1e-4)
    w = tp.tensor(x, requires_grad=True)
    loss = rosen(w)
    assert loss.dtype == np.float32
    loss.backward()
    assert w.grad.dtype == np.float32
    np.testing.assert_allclose(w.grad.numpy(), g, rtol=1e-5)
    # Python scalars keep float32; float64 tensors widen
    assert (w * 2.0).dtype == np.float32
    assert (w + tp.tensor(np.ones(6))).dtype == np.float64


@njit
def _descend(ka, x_off, n, lr, steps):
    for _ in range(steps):
        tp.sweeps.forward_backward(
            ka.entries,
            ka.bufs,
            ka.ipool,
            ka.data,
            ka.grad,
            ka.n_entries,
            ka.n_bufs,
            ka.roots,
            ka.seeds,
            True,
        )
        for j in range(n):
            ka.data[x_off + j] -= lr * ka.grad[x_off + j]
    return ka.data[x_off : x_off + n].copy()


def test_gradient_descent_loop_inside_njit():
    x0 = np.array([-1.0, 1.5, 0.5])
    t = tp.record(rosen, x0)
    off, n = t.input_slice(0)
    x = _descend(t.kernel_args(), off, n, 1e-3, 100)
    # the same 100 steps in Python with the replay API
    xr = x0.copy()
    for _ in range(100):
        xr -= 1e-3 * rosen_grad_np(xr)
    np.testing.assert_allclose(x, xr, rtol=1e-12)
    assert rosen(tp.tensor(x)).item() < rosen(tp.tensor(x0)).item()


def test_stabilising_shifts_are_recomputed_at_replay():
    t = tp.record(lambda x: tp.logsumexp(x), np.zeros(3))
    assert t.forward(np.full(3, 1000.0)) == pytest.approx(1000 + np.log(3))
    s = tp.record(lambda x: tp.softmax(x)[0], np.zeros(3))
    assert s.forward(np.array([1000.0, 0.0, 0.0])) == pytest.approx(1.0)
    np.testing.assert_allclose(
        s.gradient(np.array([1000.0, 0.0, 0.0])), [0.0, 0.0, 0.0], atol=1e-12
    )
    d = tp.record(lambda x: (x * x.detach()).sum(), np.ones(2))
    np.testing.assert_allclose(d.gradient(np.array([3.0, 4.0])), [3.0, 4.0])
