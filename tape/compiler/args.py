"""The arguments of a compiled tape's one-call gradient (``gradient_args``, which
:meth:`tape.Tape.gradient` calls from Python), in compiled code.

The call is compiled for arguments of the recorded dtypes and numbers of axes in any layout
(:func:`tape.layout.calls.gradient_signature`), so Python checks only an argument's dtype and
its number of axes before the call: the compiled code checks its shape and returns
:data:`ARGS_DIFFER` before anything runs where one differs (Python then takes the checked
path, which says what differs), and copies it in from any layout, with a contiguous loop
where it is contiguous. A strided argument thus compiles nothing new.
``benchmarks/RESULTS.md`` (twenty-first session) has what the checks cost from Python.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from tape.layout.views import span

ARGS_DIFFER = -2
"""Status of a one-call gradient whose arguments are not of the recorded shapes: nothing ran."""


@intrinsic
def as_c(typingctx, arr):
    """``arr`` (an array of any layout) typed as C-contiguous, holding no reference (as
    :func:`tape.layout.views.borrow`), for code that has checked that it is C-contiguous: a
    loop over an array of layout ``A`` does not vectorise, one over this view does."""
    if not isinstance(arr, types.Array):
        return None
    rty = arr.copy(layout="C")

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        out = context.make_array(sig.return_type)(context, builder)
        for name in ("data", "shape", "strides", "itemsize", "nitems", "parent"):
            setattr(out, name, getattr(a, name))
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        return out._getvalue()

    return rty(arr), codegen


@intrinsic
def flat(typingctx, arr):
    """A C-contiguous array of any dimension as a 1-D view of its ``size`` elements, holding no
    reference (as :func:`tape.layout.views.borrow`), for code that has checked that it is
    C-contiguous (Numba's ``ravel`` goes through its reshape helper: about 40 ns a call)."""
    if not isinstance(arr, types.Array):
        return None
    rty = types.Array(arr.dtype, 1, "C")

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        out = context.make_array(sig.return_type)(context, builder)
        context.populate_array(
            out, data=a.data, shape=cgutils.pack_array(builder, [a.nitems]),
            strides=cgutils.pack_array(builder, [a.itemsize]), itemsize=a.itemsize,
            meminfo=None, parent=a.parent,
        )  # fmt: skip
        return out._getvalue()

    return rty(arr), codegen


def load(data, o, x):
    """Copy argument ``x`` (any shape and layout) into ``data[o : o + x.size]``, C order."""


@overload(load)
def _load_impl(data, o, x):
    if x.ndim == 0:

        def zero(data, o, x):
            data[o] = x[()]

        return zero

    if x.ndim == 1:

        def one(data, o, x):
            n = x.shape[0]
            d = span(data, o, n)  # a view first: data[o + j] would not vectorise
            if n < 2 or x.strides[0] == x.itemsize:
                c = as_c(x)
                for j in range(n):
                    d[j] = c[j]
            else:
                for j in range(n):
                    d[j] = x[j]

        return one

    def many(data, o, x):
        d = span(data, o, x.size)
        if x.flags.c_contiguous:
            c = flat(x)
            for j in range(c.shape[0]):
                d[j] = c[j]
        else:
            j = 0
            for idx in np.ndindex(x.shape):
                d[j] = x[idx]
                j += 1

    return many


@njit(inline="always")
def shape_is(x, pool, at):
    """Whether ``x``'s shape is the one listed at ``pool[at : at + x.ndim]``."""
    for i in range(x.ndim):
        if x.shape[i] != pool[at + i]:
            return False
    return True
