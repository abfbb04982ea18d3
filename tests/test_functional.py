"""Composite functions (built from registered ops), constructors and tensor attributes."""

import numpy as np
import pytest
from scipy.special import log_softmax as sp_log_softmax
from scipy.special import logsumexp as sp_logsumexp
from scipy.special import softmax as sp_softmax

import tape as tp

X = np.random.default_rng(7).uniform(-2, 2, (3, 4))

COMPOSITES = [
    (lambda x: tp.mean(x), lambda x: np.mean(x)),
    (lambda x: x.mean(axis=0), lambda x: np.mean(x, 0)),
    (lambda x: tp.mean(x, dim=1, keepdims=True), lambda x: np.mean(x, 1, keepdims=True)),
    (lambda x: tp.var(x), lambda x: np.var(x)),
    (lambda x: tp.var(x, axis=1, ddof=1), lambda x: np.var(x, 1, ddof=1)),
    (lambda x: tp.std(x, axis=0), lambda x: np.std(x, 0)),
    (lambda x: tp.norm(x), lambda x: np.linalg.norm(x)),
    (lambda x: tp.norm(x, axis=1), lambda x: np.linalg.norm(x, axis=1)),
    (lambda x: tp.norm(x[0], ord=1), lambda x: np.linalg.norm(x[0], 1)),
    (lambda x: tp.logsumexp(x), lambda x: sp_logsumexp(x)),
    (lambda x: tp.logsumexp(x, axis=1), lambda x: sp_logsumexp(x, axis=1)),
    (
        lambda x: tp.logsumexp(x, axis=0, keepdims=True),
        lambda x: sp_logsumexp(x, axis=0, keepdims=True),
    ),
    (lambda x: tp.softmax(x), lambda x: sp_softmax(x, axis=-1)),
    (lambda x: tp.softmax(x, dim=0), lambda x: sp_softmax(x, axis=0)),
    (lambda x: tp.log_softmax(x, axis=1), lambda x: sp_log_softmax(x, axis=1)),
    (lambda x: tp.clip(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7)),
    (lambda x: tp.clamp(x, min=0.1), lambda x: np.clip(x, 0.1, None)),
    (lambda x: x.reshape(4, 3).T, lambda x: x.reshape(4, 3).T),
    (lambda x: tp.squeeze(tp.unsqueeze(x, 1), 1), lambda x: x),
    (lambda x: x.flatten()[::3], lambda x: x.ravel()[::3]),
    (lambda x: x.transpose(0, 1), lambda x: x.T),
    (lambda x: x.permute(1, 0), lambda x: x.T),
    (lambda x: 2.0**x, lambda x: 2.0**x),
    (lambda x: 1.0 / (1.0 + x * x), lambda x: 1.0 / (1.0 + x * x)),
    (lambda x: -x + abs(x), lambda x: -x + np.abs(x)),
]


@pytest.mark.parametrize("k", range(len(COMPOSITES)))
def test_composite_matches_reference_and_finite_differences(k):
    fn, ref = COMPOSITES[k]
    got = fn(tp.tensor(X))
    want = ref(X)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-13)
    assert tp.gradcheck(fn, X)


def test_norm_gradient_at_zero_is_zero():
    x = tp.zeros(3, requires_grad=True)
    tp.norm(x).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0])


def test_logsumexp_and_softmax_are_stable():
    x = tp.tensor([1000.0, 1000.0, -np.inf], requires_grad=True)
    assert tp.logsumexp(x).item() == pytest.approx(1000 + np.log(2))
    s = tp.softmax(x)
    np.testing.assert_allclose(s.numpy(), [0.5, 0.5, 0.0])
    s[0].backward()
    assert np.isfinite(x.grad.numpy()).all()


def test_logsumexp_is_one_entry_over_adjacent_axes_and_handles_infinities():
    from tape.layout.columns import E_OP
    from tape.ops.registry import OPS

    def ops(f, x):
        t = tp.record(f, x)
        return [OPS[c].name for c in t.entries[: t.n_entries, E_OP]]

    z = np.random.default_rng(3).normal(size=(2, 3, 4))
    assert ops(lambda x: tp.logsumexp(x, axis=(1, 2)), z) == ["logsumexp"]
    assert ops(lambda x: tp.logsumexp(x), z) == ["logsumexp"]
    # axes that are not adjacent take the composed path, with the same values and gradients
    f = lambda x: tp.logsumexp(x, axis=(0, 2)).sum()  # noqa: E731
    assert "logsumexp" not in ops(f, z)
    np.testing.assert_allclose(f(tp.tensor(z)).item(), sp_logsumexp(z, axis=(0, 2)).sum(),
                               rtol=1e-13)  # fmt: skip
    assert tp.gradcheck(f, z)
    # rows of -inf, of +inf and empty rows, as scipy
    inf = np.inf
    x = np.array([[-inf, -inf], [inf, 0.0], [-inf, 2.0]])
    got = tp.logsumexp(tp.tensor(x), axis=1).numpy()
    np.testing.assert_array_equal(got, sp_logsumexp(x, axis=1))
    assert tp.logsumexp(tp.zeros(2, 0), axis=1).numpy().tolist() == [-inf, -inf]
    # a row with -inf entries: those get zero gradient, the rest the softmax
    w = tp.tensor(x[2:], requires_grad=True)
    tp.logsumexp(w, axis=1).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[0.0, 1.0]])
    # rows across the inner axis (walked in vector order) give the bits of contiguous rows
    u = np.random.default_rng(4).normal(size=(6, 5)) * 30
    u[2, 1] = -inf
    np.testing.assert_array_equal(tp.logsumexp(tp.tensor(u), axis=0).numpy(),
                                  tp.logsumexp(tp.tensor(u.T.copy()), axis=1).numpy())  # fmt: skip
    # short rows, more than one block of them side by side (tape.ops.nn.ROW_BLOCK): the
    # values and the softmax gradient, and the same bits as the rows laid across
    v = np.random.default_rng(5).normal(size=(300, 5)) * 10
    v[7, 0], v[290, 3] = -inf, inf
    w = tp.tensor(v, requires_grad=True)
    y = tp.logsumexp(w, axis=1)
    np.testing.assert_array_equal(y.numpy(), tp.logsumexp(tp.tensor(v.T.copy()), axis=0).numpy())
    np.testing.assert_allclose(y.numpy(), sp_logsumexp(v, axis=1), rtol=1e-14)
    y[:289].sum().backward()  # the rows without +inf
    p = np.exp(v[:289] - sp_logsumexp(v[:289], axis=1, keepdims=True))
    np.testing.assert_allclose(w.grad.numpy()[:289], p, rtol=1e-13, atol=1e-300)
    assert (w.grad.numpy()[289:] == 0.0).all()
    # float32 in, float32 out; integers take the composed path (a float result)
    x32 = z.astype(np.float32)
    y32 = tp.logsumexp(tp.tensor(x32), axis=-1)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32.numpy(), sp_logsumexp(z, axis=-1), rtol=1e-6)
    yi = tp.logsumexp(tp.tensor(np.arange(6).reshape(2, 3)), axis=1)
    np.testing.assert_allclose(yi.numpy(), sp_logsumexp(np.arange(6).reshape(2, 3), axis=1))


