"""PyTorch's ``torch.nn.functional``: losses, activations, ``linear`` and ``normalize``.

Every function is composed from tape's differentiable ops (:mod:`tape.functional`), so it
needs no derivative rules of its own: gradients come from the tape, in eager mode and inside
:func:`tape.record` alike. Signatures, defaults and semantics follow PyTorch's (including the
deprecated ``size_average`` / ``reduce`` arguments of the losses); inputs may be tensors,
NumPy arrays or numbers.

Class-index targets (``cross_entropy``, ``nll_loss``) are integer tensors or arrays. They are
checked against the number of classes when the loss is built; inside a recording, a target
that is an argument of the recorded function is checked again at every replay (by the ``take``
that gathers class weights; a negative target other than ``ignore_index`` is reported there
shifted by minus the number of classes).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from tape.frontend import functional as _tf
from tape.frontend.ops import linalg as _linalg
from tape.frontend.ops import movement as _movement
from tape.frontend.ops import reduce as _red
from tape.frontend.tensor import Tensor, apply, as_tensor, float64, reshape, unsqueeze
from tape.ops.blocks import matmul as mm_block
from tape.ops.blocks import scan as scan_block
from tape.ops.nn import CROSS_ENTROPY, MATMUL_NT

# Elementwise ops come from tape.functional (generated from the op registry); reductions and
# structural ops from their front ends, whose positional signatures
# (x, axis, keepdims) do not follow the public API's NumPy/PyTorch spellings.

__all__ = [
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "cross_entropy",
    "nll_loss",
    "softmax",
    "log_softmax",
    "relu",
    "leaky_relu",
    "elu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "softplus",
    "linear",
    "normalize",
    "one_hot",
    "dropout",
]

_REDUCTIONS = ("none", "mean", "sum")


# ---------------------------------------------------------------- helpers


def _float(x):
    """``x`` as a floating tensor (integer and bool data become float64)."""
    x = as_tensor(x)
    if x.dtype.kind != "f":
        x = as_tensor(np.asarray(x._peek(), dtype=float64)) if x._tape is None else x * 1.0
    return x


def _like(v, x):
    """``v`` (weights and other constants) as a tensor of ``x``'s floating dtype."""
    if isinstance(v, Tensor):
        return v if v.dtype == x.dtype else v.to(x.dtype)
    return as_tensor(np.asarray(v, dtype=x.dtype))


def _shape(v):
    return v.shape if isinstance(v, Tensor) else np.shape(v)


def _reduction(name, size_average, reduce, reduction):
    """The reduction string, from ``reduction`` or the deprecated ``size_average`` / ``reduce``."""
    if size_average is not None or reduce is not None:
        sa = True if size_average is None else bool(size_average)
        rd = True if reduce is None else bool(reduce)
        reduction = "mean" if (sa and rd) else "sum" if rd else "none"
        warnings.warn(
            "size_average and reduce args will be deprecated, please use "
            f"reduction='{reduction}' instead.",
            UserWarning,
            stacklevel=3,
        )
    if reduction == "elementwise_mean":
        warnings.warn(
            "reduction='elementwise_mean' is deprecated. Please use reduction='mean' instead.",
            UserWarning,
            stacklevel=3,
        )
        reduction = "mean"
    if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
        raise ValueError(
            f"{name}: {reduction!r} is not a valid value for reduction "
            "(expected 'none', 'mean' or 'sum')"
        )
    return reduction


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _red.sum(loss)
    n = loss.numel()
    return _red.sum(loss) / n if n else _red.sum(loss) * np.nan


