"""Gradient checkpointing: :func:`checkpoint` stores a function's inputs and outputs only and
recomputes what is inside it during the reverse sweep.

How it runs. ``checkpoint(fn, *args)`` records ``fn(*args)`` on a tape of its own (the
*sub-tape*) and puts one callback group (:mod:`tape.program.callbacks`, the mechanism of
:class:`tape.autograd.Function`) on the tape being built (a recording, or the eager graph).
That group keeps only the arguments and the outputs. The forward sweep replays the sub-tape
to write the outputs; the reverse sweep replays it again, then runs its reverse sweep with the
outputs' adjoints as seeds and adds the sub-tape's gradients to the arguments' adjoints. So
the intermediates of ``fn`` exist once, in the sub-tape's workspace, whatever the number of
calls.

Sub-tapes are shared. Calls whose sub-tapes have the same structure (entries, shapes,
attributes, guards, captured constants) reuse one sub-tape: a time loop of
``T`` steps holds ``T`` steps' carries and one step's intermediates. Pass what changes per
step (the step's data, the carried state) as arguments; values the function closes over are
captured as constants, so a closure over ``x[t]`` makes every step a structure of its own
(right numbers, no memory saved).

Tensors the function closes over. Inside :func:`tape.record`, tensors of the recording that
``fn`` reads without receiving them as arguments (model parameters, slices of the recorded
arguments) become extra inputs of the sub-tape, and receive their gradients. In eager mode the
same holds for tensors that require grad and for results of the eager graph.

The sub-tape is replayed like any recorded tape: it gets the compiled tier after
``tape.compiled.AUTO_AFTER`` replays and runs on every thread with its own workspace. A guard
of ``fn`` that fails at replay is a failed guard of the enclosing tape, whose ``on_change``
policy applies (the default traces the whole recorded function again). The tape holding the checkpoints runs on the interpreter (in segments around the
groups), as tapes with other Python callbacks do. Forward mode (``jvp``, forward Jacobians)
runs the sub-tape's tangent sweep, and ``vjp`` and reverse Jacobians its reverse sweep; second
derivatives, sparsity patterns, GPU replay and saving refuse it with a clear error.
"""

from __future__ import annotations

import functools
import hashlib
from typing import NamedTuple

import numpy as np
from numba import njit

from tape.frontend import tensor
from tape.layout.columns import B_ALIAS, B_KIND, B_OFF, B_SIZE, CONST, E_OUT, LEAF
from tape.layout.config import SWEEP_JIT
from tape.program import callbacks


class _Lift:
    """While a sub-tape records: which outside tensors become its extra inputs.

    ``parent``: the recording the checkpoint is called in (``None``: eager mode). ``found``:
    the lifted tensors, in input order (after the arguments)."""

    __slots__ = ("parent", "found")

    def __init__(self, parent):
        self.parent = parent
        self.found = []

    def wants(self, x):
        """Whether tensor ``x`` (not of the sub-tape) is an input rather than a constant."""
        tp = x._resolve()[0] if x._tape is not None else None
        if self.parent is None:
            return x._rg or tp is not None
        return tp is not None and tensor.nested_in(self.parent, tp)

    def begin(self, t):
        """Recording of sub-tape ``t`` starts."""
        t.lift = self

    def add(self, t, x, value):
        """Make ``x`` an input of ``t`` (differentiated if it is floating); its buffer."""
        b = t.new_buffer(x.shape, LEAF if x.dtype.kind == "f" else CONST, value)
        t.leaf_bufs[id(x)] = b
        t.leaf_vers[id(x)] = x._ver[0] if x._ver is not None else 0
        t.leaves.append((x, b))
        t.inputs.append(b)
        t.input_names.append(f"closure{len(self.found)}")
        t.input_dtypes.append(x.dtype)
        if x.dtype.kind == "f":
            t.wrt.append(len(t.inputs) - 1)
        self.found.append(x)
        return b


@njit(**SWEEP_JIT)
def _gather(dst, di, src, si):
    """``dst[di] = src[si]`` (flat positions; the arenas may differ in dtype)."""
    for k in range(di.shape[0]):
        dst[di[k]] = src[si[k]]


