"""Elementwise ops: one line per op, forward rule first, then one reverse rule per input.

``h=`` gives the second partials (``f''(x0, y)`` for a unary op; ``(h00, h01, h11)`` of
``(x0, x1, y)`` for a binary one), used by Hessian-vector products; leave it out where they
are zero. The tangent (forward-mode) rule needs no column: it is the reverse rules applied to
the input tangents (see :mod:`tape.registry`).

Reverse rules get the inputs, the forward output ``y`` and the output adjoint ``gy``, and return
the contribution to that input's adjoint; the sweep adds it up, so ``x * x`` needs no special
case. Masks are written as selects (``gy if c else 0.0``), never as products, so an ``inf`` or
``NaN`` in an unselected branch cannot leak into a gradient.

Adding an op here is the whole job: run ``python -m tape.interpreter.codegen`` afterwards to regenerate the
sweeps; the front-end function (``tp.<name>``), the ``Tensor`` operators and method the line
names, the result dtype and the tests follow from the op's record.
"""

import math

import numpy as np
from numba import njit

from tape.layout.config import UNCACHED_JIT
from tape.ops import registry
from tape.ops import vmath as vm

_jit = njit(**UNCACHED_JIT)
_jit_inline = njit(inline="always", **UNCACHED_JIT)


def _rule_jit(f):
    """A rule that calls :mod:`tape.ops.vmath` (``vm.exp``) is inlined where the sweeps call it
    (Numba IR): LLVM does not inline a rule that large by itself, and a loop with a call in
    it does not vectorise."""
    calls_vm = any(f.__globals__.get(n) is vm for n in f.__code__.co_names)
    return _jit_inline(f) if calls_vm else _jit(f)


def _sigmoid(x0):
    # 1 / (1 + e**-x) for x >= 0, e**x / (1 + e**x) below: one exp, of -|x|, and a select
    e = vm.exp(-abs(x0))
    return (1.0 if x0 >= 0.0 else e) / (1.0 + e)


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
    return tuple(None if r is None else _rule_jit(r) for r in rules)


def unary(name, fwd, rev, ref, domain=(-2.0, 2.0), h=None, **facts):
    # every unary op is also a Tensor method (x.exp(), x.stop_gradient()); h: f''(x0, y)
    return registry.elementwise(
        "unary", name, _rule_jit(fwd), *_jits((rev,)), ref=ref, domain=domain, module=__name__,
        method=True, hess=_jits((h,)), **facts,
    )  # fmt: skip


def binary(name, fwd, rev0, rev1, ref, domain=(-2.0, 2.0), h=(None, None, None), **facts):
    # h: the second partials (h00, h01, h11), each h(x0, x1, y); None where zero
    return registry.elementwise(
        "binary", name, _rule_jit(fwd), *_jits((rev0, rev1)), ref=ref, domain=domain,
        module=__name__, hess=_jits(h), **facts,
    )  # fmt: skip


def ternary(name, fwd, rev0, rev1, rev2, ref, domain=(-2.0, 2.0), **facts):
    rev = (None if r is None else _jit(r) for r in (rev0, rev1, rev2))
    return registry.elementwise(
        "ternary", name, _jit(fwd), *rev, ref=ref, domain=domain, module=__name__, **facts
    )


sigmoid_scalar = _rule_jit(_sigmoid)
softplus_scalar = _jit(_softplus)


# ---- special functions: digamma and its derivatives (asymptotic series after shifting the
# argument to x >= 6, reflection below 1/2), erfinv (Newton on erf)


def _digamma(x):
    if x <= 0.0 and np.floor(x) == x:
        return np.nan
    refl = 0.0
    if x < 0.5:  # psi(1 - x) - psi(x) = pi cot(pi x)
        refl = -np.pi / np.tan(np.pi * x)
        x = 1.0 - x
    r = 0.0
    while x < 6.0:
        r -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    t = f * (
        -1.0 / 12
        + f
        * (
            1.0 / 120
            + f * (-1.0 / 252 + f * (1.0 / 240 + f * (-1.0 / 132 + f * (691.0 / 32760 - f / 12.0))))
        )
    )
    return refl + r + np.log(x) - 0.5 / x + t


