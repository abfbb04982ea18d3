"""NumPy shape and contraction composites (flip, roll, tile, repeat, split, moveaxis, swapaxes,
pad, diagonal, diag, trace, take_along_axis, tensordot, einsum, N-D matmul): edge cases, the
PyTorch method spellings, and clear errors for bad input. Values and derivatives of the regular
cases are in ``tests/test_ops.py``'s ``KERNEL_CASES``."""

import numpy as np
import pytest

import tape as tp


def _r(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).uniform(-2.0, 2.0, shape)


def close(got, want):
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- edge cases


def test_empty_and_zero_dimensional_inputs():
    close(tp.flip(tp.tensor(1.5)), np.flip(np.array(1.5)))
    close(tp.roll(tp.zeros(0, 3), 2, 1), np.zeros((0, 3)))
    close(tp.roll(tp.tensor(2.0), 3), np.roll(np.array(2.0), 3))
    close(tp.tile(tp.ones(2), (0, 2)), np.tile(np.ones(2), (0, 2)))
    close(tp.repeat(tp.tensor(_r(2, 3)), 0, axis=1), np.zeros((2, 0)))
    close(tp.pad(tp.zeros(0, 2), ((1, 1), (0, 0)), constant_values=3.0),
          np.pad(np.zeros((0, 2)), ((1, 1), (0, 0)), constant_values=3.0))  # fmt: skip
    close(tp.pad(tp.zeros(0, 2), ((0, 0), (1, 1))), np.zeros((0, 4)))
    close(tp.diag(tp.zeros(0)), np.zeros((0, 0)))
    close(tp.diagonal(tp.tensor(_r(2, 3)), 5), np.zeros(0))
    pieces = tp.split(tp.tensor(_r(4)), [1, 1, 9])
    assert [p.shape for p in pieces] == [(1,), (0,), (3,), (0,)]
    assert [p.shape for p in tp.array_split(tp.zeros(2), 3)] == [(1,), (1,), (0,)]
    close(tp.einsum("ij,jk->ik", tp.zeros(2, 0), tp.zeros(0, 3)), np.zeros((2, 3)))
    close(tp.zeros(0, 2, 3) @ tp.ones(3, 4), np.zeros((0, 2, 4)))
    close(tp.ones(2, 1, 3, 4) @ tp.ones(0, 4, 2), np.zeros((2, 0, 3, 2)))


def test_identity_arguments_record_nothing():
    x = tp.tensor(_r(2, 3))
    assert tp.roll(x, (2, 3), (0, 1)) is x
    assert tp.flip(tp.ones(1, 1)).shape == (1, 1)
    assert tp.pad(x, 0) is x
    assert tp.repeat(x, 1, axis=0) is x


def test_pad_corners_follow_numpy_and_every_element_is_written():
    x = _r(2, 3)
    cv = ((1.0, 2.0), (3.0, 4.0))
    want = np.pad(x, ((2, 1), (1, 2)), constant_values=cv)
    close(tp.pad(tp.tensor(x), ((2, 1), (1, 2)), constant_values=cv), want)
    # replays write the same values into a reused arena (no element left to chance)
    t = tp.record(lambda a: tp.pad(a * 2.0, ((2, 1), (1, 2)), constant_values=cv), x)
    for seed in range(3):
        y = _r(2, 3, seed=seed)
        np.testing.assert_array_equal(
            t.forward(y), np.pad(y * 2.0, ((2, 1), (1, 2)), constant_values=cv)
        )


def test_pad_with_a_tensor_value_gets_its_gradient():
    x = tp.tensor(_r(2, 3), requires_grad=True)
    c = tp.tensor(0.5, requires_grad=True)
    y = tp.pad(x, ((1, 0), (2, 1)), constant_values=c)
    close(y, np.pad(x.numpy(), ((1, 0), (2, 1)), constant_values=0.5))
    y.sum().backward()
    assert c.grad.item() == 3 * 6 - 6
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((2, 3)))


def test_float32_stays_float32():
    x = tp.tensor(_r(2, 3), dtype=tp.float32)
    for y in (tp.pad(x, 1, constant_values=2.0), tp.diag(x[0]), tp.flip(x), tp.roll(x, 1),
              tp.einsum("ij,kj->ik", x, x), x.reshape(1, 2, 3) @ x.T.reshape(1, 1, 3, 2)):  # fmt: skip
        assert y.dtype == np.float32


