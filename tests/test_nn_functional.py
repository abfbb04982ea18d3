"""tape.nn.functional against torch.nn.functional (values and gradients, when torch is
installed), against central finite differences (always), inside recordings, and its errors.

One table (:data:`CASES`) drives every check: each row names a function, its keyword
arguments and generators of its positional arguments (floating arrays are differentiated;
integer arrays are class-index targets).
"""

import math

import numpy as np
import pytest

import tape
import tape.frontend.nn.functional as F

pytestmark = pytest.mark.filterwarnings("ignore:size_average and reduce args")

C = 4  # classes


# ---------------------------------------------------------------- argument generators


def normal(*shape, scale=1.0):
    return lambda rng: scale * rng.standard_normal(shape)


def probs(*shape):
    return lambda rng: rng.uniform(0.05, 0.95, shape)


def simplex(n):
    return lambda rng: rng.dirichlet(np.ones(C), n)


def classes(*shape, ignore=None):
    """Class indices in [0, C); with ``ignore``, the first entry (and one more at random) is
    ``ignore``, so every draw has an ignored and a counted target."""

    def gen(rng):
        t = rng.integers(0, C, shape)
        if ignore is not None:
            t.flat[0] = ignore
            t.flat[rng.integers(1, t.size)] = ignore
        return t

    return gen


W = np.array([0.5, 2.0, 1.0, 1.5])  # class weights
REDUCTIONS = ("none", "mean", "sum")


def _each_reduction(name, fn, gens, **kw):
    return [(f"{name}-{r}", fn, gens, {**kw, "reduction": r}) for r in REDUCTIONS]


