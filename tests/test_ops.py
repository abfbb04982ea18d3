"""Registry-driven op tests: every registered op, forward against its NumPy reference and
reverse against central finite differences (float64), over 0-d, 1-d, 2-d and broadcasting
shapes. A new elementwise op is picked up automatically; a new structural op must add cases to
KERNEL_CASES (a test fails until it does)."""

import functools

import cases_factor  # tests/ is on sys.path (pytest's rootdir-less import mode)
import cases_scan
import cases_scatter
import cases_spectral
import numpy as np
import pytest
from scipy.special import logsumexp as sp_logsumexp

import tape as tp
from tape.frontend.testing import sample_inputs as sample
from tape.ops.elementwise import COMPARISONS
from tape.ops.registry import OPS

F = tp.nn.functional

UNARY_SHAPES = [(), (5,), (3, 4), (2, 1, 3)]
BINARY_SHAPES = [
    ((), ()),
    ((5,), (5,)),
    ((3, 4), (3, 4)),
    ((), (3, 4)),
    ((3, 4), ()),
    ((3, 1), (1, 4)),
    ((4,), (3, 4)),
    ((2, 3, 4), (3, 1)),
    ((1,), (3,)),
]
TERNARY_SHAPES = [((4,), (4,), (4,)), ((3, 1), (1, 4), ()), ((3, 4), (4,), (3, 1))]

ELEMENTWISE = [op for op in OPS if op.kind != "structural"]
DIFFERENTIABLE = [op for op in ELEMENTWISE if any(op.differentiable)]


def shapes_for(op):
    return {
        "unary": [(s,) for s in UNARY_SHAPES],
        "binary": BINARY_SHAPES,
        "ternary": TERNARY_SHAPES,
    }[op.kind]


def fn_of(op):
    return getattr(tp, op.name)