def _trigamma(x):
    if x <= 0.0 and np.floor(x) == x:
        return np.nan
    refl = 0.0
    flip = False
    if x < 0.5:  # psi'(x) = pi^2 / sin^2(pi x) - psi'(1 - x)
        s = np.sin(np.pi * x)
        refl = np.pi * np.pi / (s * s)
        flip = True
        x = 1.0 - x
    r = 0.0
    while x < 6.0:
        r += 1.0 / (x * x)
        x += 1.0
    f = 1.0 / (x * x)
    t = (
        1.0 / x
        + 0.5 * f
        + f
        / x
        * (
            1.0 / 6
            + f
            * (
                -1.0 / 30
                + f
                * (1.0 / 42 + f * (-1.0 / 30 + f * (5.0 / 66 + f * (-691.0 / 2730 + f * 7.0 / 6))))
            )
        )
    )
    return refl - (r + t) if flip else r + t


def _tetragamma(x):
    if x <= 0.0 and np.floor(x) == x:
        return np.nan
    refl = 0.0
    flip = False
    if x < 0.5:  # psi''(x) = psi''(1 - x) - 2 pi^3 cos(pi x) / sin^3(pi x)
        s = np.sin(np.pi * x)
        refl = -2.0 * np.pi**3 * np.cos(np.pi * x) / (s * s * s)
        flip = True
        x = 1.0 - x
    r = 0.0
    while x < 6.0:
        r -= 2.0 / (x * x * x)
        x += 1.0
    f = 1.0 / (x * x)
    t = (
        -f
        - f / x
        - f
        * f
        * (0.5 + f * (-1.0 / 6 + f * (1.0 / 6 + f * (-3.0 / 10 + f * (5.0 / 6 - f * 691.0 / 210)))))
    )
    return r + t + refl if flip else r + t


def _erfinv(y):
    if not (-1.0 < y < 1.0):
        if y == 1.0:
            return np.inf
        if y == -1.0:
            return -np.inf
        return np.nan
    # a first guess good to ~1e-3 (Winitzki), then Newton steps on erf
    a = 0.147
    ln = np.log(1.0 - y * y)
    t = 2.0 / (np.pi * a) + 0.5 * ln
    x = np.sqrt(np.sqrt(t * t - ln / a) - t)
    if y < 0.0:
        x = -x
    for _ in range(4):
        e = math.erf(x) - y
        x -= e / (TWO_OVER_SQRT_PI * np.exp(-x * x))
    return x


digamma_scalar = _jit(_digamma)


def _mod(x0, x1):
    # Python's (and NumPy's) remainder: the sign of the divisor, computed as NumPy does
    m = np.fmod(x0, x1)
    if m != 0.0:
        if (x1 < 0.0) != (m < 0.0):
            m += x1
    else:
        m = math.copysign(0.0, x1)
    return m


def _floordiv(x0, x1):
    # Python's (and NumPy's) floor division, consistent with _mod: (x0 - mod) / x1, rounded
    m = np.fmod(x0, x1)
    if x1 == 0.0:
        return x0 / x1
    d = (x0 - m) / x1
    if m != 0.0 and (x1 < 0.0) != (m < 0.0):
        d -= 1.0
    if d == 0.0:
        return math.copysign(0.0, x0 / x1)
    f = np.floor(d)
    if d - f > 0.5:
        f += 1.0
    return f


mod_scalar = _jit(_mod)
floordiv_scalar = _jit(_floordiv)
trigamma_scalar = _jit(_trigamma)
tetragamma_scalar = _jit(_tetragamma)


