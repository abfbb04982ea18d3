"""Forward mode, Jacobians, Hessians, Hessian-vector products and sparse derivatives
(:mod:`tape.derivatives`, :mod:`tape.sparse`, :mod:`tape.transforms`, :mod:`tape.optimize`,
:mod:`tape.autograd`), against central finite differences and NumPy formulas in float64.

Every op's tangent rule is checked against finite differences of its forward rule and against
its reverse rule (``<J v, u> == <v, J^T u>``), and its second-order rule (the tangent of its
reverse rule) against finite differences of the gradient, over the shapes of
``tests/test_ops.py``; structural ops over its ``KERNEL_CASES``.
"""

import numpy as np
import pytest
import scipy.sparse as sps
from test_ops import DIFFERENTIABLE, KERNEL_CASES, fn_of, shapes_for

import tape as tp
from tape.bench.ba import residual as ba_residual
from tape.frontend.testing import sample_inputs as sample
from tape.ops.registry import OPS, missing_facts


def fd_jvp(f, xs, vs, eps=1e-6):
    xp = [x + eps * v for x, v in zip(xs, vs)]
    xm = [x - eps * v for x, v in zip(xs, vs)]
    return (np.asarray(f(*xp), float) - np.asarray(f(*xm), float)) / (2 * eps)


def fd_hvp(t, xs, vs, eps=1e-6):
    gp = t.gradient(*[x + eps * v for x, v in zip(xs, vs)])
    gm = t.gradient(*[x - eps * v for x, v in zip(xs, vs)])
    gp = gp if isinstance(gp, tuple) else (gp,)
    gm = gm if isinstance(gm, tuple) else (gm,)
    return [(a - b) / (2 * eps) for a, b in zip(gp, gm)]


# ---------------------------------------------------------------- every op


def test_every_differentiable_kernel_op_has_derivative_facts():
    for op in OPS:
        assert missing_facts(op) == [], (op.name, missing_facts(op))
        if op.kind == "structural" and any(op.differentiable):
            assert op.jvp is not None and op.hvp is not None and op.sparsity is not None


@pytest.mark.parametrize("op", DIFFERENTIABLE, ids=lambda o: o.name)
def test_elementwise_tangent_and_second_order(op, rng):
    wrt = [k for k, d in enumerate(op.differentiable) if d]
    rtol, atol = op.fd_tol
    for shapes in shapes_for(op):
        xs = sample(op, shapes, rng)
        out_shape = np.broadcast_shapes(*[np.shape(x) for x in xs])
        t = tp.record(lambda *a: fn_of(op)(*a), *xs, wrt=wrt)
        vs = [rng.standard_normal(np.shape(xs[k])) for k in wrt]
        full = [np.zeros(np.shape(x)) for x in xs]
        for k, v in zip(wrt, vs):
            full[k] = v
        _, jv = t.jvp(*xs, tangents=tuple(vs))
        want = fd_jvp(lambda *a: op.ref(*a), xs, full)
        np.testing.assert_allclose(jv, want, rtol=rtol, atol=atol, err_msg=f"{op.name} {shapes}")
        # second order through a weighted sum (random weights: no cancellation)
        w = rng.uniform(0.5, 1.5, out_shape)
        assert tp.gradcheck(lambda *a: (fn_of(op)(*a) * w).sum(), *xs, wrt=wrt, order=2,
                            atol=atol, rtol=rtol)  # fmt: skip


KCASES = [(name, k, case) for name, cases in KERNEL_CASES.items() for k, case in enumerate(cases)]


@pytest.mark.parametrize("name,k,case", KCASES, ids=[f"{n}-{k}" for n, k, _ in KCASES])
def test_kernel_op_tangent_and_second_order(name, k, case, rng):
    fn, ref, xs = case
    t = tp.record(fn, *xs)
    vs = [rng.standard_normal(np.shape(x)) for x in xs]
    _, jv = t.jvp(*xs, tangents=tuple(vs))
    np.testing.assert_allclose(jv, fd_jvp(ref, xs, vs), rtol=1e-6, atol=1e-7)
    # through sin: the second order passes the kernel's jvp and hvp both ways
    w = rng.uniform(0.5, 1.5, np.shape(ref(*xs)))
    assert tp.gradcheck(lambda *a: (tp.sin(fn(*a)) * w).sum(), *xs, order=2)


