"""User-facing functions (``tp.exp``, ``tp.sum``, ``tp.softmax``, ...) and the ``Tensor``
operators and methods.

Every elementwise op in the registry becomes a function here automatically, and the ``Tensor``
operators and methods of registry ops come from their records (:class:`tape.registry.Op`);
composites (``mean``, ``var``, ``std``, ``norm``, ``logsumexp``, ``softmax``,
``log_softmax``) are written in terms of registered ops, so they need no rules of their own,
and their methods are listed here. Reductions accept NumPy's ``axis=`` and PyTorch's ``dim=``.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
from typing import NamedTuple

import numpy as np

from tape.frontend import tensor as _tensor_mod
from tape.frontend.ops import creation, linalg, movement, reduce, scan, scatter
from tape.frontend.tensor import (
    Tensor,
    as_tensor,
    binary,
    elementwise,
    flatten,
    is_grad_enabled,
    reshape,
    squeeze,
    unsqueeze,
)
from tape.ops import registry
from tape.ops.blocks import scan as scan_block
from tape.ops.elementwise import CLIP, POW, SQUARE
from tape.ops.nn import LOGSUMEXP as _LOGSUMEXP

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
    if _op.kind != "structural":
        _export(_make_elementwise(_op))

exp, log, where = globals()["exp"], globals()["log"], globals()["where"]
maximum, minimum = globals()["maximum"], globals()["minimum"]
add, sub, mul, div = globals()["add"], globals()["sub"], globals()["mul"], globals()["div"]

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


def _keep(keepdims, keepdim):
    return bool(keepdims or keepdim)


@_export
def sum(x, axis=None, keepdims=False, *, dim=None, keepdim=False):  # noqa: A001
    """Sum over ``axis`` (NumPy) or ``dim`` (PyTorch); None sums everything."""
    return reduce.sum(x, _axis(axis, dim), _keep(keepdims, keepdim))


class MaxMin(NamedTuple):
    """What ``max(x, dim)`` / ``min(x, dim)`` return, as PyTorch: the values (differentiable)
    and the int64 positions they came from."""

    values: Tensor
    indices: Tensor


def _extreme(name, red, x, dim, keepdim, axis, keepdims):
    if isinstance(dim, Tensor) or (
        dim is not None and not isinstance(dim, (int, np.integer, tuple, list))
    ):
        if axis is not None:
            raise TypeError(f"{name}(x, other) is elementwise: it takes no axis")
        return (maximum if name == "max" else minimum)(x, dim)
    keep = _keep(keepdims, keepdim)
    if dim is None or isinstance(dim, (tuple, list)):
        return red(x, _axis(axis, dim), keep)
    if axis is not None:
        raise TypeError("pass axis= or dim=, not both")
    # PyTorch: an int dim gives (values, indices); the values are gathered at the indices,
    # so on ties the gradient goes to the returned position, as in PyTorch
    x = as_tensor(x)
    idx = _arg(name, x, dim, True)
    if x.ndim == 0:
        return MaxMin(x, idx.reshape(()) if not keep else idx)
    d = reduce.normalize_axes(name, dim, x.ndim)[0]
    traced = idx._tape is not None  # inside tape.record: positions recomputed at each replay
    values = scan.take_along(x, idx, d) if traced else _take_along(x, idx, d)
    if not keep:
        values = squeeze(values, d)
        idx = squeeze(idx, d) if traced else Tensor(np.squeeze(idx._value, d))
    if values._op is not None:
        values._op = name  # grad_fn=<MaxBackward0>, as PyTorch names it
    return MaxMin(values, idx)


def _take_along(x, idx, d):
    """``x`` gathered along axis ``d`` at ``idx`` (an int64 tensor of x's shape with axis
    ``d`` of length 1, outside any graph): ``numpy.take_along_axis``, differentiable."""
    order = [a for a in range(x.ndim) if a != d] + [d]
    moved = movement.transpose(x, order)  # the identity order returns x itself
    rows = reshape(moved, -1, x.shape[d])
    k = np.moveaxis(idx._value, d, -1).reshape(-1)
    picked = rows[np.arange(k.shape[0]), k]
    shape = [x.shape[a] for a in order[:-1]] + [1]
    out = reshape(picked, shape)
    return movement.transpose(out, np.argsort(order).tolist())


def _arg(name, x, dim, keepdim):
    """Positions of the maximum / minimum along ``dim`` (first one on ties), int64, no
    gradient. Inside ``tape.record`` they are an entry (``argmax`` / ``argmin`` ops), so a
    replay recomputes them on its own data; elsewhere they are computed by NumPy."""
    x = as_tensor(x)
    if x._tape is not None and x._resolve()[0].recording:
        if dim is not None and not isinstance(dim, (int, np.integer)):
            dim = reduce.normalize_axes(name, dim, x.ndim)
            if len(dim) != 1:
                raise ValueError(f"{name}: dim must be one axis, got {dim!r}")
            dim = dim[0]
        return scan.arg_extreme(name, x, dim, keepdim)
    v = x._peek()
    fn = np.argmax if name in ("max", "argmax") else np.argmin
    if dim is None:
        if v.size == 0:
            raise ValueError(f"{name}: cannot take the position of an extreme of an empty tensor")
        out = np.asarray(fn(v.reshape(-1)))
        if keepdim:
            out = out.reshape((1,) * v.ndim)
        return Tensor(out.astype(np.int64))
    d = reduce.normalize_axes(name, dim, v.ndim)
    d = d[0] if d else 0
    if v.ndim and v.shape[d] == 0:
        raise ValueError(f"{name}: dimension {dim} of shape {tuple(v.shape)} is empty")
    out = fn(v, axis=d, keepdims=keepdim) if v.ndim else np.asarray(0)
    return Tensor(np.asarray(out, np.int64))


@_export
def max(x, dim=None, keepdim=False, *, axis=None, keepdims=False):  # noqa: A001
    """Maximum, as PyTorch and NumPy: ``max(x)`` is the largest element; ``max(x, dim)``
    (an int) returns ``(values, indices)``; ``max(x, axis=...)`` (NumPy: an int or tuple)
    returns the values only; ``max(x, other)`` is the elementwise :func:`maximum`. The
    gradient goes to the maximal elements, split evenly on ties."""
    return _extreme("max", reduce.max, x, dim, keepdim, axis, keepdims)


@_export
def min(x, dim=None, keepdim=False, *, axis=None, keepdims=False):  # noqa: A001
    """Minimum: see :func:`max`."""
    return _extreme("min", reduce.min, x, dim, keepdim, axis, keepdims)


@_export
def argmax(x, dim=None, keepdim=False, *, axis=None):
    """Position of the maximum (flattened when ``dim`` is None), int64; first one on ties,
    the first NaN if any (NumPy's rule). Inside :func:`tape.record` it is an entry, so a
    replay recomputes it on the replay's data."""
    return _arg("argmax", x, _axis(axis, dim), keepdim)


@_export
def argmin(x, dim=None, keepdim=False, *, axis=None):
    """Position of the minimum (flattened when ``dim`` is None), int64: see :func:`argmax`."""
    return _arg("argmin", x, _axis(axis, dim), keepdim)


@_export
def all(x, dim=None, keepdim=False, *, axis=None):  # noqa: A001
    """Whether every element (along ``dim``) is nonzero: a bool tensor."""
    x = as_tensor(x)
    return reduce.min(x != 0, _axis(axis, dim), keepdim) > 0.5


@_export
def any(x, dim=None, keepdim=False, *, axis=None):  # noqa: A001
    """Whether some element (along ``dim``) is nonzero: a bool tensor."""
    x = as_tensor(x)
    return reduce.max(x != 0, _axis(axis, dim), keepdim) > 0.5


@_export
def logical_and(a, b):
    """Elementwise ``a and b`` (nonzero is true): a bool tensor."""
    return (as_tensor(a) != 0) * (as_tensor(b) != 0) > 0.5


@_export
def logical_or(a, b):
    """Elementwise ``a or b`` (nonzero is true): a bool tensor."""
    return maximum(as_tensor(a) != 0, as_tensor(b) != 0) > 0.5


@_export
def logical_xor(a, b):
    """Elementwise ``a xor b`` (nonzero is true): a bool tensor."""
    return (as_tensor(a) != 0) != (as_tensor(b) != 0)


@_export
def logical_not(a):
    """Elementwise ``not a`` (nonzero is true): a bool tensor."""
    return as_tensor(a) == 0


def _bool_op(fn, sym):
    def op(a, b):
        for t in (a, b):
            if isinstance(t, Tensor) and t.dtype.kind != "b":
                raise TypeError(
                    f"operator {sym} is defined for bool tensors here (logical); got {t.dtype}"
                )
        return fn(a, b)

    return op


@_export
def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):  # noqa: A002
    """``|input - other| <= atol + rtol * |other|`` elementwise (a bool tensor), as
    ``torch.isclose``; infinities are close to themselves, NaNs only with ``equal_nan``."""
    a, b = as_tensor(input), as_tensor(other)
    close = logical_or(a == b, abs(a - b) <= atol + rtol * abs(b))
    if equal_nan:
        close = logical_or(close, logical_and(a != a, b != b))
    return close