def _bisect_erfinv(y):
    # the reference: bisection on math.erf, independent of the Newton iteration above
    if y <= -1.0 or y >= 1.0:
        return math.copysign(math.inf, y) if abs(y) == 1.0 else math.nan
    lo, hi = -6.0, 6.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if math.erf(mid) < y:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _richardson_digamma(x):
    # the reference: d/dx lgamma(x) by Richardson-extrapolated central differences
    def d(h):
        return (math.lgamma(x + h) - math.lgamma(x - h)) / (2 * h)

    h = 1e-3 * max(1.0, abs(x))
    return (4 * d(h / 2) - d(h)) / 3


_ref_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
_ref_digamma = np.vectorize(_richardson_digamma, otypes=[np.float64])
_ref_erfinv = np.vectorize(_bisect_erfinv, otypes=[np.float64])
LN2 = math.log(2.0)
LN10 = math.log(10.0)


def _ref_xlogy(x, y):
    return np.where(x == 0, 0.0, x * np.log(np.where(x == 0, 1.0, y)))


def _ref_zero(*xs):
    return np.zeros(np.broadcast_shapes(*(np.shape(x) for x in xs)))


# Keyword facts of a line (see tape.registry.Op): ``operators`` / ``reflected``, the Tensor
# operators that record the op; ``method``, whether ``tape.<name>`` is a Tensor method too;
# ``cheap`` and ``vectorises``, what the compiled tier's fused loops do with it;
# ``dtype``, the result dtype rule; ``kinks`` and ``masks``, how the tests sample inputs.
KINK_AT_ZERO = ((1,),)  # the derivative jumps where x0 == 0
KINK_AT_TIES = ((1, -1),)  # ... where x0 == x1

# fmt: off
# name        forward                         reverse (x0, y, gy) -> contribution      reference
unary("neg",     lambda x0: -x0,              lambda x0, y, gy: -gy,                   np.negative, operators=("__neg__",), exact_ref=True, cheap=True)
unary("abs",     lambda x0: np.abs(x0),       lambda x0, y, gy: gy * np.sign(x0),      np.abs, operators=("__abs__",), kinks=KINK_AT_ZERO, exact_ref=True, cheap=True)
unary("square",  lambda x0: x0 * x0,          lambda x0, y, gy: 2.0 * x0 * gy,         np.square, h=lambda x0, y: 2.0, exact_ref=True, cheap=True)
unary("sqrt",    lambda x0: np.sqrt(x0),      lambda x0, y, gy: 0.5 * gy / y,          np.sqrt, (0.1, 3.0), h=lambda x0, y: -0.25 / (x0 * y), exact_ref=True, vectorises=True)
unary("exp",     lambda x0: vm.exp(x0),       lambda x0, y, gy: gy * y,                np.exp, h=lambda x0, y: y)
unary("log",     lambda x0: vm.log(x0),       lambda x0, y, gy: gy / x0,               np.log, (0.1, 3.0), h=lambda x0, y: -1.0 / (x0 * x0))
unary("log1p",   lambda x0: np.log1p(x0),     lambda x0, y, gy: gy / (1.0 + x0),       np.log1p, (-0.5, 3.0), h=lambda x0, y: -1.0 / ((1.0 + x0) * (1.0 + x0)))
unary("expm1",   lambda x0: np.expm1(x0),     lambda x0, y, gy: gy * (y + 1.0),        np.expm1, h=lambda x0, y: y + 1.0)
unary("sin",     lambda x0: np.sin(x0),       lambda x0, y, gy: gy * np.cos(x0),       np.sin, h=lambda x0, y: -y)
unary("cos",     lambda x0: np.cos(x0),       lambda x0, y, gy: -gy * np.sin(x0),      np.cos, h=lambda x0, y: -y)
unary("tan",     lambda x0: np.tan(x0),       lambda x0, y, gy: gy * (1.0 + y * y),    np.tan, (-1.2, 1.2), h=lambda x0, y: 2.0 * y * (1.0 + y * y))
unary("tanh",    lambda x0: vm.tanh(x0),      lambda x0, y, gy: gy * (1.0 - y * y),    np.tanh, h=lambda x0, y: -2.0 * y * (1.0 - y * y))
unary("sinh",    lambda x0: np.sinh(x0),      lambda x0, y, gy: gy * np.cosh(x0),      np.sinh, h=lambda x0, y: y)
unary("cosh",    lambda x0: np.cosh(x0),      lambda x0, y, gy: gy * np.sinh(x0),      np.cosh, h=lambda x0, y: y)
unary("arctan",  lambda x0: np.arctan(x0),    lambda x0, y, gy: gy / (1.0 + x0 * x0),  np.arctan, h=lambda x0, y: -2.0 * x0 / ((1.0 + x0 * x0) * (1.0 + x0 * x0)))
unary("sigmoid", _sigmoid,                    lambda x0, y, gy: gy * y * (1.0 - y),    _ref_sigmoid, (-4.0, 4.0), h=lambda x0, y: y * (1.0 - y) * (1.0 - 2.0 * y))
unary("relu",    lambda x0: np.maximum(x0, 0.0),
                                              lambda x0, y, gy: gy if x0 > 0.0 else 0.0, _ref_relu, kinks=KINK_AT_ZERO, cheap=True)
