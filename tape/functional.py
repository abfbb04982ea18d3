"""User-facing functions (``tp.exp``, ``tp.sum``, ``tp.softmax``, ...) and the ``Tensor``
operators and methods.

Every elementwise op in the registry becomes a function here automatically, and the ``Tensor``
operators and methods of registry ops come from their records (:class:`tape.registry.Op`);
composites (``mean``, ``var``, ``std``, ``norm``, ``logsumexp``, ``softmax``,
``log_softmax``) are written in terms of registered ops, so they need no rules of their own,
and their methods are listed here. Reductions accept NumPy's ``axis=`` and PyTorch's ``dim=``.
"""

from __future__ import annotations

import math

import numpy as np

from tape import registry
from tape._front import linalg, movement, reduce
from tape._tensor import (
    Tensor,
    as_tensor,
    elementwise,
    flatten,
    reshape,
    squeeze,
    unsqueeze,
)
from tape.ops.elementwise import CLIP, POW, SQUARE

__all__ = []  # filled below


def _export(fn, name=None):
    name = name or fn.__name__
    globals()[name] = fn
    if name not in __all__:
        __all__.append(name)
    return fn


def _make_elementwise(op):
    n = op.arity

    def fn(*args):
        if len(args) != n:
            raise TypeError(f"{op.name}() takes {n} argument{'s' * (n > 1)}, got {len(args)}")
        return elementwise(op, *args)

    fn.__name__ = op.name
    fn.__qualname__ = op.name
    ref = getattr(op.ref, "__name__", "")
    fn.__doc__ = (
        f"Elementwise ``{op.name}`` (NumPy ``{ref}``), differentiable: {op.differentiable}."
    )
    return fn


# (clip's function, below, replaces the generated one: its bounds are optional)
for _op in registry.OPS:
    if _op.kind != "kernel":
        _export(_make_elementwise(_op))

exp, log, where = globals()["exp"], globals()["log"], globals()["where"]

# NumPy spellings
for _alias, _name in (
    ("negative", "neg"),
    ("subtract", "sub"),
    ("multiply", "mul"),
    ("divide", "div"),
    ("true_divide", "div"),
    ("power", "pow"),
    ("lt", "less"),
    ("le", "less_equal"),
    ("gt", "greater"),
    ("ge", "greater_equal"),
    ("eq", "equal"),
    ("ne", "not_equal"),
    ("atan", "arctan"),
):
    _export(globals()[_name], _alias)


def _axis(axis, dim):
    if dim is not None:
        if axis is not None:
            raise TypeError("pass axis= or dim=, not both")
        return dim
    return axis


@_export
def clip(x, min=None, max=None):
    """Clamp ``x`` to ``[min, max]`` (either may be None); the bounds may be tensors.
    The gradient goes to ``x`` where it lies within the bounds (inclusive)."""
    x = as_tensor(x)
    lo = -np.inf if min is None else min
    hi = np.inf if max is None else max
    return elementwise(CLIP, x, lo, hi)


clamp = _export(clip, "clamp")


@_export
def sum(x, axis=None, keepdims=False, *, dim=None):  # noqa: A001
    return reduce.sum(x, _axis(axis, dim), keepdims)


@_export
def max(x, axis=None, keepdims=False, *, dim=None):  # noqa: A001
    return reduce.max(x, _axis(axis, dim), keepdims)


@_export
def min(x, axis=None, keepdims=False, *, dim=None):  # noqa: A001
    return reduce.min(x, _axis(axis, dim), keepdims)


@_export
def prod(x, axis=None, keepdims=False, *, dim=None):
    return reduce.prod(x, _axis(axis, dim), keepdims)


amax = _export(max, "amax")
amin = _export(min, "amin")


def _count(x, axes):
    return math.prod(x.shape[a] for a in axes)


@_export
def mean(x, axis=None, keepdims=False, *, dim=None):
    """Arithmetic mean over ``axis`` (NaN for an empty reduction, as NumPy)."""
    x = as_tensor(x)
    axes = reduce.normalize_axes("mean", _axis(axis, dim), x.ndim)
    n = _count(x, axes)
    s = reduce.sum(x, axes, keepdims)
    return s / n if n else s * np.nan


@_export
def var(x, axis=None, keepdims=False, ddof=0, *, dim=None, correction=None):
    """Variance with ``ddof`` delta degrees of freedom (NumPy's default 0; PyTorch's
    ``correction=1`` is accepted too)."""
    x = as_tensor(x)
    if correction is not None:
        ddof = correction
    axes = reduce.normalize_axes("var", _axis(axis, dim), x.ndim)
    d = x - mean(x, axes, keepdims=True)
    return reduce.sum(d * d, axes, keepdims) / (_count(x, axes) - ddof)


@_export
def std(x, axis=None, keepdims=False, ddof=0, *, dim=None, correction=None):
    """Standard deviation (see :func:`var`)."""
    return var(x, axis, keepdims, ddof, dim=dim, correction=correction) ** 0.5