@_export
def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):  # noqa: A002
    """Whether every element is close (see :func:`isclose`): a Python bool."""
    return bool(all(isclose(input, other, rtol, atol, equal_nan)))


@_export
def prod(x, axis=None, keepdims=False, *, dim=None, keepdim=False):
    """Product of the elements over ``axis`` (NumPy) or ``dim`` (PyTorch), all of them by
    default; the gradient is exact when the input holds zeros (no division by the
    product)."""
    return reduce.prod(x, _axis(axis, dim), _keep(keepdims, keepdim))


@_export
def amax(x, axis=None, keepdims=False, *, dim=None, keepdim=False):
    """Maximum over ``axis`` / ``dim`` (an int or a tuple): the values only."""
    return reduce.max(x, _axis(axis, dim), _keep(keepdims, keepdim))


@_export
def amin(x, axis=None, keepdims=False, *, dim=None, keepdim=False):
    """Minimum over ``axis`` / ``dim`` (an int or a tuple): the values only."""
    return reduce.min(x, _axis(axis, dim), _keep(keepdims, keepdim))


def _count(x, axes):
    return math.prod(x.shape[a] for a in axes)


@_export
def mean(x, axis=None, keepdims=False, *, dim=None, keepdim=False):
    """Arithmetic mean over ``axis`` / ``dim`` (NaN for an empty reduction, as NumPy)."""
    x = as_tensor(x)
    keepdims = _keep(keepdims, keepdim)
    axes = reduce.normalize_axes("mean", _axis(axis, dim), x.ndim)
    n = _count(x, axes)
    s = reduce.sum(x, axes, keepdims)
    return s / n if n else s * np.nan


