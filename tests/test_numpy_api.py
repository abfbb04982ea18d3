"""NumPy and SciPy calls on tensors (``tape.frontend.numpy_api``): every mapped ufunc and
function against NumPy's values and finite differences, mixed arrays and tensors, and the
calls that must refuse (a traced tensor through a function with no tape op, ``out=``)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import scipy.special as sp

import tape as tp
from tape.frontend import numpy_api
from tape.ops.registry import BY_NAME, OPS

# the registry op behind each of NumPy's other spellings (for its sampling domain)
ALIASES = {
    "subtract": "sub", "multiply": "mul", "divide": "div", "negative": "neg", "power": "pow",
    "float_power": "pow", "absolute": "abs", "fabs": "abs", "gammaln": "lgamma", "psi": "digamma",
    "expit": "sigmoid",
}  # fmt: skip
NOT_DIFFERENTIABLE = {
    "less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "logical_and",
    "logical_or", "logical_xor", "logical_not", "isnan", "isinf", "isfinite", "floor", "ceil",
    "trunc", "rint", "sign", "floor_divide",
}  # fmt: skip
# registry ops that NumPy and SciPy have no ufunc for (reached as tape functions only), and
# the ones reached through a NumPy function rather than a ufunc
TAPE_ONLY = {"relu", "softplus", "stop_gradient", "round", "where", "clip"}


def _domain(name, k):
    op = BY_NAME.get(ALIASES.get(name, name))
    if op is not None and op.kind != "structural":
        return op.domain_of(k)
    return {"logit": (0.1, 0.9), "deg2rad": (-2, 2)}.get(name, (0.2, 0.9))


def _inputs(u, name, rng):
    return [rng.uniform(*_domain(name, k), 5) for k in range(u.nin)]


UFUNCS = sorted(numpy_api.UFUNCS.items(), key=lambda kv: kv[0].__name__) + sorted(
    numpy_api.scipy_ufuncs().items(), key=lambda kv: "sp." + kv[0].__name__
)
IDS = [("" if u in numpy_api.UFUNCS else "sp.") + u.__name__ for u, _ in UFUNCS]


@pytest.mark.parametrize("u,f", UFUNCS, ids=IDS)
def test_ufunc_on_tensors_records_the_mapped_op(u, f, rng):
    name = u.__name__
    xs = _inputs(u, name, rng)
    want = u(*xs)
    got = u(*[tp.tensor(x) for x in xs])
    assert isinstance(got, tp.Tensor), type(got)
    np.testing.assert_allclose(np.asarray(got.numpy(), float), want, rtol=1e-12, atol=1e-12)
    # mixed: the first argument a plain array, the others tensors (a constant and variables)
    if u.nin == 2:
        mixed = u(xs[0], tp.tensor(xs[1]))
        np.testing.assert_allclose(np.asarray(mixed.numpy(), float), want, rtol=1e-12, atol=1e-12)
    if name in NOT_DIFFERENTIABLE:
        t = tp.record(lambda *a: u(*a) * 1.0, *xs)  # records (bool -> float), no gradient
        np.testing.assert_array_equal(t.forward(*xs), want * 1.0)
        return
    t = tp.record(lambda *a: u(*a).sum(), *xs)
    np.testing.assert_allclose(t.forward(*xs), want.sum(), rtol=1e-12)
    assert tp.gradcheck(lambda *a: u(*a), *xs)


def test_every_elementwise_op_is_reachable_from_numpy_or_scipy():
    reached = {f for f in numpy_api.UFUNCS.values()} | set(numpy_api.scipy_ufuncs().values())
    names = {getattr(f, "__name__", "") for f in reached}
    missing = [
        op.name for op in OPS
        if op.kind != "structural" and op.name not in TAPE_ONLY and op.name not in names
    ]  # fmt: skip
    assert not missing, f"registry ops with no NumPy/SciPy ufunc mapped to them: {missing}"
    # and every mapped ufunc is one NumPy or SciPy exports under its name
    for u in numpy_api.UFUNCS:
        assert getattr(np, u.__name__) is u
    for u in numpy_api.scipy_ufuncs():
        assert getattr(sp, u.__name__) is u


A = np.random.default_rng(3).uniform(-1.0, 1.0, (3, 4))
B = np.random.default_rng(4).uniform(-1.0, 1.0, (4, 2))
V = np.random.default_rng(5).uniform(0.5, 1.5, 4)
W = np.random.default_rng(6).uniform(-1.0, 1.0, 4)
M = np.eye(3) * 3.0 + np.random.default_rng(7).uniform(-0.5, 0.5, (3, 3))
S = M @ M.T
P = np.random.default_rng(8).uniform(0.5, 1.5, (3, 4))

la = np.linalg
FUNCTION_CASES = [
    ("sum", lambda x: np.sum(x), [A]),
    ("sum axis keepdims", lambda x: np.sum(x, axis=0, keepdims=True), [A]),
    ("mean", lambda x: np.mean(x, axis=1), [A]),
    ("prod", lambda x: np.prod(x, axis=1), [P]),
    ("max", lambda x: np.max(x, axis=1), [A]),
    ("amin", lambda x: np.amin(x), [A]),
    ("var ddof", lambda x: np.var(x, ddof=1), [A]),
    ("std axis", lambda x: np.std(x, axis=0), [A]),
    ("dot", lambda x, y: np.dot(x, y), [A, B]),
    ("inner", lambda x, y: np.inner(x, y), [V, W]),
    ("outer", lambda x, y: np.outer(x, y), [V, W]),
    ("tensordot", lambda x, y: np.tensordot(x, y, axes=1), [A, B]),
    ("einsum", lambda x, y: np.einsum("ij,jk->ik", x, y), [A, B]),
    ("matmul ufunc", lambda x, y: np.matmul(x, y), [A, B]),
    ("where", lambda x, y: np.where(x > 0, x, y), [V - 1.0, W]),
    ("concatenate", lambda x, y: np.concatenate([x, y]), [V, W]),
    ("stack", lambda x, y: np.stack([x, y], axis=1), [V, W]),
    ("hstack", lambda x, y: np.hstack([x, y]), [V, W]),
    ("vstack", lambda x, y: np.vstack([x, y]), [V, W]),
    ("reshape", lambda x: np.reshape(x, (4, 3)), [A]),
    ("reshape -1", lambda x: np.reshape(x, -1), [A]),
    ("transpose", lambda x: np.transpose(x), [A]),
    ("clip", lambda x: np.clip(x, -0.5, 0.5), [A]),
    ("cumsum", lambda x: np.cumsum(x, axis=1), [A]),
    ("cumprod", lambda x: np.cumprod(x), [P]),
    ("sort", lambda x: np.sort(x, axis=0), [A]),
    ("trace", lambda x: np.trace(x), [M]),
    ("diagonal", lambda x: np.diagonal(x), [M]),
    ("squeeze", lambda x: np.squeeze(np.expand_dims(x, 0)), [A]),
    ("expand_dims", lambda x: np.expand_dims(x, (0, 2)), [A]),
    ("broadcast_to", lambda x: np.broadcast_to(x, (3, 4)), [V]),
    ("moveaxis", lambda x: np.moveaxis(x, 0, 1), [A]),
    ("swapaxes", lambda x: np.swapaxes(x, 0, 1), [A]),
    ("flip", lambda x: np.flip(x, 0), [A]),
    ("roll", lambda x: np.roll(x, 1, axis=1), [A]),
    ("tile", lambda x: np.tile(x, (2, 1)), [A]),
    ("repeat", lambda x: np.repeat(x, 2, axis=0), [A]),
    ("split", lambda x: np.split(x, 2, axis=1)[1], [A]),
    ("pad", lambda x: np.pad(x, 1), [A]),
    ("take axis", lambda x: np.take(x, [0, 2], axis=1), [A]),
    ("take flat", lambda x: np.take(x, [1, 5, 1]), [A]),
    ("take_along_axis", lambda x: np.take_along_axis(x, np.array([[0], [2], [1]]), axis=1), [A]),
    ("diff", lambda x: np.diff(x, axis=1), [A]),
    ("diff n=2", lambda x: np.diff(x, n=2), [A]),
    ("add.reduce", lambda x: np.add.reduce(x, axis=1), [A]),
    ("multiply.reduce", lambda x: np.multiply.reduce(x), [P]),
    ("maximum.reduce", lambda x: np.maximum.reduce(x, axis=1), [A]),
    ("logaddexp.reduce", lambda x: np.logaddexp.reduce(x, axis=1), [A]),
    ("add.accumulate", lambda x: np.add.accumulate(x, axis=1), [A]),
    ("multiply.accumulate", lambda x: np.multiply.accumulate(x), [P]),
    ("logaddexp.accumulate", lambda x: np.logaddexp.accumulate(x, axis=0), [A]),
    ("norm", lambda x: la.norm(x), [A]),
    ("norm axis", lambda x: la.norm(x, axis=1), [A]),
    ("solve", lambda m, v: la.solve(m, v), [M, V[:3]]),
    ("cholesky", lambda s: la.cholesky(s), [S]),
    ("slogdet", lambda m: la.slogdet(m)[1], [M]),
    ("det", lambda m: la.det(m), [M]),
    ("inv", lambda m: la.inv(m), [M]),
    ("eigvalsh", lambda s: la.eigvalsh(s), [S]),
    ("deg2rad", lambda x: np.deg2rad(x) + np.radians(x), [A]),
]


@pytest.mark.parametrize("name,f,xs", FUNCTION_CASES, ids=[c[0] for c in FUNCTION_CASES])
def test_numpy_function_on_tensors_records(name, f, xs):
    want = f(*xs)
    got = f(*[tp.tensor(x) for x in xs])
    assert isinstance(got, tp.Tensor), type(got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    assert tp.gradcheck(f, *xs)


def test_index_and_shape_functions():
    x = tp.tensor(A)
    np.testing.assert_array_equal(np.argmax(x, axis=1).numpy(), np.argmax(A, axis=1))
    np.testing.assert_array_equal(np.argsort(x, axis=0).numpy(), np.argsort(A, axis=0))
    assert np.shape(x) == A.shape and np.ndim(x) == 2 and np.size(x) == 12
    np.testing.assert_array_equal(np.zeros_like(x).numpy(), np.zeros_like(A))
    assert np.allclose(x, A) and bool(np.all(np.isclose(x, A)))


def test_a_numpy_function_as_written_differentiates():
    def f(x):
        return np.sum(np.sin(x) * x) + np.dot(x, x)

    x = np.linspace(-1.0, 2.0, 7)
    t = tp.record(f, x)
    np.testing.assert_allclose(t.forward(x), f(x), rtol=1e-13)
    want = np.sin(x) + x * np.cos(x) + 2 * x
    np.testing.assert_allclose(t.gradient(x), want, rtol=1e-13)
    x2 = x[::-1].copy()
    np.testing.assert_allclose(t.gradient(x2), np.sin(x2) + x2 * np.cos(x2) + 2 * x2, rtol=1e-13)
    # eager, PyTorch style
    xt = tp.tensor(x, requires_grad=True)
    f(xt).backward()
    np.testing.assert_allclose(xt.grad.numpy(), want, rtol=1e-13)


def test_scipy_special_functions_as_written_differentiate():
    def f(x, k):
        return np.sum(sp.gammaln(x) + sp.xlogy(k, x) - sp.expit(x) * sp.erf(x) + sp.logit(x / 4))

    x = np.linspace(0.5, 3.0, 6)
    k = np.arange(6.0)
    t = tp.record(f, x, k, wrt=[0])
    np.testing.assert_allclose(t.forward(x, k), f(x, k), rtol=1e-12)
    assert tp.gradcheck(lambda a: f(a, k), x)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_gradients_equal_jaxs_on_the_same_function():
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def make(m):
        def f(x, y):
            h = m.tanh(m.dot(x, y)) + m.exp(-(x**2))
            return m.sum(m.logaddexp(h, 0.5) * m.sqrt(m.abs(x) + 1.0)) / m.max(m.abs(h))

        return f

    x = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    y = np.linspace(0.5, -0.5, 16).reshape(4, 4)
    t = tp.record(make(np), x, y)
    gx, gy = t.gradient(x, y)
    jx, jy = jax.grad(make(jnp), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, np.asarray(jx), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gy, np.asarray(jy), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- nothing silent


def test_a_numpy_function_without_a_tape_op_refuses_a_traced_tensor():
    x = np.linspace(0.1, 1.0, 8)
    with pytest.raises(TypeError, match=r"numpy\.fft\.fft has no tape op"):
        tp.record(lambda a: np.sum(np.abs(np.fft.fft(a))), x)
    leaf = tp.tensor(x, requires_grad=True)
    with pytest.raises(TypeError, match=r"numpy\.fft\.fft"):
        np.fft.fft(leaf)
    with pytest.raises(TypeError, match=r"scipy\.special\.gamma has no tape op"):
        sp.gamma(leaf)
    with pytest.raises(TypeError, match=r"numpy\.add\.at"):
        np.add.at(leaf, [0], 1.0)


def test_untraced_tensors_run_numpys_own_implementation():
    x = np.linspace(0.1, 1.0, 8)
    np.testing.assert_allclose(np.fft.fft(tp.tensor(x)), np.fft.fft(x))
    np.testing.assert_allclose(sp.gamma(tp.tensor(x)), sp.gamma(x))


def test_writing_into_an_array_refuses_a_traced_tensor():
    leaf = tp.tensor(V, requires_grad=True)
    out = np.zeros(4)
    with pytest.raises(TypeError, match=r"numpy\.add\(\.\.\., out=\.\.\.\) writes into an array"):
        np.add(W, leaf, out=out)
    with pytest.raises(TypeError, match="writes into an array"):
        out += leaf
    np.add(W, tp.tensor(V), out=out)  # an untraced tensor: NumPy writes the value
    np.testing.assert_array_equal(out, W + V)
    with pytest.raises(TypeError, match="out="):
        np.sum(leaf, out=np.zeros(()))


def test_arrays_and_numpy_scalars_mix_with_tensors():
    x = tp.tensor(V, requires_grad=True)
    y = W * x + np.float64(2.0) * x - V / x + (x > W)
    assert isinstance(y, tp.Tensor)
    np.testing.assert_allclose(y.numpy(), W * V + 2.0 * V - 1.0 + (V > W), rtol=1e-14)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), W + 2.0 + V / V**2, rtol=1e-14)


def test_asarray_keeps_taking_a_guarded_constant():
    x = np.linspace(0.1, 1.0, 4)
    t = tp.record(lambda a: (a * float(np.asarray(a).sum())).sum(), x)
    np.testing.assert_allclose(t.gradient(x), np.full(4, x.sum()), rtol=1e-14)
