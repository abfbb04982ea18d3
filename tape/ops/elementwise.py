"""Elementwise ops: one line per op, forward rule first, then one reverse rule per input.

``h=`` gives the second partials (``f''(x0, y)`` for a unary op; ``(h00, h01, h11)`` of
``(x0, x1, y)`` for a binary one), used by Hessian-vector products; leave it out where they
are zero. The tangent (forward-mode) rule needs no column: it is the reverse rules applied to
the input tangents (see :mod:`tape.registry`).

Reverse rules get the inputs, the forward output ``y`` and the output adjoint ``gy``, and return
the contribution to that input's adjoint; the sweep adds it up, so ``x * x`` needs no special
case. Masks are written as selects (``gy if c else 0.0``), never as products, so an ``inf`` or
``NaN`` in an unselected branch cannot leak into a gradient.

Adding an op here is the whole job: run ``python -m tape._codegen`` afterwards to regenerate the
sweeps; the front-end function (``tp.<name>``), the ``Tensor`` operators and method the line
names, the result dtype and the tests follow from the op's record.
"""

import math

import numpy as np
from numba import njit

from tape import registry
from tape._config import KERNEL_JIT

_jit = njit(**KERNEL_JIT)


def _sigmoid(x0):
    if x0 >= 0.0:
        return 1.0 / (1.0 + np.exp(-x0))
    e = np.exp(x0)
    return e / (1.0 + e)


def _softplus(x0):
    return np.maximum(x0, 0.0) + np.log1p(np.exp(-np.abs(x0)))


def _pow(x0, x1):
    # small integer exponents as products (as PyTorch does): several times faster than pow()
    if x1 == 2.0:
        return x0 * x0
    if x1 == 3.0:
        return x0 * x0 * x0
    return x0**x1


def _ref_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _ref_relu(x):
    return np.maximum(x, 0.0)


def _ref_softplus(x):
    return np.logaddexp(0.0, x)


_ref_erf = np.vectorize(math.erf, otypes=[np.float64])
_ref_erfc = np.vectorize(math.erfc, otypes=[np.float64])
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _ref_identity(x):
    return x


def _ref_where(c, a, b):
    return np.where(c != 0, a, b)


def _cmp_ref(f):
    return lambda a, b: f(a, b).astype(np.float64)


def _jits(rules):
    return tuple(None if r is None else _jit(r) for r in rules)


def unary(name, fwd, rev, ref, domain=(-2.0, 2.0), h=None, **facts):
    # every unary op is also a Tensor method (x.exp(), x.stop_gradient()); h: f''(x0, y)
    return registry.elementwise(
        "unary", name, _jit(fwd), *_jits((rev,)), ref=ref, domain=domain, module=__name__,
        method=True, hess=_jits((h,)), **facts,
    )  # fmt: skip


def binary(name, fwd, rev0, rev1, ref, domain=(-2.0, 2.0), h=(None, None, None), **facts):
    # h: the second partials (h00, h01, h11), each h(x0, x1, y); None where zero
    return registry.elementwise(
        "binary", name, _jit(fwd), *_jits((rev0, rev1)), ref=ref, domain=domain,
        module=__name__, hess=_jits(h), **facts,
    )  # fmt: skip


def ternary(name, fwd, rev0, rev1, rev2, ref, domain=(-2.0, 2.0), **facts):
    rev = (None if r is None else _jit(r) for r in (rev0, rev1, rev2))
    return registry.elementwise(
        "ternary", name, _jit(fwd), *rev, ref=ref, domain=domain, module=__name__, **facts
    )


sigmoid_scalar = _jit(_sigmoid)
softplus_scalar = _jit(_softplus)

# Keyword facts of a line (see tape.registry.Op): ``operators`` / ``reflected``, the Tensor
# operators that record the op; ``method``, whether ``tape.<name>`` is a Tensor method too;
# ``dtype``, the result dtype rule; ``kinks`` and ``masks``, how the tests sample inputs.
KINK_AT_ZERO = ((1,),)  # the derivative jumps where x0 == 0
KINK_AT_TIES = ((1, -1),)  # ... where x0 == x1