def test_prod_second_order_with_zero_factors(rng):
    for x in (np.array([0.0, 2.0, 3.0, -1.5]), np.array([0.0, 2.0, 0.0, 1.5]),
              np.array([0.0, 0.0, 0.0, 1.5])):  # fmt: skip
        t = tp.record(lambda x: tp.prod(x), x)
        H = t.hessian(x)
        want = np.zeros((4, 4))
        for i in range(4):
            for j in range(4):
                if i != j:
                    want[i, j] = np.prod(np.delete(x, [i, j]))
        np.testing.assert_array_equal(H, want)
        v = rng.standard_normal(4)
        _, jv = t.jvp(x, tangents=v)
        g = np.array([np.prod(np.delete(x, i)) for i in range(4)])
        np.testing.assert_allclose(jv, g @ v, rtol=1e-14, atol=1e-14)


# ---------------------------------------------------------------- drivers


def two_in_two_out(x, y):
    # broadcasting (3, 1) against (4,), a matmul, a reduction: two outputs
    a = tp.sin(x) * y + x**2
    return tp.tanh(a @ np.linspace(-1, 1, 4)), (a * a).sum()


def ref_two(x, y):
    a = np.sin(x) * y + x**2
    return np.tanh(a @ np.linspace(-1, 1, 4)), (a * a).sum()


def fd_jacobian(f, xs, k, out):
    x = xs[k]
    cols = []
    for j in range(x.size):
        e = np.zeros(x.size)
        e[j] = 1.0
        vs = [np.zeros_like(a) for a in xs]
        vs[k] = e.reshape(x.shape)
        cols.append(np.asarray(fd_jvp(lambda *a: f(*a)[out], xs, vs)).ravel())
    return np.stack(cols, axis=-1)


def test_jacobian_modes_shapes_and_finite_differences(rng):
    x, y = rng.standard_normal((3, 1)), rng.standard_normal(4)
    t = tp.record(two_in_two_out, x, y)
    x1, y1 = x + 0.1, y - 0.2
    Jf = t.jacobian(x1, y1, mode="fwd")
    Jr = t.jacobian(x1, y1, mode="rev")
    Ja = t.jacobian(x1, y1)
    outs = ref_two(x1, y1)
    for o in range(2):
        for k, arg in enumerate((x1, y1)):
            shape = np.shape(outs[o]) + arg.shape
            assert Jf[o][k].shape == shape and Jr[o][k].shape == shape
            np.testing.assert_allclose(Jf[o][k], Jr[o][k], rtol=1e-13, atol=1e-13)
            np.testing.assert_array_equal(Ja[o][k], Jr[o][k])  # 7 inputs > 4 outputs: reverse
            num = fd_jacobian(ref_two, [x1, y1], k, o).reshape(shape)
            np.testing.assert_allclose(Jf[o][k], num, rtol=1e-6, atol=1e-8)


def test_single_output_single_argument_jacobian_is_an_array(rng):
    x = rng.standard_normal(5)
    t = tp.record(lambda x: tp.exp(x[1:]) * x[:-1], x)
    J = t.jacobian(x)
    want = np.zeros((4, 5))
    for i in range(4):
        want[i, i] = np.exp(x[i + 1])
        want[i, i + 1] = np.exp(x[i + 1]) * x[i]
    np.testing.assert_allclose(J, want, rtol=1e-14)
    np.testing.assert_allclose(t.jacobian(x, mode="rev"), want, rtol=1e-14)


def test_jvp_and_vjp_values_and_structure(rng):
    x, y = rng.standard_normal((3, 1)), rng.standard_normal(4)
    t = tp.record(two_in_two_out, x, y)
    vx, vy = rng.standard_normal((3, 1)), rng.standard_normal(4)
    val, tan = t.jvp(x, y, tangents=(vx, vy))
    want = ref_two(x, y)
    np.testing.assert_allclose(val[0], want[0], rtol=1e-14)
    np.testing.assert_allclose(float(val[1]), want[1], rtol=1e-14)
    num = fd_jvp(lambda *a: np.concatenate([np.ravel(r) for r in ref_two(*a)]), [x, y], [vx, vy])
    np.testing.assert_allclose(np.concatenate([np.ravel(a) for a in tan]), num, rtol=1e-6)
    u = (rng.standard_normal(3), 0.7)
    val2, (gx, gy) = t.vjp(x, y, cotangent=u)
    assert gx.shape == x.shape and gy.shape == y.shape
    lhs = float(np.dot(tan[0], u[0]) + tan[1] * u[1])
    np.testing.assert_allclose(lhs, np.vdot(gx, vx) + np.vdot(gy, vy), rtol=1e-12)


def rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def rosen_hessian(x):
    n = x.size
    H = np.zeros((n, n))
    for i in range(n - 1):
        H[i, i] += 1200 * x[i] ** 2 - 400 * x[i + 1] + 2
        H[i + 1, i + 1] += 200
        H[i, i + 1] = H[i + 1, i] = -400 * x[i]
    return H