@pytest.mark.parametrize("op", ELEMENTWISE, ids=lambda o: o.name)
def test_elementwise_forward_matches_numpy(op, rng):
    for shapes in shapes_for(op):
        xs = sample(op, shapes, rng)
        got = fn_of(op)(*[tp.tensor(x) for x in xs])
        want = op.ref(*xs)
        assert got.shape == np.shape(want), (op.name, shapes)
        rtol, atol = op.tol
        np.testing.assert_allclose(got.numpy().astype(float), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("op", DIFFERENTIABLE, ids=lambda o: o.name)
def test_elementwise_gradient_matches_finite_differences(op, rng):
    for shapes in shapes_for(op):
        xs = sample(op, shapes, rng)
        wrt = [k for k, d in enumerate(op.differentiable) if d]
        rtol, atol = op.fd_tol
        assert tp.gradcheck(lambda *a: fn_of(op)(*a), *xs, wrt=wrt, atol=atol, rtol=rtol)


@pytest.mark.parametrize("op", DIFFERENTIABLE, ids=lambda o: o.name)
def test_elementwise_eager_backward_equals_replay(op, rng):
    shapes = shapes_for(op)[-1]
    xs = sample(op, shapes, rng)
    wrt = [k for k, d in enumerate(op.differentiable) if d]
    ts = [tp.tensor(x, requires_grad=k in wrt) for k, x in enumerate(xs)]
    (fn_of(op)(*ts) * 1.5).sum().backward()
    t = tp.record(lambda *a: (fn_of(op)(*a) * 1.5).sum(), *xs, wrt=wrt)
    g = t.gradient(*xs)
    g = g if isinstance(g, tuple) else (g,)
    for k, gk in zip(wrt, g):
        np.testing.assert_allclose(ts[k].grad.numpy(), gk, rtol=1e-14, atol=0)


NON_DIFFERENTIABLE = [o for o in ELEMENTWISE if not any(o.differentiable)]


def test_non_differentiable_ops_are_known():
    # each needs a test of its own below
    assert {o.name for o in NON_DIFFERENTIABLE} == set(COMPARISONS) | {"stop_gradient"}


def test_stop_gradient_passes_values_not_gradients(rng):
    x = tp.tensor(rng.uniform(-1, 1, 4), requires_grad=True)
    y = tp.stop_gradient(x)
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert not y.requires_grad
    (x * tp.stop_gradient(x * 3)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * x.numpy())


@pytest.mark.parametrize(
    "op", [o for o in NON_DIFFERENTIABLE if o.name in COMPARISONS], ids=lambda o: o.name
)
def test_comparisons_are_bool_and_not_differentiable(op, rng):
    a = tp.tensor(rng.uniform(-1, 1, 5), requires_grad=True)
    b = tp.tensor(np.r_[a.numpy()[:2], rng.uniform(-1, 1, 3)])
    out = fn_of(op)(a, b)
    assert out.dtype == np.bool_
    assert not out.requires_grad
    np.testing.assert_array_equal(out.numpy(), op.ref(a.numpy(), b.numpy()).astype(bool))


def test_unary_size_zero():
    for op in ELEMENTWISE:
        if op.kind == "unary":
            assert fn_of(op)(tp.zeros(0)).shape == (0,)
    x = tp.zeros(0, 3, requires_grad=True)
    (x.exp() * 2).sum().backward()
    assert x.grad.shape == (0, 3)


# ---------------------------------------------------------------- structural ops


def _r(*shape, seed=0, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed + sum(shape)).uniform(lo, hi, shape)


def _q(*shape, seed=0):
    """Random values on a grid of eighths (exact products and sums in float64)."""
    return np.round(_r(*shape, seed=seed) * 8) / 8


# each case: (function of tensors, NumPy reference of the same, inputs)
# fmt: off
KERNEL_CASES = {
    "sum": [
        (lambda x: tp.sum(x), lambda x: np.sum(x), [_r(3, 4)]),
        (lambda x: tp.sum(x, axis=0), lambda x: np.sum(x, axis=0), [_r(3, 4)]),
        (lambda x: x.sum(1, keepdims=True), lambda x: np.sum(x, 1, keepdims=True), [_r(3, 4)]),
        (lambda x: tp.sum(x, axis=(0, 2)), lambda x: np.sum(x, axis=(0, 2)), [_r(2, 3, 4)]),
        (lambda x: tp.sum(x, axis=-1), lambda x: np.sum(x, axis=-1), [_r(2, 3, 4)]),
        (lambda x: tp.sum(x, dim=1), lambda x: np.sum(x, axis=1), [_r(2, 3, 4)]),
        (lambda x: tp.sum(x), lambda x: np.sum(x), [np.array(1.5)]),
        # composites recording copy + sum
        (lambda x: tp.trace(x), lambda x: np.trace(x), [_r(3, 3)]),
        (lambda x: x.trace(1, -1, 0), lambda x: np.trace(x, 1, -1, 0), [_r(3, 4, 2)]),
        (lambda x: tp.einsum("ii->", x), lambda x: np.einsum("ii->", x), [_r(4, 4)]),
        (lambda x: tp.einsum("ij->", x), lambda x: np.einsum("ij->", x), [_r(3, 4)]),
        (lambda x: tp.einsum("ijk->j", x), lambda x: np.einsum("ijk->j", x), [_r(2, 3, 4)]),
        (lambda x: tp.einsum("iij->j", x), lambda x: np.einsum("iij->j", x), [_r(3, 3, 2)]),
        (lambda x: tp.einsum("i...->...", x), lambda x: np.einsum("i...->...", x), [_r(2, 3)]),
    ],
    "max": [
        (lambda x: tp.max(x), lambda x: np.max(x), [_r(3, 4)]),
        (lambda x: tp.max(x, axis=1), lambda x: np.max(x, axis=1), [_r(3, 4)]),
        (lambda x: x.max((0, 2), keepdims=True), lambda x: np.max(x, (0, 2), keepdims=True), [_r(2, 3, 4)]),
    ],
    "min": [
        (lambda x: tp.min(x), lambda x: np.min(x), [_r(3, 4)]),
        (lambda x: tp.min(x, axis=0), lambda x: np.min(x, axis=0), [_r(3, 4)]),
    ],
    "prod": [
        (lambda x: tp.prod(x), lambda x: np.prod(x), [_r(5, lo=0.5)]),
        (lambda x: tp.prod(x, axis=1), lambda x: np.prod(x, axis=1), [_r(3, 4, lo=0.5)]),
    ],
    "copy": [
        (lambda x: x.T, lambda x: x.T, [_r(3, 4)]),
        (lambda x: tp.transpose(x, (1, 2, 0)), lambda x: np.transpose(x, (1, 2, 0)), [_r(2, 3, 4)]),
        (lambda x: tp.broadcast_to(x, (3, 4)), lambda x: np.broadcast_to(x, (3, 4)), [_r(4)]),
        (lambda x: tp.broadcast_to(x, (2, 3, 4)), lambda x: np.broadcast_to(x, (2, 3, 4)), [_r(3, 1)]),
        (lambda x: x[::2], lambda x: x[::2], [_r(7)]),
        (lambda x: x[::-1], lambda x: x[::-1], [_r(5)]),
        (lambda x: x[:, 1], lambda x: x[:, 1], [_r(3, 4)]),
        (lambda x: x[1:, ::-2], lambda x: x[1:, ::-2], [_r(3, 5)]),
        (lambda x: x[..., None, 0], lambda x: x[..., None, 0], [_r(2, 3, 4)]),
        (lambda a, b: tp.concatenate([a, b, a], axis=0), lambda a, b: np.concatenate([a, b, a], 0), [_r(2, 3), _r(4, 3)]),
        (lambda a, b: tp.cat([a, b], dim=1), lambda a, b: np.concatenate([a, b], 1), [_r(2, 3), _r(2, 1)]),
        (lambda a, b: tp.stack([a, b], axis=1), lambda a, b: np.stack([a, b], 1), [_r(2, 3), _r(2, 3, seed=1)]),
        # NumPy shape composites recording strided copies
        (lambda x: tp.flip(x), lambda x: np.flip(x), [_r(2, 3, 4)]),
        (lambda x: tp.flip(x, (0, -1)), lambda x: np.flip(x, (0, -1)), [_r(2, 3, 4)]),
        (lambda x: tp.flip(x, dims=[1]), lambda x: np.flip(x, 1), [_r(3, 4)]),
        (lambda x: x.flip(0, 1), lambda x: np.flip(x, (0, 1)), [_r(3, 4)]),
        (lambda x: tp.roll(x, 5), lambda x: np.roll(x, 5), [_r(3, 4)]),
        (lambda x: tp.roll(x, -1, axis=-1), lambda x: np.roll(x, -1, axis=-1), [_r(2, 3, 4)]),
        (lambda x: tp.roll(x, (1, 7), (0, 2)), lambda x: np.roll(x, (1, 7), (0, 2)), [_r(2, 3, 4)]),
        (lambda x: tp.tile(x, (2, 1, 3)), lambda x: np.tile(x, (2, 1, 3)), [_r(3, 2)]),
        (lambda x: tp.tile(x, 2), lambda x: np.tile(x, 2), [_r(2, 3)]),
        (lambda x: x.repeat(2, 1, 2), lambda x: np.tile(x, (2, 1, 2)), [_r(3, 2)]),
        (lambda x: tp.repeat(x, 2), lambda x: np.repeat(x, 2), [_r(2, 3)]),
        (lambda x: tp.repeat(x, 3, axis=-2), lambda x: np.repeat(x, 3, axis=-2), [_r(2, 3, 2)]),
        (lambda x: tp.concatenate(tp.split(x, [1, 3], axis=1)[::-1], axis=1), lambda x: np.concatenate(np.split(x, [1, 3], axis=1)[::-1], axis=1), [_r(2, 5)]),
        (lambda x: tp.concatenate([p * (k + 1) for k, p in enumerate(tp.split(x, 3, axis=-1))], -1), lambda x: np.concatenate([p * (k + 1) for k, p in enumerate(np.split(x, 3, axis=-1))], -1), [_r(2, 6)]),
        (lambda x: tp.stack([p.sum() for p in tp.array_split(x, 3)]), lambda x: np.stack([p.sum() for p in np.array_split(x, 3)]), [_r(7)]),
        (lambda x: tp.stack([p.sum() for p in x.split([1, 3], dim=1)]), lambda x: np.stack([x[:, :1].sum(), x[:, 1:].sum()]), [_r(2, 4)]),
        (lambda x: tp.moveaxis(x, 0, -1), lambda x: np.moveaxis(x, 0, -1), [_r(2, 3, 4)]),
        (lambda x: tp.moveaxis(x, [0, -1], [-1, 1]), lambda x: np.moveaxis(x, [0, -1], [-1, 1]), [_r(2, 3, 4)]),
        (lambda x: tp.swapaxes(x, -1, 0), lambda x: np.swapaxes(x, -1, 0), [_r(2, 3, 4)]),
        (lambda x: tp.pad(x, 1), lambda x: np.pad(x, 1), [_r(2, 3)]),
        (lambda x: tp.pad(x, ((1, 0), (0, 2), (3, 1))), lambda x: np.pad(x, ((1, 0), (0, 2), (3, 1))), [_r(2, 3, 2)]),
        (lambda x: tp.pad(x, ((1, 2), (2, 1)), constant_values=((1.5, -2), (3, 4))), lambda x: np.pad(x, ((1, 2), (2, 1)), constant_values=((1.5, -2), (3, 4))), [_r(2, 3)]),
        (lambda x: tp.pad(x, (0, 3), constant_values=-1.0), lambda x: np.pad(x, (0, 3), constant_values=-1.0), [_r(4)]),
        (lambda x: tp.diagonal(x), lambda x: np.diagonal(x), [_r(3, 4)]),
        (lambda x: tp.diagonal(x, -1, 2, 0), lambda x: np.diagonal(x, -1, 2, 0), [_r(3, 2, 4)]),
        (lambda x: tp.diag(x, 1), lambda x: np.diag(x, 1), [_r(3, 4)]),
        (lambda x: tp.einsum("ij->ji", x), lambda x: np.einsum("ij->ji", x), [_r(3, 4)]),
        (lambda x: tp.einsum("ii->i", x), lambda x: np.einsum("ii->i", x), [_r(3, 3)]),
    ],
    "take": [
        (lambda x: x[np.array([2, 0, 2, -1])], lambda x: x[np.array([2, 0, 2, -1])], [_r(4, 3)]),
        (lambda x: x[:, [1, 1, 0]], lambda x: x[:, [1, 1, 0]], [_r(3, 4)]),
        (lambda x: tp.take(x, np.array([[0, 1], [1, 1]]), axis=1), lambda x: np.take(x, [[0, 1], [1, 1]], axis=1), [_r(2, 3, 2)]),
        (lambda x: x[np.array([0, 2]), np.array([1, 3])], lambda x: x[[0, 2], [1, 3]], [_r(3, 4)]),
        (lambda x: x[x_mask], lambda x: x[x_mask], [_r(2, 3)]),
        # NumPy composites recording gathers
        (lambda x: tp.repeat(x, [1, 0, 2], axis=1), lambda x: np.repeat(x, [1, 0, 2], axis=1), [_r(2, 3)]),
        (lambda x: tp.repeat(x, np.array([2, 1, 3])), lambda x: np.repeat(x, [2, 1, 3]), [_r(3)]),
        (lambda x: tp.diag(x), lambda x: np.diag(x), [_r(3)]),
        (lambda x: tp.diag(x, -2), lambda x: np.diag(x, -2), [_r(3)]),
        (lambda x: tp.take_along_axis(x, tal_idx, 1), lambda x: np.take_along_axis(x, tal_idx, 1), [_r(3, 4)]),
        (lambda x: tp.take_along_axis(x, tal_idx3, -1), lambda x: np.take_along_axis(x, tal_idx3, -1), [_r(2, 1, 4)]),
        (lambda x: tp.take_along_axis(x, np.array([5, 0, -1, 5]), None), lambda x: np.take_along_axis(x, np.array([5, 0, -1, 5]), None), [_r(2, 3)]),
    ],
    "matmul": [
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(3, 4), _r(4, 2)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(4), _r(4, 2)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(3, 4), _r(4)]),
        (lambda a, b: tp.dot(a, b), lambda a, b: np.dot(a, b), [_r(4), _r(4, seed=3)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(2, 3, 4), _r(2, 4, 5)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(2, 3, 4), _r(4, 5)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(3, 4), _r(2, 4, 5)]),
        (lambda a, b: tp.outer(a, b), lambda a, b: np.outer(a, b), [_r(3), _r(2)]),
        (lambda a: a @ a, lambda a: a @ a, [_r(3, 3)]),
        # N-D batches broadcast with NumPy's rules
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(2, 1, 3, 4), _r(5, 4, 2)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(2, 2, 3, 4), _r(2, 2, 4, 2, seed=1)]),
        (lambda a, b: tp.matmul(a, b), lambda a, b: np.matmul(a, b), [_r(4), _r(2, 3, 4, 2)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(2, 3, 3, 4), _r(4)]),
        (lambda a, b: a @ b, lambda a, b: a @ b, [_r(1, 1, 3, 4), _r(2, 4, 2)]),
        # contractions lowered to matmul
        (lambda a, b: tp.tensordot(a, b), lambda a, b: np.tensordot(a, b), [_r(2, 3, 4), _r(3, 4, 2)]),
        (lambda a, b: tp.tensordot(a, b, ([0, 2], [2, 0])), lambda a, b: np.tensordot(a, b, ([0, 2], [2, 0])), [_r(2, 3, 4), _r(4, 5, 2)]),
        (lambda a, b: tp.einsum("ij,jk->ik", a, b), lambda a, b: np.einsum("ij,jk->ik", a, b), [_r(2, 3), _r(3, 4)]),
        (lambda a, b: tp.einsum("bij,bjk->bik", a, b), lambda a, b: np.einsum("bij,bjk->bik", a, b), [_r(2, 3, 4), _r(2, 4, 2)]),
        (lambda a, b: tp.einsum("i,i->", a, b), lambda a, b: np.einsum("i,i->", a, b), [_r(4), _r(4, seed=1)]),
        (lambda a, b: tp.einsum("...ij,...jk", a, b), lambda a, b: np.einsum("...ij,...jk", a, b), [_r(2, 3, 4), _r(4, 2)]),
        (lambda a, b: tp.einsum("...ij,...jk->...ik", a, b), lambda a, b: np.einsum("...ij,...jk->...ik", a, b), [_r(2, 1, 3, 4), _r(5, 4, 2)]),
        (lambda a, b: tp.einsum("ijk,jil->kl", a, b), lambda a, b: np.einsum("ijk,jil->kl", a, b), [_r(2, 3, 4), _r(3, 2, 5)]),
        # two products in a row: inputs on a grid of eighths, so that every product and sum is
        # exact and the sparse (compressed) Jacobian equals the dense one bit for bit
        (lambda a, b, c: tp.einsum("ab,cd,bc->ad", a, b, c), lambda a, b, c: np.einsum("ab,cd,bc->ad", a, b, c), [_q(2, 3), _q(4, 2), _q(3, 4)]),
        (lambda a, b: tp.einsum("ij,ij->ij", a, b), lambda a, b: np.einsum("ij,ij->ij", a, b), [_r(1, 3), _r(2, 3)]),
        (lambda a, b: tp.einsum("aab,bc->ac", a, b), lambda a, b: np.einsum("aab,bc->ac", a, b), [_r(2, 2, 3), _r(3, 4)]),
    ],
    "matmul_nt": [
        # x W^T (linear) with W read in place
        (lambda x, w: F.linear(x, w), lambda x, w: x @ w.T, [_r(3, 4), _r(2, 4)]),
        (lambda x, w: F.linear(x, w), lambda x, w: x @ w.T, [_r(4), _r(3, 4)]),
        (lambda x, w: F.linear(x, w), lambda x, w: x @ w.T, [_r(2, 3, 4), _r(5, 4)]),
        (lambda x, w, b: F.linear(x, w, b), lambda x, w, b: x @ w.T + b, [_r(3, 2), _r(4, 2), _r(4)]),
        (lambda a: F.linear(a, a), lambda a: a @ a.T, [_r(3, 3)]),  # both inputs one buffer
    ],
    "cross_entropy": [
        # -log_softmax(x)[t] per row, one entry; targets negative-free, ignored, weighted
        (lambda x: F.cross_entropy(x, ce_t, reduction="none"), lambda x: _ce_ref(x, ce_t, 1), [_r(5, 4)]),
        (lambda x: F.cross_entropy(x, ce_t), lambda x: _ce_ref(x, ce_t, 1).mean(), [_r(5, 4)]),
        (lambda x: F.cross_entropy(x, np.int64(2), reduction="sum"), lambda x: _ce_ref(x, np.int64(2), 0), [_r(4)]),
        (lambda x: F.cross_entropy(x, ce_t3, reduction="none"), lambda x: _ce_ref(x, ce_t3, 1), [_r(3, 4, 2)]),
        (lambda x: F.cross_entropy(x, ce_t, ignore_index=1, reduction="sum"), lambda x: _ce_ref(x, ce_t, 1)[ce_t != 1].sum(), [_r(5, 4)]),
        (lambda x: F.cross_entropy(x, ce_t, weight=ce_w), lambda x: (ce_w[ce_t] * _ce_ref(x, ce_t, 1)).sum() / ce_w[ce_t].sum(), [_r(5, 4)]),
        # large logits: the row's maximum keeps exp in range
        (lambda x: F.cross_entropy(x, ce_t, reduction="none"), lambda x: _ce_ref(x, ce_t, 1), [_r(5, 4, lo=700.0, hi=760.0)]),
    ],
    "logsumexp": [
        # one entry over adjacent axes: one, all, keepdims, a middle block, a 0-d tensor
        (lambda x: tp.logsumexp(x, axis=1), lambda x: sp_logsumexp(x, axis=1), [_r(3, 4)]),
        (lambda x: tp.logsumexp(x), lambda x: sp_logsumexp(x), [_r(3, 4)]),
        (lambda x: tp.logsumexp(x, axis=0, keepdims=True), lambda x: sp_logsumexp(x, axis=0, keepdims=True), [_r(3, 4)]),
        (lambda x: tp.logsumexp(x, axis=(1, 2)), lambda x: sp_logsumexp(x, axis=(1, 2)), [_r(2, 3, 2, 2)]),
        (lambda x: tp.logsumexp(x, dim=-1, keepdim=True), lambda x: sp_logsumexp(x, axis=-1, keepdims=True), [_r(2, 3, 4)]),
        (lambda x: tp.logsumexp(x), lambda x: sp_logsumexp(x), [np.array(0.7)]),
        # large values: the row's maximum keeps exp in range
        (lambda x: tp.logsumexp(x, axis=1), lambda x: sp_logsumexp(x, axis=1), [_r(3, 4, lo=700.0, hi=760.0)]),
    ],
    "guard": [
        # a Python branch on a traced value records a guard; eager ignores it
        (lambda x: x * 2 if x.sum() > 0 else x * 3, lambda x: x * 2 if x.sum() > 0 else x * 3, [_r(3, 4, lo=0.5)]),
        (lambda x: x * 2 if x.sum() > 0 else x * 3, lambda x: x * 2 if x.sum() > 0 else x * 3, [-_r(3, 4, lo=0.5)]),
        (lambda x: x[: int(x[0] > 0) + 1] * 2, lambda x: x[: int(x[0] > 0) + 1] * 2, [_r(3, lo=0.5)]),
    ],
}
# fmt: on
ce_t = np.array([0, 3, 1, 1, 2])
ce_t3 = np.array([[0, 3], [2, 2], [1, 0]])
ce_w = np.array([0.5, 2.0, 1.0, 1.5])