# (id, function name, argument generators, keyword arguments)
CASES = [
    *_each_reduction("mse", "mse_loss", (normal(3, 4), normal(3, 4))),
    *_each_reduction("mse-weight", "mse_loss", (normal(3, 4), normal(3, 4)),
                     weight=np.linspace(0.5, 2.0, 12).reshape(3, 4)),
    *_each_reduction("l1", "l1_loss", (normal(3, 4), normal(3, 4))),
    ("l1-weight-mean", "l1_loss", (normal(3, 4), normal(3, 4)),
     {"weight": np.linspace(0.5, 2.0, 12).reshape(3, 4)}),
    *_each_reduction("smooth_l1", "smooth_l1_loss", (normal(3, 4), normal(3, 4))),
    ("smooth_l1-beta", "smooth_l1_loss", (normal(3, 4), normal(3, 4)), {"beta": 0.4}),
    ("smooth_l1-beta0", "smooth_l1_loss", (normal(3, 4), normal(3, 4)), {"beta": 0.0}),
    ("smooth_l1-legacy", "smooth_l1_loss", (normal(3, 4), normal(3, 4)), {"size_average": False}),
    *_each_reduction("bce", "binary_cross_entropy", (probs(3, 4), probs(3, 4))),
    ("bce-weight", "binary_cross_entropy", (probs(3, 4), probs(3, 4)), {"weight": W}),
    *_each_reduction("bce_logits", "binary_cross_entropy_with_logits",
                     (normal(3, 4, scale=3.0), probs(3, 4))),
    *_each_reduction("bce_logits-pos_weight", "binary_cross_entropy_with_logits",
                     (normal(3, 4, scale=3.0), probs(3, 4)), pos_weight=W, weight=W[::-1].copy()),
    *_each_reduction("ce", "cross_entropy", (normal(5, C), classes(5))),
    *_each_reduction("ce-weight", "cross_entropy", (normal(5, C), classes(5)), weight=W),
    *_each_reduction("ce-ignore", "cross_entropy", (normal(5, C), classes(5, ignore=-100)),
                     weight=W),
    ("ce-ignore_index", "cross_entropy", (normal(5, C), classes(5, ignore=1)),
     {"ignore_index": 1}),
    *_each_reduction("ce-smooth", "cross_entropy", (normal(5, C), classes(5, ignore=2)),
                     label_smoothing=0.2, ignore_index=2),
    *_each_reduction("ce-smooth-weight", "cross_entropy", (normal(5, C), classes(5, ignore=-100)),
                     label_smoothing=0.3, weight=W),
    ("ce-unbatched", "cross_entropy", (normal(C), classes()), {}),
    ("ce-unbatched-smooth", "cross_entropy", (normal(C), classes()), {"label_smoothing": 0.1}),
    *_each_reduction("ce-kdim", "cross_entropy", (normal(2, C, 3), classes(2, 3, ignore=-100)),
                     weight=W, label_smoothing=0.1),
    *_each_reduction("ce-probs", "cross_entropy", (normal(5, C), simplex(5))),
    *_each_reduction("ce-probs-weight-smooth", "cross_entropy", (normal(5, C), simplex(5)),
                     weight=W, label_smoothing=0.25),
    ("ce-probs-unbatched", "cross_entropy", (normal(C), lambda rng: rng.dirichlet(np.ones(C))), {}),
    *_each_reduction("nll", "nll_loss", (normal(5, C), classes(5))),
    *_each_reduction("nll-weight-ignore", "nll_loss", (normal(5, C), classes(5, ignore=3)),
                     weight=W, ignore_index=3),
    ("nll-kdim", "nll_loss", (normal(2, C, 3), classes(2, 3, ignore=-100)), {"weight": W}),
    ("nll-unbatched", "nll_loss", (normal(C), classes()), {"reduction": "sum"}),
    ("softmax-0", "softmax", (normal(3, 4),), {"dim": 0}),
    ("softmax-last", "softmax", (normal(2, 3, 4),), {"dim": -1}),
    ("log_softmax-1", "log_softmax", (normal(2, 3, 4),), {"dim": 1}),
    ("relu", "relu", (normal(3, 4),), {}),
    ("leaky_relu", "leaky_relu", (normal(3, 4),), {}),
    ("leaky_relu-slope", "leaky_relu", (normal(3, 4),), {"negative_slope": 0.2}),
    ("elu", "elu", (normal(3, 4),), {}),
    ("elu-alpha", "elu", (normal(3, 4),), {"alpha": 0.7}),
    ("gelu", "gelu", (normal(3, 4, scale=2.0),), {}),
    ("gelu-tanh", "gelu", (normal(3, 4, scale=2.0),), {"approximate": "tanh"}),
    ("silu", "silu", (normal(3, 4),), {}),
    ("sigmoid", "sigmoid", (normal(3, 4),), {}),
    ("tanh", "tanh", (normal(3, 4),), {}),
    ("softplus", "softplus", (normal(3, 4, scale=3.0),), {}),
    ("softplus-beta-threshold", "softplus", (normal(3, 4, scale=3.0),),
     {"beta": 2.0, "threshold": 3.0}),
    ("linear", "linear", (normal(3, 4), normal(2, 4), normal(2)), {}),
    ("linear-nobias", "linear", (normal(3, 4), normal(2, 4)), {}),
    ("linear-4d", "linear", (normal(2, 1, 2, 4), normal(3, 4), normal(3)), {}),
    ("linear-vec-weight", "linear", (normal(3, 4), normal(4)), {}),
    ("normalize", "normalize", (normal(3, 4),), {}),
    ("normalize-p1-dim0", "normalize", (normal(3, 4),), {"p": 1.0, "dim": 0}),
    ("normalize-p3", "normalize", (normal(3, 4),), {"p": 3.0, "dim": -1}),
    ("normalize-inf", "normalize", (normal(3, 4),), {"p": math.inf}),
]  # fmt: skip
IDS = [c[0] for c in CASES]


def _draw(gens, seed):
    rng = np.random.default_rng(seed)
    return [g(rng) for g in gens]


def _is_float(a):
    return np.asarray(a).dtype.kind == "f"


