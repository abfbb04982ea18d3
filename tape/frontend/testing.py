"""Gradient checks users can call in their own tests, and the one sampler of op inputs the
test suite uses (:func:`sample_inputs`)."""

from __future__ import annotations

import numpy as np

from tape.frontend.record import record
from tape.frontend.tensor import Tensor
from tape.layout.columns import B_KIND, B_SIZE, CONST, E_IN0, E_OP, E_OUT
from tape.ops import registry
from tape.program.replay import run_entry, run_entry_back


class GradcheckError(AssertionError, RuntimeError):
    """The analytic gradient disagrees with central finite differences (an ``AssertionError``,
    and a ``RuntimeError`` as PyTorch's ``torch.autograd.gradcheck.GradcheckError``)."""


def _numpy_args(inputs):
    out = []
    for k, x in enumerate(inputs):
        v = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
        if v.dtype.kind not in "biuf":
            raise TypeError(f"gradcheck: input {k} is not numeric (dtype {v.dtype})")
        out.append(np.array(v, dtype=np.float64) if v.dtype.kind == "f" else v.copy())
    return out


def gradcheck(fn, *inputs, eps=1e-6, atol=1e-5, rtol=1e-3, wrt=None, max_full=64, n_directions=3,
              seed=0, n_points=1, scale=0.5, order=1, check_forward_ad=True):  # fmt: skip
    """Compare the tape's gradient of ``fn`` with central finite differences, in float64.

    ``fn`` takes tensors and returns a tensor (any shape). For inputs and outputs of at most
    ``max_full`` elements the full Jacobian is compared element by element; larger ones are
    compared along ``n_directions`` random projections ``<u, J v>`` (the dot-product test).

    With ``n_points`` > 1 the check also runs at ``n_points - 1`` random points near the inputs
    (each floating input plus ``scale`` times standard normal noise), and at each of them the
    tape recorded at ``inputs`` is replayed and compared with a fresh recording there: a
    recording that froze a path (a branch or value that depends on the inputs) disagrees.

    Forward mode is checked against reverse mode at each point: ``<J v, u> == <v, J^T u>`` for
    ``n_directions`` random ``u``, ``v`` (:meth:`Tape.jvp` against :meth:`Tape.vjp`, to
    rounding), unless the tape calls Python (a custom op or ``autograd.Function``, which
    forward mode does not take) or ``check_forward_ad=False`` (PyTorch's name; the forward-mode
    kernels of the tape's ops then need not compile, a few seconds in a new process). With ``order=2`` (scalar ``fn``) Hessian-vector products (:meth:`Tape.hvp`) are
    also compared with central differences of the gradient along ``n_directions`` random
    directions.

    Returns True, or raises :class:`GradcheckError` naming the point, the input, the worst
    element, the analytic and the numeric value, and the first tape entry whose own local
    derivative disagrees with finite differences (the op and ``file:line`` that recorded it).

    Examples
    --------
    >>> import numpy as np, tape as tp
    >>> tp.gradcheck(lambda x: tp.sin(x) * x, np.linspace(0.0, 1.0, 4))
    True
    """
    base = _numpy_args(inputs)
    # the interpreter: a check replays each tape a few times, never enough to repay a compile
    t0 = record(fn, *base, wrt=wrt, dtype=np.float64, compile=False)
    rng = np.random.default_rng(seed)
    for point in range(max(1, int(n_points))):
        if point == 0:
            args, t = base, t0
        else:
            args = [
                a + scale * rng.standard_normal(a.shape) if a.dtype.kind == "f" else a for a in base
            ]
            t = record(fn, *args, wrt=wrt, dtype=np.float64, compile=False)
            _compare_replay(t0, t, args, point)
        if order not in (1, 2):
            raise ValueError(f"gradcheck: order must be 1 or 2, got {order!r}")
        try:
            _check_point(t, args, eps, atol, rtol, max_full, n_directions, rng)
            # forward mode takes no Python callbacks (custom ops, Functions)
            if check_forward_ad and not t.callbacks:
                _check_jvp(t, args, n_directions, rng)
            if order == 2:
                _check_hvp(t, args, eps, atol, rtol, n_directions, rng)
        except GradcheckError as e:
            where = "" if point == 0 else f"at random point {point} (seed={seed}, scale={scale}): "
            raise GradcheckError(
                where + str(e) + _first_bad_entry(t, args, eps, atol, rtol, rng)
            ) from None
    return True


def _compare_replay(t0, t, args, point):
    """The tape recorded at the first point, replayed at ``args``, against a fresh recording."""
    v0, v = t0.forward(*args), t.forward(*args)
    same = np.allclose(
        np.asarray(v0, np.float64), np.asarray(v, np.float64), rtol=1e-9, atol=1e-12, equal_nan=True
    )
    if same and t.signature.n_seed == 1:
        ga, gb = t0.gradient(*args), t.gradient(*args)
        ga = ga if isinstance(ga, tuple) else (ga,)
        gb = gb if isinstance(gb, tuple) else (gb,)
        same = all(np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True) for a, b in zip(ga, gb))
    if not same:
        raise GradcheckError(
            f"at random point {point}: the tape recorded at the inputs, replayed here, disagrees "
            "with a fresh recording here: the recording froze something that depends on the "
            "inputs (a value that left the tape without a guard, such as a NumPy array computed "
            "outside tape ops, or state outside the function)"
        )