def test_hessian_and_hvp_rosenbrock(rng):
    x = rng.standard_normal(12)
    t = tp.record(rosen, x)
    x1 = rng.standard_normal(12)
    H = t.hessian(x1)
    np.testing.assert_allclose(H, rosen_hessian(x1), rtol=1e-13, atol=1e-10)
    v = rng.standard_normal(12)
    np.testing.assert_allclose(t.hvp(x1, v=v), rosen_hessian(x1) @ v, rtol=1e-12, atol=1e-9)
    Hs = t.hessian(x1, sparse=True)
    assert sps.issparse(Hs) and Hs.shape == (12, 12)
    np.testing.assert_allclose(Hs.toarray(), rosen_hessian(x1), rtol=1e-13, atol=1e-10)
    assert t.sparsity().n_hessian_colors == 3  # tridiagonal


def test_hessian_blocks_for_several_arguments(rng):
    def f(x, W):
        return (tp.tanh(W @ x) ** 2).sum() + (x * x * x).sum()

    x, W = rng.standard_normal(3), rng.standard_normal((2, 3))
    t = tp.record(f, x, W)
    H = t.hessian(x, W)
    assert H[0][0].shape == (3, 3) and H[0][1].shape == (3, 2, 3)
    assert H[1][0].shape == (2, 3, 3) and H[1][1].shape == (2, 3, 2, 3)
    flat = np.block(
        [[H[0][0], H[0][1].reshape(3, 6)], [H[1][0].reshape(6, 3), H[1][1].reshape(6, 6)]]
    )
    np.testing.assert_allclose(flat, flat.T, rtol=1e-12, atol=1e-12)
    vs = [rng.standard_normal(3), rng.standard_normal((2, 3))]
    num = fd_hvp(t, [x, W], vs)
    hv = t.hvp(x, W, v=tuple(vs))
    for a, b in zip(hv, num):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(flat @ np.concatenate([v.ravel() for v in vs]),
                               np.concatenate([a.ravel() for a in hv]), rtol=1e-12, atol=1e-12)  # fmt: skip
    Hs = t.hessian(x, W, sparse=True).toarray()
    np.testing.assert_allclose(Hs, flat, rtol=1e-12, atol=1e-12)


def test_float32_derivatives(rng):
    x = rng.standard_normal(6).astype(np.float32)
    t32 = tp.record(rosen, x)
    t64 = tp.record(rosen, x.astype(np.float64))
    H32 = t32.hessian(x)
    assert H32.dtype == np.float32
    np.testing.assert_allclose(H32, t64.hessian(x.astype(np.float64)), rtol=1e-5, atol=1e-3)
    J32 = tp.record(lambda x: tp.sin(x) * x, x).jacobian(x)
    assert J32.dtype == np.float32
    np.testing.assert_allclose(J32, np.diag(np.cos(x) * x + np.sin(x)), rtol=1e-5, atol=1e-6)
    _, jv = t32.jvp(x, tangents=np.ones(6, np.float32))
    assert jv.dtype == np.float32


def test_compiled_tier_and_retraced_variants(rng):
    x = rng.standard_normal(8)
    t = tp.record(rosen, x, compile=True)
    assert t.tier == "compiled"
    np.testing.assert_allclose(t.hessian(x), rosen_hessian(x), rtol=1e-13, atol=1e-10)

    def branchy(x):
        return (x * x).sum() if x.sum() > 0 else tp.exp(x).sum()

    tb = tp.record(branchy, np.ones(3))
    xn = -np.ones(3) * np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(tb.hessian(xn), np.diag(np.exp(xn)), rtol=1e-14)
    np.testing.assert_allclose(tb.hessian(np.ones(3)), 2 * np.eye(3))


