"""x[key] = v on tensors computed in a graph: a recorded functional update, with gradients to
v and to the elements of x not overwritten; shared memory refused after the write."""

import numpy as np
import pytest

import tape as tp


def write(a, v):
    y = a * 2.0
    z = y * y  # recorded before the write: keeps the old y
    y[0] = 10.0
    y[1:3] = v**3
    y[y > 7.0] = 7.0  # a boolean mask and one value: a where, read again at every replay
    return y.sum() + z.sum()


def write_np(a, v):
    y = a * 2.0
    z = y * y
    y[0] = 10.0
    y[1:3] = v**3
    y[y > 7.0] = 7.0
    return y.sum() + z.sum()


A = np.array([0.3, -0.4, 0.5, 1.2, -0.7])
V = np.array([0.6, 1.5])


def test_eager_matches_numpy_and_finite_differences():
    a, v = tp.tensor(A, requires_grad=True), tp.tensor(V, requires_grad=True)
    out = write(a, v)
    assert out.item() == pytest.approx(write_np(A, V), rel=1e-14)
    out.backward()
    # d/da: 8a (from z) + 2 where y keeps a*2 (positions 3, 4 not clipped); d/dv: 3v^2 unless clipped
    ga = 8 * A + np.array([0, 0, 0, 2.0 * (2 * A[3] <= 7), 2.0 * (2 * A[4] <= 7)])
    gv = 3 * V**2 * (V**3 <= 7)
    np.testing.assert_allclose(a.grad.numpy(), ga, rtol=1e-13)
    np.testing.assert_allclose(v.grad.numpy(), gv, rtol=1e-13)
    tp.gradcheck(write, A, V)


def test_recorded_write_replays_with_the_mask_recomputed():
    t = tp.record(write, A, V)
    for s in (0.0, 0.3):
        a, v = A + s, V - s
        assert t.forward(a, v) == pytest.approx(write_np(a, v), rel=1e-14)
    v2 = np.array([0.6, 2.0])  # 2**3 > 7: the mask changes, the same tape gives it
    assert t.forward(A, v2) == pytest.approx(write_np(A, v2), rel=1e-14)
    assert t.retraces == 0
    tp.gradcheck(write, A, v2, n_points=2)


def test_views_of_a_written_tensor_are_refused():
    a = tp.tensor(A[:4], requires_grad=True)
    w = (a * 1.0).reshape(2, 2)
    flat = w.reshape(4)  # shares w's memory
    w[0, 0] = 5.0
    assert w.sum().item() == pytest.approx(5.0 + A[1:4].sum())
    with pytest.raises(RuntimeError, match="shares memory with a tensor written in place"):
        flat.sum()
    with pytest.raises(RuntimeError, match="shares memory"):
        flat.numpy()
    base = a * 1.0
    row = base[1:3]  # a contiguous slice: a view
    row[0] = 0.0
    with pytest.raises(RuntimeError, match="shares memory"):
        (base * 2).sum()


def test_refused_writes():
    a = tp.tensor(A[:4], requires_grad=True)
    with pytest.raises(RuntimeError, match="strided slice, transpose"):
        q = (a * 1.0).reshape(2, 2).t()
        q[0, 0] = 1.0
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        tp.record(lambda x: x.__setitem__(0, 1.0), A)
    with pytest.raises(RuntimeError, match="can't be cast"):
        y = a * 1.0
        y[0] = 1 + 2j


def test_traced_masks_with_array_values_follow_numpy():
    a = np.arange(6.0).reshape(3, 2)
    x = tp.tensor(a, requires_grad=True)
    y = x * 1.0
    y[y[:, 0] > 1.0] = tp.tensor([7.0, 8.0]) * 1.0  # a row mask, one row of values broadcast
    z = x * 1.0
    z[z > 2.0] = tp.tensor([0.5, 0.25, 0.125])  # an elementwise mask, one value per element
    want_y, want_z = a.copy(), a.copy()
    want_y[a[:, 0] > 1.0] = [7.0, 8.0]
    want_z[a > 2.0] = [0.5, 0.25, 0.125]
    np.testing.assert_array_equal(y.numpy(), want_y)
    np.testing.assert_array_equal(z.numpy(), want_z)
    (y.sum() + z.sum()).backward()
    np.testing.assert_array_equal(x.grad.numpy(), (a[:, :1] <= 1.0) + (a <= 2.0) * 1.0)
