"""Every Numba option tape uses, in one place.

``error_model="numpy"`` gives IEEE results (``1/0 -> inf``, the same as CUDA) and lets Numba
vectorise divisions; ``fastmath`` stays off because it lets ``np.isnan`` miss NaNs.
Globals are frozen into Numba's cache, so nothing here may change at run time: pass flags as
arguments instead.

Between compiled functions, a constant argument is typed as its value (``Literal[int](0)``,
``Literal[bool](True)``), and Numba compiles the callee once more for it. Where a function
that is not inlined is also called with a variable there, pass ``np.int64(0)`` or
``np.bool_(True)``: one compile serves both calls (the sweeps' ``0`` start, the broadcast
offsets' input number, the compiled runtime's ``zero_leaves``).
"""

SWEEP_JIT = dict(cache=True, nogil=True, error_model="numpy")
"""Options of the cached sweeps and drivers (``tape/interpreter/generated/sweeps.py``)."""

UNCACHED_JIT = dict(nogil=True, error_model="numpy")
"""Options of the functions that are compiled into their callers and not cached on their own:
the scalar rules, the shared loops and helpers the op kernels call (the callers' cache holds
them; a cache of their own would be stale the moment a rule changed)."""

HELPER_JIT = dict(UNCACHED_JIT, no_cpython_wrapper=True, no_cfunc_wrapper=True)
"""Options of those of them that only compiled code calls and that are not inlined (the
loops and helpers of the op kernels, the broadcast helpers of the generated kernels, the
compiled tier's outlined rules; :func:`tape.layout.calls.compiled_only` applies them): no
wrapper for calls from Python or C. Each such function compiles on its own, and its
wrappers were about a tenth of the compile of the ADBench GMM objective's kernels."""

KERNEL_JIT = dict(SWEEP_JIT, no_cpython_wrapper=True, no_cfunc_wrapper=True)
"""Options of the op kernels (the generated ``_fwd_<op>``, ``_rev_<op>`` and the others;
:func:`tape.layout.calls.op_kernel` applies them): cached, and without the wrappers for calls
from Python and C, as :data:`HELPER_JIT`. The sweeps call them at their addresses, Python
through :class:`tape.interpreter.dispatch.Kernel`."""

COMPILED_JIT = dict(cache=True, nogil=True, error_model="numpy")
"""Options of a compiled tape's module (:mod:`tape.compiled`): those of the sweeps. No
``fastmath``: reassociation would let a fused loop compute something other than what was
recorded (``(x + c) - c`` is not ``x``)."""

UNIT_JIT = dict(COMPILED_JIT, no_cpython_wrapper=True, no_cfunc_wrapper=True)
"""Options of a compiled tape's inner functions (its units, redos and unit loops), which only
compiled code calls: no wrapper for calls from Python or C, whose making costs a sixth of a
small unit's compile."""