def test_numpy_function_and_pytorch_method_spellings():
    v = _r(3, 4)
    x = tp.tensor(v)
    # PyTorch's x.repeat is NumPy's tile; tp.repeat and x.repeat_interleave are NumPy's repeat
    close(x.repeat(2, 1), np.tile(v, (2, 1)))
    close(x.repeat((1, 2, 1)), np.tile(v, (1, 2, 1)))
    close(x.tile(2, 2), np.tile(v, (2, 2)))
    close(tp.repeat(x, 2, axis=0), np.repeat(v, 2, axis=0))
    close(x.repeat_interleave(2, dim=1), np.repeat(v, 2, axis=1))
    # x.split takes piece sizes (PyTorch), tp.split the number of pieces or split points
    assert [p.shape for p in x.split(3, dim=1)] == [(3, 3), (3, 1)]
    assert [p.shape for p in x.split([1, 2], 0)] == [(1, 4), (2, 4)]
    assert [p.shape for p in tp.split(x, 2, axis=1)] == [(3, 2), (3, 2)]
    assert isinstance(tp.split(x, 2, axis=1), list)
    close(x.flip(1), np.flip(v, 1))
    close(x.flip([0, 1]), np.flip(v))
    close(x.roll(1, 0), np.roll(v, 1, 0))
    close(tp.roll(x, shifts=(1, 1), dims=(0, 1)), np.roll(v, (1, 1), (0, 1)))
    close(x.diagonal(1), np.diagonal(v, 1))
    close(x.diagonal(dim1=1, dim2=0), np.diagonal(v, 0, 1, 0))
    close(x.trace(), np.trace(v))
    close(x.moveaxis(0, 1), v.T)
    close(x.swapaxes(0, -1), v.T)
    close(tp.tensordot(x, x, dims=([1], [1])), v @ v.T)
    close(tp.take_along_axis(x, np.zeros((3, 1), np.int64), dim=1), v[:, :1])


def test_take_along_axis_with_traced_indices_replays_the_new_indices():
    x = _r(3, 4)
    w = np.arange(1.0, 7.0).reshape(3, 2)

    def f(a, i):
        return (tp.take_along_axis(a, i, 1) * w).sum()

    idx = np.array([[0, 3], [1, -1], [2, 2]])
    t = tp.record(f, x, idx, wrt=[0])
    for new in (idx, np.array([[1, 1], [0, -4], [3, 0]])):
        want = (np.take_along_axis(x, new, 1) * w).sum()
        np.testing.assert_allclose(t.forward(x, new), want, rtol=1e-14)
        g = np.zeros_like(x)
        np.add.at(g, (np.arange(3)[:, None], new % 4), w)
        np.testing.assert_allclose(t.gradient(x, new), g)
    for bad in ([[1, 1], [0, 4], [3, 0]], [[1, 1], [0, -5], [3, 0]]):
        with pytest.raises(IndexError, match="out of bounds"):
            t.forward(x, np.array(bad))


def test_take_along_axis_accepts_an_int64_tensor_and_broadcasts():
    x = tp.tensor(_r(2, 1, 4), requires_grad=True)
    i = tp.tensor(np.array([[[0, 3]], [[-2, 1]]]).repeat(3, axis=1))
    y = tp.take_along_axis(x, i, -1)
    close(y, np.take_along_axis(x.numpy(), i.numpy(), -1))
    y.sum().backward()
    assert x.grad.numpy().sum() == 12


def test_matmul_broadcasts_batches_and_reads_whole_ones_in_place():
    a, b = _r(2, 1, 3, 4), _r(5, 4, 2)
    close(tp.tensor(a) @ tp.tensor(b), a @ b)
    # a whole batch or a single matrix is read in place; a partial one is broadcast (copied)
    for sb in ((4, 2), (1, 1, 4, 2), (2, 3, 4, 2)):
        t = tp.record(lambda p, q: p @ q, _r(2, 3, 3, 4), _r(*sb))
        assert "copy" not in str(t), sb
        assert len(t) == 1
    t = tp.record(lambda p, q: p @ q, a, b)
    assert str(t).count("copy(") == 2


def test_einsum_implicit_output_is_sorted_with_ellipsis_first():
    a = _r(2, 3)
    close(tp.einsum("ba", a), np.einsum("ba", a))
    close(tp.einsum("Ba", a), np.einsum("Ba", a))
    close(tp.einsum("i...", a), np.einsum("i...", a))
    close(tp.einsum(" ij , jk ", a, _r(3, 2)), a @ _r(3, 2))
    close(tp.einsum("i,j", _r(2), _r(3)), np.outer(_r(2), _r(3)))