def _dim(name, dim, ndim):
    """``dim`` as a non-negative axis of an ``ndim``-D tensor (a 0-D tensor has axis 0/-1)."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{name}: dim must be an int, got {dim!r}")
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    if not lo <= dim <= hi:
        raise IndexError(
            f"{name}: Dimension out of range (expected to be in range of [{lo}, {hi}], "
            f"but got {dim})"
        )
    return int(dim) % max(ndim, 1)


def _pair(name, input, target):
    """Input and target of an elementwise loss: broadcast (with PyTorch's warning) if their
    shapes differ, a RuntimeError if they do not broadcast."""
    x, y = _float(input), _float(target)
    if x.shape != y.shape:
        try:
            np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise RuntimeError(
                f"{name}: the target size {tuple(y.shape)} does not broadcast with the input size "
                f"{tuple(x.shape)}"
            ) from None
        warnings.warn(
            f"{name}: Using a target size ({tuple(y.shape)}) that is different to the input size "
            f"({tuple(x.shape)}). This will likely lead to incorrect results due to broadcasting. "
            "Please ensure they have the same size.",
            UserWarning,
            stacklevel=3,
        )
    return x, y


def _broadcast_weight(name, what, w, x):
    """A weight that must broadcast to ``x``'s shape without enlarging it."""
    w = _like(w, x)
    try:
        ok = np.broadcast_shapes(w.shape, x.shape) == x.shape
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(
            f"{name}: {what} of shape {tuple(w.shape)} cannot be broadcast to the input's shape {tuple(x.shape)}"
        )
    return w


def _weighted_reduce(name, loss, x, weight, reduction):
    """``loss * weight`` reduced, the mean being ``sum(w * loss) / sum(w)`` (mse/l1 losses)."""
    if weight is None:
        return _reduce(loss, reduction)
    w = _like(weight, x)
    if w.shape != x.shape:
        raise ValueError(
            f"{name}: Weights and input must have the same size, got weight of shape {tuple(w.shape)} "
            f"and input of shape {tuple(x.shape)}"
        )
    loss = loss * w
    if reduction == "mean":
        return _red.sum(loss) / _red.sum(w)
    return _reduce(loss, reduction)


def _inplace(name, input, out, inplace):
    """PyTorch's ``inplace=True``: write ``out`` into ``input`` (tensors that own their value
    and are not tracked for gradients only) and return ``input``."""
    if not inplace:
        return out
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}: inplace=True needs a tensor input, got {type(input).__name__}")
    try:
        return input.copy_(out)
    except RuntimeError as e:
        raise RuntimeError(f"{name}(inplace=True): {e}") from None


# ---------------------------------------------------------------- activations


def relu(input, inplace=False):
    """``max(x, 0)`` elementwise (gradient 0 at 0, as PyTorch)."""
    return _inplace("relu", input, _tf.relu(_float(input)), inplace)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """``x`` where ``x > 0``, else ``negative_slope * x``."""
    x = _float(input)
    return _inplace("leaky_relu", input, _tf.where(x > 0, x, x * negative_slope), inplace)


