"""Glue between the compiled tier's generated code and a custom op's user functions
(:func:`tape.custom_op`): the generated loops call the user's ``fwd`` and ``vjp`` and adapt
what they return (an array or a number; one cotangent or a tuple) with these.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload


def as_tuple(x):
    """``x`` if it is a tuple, else ``(x,)`` (compiled code only)."""


@overload(as_tuple)
def _as_tuple_impl(x):
    if isinstance(x, types.BaseTuple):
        return lambda x: x
    return lambda x: (x,)


@njit
def store(dst, y):
    """Write the user's output (an array or a number) into the flat buffer ``dst``."""
    a = np.asarray(y)
    if a.size != dst.shape[0]:
        raise ValueError("custom op: fwd returned an output of another size than recorded")
    if a.ndim == 0:
        dst[0] = a.item()
    else:
        flat = a.ravel()
        for j in range(dst.shape[0]):  # (Numba's slice assignment compiles in 2-3 s)
            dst[j] = flat[j]


@njit
def add(dst, g):
    """Add one cotangent (an array or a number) into the flat adjoint ``dst``."""
    a = np.asarray(g)
    if a.size != dst.shape[0]:
        raise ValueError("custom op: vjp returned a cotangent of another size than its input")
    if a.ndim == 0:
        dst[0] += a.item()
    else:
        dst += a.ravel()


def check(gs, n):
    """Fails to compile unless the vjp returned ``n`` cotangents."""


@overload(check)
def _check_impl(gs, n):
    def impl(gs, n):
        if len(gs) != n:
            raise ValueError("custom op: vjp returned another number of cotangents than inputs")

    return impl