@_export
def var(x, axis=None, keepdims=False, ddof=0, *, dim=None, correction=None, keepdim=False,
        unbiased=None):  # fmt: skip
    """Variance with ``ddof`` delta degrees of freedom. NumPy's spelling (``axis=``, ``ddof``,
    default 0) or PyTorch's (``dim=``, ``correction=`` / ``unbiased=``, default
    ``correction=1``): ``var(x, dim=0)`` is PyTorch's unbiased variance, ``var(x, axis=0)``
    NumPy's. With neither, ``var(x)`` is NumPy's ``ddof=0``; the method ``x.var()`` follows
    PyTorch (``correction=1``)."""
    x = as_tensor(x)
    keepdims = _keep(keepdims, keepdim)
    if dim is not None and ddof == 0 and correction is None and unbiased is None:
        ddof = 1  # PyTorch's spelling (dim=) brings PyTorch's default, correction=1
    if unbiased is not None:
        ddof = int(bool(unbiased))
    if correction is not None:
        ddof = correction
    axes = reduce.normalize_axes("var", _axis(axis, dim), x.ndim)
    d = x - mean(x, axes, keepdims=True)
    return reduce.sum(d * d, axes, keepdims) / (_count(x, axes) - ddof)


@_export
def std(x, axis=None, keepdims=False, ddof=0, *, dim=None, correction=None, keepdim=False,
        unbiased=None):  # fmt: skip
    """Standard deviation: see :func:`var` for the NumPy and PyTorch spellings and defaults."""
    v = var(x, axis, keepdims, ddof, dim=dim, correction=correction, keepdim=keepdim,
            unbiased=unbiased)  # fmt: skip
    return v**0.5


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
def logsumexp(x, axis=None, keepdims=False, *, dim=None, keepdim=False):
    """``log(sum(exp(x)))`` over ``axis``, computed without overflow (shifted by the maximum).

    Over adjacent axes (one axis, or all of them: the common calls) of a float tensor this is
    one ``logsumexp`` entry (:mod:`tape.ops.nn`), whose reverse rule is the softmax; other
    axes record the shift, ``exp``, ``sum`` and ``log`` as separate entries.
    """
    x = as_tensor(x)
    keepdims = _keep(keepdims, keepdim)
    axes = reduce.normalize_axes("logsumexp", _axis(axis, dim), x.ndim)
    if x.dtype.kind == "f" and (not axes or axes[-1] - axes[0] == len(axes) - 1):
        shape = x.shape
        lo, hi = (axes[0], axes[-1] + 1) if axes else (x.ndim, x.ndim)
        block = scan_block.encode(
            math.prod(shape[:lo]), math.prod(shape[lo:hi]), math.prod(shape[hi:])
        )  # fmt: skip
        return _tensor_mod.apply(_LOGSUMEXP, [x], reduce.reduced_shape(shape, axes, keepdims),
                                 block)  # fmt: skip
    m = _max_shift(x, axes)
    out = log(reduce.sum(exp(x - m), axes, keepdims=True)) + m
    return out if keepdims else squeeze(out, axes) if axes else out