def elu(input, alpha=1.0, inplace=False):
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    x = _float(input)
    # expm1 of min(x, 0): no overflow in the branch not taken (its adjoint would be 0 * inf)
    neg = _tf.expm1(_tf.clip(x, None, 0.0)) * alpha
    return _inplace("elu", input, _tf.where(x > 0, x, neg), inplace)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(input, approximate="none"):
    """Gaussian error linear unit: ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))``, or with
    ``approximate='tanh'``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    x = _float(input)
    if approximate == "none":
        return x * 0.5 * (1.0 + _tf.erf(x * _SQRT_HALF))
    if approximate == "tanh":
        return x * 0.5 * (1.0 + _tf.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    raise ValueError(
        f"gelu: approximate argument must be either 'none' or 'tanh', got {approximate!r}"
    )


def silu(input, inplace=False):
    """Sigmoid linear unit (swish): ``x * sigmoid(x)``."""
    x = _float(input)
    return _inplace("silu", input, x * _tf.sigmoid(x), inplace)


def sigmoid(input):
    """``1 / (1 + exp(-x))`` elementwise."""
    return _tf.sigmoid(_float(input))


def tanh(input):
    """Hyperbolic tangent elementwise."""
    return _tf.tanh(_float(input))


def softplus(input, beta=1.0, threshold=20.0):
    """``log(1 + exp(beta x)) / beta``, and ``x`` itself where ``beta x > threshold``."""
    x = _float(input)
    bx = x if beta == 1 else x * beta
    sp = _tf.softplus(bx)
    if beta != 1:
        sp = sp / beta
    return _tf.where(bx > threshold, x, sp)


def _softmax_dim(name, x, dim, stacklevel):
    if dim is None:
        warnings.warn(
            f"Implicit dimension choice for {name} has been deprecated. "
            "Change the call to include dim=X as an argument.",
            UserWarning,
            stacklevel=stacklevel + 1,
        )
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return _dim(name, dim, x.ndim)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """``exp(x) / sum(exp(x))`` along ``dim`` (shifted by the maximum: no overflow).
    ``dtype`` casts the input first."""
    x = _float(input) if dtype is None else as_tensor(input).to(dtype)
    return _tf.softmax(x, _softmax_dim("softmax", x, dim, _stacklevel))


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """``x - logsumexp(x)`` along ``dim``. ``dtype`` casts the input first."""
    x = _float(input) if dtype is None else as_tensor(input).to(dtype)
    return _tf.log_softmax(x, _softmax_dim("log_softmax", x, dim, _stacklevel))


# ---------------------------------------------------------------- linear, normalize


def linear(input, weight, bias=None):
    """``y = x W^T + b`` for ``x`` of shape ``(*, in)``, ``W`` of shape ``(out, in)`` (or
    ``(in,)``: then ``y`` has shape ``(*)``) and ``b`` broadcastable to the output."""
    x, w = _float(input), _float(weight)
    if w.ndim not in (1, 2):
        raise RuntimeError(f"linear: weight must be 1-D or 2-D, got shape {tuple(w.shape)}")
    if x.ndim == 0:
        raise RuntimeError("linear: input must have at least 1 dimension, got a 0-d input")
    k = w.shape[-1]
    if x.shape[-1] != k:
        rows = math.prod(x.shape[:-1])
        cols = w.shape[0] if w.ndim == 2 else 1
        raise RuntimeError(
            f"linear: mat1 and mat2 shapes cannot be multiplied ({rows}x{x.shape[-1]} and "
            f"{k}x{cols}): input of shape {tuple(x.shape)}, weight of shape {tuple(w.shape)}"
        )
    if w.ndim == 2:  # x W^T as one matmul_nt entry: W read in place, no copy of W.T
        n = w.shape[0]
        rows = math.prod(x.shape[:-1])
        x2 = x if x.ndim == 2 else reshape(x, (rows, k))
        out = apply(MATMUL_NT, [x2, w], (rows, n), mm_block.encode(1, rows, k, n, 0, 0))
        if x.ndim != 2:
            out = reshape(out, x.shape[:-1] + (n,))
    elif x.ndim <= 3:
        out = _linalg.matmul(x, w)
    else:
        out = reshape(_linalg.matmul(reshape(x, (-1, k)), w), x.shape[:-1])
    if bias is None:
        return out
    b = _float(bias)
    bs, os_ = b.shape, out.shape
    if bs == os_[-1:] or bs == () or bs == os_:  # the common shapes, without NumPy's rules
        ok = True
    else:
        try:
            ok = np.broadcast_shapes(os_, bs) == os_
        except ValueError:
            ok = False
    if not ok:
        raise RuntimeError(
            f"linear: bias of shape {tuple(b.shape)} does not match the output's shape {tuple(out.shape)} "
            f"(input {tuple(x.shape)}, weight {tuple(w.shape)})"
        )
    return out + b


def _vector_norm(x, p, dim):
    """The ``p``-norm along ``dim``, keeping the axis (gradient 0 at a zero vector)."""
    if p == 2:
        s = _red.sum(x * x, dim, True)
        pos = s > 0  # the square root through a masked where: gradient 0 (not NaN) at zero
        return _tf.where(pos, _tf.sqrt(_tf.where(pos, s, 1.0)), 0.0)
    if p == 1:
        return _red.sum(_tf.abs(x), dim, True)
    if p == math.inf:
        return _red.max(_tf.abs(x), dim, True)
    if p == -math.inf:
        return _red.min(_tf.abs(x), dim, True)
    if p == 0:
        return _red.sum(_tf.where(x != 0, 1.0, 0.0), dim, True)
    s = _red.sum(_tf.abs(x) ** p, dim, True)
    pos = s > 0
    return _tf.where(pos, _tf.where(pos, s, 1.0) ** (1.0 / p), 0.0)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """``x / max(||x||_p, eps)`` along ``dim``. ``out`` (a plain tensor) receives a copy of the
    result, which is then not differentiable, as in PyTorch."""
    x = _float(input)
    d = _dim("normalize", dim, x.ndim)
    y = x / _tf.clip(_vector_norm(x, p, d), eps)
    if out is None:
        return y
    if not isinstance(out, Tensor):
        raise TypeError(f"normalize: out must be a tensor, got {type(out).__name__}")
    return out.copy_(y)


# ---------------------------------------------------------------- elementwise losses


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """Mean squared error ``(x - y)^2``, reduced; with ``weight`` (input's shape) the mean is
    ``sum(w (x - y)^2) / sum(w)``."""
    reduction = _reduction("mse_loss", size_average, reduce, reduction)
    x, y = _pair("mse_loss", input, target)
    return _weighted_reduce("mse_loss", (x - y) ** 2, x, weight, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """Mean absolute error ``|x - y|``, reduced; with ``weight`` (input's shape) the mean is
    ``sum(w |x - y|) / sum(w)``."""
    reduction = _reduction("l1_loss", size_average, reduce, reduction)
    x, y = _pair("l1_loss", input, target)
    return _weighted_reduce("l1_loss", _tf.abs(x - y), x, weight, reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """Huber-like loss: ``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta``
    (``d = x - y``; ``beta=0`` is the L1 loss)."""
    reduction = _reduction("smooth_l1_loss", size_average, reduce, reduction)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss does not support negative values for beta, got {beta}")
    x, y = _pair("smooth_l1_loss", input, target)
    d = x - y
    ad = _tf.abs(d)
    if beta == 0:
        return _reduce(ad, reduction)
    return _reduce(_tf.where(ad < beta, d * d * (0.5 / beta), ad - 0.5 * beta), reduction)


def _clamped_log(x):
    """``max(log(x), -100)``, with a zero (not NaN) gradient where ``x <= 0``."""
    pos = x > 0
    return _tf.where(pos, _tf.clip(_tf.log(_tf.where(pos, x, 1.0)), -100.0), -100.0)


def _clamped_log1m(x):
    """``max(log(1 - x), -100)`` (as ``log1p(-x)``), with a zero gradient where ``x >= 1``."""
    pos = x < 1
    return _tf.where(pos, _tf.clip(_tf.log1p(-_tf.where(pos, x, 0.0)), -100.0), -100.0)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):  # fmt: skip
    """``-w [y log(x) + (1 - y) log(1 - x)]`` for probabilities ``x``, each log clamped at
    -100 as in PyTorch; ``weight`` broadcasts to the input's shape."""
    name = "binary_cross_entropy"
    reduction = _reduction(name, size_average, reduce, reduction)
    x, y = _float(input), _float(target)
    if y.shape != x.shape:
        raise ValueError(
            f"{name}: Using a target size ({tuple(y.shape)}) that is different to the input size "
            f"({tuple(x.shape)}) is deprecated. Please ensure they have the same size."
        )
    v = x._peek()  # a range check, not a value the result depends on
    bad = ~((v >= 0) & (v <= 1))
    if bad.any():
        raise RuntimeError(
            f"{name}: all elements of input should be between 0 and 1, got {float(v[bad].flat[0])}"
        )
    loss = -(y * _clamped_log(x) + (1.0 - y) * _clamped_log1m(x))
    if weight is not None:
        loss = loss * _broadcast_weight(name, "weight", weight, x)
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):  # fmt: skip
    """Binary cross-entropy of ``sigmoid(x)``, computed stably from the logits ``x``:
    ``w [(1 - y) x + (1 + (p - 1) y) softplus(-x)]`` with ``p`` the ``pos_weight`` (1 if
    None), which broadcasts over the input (one per class on the last axis)."""
    name = "binary_cross_entropy_with_logits"
    reduction = _reduction(name, size_average, reduce, reduction)
    x, y = _float(input), _float(target)
    if y.shape != x.shape:
        raise ValueError(
            f"{name}: Target size ({tuple(y.shape)}) must be the same as input size ({tuple(x.shape)})"
        )
    sp = _tf.softplus(-x)
    if pos_weight is None:
        loss = (1.0 - y) * x + sp
    else:
        pw = _broadcast_weight(name, "pos_weight", pos_weight, x)
        loss = (1.0 - y) * x + (1.0 + (pw - 1.0) * y) * sp
    if weight is not None:
        loss = loss * _broadcast_weight(name, "weight", weight, x)
    return _reduce(loss, reduction)


# ---------------------------------------------------------------- class-index losses


def _class_weight(name, weight, n_classes, x):
    if weight is None:
        return None
    w = _like(weight, x)
    if w.shape != (n_classes,):
        raise RuntimeError(
            f"{name}: weight tensor should be defined either for all {n_classes} classes or no "
            f"classes but got weight tensor of shape: {tuple(w.shape)}"
        )
    return w


def _class_target(name, target, x, ignore_index):
    """The class-index target as an int64 tensor, its shape and values checked against the
    (log-)probabilities ``x`` of shape ``(C,)`` or ``(N, C, d1, ...)``."""
    t = target if isinstance(target, Tensor) else np.asarray(target)
    kind = t.dtype.kind
    if kind == "f":
        raise RuntimeError(
            f"{name}: expected target dtype to be an integer type (class indices), but got "
            f"{t.dtype} with shape {tuple(t.shape)} for input of shape {tuple(x.shape)}"
            + (
                " (class probabilities must have the input's shape)"
                if name == "cross_entropy"
                else ""
            )
        )
    if kind not in "iub":
        raise TypeError(f"{name}: target must hold integer class indices, got dtype {t.dtype}")
    t = as_tensor(t)
    if kind == "b" or t.dtype != np.int64:
        t = t * 1 if t._tape is not None else as_tensor(np.asarray(t._peek(), np.int64))
    if x.ndim == 0:
        raise ValueError(f"{name}: Expected 1 or more dimensions (got 0)")
    if x.ndim == 1:
        if t.ndim != 0:
            raise ValueError(
                f"{name}: for an unbatched input of shape {tuple(x.shape)} the target must be a 0-d "
                f"class index, got a target of shape {tuple(t.shape)}"
            )
    else:
        n = x.shape[0]
        if t.ndim == 0 or t.shape[0] != n:
            raise ValueError(
                f"{name}: Expected input batch_size ({n}) to match target batch_size "
                f"({t.shape[0] if t.ndim else 'none: a 0-d target'}); input of shape "
                f"{tuple(x.shape)}, target of shape {tuple(t.shape)}"
            )
        expect = (n,) + x.shape[2:]
        if t.shape != expect:
            raise RuntimeError(
                f"{name}: Expected target size {expect}, got {tuple(t.shape)} (input of shape {tuple(x.shape)})"
            )
    c = x.shape[0 if x.ndim == 1 else 1]
    v = t._peek()  # a range check now; replays check again in the take below
    bad = (v != ignore_index) & ((v < 0) | (v >= c))
    if bad.any():
        raise IndexError(
            f"{name}: Target {int(v[bad].flat[0])} is out of bounds (expected class indices "
            f"0 <= target < {c}, or ignore_index={ignore_index})"
        )
    return t


def _nll_terms(name, logp, target, weight, ignore_index):
    """Per-element ``-w[t] logp[t]`` (0 where ignored), the weights ``w[t]`` (0 where ignored)
    and the ignore mask, for log-probabilities ``logp`` of shape ``(C,)`` or ``(N, C, ...)``."""
    t = _class_target(name, target, logp, ignore_index)
    cdim = 0 if logp.ndim == 1 else 1
    c = logp.shape[cdim]
    w = _class_weight(name, weight, c, logp)
    if t._tape is None and logp.ndim <= 2 and logp.numel() < 1 << 24:
        # a target that is data, not a traced value: gather logp at the targets (one entry;
        # flat positions under 2**24 are exact in a float32 arena too)
        tv = np.asarray(t._value, np.int64)
        ign = tv == ignore_index
        safe = np.where(ign, 0, np.where(tv < 0, tv + c, tv))
        if logp.ndim == 1:
            picked = logp[int(safe)]
        else:  # logp[arange(n), safe], as one gather from the flat values
            flat = reshape(logp, -1)
            picked = _movement.take(flat, np.arange(safe.shape[0]) * c + safe)
        keep = np.where(ign, 0.0, 1.0).astype(logp.dtype)
        if w is None:
            w_t = as_tensor(keep)
            per = -picked
        else:
            w_t = _movement.take(w, safe) * keep
            per = -(w_t * picked)
        if ign.any():
            per = _tf.where(ign, 0.0, per)
        return per, w_t, as_tensor(ign), w, cdim
    ignored = t == ignore_index
    # w[t] through take: its index is checked at every replay, so a traced target out of range
    # raises there (negative targets are shifted out of take's range, which accepts -C..-1)
    idx = _tf.where(ignored, 0, _tf.where(t < 0, t - c, t))
    wvec = w if w is not None else as_tensor(np.ones(c, dtype=logp.dtype))
    w_t = _tf.where(ignored, 0.0, _movement.take(wvec, idx))
    classes = np.arange(c).reshape((c,) + (1,) * (logp.ndim - cdim - 1))
    onehot = unsqueeze(t, cdim) == classes
    picked = _red.sum(_tf.where(onehot, logp, 0.0), cdim)
    per = -picked if w is None else -(w_t * picked)
    return _tf.where(ignored, 0.0, per), w_t, ignored, w, cdim


_TARGETS: dict = {}
"""``id(target) -> (target, version, key, rows)``: :func:`_target_rows` of the class-index
tensors ``cross_entropy`` saw last (a training loop passes the same labels every step)."""


def _target_rows(name, target, x, ignore_index, cdim):
    """For a class-index ``target`` that is data (not traced), checked against the logits
    ``x``: ``(indices, keep, ignored, block)``, the indices the ``cross_entropy`` entry reads
    (ignored ones as 0, negative ones from the end), 1.0 / 0.0 where counted / ignored, the
    ignore mask and the entry's attribute block; None for a traced target. Kept per target
    tensor until it is written in place."""
    key = (x.shape, x.dtype, ignore_index)
    cached = isinstance(target, Tensor) and target._ver is not None
    if cached:
        hit = _TARGETS.get(id(target))
        if hit is not None and hit[0] is target and hit[1] == target._ver[0] and hit[2] == key:
            return hit[3]
    t = _class_target(name, target, x, ignore_index)
    if t._tape is not None or x.shape[cdim] >= 1 << 24:
        return None
    c = x.shape[cdim]
    tv = np.asarray(t._value, np.int64)
    ign = tv == ignore_index
    safe = np.where(ign, 0, np.where(tv < 0, tv + c, tv))
    keep = as_tensor(np.where(ign, 0.0, 1.0).astype(x.dtype))
    outer = x.shape[0] if cdim == 1 else 1
    block = scan_block.encode(outer, c, math.prod(x.shape[2:]))
    rows = (safe, keep, ign if ign.any() else None, block)
    if cached:
        if len(_TARGETS) > 64:
            _TARGETS.clear()
        _TARGETS[id(target)] = (target, target._ver[0], key, rows)
    return rows


def _fused_terms(name, x, rows, weight, cdim):
    """:func:`_nll_terms` of ``log_softmax(x)`` for the target ``rows`` of
    :func:`_target_rows`, with ``-log_softmax(x)[t]`` as one ``cross_entropy`` entry
    (:mod:`tape.ops.nn`); ``(per-element loss, weights w[t])``."""
    safe, keep, ign, block = rows
    w = _class_weight(name, weight, x.shape[cdim], x)
    per = apply(CROSS_ENTROPY, [x, safe], x.shape[:cdim] + x.shape[cdim + 1 :], block)
    if w is None:
        w_t = keep
    else:
        w_t = _movement.take(w, safe) * keep
        per = w_t * per
    if ign is not None:
        per = _tf.where(ign, 0.0, per)
    return per, w_t


def _nll_reduce(loss, w_t, reduction):
    if reduction == "mean":
        if w_t._tape is None and not w_t.requires_grad:  # constant weights: their sum as a number
            return _red.sum(loss) / float(w_t._value.sum())
        return _red.sum(loss) / _red.sum(w_t)
    return _reduce(loss, reduction)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):  # fmt: skip
    """Negative log-likelihood ``-w[t] x[t]`` of log-probabilities ``x`` (``(C,)`` with a 0-d
    target, ``(N, C)`` with ``(N,)``, or ``(N, C, d1, ...)`` with ``(N, d1, ...)``); targets
    equal to ``ignore_index`` count for nothing; the mean divides by ``sum(w[t])``."""
    reduction = _reduction("nll_loss", size_average, reduce, reduction)
    x = _float(input)
    loss, w_t, _, _, _ = _nll_terms("nll_loss", x, target, weight, ignore_index)
    return _nll_reduce(loss, w_t, reduction)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):  # fmt: skip
    """Cross-entropy of logits ``x`` (class axis 1, or 0 for an unbatched ``(C,)`` input):
    ``nll_loss(log_softmax(x), target)`` for class-index targets, or
    ``-sum_c w_c y_c log_softmax(x)_c`` for class-probability targets (a float target of the
    input's shape; the mean divides by the number of samples). ``label_smoothing`` mixes the
    target with the uniform distribution: ``(1 - eps) loss + eps * (smoothed term) / C``."""
    name = "cross_entropy"
    reduction = _reduction(name, size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(
            f"{name}: label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}"
        )
    x = _float(input)
    if x.ndim == 0:
        raise ValueError(f"{name}: Expected 1 or more dimensions (got 0)")
    cdim = 0 if x.ndim == 1 else 1
    c = x.shape[cdim]
    tshape = _shape(target)
    if label_smoothing == 0 and tshape != x.shape:
        rows = _target_rows(name, target, x, ignore_index, cdim)
        if rows is not None:  # class indices that are data: one entry
            loss, w_t = _fused_terms(name, x, rows, weight, cdim)
            return _nll_reduce(loss, w_t, reduction)
    logp = _tf.log_softmax(x, cdim)
    if tshape == x.shape:  # class probabilities (PyTorch's rule: same shape as the input)
        tkind = target.dtype.kind if isinstance(target, Tensor) else np.asarray(target).dtype.kind
        if tkind != "f":
            raise RuntimeError(
                f"{name}: Expected floating point type for target with class probabilities "
                f"(a target of the input's shape {tuple(x.shape)}), got an integer target"
            )
        if ignore_index >= 0:
            raise RuntimeError(f"{name}: ignore_index is not supported for floating point target")
        w = _class_weight(name, weight, c, x)
        y = _like(target, x)
        if label_smoothing > 0:
            y = y * (1.0 - label_smoothing) + label_smoothing / c
        prod = logp * y
        if w is not None:
            prod = prod * reshape(w, (c,) + (1,) * (x.ndim - cdim - 1))
        if reduction == "none":
            return -_red.sum(prod, cdim)
        total = -_red.sum(prod)
        if reduction == "sum":
            return total
        n = x.numel() // c if c else 0
        return total / n if n else total * np.nan
    loss, w_t, ignored, w, cdim = _nll_terms(name, logp, target, weight, ignore_index)
    nll = _nll_reduce(loss, w_t, reduction)
    if label_smoothing == 0:
        return nll
    if w is None:
        smooth = -_red.sum(logp, cdim)
    else:
        smooth = -_red.sum(logp * reshape(w, (c,) + (1,) * (logp.ndim - cdim - 1)), cdim)
    smooth = _tf.where(ignored, 0.0, smooth)
    if reduction == "mean":
        smooth = _red.sum(smooth) / _red.sum(w_t)  # w_t: the weights, or 1, of the counted targets
    else:
        smooth = _reduce(smooth, reduction)
    return nll * (1.0 - label_smoothing) + smooth * (label_smoothing / c)


# ---------------------------------------------------------------- encoding and dropout


def one_hot(tensor, num_classes=-1):
    """Class indices (int64, any shape) as one-hot rows: shape ``tensor.shape + (C,)``, int64.
    ``num_classes=-1`` takes ``max + 1`` (read from the values: inside ``tape.record`` pass it
    explicitly, as the shape is fixed at record time)."""
    t = tensor if isinstance(tensor, Tensor) else as_tensor(np.asarray(tensor))
    if t.dtype.kind not in "iu":
        raise RuntimeError(f"one_hot is only applicable to index tensors, got dtype {t.dtype}")
    v = t._peek()
    if num_classes == -1:
        if t._tape is not None and t._resolve()[0].recording:
            raise ValueError(
                "one_hot inside tape.record(): pass num_classes (the shape cannot follow the data)"
            )
        num_classes = int(v.max()) + 1 if v.size else 0
    if v.size and (v.min() < 0 or v.max() >= num_classes):
        raise RuntimeError(
            f"one_hot: class values must be in [0, {num_classes}), got {v.min()}..{v.max()}"
        )
    classes = np.arange(num_classes)
    return (unsqueeze(t, t.ndim) == classes) * 1


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``
    (``training=False``: the input itself). The mask comes from tape's default generator
    (``tape.manual_seed``). Inside ``tape.record`` it would be drawn once and frozen into
    the tape, so there it raises; record with ``training=False``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    x = _float(input)
    if not training or p == 0.0:
        return x
    if x._tape is not None and x._resolve()[0].recording:
        raise NotImplementedError(
            "dropout(training=True) inside tape.record(): its random mask would be frozen "
            "into the tape; record with training=False, or apply dropout outside the recording"
        )
    from tape.frontend.ops.creation import _rng

    keep = (_rng(None).random(x.shape) >= p).astype(x.dtype)
    scaled = keep / (1.0 - p) if p < 1.0 else keep
    out = x * scaled
    return _inplace("dropout", input, out, inplace) if inplace else out
