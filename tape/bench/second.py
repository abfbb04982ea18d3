"""Derivatives beyond the gradient: Hessian-vector products, Hessians, Jacobians (dense and
by colouring) and SciPy optimisers fed by tapes, against JAX in the same run.

- ``hvp``: the timed call is the Hessian-vector product, the "objective" column the same
  tool's gradient, so ``grad/obj`` is HVP time / gradient time (tape: forward-over-reverse on
  the recorded tape, against the interpreter's gradient; JAX: ``jvp`` of ``grad``, jitted).
- ``hessian``: the dense Hessian (tape: forward-over-reverse in vector mode, and by colouring
  of the Hessian's pattern; JAX: ``jax.hessian``, jitted).
- ``jacobian``: a 100 -> 100 function (elementwise-heavy, mixed by one matrix): tape forward
  and reverse mode against ``jax.jacfwd`` / ``jax.jacrev``, jitted.
- ``ba-jacobian``: the bundle adjustment residual's Jacobian (camera, point and weight
  columns): by colouring (sparse, one tangent direction per colour) against the dense reverse
  Jacobian (one reverse sweep per residual) and JAX's dense ``jacfwd``, on the first 400
  observations of ``ba1`` (a dense Jacobian of the full instance does not fit in memory); and
  the full ``ba1`` by colouring alone.
- ``calls``: each transform (``forward``, ``gradient``, ``value_and_grad``, ``jvp``, ``vjp``,
  ``hvp``) of Rosenbrock n = 10 called from Python, against JAX's jitted transforms: the
  fixed cost of a call.
- ``optimize``: ``tape.optimize.minimize(method="trust-ncg")`` on Rosenbrock n=1,000 and
  ``tape.optimize.least_squares`` on the full ``ba1``, against the same SciPy call fed by JAX
  (jitted gradient and HVP) for the former.

CasADi (on Rosenbrock and the 100 -> 100 function: one vector argument) runs an ``MX``
``ca.Function`` of the symbolic derivative, called through ``Function.buffer`` (see
:mod:`tape.bench.common`): ``ca.jtimes(ca.gradient(f, x), x, v)`` (forward over reverse) for
the HVP, ``ca.hessian`` and ``ca.jacobian`` (densified) for the dense matrices.
"""

from __future__ import annotations

import numpy as np

from tape.bench import adbench
from tape.bench.common import backend, casadi_buffered, casadi_symbols
from tape.bench.harness import Case, Impl, Problem, Skip, flat


def _record(f, params, consts, compile=False):
    """A tape of ``f``, on the interpreter or (``compile``) compiled: its derivative drivers
    (and its gradient, the ``hvp`` problem's "objective") run on that tier."""
    import tape as tp

    B = backend("tape")
    cs = [tp.tensor(c) if np.asarray(c).dtype.kind == "f" else np.asarray(c) for c in consts]
    return tp.record(lambda *ps: f(B, ps, cs), *params, wrt=list(range(len(params))),
                     compile=compile)  # fmt: skip


def _jax_fn(f, params, consts):
    B = backend("jax")
    xs = [B.jnp.asarray(p) for p in params]
    cs = [B.jnp.asarray(c) for c in consts]
    n = len(xs)

    def fj(*a):
        return f(B, a, cs)

    return B.jax, xs, fj, n


def casadi_derivative(f, x, consts, what, v=None):
    """A builder of CasADi's ``what`` (``"hvp"``, ``"hessian"``, ``"jacobian"``) of ``f`` at
    the vector ``x`` (``v``: the HVP's direction); for the HVP, the gradient is the objective
    (the ``hvp`` problem's ``grad/obj``)."""

    def build():
        ca, (xs,), y = casadi_symbols(f, [x], consts)
        value = None
        if what == "hvp":
            vs = ca.MX.sym("v", np.size(x))
            d = ca.Function("hvp", [xs, vs], [ca.jtimes(ca.gradient(y, xs), xs, vs)])
            args = [x, v]
            G = ca.Function("gradient", [xs], [ca.densify(ca.gradient(y, xs))])
            value = casadi_buffered(G, [x])
        else:
            J = ca.hessian(y, xs)[0] if what == "hessian" else ca.jacobian(y, xs)
            d, args = ca.Function(what, [xs], [ca.densify(J)]), [x]
        m = d.size1_out(0)
        return Impl(
            grad=casadi_buffered(d, args), value=value,
            grad_np=lambda r: r[0].reshape((m, -1), order="F").ravel(),
            note="MX Function, called through Function.buffer",
        )  # fmt: skip

    return build


