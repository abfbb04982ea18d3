"""Python callbacks in a tape: how :class:`tape.autograd.Function` runs its own ``forward``
and ``backward`` inside the compiled sweeps.

This module is the tape's side of the protocol and knows no tensors: a callback group's
record (``tape.callbacks[id]``) is any object with ``label``, ``ins``, ``outs``,
``forward(tp, data, tls)`` and ``backward(tp, data, grad, need, ctx)`` (a Function's call,
:class:`tape.autograd.Call`; a custom op's or a checkpoint's record).

A Function call with outputs ``y_0 .. y_{m-1}`` and tensor inputs ``x_0 .. x_{n-1}`` is
recorded as a group of consecutive entries with op code :data:`CALLBACK`: for each output,
``ceil(n / 3)`` entries (at least one) whose inputs are the tensor inputs three at a time and
whose output is that output, so the reachability pass (``reach``) sees every dependency. Their
attribute block is ``[call id, part]``; the id keys the call's Python record in
``tape.callbacks``. The op code is not a registry op: the compiled sweeps never run these
entries. Instead:

- eager ``backward`` (an entry-by-entry loop in Python) calls the Function's ``backward`` when
  it reaches the group;
- a replay runs the interpreter's sweeps in segments between groups
  (:class:`CallbackSweeps`, which stands in for the sweeps module in ``Tape.run_with``): the
  forward sweep stops before a group, Python runs ``forward`` on the arena's values and writes
  the outputs, and the sweep resumes after it; the reverse sweep likewise stops after a group,
  Python runs ``backward`` on the outputs' adjoints and adds the results to the inputs'
  adjoints, and the sweep resumes before it.

The same groups carry :func:`tape.custom_op` applications (whose functions the compiled tier
can call from generated code) and :func:`tape.checkpoint` calls (which replay a sub-tape; a
guard failing inside one stops the forward sweep at the group, as a guard of this tape would:
:func:`failed_guard`). Forward mode runs the tangent sweep in segments too, calling each
group's ``tangent`` (custom ops with a ``jvp``, checkpoints); ``vjp`` rows run
:meth:`CallbackSweeps.backward`. Batched replay runs instance by instance. GPU replay runs
custom ops made with CUDA device functions between its launches (:mod:`tape.gpu._custom`)
and refuses other callbacks (:func:`refuse_gpu`); second derivatives, sparsity patterns and
saving refuse tapes with callbacks with a clear error (:func:`refuse`).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from tape.interpreter.generated import sweeps
from tape.layout.columns import ACTIVE, CALLBACK, CONST, E_ATTR, E_OP
from tape.program.replay import GuardError

_ids = itertools.count(1)

REFUSED = (
    "{what}: this tape calls Python (a tape.autograd.Function, tape.custom_op or tape.checkpoint: "
    "{names}); "
    "{what} needs every entry as compiled code. Replay it with forward()/gradient()/"
    "value_and_grad()/gradient_batch(), or write the function's rules as registry ops"
)


def refuse(t, what, error=NotImplementedError):
    """Raise ``error`` with a clear message when ``what`` (a driver name) cannot run tape
    ``t``'s callbacks."""
    calls = getattr(t, "callbacks", None)
    if calls:
        names = ", ".join(sorted({c.label for c in calls.values()}))
        raise error(REFUSED.format(what=what, names=names))


def refuse_gpu(t, what):
    """Raise ``NotImplementedError`` when GPU replay (``what``) cannot run one of tape
    ``t``'s callbacks: only :func:`tape.custom_op` applications with CUDA device functions
    run there."""
    for call in (getattr(t, "callbacks", None) or {}).values():
        problem = getattr(call, "gpu_problem", None)
        if problem is None:
            raise NotImplementedError(
                f"{what}: this tape calls Python ({call.label}); GPU replay runs only "
                "registry ops and custom ops made with CUDA device functions "
                "(tape.custom_op(..., cuda_fwd=, cuda_vjp=)). Replay it on the CPU"
            )
        why = problem()
        if why is not None:
            raise NotImplementedError(f"{what}: {why}")


def python_free(t):
    """Whether every callback of ``t`` is a :func:`tape.custom_op` application, whose
    functions the compiled tier calls from generated code (no Python at replay)."""
    return all(
        getattr(c, "compiled_ok", False) for c in (getattr(t, "callbacks", None) or {}).values()
    )


def entry_name(t, i):
    """The name entry ``i`` of tape ``t`` shows: its op's, or ``<Function>.apply``."""
    code = int(t.entries[i, E_OP])
    if code == CALLBACK:
        return t.callbacks[call_id(t, i)].label
    from tape.ops import registry

    return registry.OPS[code].name