# ---------------------------------------------------------------- errors


def test_axis_errors_name_the_function_and_the_shape():
    x = tp.ones(2, 3)
    with pytest.raises(ValueError, match=r"flip: axis 2 is out of range for a 2-D tensor"):
        tp.flip(x, 2)
    with pytest.raises(ValueError, match=r"flip: repeated axis"):
        tp.flip(x, (0, -2))
    with pytest.raises(TypeError, match=r"flip: pass axis= or dims=, not both"):
        tp.flip(x, 0, dims=0)
    with pytest.raises(ValueError, match=r"swapaxes: axis -3 is out of range for a 2-D tensor"):
        tp.swapaxes(x, 0, -3)
    with pytest.raises(TypeError, match=r"swapaxes: an axis must be an int, got 1.0"):
        tp.swapaxes(x, 0, 1.0)
    with pytest.raises(ValueError, match=r"moveaxis: source .* and destination .* same number"):
        tp.moveaxis(x, [0, 1], [0])
    with pytest.raises(ValueError, match=r"moveaxis: repeated axis"):
        tp.moveaxis(x, [0, 0], [0, 1])
    with pytest.raises(ValueError, match=r"roll: shift \(1, 2\) and axis \(0, 1, 1\)"):
        tp.roll(tp.ones(2, 3, 4), (1, 2), (0, 1, 1))
    with pytest.raises(TypeError, match=r"roll: missing the shift"):
        tp.roll(x)


def test_repeat_tile_split_errors():
    x = tp.ones(2, 3)
    with pytest.raises(ValueError, match=r"tile: reps must be non-negative"):
        tp.tile(x, (2, -1))
    with pytest.raises(TypeError, match=r"tile: reps must be an int or a sequence of ints"):
        tp.tile(x, 1.5)
    with pytest.raises(ValueError, match=r"repeat: the number of repeat sizes \(1\).*\(2, 3\)"):
        x.repeat(2)
    with pytest.raises(ValueError, match=r"repeat: repeats of shape \(2,\) .*axis 1 \(of size 3\)"):
        tp.repeat(x, [1, 2], axis=1)
    with pytest.raises(ValueError, match=r"repeat: repeats must be non-negative"):
        tp.repeat(x, -1)
    with pytest.raises(TypeError, match=r"repeat: repeats must be ints"):
        tp.repeat(x, 1.5)
    with pytest.raises(ValueError, match=r"repeat: axis 2 is out of range"):
        tp.repeat(x, 2, axis=2)
    with pytest.raises(ValueError, match=r"split: array split does not result in an equal "
                       r"division: axis 1 of shape \(2, 3\) \(size 3\) into 2 sections"):  # fmt: skip
        tp.split(x, 2, axis=1)
    with pytest.raises(ValueError, match=r"array_split: the number of sections must be positive"):
        tp.array_split(x, 0)
    with pytest.raises(ValueError, match=r"split: split sizes \[1, 1\] must .*add up to 3"):
        x.split([1, 1], dim=1)
    with pytest.raises(TypeError, match=r"split: indices_or_sections must be"):
        tp.split(x, [1.5])


def test_pad_errors():
    x = tp.ones(2, 3)
    with pytest.raises(NotImplementedError, match=r"pad: mode='reflect' is not supported"):
        tp.pad(x, 1, mode="reflect")
    with pytest.raises(NotImplementedError, match=r"pad: mode='edge'"):
        tp.pad(x, 1, "edge")
    with pytest.raises(ValueError, match=r"pad: pad_width must be non-negative"):
        tp.pad(x, ((1, -1), (0, 0)))
    with pytest.raises(TypeError, match=r"pad: pad_width must be integers"):
        tp.pad(x, 1.5)
    with pytest.raises(ValueError, match=r"pad: pad_width of shape \(3, 2\) does not fit a 2-D"):
        tp.pad(x, ((1, 1), (1, 1), (1, 1)))
    with pytest.raises(ValueError, match=r"pad: a tensor constant_values must be 0-d"):
        tp.pad(x, 1, constant_values=tp.ones(2))