def test_errors_are_clear(rng):
    x = rng.standard_normal(4)
    t = tp.record(lambda x: tp.sin(x), x)
    with pytest.raises(ValueError, match="Hessians need a scalar output"):
        t.hessian(x)
    with pytest.raises(ValueError, match="mode must be one of"):
        t.jacobian(x, mode="sideways")
    with pytest.raises(ValueError, match="has shape"):
        t.jvp(x, tangents=np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        t.vjp(x, cotangent=np.ones(5))
    t2 = tp.record(lambda x, y: (x * y).sum(), x, x)
    with pytest.raises(ValueError, match="expected 2 arrays"):
        t2.hvp(x, x, v=np.ones(4))


# ---------------------------------------------------------------- sparse


def ba_instance(rng, n_cams=3, n_pts=8, n_obs=24):
    cams = np.zeros((n_cams, 11))
    cams[:, 0:3] = rng.uniform(-0.3, 0.3, (n_cams, 3))
    cams[:, 3:6] = rng.uniform(-1, 1, (n_cams, 3))
    cams[:, 6] = rng.uniform(400, 600, n_cams)
    cams[:, 7:9] = rng.uniform(-5, 5, (n_cams, 2))
    cams[:, 9:11] = rng.uniform(-1e-3, 1e-3, (n_cams, 2))
    X = rng.uniform(-1, 1, (n_pts, 3))
    X[:, 2] -= 8.0
    obs = np.stack([np.arange(n_obs) % n_cams, np.arange(n_obs) % n_pts], axis=1)
    w = rng.uniform(0.8, 1.2, n_obs)
    return cams, X, w, obs


def ba_fun(obs, feats):
    def f(cams, X, w):
        camT = cams[obs[:, 0]].T
        XT = X[obs[:, 1]].T
        return tp.concatenate([ba_residual(tp, camT, XT, w, feats.T).reshape(-1), 1.0 - w * w])

    return f


def test_sparse_jacobian_of_bundle_adjustment(rng):
    cams, X, w, obs = ba_instance(rng)
    feats = rng.uniform(-50, 50, (obs.shape[0], 2))
    t = tp.record(ba_fun(obs, feats), cams, X, w)
    J = t.jacobian(cams, X, w, sparse=True)
    dense = t.jacobian(cams, X, w, mode="fwd")
    flat = np.concatenate([d.reshape(J.shape[0], -1) for d in dense], axis=1)
    np.testing.assert_allclose(J.toarray(), flat, rtol=1e-13, atol=1e-13)
    sp = t.sparsity()
    # a residual row sees one camera (10 of its 11 parameters: e0 reads the x principal
    # point, e1 the y one), one point (3) and one weight: 14 per row
    assert sp.jacobian.getnnz(axis=1).max() == 14
    assert sp.n_jacobian_colors <= 3 * 15, sp.n_jacobian_colors
    assert (abs(flat) > 0).sum() <= sp.jacobian.nnz  # the pattern covers every nonzero


def test_sparsity_follows_gather_indices(rng):
    x = rng.standard_normal(5)
    t = tp.record(lambda x, i: tp.take(x, i) * 2.0, x, np.array([0, 1]))
    p1 = t.sparsity(x, np.array([0, 1])).jacobian.toarray()
    p2 = t.sparsity(x, np.array([4, 4])).jacobian.toarray()
    np.testing.assert_array_equal(p1, np.eye(2, 5, dtype=bool))
    np.testing.assert_array_equal(p2, np.array([[0, 0, 0, 0, 1]] * 2, bool))
    J = t.jacobian(x, np.array([4, 2]), sparse=True).toarray()
    np.testing.assert_array_equal(J, 2.0 * np.eye(5)[[4, 2]])


def test_hessian_pattern_of_separable_function(rng):
    x = rng.standard_normal(10)
    t = tp.record(lambda x: (tp.exp(x[:5]) * x[5:]).sum() + (x[:5] ** 2).sum(), x)
    pat = t.sparsity().hessian.toarray()
    want = np.zeros((10, 10), bool)
    for i in range(5):
        want[i, i] = want[i, i + 5] = want[i + 5, i] = True
    np.testing.assert_array_equal(pat, want)
    np.testing.assert_allclose(t.hessian(x, sparse=True).toarray(), t.hessian(x), rtol=1e-14)


# ---------------------------------------------------------------- transforms


def test_transforms_match_the_tape_drivers_and_numpy(rng):
    def f(x, y):
        return (tp.sin(x) * y).sum() + (x * x * y).sum()

    x, y = rng.standard_normal(4), rng.standard_normal(4)
    gx = np.cos(x) * y + 2 * x * y
    gy = np.sin(x) + x * x
    np.testing.assert_allclose(tp.grad(f)(x, y), gx, rtol=1e-14)
    gy2, gx2 = tp.grad(f, argnums=(1, 0))(x, y)
    np.testing.assert_allclose(gx2, gx, rtol=1e-14)
    np.testing.assert_allclose(gy2, gy, rtol=1e-14)
    v, g = tp.value_and_grad(f, argnums=1)(x, y)
    np.testing.assert_allclose(v, (np.sin(x) * y).sum() + (x * x * y).sum(), rtol=1e-14)
    np.testing.assert_allclose(g, gy, rtol=1e-14)
    H = tp.hessian(f)(x, y)
    np.testing.assert_allclose(H, np.diag(-np.sin(x) * y + 2 * y), rtol=1e-14)
    Hb = tp.hessian(f, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(Hb[0][1], np.diag(np.cos(x) + 2 * x), rtol=1e-14)
    vx, vy = rng.standard_normal(4), rng.standard_normal(4)
    val, tan = tp.jvp(f, (x, y), (vx, vy))
    np.testing.assert_allclose(tan, gx @ vx + gy @ vy, rtol=1e-13)
    val2, vjp_fn = tp.vjp(f, x, y)
    cx, cy = vjp_fn(2.0)
    np.testing.assert_allclose(cx, 2 * gx, rtol=1e-14)
    np.testing.assert_allclose(cy, 2 * gy, rtol=1e-14)
    hx, hy = tp.hvp(f, (x, y), (vx, vy))
    np.testing.assert_allclose(
        hx, (-np.sin(x) * y + 2 * y) * vx + (np.cos(x) + 2 * x) * vy, rtol=1e-13
    )
    np.testing.assert_allclose(hy, (np.cos(x) + 2 * x) * vx, rtol=1e-13)
    J = tp.jacobian(lambda x: tp.exp(x) * 2.0)(x)
    np.testing.assert_allclose(J, np.diag(2 * np.exp(x)), rtol=1e-14)
    np.testing.assert_allclose(tp.jacrev(lambda x: tp.exp(x))(x), np.diag(np.exp(x)), rtol=1e-14)


def test_transform_records_once_per_shape():
    calls = []

    def f(x):
        calls.append(x.shape)
        return (x * x).sum()

    g = tp.grad(f)
    for k in range(3):
        g(np.ones(3) * k)
    g(np.ones(5))
    assert calls == [(3,), (5,)]


# ---------------------------------------------------------------- scipy, autograd, gradcheck


def test_minimize_trust_ncg_rosenbrock():
    res = tp.optimize.minimize(rosen, np.zeros(50), method="trust-ncg", options={"gtol": 1e-9})
    assert res.success and res.nhev > 0  # Hessian-vector products from the tape
    np.testing.assert_allclose(res.x, np.ones(50), atol=1e-6)
    res = tp.optimize.minimize(
        rosen, np.zeros((2, 5)), method="trust-exact", options={"gtol": 1e-9}
    )
    assert res.success and res.x.shape == (2, 5)
    np.testing.assert_allclose(res.x, np.ones((2, 5)), atol=1e-6)


def test_minimize_constraints_get_tape_jacobians():
    res = tp.optimize.minimize(
        lambda x: (x * x).sum(), np.array([1.0, 2.0, 0.5]), method="SLSQP",
        constraints=[{"type": "eq", "fun": lambda x: x[0] + 2.0 * x[1] - 1.0}],
        bounds=[(None, None), (None, None), (0.25, 1.0)],
    )  # fmt: skip
    assert res.success
    np.testing.assert_allclose(res.x, [0.2, 0.4, 0.25], atol=1e-7)


def test_least_squares_solves_bundle_adjustment(rng):
    cams, X, w, obs = ba_instance(rng, n_cams=2, n_pts=12, n_obs=40)
    feats = np.zeros((obs.shape[0], 2))
    truth = tp.record(ba_fun(obs, feats), cams, X, w)
    r = truth.forward(cams, X, w)[: 2 * obs.shape[0]].reshape(2, -1).T
    feats = -r / w[:, None]  # features the true parameters reproduce exactly
    n_c = cams.size

    def resid_all(z):
        c = z[:n_c].reshape(cams.shape)
        return ba_fun(obs, feats)(c, z[n_c:].reshape(X.shape), w)[: 2 * obs.shape[0]]

    z0 = np.concatenate([cams.ravel(), (X + 0.01 * rng.standard_normal(X.shape)).ravel()])
    res = tp.optimize.least_squares(resid_all, z0, sparse=True)
    assert res.success and sps.issparse(res.jac)
    assert res.cost < 1e-12


def test_autograd_grad():
    x = tp.tensor([0.5, 1.0, 2.0], requires_grad=True)
    w = tp.tensor(0.3, requires_grad=True)
    h = tp.sin(x * w)
    z = (h * h).sum()
    gx, gh = tp.autograd.grad(z, (x, h), retain_graph=True)
    xv = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(
        gx.numpy(), 2 * np.sin(0.3 * xv) * np.cos(0.3 * xv) * 0.3, rtol=1e-14
    )
    np.testing.assert_allclose(gh.numpy(), 2 * np.sin(0.3 * xv), rtol=1e-14)
    assert x.grad is None and w.grad is None
    (gw,) = tp.autograd.grad(z, [w], grad_outputs=tp.tensor(2.0))
    np.testing.assert_allclose(gw.numpy(), 2 * (2 * np.sin(0.3 * xv) * np.cos(0.3 * xv) * xv).sum())
    with pytest.raises(RuntimeError, match="second time"):
        tp.autograd.grad(z, [w])
    u = tp.tensor(1.0, requires_grad=True)
    z2 = (x * 2).sum()
    with pytest.raises(RuntimeError, match="not have been used"):
        tp.autograd.grad(z2, [u], retain_graph=True)
    assert tp.autograd.grad(z2, [u], allow_unused=True, retain_graph=True) == (None,)
    (gx,) = tp.autograd.grad(z2, [x], create_graph=True)  # a constant gradient: 2
    np.testing.assert_array_equal(gx.numpy(), np.full(x.shape, 2.0))


def test_gradcheck_order_two_catches_a_wrong_hessian_vector_product(monkeypatch, rng):
    from tape.transforms import derivatives

    x = rng.uniform(0.5, 1.5, 4)
    assert tp.gradcheck(lambda x: (tp.exp(x) * tp.log(x)).sum(), x, order=2)
    real = derivatives.hvp
    monkeypatch.setattr(derivatives, "hvp", lambda *a, **k: real(*a, **k) * 1.01)
    with pytest.raises(tp.GradcheckError):
        tp.gradcheck(lambda x: (tp.exp(x) * tp.log(x)).sum(), x, order=2)


@pytest.mark.parametrize("name,k,case", KCASES, ids=[f"{n}-{k}" for n, k, _ in KCASES])
def test_sparse_jacobian_and_pattern_of_every_kernel_case(name, k, case):
    fn, ref, xs = case
    t = tp.record(fn, *xs)
    dense = t.jacobian(*xs, mode="rev")
    dense = dense if isinstance(dense, tuple) else (dense,)
    n_out = int(np.prod(np.shape(ref(*xs)), dtype=np.int64))
    flat = np.concatenate([d.reshape(n_out, -1) for d in dense], axis=1)
    J = t.jacobian(*xs, sparse=True)
    # to rounding: the dense factorisations' tangent and adjoint rules round differently
    np.testing.assert_allclose(J.toarray(), flat, rtol=1e-12, atol=1e-15)
    assert not (flat[~t.sparsity().jacobian.toarray()] != 0).any()  # nonzeros inside


def test_dense_by_colouring_equals_one_direction_per_element(monkeypatch, rng):
    from tape.transforms import derivatives

    x = rng.standard_normal(40)
    tj = tp.record(lambda x: tp.sin(x[1:]) * x[:-1], x)
    th = tp.record(lambda x: (tp.sin(x[1:]) * x[:-1]).sum(), x)
    tc = tp.record(lambda x: tp.exp(x[:30]).sum() ** 2 + (x * x).sum(), x)
    assert tj.sparsity().n_jacobian_colors <= 3 and th.sparsity().n_hessian_colors <= 3
    assert 2 * tc.sparsity().n_hessian_colors > 40  # coupled: one direction per element
    # a pattern that depends on a gather's indices (an argument): each permutation its own
    tg = tp.record(lambda x, p: (tp.sin(x[p]) * x).sum(), x, np.arange(40), wrt=[0])
    x2, perms = rng.standard_normal(40), [rng.permutation(40), rng.permutation(40)]

    def all_of():  # twice at other arguments: the compressions made once are reused
        return [tj.jacobian(x, mode="fwd"), tj.jacobian(x), th.hessian(x), tc.hessian(x),
                tj.jacobian(x2), th.hessian(x2)] + [tg.hessian(x2, p) for p in perms * 2]  # fmt: skip

    got = all_of()
    assert 2 * tg.sparsity(x2, perms[0]).n_hessian_colors <= 40  # compressed
    monkeypatch.setattr(derivatives, "COMPRESS_MIN", 10**9)
    want = all_of()
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-15, atol=0)
    # and against the formula: sin(x[p]) x has d2/dx_j dx_i = cos(x_j) where p_i = j, ...
    p = perms[0]
    H = np.zeros((40, 40))
    H[p, np.arange(40)] += np.cos(x2[p])
    H[np.arange(40), p] += np.cos(x2[p])
    H[p, p] -= np.sin(x2[p]) * x2
    np.testing.assert_allclose(got[6], H, rtol=1e-14, atol=1e-14)
    # the CSR results, laid out from the structure kept per pattern, at each permutation
    for k, p in enumerate(perms * 2):
        Hs = tg.hessian(x2, p, sparse=True)
        assert Hs.has_sorted_indices and Hs.nnz == np.count_nonzero(
            tg.sparsity(x2, p).hessian.toarray()
        )
        np.testing.assert_array_equal(Hs.toarray(), got[6 + k])
    for xx in (x, x2):
        np.testing.assert_array_equal(
            tj.jacobian(xx, sparse=True).toarray(), tj.jacobian(xx, mode="fwd")
        )


def test_docs_example_runs():
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "guides" / "derivatives.md"
    code = page.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    scope = {}
    exec(compile(code, f"<{page.name}>", "exec"), scope)
    assert scope["H"].shape == (100, 100) and sps.issparse(scope["Hs"])
    np.testing.assert_allclose(scope["Hs"].toarray(), scope["H"], rtol=1e-14)
    np.testing.assert_allclose(scope["hv"], scope["H"] @ np.ones(100), rtol=1e-12)
    assert scope["J"][0][1].shape == (3, 4, 4)


def _conformance_cases():
    from test_conformance import CASES

    return CASES


@pytest.mark.parametrize("case", _conformance_cases(), ids=lambda c: c.name)
def test_conformance_table_through_forward_mode(case, rng):
    """The conformance table's gradients (computed without tape, at kinks, ties and zeros
    too) from forward mode: the Jacobian column by column and ``jvp`` along random
    directions; and, for its smooth cases, Hessian-vector products against finite
    differences."""
    at = case.record_at or case.points[0][0]
    t = tp.record(case.fn, *at, wrt=list(case.wrt))
    rtol, atol = max(case.rtol, 1e-10), max(case.atol, 1e-10)
    for args, _, grads in case.points:
        J = t.jacobian(*args, mode="fwd")
        J = J if isinstance(J, tuple) else (J,)
        for got, want in zip(J, grads):
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
        vs = tuple(rng.standard_normal(np.shape(args[k])) for k in case.wrt)
        _, slope = t.jvp(*args, tangents=vs)
        want = sum(float(np.vdot(g, v)) for g, v in zip(grads, vs))
        np.testing.assert_allclose(slope, want, rtol=max(rtol, 1e-9), atol=max(atol, 1e-9))
    if case.ref is not None:
        assert tp.gradcheck(case.fn, *at, wrt=list(case.wrt), order=2)


def test_dense_hessian_of_a_small_mlp_against_finite_differences(rng):
    """Many coupled directions at once (no colouring helps): the multi-direction paths of
    the broadcast add, tanh and matmul second-order kernels."""
    X, y = rng.standard_normal((6, 4)), rng.standard_normal((6, 1))

    def mlp(W1, b1, W2, b2):
        h = tp.tanh(X @ W1 + b1)
        return ((h @ W2 + b2 - y) ** 2).mean()

    ps = [rng.standard_normal((4, 5)), rng.standard_normal(5), rng.standard_normal((5, 1)),
          rng.standard_normal(1)]  # fmt: skip
    t = tp.record(mlp, *ps)
    assert 2 * t.sparsity().n_hessian_colors > 31
    H = t.hessian(*ps)
    flat = np.block([[H[i][j].reshape(ps[i].size, ps[j].size) for j in range(4)] for i in range(4)])
    cols = []
    for j in range(31):
        e = np.zeros(31)
        e[j] = 1.0
        vs, c = [], 0
        for p in ps:
            vs.append(e[c : c + p.size].reshape(p.shape))
            c += p.size
        cols.append(np.concatenate([a.ravel() for a in fd_hvp(t, ps, vs)]))
    np.testing.assert_allclose(flat, np.stack(cols, axis=1), rtol=1e-6, atol=1e-7)
    v = [rng.standard_normal(p.shape) for p in ps]
    hv = t.hvp(*ps, v=tuple(v))
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in hv]),
                               flat @ np.concatenate([a.ravel() for a in v]), rtol=1e-12, atol=1e-12)  # fmt: skip


