"""NumPy and SciPy calls on tensors: ``np.sin(x)``, ``np.sum(x, axis=0)``, ``np.dot(a, b)``,
``scipy.special.gammaln(x)`` record tape ops, so numerical code written for NumPy records and
differentiates unmodified.

Tensors take part in NumPy's two dispatch protocols: ``__array_ufunc__`` (NEP 13: every ufunc
call, ``ndarray + tensor`` included) and ``__array_function__`` (NEP 18: ``np.sum``,
``np.concatenate``, ``np.linalg.solve``, ...). A call is mapped to the tape function of the
same meaning (:data:`UFUNCS`, :data:`FUNCTIONS`), with NumPy's argument names and defaults;
plain arrays and Python numbers mix with tensors as constants. The result is a tensor.

Nothing is silent. A NumPy or SciPy call that tape has no op for, on a tensor that is traced
(inside :func:`tape.record`, or requiring a gradient), raises ``TypeError`` naming the
function: it never turns the tensor into a constant behind the user's back. On other tensors
it runs NumPy's own implementation on their values and returns what NumPy returns. Writing
into an array (``out=``, ``np.add.at``) with a traced tensor raises as well. ``np.asarray(t)``
and ``float(t)`` keep their meaning: the value taken as a constant on purpose (a guard inside
a recording).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from tape.frontend import functional as fn
from tape.frontend import linalg, tensor
from tape.ops import registry

Tensor = tensor.Tensor


def traced(x) -> bool:
    """Whether ``x`` is a tensor whose value a gradient flows through: taped (inside a
    recording, or computed from tensors that require grad) or itself requiring grad."""
    return isinstance(x, Tensor) and (x._rg or x._tape is not None)


def _any_traced(args) -> bool:
    for a in args:
        if isinstance(a, (list, tuple)):
            if _any_traced(a):
                return True
        elif traced(a):
            return True
    return False


def _values(args):
    """``args`` with every tensor replaced by its value (lists and tuples walked)."""
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(a._peek())
        elif isinstance(a, (list, tuple)):
            out.append(type(a)(_values(a)))
        else:
            out.append(a)
    return out


def _name(f) -> str:
    mod = getattr(f, "__module__", None) or "numpy"
    name = getattr(f, "__name__", repr(f))
    if isinstance(f, np.ufunc):
        sp = sys.modules.get("scipy.special")
        mine = getattr(np, name, None) is f
        mod = "scipy.special" if not mine and getattr(sp, name, None) is f else "numpy"
    return f"{mod}.{name}".replace("numpy.core.", "numpy.").replace("numpy._core.", "numpy.")


def _refuse(what, why):
    raise TypeError(
        f"tape: {what} {why}. Record it with tape ops (tape.<name>), wrap it as an op of its own "
        "(tape.custom_op, with its derivative), or take the value as a constant on purpose "
        "(np.asarray(x))"
    )


# ---------------------------------------------------------------- ufuncs


def _identity(x):
    return x


def _deg2rad(x):
    return fn.mul(x, math.pi / 180.0)


def _rad2deg(x):
    return fn.mul(x, 180.0 / math.pi)


def _isnan(x):
    return fn.not_equal(x, x)


def _isinf(x):
    return fn.equal(fn.abs(x), math.inf)


def _isfinite(x):
    return fn.less(fn.abs(x), math.inf)


def _logit(x):
    return fn.sub(fn.log(x), fn.log1p(fn.neg(x)))


def _numpy_table():
    table = {}
    for op in registry.OPS:
        u = getattr(np, op.name, None)
        if op.kind != "structural" and isinstance(u, np.ufunc):
            table[u] = getattr(fn, op.name)
    table.update({
        np.subtract: fn.sub, np.multiply: fn.mul, np.divide: fn.div, np.negative: fn.neg,
        np.power: fn.pow, np.float_power: fn.pow, np.absolute: fn.abs, np.fabs: fn.abs,
        np.positive: _identity, np.conjugate: _identity, np.matmul: fn.matmul,
        np.deg2rad: _deg2rad, np.radians: _deg2rad, np.rad2deg: _rad2deg,
        np.degrees: _rad2deg, np.logical_and: fn.logical_and, np.logical_or: fn.logical_or,
        np.logical_xor: fn.logical_xor, np.logical_not: fn.logical_not, np.isnan: _isnan,
        np.isinf: _isinf, np.isfinite: _isfinite,
    })  # fmt: skip
    return table


UFUNCS = _numpy_table()
"""NumPy ufunc -> the tape function it records (every elementwise registry op with a NumPy
name, and NumPy's other spellings of them)."""

_SCIPY: dict = {}


def _scipy_table():
    """``scipy.special``'s ufuncs that tape has ops for; built once SciPy's module is loaded
    (tape never imports it for this)."""
    sp = sys.modules.get("scipy.special")
    if sp is None or _SCIPY:
        return _SCIPY
    for name, f in (
        ("gammaln", fn.lgamma), ("psi", fn.digamma), ("digamma", fn.digamma), ("erf", fn.erf),
        ("erfc", fn.erfc), ("erfinv", fn.erfinv), ("expit", fn.sigmoid), ("logit", _logit),
        ("xlogy", fn.xlogy), ("log1p", fn.log1p), ("expm1", fn.expm1), ("exp2", fn.exp2),
        ("cbrt", fn.cbrt),
    ):  # fmt: skip
        u = getattr(sp, name, None)
        if isinstance(u, np.ufunc):
            _SCIPY[u] = f
    return _SCIPY


def scipy_ufuncs() -> dict:
    """``scipy.special`` ufunc -> the tape function it records (imports SciPy)."""
    import scipy.special  # noqa: F401

    return dict(_scipy_table())


def _axis0(kwargs, default=0):
    return kwargs.pop("axis", default)


def _reduce(sum_like):
    def reduce(x, axis=0, dtype=None, out=None, keepdims=False, **rest):
        if rest:
            raise TypeError(f"unsupported arguments {sorted(rest)}")
        return sum_like(x, axis=axis, keepdims=keepdims)

    return reduce


def _accumulate(scan):
    def accumulate(x, axis=0, dtype=None, out=None):
        return scan(x, axis=axis)

    return accumulate


REDUCE = {
    np.add: _reduce(fn.sum), np.multiply: _reduce(fn.prod), np.maximum: _reduce(fn.amax),
    np.minimum: _reduce(fn.amin), np.logaddexp: _reduce(fn.logsumexp),
}  # fmt: skip
"""``ufunc.reduce`` calls tape records (``np.add.reduce`` is a sum)."""

ACCUMULATE = {
    np.add: _accumulate(fn.cumsum), np.multiply: _accumulate(fn.cumprod),
    np.logaddexp: _accumulate(fn.logcumsumexp),
}  # fmt: skip
"""``ufunc.accumulate`` calls tape records."""

_CALL_DEFAULTS = {"out": None, "where": True, "dtype": None, "casting": "same_kind",
                  "order": "K", "subok": True}  # fmt: skip


def _out_given(out):
    return out is not None and not (isinstance(out, tuple) and all(o is None for o in out))


def array_ufunc(self, ufunc, method, *inputs, **kwargs):
    """``Tensor.__array_ufunc__``: a NumPy (or ``scipy.special``) ufunc call on tensors."""
    if method == "__call__" and not kwargs:  # the common call (``ndarray * tensor``): no checks
        f = UFUNCS.get(ufunc)
        if f is not None:
            return f(*inputs)
    what = _name(ufunc) + ("" if method == "__call__" else f".{method}")
    is_traced = _any_traced(inputs)
    if _out_given(kwargs.get("out")):
        if is_traced:
            _refuse(f"{what}(..., out=...)", "writes into an array, which carries no gradient")
        return _numpy_fallback(getattr(ufunc, method), inputs, kwargs)
    kwargs.pop("out", None)
    f = None
    if method == "__call__":
        f = UFUNCS.get(ufunc) or _scipy_table().get(ufunc)
        bad = [k for k, v in kwargs.items() if not (k in _CALL_DEFAULTS and _same(v, k))]
        if f is not None and bad:
            if is_traced:
                _refuse(f"{what}(..., {', '.join(bad)}=...)", "takes arguments tape does not map")
            f = None
        kwargs = {}
    elif method == "reduce":
        f = REDUCE.get(ufunc)
    elif method == "accumulate":
        f = ACCUMULATE.get(ufunc)
    if f is None:
        if is_traced:
            _refuse(what, "has no tape op, so it cannot carry a gradient")
        return _numpy_fallback(getattr(ufunc, method), inputs, kwargs)
    return f(*inputs, **kwargs)


def _same(v, k):
    d = _CALL_DEFAULTS[k]
    if k == "dtype":
        return v is None
    return v is d or (isinstance(v, (bool, str)) and v == d)


def _numpy_fallback(f, args, kwargs):
    """NumPy's own implementation on the tensors' values (no tensor here is traced)."""
    return f(*_values(args), **{k: _values([v])[0] for k, v in kwargs.items()})


# ---------------------------------------------------------------- functions


def _no_out(f, *drop):
    """``f`` with NumPy's ``out=`` (refused unless None) and the named keywords (dropped when
    they hold NumPy's default: None or ``np._NoValue``) taken off."""

    def call(*args, **kwargs):
        out = kwargs.pop("out", None)
        if out is not None:
            raise TypeError("out= writes into an array, which carries no gradient")
        for k in drop:
            if k in kwargs and (kwargs[k] is None or kwargs[k] is np._NoValue):
                del kwargs[k]
        for k, v in list(kwargs.items()):
            if v is np._NoValue:
                del kwargs[k]
        return f(*args, **kwargs)

    return call


def _reshape(a, *args, shape=None, newshape=None, order="C", copy=None):
    if order != "C":
        raise TypeError(f"order={order!r}: tensors are C-ordered")
    s = shape if shape is not None else newshape if newshape is not None else args[0]
    return fn.reshape(a, s)


def _clip(a, a_min=np._NoValue, a_max=np._NoValue, *, min=np._NoValue, max=np._NoValue):  # noqa: A002
    lo = a_min if a_min is not np._NoValue else min
    hi = a_max if a_max is not np._NoValue else max
    return fn.clip(a, None if lo is np._NoValue else lo, None if hi is np._NoValue else hi)


def _take(a, indices, axis=None, mode=None):
    if mode not in (None, "raise"):
        raise TypeError(f"mode={mode!r}: tape's take raises on an index out of range")
    if axis is None:
        return fn.take(fn.reshape(a, (-1,)), indices, 0)
    return fn.take(a, indices, axis)


def _where(condition, *xy):
    if len(xy) != 2:
        raise TypeError("numpy.where(condition) (the positions) has no tape op; pass x and y")
    return fn.where(condition, *xy)


def _round(a, decimals=0):
    if decimals != 0:
        return fn.div(fn.round(fn.mul(a, 10.0**decimals)), 10.0**decimals)
    return fn.round(a)


def _expand_dims(a, axis):
    if isinstance(axis, (tuple, list)):
        for ax in sorted(int(v) % (np.ndim(a) + len(axis)) for v in axis):
            a = fn.unsqueeze(a, ax)
        return a
    return fn.unsqueeze(a, axis)


def _diff(a, n=1, axis=-1):
    x = tensor.as_tensor(a)
    ax = axis % x.ndim
    for _ in range(n):
        m = x.shape[ax]
        hi = [slice(None)] * x.ndim
        lo = [slice(None)] * x.ndim
        hi[ax] = slice(1, m)
        lo[ax] = slice(0, m - 1)
        x = x[tuple(hi)] - x[tuple(lo)]
    return x


def _hstack(tup, *, dtype=None, casting="same_kind"):
    tup = [tensor.as_tensor(t) for t in tup]
    return fn.concatenate(tup, 0 if tup and tup[0].ndim == 1 else 1)


def _vstack(tup, *, dtype=None, casting="same_kind"):
    tup = [tensor.as_tensor(t) for t in tup]
    return fn.concatenate([t.reshape(1, -1) if t.ndim == 1 else t for t in tup], 0)


def _like(make):
    def like(a, dtype=None, order="K", subok=True, shape=None):
        s = tuple(a.shape) if shape is None else shape
        return tensor.as_tensor(make(s, a.dtype if dtype is None else dtype))

    return like


def _var_like(f):
    def g(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **rest):
        if out is not None:
            raise TypeError("out= writes into an array, which carries no gradient")
        rest.pop("where", None)
        return f(a, axis=axis, keepdims=keepdims is True, ddof=ddof)

    return g


def _functions():
    la = np.linalg
    table = {
        np.sum: _no_out(fn.sum, "dtype", "initial", "where"),
        np.mean: _no_out(fn.mean, "dtype", "where"),
        np.prod: _no_out(fn.prod, "dtype", "initial", "where"),
        np.max: _no_out(fn.amax, "initial", "where"), np.amax: _no_out(fn.amax, "initial", "where"),
        np.min: _no_out(fn.amin, "initial", "where"), np.amin: _no_out(fn.amin, "initial", "where"),
        np.var: _var_like(fn.var), np.std: _var_like(fn.std),
        np.dot: _no_out(fn.dot), np.inner: _no_out(fn.dot), np.outer: _no_out(fn.outer),
        np.tensordot: fn.tensordot, np.einsum: _no_out(fn.einsum, "dtype", "optimize"),
        np.where: _where, np.concatenate: _no_out(fn.concatenate, "dtype"),
        np.stack: _no_out(fn.stack, "dtype"), np.hstack: _hstack, np.vstack: _vstack,
        np.reshape: _reshape, np.transpose: fn.transpose, np.clip: _clip,
        np.cumsum: _no_out(fn.cumsum, "dtype"), np.cumprod: _no_out(fn.cumprod, "dtype"),
        np.sort: fn.sort, np.argsort: fn.argsort, np.argmax: _no_out(fn.argmax),
        np.argmin: _no_out(fn.argmin), np.trace: _no_out(fn.trace, "dtype"),
        np.diagonal: fn.diagonal, np.squeeze: fn.squeeze, np.expand_dims: _expand_dims,
        np.broadcast_to: fn.broadcast_to, np.moveaxis: fn.moveaxis, np.swapaxes: fn.swapaxes,
        np.flip: fn.flip, np.roll: fn.roll, np.tile: fn.tile, np.repeat: fn.repeat,
        np.split: fn.split, np.array_split: fn.array_split, np.pad: fn.pad, np.take: _take,
        np.take_along_axis: fn.take_along_axis, np.round: _round, np.around: _round,
        np.diff: _diff, np.all: _no_out(fn.all, "where"), np.any: _no_out(fn.any, "where"),
        np.isclose: fn.isclose, np.allclose: fn.allclose,
        np.shape: lambda a: tuple(a.shape), np.ndim: lambda a: a.ndim,
        np.size: lambda a, axis=None: a.numel() if axis is None else a.shape[axis],
        np.zeros_like: _like(np.zeros), np.ones_like: _like(np.ones),
        np.copy: lambda a, order="K", subok=False: fn.mul(a, 1.0) if traced(a) else a.clone(),
        la.norm: fn.norm, la.solve: linalg.solve, la.cholesky: linalg.cholesky,
        la.slogdet: linalg.slogdet, la.det: linalg.det, la.inv: linalg.inv,
        la.eigh: linalg.eigh, la.eigvalsh: linalg.eigvalsh, la.qr: linalg.qr,
    }  # fmt: skip
    if hasattr(np, "round_"):  # NumPy 1.x spelling
        table[np.round_] = _round
    return table


FUNCTIONS = _functions()
"""NumPy function -> the tape function it records (NumPy's signature: ``out=`` refused,
defaults such as ``dtype=None`` accepted)."""


def array_function(self, func, types, args, kwargs):
    """``Tensor.__array_function__``: a NumPy function called with tensors among its
    arguments."""
    if not all(issubclass(t, (np.ndarray, Tensor)) for t in types):
        return NotImplemented
    f = FUNCTIONS.get(func)
    is_traced = _any_traced(args) or _any_traced(list(kwargs.values()))
    if f is None:
        if is_traced:
            _refuse(_name(func), "has no tape op, so it cannot carry a gradient")
        return func._implementation(*_values(args), **dict(zip(kwargs, _values(kwargs.values()))))
    try:
        return f(*args, **kwargs)
    except TypeError as e:
        if str(e).startswith("tape:"):
            raise
        raise TypeError(f"tape: {_name(func)}: {e}") from None


Tensor.__array_ufunc__ = array_ufunc
Tensor.__array_function__ = array_function