def _ce_ref(x, t, axis):
    """-log_softmax(x)[t] along ``axis`` (NumPy)."""
    m = x.max(axis=axis, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    picked = np.take_along_axis(x, np.expand_dims(t, axis), axis)
    return np.squeeze(lse - picked, axis)


x_mask = np.array([[True, False, True], [False, True, True]])
tal_idx = np.array([[0, 3, 3], [1, -1, 0], [2, 2, 1]])
tal_idx3 = np.array([[[0, 3]], [[-2, 1]]])

for _cases in (cases_scan.CASES, cases_factor.CASES, cases_scatter.CASES, cases_spectral.CASES):
    for _name, _list in _cases.items():
        KERNEL_CASES.setdefault(_name, []).extend(_list)

KERNELS = [op for op in OPS if op.kind == "structural"]


def test_every_kernel_op_has_cases():
    missing = [op.name for op in KERNELS if op.name not in KERNEL_CASES]
    assert not missing, f"add test cases for structural ops {missing} to KERNEL_CASES"


CASES = [(name, k, case) for name, cases in KERNEL_CASES.items() for k, case in enumerate(cases)]


@pytest.mark.parametrize("name,k,case", CASES, ids=[f"{n}-{k}" for n, k, _ in CASES])
def test_kernel_op(name, k, case):
    fn, ref, xs = case
    got = fn(*[tp.tensor(x) for x in xs])
    want = ref(*xs)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    assert tp.gradcheck(fn, *xs)


def test_max_ties_share_gradient():
    x = tp.tensor([1.0, 3.0, 3.0, 2.0], requires_grad=True)
    x.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0.5, 0.5, 0])
    y = tp.tensor([[1.0, 1.0], [0.0, 2.0]], requires_grad=True)
    y.min(axis=1).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [[0.5, 0.5], [1, 0]])


