"""Record once, replay many: :func:`record` traces a function into a :class:`~tape.core.Tape`."""

from __future__ import annotations

import inspect

import numpy as np

from tape.frontend.tensor import Tensor, _buffer_in, _check_dtype, _state, float32, float64, no_grad
from tape.interpreter.dispatch import speculate_driver
from tape.layout.columns import CONST, LEAF
from tape.program.core import Tape

ON_CHANGE = ("retrace", "raise", "warn")


def record(
    fn,
    *example_args,
    wrt=None,
    dtype=None,
    device=None,
    on_change="retrace",
    compile="auto",
    _lift=None,
) -> Tape:
    """Trace ``fn(*example_args)`` once into a replayable :class:`~tape.core.Tape`.

    Parameters
    ----------
    fn : callable
        Takes tensors, returns a tensor or a tuple/list of tensors, using tape operations.
        Python control flow is frozen at the path taken for ``example_args``.
    *example_args : array_like
        Example values; replays must pass arguments of the same shapes.
    wrt : int or sequence of int, optional
        Positions of the arguments to differentiate with respect to. Default: every
        floating-point argument.
    dtype : float64 or float32, optional
        Arena dtype; default float32 if every floating argument is float32, else float64.
    device : str, optional
        ``"cuda"`` returns the tape moved to the GPU (:meth:`Tape.to`); default CPU. With
        ``compile=True`` the GPU replays with code generated for the tape (the GPU's compiled
        tier, :meth:`tape.gpu.CudaTape.compile`) and the CPU tape is not compiled.
    on_change : {"retrace", "raise", "warn"}
        What a replay does when a guard fails, that is when a value that left the tape during
        recording (a Python ``if`` or ``while`` on a tensor, ``float(x)``, ``int(x)``,
        ``x.item()``, ``np.asarray(x)``, ``x.numpy()``, ``x.tolist()``) differs at the new
        arguments, so ``fn`` would take another path:

        - ``"retrace"`` (default): trace ``fn`` again at the new arguments and replay that;
          up to ``t.max_variants`` (8) traced variants are kept, most recently used first, so
          code alternating between paths does not retrace every call. ``t.retraces`` counts.
        - ``"raise"``: raise :class:`tape.GuardError` naming the guard, the op, the recorded
          and the new value and the ``file:line`` that made it.
        - ``"warn"``: warn once per guard (:class:`tape.GuardWarning`) and continue on the
          recorded path.
    compile : {"auto", True, False}
        The compiled tier (:meth:`Tape.compile`, :mod:`tape.compiled`): code generated for
        this tape's structure, with fused loops. ``True`` compiles now; ``"auto"`` (default)
        compiles at the ``tape.compiled.AUTO_AFTER``-th (100th) replay, or, once its
        replays on the interpreter have taken ``tape.compiled.AUTO_SECONDS`` (0.5 s) in all
        from the third on, in a background thread while the replays go on on the
        interpreter (``t.compiling`` is that thread; ``t.compile()`` waits for it). So a
        tape replayed in a loop gets it, an expensive one soon, and a tape replayed a few
        times pays no compile. Where the compile is estimated (``t.compile_cost``: the
        fused loops and runtime entry Numba's cache lacks) to cost more than the replays so
        far, promotion waits until they have taken that long. ``False`` keeps the
        interpreter. Tapes too long for the tier stay on the interpreter. Retraced variants
        follow the same rule.

    Returns
    -------
    Tape
        ``t.forward(*args)``, ``t.backward(seed)``, ``t.grads``, ``t.gradient(*args)``,
        ``t.value_and_grad(*args)``, ``t.zero_grad()``.

    Notes
    -----
    Values the function closes over (arrays, tensors, model parameters) are captured as
    constants at record time. Integer arguments (for example gather indices) are replayed as
    data and checked for range at every replay. Every entry keeps the ``file:line`` of the code
    that recorded it (``print(t)``, error and anomaly messages).

    Examples
    --------
    >>> import numpy as np, tape as tp
    >>> t = tp.record(lambda x: (x * x).sum(), np.zeros(3))
    >>> t.gradient(np.array([1.0, 2.0, 3.0]))
    array([2., 4., 6.])
    >>> value, g = t.value_and_grad(np.ones(3))
    >>> float(value)
    3.0
    """
    if on_change not in ON_CHANGE and on_change != "_variant":
        raise ValueError(f"record: on_change must be one of {ON_CHANGE}, got {on_change!r}")
    if compile not in ("auto", True, False):
        raise ValueError(f"record: compile must be 'auto', True or False, got {compile!r}")
    vals = []
    for k, a in enumerate(example_args):
        v = a.numpy() if isinstance(a, Tensor) else np.asarray(a)
        try:
            dt = _check_dtype(v.dtype)
        except TypeError as e:
            raise TypeError(f"record: argument {k}: {e}") from None
        vals.append(v.astype(dt, copy=False))
    if wrt is None:
        wrt = [k for k, v in enumerate(vals) if v.dtype.kind == "f"]
    elif isinstance(wrt, (int, np.integer)):
        wrt = [int(wrt)]
    wrt = sorted(int(k) for k in wrt)
    for k in wrt:
        if not 0 <= k < len(vals):
            raise ValueError(
                f"record: wrt={k} is not an argument position (the function gets {len(vals)})"
            )
        if vals[k].dtype.kind != "f":
            raise TypeError(
                f"record: argument {k} has dtype {vals[k].dtype}; only floating arguments can be differentiated"
            )
    if dtype is None:
        floats = [v.dtype for v in vals if v.dtype.kind == "f"]
        dtype = float32 if floats and all(d == float32 for d in floats) else float64
    t = Tape(dtype)
    t.recording = True
    t.speculate = compile is not True  # a compiled tape runs few of the ops' reverse kernels
    if t.speculate:  # from an empty cache, a helper compiles the gradient driver meanwhile
        speculate_driver(dtype)
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    tracers = []
    for k, v in enumerate(vals):
        kind = LEAF if k in wrt else CONST
        b = t.new_buffer(v.shape, kind, v)
        tracers.append(Tensor._traced(t, b, v.shape, v.dtype, kind == LEAF, None))
        t.inputs.append(b)
        t.input_names.append(
            names[k] if k < len(names) and not names[k].startswith("*") else f"arg{k}"
        )
        t.input_dtypes.append(v.dtype)
    t.wrt = wrt
    if compile is True:  # a cold cache starts the compile of the runtime for these arguments
        from tape.compiler.compiled import runtime_job, start_runtime_compile

        t.cold_jobs = (runtime_job(t),)
        start_runtime_compile(t)
    if _lift is not None:  # a tape.checkpoint sub-tape: tensors read from outside are inputs
        _lift.begin(t)
    outer = _state.recordings
    _state.recordings = outer + (t,)
    try:
        out = fn(*tracers)
    finally:
        t.recording = False
        _state.recordings = outer
    single = not isinstance(out, (tuple, list))
    outs = [out] if single else list(out)
    for o in outs:
        if not isinstance(o, (Tensor, int, float, np.ndarray)):
            raise TypeError(f"record: the function must return tensors, got {type(o).__name__}")
    with no_grad():
        # outputs not computed on this tape (constants, values of other graphs) are copied in
        t.outputs = [
            o._buf if isinstance(o, Tensor) and o._resolve()[0] is t else _buffer_in(t, o, False)
            for o in outs
        ]
    if t._written:
        from tape.frontend.tensor import stale

        stale(t, t.outputs)
    t.single_output = single
    t.output_dtypes = [o.dtype if isinstance(o, Tensor) else np.asarray(o).dtype for o in outs]
    t.leaves, t.leaf_bufs, t.leaf_vers = (
        [],
        {},
        {},
    )  # the captured constants' values are in the arena
    t.on_change = on_change
    in_dtypes = list(t.input_dtypes)

    def retrace(*args):
        args = [np.asarray(a).astype(d, copy=False) for a, d in zip(args, in_dtypes)]
        return record(fn, *args, wrt=wrt, dtype=t.dtype, on_change="_variant", compile=compile)

    t.retracer = retrace
    on_gpu = device not in (None, "cpu")
    if compile is True and not on_gpu:
        t.compile()
    elif compile == "auto":
        from tape.compiler.params import AUTO_AFTER, AUTO_MIN, AUTO_SECONDS

        t.compile_after, t.compile_after_seconds = AUTO_AFTER, AUTO_SECONDS
        t.compile_min_replays = AUTO_MIN
    return t.to(device, compile=compile is True) if on_gpu else t