@njit(**SWEEP_JIT)
def _scatter_add(dst, di, src, si):
    """``dst[di] += src[si]``, repeated positions accumulating."""
    for k in range(di.shape[0]):
        dst[di[k]] += src[si[k]]


class _Positions(NamedTuple):
    """Flat arena positions of one checkpointed call: the arguments in the enclosing tape and
    in the sub-tape, the outputs in both, the differentiated arguments' adjoints in both (those
    not constant around), and every differentiated argument's tangent around."""

    key: tuple
    args: np.ndarray
    sub_args: np.ndarray
    sub_outs: np.ndarray
    outs: np.ndarray
    grads: np.ndarray
    sub_grads: np.ndarray
    tangents: np.ndarray


class _Call:
    """One checkpointed application on the enclosing tape (the interface of
    :class:`tape.autograd.Call`). Its output buffer holds every output of ``fn``, flat
    (the outputs are views of it), so the group has ``ceil(inputs / 3)`` entries."""

    __slots__ = ("sub", "ins", "outs", "out_shapes", "out_dtypes", "ctx", "label", "_plan")
    compiled_ok = False  # the compiled tier would need the sub-tape's sweeps as globals
    escalates = True  # a guard failing in the sub-tape is a guard failure of the tape around

    def plan(self, tp):
        """Flat arena positions (:class:`_Positions`), made once per buffer layout (an eager
        graph merged into another moves them)."""
        p = self._plan
        if p is not None and p.key == (id(tp), self.ins[0], self.outs[0]):
            return p
        sub = self.sub

        def flat(t, bs):
            idx = [np.arange(t.bufs[b, B_OFF], t.bufs[b, B_OFF] + t.bufs[b, B_SIZE]) for b in bs]
            return np.concatenate(idx) if idx else np.zeros(0, np.int64)

        wrt = [k for k in sub.wrt if tp.bufs[self.ins[k], B_KIND] != CONST]
        p = self._plan = _Positions(
            key=(id(tp), self.ins[0], self.outs[0]),
            args=flat(tp, self.ins), sub_args=flat(sub, sub.inputs),
            sub_outs=flat(sub, sub.outputs), outs=flat(tp, self.outs),
            grads=flat(tp, [self.ins[k] for k in wrt]),
            sub_grads=flat(sub, [sub.inputs[k] for k in wrt]),
            tangents=flat(tp, [self.ins[k] for k in sub.wrt]),
        )  # fmt: skip
        return p

    def _args(self, tp, data):
        """The arguments as arrays of the sub-tape's input dtypes (views where they match)."""
        return [
            tp.view(data, b).astype(d, copy=False) for b, d in zip(self.ins, self.sub.input_dtypes)
        ]

    def _policy(self, tp):
        # "warn" continues on the recorded path inside the sub-tape too; otherwise the sub-tape
        # raises GuardError, which the sweeps around it turn into a failed guard of the
        # enclosing tape, so its own policy (retrace the whole function, or raise) applies
        self.sub.on_change = "warn" if tp.on_change == "warn" else "raise"

    def _sub_run(self, tp, data, p):
        """Load the arguments into this thread's workspace of the sub-tape; its sweeps and
        pool, counting the replay toward the compiled tier's promotion."""
        sub = self.sub
        r = sub.replay_state()
        sub.count_replay()
        ws = sub.thread_workspace()
        ws.ok = False
        _gather(ws.data, p.sub_args, data, p.args)
        return r, ws

    def _slow(self, tp, data):
        """The sub-tape's sweep stopped (a guard or an op's check): replay it through
        :meth:`Tape.forward`, which raises the right error or follows the policy."""
        self._policy(tp)
        self.sub.forward(*self._args(tp, data))
        return self.sub.last_replay()

    def forward(self, tp, data, tls):
        """Replay the sub-tape on the arguments in ``data``; write the outputs there."""
        p = self.plan(tp)
        sub = self.sub
        _, ws = self._sub_run(tp, data, p)
        sw, pool = sub.prepared_sweeps()
        status = sw.forward_sweep(sub.entries, sub.bufs, pool, ws.data, 0, sub.n_entries)
        if status >= 0:
            _, ws = self._slow(tp, data)
        ws.ok = True
        _gather(data, p.outs, ws.data, p.sub_outs)

    def tangent(self, tp, data, tensor):
        """Forward mode: the sub-tape's tangent sweep on the arguments' tangents (rows of
        ``T``, one per direction); the outputs' tangents written there."""
        from tape.transforms.derivatives import _forward, _jac_fwd_rows

        p = self.plan(tp)
        self._policy(tp)
        plan, sub_data = _forward(self.sub, self._args(tp, data))
        tensor[:, p.outs] = _jac_fwd_rows(plan, sub_data, tensor[:, p.tangents])

    def backward(self, tp, data, grad, need, ctx):
        """Recompute the sub-tape and pull the outputs' adjoints back through it (one
        forward-and-reverse call of its sweeps); add the result to the arguments' adjoints."""
        o = self.outs[0]
        if not need[o] or tp.bufs[o, B_KIND] == CONST:
            return
        p = self.plan(tp)
        sub = self.sub
        r, ws = self._sub_run(tp, data, p)
        seeds = np.ascontiguousarray(grad[p.outs], sub.dtype)
        sw, pool = sub.prepared_sweeps()
        status = sw.forward_backward(
            sub.entries, sub.bufs, pool, ws.data, ws.grad,
            sub.n_entries, sub.n_bufs, r["roots"], seeds, True,
        )  # fmt: skip
        if status >= 0:
            raise RuntimeError(
                f"{self.label}: the recomputation in the reverse sweep stopped at entry "
                f"{status} of the checkpointed function, which the forward sweep passed"
            )
        _scatter_add(grad, p.grads, ws.grad, p.sub_grads)