def test_prod_gradient_with_zeros():
    x = tp.tensor([2.0, 0.0, 3.0], requires_grad=True)
    x.prod().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 6.0, 0.0])
    y = tp.tensor([0.0, 0.0, 3.0], requires_grad=True)
    y.prod().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [0.0, 0.0, 0.0])


def test_gather_repeated_indices_accumulate():
    x = tp.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[[0, 0, 2, 0]].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 1.0])


def test_sum_of_empty_and_reductions_of_size_zero():
    assert tp.zeros(0).sum().item() == 0.0
    assert tp.ones(0, 3).sum(axis=0).shape == (3,)
    with pytest.raises(ValueError, match="zero-size"):
        tp.zeros(0).max()


@functools.cache
def _gemm_jit():
    """``gemm_acc`` compiled, adding (beta = 1) and assigning (beta = 0): one dispatcher each
    for every test below (each compiles once per dtype)."""
    from numba import njit

    from tape.ops.blas import gemm_acc

    return (njit(lambda a, ta, b, tb, c: gemm_acc(a, ta, b, tb, c)),
            njit(lambda a, ta, b, tb, c: gemm_acc(a, ta, b, tb, c, 0.0)))  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m, k, n", [(3, 5, 4), (6, 5, 1), (1, 5, 6), (1, 5, 1), (4, 1, 1)])
