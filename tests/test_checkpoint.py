"""tape.checkpoint: recomputation in the reverse sweep, checked against the plain tape, NumPy
and finite differences."""

import threading

import numpy as np
import pytest

import tape as tp


def cell(h, x, W):
    return tp.tanh(h @ W + x)


def rnn(W, xs, mode):
    """A small recurrent loop: plain, checkpointed with W as an argument, or checkpointed
    with W read from the closure (a new lambda per step)."""
    h = tp.zeros(W.shape[0])
    for t in range(xs.shape[0]):
        if mode == "plain":
            h = cell(h, xs[t], W)
        elif mode == "arg":
            h = tp.checkpoint(cell, h, xs[t], W)
        else:
            h = tp.checkpoint(lambda h, x: tp.tanh(h @ W + x), h, xs[t])
    return (h**2).sum() + 0.5 * h[0]


def rnn_numpy(W, xs):
    h = np.zeros(W.shape[0])
    for x in xs:
        h = np.tanh(h @ W + x)
    return (h**2).sum() + 0.5 * h[0]


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(5, 5)) * 0.4, rng.normal(size=(7, 5))


@pytest.mark.parametrize("mode", ["arg", "closure"])
def test_replay_matches_plain_tape_numpy_and_shares_one_subtape(data, mode):
    W0, xs0 = data
    plain = tp.record(lambda W, xs: rnn(W, xs, "plain"), W0, xs0)
    t = tp.record(lambda W, xs: rnn(W, xs, mode), W0, xs0)
    assert len(t._checkpoints) == 1  # seven steps, one sub-tape
    assert t.n_data < plain.n_data  # the steps' intermediates are not on the tape
    rng = np.random.default_rng(0)
    for _ in range(3):
        W, xs = W0 + 0.1 * rng.normal(size=W0.shape), rng.normal(size=xs0.shape)
        v, (gW, gx) = t.value_and_grad(W, xs)
        pv, (pW, px) = plain.value_and_grad(W, xs)
        assert v == pytest.approx(rnn_numpy(W, xs), rel=1e-13)
        np.testing.assert_allclose(gW, pW, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(gx, px, rtol=1e-12, atol=1e-15)


def test_gradcheck_against_finite_differences(data):
    W0, xs0 = data
    tp.gradcheck(lambda W, xs: rnn(W, xs, "closure"), W0, xs0[:3], n_points=3)


def test_eager_backward_recomputes_and_accumulates(data):
    W0, xs0 = data
    ref = tp.record(lambda W, xs: rnn(W, xs, "plain"), W0, xs0, wrt=0).gradient(W0, xs0)
    W = tp.tensor(W0, requires_grad=True)
    rnn(W, tp.tensor(xs0), "closure").backward()
    np.testing.assert_allclose(W.grad.numpy(), ref, rtol=1e-12)
    rnn(W, tp.tensor(xs0), "arg").backward()  # .grad accumulates, as in PyTorch
    np.testing.assert_allclose(W.grad.numpy(), 2 * ref, rtol=1e-12)
    with tp.no_grad():
        out = tp.checkpoint(cell, tp.zeros(5), tp.tensor(xs0[0]), W)
    assert not out.requires_grad


def test_several_outputs_nesting_keywords_and_integer_outputs():
    rng = np.random.default_rng(1)
    a0, b0 = rng.normal(size=4), rng.normal(size=(2, 4))

    def inner(a, b, scale=1.0):
        return tp.sin(a) * scale, (a * b).sum(0), tp.argmax(a)

    def outer(a, b):
        s, p, k = tp.checkpoint(inner, a, b, scale=2.0)
        return tp.exp(s) + p, k

    def f(a, b):
        y, k = tp.checkpoint(outer, a, b)
        return (y * y).sum() + 0 * k

    def f_np(a, b):
        y = np.exp(2.0 * np.sin(a)) + (a * b).sum(0)
        return (y * y).sum()

    t = tp.record(f, a0, b0)
    for s in range(2):
        a, b = a0 + s, b0 - s
        assert t.forward(a, b) == pytest.approx(f_np(a, b), rel=1e-13)
    tp.gradcheck(f, a0, b0, n_points=2)


def test_guard_inside_checkpoint_retraces_the_enclosing_tape():
    def step(h, x):
        if float(x.sum()) > 0:  # a branch on the data: a guard inside the sub-tape
            return tp.tanh(h * x)
        return tp.sin(h + x)

    def loss(h0, xs, ck=True):
        h = h0
        for s in range(3):
            h = tp.checkpoint(step, h, xs[s]) if ck else step(h, xs[s])
        return h.sum()

    h0, xs0 = np.full(2, 0.5), np.ones((3, 2))
    t = tp.record(loss, h0, xs0)
    for xs in (-xs0, np.array([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]])):
        fresh = tp.record(lambda h, x: loss(h, x, False), h0, xs)
        v, g = t.value_and_grad(h0, xs)
        fv, fg = fresh.value_and_grad(h0, xs)
        assert v == pytest.approx(fv, rel=1e-14)
        np.testing.assert_allclose(g[0], fg[0], rtol=1e-13)
        np.testing.assert_allclose(g[1], fg[1], rtol=1e-13)
    assert t.retraces == 2
    strict = tp.record(loss, h0, xs0, on_change="raise")
    with pytest.raises(tp.GuardError, match=r"inside checkpoint\(step\)"):
        strict.forward(h0, -xs0)