unary("softplus", _softplus,                  lambda x0, y, gy: gy * sigmoid_scalar(x0), _ref_softplus, (-4.0, 4.0),
      h=lambda x0, y: sigmoid_scalar(x0) * (1.0 - sigmoid_scalar(x0)))
unary("erf",     lambda x0: math.erf(x0),     lambda x0, y, gy: gy * TWO_OVER_SQRT_PI * np.exp(-x0 * x0), _ref_erf,
      h=lambda x0, y: -2.0 * x0 * TWO_OVER_SQRT_PI * np.exp(-x0 * x0))
unary("erfc",    lambda x0: math.erfc(x0),    lambda x0, y, gy: -gy * TWO_OVER_SQRT_PI * np.exp(-x0 * x0), _ref_erfc,
      h=lambda x0, y: 2.0 * x0 * TWO_OVER_SQRT_PI * np.exp(-x0 * x0))
unary("arcsin",  lambda x0: np.arcsin(x0),    lambda x0, y, gy: gy / np.sqrt(1.0 - x0 * x0), np.arcsin, (-0.9, 0.9),
      h=lambda x0, y: x0 / ((1.0 - x0 * x0) * np.sqrt(1.0 - x0 * x0)))
unary("arccos",  lambda x0: np.arccos(x0),    lambda x0, y, gy: -gy / np.sqrt(1.0 - x0 * x0), np.arccos, (-0.9, 0.9),
      h=lambda x0, y: -x0 / ((1.0 - x0 * x0) * np.sqrt(1.0 - x0 * x0)))
unary("arcsinh", lambda x0: np.arcsinh(x0),   lambda x0, y, gy: gy / np.sqrt(x0 * x0 + 1.0), np.arcsinh,
      h=lambda x0, y: -x0 / ((x0 * x0 + 1.0) * np.sqrt(x0 * x0 + 1.0)))
unary("arccosh", lambda x0: np.arccosh(x0),   lambda x0, y, gy: gy / np.sqrt(x0 * x0 - 1.0), np.arccosh, (1.2, 3.0),
      h=lambda x0, y: -x0 / ((x0 * x0 - 1.0) * np.sqrt(x0 * x0 - 1.0)))
unary("arctanh", lambda x0: np.arctanh(x0),   lambda x0, y, gy: gy / (1.0 - x0 * x0),  np.arctanh, (-0.9, 0.9),
      h=lambda x0, y: 2.0 * x0 / ((1.0 - x0 * x0) * (1.0 - x0 * x0)))