def test_softmax_keeps_the_accuracy_of_large_close_logits():
    # float32 logits near 300: the shifted forms lose nothing to the size of the logits
    # (exp(x - logsumexp(x)) would: 1.5e-5 relative, 130 float32 ulps)
    x = (300.0 + np.random.default_rng(0).normal(size=(64, 10))).astype(np.float32)
    x64 = x.astype(np.float64)
    want_log = x64 - sp_logsumexp(x64, axis=1, keepdims=True)
    want = np.exp(want_log)
    F = tp.nn.functional
    for got in (tp.softmax(tp.tensor(x), axis=1), F.softmax(tp.tensor(x), dim=1)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    for got in (tp.log_softmax(tp.tensor(x), axis=1), F.log_softmax(tp.tensor(x), dim=1)):
        np.testing.assert_allclose(got.numpy(), want_log, rtol=0, atol=1e-6)
    # logsumexp's gradient (the softmax) too: it is computed from the shift and the sum, not
    # from the float32 logsumexp, and across rows as along them
    for axis, v in ((1, x), (0, x.T.copy())):
        w = tp.tensor(v, requires_grad=True)
        tp.logsumexp(w, axis=axis).sum().backward()
        np.testing.assert_allclose(w.grad.numpy(), want if axis == 1 else want.T, rtol=1e-6)


def test_constructors():
    assert tp.zeros(2, 3).shape == (2, 3) and tp.zeros((2, 3)).numpy().sum() == 0
    assert tp.ones(4).numpy().tolist() == [1.0] * 4
    assert tp.full((2,), 7.0).numpy().tolist() == [7.0, 7.0]
    x = tp.tensor([[1.0, 2.0]])
    assert tp.zeros_like(x).shape == (1, 2) and tp.ones_like(x).numpy().sum() == 2
    assert tp.arange(5).dtype == np.int64 and tp.arange(5).numpy().tolist() == [0, 1, 2, 3, 4]
    assert tp.arange(0.0, 1.0, 0.5).numpy().tolist() == [0.0, 0.5]
    np.testing.assert_allclose(tp.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5))
    np.testing.assert_array_equal(tp.eye(3).numpy(), np.eye(3))
    assert tp.tensor(1.5).dtype == np.float64
    assert tp.tensor([1, 2]).dtype == np.int64
    assert tp.tensor(True).dtype == np.bool_
    assert tp.tensor([1.0], dtype=tp.float32).dtype == np.float32
    assert tp.ones(2, requires_grad=True).requires_grad


def test_numpy_interop_and_attributes():
    x = tp.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 2
    assert isinstance(np.asarray(y), np.ndarray)
    np.testing.assert_array_equal(np.asarray(y), [[2.0, 4.0], [6.0, 8.0]])
    np.testing.assert_array_equal(y.numpy(), np.asarray(y))
    assert y.ndim == 2 and y.numel() == 4 and y.size() == (2, 2) and y.size(0) == 2 and len(y) == 2
    assert y.tolist() == [[2.0, 4.0], [6.0, 8.0]]
    assert float(y[1, 1]) == 8.0
    z = np.ones(2) * x  # NumPy array on the left still records
    assert z.requires_grad and z.grad_fn is not None
    assert [r.numpy().tolist() for r in x] == [[1.0, 2.0], [3.0, 4.0]]
    d = y.detach()
    assert not d.requires_grad and d.is_leaf
    assert "requires_grad=True" in repr(x)
    assert "dtype=tape.float32" in repr(tp.ones(1, dtype=tp.float32))
    with tp.no_grad():
        w = x * 3
    assert not w.requires_grad and w.grad_fn is None
    assert tp.is_grad_enabled()


def test_indexing_views_of_leaves_join_one_graph():
    x = tp.tensor(np.arange(6.0), requires_grad=True)
    a, b = x[1:], x[:-1]
    assert a.requires_grad and not a.is_leaf
    (a * b).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 4.0, 6.0, 8.0, 4.0])


def test_graphs_merge_when_combined():
    w = tp.tensor([1.0, 2.0], requires_grad=True)
    a = (w * 3).sum()
    b = (w * w).sum()
    (a + b).backward()
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 7.0])
    # both partial results still read their values after the merge
    assert a.item() == 9.0 and b.item() == 5.0