def test_threads_and_gradient_batch(data):
    W0, xs0 = data
    t = tp.record(lambda W, xs: rnn(W, xs, "closure"), W0, xs0)
    plain = tp.record(lambda W, xs: rnn(W, xs, "plain"), W0, xs0)
    Ws = [W0 * (1 + 0.1 * k) for k in range(6)]
    want = [plain.gradient(W, xs0)[0] for W in Ws]
    got = [None] * 6

    def work(k):
        for _ in range(5):
            got[k] = t.gradient(Ws[k], xs0)[0]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    vals, grads = t.gradient_batch(np.stack(Ws[:3]), np.stack([xs0] * 3))
    for k in range(3):
        np.testing.assert_allclose(grads[0][k], want[k], rtol=1e-12)


def test_forward_mode_and_reverse_jacobians(data):
    W0, xs0 = data[0], data[1][:3]
    t = tp.record(lambda W, xs: rnn(W, xs, "closure"), W0, xs0)
    plain = tp.record(lambda W, xs: rnn(W, xs, "plain"), W0, xs0)
    want = plain.jacobian(W0, xs0, mode="rev")
    for mode in ("fwd", "rev"):
        for got, w in zip(t.jacobian(W0, xs0, mode=mode), want):
            np.testing.assert_allclose(got, w, rtol=1e-11, atol=1e-14)
    tan = (np.ones_like(W0), np.zeros_like(xs0))
    np.testing.assert_allclose(
        t.jvp(W0, xs0, tangents=tan)[1], plain.jvp(W0, xs0, tangents=tan)[1], rtol=1e-12
    )


def test_refusals_and_bad_input(data, tmp_path):
    W0, xs0 = data
    t = tp.record(lambda W, xs: rnn(W, xs, "arg"), W0, xs0)
    with pytest.raises(tp.CompileError, match="checkpoint"):
        t.compile()
    with pytest.raises(NotImplementedError, match="checkpoint"):
        t.hessian(W0, xs0)
    with tp.detect_anomaly(), pytest.raises(NotImplementedError, match="detect_anomaly"):
        t.gradient(W0, xs0)  # the checked sweeps run registry ops only: refused, not half-run
    with pytest.raises(NotImplementedError, match="checkpoint"):
        t.save(tmp_path / "t.npz")
    with pytest.raises(TypeError, match="callable"):
        tp.checkpoint(3, tp.zeros(2))
    with pytest.raises(TypeError, match="argument 1"):
        tp.checkpoint(lambda a, b: a, tp.zeros(2), "text")


def test_docs_example_runs():
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "guides" / "checkpointing.md"
    code = page.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    scope = {}
    exec(compile(code, f"<{page.name}>", "exec"), scope)

    def plain(w, xs):
        h = tp.zeros(16)
        for s in range(xs.shape[0]):
            h = tp.tanh(h @ w + xs[s])
        return (h**2).sum()

    want = tp.record(plain, scope["w0"], scope["xs0"]).gradient(scope["w0"], scope["xs0"])
    assert len(scope["t"]._checkpoints) == 1
    np.testing.assert_allclose(scope["gw"], want[0], rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(scope["gxs"], want[1], rtol=1e-11, atol=1e-15)