unary("log2",    lambda x0: np.log2(x0),      lambda x0, y, gy: gy / (x0 * LN2),       np.log2, (0.1, 3.0), h=lambda x0, y: -1.0 / (x0 * x0 * LN2))
unary("log10",   lambda x0: np.log10(x0),     lambda x0, y, gy: gy / (x0 * LN10),      np.log10, (0.1, 3.0), h=lambda x0, y: -1.0 / (x0 * x0 * LN10))
unary("exp2",    lambda x0: np.exp2(x0),      lambda x0, y, gy: gy * y * LN2,          np.exp2, h=lambda x0, y: y * LN2 * LN2)
unary("cbrt",    lambda x0: np.cbrt(x0),      lambda x0, y, gy: gy / (3.0 * y * y),    np.cbrt, (0.2, 3.0), h=lambda x0, y: -2.0 / (9.0 * y ** 5))
unary("reciprocal", lambda x0: 1.0 / x0,      lambda x0, y, gy: -gy * y * y,           np.reciprocal, (0.5, 2.0), h=lambda x0, y: 2.0 * y * y * y,
      exact_ref=True, vectorises=True)
unary("lgamma",  lambda x0: math.lgamma(x0),  lambda x0, y, gy: gy * digamma_scalar(x0), _ref_lgamma, (0.3, 5.0),
      h=lambda x0, y: trigamma_scalar(x0))
unary("digamma", _digamma,                    lambda x0, y, gy: gy * trigamma_scalar(x0), _ref_digamma, (0.3, 5.0),
      h=lambda x0, y: tetragamma_scalar(x0), tol=(1e-8, 1e-8))
unary("erfinv",  _erfinv,                     lambda x0, y, gy: gy / (TWO_OVER_SQRT_PI * np.exp(-y * y)), _ref_erfinv, (-0.9, 0.9),
      h=lambda x0, y: 2.0 * y / ((TWO_OVER_SQRT_PI * np.exp(-y * y)) * (TWO_OVER_SQRT_PI * np.exp(-y * y))), tol=(1e-10, 1e-12))
# Piecewise constant: a zero gradient (not none: the result still requires grad, as in NumPy
# and PyTorch); sampled away from their jumps.
unary("sign",    lambda x0: np.sign(x0),      lambda x0, y, gy: 0.0,                   np.sign, kinks=KINK_AT_ZERO, vectorises=True)
unary("floor",   lambda x0: np.floor(x0),     lambda x0, y, gy: 0.0,                   np.floor, (0.1, 0.9))
unary("ceil",    lambda x0: np.ceil(x0),      lambda x0, y, gy: 0.0,                   np.ceil, (0.1, 0.9))
unary("round",   lambda x0: np.rint(x0),      lambda x0, y, gy: 0.0,                   np.round, (0.1, 0.4))
unary("trunc",   lambda x0: np.trunc(x0),     lambda x0, y, gy: 0.0,                   np.trunc, (0.1, 0.9))
# The value, recomputed at every replay, with no gradient (``detach`` inside a recording).
unary("stop_gradient", lambda x0: x0,         None,                                    _ref_identity, cheap=True)

# name       forward                        reverse input 0 (x0, x1, y, gy)       reverse input 1                      reference
binary("add",     lambda x0, x1: x0 + x1,   lambda x0, x1, y, gy: gy,             lambda x0, x1, y, gy: gy,            np.add,
       operators=("__add__",), reflected=("__radd__",), exact_ref=True, cheap=True)
binary("sub",     lambda x0, x1: x0 - x1,   lambda x0, x1, y, gy: gy,             lambda x0, x1, y, gy: -gy,           np.subtract,
       operators=("__sub__",), reflected=("__rsub__",), exact_ref=True, cheap=True)
binary("mul",     lambda x0, x1: x0 * x1,   lambda x0, x1, y, gy: gy * x1,        lambda x0, x1, y, gy: gy * x0,       np.multiply,
       operators=("__mul__",), reflected=("__rmul__",), h=(None, lambda x0, x1, y: 1.0, None), exact_ref=True, cheap=True)
# true division: integers divide to float64
binary("div",     lambda x0, x1: x0 / x1,   lambda x0, x1, y, gy: gy / x1,        lambda x0, x1, y, gy: -gy * y / x1,  np.divide, (0.5, 2.0),
       operators=("__truediv__",), reflected=("__rtruediv__",), dtype="float", exact_ref=True,
       h=(None, lambda x0, x1, y: -1.0 / (x1 * x1), lambda x0, x1, y: 2.0 * y / (x1 * x1)), cheap=True)
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
       method=True, kinks=KINK_AT_TIES, exact_ref=True, cheap=True)