def _seed_like(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def _tape_eager(name, args, kw, seed):
    """Value and gradients (of ``<seed, f>``) of tape's function, eagerly."""
    ts = [tape.tensor(a, requires_grad=_is_float(a)) for a in args]
    out = getattr(F, name)(*ts, **kw)
    u = _seed_like(out.shape, seed)
    out.backward(u)
    return out.numpy(), [t.grad.numpy() for t in ts if _is_float(t.numpy())]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_torch(case):
    """Values and gradients against torch.nn.functional in float64."""
    torch = pytest.importorskip("torch")
    _, name, gens, kw = case
    args = _draw(gens, 0)
    tts = [torch.tensor(a, requires_grad=_is_float(a)) for a in args]
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    try:
        want = getattr(torch.nn.functional, name)(*tts, **tkw)
    except TypeError as e:  # an older torch without this keyword (mse_loss's weight)
        pytest.skip(f"torch does not support this call: {e}")
    got, grads = _tape_eager(name, args, kw, seed=1)
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    want.backward(torch.tensor(_seed_like(got.shape, 1)))
    tgrads = [t.grad for t in tts if t.requires_grad]
    for k, (g, tg) in enumerate(zip(grads, tgrads)):
        tg = np.zeros_like(g) if tg is None else tg.numpy()
        np.testing.assert_allclose(g, tg, rtol=1e-9, atol=1e-12, err_msg=f"argument {k}")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradcheck(case):
    """Gradients (every floating argument) against central finite differences; no torch."""
    _, name, gens, kw = case
    fn = getattr(F, name)
    assert tape.gradcheck(lambda *a: fn(*a, **kw), *_draw(gens, 0), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_recorded_replay_matches_eager(case):
    """Recorded at one draw (targets recorded as arguments too), replayed at another: the
    gradient equals the eager one there."""
    _, name, gens, kw = case
    fn = getattr(F, name)
    x0, x1 = _draw(gens, 0), _draw(gens, 5)
    got1, grads1 = _tape_eager(name, x1, kw, seed=2)
    u = _seed_like(got1.shape, 2)
    t = tape.record(lambda *a: tape.sum(fn(*a, **kw) * u), *x0)
    g = t.gradient(*x1)
    g = g if isinstance(g, tuple) else (g,)
    assert len(g) == len(grads1)
    for a, b in zip(g, grads1):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(t.forward(*x1), np.sum(got1 * u), rtol=1e-12)


def test_recorded_cross_entropy_closing_over_target():
    target = np.array([0, 3, 1, -100, 2])
    x0, x1 = _draw((normal(5, C), normal(5, C)), 3)
    t = tape.record(lambda x: F.cross_entropy(x, target, label_smoothing=0.1), x0)
    x = tape.tensor(x1, requires_grad=True)
    F.cross_entropy(x, target, label_smoothing=0.1).backward()
    np.testing.assert_allclose(t.gradient(x1), x.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_cross_entropy_with_data_targets_is_one_entry_and_follows_writes():
    # class indices that are data: -log_softmax(x)[t] as one cross_entropy entry, then the
    # mean (a sum and a division); a label tensor written in place between steps is read anew
    x0 = _draw((normal(5, C),), 4)[0]
    labels = tape.tensor(np.array([0, 3, 1, 1, 2]))
    x = tape.tensor(x0, requires_grad=True)
    loss = F.cross_entropy(x, labels)
    ops = [tape.registry.OPS[c].name for c in loss._tape.entries[: loss._tape.n_entries, 0]]
    assert ops == ["cross_entropy", "sum", "div"]
    for new in (np.array([2, 2, 0, 3, 1]), np.array([1, 0, 3, 3, 0])):
        with tape.no_grad():
            labels.copy_(tape.tensor(new))
        x.grad = None
        F.cross_entropy(x, labels).backward()
        want = F.cross_entropy(tape.tensor(x0, requires_grad=True), new)
        np.testing.assert_array_equal(F.cross_entropy(x, labels).item(), want.item())
        p = np.exp(x0 - x0.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(5), new] -= 1.0
        np.testing.assert_allclose(x.grad.numpy(), p / 5, rtol=1e-13, atol=1e-15)


def test_cross_entropy_of_masked_logits():
    # -inf logits (masked classes), the first of a row among them: the loss and its gradient
    # are those of the remaining classes (a row starting with -inf once summed to NaN)
    x = np.array([[-np.inf, 1.0, 2.0], [0.5, -np.inf, -1.0]])
    t = np.array([2, 0])
    xt = tape.tensor(x, requires_grad=True)
    loss = F.cross_entropy(xt, tape.tensor(t), reduction="sum")
    finite = [x[0, 1:], x[1, [0, 2]]]
    want = sum(np.log(np.exp(r).sum()) - r[k] for r, k in zip(finite, [1, 0]))
    np.testing.assert_allclose(loss.item(), want, rtol=1e-14)
    loss.backward()
    p0 = np.exp(finite[0]) / np.exp(finite[0]).sum()
    p1 = np.exp(finite[1]) / np.exp(finite[1]).sum()
    want_g = [[0.0, p0[0], p0[1] - 1.0], [p1[0] - 1.0, 0.0, p1[1]]]
    np.testing.assert_allclose(xt.grad.numpy(), want_g, rtol=1e-14, atol=1e-15)


def test_recorded_target_out_of_range_raises_at_replay():
    x0 = np.zeros((3, C))
    t = tape.record(lambda x, y: F.cross_entropy(x, y), x0, np.array([0, 1, 2]))
    for bad in (C, -1):
        with pytest.raises(IndexError, match="out of bounds"):
            t.gradient(x0, np.array([0, bad, 2]))


def test_misc_torch_conventions():
    x = tape.tensor([-1.0, 0.0, 2.0])
    assert F.relu(x, inplace=True) is x
    np.testing.assert_array_equal(x.numpy(), [0.0, 0.0, 2.0])
    with pytest.warns(UserWarning, match="Implicit dimension"):
        s = F.softmax(tape.tensor(np.zeros((2, 3))))  # dim 1 for 2-D input
    np.testing.assert_allclose(s.numpy(), np.full((2, 3), 1 / 3))
    with pytest.warns(UserWarning, match="reduction='sum'"):
        v = F.mse_loss(x, tape.zeros(3), size_average=False)
    assert v.item() == pytest.approx(4.0)
    with pytest.warns(UserWarning, match="different to the input size"):
        F.mse_loss(tape.zeros(2, 3), tape.zeros(3))
    # extreme probabilities: logs clamped at -100, no NaN in the gradient
    p = tape.tensor([0.0, 1.0], requires_grad=True)
    loss = F.binary_cross_entropy(p, tape.tensor([1.0, 0.0]), reduction="sum")
    assert loss.item() == pytest.approx(200.0)
    loss.backward()
    assert np.isfinite(p.grad.numpy()).all()
    # stable logits: no overflow
    z = tape.tensor([800.0, -800.0], requires_grad=True)
    loss = F.binary_cross_entropy_with_logits(z, tape.tensor([1.0, 0.0]))
    loss.backward()
    assert loss.item() == 0.0 and np.isfinite(z.grad.numpy()).all()
    assert np.isfinite(F.elu(tape.tensor([1000.0]), alpha=2.0).numpy()).all()
    # every target ignored: the mean is 0/0, as in PyTorch
    assert np.isnan(F.cross_entropy(tape.zeros(2, C), np.array([-100, -100])).item())


X = np.zeros((3, C))
ERRORS = [
    (lambda: F.mse_loss(X, X, reduction="avg"), ValueError, "mse_loss: 'avg' is not a valid"),
    (lambda: F.cross_entropy(X, [0, 1, 2], reduction="bad"), ValueError, "not a valid value"),
    (lambda: F.mse_loss(X, np.zeros(5)), RuntimeError, r"mse_loss: .*\(5,\).*\(3, 4\)"),
    (lambda: F.mse_loss(X, X, weight=np.ones(4)), ValueError, "Weights and input"),
    (lambda: F.binary_cross_entropy(X + 0.5, np.zeros(4)), ValueError,
     r"binary_cross_entropy: .*target size \(\(4,\)\).*input size \(\(3, 4\)\)"),
    (lambda: F.binary_cross_entropy(X + 1.5, X), RuntimeError, "between 0 and 1, got 1.5"),
    (lambda: F.binary_cross_entropy(X + 0.5, X, weight=np.ones(3)), RuntimeError,
     r"weight of shape \(3,\)"),
    (lambda: F.binary_cross_entropy_with_logits(X, X[0]), ValueError,
     r"Target size \(\(4,\)\) must be the same as input size \(\(3, 4\)\)"),
    (lambda: F.binary_cross_entropy_with_logits(X, X, pos_weight=np.ones(3)), RuntimeError,
     r"pos_weight of shape \(3,\) cannot be broadcast"),
    (lambda: F.cross_entropy(X, [0, 5, 1]), IndexError, "cross_entropy: Target 5 is out of bounds"),
    (lambda: F.nll_loss(X, [0, -1, 1]), IndexError, "nll_loss: Target -1 is out of bounds"),
    (lambda: F.cross_entropy(X, [0, 1]), ValueError,
     r"Expected input batch_size \(3\) to match target batch_size \(2\)"),
    (lambda: F.nll_loss(np.zeros((2, C, 3)), np.zeros((2, 4), int)), RuntimeError,
     r"Expected target size \(2, 3\), got \(2, 4\)"),
    (lambda: F.nll_loss(np.zeros(C), [1]), ValueError, "must be a 0-d class index"),
    (lambda: F.nll_loss(np.float64(1.0), 0), ValueError, r"Expected 1 or more dimensions"),
    (lambda: F.cross_entropy(X, np.array([0.0, 1.0, 2.0])), RuntimeError,
     "expected target dtype to be an integer type"),
    (lambda: F.cross_entropy(X, np.zeros((3, C), int)), RuntimeError,
     "Expected floating point type for target with class probabilities"),
    (lambda: F.cross_entropy(X, X, ignore_index=1), RuntimeError, "ignore_index is not supported"),
    (lambda: F.cross_entropy(X, [0, 1, 2], weight=np.ones(3)), RuntimeError,
     r"defined either for all 4 classes .* shape: \(3,\)"),
    (lambda: F.cross_entropy(X, [0, 1, 2], label_smoothing=1.5), ValueError, "label_smoothing"),
    (lambda: F.smooth_l1_loss(X, X, beta=-1.0), ValueError, "negative values for beta"),
    (lambda: F.gelu(X, approximate="fast"), ValueError, "either 'none' or 'tanh'"),
    (lambda: F.softmax(X, dim=2), IndexError,
     r"softmax: Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
    (lambda: F.normalize(np.zeros(4)), IndexError, "normalize: Dimension out of range"),
    (lambda: F.linear(X, np.zeros((5, 3))), RuntimeError,
     r"linear: mat1 and mat2 shapes cannot be multiplied \(3x4 and 3x5\)"),
    (lambda: F.linear(X, np.zeros((5, 4)), np.zeros(4)), RuntimeError,
     r"linear: bias of shape \(4,\) does not match the output's shape \(3, 5\)"),
    (lambda: F.relu(tape.zeros(3, requires_grad=True), inplace=True), RuntimeError,
     r"relu\(inplace=True\)"),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(ERRORS)))
def test_errors(k):
    fn, exc, match = ERRORS[k]
    with pytest.raises(exc, match=match):
        fn()


# ---------------------------------------------------------------- one_hot, dropout


def test_one_hot_matches_numpy_and_checks_range():
    t = tape.tensor([[0, 2], [1, 3]])
    got = F.one_hot(t)
    want = np.eye(4, dtype=np.int64)[t.numpy()]
    assert got.dtype == np.int64 and got.shape == (2, 2, 4)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(F.one_hot(np.array([1]), num_classes=3).numpy(), [[0, 1, 0]])
    with pytest.raises(RuntimeError, match="in \\[0, 3\\)"):
        F.one_hot(tape.tensor([3]), num_classes=3)
    with pytest.raises(RuntimeError, match="index tensors"):
        F.one_hot(tape.tensor([1.0]))


def test_one_hot_recorded_follows_new_targets():
    logits = np.linspace(-1, 1, 12).reshape(4, 3)

    def f(x, t):
        return (x * F.one_hot(t, num_classes=3)).sum()

    rec = tape.record(f, logits, np.array([0, 1, 2, 0]))
    for t in (np.array([2, 2, 1, 0]), np.array([1, 0, 0, 2])):
        want = logits[np.arange(4), t].sum()
        np.testing.assert_allclose(rec.forward(logits, t), want, rtol=1e-14)


def test_dropout_scales_the_kept_elements_and_is_reproducible():
    x = tape.ones(1000, requires_grad=True)
    tape.manual_seed(3)
    y = F.dropout(x, p=0.25)
    v = y.detach().numpy()
    assert set(np.unique(v)) <= {0.0, 1.0 / 0.75}
    assert 0.65 < (v > 0).mean() < 0.85
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), v)  # the gradient is the mask, scaled
    tape.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, p=0.25).detach().numpy(), v)
    assert F.dropout(x, p=0.25, training=False) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, p=1.5)
    with pytest.raises(NotImplementedError, match="frozen"):
        tape.record(lambda z: F.dropout(z, 0.5).sum(), np.ones(3))
    t = tape.record(lambda z: F.dropout(z, 0.5, training=False).sum(), np.ones(3))
    assert t.forward(np.full(3, 2.0)) == 6.0