def _max_shift(x, axis):
    """The maximum of ``x`` over ``axis`` (kept), without gradient: the shift that keeps
    ``exp`` in range, 0 where it is infinite. Taped (not a frozen value), so replays on new
    data shift by their own maximum; in eager mode a constant computed in NumPy (the same
    values, no entries)."""
    m = reduce.max(x, axis, keepdims=True).detach()
    if m._tape is None:
        v = m.numpy()
        return as_tensor(np.where(np.abs(v) < np.inf, v, 0.0))  # dtype as where() gives
    return where(abs(m) < np.inf, m, 0.0)


@_export
def softmax(x, axis=None, *, dim=None):
    """``exp(x) / sum(exp(x))`` along ``axis`` (default: the last), shifted by the maximum
    (``exp(x - logsumexp(x))`` would lose accuracy where the logits are large and close)."""
    x = as_tensor(x)
    axis = _axis(axis, dim)
    axis = -1 if axis is None else axis
    e = exp(x - _max_shift(x, axis))
    return e / reduce.sum(e, axis, keepdims=True)


@_export
def log_softmax(x, axis=None, *, dim=None):
    """``x - logsumexp(x)`` along ``axis`` (default: the last), as ``s - log(sum(exp(s)))``
    with ``s`` shifted by the maximum: subtracting a large ``logsumexp`` would lose the
    accuracy of the small differences."""
    x = as_tensor(x)
    axis = _axis(axis, dim)
    axis = -1 if axis is None else axis
    s = x - _max_shift(x, axis)
    return s - log(reduce.sum(exp(s), axis, keepdims=True))


for _fn in (
    linalg.matmul,
    linalg.dot,
    linalg.outer,
    linalg.diagonal,
    linalg.diag,
    linalg.trace,
    linalg.tensordot,
    linalg.einsum,
    movement.transpose,
    movement.swapaxes,
    movement.moveaxis,
    movement.flip,
    movement.roll,
    movement.tile,
    movement.repeat,
    movement.split,
    movement.array_split,
    movement.pad,
    movement.take_along_axis,
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
for _fn in scan.EXPORTS:
    _export(_fn)


def permute(x, *axes):
    """``x`` with its axes in the order ``axes`` (``permute(x, 1, 0)`` or
    ``permute(x, (1, 0))``), as ``torch.permute``; NumPy's ``transpose(x, axes)``."""
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return movement.transpose(x, axes)


_export(permute)
_export(scatter.index_add)


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
        "mean", "norm", "logsumexp", "softmax", "log_softmax", "clamp", "dot",
        "outer", "flatten", "squeeze", "unsqueeze", "broadcast_to", "amax", "amin",
        "diagonal", "trace", "moveaxis", "swapaxes", "roll",
    ):  # fmt: skip
        setattr(T, name, globals()[name])
    T.reshape = lambda x, *shape: reshape(x, *shape)
    T.view = T.reshape
    T.permute = permute
    T.transpose = _tensor_transpose
    T.T = property(lambda x: movement.transpose(x))
    T.mT = property(lambda x: movement.swapaxes(x, -1, -2))
    _install_torch_methods(T)


def _operator(op, fn, reflected):
    """The operator method recording ``op``: elementwise ops record directly (operators are
    the hot path of eager code), structural ops call their front end ``fn``."""
    if op.kind == "structural":
        return (lambda a, b: fn(b, a)) if reflected else fn
    if op.arity == 1:
        return lambda a: elementwise(op, a)
    if reflected:
        return lambda a, b: binary(op, b, a)
    return lambda a, b: binary(op, a, b)


def _pow(a, b):
    if (
        b.__class__ in (int, float)
        and (b == 2 or b == 3)
        and a._tape is None
        and a.dtype.kind == "f"
        and not (a._rg and is_grad_enabled())
    ):
        # a constant: x * x (the square kernel's product), x * x * x (the pow kernel's own
        # product for exponent 3)
        v = a._value
        return Tensor(v * v if b == 2 else v * v * v)
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b == 2:
        y = elementwise(SQUARE, a)
        if y._op is not None:
            y._op = "pow"  # grad_fn=<PowBackward0>, as PyTorch names x ** 2
        return y
    return elementwise(POW, a, b)


def _tensor_transpose(x, *axes):
    """PyTorch's ``x.transpose(dim0, dim1)`` swaps two axes; ``x.transpose()`` or a full
    permutation behaves as NumPy's."""
    if len(axes) == 2 and builtins.all(isinstance(a, int) for a in axes):
        return movement.swapaxes(x, axes[0], axes[1])
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return movement.transpose(x, axes or None)