# ------------------------------------------------------------------ HVP


def hvp_builders(f, params, consts, casadi=False):
    """tape and JAX; ``casadi``: CasADi too (``f`` of one vector argument)."""
    rng = np.random.default_rng(7)
    vs = [rng.standard_normal(np.shape(p)) for p in params]

    def tape_b(compile=True):
        t = _record(f, params, consts, compile)
        return Impl(
            grad=lambda: t.hvp(*params, v=tuple(vs)),
            value=lambda: t.gradient(*params),
            note=f"{len(t)} entries",
        )

    def jax_b():
        jax, xs, fj, n = _jax_fn(f, params, consts)
        g = jax.grad(fj, argnums=tuple(range(n)))
        h = jax.jit(lambda ps, ts: jax.jvp(lambda *p: g(*p), ps, ts)[1])
        gj = jax.jit(g)
        vj = tuple(jax.numpy.asarray(v) for v in vs)
        return Impl(
            grad=lambda: jax.block_until_ready(h(tuple(xs), vj)),
            value=lambda: jax.block_until_ready(gj(*xs)),
        )

    out = {"tape": tape_b, "tape interpreter": lambda: tape_b(False), "jax jit": jax_b}
    if casadi:
        out["casadi"] = casadi_derivative(f, params[0], consts, "hvp", vs[0])
    return out


def hvp_cases(opts):
    from tape.bench import gmm, simple

    x = np.random.default_rng(0).uniform(-1.0, 2.0, 1000)
    tools = hvp_builders(simple.rosenbrock, [x], (), casadi=True)
    out = [Case("hvp", "rosenbrock n=1000", 1000, tools, ratio=True)]
    rng = np.random.default_rng(1)
    params = simple._mlp_params(rng, (32, 64, 1))
    X, y = rng.normal(size=(64, 32)), rng.normal(size=(64, 1))
    out.append(Case("hvp", "mlp 32-64-1 batch 64", 64 * 32 * 64,
                    hvp_builders(simple.mlp_tanh_mse, params, (X, y)), ratio=True))  # fmt: skip
    root = adbench.find_data_dir(opts.data_dir)
    if root is not None:
        for label, path in adbench.gmm_files(root, "1k"):
            if label.split()[1:] == ["d10", "K25"]:
                data = adbench.read_gmm(path)
                f = gmm.make_objective(data.d, data.K, data.n, data.gamma, data.m)
                params = [data.alphas, data.means, data.icf]
                out.append(Case("hvp", "gmm 1k d10 K25", data.n_params,
                                hvp_builders(f, params, gmm.consts_for(data)), ratio=True))  # fmt: skip
    return out


# ------------------------------------------------------------------ Hessian


def hessian_cases(opts):
    from tape.bench import simple

    out = []
    for n in (100,) if opts.quick else (10, 100, 1000):
        x = np.random.default_rng(0).uniform(-1.0, 2.0, n)

        def tape_b(x=x, sparse=False):
            t = _record(simple.rosenbrock, [x], (), compile=True)
            conv = (lambda H: H.toarray().ravel()) if sparse else (lambda H: np.ravel(H))
            note = f"{len(t)} entries"
            if sparse:
                note += f", {t.sparsity().n_hessian_colors} colours"
            return Impl(grad=lambda: t.hessian(x, sparse=sparse), grad_np=conv, note=note)

        def jax_b(x=x):
            jax, xs, fj, _ = _jax_fn(simple.rosenbrock, [x], ())
            h = jax.jit(jax.hessian(fj))
            return Impl(grad=lambda: jax.block_until_ready(h(*xs)))

        tools = {"tape": tape_b, "tape sparse": lambda x=x: tape_b(x, True), "jax jit": jax_b,
                 "casadi": casadi_derivative(simple.rosenbrock, x, (), "hessian")}  # fmt: skip
        out.append(Case("hessian", f"rosenbrock n={n}", n, tools))
    rng = np.random.default_rng(5)
    theta = np.concatenate([np.ravel(p) for p in simple._mlp_params(rng, (8, 16, 1))])
    X, y = rng.normal(size=(32, 8)), rng.normal(size=(32, 1))

    def tape_mlp():
        t = _record(mlp_flat, [theta], (X, y), compile=True)
        return Impl(grad=lambda: t.hessian(theta), grad_np=np.ravel, note=f"{len(t)} entries")

    def jax_mlp():
        jax, xs, fj, _ = _jax_fn(mlp_flat, [theta], (X, y))
        h = jax.jit(jax.hessian(fj))
        return Impl(grad=lambda: jax.block_until_ready(h(*xs)))

    out.append(Case("hessian", "mlp 8-16-1 batch 32 (161 parameters)", theta.size,
                    {"tape": tape_mlp, "jax jit": jax_mlp}))  # fmt: skip
    return out


