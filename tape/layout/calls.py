"""Calling a compiled function from Python without Numba's dispatch.

A call of a Numba dispatcher from Python first works out the Numba type of every argument
and looks up the compiled version for them: for arrays that costs as much as a small
tape's whole sweep (``benchmarks/MEASURED.md``). Where the caller knows the types already
(its own arrays, made once, of one dtype and layout), :func:`entry_point` gives the
compiled version's own entry, which converts the arguments and runs, nothing more.

That entry trusts its arguments' types: an array of another dtype, number of dimensions or
layout would be read as if it had the compiled ones (wrong numbers, or memory outside the
array). Use it only for arguments whose types are fixed by construction, and check those
that come from users before each call (their dtype and number of axes where the entry is
compiled for arrays of layout ``A``, which read any layout), falling back to the dispatcher
or to a checked path otherwise. Python ints and floats are converted as the compiled
signature says.

The other way round, :func:`compiled_only` compiles a function that only compiled code calls
without the entries through which Python and C would call it (they take compile time).
"""

from __future__ import annotations

import inspect

import numpy as np
from numba import njit, typeof, types
from numba.core.registry import CPUDispatcher
from numba.core.typing.typeof import Purpose
from numba.np.numpy_support import from_dtype

from tape.layout.config import HELPER_JIT, KERNEL_JIT


def entry_point(fn, args, sig=None):
    """The entry of dispatcher ``fn`` compiled for the types of ``args`` (or for the Numba
    types ``sig``: arrays of layout ``A`` take any layout) (compiled now, or loaded from
    Numba's cache, if it was not yet), callable from Python as ``fn`` is, with arguments of
    those types only (see the module's docstring). For a function with ``*args`` it is
    ``fn`` itself (Numba folds those into a tuple as it dispatches)."""
    if fn.py_func.__code__.co_flags & inspect.CO_VARARGS:
        return fn
    if sig is None:
        sig = tuple(typeof(a, Purpose.argument) for a in args)
    fn.compile(sig)
    return fn.overloads[sig].entry_point


def array_type(dtype, ndim):
    """Numba's type of an argument of ``dtype`` with ``ndim`` axes, in any layout (C for no
    axes, where there is one layout)."""
    return types.Array(from_dtype(np.dtype(dtype)), ndim, "A" if ndim else "C")


def gradient_signature(dtype, specs):
    """The types a compiled tape's ``gradient_args`` (:mod:`tape.compiler.args`) is compiled
    for: the tape's integer array, its arena of ``dtype``, and one argument per ``(shape,
    dtype)`` of ``specs`` in any layout."""
    head = [types.Array(types.int64, 1, "C"), types.Array(from_dtype(np.dtype(dtype)), 1, "C")]
    return tuple(head + [array_type(dt, len(shape)) for shape, dt in specs])


class CompiledOnly(CPUDispatcher):
    """The dispatcher of a function compiled with :data:`tape.layout.config.HELPER_JIT` or
    ``KERNEL_JIT`` (:func:`compiled_only`, :func:`op_kernel`): compiled functions call it as
    any other, but it has no entry for
    calls from Python, where Numba would jump through a missing one (a crash); a call from
    Python raises ``TypeError`` instead."""

    def __call__(self, *args, **kwargs):
        f = self.py_func
        raise TypeError(
            f"{f.__module__}.{f.__qualname__} is compiled for calls from compiled code only "
            "(a helper of tape's kernels): call it from an @njit function"
        )


def compiled_only(fn=None, **options):
    """``njit`` with :data:`tape.layout.config.HELPER_JIT` (and ``options``) for a function
    that only other compiled functions call and that is not inlined: it compiles without the
    wrappers for calls from Python and C, and a call from Python raises ``TypeError``
    (:class:`CompiledOnly`). Use as ``@compiled_only`` or ``@compiled_only(fastmath=...)``."""

    def make(f):
        return _compiled_only(f, dict(HELPER_JIT, **options))

    return make if fn is None else make(fn)


def op_kernel(fn):
    """An op's kernel, as :func:`compiled_only` with :data:`tape.layout.config.KERNEL_JIT`
    (cached): the generated op modules' decorator."""
    return _compiled_only(fn, KERNEL_JIT)


def _compiled_only(f, options):
    d = njit(**options)(f)
    d.__class__ = CompiledOnly
    return d