@_export
def norm(x, ord=None, axis=None, keepdims=False, *, dim=None):
    """Euclidean (Frobenius) norm over ``axis``, or ``ord=1`` / ``ord=inf`` vector norms.

    The 2-norm's gradient at zero is zero (a subgradient), not NaN: the square root is taken
    through a masked ``where``.
    """
    x = as_tensor(x)
    axis = _axis(axis, dim)
    if ord in (None, 2, "fro"):
        s = reduce.sum(x * x, axis, keepdims)
        pos = s > 0
        return where(pos, where(pos, s, 1.0) ** 0.5, 0.0)
    if ord == 1:
        return reduce.sum(abs(x), axis, keepdims)
    if ord in (np.inf, float("inf")):
        return reduce.max(abs(x), axis, keepdims)
    raise ValueError(f"norm: ord={ord!r} is not supported (None/2, 1 or inf)")


@_export
def logsumexp(x, axis=None, keepdims=False, *, dim=None):
    """``log(sum(exp(x)))`` over ``axis``, computed without overflow."""
    x = as_tensor(x)
    axes = reduce.normalize_axes("logsumexp", _axis(axis, dim), x.ndim)
    m = _finite_or_zero(reduce.max(x, axes, keepdims=True).detach())
    out = log(reduce.sum(exp(x - m), axes, keepdims=True)) + m
    return out if keepdims else squeeze(out, axes) if axes else out


def _finite_or_zero(m):
    # The shift that keeps exp() in range. It is taped (not a frozen value), so replays on
    # new data shift by their own maximum; an infinite maximum shifts by 0.
    return where(abs(m) < np.inf, m, 0.0)


@_export
def softmax(x, axis=None, *, dim=None):
    """``exp(x) / sum(exp(x))`` along ``axis`` (default: the last)."""
    x = as_tensor(x)
    axis = _axis(axis, dim)
    axis = -1 if axis is None else axis
    e = exp(x - _finite_or_zero(reduce.max(x, axis, keepdims=True).detach()))
    return e / reduce.sum(e, axis, keepdims=True)


@_export
def log_softmax(x, axis=None, *, dim=None):
    """``x - logsumexp(x)`` along ``axis`` (default: the last)."""
    x = as_tensor(x)
    axis = _axis(axis, dim)
    return x - logsumexp(x, -1 if axis is None else axis, keepdims=True)


for _fn in (
    linalg.matmul,
    linalg.dot,
    linalg.outer,
    movement.transpose,
    movement.swapaxes,
    movement.broadcast_to,
    movement.concatenate,
    movement.stack,
    movement.take,
    reshape,
    flatten,
    squeeze,
    unsqueeze,
):
    _export(_fn)
cat = _export(movement.concatenate, "cat")


def permute(x, *axes):
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return movement.transpose(x, axes)


_export(permute)


# ---------------------------------------------------------------- Tensor operators and methods


def _install():
    """The ``Tensor`` operators and methods: each registry op's, as its record names them
    (calling ``tape.<name>``), then the composites'."""
    T = Tensor
    for op in registry.OPS:
        fn = globals().get(op.name)
        if fn is None and (op.operators or op.reflected or op.method):
            raise RuntimeError(
                f"op {op.name!r} names Tensor operators or a method, but there is no tape.{op.name}"
            )
        for dunder in op.operators:
            setattr(T, dunder, _operator(op, fn, False))
        for dunder in op.reflected:
            setattr(T, dunder, _operator(op, fn, True))
        if op.method:
            setattr(T, op.name, fn)
    T.__pow__ = _pow  # x ** 2 records a square
    T.__pos__ = lambda a: a
    T.__getitem__ = movement.getitem
    for name in (
        "mean", "var", "std", "norm", "logsumexp", "softmax", "log_softmax", "clamp", "dot",
        "outer", "flatten", "squeeze", "unsqueeze", "broadcast_to", "amax", "amin",
    ):  # fmt: skip
        setattr(T, name, globals()[name])
    T.reshape = lambda x, *shape: reshape(x, *shape)
    T.view = T.reshape
    T.permute = permute
    T.transpose = _tensor_transpose
    T.T = property(lambda x: movement.transpose(x))
    T.mT = property(lambda x: movement.swapaxes(x, -1, -2))


def _operator(op, fn, reflected):
    """The operator method recording ``op``: elementwise ops record directly (operators are
    the hot path of eager code), kernel ops call their front end ``fn``."""
    if op.kind == "kernel":
        return (lambda a, b: fn(b, a)) if reflected else fn
    if op.arity == 1:
        return lambda a: elementwise(op, a)
    if reflected:
        return lambda a, b: elementwise(op, b, a)
    return lambda a, b: elementwise(op, a, b)


def _pow(a, b):
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b == 2:
        return elementwise(SQUARE, a)
    return elementwise(POW, a, b)


def _tensor_transpose(x, *axes):
    """PyTorch's ``x.transpose(dim0, dim1)`` swaps two axes; ``x.transpose()`` or a full
    permutation behaves as NumPy's."""
    if len(axes) == 2 and all(isinstance(a, int) for a in axes):
        return movement.swapaxes(x, axes[0], axes[1])
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return movement.transpose(x, axes or None)


_install()