def test_gemm_adds_the_product_into_its_output(dtype, ta, tb, m, k, n):
    # matmul's reverse adds A^T gY and gY B^T into the adjoints through BLAS (beta = 1); a
    # product with one column or one row of output goes through gemv
    from tape.ops.blas import gemm_acc

    acc, assign = _gemm_jit()
    rng = np.random.default_rng(7)
    a = rng.normal(size=(k, m) if ta else (m, k)).astype(dtype)
    b = rng.normal(size=(n, k) if tb else (k, n)).astype(dtype)
    c0 = rng.normal(size=(m, n)).astype(dtype)
    c = c0.copy()
    acc(a, ta, b, tb, c)
    f64 = lambda x: x.astype(np.float64)  # noqa: E731
    want = f64(c0) + (f64(a).T if ta else f64(a)) @ (f64(b).T if tb else f64(b))
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    c = c0.copy()
    gemm_acc(a, ta, b, tb, c)  # the Python version (NUMBA_DISABLE_JIT)
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    # beta = 0 (matmul's forward): the product alone, whatever c held (NaN included)
    want0 = (f64(a).T if ta else f64(a)) @ (f64(b).T if tb else f64(b))
    for fn in (assign, lambda a, ta, b, tb, c: gemm_acc(a, ta, b, tb, c, 0.0)):
        c = np.full((m, n), np.nan, dtype)
        fn(a, ta, b, tb, c)
        np.testing.assert_allclose(c, want0, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("trans", [False, True])
def test_gesv_solves_and_reports_a_singular_matrix(dtype, trans):
    # solve's kernels call LAPACK gesv directly: op(a) x = b, and ok False at a zero pivot
    from numba import njit

    from tape.ops.blas import gesv

    rng = np.random.default_rng(8)
    a = (rng.normal(size=(4, 4)) + 4 * np.eye(4)).astype(dtype)
    b = rng.normal(size=(4, 3)).astype(dtype)
    a_view = a[:, ::-1][:, ::-1]  # a strided view: any layout is read
    f64 = lambda x: x.astype(np.float64)  # noqa: E731
    want = np.linalg.solve(f64(a).T if trans else f64(a), f64(b))
    tol = 1e-12 if dtype == np.float64 else 1e-4
    sing = a.copy()
    sing[:, 2] = 0.0  # a zero column: a zero pivot in any precision
    sing = np.ascontiguousarray(sing.T) if trans else sing
    for fn in (njit(lambda a, t, b: gesv(a, t, b)), gesv):
        x, ok = fn(a_view, trans, b)
        assert ok and x.shape == (4, 3) and x.dtype == dtype
        np.testing.assert_allclose(x, want, rtol=tol, atol=tol)
        assert not fn(sing, trans, b)[1]
    np.testing.assert_array_equal(a, a_view)  # nothing written


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_trsm_and_potrf_against_scipy_and_numpy(dtype):
    # the triangular solves and Cholesky factors of the factorisation kernels: BLAS trsm
    # (op(a) x = b, one triangle of a read) and LAPACK potrf (the lower triangle read)
    import scipy.linalg
    from numba import njit

    from tape.ops.blas import potrf, trsm

    rng = np.random.default_rng(9)
    f64 = lambda x: x.astype(np.float64)  # noqa: E731
    tol = 1e-12 if dtype == np.float64 else 1e-4
    a = (rng.normal(size=(5, 5)) + 5 * np.eye(5)).astype(dtype)
    b = rng.normal(size=(5, 3)).astype(dtype)
    jt = njit(lambda a, b, lo, tr: trsm(a, b, lo, tr))
    for lower in (True, False):
        for trans in (False, True):
            tri = np.tril(f64(a)) if lower else np.triu(f64(a))
            want = scipy.linalg.solve_triangular(tri, f64(b), lower=lower, trans=int(trans))
            for fn in (jt, trsm):
                for av, bv in ((a, b), (np.asfortranarray(a), b[::-1][::-1]), (a, b[:, :1])):
                    x = fn(av, bv, lower, trans)
                    assert x.dtype == dtype and x.shape == bv.shape and x.flags.c_contiguous
                    w = want if bv.shape == b.shape else want[:, :1]
                    np.testing.assert_allclose(x, w, rtol=tol, atol=tol)
    assert jt(a, b[:, :0], True, False).shape == (5, 0)
    s = f64(a) @ f64(a).T
    lower_only = np.tril(s) + np.triu(np.full((5, 5), np.nan), 1)  # the upper is never read
    jp = njit(lambda a: potrf(a))
    for fn in (jp, potrf):
        low, ok = fn(lower_only.astype(dtype))
        assert ok and low.dtype == dtype
        np.testing.assert_allclose(low, np.linalg.cholesky(s), rtol=tol, atol=tol)
        assert not fn((-s).astype(dtype))[1]  # not positive definite


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gemm_and_right_trsm_on_blocks_of_larger_arrays(dtype):
    # the Cholesky adjoint's BLAS calls work on blocks sliced from its matrices (the row stride
    # as the leading dimension) and write them in place: every element outside the block stays
    import scipy.linalg
    from numba import njit

    from tape.ops.blas import gemm_acc, trsm_lower_right

    rng = np.random.default_rng(4)
    tol = 1e-12 if dtype == np.float64 else 1e-4
    big = rng.normal(size=(9, 11)).astype(dtype)
    a, b = rng.normal(size=(6, 5)).astype(dtype), rng.normal(size=(7, 8)).astype(dtype)
    f64 = lambda x: x.astype(np.float64)  # noqa: E731

    @njit
    def blocks(a, b, c, d, x):
        gemm_acc(a[1:5, 2:5], True, b[2:6, 1:4], False, c[2:5, 3:6], 0.5, -2.0)
        trsm_lower_right(d[1:4, 2:5], x[3:8, 4:7])
        # one row of output (through gemv, its matrix a block), one column (a strided
        # column: through gemm)
        gemm_acc(a[1:2, 0:4], False, b[2:6, 1:6], False, c[6:7, 1:6], 0.5, 3.0)
        gemm_acc(a[1:5, 2:5], True, b[2:6, 6:7], False, c[2:5, 8:9], 0.0, -1.0)

    for jit in (True, False):
        c, x = big.copy(), big.copy()
        d = big.copy()
        d[1:4, 2:5] += 4 * np.eye(3, dtype=dtype)
        if jit:
            blocks(a, b, c, d, x)
        else:  # the Python versions
            gemm_acc(a[1:5, 2:5], True, b[2:6, 1:4], False, c[2:5, 3:6], 0.5, -2.0)
            trsm_lower_right(d[1:4, 2:5], x[3:8, 4:7])
            gemm_acc(a[1:2, 0:4], False, b[2:6, 1:6], False, c[6:7, 1:6], 0.5, 3.0)
            gemm_acc(a[1:5, 2:5], True, b[2:6, 6:7], False, c[2:5, 8:9], 0.0, -1.0)
        want_c, want_x = f64(big), f64(big)
        want_c[2:5, 3:6] = 0.5 * want_c[2:5, 3:6] - 2.0 * f64(a[1:5, 2:5]).T @ f64(b[2:6, 1:4])
        want_c[6:7, 1:6] = 0.5 * want_c[6:7, 1:6] + 3.0 * f64(a[1:2, 0:4]) @ f64(b[2:6, 1:6])
        want_c[2:5, 8:9] = -f64(a[1:5, 2:5]).T @ f64(b[2:6, 6:7])
        low = np.tril(f64(d[1:4, 2:5]))
        want_x[3:8, 4:7] = scipy.linalg.solve_triangular(low, f64(big[3:8, 4:7]).T, trans=1,
                                                         lower=True).T  # fmt: skip
        np.testing.assert_allclose(c, want_c, rtol=tol, atol=tol)
        np.testing.assert_allclose(x, want_x, rtol=tol, atol=tol)
        np.testing.assert_allclose(f64(x[3:8, 4:7]) @ low, f64(big[3:8, 4:7]), rtol=tol, atol=tol)


def test_cholesky_gradient_over_several_blocks(dtype=np.float64):
    # n = 150 is three blocks of the blocked adjoint (64, 64 and a last one of 22): against the
    # whole-matrix formula in NumPy and a central difference along a random symmetric direction
    # (float32 runs the same code: its BLAS calls are tested on blocks above)
    from tape.ops.factor import CHOLESKY_BLOCK

    n = 150
    assert n > 2 * CHOLESKY_BLOCK
    rng = np.random.default_rng(8)
    m = rng.normal(size=(n, n))
    a = m @ m.T / n + np.eye(n)
    w = rng.normal(size=(n, n))
    f = lambda x: tp.sum(tp.linalg.cholesky(x) * w.astype(dtype))  # noqa: E731
    t = tp.record(f, a.astype(dtype), compile=False)
    g = t.gradient(a.astype(dtype))  # one argument: its gradient alone
    low = np.linalg.cholesky(a)
    gl = np.tril(w)
    phi = lambda x: np.tril(x) - 0.5 * np.diag(np.diag(x))  # noqa: E731
    li = np.linalg.inv(low)
    s = li.T @ phi(low.T @ gl) @ li
    want = phi(s + s.T)
    tol = 1e-10 if dtype == np.float64 else 2e-3
    np.testing.assert_allclose(g, want, rtol=tol, atol=tol * np.abs(want).max())
    if dtype == np.float64:
        e = rng.normal(size=(n, n))
        e = e + e.T
        h = 1e-6
        fd = ((np.linalg.cholesky(a + h * e) - np.linalg.cholesky(a - h * e)) * w).sum() / (2 * h)
        # the gradient is of the lower triangle the factorisation reads
        assert np.isclose((g * np.tril(e)).sum(), fd, rtol=1e-6)


def test_float32_matmul_gradient():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(2, 3, 4)).astype(np.float32)
    b = rng.normal(size=(4, 5)).astype(np.float32)
    t = tp.record(lambda a, b: tp.sum(tp.sin(a @ b)), a, b)
    assert t.dtype == np.float32
    ga, gb = t.gradient(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    gy = np.cos(a64 @ b64)
    np.testing.assert_allclose(ga, gy @ b64.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, np.einsum("bij,bik->jk", a64, gy), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2)])