# ---------------------------------------------------------------- PyTorch's method spellings


def _scaled(other, alpha):
    return other if alpha == 1 else other * alpha


def _alpha_op(fn, name):
    def method(x, other, *, alpha=1):
        return fn(x, _scaled(other, alpha))

    method.__name__ = name
    method.__doc__ = f"``{name}(other, alpha=1)``: ``x {name} alpha * other``, as PyTorch."
    return method


def _div(x, other, *, rounding_mode=None):
    """``x / other``; ``rounding_mode`` other than None raises (no gradient is defined)."""
    if rounding_mode is not None:
        raise NotImplementedError(f"div: rounding_mode={rounding_mode!r} is not supported")
    return div(x, other)


def _matrix(name, x, nd):
    if x.ndim != nd:
        raise RuntimeError(f"{name}: expected a {nd}-D tensor, got shape {tuple(x.shape)}")


def mm(a, b):
    """Matrix product of two 2-D tensors."""
    a, b = as_tensor(a), as_tensor(b)
    _matrix("mm", a, 2)
    _matrix("mm", b, 2)
    return linalg.matmul(a, b)


def mv(a, v):
    """Matrix-vector product of a 2-D and a 1-D tensor."""
    a, v = as_tensor(a), as_tensor(v)
    _matrix("mv", a, 2)
    _matrix("mv", v, 1)
    return linalg.matmul(a, v)


def bmm(a, b):
    """Batched matrix product of two 3-D tensors ``(b, n, m) @ (b, m, p)``."""
    a, b = as_tensor(a), as_tensor(b)
    _matrix("bmm", a, 3)
    _matrix("bmm", b, 3)
    if a.shape[0] != b.shape[0]:
        raise RuntimeError(f"bmm: batch sizes differ: {tuple(a.shape)} and {tuple(b.shape)}")
    return linalg.matmul(a, b)


def t(x):
    """Transpose of a tensor of at most 2 dimensions (PyTorch's ``x.t()``)."""
    x = as_tensor(x)
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return movement.transpose(x) if x.ndim == 2 else x


for _fn in (mm, mv, bmm, t):
    _export(_fn)


def _alpha_fn(fn, name):
    def f(input, other, *, alpha=1):  # noqa: A002
        return fn(input, _scaled(other, alpha))

    f.__name__ = f.__qualname__ = name
    f.__doc__ = (
        f"Elementwise ``{name}`` with NumPy broadcasting; ``alpha`` scales ``other`` (PyTorch)."
    )
    return f


_export(_alpha_fn(add, "add"))
_export(_alpha_fn(sub, "sub"))
_export(globals()["sub"], "subtract")


def _expand(x, *sizes):
    """Broadcast to ``sizes`` (``-1`` keeps a dimension), as PyTorch's ``expand``."""
    sizes = _sizes(sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to "
            f"the number of dimensions in the tensor ({x.ndim})"
        )
    shape = tuple(x.shape[k - lead] if s == -1 and k >= lead else s for k, s in enumerate(sizes))
    if builtins.any(s < 0 for s in shape):
        raise RuntimeError(f"expand: -1 is not allowed in a leading, new dimension: {sizes}")
    return movement.broadcast_to(x, shape)


def _sizes(sizes):
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        return tuple(int(s) for s in sizes[0])
    return tuple(int(s) for s in sizes)


def _t_var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over ``dim`` with PyTorch's default ``correction=1`` (Bessel's)."""
    if correction is None:
        correction = 1 if unbiased is None else int(bool(unbiased))
    return var(x, dim, keepdim, correction)


def _t_std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Standard deviation over ``dim`` with PyTorch's default ``correction=1``."""
    return _t_var(x, dim, unbiased, keepdim, correction=correction) ** 0.5


def _leaf_inplace(name, compute):
    """An in-place method on a tensor that owns its value (a leaf under ``no_grad``, or a
    tensor outside any graph): ``compute(value)`` gives the new value."""

    def method(x, *args, **kwargs):
        x._inplace_check()
        v = compute(x._value, *args, **kwargs)
        vd = np.result_type(v)
        if not np.can_cast(vd, x.dtype, "same_kind"):
            raise RuntimeError(
                f"{name}: result type {vd} can't be cast to the tensor's dtype {x.dtype}"
            )
        try:
            x._value[...] = v
        except ValueError:
            raise RuntimeError(
                f"{name}: the result of shape {np.shape(v)} does not fit the tensor's shape {tuple(x.shape)}"
            ) from None
        x._bump()
        return x

    method.__name__ = name
    return method


def _val(v):
    return v._peek() if isinstance(v, Tensor) else v


