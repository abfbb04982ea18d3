"""``tape.optimize``: SciPy's optimisers with derivatives from one recorded tape.

:func:`minimize` records ``fn`` once and gives ``scipy.optimize.minimize`` the gradient
(``jac``), Hessian-vector products (``hessp``: Newton-CG, trust-ncg, trust-krylov,
trust-constr) or the Hessian (``hess``: dogleg, trust-exact), and Jacobians of the
constraints. :func:`least_squares` gives ``scipy.optimize.least_squares`` the residual's
Jacobian, sparse (by colouring, :meth:`tape.Tape.jacobian`) where it pays. Bounds and other
options pass through unchanged.

Given Dask arrays among its ``args``, :func:`minimize` minimises the sum of ``fn`` over their
chunks on a Dask cluster: gradients from :func:`tape.distributed.value_and_grad`, Hessian-vector
products from :func:`tape.distributed.hvp` (Newton-CG and the other ``hessp`` methods).
"""

from __future__ import annotations

import numpy as np
import scipy.optimize as so

from tape.frontend.record import record

__all__ = ["minimize", "least_squares"]

HESSP_METHODS = ("newton-cg", "trust-ncg", "trust-krylov", "trust-constr")
HESS_METHODS = ("dogleg", "trust-exact")
GRADIENT_FREE = ("nelder-mead", "powell", "cobyla", "cobyqa")


def _record(fn, x0, args):
    x0 = np.asarray(x0, np.float64)
    return record(fn, x0, *args, wrt=0, dtype=np.float64), x0.shape


def _constraint_jacobians(constraints, x0, shape):
    """Constraints with their Jacobians from tapes where the caller gave none."""
    if constraints is None:
        return ()
    single = isinstance(constraints, (dict, so.NonlinearConstraint, so.LinearConstraint))
    out = []
    for c in [constraints] if single else list(constraints):
        if isinstance(c, dict) and "jac" not in c:
            c = dict(c)
            t, _ = _record(c["fun"], x0.reshape(shape), tuple(c.get("args", ())))
            c["jac"] = _jac_of(t, shape)
        elif isinstance(c, so.NonlinearConstraint) and isinstance(c.jac, str):
            t, _ = _record(c.fun, x0.reshape(shape), ())
            c = so.NonlinearConstraint(
                _flat_fun(t, shape), c.lb, c.ub, jac=_jac_of(t, shape), hess=c.hess,
                keep_feasible=c.keep_feasible,
            )  # fmt: skip
        out.append(c)
    return out[0] if single else out


def _flat_fun(t, shape):
    return lambda x, *a: np.asarray(t.forward(x.reshape(shape), *a), np.float64)


def _jac_of(t, shape):
    n = int(np.prod(shape, dtype=np.int64))

    def jac(x, *a):
        return np.asarray(t.jacobian(x.reshape(shape), *a), np.float64).reshape(-1, n)

    return jac


def minimize(fn, x0, args=(), method=None, jac=None, hess=None, hessp=None, constraints=(),
             **kw):  # fmt: skip
    """``scipy.optimize.minimize(fn, x0, ...)`` with derivatives from a tape of ``fn``.

    ``fn(x, *args)`` takes tensors and returns a scalar tensor; ``x0`` may have any shape
    (SciPy sees it flattened; the result's ``x`` has ``x0``'s shape). ``args`` are replayed as
    data (same shapes at every call). Derivatives the caller passes (``jac``, ``hess``,
    ``hessp``, a constraint's ``jac``) are used as given. ``method=None`` is SciPy's default.
    Returns SciPy's ``OptimizeResult``.

    With Dask arrays in ``args`` (all of them then, rows along their first axis), the objective
    is the sum of ``fn(x, *chunk)`` over their chunks, computed on a Dask cluster
    (:mod:`tape.distributed`; ``client=`` and ``n_workers=`` go there): the gradient by
    :func:`tape.distributed.value_and_grad`, ``hessp`` by :func:`tape.distributed.hvp`.
    Methods that need the dense Hessian (``dogleg``, ``trust-exact``) and constraints without
    their own Jacobian raise ``ValueError`` there.
    """
    if any(hasattr(a, "dask") and hasattr(a, "chunks") for a in args):
        return _minimize_chunks(fn, x0, tuple(args), method, jac, hess, hessp, constraints, kw)
    t, shape = _record(fn, x0, tuple(args))
    x0f = np.asarray(x0, np.float64).ravel()

    def fun(x, *a):
        v, g = t.value_and_grad(x.reshape(shape), *a)
        return float(v), np.asarray(g, np.float64).ravel()

    def hvp(x, p, *a):
        return np.asarray(t.hvp(x.reshape(shape), *a, v=p.reshape(shape)), np.float64).ravel()

    def dense_hess(x, *a):
        n = x.size
        return np.asarray(t.hessian(x.reshape(shape), *a), np.float64).reshape(n, n)

    def value(x, *a):
        return float(t.forward(x.reshape(shape), *a))

    options = dict(kw)
    cons = _constraint_jacobians(constraints, x0f, shape)
    if cons != () and cons != []:
        options["constraints"] = cons
    derivs = (fun, value, hvp, dense_hess)
    return _scipy_minimize(derivs, x0f, shape, tuple(args), method, jac, hess, hessp, options)