# fmt: off
# name        forward                         reverse (x0, y, gy) -> contribution      reference
unary("neg",     lambda x0: -x0,              lambda x0, y, gy: -gy,                   np.negative, operators=("__neg__",), exact_ref=True)
unary("abs",     lambda x0: np.abs(x0),       lambda x0, y, gy: gy * np.sign(x0),      np.abs, operators=("__abs__",), kinks=KINK_AT_ZERO, exact_ref=True)
unary("square",  lambda x0: x0 * x0,          lambda x0, y, gy: 2.0 * x0 * gy,         np.square, h=lambda x0, y: 2.0, exact_ref=True)
unary("sqrt",    lambda x0: np.sqrt(x0),      lambda x0, y, gy: 0.5 * gy / y,          np.sqrt, (0.1, 3.0), h=lambda x0, y: -0.25 / (x0 * y), exact_ref=True)
unary("exp",     lambda x0: np.exp(x0),       lambda x0, y, gy: gy * y,                np.exp, h=lambda x0, y: y)
unary("log",     lambda x0: np.log(x0),       lambda x0, y, gy: gy / x0,               np.log, (0.1, 3.0), h=lambda x0, y: -1.0 / (x0 * x0))
unary("log1p",   lambda x0: np.log1p(x0),     lambda x0, y, gy: gy / (1.0 + x0),       np.log1p, (-0.5, 3.0), h=lambda x0, y: -1.0 / ((1.0 + x0) * (1.0 + x0)))
unary("expm1",   lambda x0: np.expm1(x0),     lambda x0, y, gy: gy * (y + 1.0),        np.expm1, h=lambda x0, y: y + 1.0)
unary("sin",     lambda x0: np.sin(x0),       lambda x0, y, gy: gy * np.cos(x0),       np.sin, h=lambda x0, y: -y)
unary("cos",     lambda x0: np.cos(x0),       lambda x0, y, gy: -gy * np.sin(x0),      np.cos, h=lambda x0, y: -y)
unary("tan",     lambda x0: np.tan(x0),       lambda x0, y, gy: gy * (1.0 + y * y),    np.tan, (-1.2, 1.2), h=lambda x0, y: 2.0 * y * (1.0 + y * y))
unary("tanh",    lambda x0: np.tanh(x0),      lambda x0, y, gy: gy * (1.0 - y * y),    np.tanh, h=lambda x0, y: -2.0 * y * (1.0 - y * y))
unary("sinh",    lambda x0: np.sinh(x0),      lambda x0, y, gy: gy * np.cosh(x0),      np.sinh, h=lambda x0, y: y)
unary("cosh",    lambda x0: np.cosh(x0),      lambda x0, y, gy: gy * np.sinh(x0),      np.cosh, h=lambda x0, y: y)
unary("arctan",  lambda x0: np.arctan(x0),    lambda x0, y, gy: gy / (1.0 + x0 * x0),  np.arctan, h=lambda x0, y: -2.0 * x0 / ((1.0 + x0 * x0) * (1.0 + x0 * x0)))
unary("sigmoid", _sigmoid,                    lambda x0, y, gy: gy * y * (1.0 - y),    _ref_sigmoid, (-4.0, 4.0), h=lambda x0, y: y * (1.0 - y) * (1.0 - 2.0 * y))
unary("relu",    lambda x0: np.maximum(x0, 0.0),
                                              lambda x0, y, gy: gy if x0 > 0.0 else 0.0, _ref_relu, kinks=KINK_AT_ZERO)
unary("softplus", _softplus,                  lambda x0, y, gy: gy * sigmoid_scalar(x0), _ref_softplus, (-4.0, 4.0),
      h=lambda x0, y: sigmoid_scalar(x0) * (1.0 - sigmoid_scalar(x0)))
unary("erf",     lambda x0: math.erf(x0),     lambda x0, y, gy: gy * TWO_OVER_SQRT_PI * np.exp(-x0 * x0), _ref_erf,
      h=lambda x0, y: -2.0 * x0 * TWO_OVER_SQRT_PI * np.exp(-x0 * x0))
unary("erfc",    lambda x0: math.erfc(x0),    lambda x0, y, gy: -gy * TWO_OVER_SQRT_PI * np.exp(-x0 * x0), _ref_erfc,
      h=lambda x0, y: 2.0 * x0 * TWO_OVER_SQRT_PI * np.exp(-x0 * x0))
# The value, recomputed at every replay, with no gradient (``detach`` inside a recording).
unary("stop_gradient", lambda x0: x0,         None,                                    _ref_identity)

# name       forward                        reverse input 0 (x0, x1, y, gy)       reverse input 1                      reference
binary("add",     lambda x0, x1: x0 + x1,   lambda x0, x1, y, gy: gy,             lambda x0, x1, y, gy: gy,            np.add,
       operators=("__add__",), reflected=("__radd__",), exact_ref=True)
binary("sub",     lambda x0, x1: x0 - x1,   lambda x0, x1, y, gy: gy,             lambda x0, x1, y, gy: -gy,           np.subtract,
       operators=("__sub__",), reflected=("__rsub__",), exact_ref=True)
binary("mul",     lambda x0, x1: x0 * x1,   lambda x0, x1, y, gy: gy * x1,        lambda x0, x1, y, gy: gy * x0,       np.multiply,
       operators=("__mul__",), reflected=("__rmul__",), h=(None, lambda x0, x1, y: 1.0, None), exact_ref=True)
# true division: integers divide to float64
binary("div",     lambda x0, x1: x0 / x1,   lambda x0, x1, y, gy: gy / x1,        lambda x0, x1, y, gy: -gy * y / x1,  np.divide, (0.5, 2.0),
       operators=("__truediv__",), reflected=("__rtruediv__",), dtype="float", exact_ref=True,
       h=(None, lambda x0, x1, y: -1.0 / (x1 * x1), lambda x0, x1, y: 2.0 * y / (x1 * x1)))