def _structure_key(sub):
    """A digest of ``sub``'s structure, guards and captured constants (``None``: never
    shared). Two sub-tapes with the same digest compute the same function of their inputs
    wherever their guards hold; where one fails, the enclosing tape retraces."""
    if sub.callbacks:
        return None  # callback ids differ per recording: nested groups are not compared
    n, nb, ni = sub.n_entries, sub.n_bufs, sub.n_ipool
    bufs = sub.bufs[:nb]
    made = np.zeros(nb, np.bool_)
    made[sub.entries[:n, E_OUT]] = True
    made[np.asarray(sub.inputs, np.int64)] = True
    const = (bufs[:, B_KIND] == CONST) & ~made & (bufs[:, B_ALIAS] < 0)
    h = hashlib.blake2b(digest_size=32)
    for a in (sub.entries[:n], bufs, sub.ipool[:ni]):
        h.update(np.ascontiguousarray(a).tobytes())
    for off, size in bufs[const][:, [B_OFF, B_SIZE]]:
        h.update(sub.data[off : off + size].tobytes())
    meta = (str(sub.dtype), tuple(sub.inputs), tuple(sub.outputs), tuple(sub.wrt),
            tuple(str(d) for d in sub.input_dtypes), tuple(str(d) for d in sub.output_dtypes))  # fmt: skip
    h.update(repr(meta).encode())
    return h.digest()


def _record_sub(fn, args, parent, dtype):
    """Record ``fn(*args)`` on a sub-tape, lifting outside tensors (see :class:`_Lift`);
    returns the sub-tape and the lifted tensors."""
    from tape.frontend.record import record

    vals = [a._peek() if isinstance(a, tensor.Tensor) else np.asarray(a) for a in args]
    wrt = [k for k, v in enumerate(vals) if v.dtype.kind == "f"]
    lift = _Lift(parent)
    sub = record(fn, *vals, wrt=wrt, dtype=dtype, on_change="raise", _lift=lift)
    sub.retracer = None  # the enclosing tape retraces (see _Call._policy)
    return sub, list(lift.found)


