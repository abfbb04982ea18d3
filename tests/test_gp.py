"""The Gaussian-process negative log marginal likelihood of ``tape.bench.gp`` (RBF kernel,
Cholesky): value, gradient and Hessian with respect to the log-hyperparameters, eagerly and on
a recorded tape replayed at new hyperparameters, against central finite differences and the
analytic NumPy/SciPy formula; and a kernel matrix that is not positive definite."""

import numpy as np
import pytest

import tape as tp
from tape.bench import gp
from tape.bench.common import backend

N = 12
X, Y = gp.make_data(N, seed=3)
D = gp.sqdist(X)
THETA0 = np.log([0.6, 1.2, 0.1])
NEW_THETAS = [np.log([0.3, 0.7, 0.02]), np.log([1.5, 2.5, 0.5]), np.array([0.1, -0.4, -1.0])]


def nlml_np(theta):
    return gp.nlml_numpy(np.asarray(theta, np.float64), D, Y)


def grad_np(theta):
    return gp.nlml_grad_numpy(np.asarray(theta, np.float64), X, Y, D)[1]


def central(f, theta, h):
    """Central differences of ``f`` (scalar or vector valued) at ``theta``, one column per
    coordinate."""
    cols = []
    for k in range(len(theta)):
        e = np.zeros_like(theta)
        e[k] = h
        cols.append((np.asarray(f(theta + e)) - np.asarray(f(theta - e))) / (2.0 * h))
    return np.stack(cols, axis=-1)


def nlml_tape(theta, d, ycol, eye):
    return gp.nlml_theta(backend("tape"), [theta], (d, ycol, eye))


@pytest.fixture(scope="module")
def recorded():
    return tp.record(nlml_tape, THETA0, D, Y[:, None], np.eye(N), wrt=0, compile=False)


# ------------------------------------------------------------------ the reference itself


@pytest.mark.parametrize("theta", [THETA0] + NEW_THETAS)
def test_analytic_gradient_matches_finite_differences(theta):
    v, g = gp.nlml_grad_numpy(theta, X, Y, D)
    assert np.isclose(v, nlml_np(theta), rtol=1e-13)
    fd = central(nlml_np, theta, 1e-6)
    np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-7)


def test_value_matches_the_gaussian_density():
    """NLML = -log N(y; 0, K), from the dense K (no Cholesky)."""
    ell2, s2, noise2 = np.exp(2 * THETA0[0]), np.exp(THETA0[1]), np.exp(THETA0[2])
    K = s2 * np.exp(-0.5 * D / ell2) + (noise2 + gp.JITTER) * np.eye(N)
    sign, lad = np.linalg.slogdet(K)
    assert sign > 0
    want = 0.5 * Y @ np.linalg.solve(K, Y) + 0.5 * lad + 0.5 * N * np.log(2 * np.pi)
    assert np.isclose(nlml_np(THETA0), want, rtol=1e-12)


# ------------------------------------------------------------------ eager


@pytest.mark.parametrize("theta", [THETA0] + NEW_THETAS[:1])
def test_eager_backward(theta):
    th = tp.tensor(theta, requires_grad=True)
    loss = nlml_tape(th, tp.tensor(D), tp.tensor(Y[:, None]), tp.tensor(np.eye(N)))
    loss.backward()
    assert np.isclose(float(loss.item()), nlml_np(theta), rtol=1e-12)
    g = th.grad.numpy()
    np.testing.assert_allclose(g, grad_np(theta), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, central(nlml_np, theta, 1e-6), rtol=1e-7, atol=1e-7)


# ------------------------------------------------------------------ recorded tape, replayed


def test_replay_at_new_hyperparameters(recorded):
    for theta in [THETA0] + NEW_THETAS:
        v = recorded.forward(theta, D, Y[:, None], np.eye(N))
        assert np.isclose(float(np.asarray(v)), nlml_np(theta), rtol=1e-12)
        g = np.asarray(recorded.gradient(theta, D, Y[:, None], np.eye(N)))
        np.testing.assert_allclose(g, grad_np(theta), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g, central(nlml_np, theta, 1e-6), rtol=1e-7, atol=1e-7)


