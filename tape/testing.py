"""Gradient checks users can call in their own tests."""

from __future__ import annotations

import numpy as np

from tape._tensor import Tensor
from tape.record import record


class GradcheckError(AssertionError):
    """The analytic gradient disagrees with central finite differences."""


def _numpy_args(inputs):
    out = []
    for k, x in enumerate(inputs):
        v = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
        if v.dtype.kind not in "biuf":
            raise TypeError(f"gradcheck: input {k} is not numeric (dtype {v.dtype})")
        out.append(np.array(v, dtype=np.float64) if v.dtype.kind == "f" else v.copy())
    return out


def gradcheck(fn, *inputs, eps=1e-6, atol=1e-5, rtol=1e-3, wrt=None, max_full=64, n_directions=3, seed=0):
    """Compare the tape's gradient of ``fn`` with central finite differences, in float64.

    ``fn`` takes tensors and returns a tensor (any shape). For inputs and outputs of at most
    ``max_full`` elements the full Jacobian is compared element by element; larger ones are
    compared along ``n_directions`` random projections ``<u, J v>`` (the dot-product test).

    Returns True, or raises :class:`GradcheckError` naming the input, the worst element, the
    analytic and the numeric value.
    """
    args = _numpy_args(inputs)
    t = record(fn, *args, wrt=wrt, dtype=np.float64)
    y0 = np.asarray(t.forward(*args), np.float64)
    n_out = y0.size
    rng = np.random.default_rng(seed)

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
                _compare(np.array([[ana]]), np.array([[numv]]), atol, rtol, k, "<u, J v> (random projection)", None, None)
    return True


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