binary("minimum", lambda x0, x1: np.minimum(x0, x1),
       lambda x0, x1, y, gy: gy if x0 < x1 else (0.5 * gy if x0 == x1 else 0.0),
       lambda x0, x1, y, gy: gy if x1 < x0 else (0.5 * gy if x0 == x1 else 0.0),                            np.minimum,
       method=True, kinks=KINK_AT_TIES, exact_ref=True, cheap=True)
binary("arctan2", lambda x0, x1: np.arctan2(x0, x1),
       lambda x0, x1, y, gy: gy * x1 / (x0 * x0 + x1 * x1),
       lambda x0, x1, y, gy: -gy * x0 / (x0 * x0 + x1 * x1),                                               np.arctan2, (0.5, 2.0),
       h=(lambda x0, x1, y: -2.0 * x0 * x1 / ((x0 * x0 + x1 * x1) * (x0 * x0 + x1 * x1)),
          lambda x0, x1, y: (x0 * x0 - x1 * x1) / ((x0 * x0 + x1 * x1) * (x0 * x0 + x1 * x1)),
          lambda x0, x1, y: 2.0 * x0 * x1 / ((x0 * x0 + x1 * x1) * (x0 * x0 + x1 * x1))))
binary("hypot",   lambda x0, x1: np.hypot(x0, x1),
       lambda x0, x1, y, gy: gy * x0 / y,
       lambda x0, x1, y, gy: gy * x1 / y,                                                                   np.hypot, (0.5, 2.0),
       h=(lambda x0, x1, y: x1 * x1 / (y * y * y), lambda x0, x1, y: -x0 * x1 / (y * y * y),
          lambda x0, x1, y: x0 * x0 / (y * y * y)))
binary("logaddexp", lambda x0, x1: np.logaddexp(x0, x1),
       lambda x0, x1, y, gy: gy * np.exp(x0 - y),
       lambda x0, x1, y, gy: gy * np.exp(x1 - y),                                                           np.logaddexp,
       h=(lambda x0, x1, y: np.exp(x0 - y) * np.exp(x1 - y), lambda x0, x1, y: -np.exp(x0 - y) * np.exp(x1 - y),
          lambda x0, x1, y: np.exp(x0 - y) * np.exp(x1 - y)))
binary("logaddexp2", lambda x0, x1: np.logaddexp2(x0, x1),
       lambda x0, x1, y, gy: gy * np.exp2(x0 - y),
       lambda x0, x1, y, gy: gy * np.exp2(x1 - y),                                                          np.logaddexp2,
       h=(lambda x0, x1, y: LN2 * np.exp2(x0 - y) * np.exp2(x1 - y), lambda x0, x1, y: -LN2 * np.exp2(x0 - y) * np.exp2(x1 - y),
          lambda x0, x1, y: LN2 * np.exp2(x0 - y) * np.exp2(x1 - y)))
# xlogy(x, y) = x * log(y), and 0 where x == 0 (whatever y): the log-likelihood term
binary("xlogy",   lambda x0, x1: 0.0 if x0 == 0.0 else x0 * np.log(x1),
       lambda x0, x1, y, gy: gy * np.log(x1),
       lambda x0, x1, y, gy: 0.0 if x0 == 0.0 else gy * x0 / x1,                                            _ref_xlogy, (0.5, 2.0),
       h=(None, lambda x0, x1, y: 1.0 / x1, lambda x0, x1, y: -x0 / (x1 * x1)))
# fmod (C's, the sign of x0) and remainder (Python's %, the sign of x1): the gradient is
# 1 for x0 and -trunc(x0 / x1) / -floor(x0 / x1) for x1, sampled away from the jumps
binary("fmod",    lambda x0, x1: np.fmod(x0, x1),
       lambda x0, x1, y, gy: gy,
       lambda x0, x1, y, gy: -gy * np.trunc(x0 / x1),                                                       np.fmod,
       domains=((2.1, 2.8), (1.0, 1.04)))