def test_replay_with_new_data(recorded):
    """The data are arguments of the tape too: new inputs and targets, same hyperparameters."""
    x2, y2 = gp.make_data(N, seed=11)
    d2 = gp.sqdist(x2)
    g = np.asarray(recorded.gradient(THETA0, d2, y2[:, None], np.eye(N)))
    np.testing.assert_allclose(g, gp.nlml_grad_numpy(THETA0, x2, y2, d2)[1], rtol=1e-10)


def test_hessian(recorded):
    for theta in (THETA0, NEW_THETAS[0]):
        H = np.asarray(recorded.hessian(theta, D, Y[:, None], np.eye(N)))
        assert H.shape == (3, 3)
        fd = central(grad_np, theta, 1e-5)  # fd[i, j] = d g_i / d theta_j
        np.testing.assert_allclose(H, fd, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(H, H.T, rtol=1e-10, atol=1e-12)


def test_hessian_transform():
    H = tp.hessian(nlml_tape)(THETA0, D, Y[:, None], np.eye(N))
    np.testing.assert_allclose(np.asarray(H), central(grad_np, THETA0, 1e-5), rtol=1e-6, atol=1e-6)


def test_gradient_with_respect_to_inputs():
    """``gp-x``: the hyperparameters and the inputs ``x``, against the analytic formula and
    central differences in ``x``."""
    t = tp.record(
        lambda th, x, ycol, eye: gp.nlml_theta_x(backend("tape"), [th, x], (ycol, eye)),
        THETA0, X, Y[:, None], np.eye(N), wrt=[0, 1], compile=False,
    )  # fmt: skip
    x2 = X + 0.05 * np.random.default_rng(5).standard_normal(X.shape)
    gth, gx = t.gradient(THETA0, x2, Y[:, None], np.eye(N))
    _, wth, wx = gp.nlml_grad_numpy(THETA0, x2, Y, wrt_x=True)
    np.testing.assert_allclose(np.asarray(gth), wth, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gx), wx, rtol=1e-10, atol=1e-12)

    def f(xflat):
        return gp.nlml_numpy(THETA0, gp.sqdist(xflat.reshape(X.shape)), Y)

    fd = central(f, x2.ravel(), 1e-6).reshape(X.shape)
    np.testing.assert_allclose(np.asarray(gx), fd, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ not positive definite


def nlml_raw_noise(theta, d, ycol, eye):
    """As the benchmark, with the noise variance itself as ``theta[2]`` (not its log), so
    that a negative value makes ``K`` indefinite."""
    la = tp.linalg
    K = tp.exp(theta[1]) * tp.exp(-0.5 * d / tp.exp(2.0 * theta[0])) + theta[2] * eye
    L = la.cholesky(K)
    z = la.solve_triangular(L, ycol, lower=True)
    return 0.5 * (z * z).sum() + 0.5 * la.logdet_cholesky(L) + 0.5 * N * gp.LOG_2PI


def test_indefinite_kernel_raises_on_replay():
    good = np.array([THETA0[0], THETA0[1], 0.1])
    # the same K as the log-parametrised formula at this noise (less its jitter)
    same = np.array([THETA0[0], THETA0[1], np.log(0.1 - gp.JITTER)])
    want = grad_np(same) / np.array([1.0, 1.0, 0.1 - gp.JITTER])
    t = tp.record(nlml_raw_noise, good, D, Y[:, None], np.eye(N), wrt=0, compile=False)
    np.testing.assert_allclose(np.asarray(t.gradient(good, D, Y[:, None], np.eye(N))), want)
    bad = np.array([THETA0[0], THETA0[1], -0.5])
    K = np.exp(bad[1]) * np.exp(-0.5 * D / np.exp(2 * bad[0])) - 0.5 * np.eye(N)
    assert np.linalg.eigvalsh(K).min() < 0  # really indefinite
    with pytest.raises(np.linalg.LinAlgError):
        t.gradient(bad, D, Y[:, None], np.eye(N))
    with pytest.raises(tp.linalg.LinAlgError):
        t.forward(bad, D, Y[:, None], np.eye(N))
    # the tape is still usable afterwards
    np.testing.assert_allclose(np.asarray(t.gradient(good, D, Y[:, None], np.eye(N))), want)