def test_diagonal_diag_trace_errors():
    with pytest.raises(
        ValueError, match=r"diagonal: the input must be at least 2-D, got shape \(3,\)"
    ):
        tp.diagonal(tp.ones(3))
    with pytest.raises(ValueError, match=r"diagonal: axis1 and axis2 must be different axes"):
        tp.diagonal(tp.ones(2, 2), 0, 1, -1)
    with pytest.raises(TypeError, match=r"diagonal: offset must be an int"):
        tp.diagonal(tp.ones(2, 2), 0.5)
    with pytest.raises(
        ValueError, match=r"diag: the input must be 1-D or 2-D, got shape \(2, 2, 2\)"
    ):
        tp.diag(tp.ones(2, 2, 2))
    with pytest.raises(ValueError, match=r"diagonal: axis 2 is out of range"):
        tp.trace(tp.ones(2, 2), 0, 0, 2)


def test_take_along_axis_errors():
    x = tp.ones(2, 3)
    with pytest.raises(ValueError, match=r"take_along_axis: indices of shape \(2,\) must have as "
                       r"many dimensions as the tensor of shape \(2, 3\)"):  # fmt: skip
        tp.take_along_axis(x, np.array([0, 1]), 1)
    with pytest.raises(IndexError, match=r"take_along_axis: index 3 is out of bounds for axis 1 "
                       r"with size 3"):  # fmt: skip
        tp.take_along_axis(x, np.array([[0], [3]]), 1)
    with pytest.raises(IndexError, match=r"take_along_axis: indices must be integers"):
        tp.take_along_axis(x, np.array([[0.0], [1.0]]), 1)
    with pytest.raises(IndexError, match=r"take_along_axis: indices must be an integer tensor"):
        tp.take_along_axis(x, tp.zeros(2, 1), 1)
    with pytest.raises(ValueError, match=r"take_along_axis: .*\(2, 3\).*\(3, 1\) do not broadcast"):
        tp.take_along_axis(x, np.zeros((3, 1), np.int64), 1)


def test_contraction_errors():
    a, b = tp.ones(2, 3), tp.ones(4, 5)
    with pytest.raises(ValueError, match=r"tensordot: shape mismatch: axis 1 of a \(2, 3\) has "
                       r"size 3 but axis 0 of b \(4, 5\) has size 4"):  # fmt: skip
        tp.tensordot(a, b, 1)
    with pytest.raises(ValueError, match=r"tensordot: axes=3 needs operands of at least 3"):
        tp.tensordot(a, b, 3)
    with pytest.raises(TypeError, match=r"tensordot: axes must be an int or a pair"):
        tp.tensordot(a, b, "ij")
    with pytest.raises(ValueError, match=r"tensordot: 2 axes of a .* against 1 of b"):
        tp.tensordot(a, b, ([0, 1], [0]))
    with pytest.raises(ValueError, match=r"matmul: batch dimensions \(2, 3\) and \(4,\)"):
        tp.ones(2, 3, 4, 5) @ tp.ones(4, 5, 6)
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3, 4\) and \(2, 5, 6\)"):
        tp.ones(2, 3, 4) @ tp.ones(2, 5, 6)


def test_einsum_errors():
    a, b = tp.ones(2, 3), tp.ones(4, 5)
    with pytest.raises(ValueError, match=r"einsum: 'ij,jk->ik' names 2 operand\(s\), got 1"):
        tp.einsum("ij,jk->ik", a)
    with pytest.raises(ValueError, match=r"einsum: label 'j' has size 3 in operand 0 and 4 in "
                       r"operand 1"):  # fmt: skip
        tp.einsum("ij,jk->ik", a, b)
    with pytest.raises(ValueError, match=r"einsum: operand 0 has shape \(2, 3\) \(2 dimensions\) "
                       r"but its subscripts 'ijk' name 3"):  # fmt: skip
        tp.einsum("ijk->i", a)
    with pytest.raises(ValueError, match=r"einsum: output label 'z' appears in no operand"):
        tp.einsum("ij->z", a)
    with pytest.raises(ValueError, match=r"einsum: the output 'ii' repeats a label"):
        tp.einsum("ij->ii", a)
    with pytest.raises(ValueError, match=r"einsum: invalid subscript '1'"):
        tp.einsum("i1->i", a)
    with pytest.raises(ValueError, match=r"einsum: .*'\.\.\.' axes are not in the output"):
        tp.einsum("...j->j", a)
    with pytest.raises(ValueError, match=r"einsum: label 'i' is repeated in operand 0 \(shape "
                       r"\(2, 3\)\) over axes of different sizes"):  # fmt: skip
        tp.einsum("ii->i", a)
    with pytest.raises(TypeError, match=r"einsum: the first argument must be a subscripts string"):
        tp.einsum(a, [0, 1])
    with pytest.raises(ValueError, match=r"einsum: .* has more than one '->'"):
        tp.einsum("i->i->i", tp.ones(2))