def test_directions_in_several_passes_match_one_pass(monkeypatch, rng):
    """More directions than one pass's arenas hold (``CHUNK_BYTES``) run in passes of equal
    size, and the dense Hessian and forward Jacobian do not depend on the split; a pass holds
    at least ``CHUNK_MIN`` directions where ``CHUNK_MAX_BYTES`` allows."""
    from tape.transforms import derivatives as D

    X = rng.standard_normal((6, 4))
    ps = [rng.standard_normal((4, 5)), rng.standard_normal(5)]  # 25 directions
    t = tp.record(lambda W, b: (tp.tanh(X @ W + b) ** 2).sum(), *ps)
    tj = tp.record(lambda W, b: tp.tanh(X @ W + b), *ps)
    monkeypatch.setattr(D, "COMPRESS_MIN", 10**9)  # one direction per element
    H1, J1 = t.hessian(*ps), tj.jacobian(*ps, mode="fwd")
    passes = []

    def spy(name, arg):  # arg: the position of T / of V
        real = getattr(D, name)

        def call(*a):
            passes.append((name, a[arg].shape[0]))
            return real(*a)

        return call

    for name, arg in (("_hvp_pass", 3), ("_tangents", 2)):
        monkeypatch.setattr(D, name, spy(name, arg))
    live = t.n_data - D._plan(t).n_const  # the cells a pass can touch (no constants)
    monkeypatch.setattr(D, "CHUNK_BYTES", 7 * 2 * live * 8)  # at most 7 per pass ...
    monkeypatch.setattr(D, "CHUNK_MIN", 4)  # ... as 7 is above the least a pass may hold
    H, J = t.hessian(*ps), tj.jacobian(*ps, mode="fwd")
    assert passes == [("_hvp_pass", 7)] * 3 + [("_hvp_pass", 4)] + [("_tangents", 7)] * 3 + [
        ("_tangents", 4)
    ]
    for a, b in [(H[i][j], H1[i][j]) for i in range(2) for j in range(2)] + list(zip(J, J1)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    passes.clear()
    monkeypatch.setattr(D, "CHUNK_MIN", 13)  # 13 per pass: two passes, of 13 and 12
    t.hessian(*ps)
    monkeypatch.setattr(D, "CHUNK_MAX_BYTES", 5 * 2 * live * 8)  # ... unless over the cap
    t.hessian(*ps)
    assert passes == [("_hvp_pass", 13), ("_hvp_pass", 12)] + [("_hvp_pass", 5)] * 5


def test_constants_do_not_count_toward_a_pass(monkeypatch, rng):
    """A pass's size counts the arena's cells less its constants (which no tangent pass
    touches): a large constant matrix does not split the directions into more passes, and the
    forward Jacobian is the same either way (and matches finite differences)."""
    from tape.transforms import derivatives as D

    A = rng.standard_normal((40, 40)) / 10.0  # 1,600 constant cells
    f = lambda x: tp.tanh(A @ tp.sin(x)) * tp.cos(x)  # noqa: E731
    x = rng.standard_normal(40)
    t = tp.record(f, x)
    plan = D._plan(t)
    live = t.n_data - plan.n_const
    assert plan.n_const >= A.size and live < t.n_data // 4
    monkeypatch.setattr(D, "COMPRESS_MIN", 10**9)  # one direction per element
    monkeypatch.setattr(D, "CHUNK_MIN", 1)
    monkeypatch.setattr(D, "CHUNK_BYTES", 20 * 2 * live * 8)  # 20 directions of live cells
    passes = []

    def spy(*a, real=D._tangents):
        passes.append(a[2].shape[0])
        return real(*a)

    monkeypatch.setattr(D, "_tangents", spy)
    J = t.jacobian(x, mode="fwd")
    assert passes == [20, 20]  # (the whole arena would allow 5 per pass)
    monkeypatch.undo()
    fd = np.empty((40, 40))
    for j in range(40):
        e = np.zeros(40)
        e[j] = 1e-6
        fd[:, j] = (np.tanh(A @ np.sin(x + e)) * np.cos(x + e)
                    - np.tanh(A @ np.sin(x - e)) * np.cos(x - e)) / 2e-6  # fmt: skip
    np.testing.assert_allclose(J, fd, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(J, t.jacobian(x, mode="rev"), rtol=1e-13, atol=1e-13)


def test_products_skip_directions_with_zero_tangents(rng):
    """The matrix products' multi-direction tangent and forward-over-reverse kernels leave
    out the directions whose tangent of an operand is all zero (a seed that misses it): the
    dense Hessian (identity seeds, most of which miss each operand) and the forward Jacobian
    match one direction at a time (the one-direction kernels) and finite differences, with
    both operands differentiated, ``matmul`` and ``matmul_nt`` (``linear``), and a parameter
    that reaches no product (every product's tangent is zero in its directions)."""
    import tape.nn.functional as F

    X = rng.standard_normal((5, 3))

    def f(A, W, c):
        h = tp.tanh(X @ A)  # A: (3, 4)
        z = F.linear(h, W)  # W: (2, 4): h W^T
        return (z * z).sum() + (h @ (W.T * c[0])).sum() + (c**3).sum()

    ps = [rng.standard_normal((3, 4)), rng.standard_normal((2, 4)), rng.standard_normal(2)]
    n = sum(p.size for p in ps)
    t = tp.record(f, *ps)
    H = t.hessian(*ps)
    flat = np.block([[H[i][j].reshape(ps[i].size, ps[j].size) for j in range(3)] for i in range(3)])
    for j in range(n):
        e = np.zeros(n)
        e[j] = 1.0
        vs, c = [], 0
        for p in ps:
            vs.append(e[c : c + p.size].reshape(p.shape))
            c += p.size
        col = np.concatenate([a.ravel() for a in t.hvp(*ps, v=tuple(vs))])  # one direction
        np.testing.assert_allclose(flat[:, j], col, rtol=1e-12, atol=1e-12)
        fd = np.concatenate([a.ravel() for a in fd_hvp(t, ps, vs)])
        np.testing.assert_allclose(flat[:, j], fd, rtol=1e-6, atol=1e-6)
    tj = tp.record(lambda A, W, c: tp.tanh(X @ A) @ (W.T * c[1]), *ps)
    J = tj.jacobian(*ps, mode="fwd")
    Jr = tj.jacobian(*ps, mode="rev")
    for a, b in zip(J, Jr):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