binary("remainder", _mod,
       lambda x0, x1, y, gy: gy,
       lambda x0, x1, y, gy: -gy * floordiv_scalar(x0, x1),                                                 np.remainder,
       domains=((2.1, 2.8), (1.0, 1.04)), operators=("__mod__",), reflected=("__rmod__",))
binary("floor_divide", _floordiv,
       lambda x0, x1, y, gy: 0.0,
       lambda x0, x1, y, gy: 0.0,                                                                           np.floor_divide,
       domains=((2.1, 2.8), (1.0, 1.04)), operators=("__floordiv__",), reflected=("__rfloordiv__",))
# Comparisons give 1.0 / 0.0 (typed bool by their dtype rule) and carry no gradient.
binary("less",          lambda x0, x1: 1.0 if x0 < x1 else 0.0,  None, None, _cmp_ref(np.less),          operators=("__lt__",), dtype="bool", exact_ref=True, cheap=True)
binary("less_equal",    lambda x0, x1: 1.0 if x0 <= x1 else 0.0, None, None, _cmp_ref(np.less_equal),    operators=("__le__",), dtype="bool", exact_ref=True, cheap=True)
binary("greater",       lambda x0, x1: 1.0 if x0 > x1 else 0.0,  None, None, _cmp_ref(np.greater),       operators=("__gt__",), dtype="bool", exact_ref=True, cheap=True)
binary("greater_equal", lambda x0, x1: 1.0 if x0 >= x1 else 0.0, None, None, _cmp_ref(np.greater_equal), operators=("__ge__",), dtype="bool", exact_ref=True, cheap=True)
binary("equal",         lambda x0, x1: 1.0 if x0 == x1 else 0.0, None, None, _cmp_ref(np.equal),         operators=("__eq__",), dtype="bool", exact_ref=True, cheap=True)
binary("not_equal",     lambda x0, x1: 1.0 if x0 != x1 else 0.0, None, None, _cmp_ref(np.not_equal),     operators=("__ne__",), dtype="bool", exact_ref=True, cheap=True)

# where(cond, a, b): the condition is data, not differentiable; the result has the branches'
# dtype.
ternary("where", lambda x0, x1, x2: x1 if x0 != 0.0 else x2,
        None,
        lambda x0, x1, x2, y, gy: gy if x0 != 0.0 else 0.0,
        lambda x0, x1, x2, y, gy: 0.0 if x0 != 0.0 else gy,
        _ref_where, dtype=("like", (1, 2)), masks=(0,), exact_ref=True, cheap=True)
# clip(x, lo, hi) = minimum(maximum(x, lo), hi); each element's adjoint goes to the one input
# whose value was selected (x on the closed interval [lo, hi]). The result has x's dtype.
ternary("clip", lambda x0, x1, x2: np.minimum(np.maximum(x0, x1), x2),
        lambda x0, x1, x2, y, gy: gy if (x0 >= x1 and x0 <= x2) else 0.0,
        lambda x0, x1, x2, y, gy: gy if (x0 < x1 and x1 <= x2) else 0.0,
        lambda x0, x1, x2, y, gy: gy if np.maximum(x0, x1) > x2 else 0.0,
        np.clip, domains=((-2.0, 2.0), (-1.0, -0.5), (0.5, 1.0)),
        dtype=("like", (0,)), method=True, kinks=((1, -1, 0), (1, 0, -1)), exact_ref=True, cheap=True)
# fmt: on

# The records other modules name (they import these, never spell the op names).
STOP_GRADIENT = registry.BY_NAME["stop_gradient"]  # Tensor.detach inside a recording
SQUARE = registry.BY_NAME["square"]  # x ** 2
POW = registry.BY_NAME["pow"]
CLIP = registry.BY_NAME["clip"]  # tape.clip, whose bounds may be None
COMPARISONS = tuple(op.name for op in registry.OPS if op.dtype == "bool")
