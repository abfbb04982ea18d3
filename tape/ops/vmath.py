"""``exp``, ``log`` and ``tanh`` that LLVM can vectorise, for the elementwise rules.

Numba calls the C library for ``math.exp`` and friends, one element at a time: a loop over
``tanh`` costs dozens of adds per element (``benchmarks/MEASURED.md``). (Numba vectorises them only with
Intel's SVML, which the llvmlite wheels on PyPI are not built with.) These versions are
straight-line float64 arithmetic with selects instead of branches, so a loop that calls them
compiles to vector code:

- ``exp``: ``x = k ln2 + r`` with ``|r| <= ln2 / 2`` (``ln2`` split in two so that ``k ln2`` is
  exact), ``exp(r)`` by its Taylor series to ``r**13``, and ``2**k`` built from its bits (in
  two factors, so that results in the subnormal range round once);
- ``log``: ``x = 2**e m`` with ``m`` in ``[sqrt(1/2), sqrt(2))``, then ``log(m) = 2 atanh(s)``
  with ``s = (m - 1) / (m + 1)``, ``|s| <= 0.172``, by its series to ``s**25``;
- ``tanh``: ``x + x z N(z) / D(z)`` with ``z = x**2`` below ``|x| = 0.55`` (a rational
  function of degrees 3 and 4 from Lambert's continued fraction, which needs half the
  operations of the Taylor series), ``1 - 2 / (exp(2|x|) + 1)`` above (where the subtraction
  loses at most a bit).

The polynomials run by Horner's rule, each step one fused multiply-add (``_fma``). The
coefficients are computed here, exactly (``fractions``), and rounded once. The tests hold
each function to 2 units in the last place of the C library's result over the whole float64
range, with NaN, infinities, zeros and subnormals. Arguments are converted to float64; the
rules store the result in the tape's dtype.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from tape.layout.config import UNCACHED_JIT


@intrinsic
def _as_float(typingctx, bits):
    """The float64 whose bits are the int64 ``bits``."""
    if bits != types.int64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _as_bits(typingctx, x):
    """The bits of the float64 ``x``, as an int64."""
    if x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c``, in one fused multiply-add where the CPU has one (LLVM's ``fmuladd``:
    a multiply and an add elsewhere). Numba does not fuse them by itself (no ``contract``
    flag), and a polynomial's Horner steps then wait on two roundings each: fused, ``exp``,
    ``log`` and ``tanh`` run much faster (``benchmarks/MEASURED.md``)."""
    if not all(isinstance(v, (types.Float, types.Integer)) for v in (a, b, c)):
        return None
    # float64 operands (a float32 tape's values are widened, as float64 constants widen them)

    def codegen(context, builder, sig, args):
        d = ir.DoubleType()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(d, [d, d, d]), "llvm.fmuladd.f64"
        )
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


def _ln2_split():
    """``ln 2`` as ``hi + lo``: ``hi`` with its low 32 bits of mantissa zero (so ``k * hi`` is
    exact for ``|k| < 2**21``), ``lo`` the rest, rounded."""
    with decimal.localcontext() as c:
        c.prec = 60
        ln2 = decimal.Decimal(2).ln()
        hi = math.ldexp(math.floor(math.ldexp(float(ln2), 20)), -20)
        lo = float(ln2 - decimal.Decimal(hi))
    return hi, lo


def _bernoulli(n):
    """Bernoulli numbers ``B_0 .. B_n`` (``B_1 = -1/2``), exactly."""
    b = [Fraction(0)] * (n + 1)
    a = [Fraction(0)] * (n + 1)
    for m in range(n + 1):  # Akiyama-Tanigawa
        a[m] = Fraction(1, m + 1)
        for j in range(m, 0, -1):
            a[j - 1] = j * (a[j - 1] - a[j])
        b[m] = a[0]
    b[1] = -b[1]
    return b


def _tanh_series(n_terms):
    """``c[k]`` with ``tanh x = sum c[k] x**(2k+1)``, ``k < n_terms``, exactly."""
    b = _bernoulli(2 * n_terms + 2)
    return [
        Fraction(2 ** (2 * n) * (2 ** (2 * n) - 1)) * b[2 * n] / math.factorial(2 * n)
        for n in range(1, n_terms + 1)
    ]


def _tanh_rational(levels):
    """``(N, D)``, polynomials in ``z = x**2`` (coefficients from the constant term up, exact),
    with ``tanh x = x + x z N(z) / D(z)``, ``D(0) = 1``: Lambert's continued fraction
    ``tanh x = x / (1 + z / (3 + z / (5 + ...)))`` cut after ``levels`` levels."""

    def add(a, b):
        n = max(len(a), len(b))
        return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]

    num, den = [Fraction(2 * levels + 1)], [Fraction(1)]  # the last level, as num / den
    for k in range(levels - 1, -1, -1):  # (2k + 1) + z den / num
        num, den = add([(2 * k + 1) * c for c in num], [Fraction(0)] + den), num
    # tanh x / x = den / num; minus 1: (den - num) / num, whose numerator has no constant term
    diff = add(den, [-c for c in num])
    assert diff[0] == 0
    return [c / num[0] for c in diff[1:]], [c / num[0] for c in num]


LN2_HI, LN2_LO = _ln2_split()
LOG2E = 1.4426950408889634  # 1 / ln 2, rounded
SQRT2 = math.sqrt(2.0)
_TINY = 2.2250738585072014e-308  # the smallest normal float64
_TWO54 = 2.0**54

