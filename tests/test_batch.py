"""Batched replay on the CPU (tape.batch.gradient_batch): every instance against a replay of
its own, argument checks, and the cache guard of the compiled driver."""

import numpy as np
import pytest

import tape as tp
from tape.transforms.batch import gradient_batch


def rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def test_matches_one_replay_per_instance(rng):
    t = tp.record(rosen, np.zeros(7))
    X = rng.standard_normal((50, 7))
    v, g = gradient_batch(t, X)
    assert v.shape == (50,) and g.shape == (50, 7)
    for b in range(50):
        np.testing.assert_allclose(g[b], t.gradient(X[b]), rtol=1e-13)
        np.testing.assert_allclose(v[b], t.forward(X[b]), rtol=1e-13)


def test_several_arguments_gather_and_broadcast(rng):
    w = rng.standard_normal((3, 4))

    def f(x, y, i):
        z = tp.tanh(x @ w) * y
        return (
            tp.max(z, axis=1).sum() + tp.take(z, i, axis=1).prod() + tp.where(x > 0, x, 0.0).sum()
        )

    t = tp.record(f, rng.standard_normal((2, 3)), rng.standard_normal(4), np.array([0, 3, 3]))
    B = 13
    X, Y = rng.standard_normal((B, 2, 3)), rng.standard_normal((B, 4))
    idx = rng.integers(-4, 4, (B, 3))
    v, (gx, gy) = gradient_batch(t, X, Y, idx, n_threads=3)
    assert gx.shape == (B, 2, 3) and gy.shape == (B, 4)
    for b in range(B):
        want_x, want_y = t.gradient(X[b], Y[b], idx[b])
        np.testing.assert_allclose(gx[b], want_x, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(gy[b], want_y, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(v[b], t.forward(X[b], Y[b], idx[b]), rtol=1e-13)


def test_wrt_subset(rng):
    # (float32 tapes take the same path with another signature: a second ~30 s compile,
    # so the float32 batched replay is exercised by the GPU simulator tests only)
    t = tp.record(lambda x, y: (tp.sin(x) * y).sum(), np.ones(3), np.ones(3), wrt=1)
    X = rng.standard_normal((6, 3))
    Y = rng.standard_normal((6, 3))
    v, g = gradient_batch(t, X, Y)
    assert g.shape == (6, 3)
    np.testing.assert_allclose(g, np.sin(X), rtol=1e-13)
    np.testing.assert_allclose(v, (np.sin(X) * Y).sum(axis=1), rtol=1e-13)


def test_bad_index_names_the_instance(rng):
    t = tp.record(lambda x, i: tp.take(x, i).sum(), np.ones(4), np.array([0, 1]))
    idx = np.array([[0, 1], [2, 3], [1, 4], [0, 0]])
    with pytest.raises(IndexError, match="instance 2"):
        gradient_batch(t, np.ones((4, 4)), idx)
    v, g = gradient_batch(t, np.ones((4, 4)), idx % 4)
    np.testing.assert_allclose(v, 2.0)


def test_argument_checks():
    t = tp.record(lambda x, y: (x * y).sum(), np.ones(3), np.ones(3))
    with pytest.raises(tp.ReplayError, match="2 arguments"):
        gradient_batch(t, np.ones((2, 3)))
    with pytest.raises(tp.ReplayError, match="expected shape"):
        gradient_batch(t, np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(tp.ReplayError, match="batch size"):
        gradient_batch(t, np.ones((2, 3)), np.ones((5, 3)))
    vec = tp.record(lambda x: x * 2.0, np.ones(3))
    with pytest.raises(RuntimeError, match="scalar output"):
        gradient_batch(vec, np.ones((2, 3)))


def test_empty_batch_and_tape_untouched(rng):
    t = tp.record(rosen, np.zeros(4))
    x = rng.standard_normal(4)
    g_before = t.gradient(x).copy()
    v, g = gradient_batch(t, np.zeros((0, 4)))
    assert v.shape == (0,) and g.shape == (0, 4)
    gradient_batch(t, rng.standard_normal((5, 4)))
    np.testing.assert_allclose(t.grads[0], g_before)  # the tape's own arenas are not used
