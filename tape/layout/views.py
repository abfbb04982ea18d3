"""Views of the arena, the pool and the tables that hold no reference.

A Numba slice or reshape of an array takes a reference to the array's memory (an atomic
increment, and a decrement when the view goes out of scope): a compiled sweep makes views
per call, per entry or per block (a profile of the compiled tier's Rosenbrock n = 10
gradient in an ``@njit`` loop had 29% of its samples in those two operations). These views
are made without them (``benchmarks/RESULTS.md``, ninth session: the interpreter's n = 10
gradient 1.07 -> 0.95 us, the compiled tier's n = 1,000 1.5 -> 1.45 us). They are for use
inside a call while the array they view, an argument of the call, is alive: never returned
to Python or stored.

:func:`borrow` is the same for a whole argument. Functions that call kernels through the
address tables (the sweeps, the compiled runtime's unit loops, eager mode's step) and the
drivers that user ``@njit`` code calls (``tape.kernels``, ``t.njit_gradient``) rebind their
arrays with it first: an argument tuple, an inlined function's copy of its arguments or a
field read from ``ka`` takes a reference, and where a path can raise before it is dropped,
Numba's pruning keeps the atomic pair (``benchmarks/RESULTS.md``, fourteenth session).
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _view(context, builder, sig, args, shape, strides):
    """The view of ``args[0]`` (of type ``sig.args[0]``) from element ``args[1]`` on, of
    type ``sig.return_type``: ``shape`` and ``strides`` are functions of the element size
    that give them. It holds no reference: no atomic reference count is taken or dropped
    when it is made and goes out of scope."""
    a = context.make_array(sig.args[0])(context, builder, args[0])
    dims = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], sig.args[1:])]
    item = context.get_constant(types.intp, context.get_abi_sizeof(a.data.type.pointee))
    out = context.make_array(sig.return_type)(context, builder)
    context.populate_array(
        out, data=builder.gep(a.data, [dims[0]], inbounds=True),
        shape=cgutils.pack_array(builder, shape(dims)),
        strides=cgutils.pack_array(builder, strides(builder, dims, item)), itemsize=item,
        meminfo=None, parent=a.parent,
    )  # fmt: skip
    return out._getvalue()


@intrinsic
def span(typingctx, arr, start, n):
    """``arr[start : start + n]`` of a C-contiguous 1-D array, for ``0 <= start`` and
    ``start + n <= arr.shape[0]``, which the caller guarantees (nothing is checked or
    clamped). Numba lowers a slice through its general indexing code; this view costs a
    fraction of that compile time and runs as fast (the generated code makes one per buffer
    it reads: 60 slices took 1.95 s to compile, 60 spans 1.0 s).

    The view holds no reference of its own (Numba's views take one: an atomic increment and
    decrement per view and call): it is for use inside a call while ``arr``, an argument,
    is alive, never to be returned or stored."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"):
        return None
    if not (isinstance(start, types.Integer) and isinstance(n, types.Integer)):
        return None
    sig = arr(arr, start, n)

    def codegen(context, builder, sig, args):  # shape (n,), stride one element
        return _view(context, builder, sig, args, lambda d: [d[1]], lambda b, d, item: [item])

    return sig, codegen


@intrinsic
def table(typingctx, arr, start, rows, cols):
    """``arr[start : start + rows * cols].reshape(rows, cols)`` of a C-contiguous 1-D array
    (the caller guarantees the range), a view holding no reference, as :func:`span`."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"):
        return None
    if not all(isinstance(v, types.Integer) for v in (start, rows, cols)):
        return None
    rty = arr.copy(ndim=2)
    sig = rty(arr, start, rows, cols)

    def codegen(context, builder, sig, args):  # shape (rows, cols), C order
        return _view(context, builder, sig, args, lambda d: [d[1], d[2]],
                     lambda b, d, item: [b.mul(d[2], item), item])  # fmt: skip

    return sig, codegen


@intrinsic
def borrow(typingctx, arr):
    """``arr`` itself, holding no reference if it is an array (any layout and dimension);
    any other value is returned as it is. An ``inline='always'`` function called in a
    user's loop takes copies of its array arguments, each with an atomic increment on entry
    and a decrement where it is last used; Numba's pruning of those pairs gives up where a
    path can raise between them, so a function that checks its arguments and raises paid
    two atomic operations per array per call (``t.njit_gradient``, Rosenbrock n = 10 on a
    Xeon: 89 against 33 ns for the hand-written gradient). Rebinding each argument to its
    borrowed view first ends the copy's life at once, before any check."""

    def codegen(context, builder, sig, args):
        ty = sig.args[0]
        if not isinstance(ty, types.Array):
            context.nrt.incref(builder, ty, args[0])  # a new reference, as calls return
            return args[0]
        a = context.make_array(ty)(context, builder, args[0])
        a.meminfo = cgutils.get_null_value(a.meminfo.type)
        return a._getvalue()

    return arr(arr), codegen