def add_group(target, call, values, diff):
    """Register ``call`` (its ``ins`` set) on tape ``target`` and record its entry group: one
    buffer per output value (``ACTIVE`` where ``diff``), each the output of ``ceil(n / 3)``
    callback entries reading the inputs three at a time. Returns the output buffers."""
    cid = next(_ids)
    if getattr(target, "callbacks", None) is None:
        target.callbacks = {}
    target.callbacks[cid] = call
    first = target.n_entries
    chunks = [call.ins[j : j + 3] for j in range(0, len(call.ins), 3)] or [[]]
    call.outs, call.out_shapes, call.out_dtypes = [], [], []
    part = 0
    for v, d in zip(values, diff):
        b = target.new_buffer(v.shape, ACTIVE if d else CONST, v)
        call.outs.append(b)
        call.out_shapes.append(tuple(v.shape))
        call.out_dtypes.append(v.dtype)
        for ch in chunks:
            target.add_entry(CALLBACK, ch, b, [cid, part])
            part += 1
    if target.recording:
        from tape.layout.source import user_line

        src = user_line()
        for i in range(first, target.n_entries):
            target.sources[i] = src
    return call.outs


def call_id(tp, i):
    """The call that callback entry ``i`` belongs to: the first int of its attribute block
    ``[id, part]``, an index into ``tp.callbacks``."""
    return int(tp.ipool[tp.entries[i, E_ATTR]])


def call_part(tp, i):
    """Which of its call's entries callback entry ``i`` is (the block's second int)."""
    return int(tp.ipool[tp.entries[i, E_ATTR] + 1])


def groups(tp):
    """The callback groups of ``tp`` in entry order: ``(start, stop, call)``."""
    n = tp.n_entries
    idx = np.flatnonzero(tp.entries[:n, E_OP] == CALLBACK)
    out = []
    last = None
    for i in idx:
        cid = call_id(tp, i)
        if last is not None and last[2] == cid and last[1] == i:
            last[1] = i + 1
            continue
        last = [int(i), int(i) + 1, cid]
        out.append(last)
    return [(s, e, tp.callbacks[c]) for s, e, c in out]


def eager_backward(tp, i, emask, need, done):
    """Eager ``backward`` reached callback entry ``i``: run the call's ``backward`` once, at
    the first entry of its group that the roots need (the last one the reverse loop visits)."""
    cid = call_id(tp, i)
    if cid in done:
        return
    call = tp.callbacks[cid]
    j = i - 1
    while j >= 0 and tp.entries[j, E_OP] == CALLBACK and call_id(tp, j) == cid:
        if emask[j]:
            return  # an earlier entry of the group will run it
        j -= 1
    done.add(cid)
    call.backward(tp, tp.data, tp.grad, need, call.ctx)


def failed_guard(tp):
    """The :class:`GuardError` of the sub-tape whose failure stopped ``tp``'s last forward
    sweep at a callback group on this thread (:func:`tape.checkpoint`), or ``None``."""
    seg = getattr(tp, "callback_sweeps", None)
    return None if seg is None else getattr(seg._tls, "failed", None)


class CallbackSweeps:
    """Stands in for the sweeps module in ``Tape.run_with`` for a tape with callbacks: the
    interpreter's sweeps, run in segments between the callback groups (same signatures)."""

    def __init__(self, tp):
        self.tp = tp
        self.groups = groups(tp)
        self._tls = threading.local()

    def _ctx(self):
        d = getattr(self._tls, "ctx", None)
        if d is None:
            d = self._tls.ctx = {}
        return d

    def forward_sweep(self, entries, bufs, ipool, data, start, stop):
        lo = start
        self._tls.failed = None
        for s, e, call in self.groups:
            if e <= start or s < start:
                continue
            if s >= stop:
                break
            status = sweeps.forward_sweep(entries, bufs, ipool, data, lo, s)
            if status >= 0:
                return status
            try:
                call.forward(self.tp, data, self._ctx())
            except GuardError as err:
                if not getattr(call, "escalates", False):
                    raise
                self._tls.failed = err  # a guard inside a checkpoint: this tape's guard failed
                return s
            lo = e
        return sweeps.forward_sweep(entries, bufs, ipool, data, lo, stop)

    def backward(self, entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, seeds,
                 zero_leaves):  # fmt: skip
        emask, need = sweeps.reach(entries, bufs, n_entries, roots)
        sweeps.zero_adjoints(bufs, grad, need, n_bufs, zero_leaves)
        sweeps.add_seeds(bufs, grad, roots, seeds)
        hi = n_entries
        ctxs = self._ctx()
        for s, e, call in reversed(self.groups):
            sweeps.reverse_sweep(entries, bufs, ipool, data, grad, emask, e, hi)
            if emask[s:e].any():
                call.backward(self.tp, data, grad, need, ctxs.get(id(call)))
            hi = s
        sweeps.reverse_sweep(entries, bufs, ipool, data, grad, emask, 0, hi)
        return need

    def forward_backward(self, entries, bufs, ipool, data, grad, n_entries, n_bufs, roots,
                         seeds, zero_leaves):  # fmt: skip
        status = self.forward_sweep(entries, bufs, ipool, data, 0, n_entries)
        if status >= 0:
            return status
        self.backward(entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, seeds,
                      zero_leaves)  # fmt: skip
        return -1