def _normal_(value, mean=0.0, std=1.0, *, generator=None):
    return creation._rng(generator).normal(mean, std, value.shape)


def _uniform_(value, a=0.0, b=1.0, *, generator=None, **kw):
    a, b = kw.get("from_", a), kw.get("to", b)
    return creation._rng(generator).uniform(a, b, value.shape)


def _new(make):
    """PyTorch's ``x.new_zeros(*size)`` & co.: a new leaf of ``x``'s dtype unless given."""

    def method(x, *size, dtype=None, device=None, requires_grad=False):
        return make(*size, dtype=x.dtype if dtype is None else dtype, device=device,
                    requires_grad=requires_grad)  # fmt: skip

    method.__name__ = "new_" + make.__name__
    method.__doc__ = f"``x.new_{make.__name__}(*size)``: {make.__name__}, in ``x``'s dtype."
    return method


def _new_full(x, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    """``x.new_full(size, fill_value)``: a new leaf filled with ``fill_value``, ``x``'s dtype."""
    return _tensor_mod.full(size, fill_value, dtype=x.dtype if dtype is None else dtype,
                            requires_grad=requires_grad, device=device)  # fmt: skip


def _new_tensor(x, data, *, dtype=None, device=None, requires_grad=False):
    """``x.new_tensor(data)``: a new leaf holding a copy of ``data``, ``x``'s dtype."""
    return _tensor_mod.tensor(data, dtype=x.dtype if dtype is None else dtype,
                              requires_grad=requires_grad, device=device)  # fmt: skip


# ---------------------------------------------------------------- PyTorch's indexing functions
# Compositions of tape's own ops (gathers, slices, where): their derivatives are those ops'.


@_export
def gather(input, dim, index):
    """``torch.gather``: ``out[i][j] = input[index[i][j]][j]`` along ``dim`` (``index`` has
    ``input``'s number of axes; the other axes as in ``take_along_axis``)."""
    x = as_tensor(input)
    idx = np.asarray(index.numpy() if isinstance(index, Tensor) else index)
    if idx.ndim != x.ndim:
        raise ValueError(
            f"gather: index has {idx.ndim} axes, input has {x.ndim}: they must have the same"
        )
    if idx.dtype.kind not in "iu":
        raise TypeError(f"gather: index must hold integers, got {idx.dtype}")
    return movement.take_along_axis(x, idx, axis=dim)


@_export
def index_select(input, dim, index):
    """``torch.index_select``: the entries ``index`` (1-D integers) along ``dim``."""
    idx = np.asarray(index.numpy() if isinstance(index, Tensor) else index)
    if idx.ndim != 1:
        raise ValueError(f"index_select: index must be 1-D, got shape {idx.shape}")
    return movement.take(as_tensor(input), idx, axis=dim)


@_export
def masked_fill(input, mask, value):
    """``torch.masked_fill``: ``value`` where ``mask`` (broadcast to ``input``) is true."""
    x = as_tensor(input)
    m = np.asarray(mask.numpy() if isinstance(mask, Tensor) else mask)
    if m.dtype != np.bool_:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got {m.dtype}")
    return where(np.broadcast_to(m, x.shape), value, x)


@_export
def narrow(input, dim, start, length):
    """``torch.narrow``: ``length`` entries from ``start`` along ``dim`` (a view)."""
    x = as_tensor(input)
    d = operator.index(dim) % builtins.max(x.ndim, 1)
    n = x.shape[d]
    start = operator.index(start) + (n if start < 0 else 0)
    if not (0 <= start <= n and 0 <= length <= n - start):
        raise IndexError(
            f"narrow: start {start} and length {length} do not fit axis {d} of length {n}"
        )
    key = (slice(None),) * d + (slice(start, start + length),)
    return x[key]


@_export
def chunk(input, chunks, dim=0):
    """``torch.chunk``: ``chunks`` pieces along ``dim`` of ``ceil(n / chunks)`` entries each,
    the last one smaller (fewer pieces when they run out), as PyTorch splits."""
    x = as_tensor(input)
    if operator.index(chunks) < 1:
        raise ValueError(f"chunk: chunks must be at least 1, got {chunks}")
    d = operator.index(dim) % builtins.max(x.ndim, 1)
    n = x.shape[d]
    size = -(-n // chunks) if n else 0
    if size == 0:
        return (x,)
    return tuple(narrow(x, d, s, builtins.min(size, n - s)) for s in range(0, n, size))


def _triangle(name, keep):
    def fn(input, diagonal=0):
        x = as_tensor(input)
        if x.ndim < 2:
            raise ValueError(f"{name}: input must have at least 2 axes, got shape {tuple(x.shape)}")
        r, c = x.shape[-2:]
        mask = keep(np.ones((r, c), np.bool_), diagonal)
        return where(np.broadcast_to(mask, x.shape), x, 0.0)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"``torch.{name}``: the {'lower' if name == 'tril' else 'upper'} triangle of the last "
        "two axes (``diagonal`` shifts it), zeros elsewhere."
    )
    return _export(fn)


tril = _triangle("tril", np.tril)
triu = _triangle("triu", np.triu)


def _install_torch_methods(T):
    """PyTorch's method names and arguments (``dim``, ``keepdim``, ``alpha``), on top of the
    registry's."""
    T.add = _alpha_op(add, "add")
    T.sub = _alpha_op(sub, "sub")
    T.mul = mul
    T.div = _div
    T.pow = _pow
    T.t = t
    T.mm = mm
    T.mv = mv
    T.bmm = bmm
    T.sum = sum
    T.prod = prod
    T.max = max
    T.min = min
    T.argmax = argmax
    T.argmin = argmin
    # PyTorch's methods: x.sort() gives (values, indices), where tape.sort (NumPy) gives values
    T.at = property(scatter.at)
    T.index_add = scatter.index_add
    T.sort = scan.sort_method
    T.argsort = scan.argsort_method
    T.topk = scan.topk
    T.__and__ = T.__rand__ = _bool_op(logical_and, "&")
    T.__or__ = T.__ror__ = _bool_op(logical_or, "|")
    T.__xor__ = T.__rxor__ = _bool_op(logical_xor, "^")
    T.__invert__ = lambda a: _bool_op(lambda x, _: logical_not(x), "~")(a, None)
    T.all = all
    T.any = any
    T.gather = gather
    T.index_select = index_select
    T.masked_fill = masked_fill
    T.narrow = narrow
    T.chunk = chunk
    T.tril = tril
    T.triu = triu
    T.isclose = isclose
    T.allclose = allclose
    for name, fn in (("eq", "equal"), ("ne", "not_equal"), ("lt", "less"), ("le", "less_equal"),
                     ("gt", "greater"), ("ge", "greater_equal")):  # fmt: skip
        setattr(T, name, globals()[fn])
    # PyTorch's spellings where they differ from NumPy's functions: x.repeat(*sizes) is
    # tape.tile, x.repeat_interleave is tape.repeat, x.split takes piece sizes, x.flip(*dims)
    T.repeat = movement.torch_repeat
    T.repeat_interleave = lambda x, repeats, dim=None: movement.repeat(x, repeats, dim)
    T.split = movement.torch_split
    T.flip = movement.torch_flip
    T.tile = lambda x, *reps: movement.tile(x, reps[0] if len(reps) == 1 else reps)
    T.var = _t_var
    T.std = _t_std
    T.expand = _expand
    T.expand_as = lambda x, other: movement.broadcast_to(x, other.shape)
    T.view_as = lambda x, other: reshape(x, other.shape)
    T.contiguous = lambda x, memory_format=None: x  # tensors are always C-contiguous
    T.new_zeros = _new(_tensor_mod.zeros)
    T.new_ones = _new(_tensor_mod.ones)
    T.new_empty = _new(_tensor_mod.empty)
    T.new_full = _new_full
    T.new_tensor = _new_tensor
    T.type_as = lambda x, other: x.to(other.dtype)
    T.add_ = _leaf_inplace("add_", lambda v, o, alpha=1: v + alpha * _val(o))
    T.sub_ = _leaf_inplace("sub_", lambda v, o, alpha=1: v - alpha * _val(o))
    T.mul_ = _leaf_inplace("mul_", lambda v, o: v * _val(o))
    T.div_ = _leaf_inplace("div_", lambda v, o: v / _val(o))
    T.clamp_ = T.clip_ = _leaf_inplace(
        "clamp_",
        lambda v, min=None, max=None: np.clip(
            v,
            -np.inf if min is None else _val(min),  # noqa: A006
            np.inf if max is None else _val(max),
        ),  # fmt: skip
    )
    T.normal_ = _leaf_inplace("normal_", _normal_)
    T.uniform_ = _leaf_inplace("uniform_", _uniform_)


_install()


# ---------------------------------------------------------------- PyTorch's keywords and out=
# ``torch.add(input=a, other=b)``, ``torch.matmul(a, other=b)``, ``torch.sin(x, out=y)``: the
# module-level functions take PyTorch's keyword names for their tensor arguments and ``out=``
# (the Tensor methods, installed above, are the plain functions).


def _write_out(name, out, r):
    """``out=``: the result copied into ``out``, as PyTorch (which refuses it with grad)."""
    if not isinstance(out, Tensor):
        raise TypeError(f"{name}(): argument 'out' must be Tensor, not {type(out).__name__}")
    if out.requires_grad or r.requires_grad:
        raise RuntimeError(
            f"{name}(): functions with out=... arguments don't support automatic "
            "differentiation, but one of the arguments requires grad."
        )
    if r._tape is not None:
        raise RuntimeError(f"{name}(out=...) inside tape.record(): return the result instead")
    if tuple(out.shape) != tuple(r.shape):
        raise RuntimeError(
            f"{name}(): out= has shape {tuple(out.shape)}, the result has shape "
            f"{tuple(r.shape)} (tape does not resize out)"
        )
    if out.dtype != r.dtype:
        raise RuntimeError(f"{name}(): result type {r.dtype} can't be cast to out's {out.dtype}")
    with _tensor_mod.no_grad():
        out.copy_(r)
    return out


def _torch_keywords(fn, names):
    """``fn`` taking its leading tensor arguments by PyTorch's ``names`` too, and ``out=``."""

    def call(*args, out=None, **kw):
        if kw and builtins.any(n in kw for n in names):
            args = list(args)
            for k, n in enumerate(names):
                if n in kw:
                    if len(args) > k:
                        raise TypeError(f"{fn.__name__}() got multiple values for argument {n!r}")
                    if len(args) < k:  # an argument before it is left out: keywords from here
                        break
                    args.append(kw.pop(n))
        if "alpha" in kw and fn in (add, sub):  # torch.add(a, b, alpha=2): a + 2 * b
            alpha = kw.pop("alpha")
            args = [args[0], _scaled(args[1], alpha)]
        if "dtype" in kw and fn.__name__ in _CAST_FIRST:  # torch.sum(x, dtype=...): cast, then sum
            dtype = kw.pop("dtype")
            if dtype is not None:
                args = [as_tensor(args[0]).to(dtype), *args[1:]]
        if "p" in kw and fn.__name__ == "norm":  # torch.norm(x, p=1): NumPy's ord
            kw["ord"] = kw.pop("p")
        r = fn(*args, **kw)
        return r if out is None else _write_out(fn.__name__, out, r)

    functools.update_wrapper(call, fn)
    return call


_CAST_FIRST = frozenset(
    ("sum", "mean", "prod", "softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp")
)
"""Functions whose ``dtype=`` (PyTorch's) casts the input before the operation."""


def _keywords():
    g = globals()
    named = {op.name: ("input", "other")[: op.arity] for op in registry.OPS if op.arity in (1, 2)}
    named.update(
        {"where": ("condition", "input", "other"), "clip": ("input",), "clamp": ("input",)}
    )
    for name in ("matmul", "mm", "bmm", "dot"):
        named[name] = ("input", "other")
    named.update({"mv": ("input", "vec"), "outer": ("input", "vec2"), "pow": ("input", "exponent")})
    # PyTorch's names of the leading arguments where tape's functions take NumPy's
    named.update({
        "transpose": ("input", "dim0", "dim1"), "swapaxes": ("input", "axis0", "axis1"),
        "swapdims": ("input", "dim0", "dim1"), "flatten": ("input", "start_dim", "end_dim"),
        "unsqueeze": ("input", "dim"), "squeeze": ("input", "dim"), "permute": ("input", "dims"),
        "tile": ("input", "dims"), "diag": ("input", "diagonal"), "reshape": ("input", "shape"), "take": ("input", "index"),
        "moveaxis": ("input", "source", "destination"),
        "movedim": ("input", "source", "destination"), "topk": ("input", "k"),
        "cat": ("tensors",), "stack": ("tensors",),
        "concatenate": ("tensors",),
    })  # fmt: skip
    for name in ("t", "trace", "sort", "argsort", "min", "max", "argmax", "argmin", "all",
                 "any", "flip", "diagonal", "roll", "round", "var_mean", "std_mean", "median",
                 "clone", "detach", "numel", "square", "sign", "reciprocal", "floor", "ceil",
                 "trunc", "frac", "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "atan",
                 "log2", "log10", "log1p", "expm1", "exp2", "rsqrt", "erf", "erfc"):  # fmt: skip
        named.setdefault(name, ("input",))
    for name in ("sum", "mean", "prod", "amax", "amin", "logsumexp", "var", "std", "norm",
                 "cumsum", "cumprod", "logcumsumexp", "softmax", "log_softmax", "exp", "log",
                 "abs", "sqrt", "neg", "sigmoid", "tanh", "relu"):  # fmt: skip
        named.setdefault(name, ("input",))
    for name, names in named.items():
        if name in g and callable(g[name]):
            g[name] = _torch_keywords(g[name], names)


_keywords()
