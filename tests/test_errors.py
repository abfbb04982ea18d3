"""Bad input gets a clear Python exception naming the op, the shapes or the argument."""

import numpy as np
import pytest

import tape as tp


def test_non_broadcastable_shapes_name_op_and_shapes():
    a, b = tp.ones(3, requires_grad=True), tp.ones(4)
    with pytest.raises(ValueError, match=r"add: .*\(3,\) and \(4,\)"):
        a + b
    with pytest.raises(ValueError, match=r"where: .*\(2,\).*\(3,\)"):
        tp.where(tp.ones(2) > 0, tp.ones(3), 0.0)
    with pytest.raises(ValueError, match=r"broadcast_to: .*\(3,\).*\(4, 2\)"):
        tp.broadcast_to(tp.ones(3), (4, 2))


def test_matmul_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(4, 5\)"):
        tp.ones(2, 3) @ tp.ones(4, 5)
    with pytest.raises(ValueError, match=r"matmul: shapes \(3,\) and \(2,\)"):
        tp.dot(tp.ones(3), tp.ones(2))
    with pytest.raises(ValueError, match="at least 1-D"):
        tp.matmul(tp.tensor(1.0), tp.ones(2))
    with pytest.raises(ValueError, match="batch"):
        tp.ones(2, 3, 4) @ tp.ones(3, 4, 5)


def test_backward_of_non_scalar_without_gradient():
    x = tp.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="gradient has shape"):
        (x * 2).backward(gradient=np.ones(2))
    (x * 2).backward(gradient=np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0])


def test_backward_without_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        (tp.ones(2) * 2).sum().backward()


def test_requires_grad_on_integer_or_bool_data():
    with pytest.raises(RuntimeError, match="floating point"):
        tp.tensor([1, 2], requires_grad=True)
    with pytest.raises(RuntimeError, match="floating point"):
        tp.tensor(True, requires_grad=True)
    with pytest.raises(RuntimeError, match="floating point"):
        tp.arange(3).requires_grad_()


def test_non_numeric_data():
    with pytest.raises(TypeError, match="numeric"):
        tp.tensor("abc")
    with pytest.raises(TypeError):
        tp.tensor([[1.0, 2.0], [3.0]])
    with pytest.raises(TypeError, match="complex"):
        tp.tensor(np.ones(2, complex))
    with pytest.raises(TypeError):
        tp.ones(2) + "a"


def test_out_of_range_indices_at_record_time():
    x = tp.ones(3, requires_grad=True)
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 0 with size 3"):
        x[3]
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        x[np.array([0, 5])]
    with pytest.raises(IndexError, match="index -4 is out of bounds"):
        x[[-4]]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0]
    with pytest.raises(IndexError, match="integer"):
        x[np.array([0.5])]


def test_out_of_range_indices_at_replay_are_caught_before_memory_is_touched():
    t = tp.record(lambda x, i: x[i].sum(), np.ones(3), np.array([0, 2]))
    assert t.gradient(np.ones(3), np.array([2, -1])).tolist() == [0.0, 0.0, 2.0]
    with pytest.raises(IndexError, match=r"take.*index 3 is out of bounds for an axis of size 3"):
        t.gradient(np.ones(3), np.array([0, 3]))
    with pytest.raises(IndexError, match="out of bounds"):
        t.forward(np.ones(3), np.array([-4, 0]))
    # the tape still works afterwards
    assert t.forward(np.array([1.0, 2.0, 3.0]), np.array([1, 1])) == 4.0


def test_replay_argument_checks_name_the_argument():
    t = tp.record(lambda x, y: (x * y).sum(), np.ones(3), np.ones(3))
    with pytest.raises(tp.ReplayError, match=r"takes 2 arguments \(x, y\), got 1"):
        t.gradient(np.ones(3))
    with pytest.raises(
        tp.ReplayError, match=r"argument 1 \(y\): expected shape \(3,\), got \(4,\)"
    ):
        t.gradient(np.ones(3), np.ones(4))
    with pytest.raises(
        tp.ReplayError, match=r"argument 0 \(x\): cannot use values of dtype complex128"
    ):
        t.forward(np.ones(3, complex), np.ones(3))
    with pytest.raises(tp.ReplayError, match="argument 0"):
        t.forward(["a", "b", "c"], np.ones(3))
    ti = tp.record(lambda x, i: x[i].sum(), np.ones(3), np.array([0]))
    with pytest.raises(tp.ReplayError, match=r"argument 1 \(i\).*float64"):
        ti.forward(np.ones(3), np.array([0.5]))
    # lists and ints are fine where they cast
    assert t.forward([1, 2, 3], np.ones(3)) == 6.0


def test_nan_and_inf_follow_ieee():
    x = tp.tensor([0.0, -1.0, np.inf, np.nan], requires_grad=True)
    y = tp.log(x)
    v = y.numpy()
    assert v[0] == -np.inf and np.isnan(v[1]) and v[2] == np.inf and np.isnan(v[3])
    y.sum().backward()
    g = x.grad.numpy()
    assert g[0] == np.inf and g[1] == -1.0 and g[2] == 0.0 and np.isnan(g[3])
    assert (tp.tensor(1.0) / tp.tensor(0.0)).item() == np.inf
    assert np.isnan(tp.sqrt(tp.tensor(-1.0)).item())
    assert (
        tp.max(tp.tensor([1.0, np.nan, 3.0])).item() != tp.max(tp.tensor([1.0, np.nan, 3.0])).item()
    )


def test_size_zero_tensors():
    x = tp.zeros(0, requires_grad=True)
    (x * 2 + 1).sum().backward()
    assert x.grad.shape == (0,)
    assert (tp.zeros(2, 0) @ tp.zeros(0, 3)).numpy().tolist() == [[0.0] * 3] * 2
    t = tp.record(lambda a: (a * a).sum(), np.zeros((0, 4)))
    assert t.gradient(np.zeros((0, 4))).shape == (0, 4)
    assert tp.concatenate([tp.zeros(0), tp.ones(2)]).shape == (2,)


def test_axis_errors():
    with pytest.raises(ValueError, match="sum: axis 2 is out of range"):
        tp.ones(2, 3).sum(axis=2)
    with pytest.raises(ValueError, match="repeated axis"):
        tp.ones(2, 3).sum(axis=(0, 0))
    with pytest.raises(ValueError, match="reshape"):
        tp.ones(6).reshape(4, 2)
    with pytest.raises(ValueError, match="concatenate"):
        tp.concatenate([tp.ones(2, 3), tp.ones(2, 4)])


def test_inplace_on_leaf_requiring_grad():
    w = tp.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        w -= 1.0
    with tp.no_grad():
        w -= 0.5
    np.testing.assert_array_equal(w.numpy(), [0.5, 0.5])
    assert w.requires_grad


def test_record_argument_errors():
    with pytest.raises(TypeError, match="argument 0"):
        tp.record(lambda x: x, np.array(["a"]))
    with pytest.raises(TypeError, match="only floating"):
        tp.record(lambda x: x, np.array([1, 2]), wrt=0)
    with pytest.raises(ValueError, match="wrt=3"):
        tp.record(lambda x: x, np.ones(2), wrt=3)
    with pytest.raises(TypeError, match="must return tensors"):
        tp.record(lambda x: "nope", np.ones(2))
    with pytest.raises(RuntimeError, match="inside tape.record"):
        tp.record(lambda x: x.sum().backward(), np.ones(2))