def _check_point(t, args, eps, atol, rtol, max_full, n_directions, rng):
    y0 = np.asarray(t.forward(*args), np.float64)
    n_out = y0.size

    def f(xs):
        return np.asarray(t.forward(*xs), np.float64).ravel()

    def vjp(u):
        t.forward(*args)
        t.zero_grad()
        t.backward(u.reshape(y0.shape))
        return [g.copy() for g in t.grads]

    for pos, k in enumerate(t.wrt):
        x = args[k]
        full = x.size <= max_full and n_out <= max_full
        if full:
            jac = np.zeros((n_out, x.size))
            for r in range(n_out):
                u = np.zeros(n_out)
                u[r] = 1.0
                jac[r] = vjp(u)[pos].ravel()
            num = np.zeros_like(jac)
            for j in range(x.size):
                xp = [a.copy() for a in args]
                xm = [a.copy() for a in args]
                xp[k].flat[j] += eps
                xm[k].flat[j] -= eps
                num[:, j] = (f(xp) - f(xm)) / (2 * eps)
            _compare(jac, num, atol, rtol, k, "d output[{r}] / d input[{j}]", x.shape, y0.shape)
        else:
            for _ in range(n_directions):
                u = rng.standard_normal(n_out)
                v = rng.standard_normal(x.shape)
                ana = float(np.vdot(vjp(u)[pos], v))
                xp = [a.copy() for a in args]
                xm = [a.copy() for a in args]
                xp[k] = xp[k] + eps * v
                xm[k] = xm[k] - eps * v
                numv = float(np.dot(u, (f(xp) - f(xm)) / (2 * eps)))
                _compare(
                    np.array([[ana]]),
                    np.array([[numv]]),
                    atol,
                    rtol,
                    k,
                    "<u, J v> (random projection)",
                    None,
                    None,
                )


def _check_jvp(t, args, n_directions, rng):
    """Forward mode against reverse mode: ``<J v, u> == <v, J^T u>`` to rounding."""
    wrt_shapes = [args[k].shape for k in t.wrt]
    for _ in range(n_directions):
        vs = tuple(rng.standard_normal(s) for s in wrt_shapes)
        y, jv = t.jvp(*args, tangents=vs)
        ys = y if isinstance(y, tuple) else (y,)
        jvs = jv if isinstance(jv, tuple) else (jv,)
        us = tuple(rng.standard_normal(np.shape(a)) for a in ys)
        _, g = t.vjp(*args, cotangent=us if isinstance(y, tuple) else us[0])
        gs = g if isinstance(g, tuple) else (g,)
        jvs = [np.asarray(p, np.float64) for p in jvs]
        gs = [np.asarray(q, np.float64) for q in gs]
        a = sum(float(np.vdot(p, u)) for p, u in zip(jvs, us))
        b = sum(float(np.vdot(q, v)) for q, v in zip(gs, vs))
        size = sum(float(np.vdot(np.abs(p), np.abs(u))) for p, u in zip(jvs, us))
        size += sum(float(np.vdot(np.abs(q), np.abs(v))) for q, v in zip(gs, vs))
        if not abs(a - b) <= 1e-9 * size:  # both are exact: only rounding separates them
            raise GradcheckError(
                f"forward and reverse mode disagree: <J v, u> = {a!r} (jvp), <v, J^T u> = {b!r} "
                "(vjp)"
            )


def _check_hvp(t, args, eps, atol, rtol, n_directions, rng):
    """Hessian-vector products against central differences of the gradient."""
    if t.signature.n_seed != 1:
        raise ValueError("gradcheck(order=2) needs a scalar function")
    for _ in range(n_directions):
        vs = [rng.standard_normal(args[k].shape) for k in t.wrt]
        hv = t.hvp(*args, v=tuple(vs) if len(vs) > 1 else vs[0])
        hv = hv if isinstance(hv, tuple) else (hv,)
        xp = [a.copy() for a in args]
        xm = [a.copy() for a in args]
        for k, v in zip(t.wrt, vs):
            xp[k] = xp[k] + eps * v
            xm[k] = xm[k] - eps * v
        gp, gm = t.gradient(*xp), t.gradient(*xm)
        gp = gp if isinstance(gp, tuple) else (gp,)
        gm = gm if isinstance(gm, tuple) else (gm,)
        for pos, k in enumerate(t.wrt):
            num = ((gp[pos] - gm[pos]) / (2 * eps)).reshape(1, -1)
            _compare(np.asarray(hv[pos], np.float64).reshape(1, -1), num, atol, rtol, k,
                     "Hessian-vector product, element {j}", None, None)  # fmt: skip