# exp(r) = sum r**i / i!, i <= 13: the next term is below 4e-18 for |r| <= ln2 / 2
E = tuple(float(Fraction(1, math.factorial(i))) for i in range(14))
# 2 atanh(s) = 2 sum s**(2i+1) / (2i+1), i <= 12: the next term is below 1e-19 for |s| <= 0.172
L = tuple(float(Fraction(2, 2 * i + 1)) for i in range(13))
# tanh below 0.55: Lambert's fraction to 7 levels, within 1e-18 (relative) of tanh there
TN, TD = (tuple(float(c) for c in p) for p in _tanh_rational(7))
TANH_SMALL = 0.55

_jit = njit(**UNCACHED_JIT)
"""Compiled once per argument type, and inlined by LLVM into the loop that calls them, which
then vectorises (``tests/test_vmath.py`` checks the loops' machine code). Not inlined in
Numba IR: there every call site was a copy of the function's IR, typed and lowered again,
which made the kernels that call them several times (``logsumexp``'s) seconds slower to
compile. Compiled on their own, they also keep their own error model (``numpy``: no
division check) in a caller compiled with Python's."""

# Integers travel through float64 bit patterns, never through int64 <-> float64 conversions
# or 64-bit arithmetic right shifts, which AVX2 lacks (LLVM would leave the loop scalar).
_SHIFTER = 6755399441055744.0  # 1.5 * 2**52: n + _SHIFTER holds the integer n in its low bits
_SHIFTER_BITS = 0x4338000000000000
_TWO52_BITS = 0x4330000000000000  # 2**52; (2**52 bits) | n is the float 2**52 + n


@_jit
def _pow2(kf):
    """``2.0 ** kf`` for an integer-valued float ``kf`` in [-1022, 1023]."""
    return _as_float((_as_bits(kf + _SHIFTER) - _SHIFTER_BITS + 1023) << 52)


@_jit
def exp(x):
    """``e**x`` (float64), to 2 ulp; vectorisable."""
    x = float(x)
    # Below -745.2, e**x rounds to 0: those lanes compute e**0 and select 0. Letting the
    # scaling below underflow instead costs a microcode assist per element on Intel CPUs
    # (benchmarks/MEASURED.md). Above 710 the scaling gives inf.
    zero = x < -745.2
    xc = 0.0 if zero else min(x, 710.0)
    kf = math.floor(xc * LOG2E + 0.5)
    r = (xc - kf * LN2_HI) - kf * LN2_LO
    p = E[13]
    p = _fma(p, r, E[12])
    p = _fma(p, r, E[11])
    p = _fma(p, r, E[10])
    p = _fma(p, r, E[9])
    p = _fma(p, r, E[8])
    p = _fma(p, r, E[7])
    p = _fma(p, r, E[6])
    p = _fma(p, r, E[5])
    p = _fma(p, r, E[4])
    p = _fma(p, r, E[3])
    p = _fma(p, r, E[2])
    p = _fma(p, r, E[1])
    p = _fma(p, r, E[0])
    k1 = math.floor(0.5 * kf)  # 2**k = 2**k1 * 2**k2, each in the normal range
    y = p * _pow2(k1) * _pow2(kf - k1)
    y = 0.0 if zero else y
    return y if x == x else x


@_jit
def log(x):
    """Natural logarithm (float64), to 2 ulp; vectorisable. NaN below 0, ``-inf`` at 0."""
    x = float(x)
    sub = x < _TINY
    xs = x * _TWO54 if sub else x  # subnormals: scaled into the normal range first
    bits = _as_bits(xs)
    biased = _as_float(((bits >> 52) & 0x7FF) | _TWO52_BITS) - 4503599627370496.0
    m = _as_float((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)  # in [1, 2)
    big = m > SQRT2
    m = 0.5 * m if big else m
    ef = biased - (1023.0 + 54.0 if sub else 1023.0) + (1.0 if big else 0.0)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    p = L[12]
    p = _fma(p, z, L[11])
    p = _fma(p, z, L[10])
    p = _fma(p, z, L[9])
    p = _fma(p, z, L[8])
    p = _fma(p, z, L[7])
    p = _fma(p, z, L[6])
    p = _fma(p, z, L[5])
    p = _fma(p, z, L[4])
    p = _fma(p, z, L[3])
    p = _fma(p, z, L[2])
    p = _fma(p, z, L[1])
    y = ef * LN2_HI + (s * L[0] + (s * z * p + ef * LN2_LO))
    y = -math.inf if x == 0.0 else y
    y = math.nan if x < 0.0 else y
    return x if (x != x or x == math.inf) else y


@_jit
def tanh(x):
    """Hyperbolic tangent (float64), to 2 ulp; vectorisable."""
    x = float(x)
    a = abs(x)
    z = x * x
    n = TN[3]
    n = _fma(n, z, TN[2])
    n = _fma(n, z, TN[1])
    n = _fma(n, z, TN[0])
    d = TD[4]
    d = _fma(d, z, TD[3])
    d = _fma(d, z, TD[2])
    d = _fma(d, z, TD[1])
    d = _fma(d, z, TD[0])
    small = a + a * (z * n / d)  # the correction is under a tenth of a: its error shrinks
    big = 1.0 - 2.0 / (exp(2.0 * a) + 1.0)
    return math.copysign(small if a < TANH_SMALL else big, x)
