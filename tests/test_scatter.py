"""Functional updates (``x.at[i].set/add``, ``index_add``) beyond the registry-driven cases:
traced indices recomputed at replay, gradients through both operands, errors."""

import numpy as np
import pytest

import tape as tp


def test_traced_index_add_replays_new_indices(rng):
    x, v = rng.normal(size=(5, 2)), rng.normal(size=(3, 2))
    w = rng.normal(size=(5, 2))

    def f(x, i, v):
        return (x.at[i].add(v) * w).sum()

    t = tp.record(f, x, np.array([0, 1, 1]), v, wrt=[0, 2])
    i2 = np.array([4, 4, -1])
    val, (gx, gv) = t.value_and_grad(x, i2, v)
    y = x.copy()
    np.add.at(y, i2, v)
    np.testing.assert_allclose(val, (y * w).sum(), rtol=1e-13)
    np.testing.assert_allclose(gx, w)
    np.testing.assert_allclose(gv, w[i2])
    with pytest.raises(IndexError, match="scatter_add.*out of bounds"):
        t.forward(x, np.array([0, 5, 1]), v)


def test_eager_gradients_and_original_unchanged():
    x = tp.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    v = tp.tensor([10.0, 20.0], requires_grad=True)
    y = x.at[np.array([3, 0])].set(v)
    np.testing.assert_array_equal(x.numpy(), [1, 2, 3, 4])
    np.testing.assert_array_equal(y.numpy(), [20, 2, 3, 10])
    (y * tp.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 2, 3, 0])
    np.testing.assert_array_equal(v.grad.numpy(), [4, 1])


def test_errors():
    x = tp.ones(3, 2)
    with pytest.raises(NotImplementedError, match="traced index"):
        tp.record(lambda x, i: x.at[i].set(0.0).sum(), np.ones(3), np.array([0]))
    with pytest.raises(ValueError, match="index_add: source of shape"):
        tp.index_add(x, 0, np.array([0, 1]), tp.ones(3, 2))
    with pytest.raises(IndexError, match="out of bounds"):
        x.at[np.array([3])].add(1.0)