def _first_bad_entry(t, args, eps, atol, rtol, rng):
    """Check each entry's own derivative (its reverse rule against finite differences of its
    forward rule, on the values of this point) and describe the first that disagrees."""
    t.forward(*args)
    ka = t.kernel_args()
    data = ka.data.copy()
    entries, bufs = t.entries, t.bufs

    def flat(arena, b):  # buffer b of arena, as a writable flat view
        return t.view(arena, b).reshape(-1)

    for i in range(t.n_entries):
        if entries[i, E_OP] < 0:
            continue  # a Python callback (Function, custom_op, checkpoint): not a registry op
        op = registry.OPS[entries[i, E_OP]]
        out = int(entries[i, E_OUT])
        diff = op.differentiable
        ins = []
        for k in range(E_IN0, E_OUT):
            b = int(entries[i, k])
            if (
                b >= 0
                and k - E_IN0 < len(diff)
                and diff[k - E_IN0]
                and bufs[b, B_KIND] != CONST
                and b not in ins
            ):
                ins.append(b)
        if not ins or bufs[out, B_KIND] == CONST or not op.rev[0]:
            continue
        u = rng.standard_normal(int(bufs[out, B_SIZE]))
        vs = {b: rng.standard_normal(int(bufs[b, B_SIZE])) for b in ins}
        grad = np.zeros_like(data)
        flat(grad, out)[:] = u
        run_entry_back(t, i, data, grad, entries, bufs)
        ana = sum(float(np.dot(flat(grad, b), vs[b])) for b in ins)
        ys = []
        for sign in (1.0, -1.0):
            d = data.copy()
            for b in ins:
                flat(d, b)[:] += sign * eps * vs[b]
            run_entry(t, i, d, entries, bufs)
            ys.append(flat(d, out).copy())
        num = float(np.dot(u, (ys[0] - ys[1]) / (2 * eps)))
        if not abs(ana - num) <= atol + rtol * abs(num):
            src = t.sources.get(i, "")
            return (
                f"\nfirst entry whose local derivative disagrees: entry {i} ({op.name})"
                + (f" recorded at {src}" if src else "")
                + f": <u, J v> analytic {ana!r}, numeric {num!r}"
            )
    if t.callbacks:
        names = ", ".join(sorted({c.label for c in t.callbacks.values()}))
        return (
            "\n(every registry op's local derivative agrees with finite differences; the tape "
            f"also calls Python, whose rules are not checked entry by entry: {names}. Check "
            "those first, e.g. a custom_op's vjp)"
        )
    return "\n(every entry's local derivative agrees with finite differences: the disagreement comes from how the entries are combined)"


def sample_inputs(op, shapes, rng):
    """Inputs of ``shapes`` (one per input) for elementwise ``op`` (a
    :class:`tape.registry.Op`), drawn with ``rng`` as the record says: uniform on its domain
    (``Op.domain``, or ``Op.domains`` per input), ``0.0`` / ``1.0`` for its ``masks``, and
    moved at least ``0.09`` away from its ``kinks``, where finite differences would straddle
    a jump of the derivative. Returns a list of float64 arrays."""
    xs = []
    for k, shape in enumerate(shapes):
        if k in op.masks:
            xs.append((rng.uniform(size=shape) > 0.5).astype(float))
        else:
            lo, hi = op.domain_of(k)
            xs.append(rng.uniform(lo, hi, shape))
    for coef in op.kinks:
        j = max(k for k, c in enumerate(coef) if c)  # the input that moves
        for _ in range(10):
            near = np.abs(sum(c * x for c, x in zip(coef, xs) if c)) < 1e-2
            if not near.any():
                break
            xs[j] = np.asarray(xs[j] + 0.1 * _any_to(near, np.shape(xs[j])))
    return xs


def _any_to(mask, shape):
    """``mask``, broadcast from ``shape``, reduced back to ``shape`` by ``any``."""
    lead = mask.ndim - len(shape)
    m = mask.any(axis=tuple(range(lead))) if lead else mask
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and m.shape[k] != 1)
    return m.any(axis=axes, keepdims=True) if axes else m


def _compare(ana, num, atol, rtol, k, what, xshape, yshape):
    err = np.abs(ana - num) - (atol + rtol * np.abs(num))
    bad = ~(err <= 0)  # catches NaN as a failure
    if bad.any():
        r, j = np.unravel_index(np.argmax(np.where(np.isnan(err), np.inf, err)), err.shape)
        where = what
        if xshape is not None:
            jj = np.unravel_index(j, xshape) if xshape else ()
            rr = np.unravel_index(r, yshape) if yshape else ()
            where = f"d output{list(rr)} / d input {k}{list(jj)}"
        raise GradcheckError(
            f"gradcheck failed for input {k}: {where}: analytic {ana[r, j]!r}, numeric {num[r, j]!r} "
            f"(atol={atol}, rtol={rtol}; {int(bad.sum())} of {bad.size} elements disagree)"
        )