binary("pow",     _pow,
       lambda x0, x1, y, gy: 0.0 if x1 == 0.0 else gy * x1 * x0 ** (x1 - 1.0),
       lambda x0, x1, y, gy: 0.0 if x0 == 0.0 else gy * y * np.log(x0),                                     np.power, (0.5, 2.0),
       operators=("__pow__",), reflected=("__rpow__",),
       h=(lambda x0, x1, y: 0.0 if x1 == 0.0 or x1 == 1.0 else x1 * (x1 - 1.0) * x0 ** (x1 - 2.0),
          lambda x0, x1, y: 0.0 if x0 == 0.0 else x0 ** (x1 - 1.0) * (1.0 + x1 * np.log(x0)),
          lambda x0, x1, y: 0.0 if x0 == 0.0 else y * np.log(x0) * np.log(x0)))
binary("maximum", lambda x0, x1: np.maximum(x0, x1),
       lambda x0, x1, y, gy: gy if x0 > x1 else (0.5 * gy if x0 == x1 else 0.0),
       lambda x0, x1, y, gy: gy if x1 > x0 else (0.5 * gy if x0 == x1 else 0.0),                            np.maximum,
       method=True, kinks=KINK_AT_TIES, exact_ref=True)
binary("minimum", lambda x0, x1: np.minimum(x0, x1),
       lambda x0, x1, y, gy: gy if x0 < x1 else (0.5 * gy if x0 == x1 else 0.0),
       lambda x0, x1, y, gy: gy if x1 < x0 else (0.5 * gy if x0 == x1 else 0.0),                            np.minimum,
       method=True, kinks=KINK_AT_TIES, exact_ref=True)
# Comparisons give 1.0 / 0.0 (typed bool by their dtype rule) and carry no gradient.
binary("less",          lambda x0, x1: 1.0 if x0 < x1 else 0.0,  None, None, _cmp_ref(np.less),          operators=("__lt__",), dtype="bool", exact_ref=True)
binary("less_equal",    lambda x0, x1: 1.0 if x0 <= x1 else 0.0, None, None, _cmp_ref(np.less_equal),    operators=("__le__",), dtype="bool", exact_ref=True)
binary("greater",       lambda x0, x1: 1.0 if x0 > x1 else 0.0,  None, None, _cmp_ref(np.greater),       operators=("__gt__",), dtype="bool", exact_ref=True)
binary("greater_equal", lambda x0, x1: 1.0 if x0 >= x1 else 0.0, None, None, _cmp_ref(np.greater_equal), operators=("__ge__",), dtype="bool", exact_ref=True)
binary("equal",         lambda x0, x1: 1.0 if x0 == x1 else 0.0, None, None, _cmp_ref(np.equal),         operators=("__eq__",), dtype="bool", exact_ref=True)
binary("not_equal",     lambda x0, x1: 1.0 if x0 != x1 else 0.0, None, None, _cmp_ref(np.not_equal),     operators=("__ne__",), dtype="bool", exact_ref=True)

# where(cond, a, b): the condition is data, not differentiable; the result has the branches'
# dtype.
ternary("where", lambda x0, x1, x2: x1 if x0 != 0.0 else x2,
        None,
        lambda x0, x1, x2, y, gy: gy if x0 != 0.0 else 0.0,
        lambda x0, x1, x2, y, gy: 0.0 if x0 != 0.0 else gy,
        _ref_where, dtype=("like", (1, 2)), masks=(0,), exact_ref=True)
# clip(x, lo, hi) = minimum(maximum(x, lo), hi); each element's adjoint goes to the one input
# whose value was selected (x on the closed interval [lo, hi]). The result has x's dtype.
ternary("clip", lambda x0, x1, x2: np.minimum(np.maximum(x0, x1), x2),
        lambda x0, x1, x2, y, gy: gy if (x0 >= x1 and x0 <= x2) else 0.0,
        lambda x0, x1, x2, y, gy: gy if (x0 < x1 and x1 <= x2) else 0.0,
        lambda x0, x1, x2, y, gy: gy if np.maximum(x0, x1) > x2 else 0.0,
        np.clip, domains=((-2.0, 2.0), (-1.0, -0.5), (0.5, 1.0)),
        dtype=("like", (0,)), method=True, kinks=((1, -1, 0), (1, 0, -1)), exact_ref=True)
# fmt: on

# The records other modules name (they import these, never spell the op names).
STOP_GRADIENT = registry.BY_NAME["stop_gradient"]  # Tensor.detach inside a recording
SQUARE = registry.BY_NAME["square"]  # x ** 2
POW = registry.BY_NAME["pow"]
CLIP = registry.BY_NAME["clip"]  # tape.clip, whose bounds may be None
COMPARISONS = tuple(op.name for op in registry.OPS if op.dtype == "bool")