@pytest.mark.parametrize("name", ["max", "min"])
def test_extremum_over_axes_with_nan_and_inf_as_numpy(name, axis):
    # rows of the innermost axis: kept (axis 0), reduced (axis 1, (0, 2)), or all of them
    x = np.arange(60.0).reshape(3, 4, 5) * np.where(np.arange(5) % 2, -1.0, 1.0)
    x[1, 2, 3] = np.nan
    x[2, 0, 1] = -np.inf
    x[0, 3, :] = np.inf
    got = getattr(tp, name)(tp.tensor(x), axis=axis).numpy()
    np.testing.assert_array_equal(got, getattr(np, name)(x, axis=axis))


@pytest.mark.parametrize("m", [1, 3, 4, 7, 1001])
def test_broadcast_adjoint_summed_over_rows_of_any_length(m):
    # a (3, 1) input against (3, m): its adjoint is each row's contributions summed (in four
    # running sums, then the rest), as the first operand (a * b) and as the second (b - a)
    rng = np.random.default_rng(m)
    a, b = rng.normal(size=(3, 1)), rng.normal(size=(3, m))
    t = tp.record(lambda a, b: tp.sum(tp.sin(a * b) + (b - a) ** 2), a, b)
    ga, gb = t.gradient(a, b)
    r = b - a
    want_a = (np.cos(a * b) * b).sum(axis=1, keepdims=True) - 2.0 * r.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(ga, want_a, rtol=1e-12, atol=1e-12 * m)
    np.testing.assert_allclose(gb, np.cos(a * b) * a + 2.0 * r, rtol=1e-12, atol=1e-13)
    x = tp.tensor(a, requires_grad=True)  # eager runs the same kernels
    (tp.sin(x * tp.tensor(b)) + (tp.tensor(b) - x) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), want_a, rtol=1e-12, atol=1e-12 * m)