def mlp_flat(B, params, consts):
    """The MLP loss of :func:`tape.bench.simple.mlp_tanh_mse` (8 -> 16 -> 1) as a function of
    one vector of its 161 parameters."""
    from tape.bench import simple

    (th,) = params
    W1, b1 = th[0:128].reshape(8, 16), th[128:144]
    W2, b2 = th[144:160].reshape(16, 1), th[160:161]
    return simple.mlp_tanh_mse(B, [W1, b1, W2, b2], consts)


# ------------------------------------------------------------------ Jacobian


def mixed(B, params, consts):
    """100 -> 100: elementwise work on both sides of one dense mixing matrix."""
    (x,) = params
    (A,) = consts
    u = B.tanh(x) * B.sin(x) + B.exp(-x * x)
    v = A @ u
    return B.sigmoid(v) * B.cos(x) + v * v * 0.01 + B.sqrt(1.0 + x * x)


def jacobian_cases(opts):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(100)
    A = rng.standard_normal((100, 100)) / 10.0

    def tape_b(mode):
        def build():
            t = _record(mixed, [x], (A,), compile=True)
            return Impl(grad=lambda: t.jacobian(x, mode=mode), note=f"{len(t)} entries")

        return build

    def jax_b(which):
        def build():
            jax, xs, fj, _ = _jax_fn(mixed, [x], (A,))
            j = jax.jit(getattr(jax, which)(fj))
            return Impl(grad=lambda: jax.block_until_ready(j(*xs)))

        return build

    tools = {"tape fwd": tape_b("fwd"), "tape rev": tape_b("rev"),
             "jax jacfwd": jax_b("jacfwd"), "jax jacrev": jax_b("jacrev"),
             "casadi": casadi_derivative(mixed, x, (A,), "jacobian")}  # fmt: skip
    return [Case("jacobian", "100 -> 100", 100, tools)]


# ------------------------------------------------------------------ bundle adjustment


def ba_function(B, obs, feats):
    """The BA residual vector (reprojection errors, then w_err) of ``(cams, X, w)``."""
    from tape.bench.ba import residual

    o0, o1 = obs[:, 0], obs[:, 1]
    featT = np.ascontiguousarray(feats.T)

    def f(cams, X, w):
        r = residual(B, cams[o0].T, X[o1].T, w, featT)
        return B.concat([r.reshape(-1), 1.0 - w * w])

    return f


def _ba_subset(data, p):
    """The first ``p`` observations, with the cameras and points they use (reindexed)."""
    obs = data.obs[:p]
    cams_used, c_idx = np.unique(obs[:, 0], return_inverse=True)
    pts_used, p_idx = np.unique(obs[:, 1], return_inverse=True)
    return (data.cams[cams_used], data.X[pts_used], data.w[:p],
            np.stack([c_idx, p_idx], axis=1), data.feats[:p])  # fmt: skip


