"""The vectorisable exp, log and tanh (tape.ops.vmath) against NumPy's, in units in the last place,
over the whole float64 range and at the special values; and that a loop over them vectorises."""

import math
import re
from fractions import Fraction

import numpy as np
import pytest
from numba import njit

from tape.ops import vmath as vm


@njit(error_model="numpy")
def _exp_loop(x, y):
    for i in range(x.shape[0]):
        y[i] = vm.exp(x[i])


@njit(error_model="numpy")
def _log_loop(x, y):
    for i in range(x.shape[0]):
        y[i] = vm.log(x[i])


@njit(error_model="numpy")
def _tanh_loop(x, y):
    for i in range(x.shape[0]):
        y[i] = vm.tanh(x[i])


LOOPS = {"exp": (_exp_loop, np.exp), "log": (_log_loop, np.log), "tanh": (_tanh_loop, np.tanh)}

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-310, 2.2250738585072014e-308,
           1.0, -1.0, 2.0, 0.5, math.sqrt(2.0), np.nextafter(math.sqrt(2.0), 3.0),
           1.7976931348623157e308, -1.7976931348623157e308]  # fmt: skip


def _points(name, rng):
    n = 200_000
    if name == "exp":
        parts = [rng.uniform(-750.0, 712.0, n), rng.uniform(-1.0, 1.0, n),
                 rng.uniform(-1e-9, 1e-9, n // 10),
                 [709.782712893384, 709.7827128933841, -745.1332191019411, -745.1332191019412,
                  -708.4, -720.0, -744.0, 0.34657359027997264, -0.34657359027997264]]  # fmt: skip
    elif name == "log":
        parts = [np.exp(rng.uniform(-745.0, 709.0, n)), rng.uniform(0.5, 2.0, n),
                 1.0 + rng.uniform(-1e-7, 1e-7, n // 10), -rng.uniform(0.0, 10.0, 100),
                 rng.uniform(0.0, 1e-308, 1000)]  # fmt: skip
    else:
        parts = [rng.uniform(-25.0, 25.0, n), rng.uniform(-0.6, 0.6, n),
                 rng.uniform(-1e-9, 1e-9, n // 10),
                 [vm.TANH_SMALL, -vm.TANH_SMALL, np.nextafter(vm.TANH_SMALL, 0.0), 400.0, -800.0]]  # fmt: skip
    return np.concatenate([np.asarray(p, np.float64) for p in parts] + [np.array(SPECIAL)])


def _ulps(got, ref):
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    # a NaN, an infinity or a sign on one side only is an infinite error
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - ref) / np.maximum(np.spacing(np.abs(ref)), 5e-324)
    return np.where(same, 0.0, np.where(np.isfinite(err), err, np.inf))


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_within_two_ulps_of_numpy(name):
    loop, ref = LOOPS[name]
    x = _points(name, np.random.default_rng(7))
    y = np.empty_like(x)
    loop(x, y)
    with np.errstate(all="ignore"):
        r = ref(x)
    e = _ulps(y, r)
    worst = int(np.argmax(e))
    assert e[worst] <= 2.0, f"{name}({x[worst]!r}) = {y[worst]!r}, NumPy {r[worst]!r}"
    # zeros keep their sign, NaN stays NaN, and the limits are exact
    assert np.array_equal(np.signbit(y[r == 0]), np.signbit(r[r == 0]))
    assert np.array_equal(np.isnan(y), np.isnan(r))


def test_special_values():
    e = lambda v: vm.exp(v)  # noqa: E731
    assert e(0.0) == 1.0 and e(-np.inf) == 0.0 and e(np.inf) == np.inf and np.isnan(e(np.nan))
    assert e(710.0) == np.inf and e(-746.0) == 0.0 and e(-745.0) > 0.0
    assert vm.log(1.0) == 0.0 and vm.log(0.0) == -np.inf and vm.log(-0.0) == -np.inf
    assert vm.log(np.inf) == np.inf and np.isnan(vm.log(-1.0)) and np.isnan(vm.log(-np.inf))
    assert vm.log(5e-324) == pytest.approx(math.log(5e-324), rel=1e-15)
    assert vm.tanh(np.inf) == 1.0 and vm.tanh(-np.inf) == -1.0 and np.isnan(vm.tanh(np.nan))
    assert math.copysign(1.0, vm.tanh(-0.0)) == -1.0
    # integer and float32 arguments are taken as float64
    assert vm.exp(np.float32(1.0)) == vm.exp(1.0) and vm.log(2) == vm.log(2.0)


def test_coefficients_are_the_series():
    # tanh x = x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 ...
    series = vm._tanh_series(10)
    assert series[:5] == [1, Fraction(-1, 3), Fraction(2, 15), Fraction(-17, 315),
                          Fraction(62, 2835)]  # fmt: skip
    # tanh's rational function is a Pade approximant: N / D (degrees 3 and 4) agrees with
    # (tanh x / x - 1) / z, z = x^2, in its first 3 + 4 terms
    num, den = vm._tanh_rational(7)
    q = []  # N / D as a power series: N = D q
    for k in range(7):
        nk = num[k] if k < len(num) else 0
        q.append((nk - sum(den[i] * q[k - i] for i in range(1, min(k, len(den) - 1) + 1))) / den[0])
    assert q == series[1:8]
    assert den[0] == 1 and vm.TN == tuple(float(c) for c in num)
    assert vm.LN2_HI + vm.LN2_LO == math.log(2.0)
    assert vm.E[:4] == (1.0, 1.0, 0.5, 1 / 6)
    assert vm.L[:3] == (2.0, 2 / 3, 2 / 5)


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_loop_vectorises(name):
    """The point of the module: LLVM turns a loop over them into vector code (no call left)."""
    loop, _ = LOOPS[name]
    x = np.linspace(0.5, 1.5, 16)
    loop(x, np.empty_like(x))
    ir = "\n".join(loop.inspect_llvm().values())
    assert re.search(r"<\d+ x double>", ir), "no vector instructions"
    # the functions compile on their own (no Numba-IR inlining): LLVM must inline them
    assert not re.search(r"call [^\n]*@_ZN[^\s(]*tape3ops5vmath", ir), "a call to vmath is left"