def _scipy_minimize(derivs, x0f, shape, args, method, jac, hess, hessp, options):
    """``scipy.optimize.minimize`` given ``derivs = (value_and_grad, value, hvp, dense_hess)``
    of the objective (functions of the flat ``x`` and ``args``), each used where the method
    wants it and the caller passed none; the result's ``x`` has ``shape``."""
    fun, value, hvp, dense_hess = derivs
    m = (method or "").lower() if isinstance(method, str) else None
    if m in GRADIENT_FREE:
        target, jac_arg = value, None
    elif jac is None:
        target, jac_arg = fun, True
    else:
        target, jac_arg = value, jac
    if hess is None and hessp is None:
        if m in HESSP_METHODS:
            options["hessp"] = hvp
        elif m in HESS_METHODS:
            options["hess"] = dense_hess
    else:
        if hess is not None:
            options["hess"] = hess
        if hessp is not None:
            options["hessp"] = hessp
    res = so.minimize(target, x0f, args=args, method=method, jac=jac_arg, **options)
    res.x = res.x.reshape(shape)
    return res


def _minimize_chunks(fn, x0, data, method, jac, hess, hessp, constraints, kw):
    """:func:`minimize` of the sum of ``fn`` over the chunks of Dask arrays ``data``."""
    from tape.frontend import distributed as D

    if not all(hasattr(a, "dask") and hasattr(a, "chunks") for a in data):
        raise TypeError(
            "tape.optimize.minimize: with Dask arrays in args, every arg must be one (the data "
            "whose chunks the objective sums over)"
        )
    where = {k: kw.pop(k) for k in ("client", "n_workers") if k in kw}
    x0 = np.asarray(x0, np.float64)
    shape = x0.shape
    m = (method or "").lower() if isinstance(method, str) else None
    if m in HESS_METHODS and hess is None:
        raise ValueError(
            f"tape.optimize.minimize: {method} needs the dense Hessian, which is not summed over "
            "Dask chunks; use Newton-CG, trust-ncg or trust-krylov (Hessian-vector products)"
        )
    if constraints:
        cs = [constraints] if isinstance(constraints, dict) else list(constraints)
        if any(isinstance(c, dict) and "jac" not in c for c in cs):
            raise ValueError(
                "tape.optimize.minimize: constraints over Dask chunks need their own 'jac'"
            )
        kw["constraints"] = constraints

    def fun(x):
        v, g = D.value_and_grad(fn, x.reshape(shape), *data, **where)
        return float(v), np.asarray(g, np.float64).ravel()

    def hvp(x, p):
        h = D.hvp(fn, x.reshape(shape), p.reshape(shape), *data, **where)
        return np.asarray(h, np.float64).ravel()

    derivs = (fun, lambda x: fun(x)[0], hvp, None)  # HESS_METHODS were refused above
    return _scipy_minimize(derivs, x0.ravel(), shape, (), method, jac, hess, hessp, kw)


SPARSE_DENSITY = 0.1
"""``least_squares(sparse="auto")`` uses a sparse Jacobian below this density (and more than
100 unknowns)."""


def least_squares(residual, x0, args=(), sparse="auto", **kw):
    """``scipy.optimize.least_squares(residual, x0, ...)`` with the Jacobian from a tape of
    ``residual``.

    ``residual(x, *args)`` takes tensors and returns a tensor of residuals (any shape; SciPy
    sees it flattened). ``sparse``: ``True`` gives SciPy a ``csr_matrix`` Jacobian evaluated by
    colouring (:meth:`tape.Tape.jacobian` with ``sparse=True``), ``False`` a dense one,
    ``"auto"`` (default) sparse when there are more than 100 unknowns, the pattern's density is
    under :data:`SPARSE_DENSITY` and ``method`` is not ``"lm"`` (which takes dense Jacobians
    only). A ``jac`` the caller passes is used as given. Returns SciPy's ``OptimizeResult``
    (``x`` with ``x0``'s shape).
    """
    if sparse not in ("auto", True, False):
        raise ValueError(f"least_squares: sparse must be 'auto', True or False, got {sparse!r}")
    t, shape = _record(residual, x0, tuple(args))
    x0f = np.asarray(x0, np.float64).ravel()
    n = x0f.size
    if sparse == "auto":
        pat = t.sparsity(np.asarray(x0, np.float64), *args).jacobian
        dens = pat.nnz / max(1, pat.shape[0] * pat.shape[1])
        sparse = n > 100 and dens < SPARSE_DENSITY and kw.get("method") != "lm"
    if sparse and kw.get("method") == "lm":
        raise ValueError("least_squares: method='lm' takes dense Jacobians only (use sparse=False)")

    def fun(x, *a):
        return np.asarray(t.forward(x.reshape(shape), *a), np.float64).ravel()

    def jac(x, *a):
        if sparse:
            return t.jacobian(x.reshape(shape), *a, sparse=True)
        return np.asarray(t.jacobian(x.reshape(shape), *a), np.float64).reshape(-1, n)

    kw.setdefault("jac", jac)
    if sparse:
        kw.setdefault("tr_solver", "lsmr")
    res = so.least_squares(fun, x0f, args=tuple(args), **kw)
    res.x = res.x.reshape(shape)
    return res
