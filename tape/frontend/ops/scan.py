"""Front ends of the scans and selections (:mod:`tape.ops.scan`): ``cumsum``, ``cumprod``,
``logcumsumexp``, ``argsort``, ``sort``, ``topk`` and the taped ``argmax`` / ``argmin``.

Every op views its input as ``(outer, n, inner)`` around the chosen axis (a free reshape), so
no axis is moved. The index ops record entries that a replay recomputes on its own data
(their positions are never frozen at the recorded values); ``sort`` and ``topk`` gather the
values at those positions with ``take`` on the flattened input, the flat positions computed
on the tape too, so the gradient reaches the elements selected at each replay.

NumPy and PyTorch differ on sorting, and the functions here follow NumPy:
``tape.sort(x)`` returns the sorted values, ``tape.argsort(x)`` the positions; the ``Tensor``
methods follow PyTorch: ``x.sort()`` returns ``(values, indices)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tape.frontend import tensor
from tape.frontend.ops import movement
from tape.ops.blocks import scan as sc
from tape.ops.scan import ARGMAX, ARGMIN, ARGSORT, CUMPROD, CUMSUM, LOGCUMSUMEXP

KINDS = (None, "stable", "mergesort", "quicksort", "heapsort")

F32_EXACT = 1 << 24  # positions a float32 arena holds exactly


class SortResult(NamedTuple):
    """What ``x.sort()`` returns, as PyTorch: the sorted values (differentiable) and the
    int64 positions they came from."""

    values: tensor.Tensor
    indices: tensor.Tensor


class TopK(NamedTuple):
    """What :func:`topk` returns, as PyTorch: the ``k`` largest (smallest) values
    (differentiable) and their int64 positions along the axis."""

    values: tensor.Tensor
    indices: tensor.Tensor


def _pick(fn, axis, dim, default):
    """``axis`` (NumPy) or ``dim`` (PyTorch); passing both raises."""
    if dim is not None:
        if axis != default:
            raise TypeError(f"{fn}: pass axis= or dim=, not both")
        return dim
    return axis


def _axis(fn, x, axis):
    """``axis`` of ``x`` as a non-negative int (a 0-d tensor takes 0 or -1, as in PyTorch,
    and is one row of one element)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{fn}: axis must be an int or None, got {axis!r}")
    nd = x.ndim
    if not -max(nd, 1) <= axis < max(nd, 1):
        raise ValueError(
            f"{fn}: axis {axis} is out of range for a tensor of shape {tuple(x.shape)} ({nd} dimensions)"
        )
    return int(axis) % max(nd, 1)


def _rows(shape, ax):
    """``(outer, n, inner)``: ``shape`` viewed around axis ``ax`` (0-d: one element)."""
    if not shape:
        return 1, 1, 1
    return math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1 :])


def _flat_or_axis(fn, x, axis):
    """``(x, axis)``, with ``axis=None`` meaning the flattened tensor (NumPy)."""
    if axis is None:
        return tensor.view(x, (x.numel(),), 0), 0
    return x, _axis(fn, x, axis)


def _check_positions(fn, x, n):
    if x.dtype == tensor.float32 and n > F32_EXACT:
        raise ValueError(
            f"{fn}: positions up to {n} do not fit a float32 arena exactly (at most "
            f"{F32_EXACT}); use float64 for a tensor of shape {tuple(x.shape)}"
        )


def _scan(op, fn, x, axis, dim):
    x = tensor.as_tensor(x)
    x, ax = _flat_or_axis(fn, x, _pick(fn, axis, dim, None))
    return tensor.apply(op, [x], x.shape, sc.encode(*_rows(x.shape, ax)))


def cumsum(x, axis=None, *, dim=None):
    """Cumulative sum along ``axis`` (NumPy; ``dim`` in PyTorch); ``axis=None`` sums the
    flattened tensor, as ``numpy.cumsum``. Integer and bool inputs give int64. The gradient
    is the reversed cumulative sum of the output's."""
    return _scan(CUMSUM, "cumsum", x, axis, dim)


def cumprod(x, axis=None, *, dim=None):
    """Cumulative product along ``axis`` (NumPy; ``dim`` in PyTorch); ``axis=None``
    multiplies the flattened tensor, as ``numpy.cumprod``. Its derivatives divide by
    nothing, so they are exact when elements are zero."""
    return _scan(CUMPROD, "cumprod", x, axis, dim)


def logcumsumexp(x, axis=None, *, dim=None):
    """``log(cumsum(exp(x)))`` along ``axis`` (``dim`` in PyTorch; ``axis=None``: the
    flattened tensor), computed as ``numpy.logaddexp.accumulate``: nothing overflows.
    Integer inputs give float64. The derivative is NaN where a row starts with -inf, as
    ``logaddexp``'s."""
    return _scan(LOGCUMSUMEXP, "logcumsumexp", x, axis, dim)


def argsort(x, axis=-1, kind=None, *, dim=None, descending=False, stable=True):
    """Positions that sort ``x`` along ``axis`` (``None``: the flattened tensor), int64,
    no gradient, as ``numpy.argsort(x, axis, kind="stable")``: ties keep their order, NaN
    sorts last (first with ``descending=True``, PyTorch's flag). Every ``kind`` gives this
    stable order, and so does PyTorch's ``stable=False``. Inside :func:`tape.record` the
    positions are recomputed at every replay."""
    x = tensor.as_tensor(x)
    if kind not in KINDS:
        raise ValueError(f"argsort: kind={kind!r} is not one of {KINDS}")
    x, ax = _flat_or_axis("argsort", x, _pick("argsort", axis, dim, -1))
    outer, n, inner = _rows(x.shape, ax)
    _check_positions("argsort", x, n)
    ints = [*sc.encode(outer, n, inner), int(bool(descending))]  # then sc.DESCENDING
    return tensor.apply(ARGSORT, [x], x.shape, ints, dtype=tensor.int64)