def _tape_ba(cams, X, w, obs, feats, sparse, mode="rev", full_check=True):
    def build():
        import tape as tp

        t = tp.record(ba_function(backend("tape"), obs, feats), cams, X, w)
        note = f"{len(t)} entries"
        if sparse:
            sp = t.sparsity()
            note += f", {sp.n_jacobian_colors} colours = tangent directions"
            conv = (lambda J: J.toarray().ravel()) if full_check else (lambda J: J.data)
            return Impl(grad=lambda: t.jacobian(cams, X, w, sparse=True), grad_np=conv, note=note)
        m = 3 * w.shape[0]
        note += f", {m} reverse sweeps" if mode == "rev" else ""
        return Impl(grad=lambda: t.jacobian(cams, X, w, mode=mode),
                    grad_np=lambda J: np.concatenate([j.reshape(J[0].shape[0], -1) for j in J], 1).ravel(),
                    note=note)  # fmt: skip

    return build


def _jax_ba(cams, X, w, obs, feats):
    def build():
        B = backend("jax")
        jax = B.jax
        f = ba_function(B, obs, feats)
        j = jax.jit(jax.jacfwd(f, argnums=(0, 1, 2)))
        xs = [B.jnp.asarray(a) for a in (cams, X, w)]
        return Impl(
            grad=lambda: jax.block_until_ready(j(*xs)),
            grad_np=lambda J: np.concatenate([np.asarray(a).reshape(3 * w.shape[0], -1) for a in J], 1).ravel(),
        )  # fmt: skip

    return build


def ba_jacobian_cases(opts):
    root = adbench.find_data_dir(opts.data_dir)
    if root is None:
        raise Skip(f"no ADBench data (set ${adbench.ENV_VAR} or --adbench)")
    files = adbench.ba_files(root)
    if not files:
        raise Skip(f"no ADBench BA instances in {root}")
    data = adbench.read_ba(files[0][1])
    sub = _ba_subset(data, 400)
    n_in = sub[0].size + sub[1].size + sub[2].size
    tools = {"tape sparse": _tape_ba(*sub, True), "tape rev (dense)": _tape_ba(*sub, False),
             "jax jacfwd (dense)": _jax_ba(*sub)}  # fmt: skip
    out = [Case("ba-jacobian", f"{files[0][0]} first 400 obs ({3 * 400} x {n_in})", 400, tools)]
    full = (data.cams, data.X, data.w, data.obs, data.feats)
    out.append(Case("ba-jacobian", f"{files[0][0]} p={data.p}", data.p,
                    {"tape sparse": _tape_ba(*full, True, full_check=False)}))  # fmt: skip
    return out


# ------------------------------------------------------------------ SciPy


def optimize_cases(opts):
    from tape.bench import simple

    n = 100 if opts.quick else 1000  # quick: 4,050 iterations at 1,000 take 2 s a solve
    x0 = np.zeros(n)

    def tape_b():
        import tape as tp

        f = lambda x: simple.rosenbrock(backend("tape"), [x], ())  # noqa: E731
        tp.optimize.minimize(f, x0[:10], method="trust-ncg")  # compile the sweeps
        return Impl(grad=lambda: tp.optimize.minimize(f, x0, method="trust-ncg",
                                                      options={"gtol": 1e-8}).x)  # fmt: skip

    def jax_b():
        import scipy.optimize as so

        jax, _, fj, _ = _jax_fn(simple.rosenbrock, [x0], ())
        vg = jax.jit(jax.value_and_grad(fj))
        hv = jax.jit(lambda x, p: jax.jvp(jax.grad(fj), (x,), (p,))[1])

        def fun(x):
            v, g = vg(x)
            return float(v), np.asarray(g)

        return Impl(grad=lambda: so.minimize(fun, x0, jac=True, hessp=lambda x, p: np.asarray(hv(x, p)),
                                             method="trust-ncg", options={"gtol": 1e-8}).x)  # fmt: skip

    out = [Case("optimize", f"minimize trust-ncg rosenbrock n={n}", n,
                {"tape": tape_b, "jax jit": jax_b})]  # fmt: skip
    root = adbench.find_data_dir(opts.data_dir)
    if root is not None and not opts.quick:
        data = adbench.read_ba(adbench.ba_files(root)[0][1])

        def ba_b():
            import tape as tp

            nc, nx = data.cams.size, data.X.size
            f = ba_function(backend("tape"), data.obs, data.feats)

            def resid(z):
                return f(z[:nc].reshape(data.cams.shape), z[nc : nc + nx].reshape(data.X.shape),
                         z[nc + nx :])  # fmt: skip

            z0 = np.concatenate([data.cams.ravel(), data.X.ravel(), data.w])

            def solve():
                res = tp.optimize.least_squares(resid, z0, sparse=True, x_scale="jac")
                return np.array([res.cost, res.nfev, res.njev])

            note = f"{3 * data.p} residuals, {z0.size} unknowns"
            return Impl(grad=solve, note=note)

        out.append(Case("optimize", f"least_squares ba1 p={data.p}", data.p, {"tape": ba_b},
                        max_repeats=1, notes=["one timed solve per run"]))  # fmt: skip
    return out


