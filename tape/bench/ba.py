"""ADBench bundle adjustment: the sparse Jacobian (2 x 15 block per observation plus the
w_err diagonal), formulas in ``shared/adbench/README.md`` §1.2.

Every tool computes it the same way, the way reverse mode does it best here: gather each
observation's camera and point (component-major: ``camT`` is ``(11, p)``), evaluate the
reprojection residuals of all observations as one vectorised function ``R(camT, XT, w)`` of
shape ``(2, p)``, and take two vector-Jacobian products, seeded with ones on row 0 and on row 1.
Residual ``i`` depends only on column ``i`` of the gathered inputs, so the two VJPs are exactly
the two Jacobian rows of every observation (a row colouring with two colours). For tape that
is: one tape recorded for the residual, replayed with ``forward`` and two ``backward(seed)``.

"tape per-obs" is the literal alternative: one observation's residual recorded once
(11 + 3 + 1 inputs, 2 outputs) and replayed from a Python loop, one forward and two
backward sweeps per observation (run on the smallest instance only: Python overhead per call).

The hand-written Jacobian is forward mode by hand in Numba (a 15-vector tangent per
intermediate), the "Manual" column of ADBench. w_err rows (-2 w) are computed by every tool.
Timed: from (cams, X, w, obs, feats) to the 31 p Jacobian values in the tool's own layout
(the CSR index arrays are the same for every tool and are not timed). The objective timed
for the ratio is the full residual vector (gather, reprojection errors and w_err).

The fallback for a zero rotation (theta = 0) is not reproduced: no ADBench instance has one.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from tape.bench import adbench
from tape.bench.common import backend
from tape.bench.harness import Case, Impl, Problem, Skip

# shared/adbench/README.md §3.4 (ADBench BaTests.cpp), for ba/test.txt
TEST_ROW_X = np.array([
    228.877202208246757, 634.574811495545418, -782.222866259340549, 2.42892615607159668,
    -11.7828079628011313, 2.54169312487743460, -1.03657084958518086, 0.417022, 0.0,
    -350.739521096005205, -912.107773668008576, -2.42892615607159668, 11.7828079628011313,
    -2.54169312487743460, -0.645167039712987389,
])  # fmt: skip
TEST_ROW_Y = np.array([
    -120.542435994996879, -385.673240766460424, 97.5476291403326456, -1.78372108529576567,
    4.15466799433126077, 2.04025718029898906, 0.349176397433145880, 0.0, 0.417022,
    118.149147704414503, 307.250108960343255, 1.78372108529576567, -4.15466799433126077,
    -2.04025718029898906, 0.623335921553064054,
])  # fmt: skip
TEST_WERR_ROW = -0.834044
RESIDUALS = dict(  # README §3: every ba1..ba20 residual, and ba/test.txt's
    ba=(1.013358379144e-01, -6.896776592448e-02, 8.260926515160e-01),
    test=(-2.690488492354e-01, 2.599447926779e-01, 8.260926515160e-01),
)


def residual(B, camT, XT, w, featT):
    """Reprojection errors ``(2, p)`` of ``p`` observations, component-major inputs."""
    r0, r1, r2 = camT[0], camT[1], camT[2]
    x0, x1, x2 = XT[0] - camT[3], XT[1] - camT[4], XT[2] - camT[5]
    th = B.sqrt(r0 * r0 + r1 * r1 + r2 * r2)
    ct, st = B.cos(th), B.sin(th)
    v0, v1, v2 = r0 / th, r1 / th, r2 / th
    dt = (v0 * x0 + v1 * x1 + v2 * x2) * (1.0 - ct)
    c0 = x0 * ct + (v1 * x2 - v2 * x1) * st + v0 * dt
    c1 = x1 * ct + (v2 * x0 - v0 * x2) * st + v1 * dt
    c2 = x2 * ct + (v0 * x1 - v1 * x0) * st + v2 * dt
    p0, p1 = c0 / c2, c1 / c2
    rs = p0 * p0 + p1 * p1
    s = (1.0 + camT[9] * rs + camT[10] * rs * rs) * camT[6]
    e0 = w * (p0 * s + camT[7] - featT[0])
    e1 = w * (p1 * s + camT[8] - featT[1])
    return B.stack([e0, e1])


def jacobian_np(g0, g1, werr):
    """Flat Jacobian values in ADBench's CSR order from the two VJPs (each: dcamT (11, p),
    dXT (3, p), dw (p,)) and the w_err diagonal."""
    p = werr.shape[0]
    J = np.empty((p, 2, 15))
    for row, g in ((0, g0), (1, g1)):
        c, x, w = (np.asarray(flat_to(a)) for a in g)
        J[:, row, :11] = c.reshape(11, p).T
        J[:, row, 11:14] = x.reshape(3, p).T
        J[:, row, 14] = w.reshape(p)
    return np.concatenate([J.ravel(), np.asarray(flat_to(werr)).ravel()])


def flat_to(a):
    if hasattr(a, "detach"):
        a = a.detach()
    return np.asarray(a, np.float64)


def objective_np(out):
    reproj, werr = out
    return np.concatenate([flat_to(reproj).T.ravel(), flat_to(werr).ravel()])


def _seeds(p):
    s0 = np.zeros((2, p))
    s0[0] = 1.0
    return s0, s0[::-1].copy()


# ------------------------------------------------------------------ tools


def tape_builder(data):
    def build():
        import tape as tp

        B = backend("tape")
        cams, X, w, obs, feats = data.cams, data.X, data.w, data.obs, data.feats
        o0, o1 = obs[:, 0], obs[:, 1]
        featT = np.ascontiguousarray(feats.T)
        t = tp.record(
            lambda c, x, ww, f: residual(B, c, x, ww, f),
            cams.T[:, o0],
            X.T[:, o1],
            w,
            featT,
            wrt=[0, 1, 2],
        )
        s0, s1 = _seeds(data.p)

        def jac():
            t.forward(cams.T[:, o0], X.T[:, o1], w, featT)
            t.zero_grad()
            t.backward(s0)
            g0 = [g.copy() for g in t.grads]
            t.zero_grad()
            t.backward(s1)
            g1 = [g.copy() for g in t.grads]
            return g0, g1, -2.0 * w

        def obj():
            return t.forward(cams.T[:, o0], X.T[:, o1], w, featT), 1.0 - w * w

        return Impl(
            grad=jac,
            value=obj,
            grad_np=lambda r: jacobian_np(*r),
            value_np=objective_np,
            note=f"{len(t)} entries",
        )

    return build


def tape_per_obs_builder(data):
    def build():
        import tape as tp

        B = backend("tape")
        cams, X, w, obs, feats = data.cams, data.X, data.w, data.obs, data.feats

        def one(cam, x, ww, f):
            return residual(
                B, cam.reshape((11, 1)), x.reshape((3, 1)), ww, f.reshape((2, 1))
            ).reshape((2,))

        t = tp.record(one, cams[0], X[0], w[:1], feats[0], wrt=[0, 1, 2])
        e0, e1 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
        p = data.p

        def jac():
            J = np.empty((p, 2, 15))
            for i in range(p):
                t.forward(cams[obs[i, 0]], X[obs[i, 1]], w[i : i + 1], feats[i])
                for row, seed in ((0, e0), (1, e1)):
                    t.zero_grad()
                    t.backward(seed)
                    gc, gx, gw = t.grads
                    J[i, row, :11] = gc
                    J[i, row, 11:14] = gx
                    J[i, row, 14] = gw[0]
            return J, -2.0 * w

        def obj():
            out = np.empty((p, 2))
            for i in range(p):
                out[i] = t.forward(cams[obs[i, 0]], X[obs[i, 1]], w[i : i + 1], feats[i])
            return out.T, 1.0 - w * w

        return Impl(
            grad=jac, value=obj, value_np=objective_np,
            grad_np=lambda r: np.concatenate([r[0].ravel(), r[1]]), note=f"{len(t)} entries, Python loop",
        )  # fmt: skip

    return build


def jax_builder(data):
    def build():
        B = backend("jax")
        jax, jnp = B.jax, B.jnp
        args = [
            jnp.asarray(a)
            for a in (data.cams, data.X, data.w, data.obs[:, 0], data.obs[:, 1], data.feats.T)
        ]
        s0, s1 = (jnp.asarray(s) for s in _seeds(data.p))

        def jac(cams, X, w, o0, o1, featT):
            r, vjp = jax.vjp(
                lambda c, x, ww: residual(B, c, x, ww, featT), cams.T[:, o0], X.T[:, o1], w
            )
            return vjp(s0), vjp(s1), -2.0 * w

        def obj(cams, X, w, o0, o1, featT):
            return residual(B, cams.T[:, o0], X.T[:, o1], w, featT), 1.0 - w * w

        jj, jo = jax.jit(jac), jax.jit(obj)
        return Impl(
            grad=lambda: jax.block_until_ready(jj(*args)), value=lambda: jax.block_until_ready(jo(*args)),
            grad_np=lambda r: jacobian_np(*r), value_np=objective_np,
        )  # fmt: skip

    return build


def torch_builder(data):
    def build():
        B = backend("torch")
        torch = B.torch
        cams, X, w = (torch.from_numpy(a) for a in (data.cams, data.X, data.w))
        o0, o1 = (
            torch.from_numpy(np.ascontiguousarray(a)) for a in (data.obs[:, 0], data.obs[:, 1])
        )
        featT = torch.from_numpy(np.ascontiguousarray(data.feats.T))
        s0, s1 = (torch.from_numpy(s) for s in _seeds(data.p))

        def jac():
            c = cams.T[:, o0].requires_grad_()
            x = X.T[:, o1].requires_grad_()
            ww = w.detach().requires_grad_()
            r = residual(B, c, x, ww, featT)
            g0 = torch.autograd.grad(r, (c, x, ww), s0, retain_graph=True)
            g1 = torch.autograd.grad(r, (c, x, ww), s1)
            return g0, g1, -2.0 * w

        def obj():
            with torch.no_grad():
                return residual(B, cams.T[:, o0], X.T[:, o1], w, featT), 1.0 - w * w

        return Impl(grad=jac, value=obj, grad_np=lambda r: jacobian_np(*r), value_np=objective_np)

    return build


def autograd_builder(data):
    def build():
        B = backend("autograd")
        from autograd import make_vjp

        cams, X, w, obs, feats = data.cams, data.X, data.w, data.obs, data.feats
        o0, o1 = obs[:, 0], obs[:, 1]
        featT = np.ascontiguousarray(feats.T)
        s0, s1 = _seeds(data.p)
        f = make_vjp(lambda c, x, ww: residual(B, c, x, ww, featT), argnum=(0, 1, 2))

        def jac():
            vjp, _ = f(cams.T[:, o0], X.T[:, o1], w)
            return vjp(s0), vjp(s1), -2.0 * w

        def obj():
            return residual(B, cams.T[:, o0], X.T[:, o1], w, featT), 1.0 - w * w

        return Impl(grad=jac, value=obj, grad_np=lambda r: jacobian_np(*r), value_np=objective_np)

    return build


# ------------------------------------------------------------------ hand-written forward mode (Numba)


@njit(cache=True, error_model="numpy", inline="always")
def _op(V, D, o, val, a, da, b, db):
    """Slot o = val with tangent da * D[a] + db * D[b] (b < 0: unary)."""
    V[o] = val
    if b < 0:
        for j in range(15):
            D[o, j] = da * D[a, j]
    else:
        for j in range(15):
            D[o, j] = da * D[a, j] + db * D[b, j]
    return o


@njit(cache=True, error_model="numpy")
def _ba_one(cam, X, w, feat, V, D, J):
    for j in range(15):
        for k in range(15):
            D[j, k] = 0.0
        D[j, j] = 1.0
    V[:11] = cam
    V[11:14] = X
    V[14] = w
    s = 15
    xo = np.empty(3, np.int64)
    for j in range(3):
        xo[j] = _op(V, D, s, V[11 + j] - V[3 + j], 11 + j, 1.0, 3 + j, -1.0)
        s += 1
    t2 = _op(V, D, s, V[0] * V[0] + V[1] * V[1], 0, 2 * V[0], 1, 2 * V[1])
    s += 1
    t2 = _op(V, D, s, V[t2] + V[2] * V[2], t2, 1.0, 2, 2 * V[2])
    s += 1
    th = math.sqrt(V[t2])
    th_ = _op(V, D, s, th, t2, 0.5 / th, -1, 0.0)
    s += 1
    ct = _op(V, D, s, math.cos(th), th_, -math.sin(th), -1, 0.0)
    s += 1
    st = _op(V, D, s, math.sin(th), th_, math.cos(th), -1, 0.0)
    s += 1
    v = np.empty(3, np.int64)
    for j in range(3):
        v[j] = _op(V, D, s, V[j] / th, j, 1.0 / th, th_, -V[j] / (th * th))
        s += 1
    # dot = v . xo, then dt = dot * (1 - ct)
    dot = _op(V, D, s, V[v[0]] * V[xo[0]], v[0], V[xo[0]], xo[0], V[v[0]])
    s += 1
    for j in (1, 2):
        m = _op(V, D, s, V[v[j]] * V[xo[j]], v[j], V[xo[j]], xo[j], V[v[j]])
        s += 1
        dot = _op(V, D, s, V[dot] + V[m], dot, 1.0, m, 1.0)
        s += 1
    dt = _op(V, D, s, V[dot] * (1.0 - V[ct]), dot, 1.0 - V[ct], ct, -V[dot])
    s += 1
    c = np.empty(3, np.int64)
    for j in range(3):
        a, b = (j + 1) % 3, (j + 2) % 3  # cross_j = v_a xo_b - v_b xo_a
        m1 = _op(V, D, s, V[v[a]] * V[xo[b]], v[a], V[xo[b]], xo[b], V[v[a]])
        s += 1
        m2 = _op(V, D, s, V[v[b]] * V[xo[a]], v[b], V[xo[a]], xo[a], V[v[b]])
        s += 1
        cr = _op(V, D, s, V[m1] - V[m2], m1, 1.0, m2, -1.0)
        s += 1
        t1 = _op(V, D, s, V[xo[j]] * V[ct], xo[j], V[ct], ct, V[xo[j]])
        s += 1
        t2_ = _op(V, D, s, V[cr] * V[st], cr, V[st], st, V[cr])
        s += 1
        t3 = _op(V, D, s, V[v[j]] * V[dt], v[j], V[dt], dt, V[v[j]])
        s += 1
        u = _op(V, D, s, V[t1] + V[t2_], t1, 1.0, t2_, 1.0)
        s += 1
        c[j] = _op(V, D, s, V[u] + V[t3], u, 1.0, t3, 1.0)
        s += 1
    z = V[c[2]]
    p0 = _op(V, D, s, V[c[0]] / z, c[0], 1.0 / z, c[2], -V[c[0]] / (z * z))
    s += 1
    p1 = _op(V, D, s, V[c[1]] / z, c[1], 1.0 / z, c[2], -V[c[1]] / (z * z))
    s += 1
    rs = _op(V, D, s, V[p0] * V[p0] + V[p1] * V[p1], p0, 2 * V[p0], p1, 2 * V[p1])
    s += 1
    k1k = _op(V, D, s, V[9] * V[rs], 9, V[rs], rs, V[9])
    s += 1
    r2 = V[rs] * V[rs]
    k2k = _op(V, D, s, V[10] * r2, 10, r2, rs, 2 * V[10] * V[rs])
    s += 1
    L = _op(V, D, s, 1.0 + V[k1k] + V[k2k], k1k, 1.0, k2k, 1.0)
    s += 1
    sc = _op(V, D, s, V[L] * V[6], L, V[6], 6, V[L])
    s += 1
    for row, (pp, u0) in enumerate(((p0, 7), (p1, 8))):
        q = _op(V, D, s, V[pp] * V[sc], pp, V[sc], sc, V[pp])
        s += 1
        q = _op(V, D, s, V[q] + V[u0] - feat[row], q, 1.0, u0, 1.0)
        s += 1
        e = _op(V, D, s, V[14] * V[q], 14, V[q], q, V[14])
        s += 1
        for j in range(15):
            J[row, j] = D[e, j]


@njit(cache=True, error_model="numpy")
def ba_jacobian_njit(cams, X, w, obs, feats):
    p = w.shape[0]
    J = np.empty((p, 2, 15))
    V = np.empty(128)
    D = np.empty((128, 15))
    for i in range(p):
        _ba_one(cams[obs[i, 0]], X[obs[i, 1]], w[i], feats[i], V, D, J[i])
    return J, -2.0 * w


@njit(cache=True, error_model="numpy")
def ba_objective_njit(cams, X, w, obs, feats):
    p = w.shape[0]
    out = np.empty((2, p))
    for i in range(p):
        cam = cams[obs[i, 0]]
        x0, x1, x2 = X[obs[i, 1], 0] - cam[3], X[obs[i, 1], 1] - cam[4], X[obs[i, 1], 2] - cam[5]
        th = math.sqrt(cam[0] * cam[0] + cam[1] * cam[1] + cam[2] * cam[2])
        ct, st = math.cos(th), math.sin(th)
        v0, v1, v2 = cam[0] / th, cam[1] / th, cam[2] / th
        dt = (v0 * x0 + v1 * x1 + v2 * x2) * (1.0 - ct)
        c0 = x0 * ct + (v1 * x2 - v2 * x1) * st + v0 * dt
        c1 = x1 * ct + (v2 * x0 - v0 * x2) * st + v1 * dt
        c2 = x2 * ct + (v0 * x1 - v1 * x0) * st + v2 * dt
        p0, p1 = c0 / c2, c1 / c2
        rs = p0 * p0 + p1 * p1
        sc = (1.0 + cam[9] * rs + cam[10] * rs * rs) * cam[6]
        out[0, i] = w[i] * (p0 * sc + cam[7] - feats[i, 0])
        out[1, i] = w[i] * (p1 * sc + cam[8] - feats[i, 1])
    return out, 1.0 - w * w


def hand_builder(data):
    a = (data.cams, data.X, data.w, data.obs, data.feats)

    def build():
        return Impl(
            grad=lambda: ba_jacobian_njit(*a), value=lambda: ba_objective_njit(*a), value_np=objective_np,
            grad_np=lambda r: np.concatenate([r[0].ravel(), r[1]]),
        )  # fmt: skip

    return build


def builders(data, per_obs=False):
    out = {"tape": tape_builder(data)}
    if per_obs:
        out["tape per-obs"] = tape_per_obs_builder(data)
    out["njit (hand)"] = hand_builder(data)
    out["jax jit"] = jax_builder(data)
    out["torch"] = torch_builder(data)
    out["autograd"] = autograd_builder(data)
    return out


def ba_cases(opts):
    root = adbench.find_data_dir(opts.data_dir)
    if root is None:
        raise Skip(f"no ADBench data (set ${adbench.ENV_VAR} or --adbench)")
    out = []
    files = adbench.ba_files(root)
    for k, (label, path) in enumerate(files):
        if opts.quick and k > 0:
            break
        data = adbench.read_ba(path)
        per_obs = k == 0 and not opts.quick
        case = Case(
            "ba", f"{label} p={data.p}", data.p, builders(data, per_obs=per_obs), ratio=True
        )
        if k == 0 and opts.quick:
            case.notes.append(
                "tape per-obs (Python loop over observations) runs in the full suite only"
            )
        out.append(case)
    return out


PROBLEMS = [
    Problem(
        "ba",
        "ADBench bundle adjustment sparse Jacobian (2 VJPs on the vectorised residual)",
        "observations p",
        ba_cases,
        ratio=True,
    ),
]