def checkpoint(fn, *args, use_reentrant=None, **kwargs):
    """``fn(*args, **kwargs)``, storing only its inputs and outputs: what ``fn`` computes
    inside is recomputed during the reverse sweep (PyTorch's
    ``torch.utils.checkpoint.checkpoint``, JAX's ``jax.checkpoint``).

    Inside :func:`tape.record` a long time loop then replays in memory bounded by one step's
    intermediates plus the carried state of every step::

        def loss(w, xs):
            h = tp.zeros(16)
            for t in range(len(xs)):
                h = tp.checkpoint(cell, h, xs[t])   # cell reads w from the closure
            return (h ** 2).sum()

        t = tp.record(loss, w0, xs0)

    In eager mode it works as PyTorch's: ``backward()`` recomputes ``fn``.

    Parameters
    ----------
    fn : callable
        Takes tensors (and other values), returns a tensor or a tuple/list of tensors, using
        tape operations. Its Python control flow is frozen per recording, as in
        :func:`tape.record`. Tensors it closes over get their gradients (see :mod:`tape.checkpoint`).
    *args
        Tensors, arrays or numbers: what changes from call to call.
    use_reentrant : ignored
        Accepted for PyTorch compatibility; there is one implementation.
    **kwargs
        Passed to ``fn`` (captured as constants).

    Returns
    -------
    Tensor or tuple of Tensor
        ``fn``'s outputs.

    Notes
    -----
    Calls with the same function and the same recorded structure share one sub-tape, so the
    memory of ``fn``'s intermediates is paid once. The cost is a second forward pass of ``fn``
    in the reverse sweep and a Python call per application and sweep (see
    ``benchmarks/checkpoint_lstm.py`` for memory and time on the LSTM benchmark).
    """
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable, got {type(fn).__name__}")
    if kwargs:
        fn = functools.partial(fn, **kwargs)
    parent = tensor.current_recording()
    grad_on = tensor.is_grad_enabled()
    if parent is None and not grad_on:
        return fn(*args)
    for k, a in enumerate(args):
        if not isinstance(a, (tensor.Tensor, np.ndarray, int, float, np.number, bool)):
            raise TypeError(
                f"checkpoint: argument {k} is a {type(a).__name__}; arguments are tensors, "
                "arrays or numbers (close over other values, or pass them as keywords)"
            )
    ts = [a for a in args if isinstance(a, tensor.Tensor)]
    rec, eager = tensor.tapes_of(ts)
    if parent is not None and rec is not None and rec is not parent:
        parent = rec if tensor.nested_in(rec, parent) else parent
    dtype = parent.dtype if parent is not None else None
    sub, lifted = _record_sub(fn, args, parent, dtype)
    values = _values(sub)  # this call's outputs (before a shared sub-tape replaces sub)
    inputs = list(args) + lifted
    target = parent
    if target is None:
        eager_ts = [x for x in inputs if isinstance(x, tensor.Tensor)]
        rec, eager = tensor.tapes_of(eager_ts)
        if not eager and not any(x._rg for x in eager_ts):
            outs = [tensor.Tensor(v) for v in values]  # nothing to differentiate: no graph
            return outs[0] if sub.single_output else tuple(outs)
        target = tensor._union(eager, eager_ts)
    if sub.dtype.itemsize > target.dtype.itemsize:
        target.promote(sub.dtype)
    cache = target.__dict__.setdefault("_checkpoints", {})
    key = _structure_key(sub)
    if key is not None:
        sub = cache.setdefault(key, sub)
    call = _Call()
    call.sub = sub
    call.label = f"checkpoint({getattr(fn, '__name__', type(fn).__name__)})"
    call.ctx = None
    call._plan = None
    call.ins = [tensor._buffer_in(target, x, grad_on) for x in inputs]
    active = grad_on and any(target.bufs[b, B_KIND] != CONST for b in call.ins)
    flat = np.concatenate([v.ravel() for v in values]).astype(target.dtype)
    (b,) = callbacks.add_group(target, call, [flat], [active])
    outs, off = [], 0
    for v, dt in zip(values, sub.output_dtypes):
        ob = target.alias(b, v.shape, off)
        off += v.size
        diff = active and np.dtype(dt).kind == "f"  # integer outputs get no gradient
        if diff or target.recording:
            outs.append(
                tensor.Tensor._traced(
                    target, ob, v.shape, np.dtype(dt), diff, "checkpoint" if diff else None
                )
            )
        else:
            outs.append(tensor.Tensor(v))
    return outs[0] if sub.single_output else tuple(outs)


def _values(sub):
    """The sub-tape's outputs as recorded."""
    return [sub.value(b).astype(d, copy=True) for b, d in zip(sub.outputs, sub.output_dtypes)]