def take_along(x, idx, ax):
    """``x`` gathered along axis ``ax`` at positions ``idx`` (an integer tensor of ``x``'s
    shape but for axis ``ax``, values in ``0..n-1``): ``numpy.take_along_axis`` on the tape.
    The flat positions are computed by entries (``idx * inner + start of the row``), so a
    replay gathers where its own indices point; the gradient scatters back through
    ``take``."""
    x = tensor.as_tensor(x)
    outer, n, inner = _rows(x.shape, ax)
    m = idx.shape[ax] if idx.ndim else 1
    _check_positions("take_along", x, x.numel())
    flat = idx if inner == 1 else idx * inner
    if outer > 1 or inner > 1:
        start = np.arange(outer)[:, None, None] * (n * inner) + np.arange(inner)[None, None, :]
        flat = tensor.view(flat, (outer, m, inner), 0) + start
    out = movement.take(
        tensor.view(x, (x.numel(),), 0), tensor.view(flat, (outer * m * inner,), 0), 0
    )
    return tensor.view(out, idx.shape, 0)


def sort(x, axis=-1, kind=None, *, dim=None, descending=False, stable=True):
    """Sorted values along ``axis`` (``None``: the flattened tensor), as ``numpy.sort``:
    the values only (``x.sort()``, PyTorch's method, returns ``(values, indices)``). Ties
    keep their order, NaN sorts last (first with ``descending=True``). Differentiable: the
    gradient of each output goes to the element it came from (gathered at
    :func:`argsort`'s positions, recomputed at every replay)."""
    x = tensor.as_tensor(x)
    x, ax = _flat_or_axis("sort", x, _pick("sort", axis, dim, -1))
    idx = argsort(x, ax, kind, descending=descending, stable=stable)
    return take_along(x, idx, ax)


def sort_method(x, dim=-1, descending=False, stable=False, *, axis=None):
    """``x.sort(dim=-1, descending=False, stable=False)``, as PyTorch: ``(values, indices)``
    (a :class:`SortResult`). The order is always stable. The function ``tape.sort`` follows
    NumPy and returns the values only."""
    x = tensor.as_tensor(x)
    ax = _axis("sort", x, dim if axis is None else axis)
    idx = argsort(x, ax, descending=descending)
    return SortResult(take_along(x, idx, ax), idx)


def argsort_method(x, dim=-1, descending=False, stable=False, *, axis=None):
    """``x.argsort(dim=-1, descending=False, stable=False)``, as PyTorch (always stable):
    see :func:`argsort`."""
    return argsort(x, dim if axis is None else axis, descending=descending)


def topk(x, k, axis=-1, largest=True, sorted=True, *, dim=None):  # noqa: A002
    """The ``k`` largest (``largest=False``: smallest) elements along ``axis``, as
    ``torch.topk``: a :class:`TopK` ``(values, indices)``, the values differentiable (the
    gradient goes to the selected elements), the indices int64 positions along the axis.
    Always in sorted order (``sorted=False`` allows any order; this one is it); ties: the
    lower position first; NaN counts as the largest. Recomputed at every replay."""
    x = tensor.as_tensor(x)
    ax = _axis("topk", x, _pick("topk", axis, dim, -1))
    n = x.shape[ax] if x.ndim else 1
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"topk: k must be an int, got {k!r} ({type(k).__name__})")
    if not 0 <= k <= n:
        raise ValueError(
            f"topk: k={k} is out of range for axis {ax} (size {n}) of a tensor of shape {tuple(x.shape)}"
        )
    if x.ndim == 0:  # one row of one element (PyTorch takes 0-d tensors)
        values, idx = topk(tensor.view(x, (1,), 0), k, 0, largest, sorted)
        shape = () if k else (0,)
        return TopK(tensor.view(values, shape, 0), tensor.view(idx, shape, 0))
    idx = argsort(x, ax, descending=largest)
    if k < n:
        idx = idx[(slice(None),) * ax + (slice(0, int(k)),)]
    return TopK(take_along(x, idx, ax), idx)


def arg_extreme(name, x, axis, keepdims):
    """Position of the maximum (``name="argmax"``) or minimum along ``axis`` (``None``: of
    the flattened tensor), int64, as ``numpy.argmax`` (the first one on ties, the first
    NaN if any): recorded as an entry, so a replay recomputes it."""
    x = tensor.as_tensor(x)
    op = ARGMAX if name in ("max", "argmax") else ARGMIN
    shape = x.shape
    if axis is None:
        x, ax = tensor.view(x, (x.numel(),), 0), 0
        out_shape = (1,) * len(shape) if keepdims else ()
    else:
        ax = _axis(name, x, axis)
        out_shape = shape[:ax] + ((1,) if keepdims else ()) + shape[ax + 1 :] if shape else ()
    outer, n, inner = _rows(x.shape, ax)
    if n == 0:
        raise ValueError(
            f"{name}: cannot take the position of an extreme along an empty axis of a tensor "
            f"of shape {tuple(shape)}"
        )
    _check_positions(name, x, n)
    return tensor.apply(op, [x], out_shape, sc.encode(outer, n, inner), dtype=tensor.int64)


EXPORTS = (cumsum, cumprod, logcumsumexp, argsort, sort, topk)
"""The public functions, exported by :mod:`tape.functional`."""