# ------------------------------------------------------------------ calls from Python


CALLS = ("forward", "gradient", "value_and_grad", "jvp", "vjp", "hvp")
"""The transforms the ``calls`` problem times from Python, one case each."""


def calls_cases(opts):
    """Each transform of a small Rosenbrock (n = 10) called from Python: the fixed cost of a
    call where an optimiser, a sampler or a solver written in Python calls a small function
    many times. tape's compiled tier and its interpreter (recorded once) against JAX's jitted
    transforms; the check compares the derivative (the value, for ``forward``)."""
    from tape.bench import simple

    n = 10
    x = np.random.default_rng(0).uniform(-1.0, 2.0, n)
    v = np.random.default_rng(1).standard_normal(n)
    # what each call returns, as the derivative the check compares
    pick = {"value_and_grad": lambda r: flat(r[1]), "jvp": lambda r: flat(r[1]),
            "vjp": lambda r: flat(r[1] if len(r) == 2 else r[0])}  # fmt: skip

    def tape_b(what, compile=True):
        t = _record(simple.rosenbrock, [x], (), compile)
        call = {
            "forward": lambda: t.forward(x), "gradient": lambda: t.gradient(x),
            "value_and_grad": lambda: t.value_and_grad(x),
            "jvp": lambda: t.jvp(x, tangents=v), "vjp": lambda: t.vjp(x, cotangent=1.0),
            "hvp": lambda: t.hvp(x, v=v),
        }[what]  # fmt: skip
        return Impl(grad=call, grad_np=pick.get(what, flat), note=f"{len(t)} entries")

    def jax_b(what):
        jax, (xj,), fj, _ = _jax_fn(simple.rosenbrock, [x], ())
        vj = jax.numpy.asarray(v)
        fn = {
            "forward": (jax.jit(fj), (xj,)),
            "gradient": (jax.jit(jax.grad(fj)), (xj,)),
            "value_and_grad": (jax.jit(jax.value_and_grad(fj)), (xj,)),
            "jvp": (jax.jit(lambda a, b: jax.jvp(fj, (a,), (b,))), (xj, vj)),
            "vjp": (jax.jit(lambda a: jax.vjp(fj, a)[1](1.0)), (xj,)),
            "hvp": (jax.jit(lambda a, b: jax.jvp(jax.grad(fj), (a,), (b,))[1]), (xj, vj)),
        }  # fmt: skip
        f, args = fn[what]
        return Impl(grad=lambda: jax.block_until_ready(f(*args)), grad_np=pick.get(what, flat))

    out = []
    for what in CALLS:
        tools = {"tape": lambda w=what: tape_b(w), "tape interpreter": lambda w=what: tape_b(w, False),
                 "jax jit": lambda w=what: jax_b(w)}  # fmt: skip
        out.append(Case("calls", f"{what} rosenbrock n={n}", n, tools))
    return out


PROBLEMS = [
    Problem("hvp", "Hessian-vector product (grad/obj = HVP time / gradient time)", "size",
            hvp_cases, ratio=True),
    Problem("hessian", "dense Hessian of Rosenbrock and of a small MLP", "n", hessian_cases),
    Problem("jacobian", "Jacobian of a 100 -> 100 function, forward and reverse", "n", jacobian_cases),
    Problem("ba-jacobian", "bundle adjustment residual Jacobian: colouring vs dense", "observations p",
            ba_jacobian_cases),
    Problem("optimize", "SciPy optimisers fed by tape (time to solve)", "n", optimize_cases),
    Problem("calls", "each transform of a small tape called from Python (Rosenbrock n=10)", "n",
            calls_cases),
]  # fmt: skip
