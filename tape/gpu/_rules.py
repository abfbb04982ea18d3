"""The elementwise rules on the GPU: the very functions of ``tape/ops/elementwise.py``,
recompiled as CUDA device functions.

A rule is an njit'd Python function (``lambda x0, y, gy: gy * np.cos(x0)``). Its
``.py_func`` is rebuilt with the same code object and a copy of its module's globals in which
``np`` is :data:`npgpu`, a module of device functions with NumPy's names and semantics
(numba-cuda implements only some NumPy ufuncs on scalars: ``np.exp`` and ``np.sqrt`` are
missing), and every njit'd helper it calls (``sigmoid_scalar``) is translated the same way.
So adding an elementwise op touches only its line in ``tape/ops/elementwise.py``; a rule that
uses a NumPy function missing here fails the simulator and PTX tests with
"Unknown attribute '<name>' of type Module(npgpu)": add it to :data:`_MATH` or below.

Under the simulator the transcendental functions are NumPy's own (Python's ``math`` raises
on overflow and domain errors where the GPU returns inf or NaN).
"""

from __future__ import annotations

import math
import types

import numpy as np
from numba import cuda
from numba.core.dispatcher import Dispatcher

from tape.gpu._config import DEVICE_JIT, SIMULATOR
from tape.ops import vmath as _vmath

_dev = cuda.jit(**DEVICE_JIT)

# NumPy name: the CUDA implementation (Python's math, which numba-cuda maps to libdevice)
_MATH = {
    "sqrt": math.sqrt,
    "exp": math.exp,
    "exp2": None,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "log1p": math.log1p,
    "expm1": math.expm1,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "arcsin": math.asin,
    "arccos": math.acos,
    "arctan": math.atan,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "arcsinh": math.asinh,
    "arccosh": math.acosh,
    "arctanh": math.atanh,
    "arctan2": math.atan2,
    "hypot": math.hypot,
    "erf": None,
    # float in, float out (Python's math.floor & co. return ints): libdevice's own
    "floor": "floor",
    "ceil": "ceil",
    "trunc": "trunc",
    "rint": "rint",
    "cbrt": "cbrt",
    "fmod": "fmod",
}


def _abs(x):
    return abs(x)


def _sign(x):
    # NumPy: -1, 0 or 1, and NaN for NaN (x itself for zeros and NaN)
    if x > 0:
        return 1.0
    if x < 0:
        return -1.0
    return x


def _maximum(x0, x1):
    # NumPy's maximum propagates NaN from either side
    if x0 != x0 or x0 >= x1:
        return x0
    return x1


def _minimum(x0, x1):
    if x0 != x0 or x0 <= x1:
        return x0
    return x1


def _fmax(x0, x1):
    # NumPy's fmax ignores a NaN
    if x1 != x1 or x0 >= x1:
        return x0
    return x1


def _fmin(x0, x1):
    if x1 != x1 or x0 <= x1:
        return x0
    return x1


def _isnan(x):
    return x != x


def _isinf(x):
    return x == math.inf or x == -math.inf


def _isfinite(x):
    return x == x and x != math.inf and x != -math.inf


def _square(x):
    return x * x


def _negative(x):
    return -x


def _reciprocal(x):
    return 1.0 / x


def _power(x0, x1):
    return x0**x1


def _exp2(x):
    return 2.0**x


def _logaddexp(x0, x1):
    m = x0 if x0 >= x1 else x1
    if m == math.inf or m == -math.inf:
        return x0 + x1 if x0 == x1 else m
    return m + math.log1p(math.exp(-abs(x0 - x1)))


def _logaddexp2(x0, x1):
    m = x0 if x0 >= x1 else x1
    if m == math.inf or m == -math.inf:
        return x0 + x1 if x0 == x1 else m
    return m + math.log1p(2.0 ** (-abs(x0 - x1))) / math.log(2.0)


def _where(c, x0, x1):
    return x0 if c else x1


_PYTHON = {
    "abs": _abs,
    "absolute": _abs,
    "fabs": _abs,
    "sign": _sign,
    "maximum": _maximum,
    "minimum": _minimum,
    "fmax": _fmax,
    "fmin": _fmin,
    "isnan": _isnan,
    "isinf": _isinf,
    "isfinite": _isfinite,
    "square": _square,
    "negative": _negative,
    "reciprocal": _reciprocal,
    "power": _power,
    "exp2": _exp2,
    "logaddexp": _logaddexp,
    "logaddexp2": _logaddexp2,
    "where": _where,
}


def _build_npgpu():
    mod = types.ModuleType("npgpu", "NumPy's scalar functions as CUDA device functions.")
    for name, f in _MATH.items():
        if f is None:
            continue
        if SIMULATOR:
            # NumPy's scalar functions give inf / NaN where Python's math raises
            setattr(mod, name, getattr(np, name))
        elif isinstance(f, str):
            from numba.cuda import libdevice

            setattr(mod, name, getattr(libdevice, f))
        else:
            setattr(mod, name, f)
    for name, f in _PYTHON.items():
        setattr(mod, name, _dev(f))
    for name in ("inf", "nan", "pi", "e", "float64", "float32"):
        setattr(mod, name, getattr(np, name))
    return mod


npgpu = _build_npgpu()
"""Stands in for ``numpy`` in the translated rules."""

_done: dict = {}


def _names(code):
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _translate_value(v):
    if v is np or v is _vmath:  # the CPU's vectorisable exp, log, tanh: libdevice's on the GPU
        return npgpu
    if isinstance(v, Dispatcher):
        return device_rule(v)
    return v


def device_rule(fn):
    """The CUDA device function computing what the rule ``fn`` (an njit dispatcher or a Python
    function) computes on the CPU. Memoised: each rule is translated once."""
    py = getattr(fn, "py_func", fn)
    hit = _done.get(py)
    if hit is not None:
        return hit
    g = dict(py.__globals__)
    for name in _names(py.__code__):
        if name in g:
            g[name] = _translate_value(g[name])
    closure = py.__closure__
    if closure is not None:
        closure = tuple(types.CellType(_translate_value(c.cell_contents)) for c in closure)
    new = types.FunctionType(py.__code__, g, py.__name__, py.__defaults__, closure)
    new.__qualname__ = py.__qualname__
    new.__module__ = py.__module__
    dev = _dev(new)
    _done[py] = dev
    return dev


@_dev
def no_rule3(x0, y, gy):
    return 0.0


@_dev
def no_rule4(x0, x1, y, gy):
    return 0.0


@_dev
def no_rule5(x0, x1, x2, y, gy):
    return 0.0
