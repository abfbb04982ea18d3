"""Batched replay on the CPU: one tape, many independent argument sets, in parallel.

``gradient_batch(t, *args)`` takes each argument with a leading batch axis and returns the
per-instance values of the (scalar) output and the per-instance gradients, batch axis first.
Instances run in parallel over Numba's ``prange``; each worker chunk has its own copy of the
value and adjoint arenas, so no two threads ever write the same memory (DESIGN.md section 3:
parallelise only over independent instances).

The compiled driver, :func:`tape.interpreter.generated.sweeps.gradient_batch_kernel`, lives with the
sweeps it calls in the generated module, so Numba's cache of it can never go stale.

The GPU version, one thread per instance, is :func:`tape.cuda.gradient_batch`.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads

from tape.interpreter import dispatch as _dispatch
from tape.interpreter.generated import sweeps
from tape.layout.columns import B_OFF, B_SIZE
from tape.program.callbacks import refuse
from tape.program.core import register_extension
from tape.program.replay import GuardError

__all__ = ["gradient_batch", "BatchPlan"]


class BatchPlan:
    """Everything about a tape that batched replay needs, computed once per tape (host side,
    shared by the CPU and the GPU versions).

    Attributes
    ----------
    in_offs, in_sizes : int64 arrays
        Arena offset and size of each input buffer.
    out_offs, out_sizes : int64 arrays
        The same for each output buffer.
    g_offs, g_sizes : int64 arrays
        The same for each differentiated input (adjoint arena).
    emask, need : bool arrays
        Entries and buffers the outputs depend on (:func:`tape.interpreter.generated.sweeps.reach`).
    roots : int64 array
        The output buffers.
    seed : float array
        The output adjoint (one: the output is a scalar).
    """

    def __init__(self, t):
        if not t.inputs and not t.outputs:
            raise RuntimeError(
                "batched replay needs a tape made by tape.record() (a recorded signature)"
            )
        n_out = sum(int(t.bufs[b, B_SIZE]) for b in t.outputs)
        if len(t.outputs) != 1 or n_out != 1:
            shapes = [t.shapes[b] for b in t.outputs]
            raise RuntimeError(
                f"gradient_batch needs a single scalar output, this tape returns shapes {shapes}"
            )
        _dispatch.prepare_tape(t)
        self.tape = t
        bufs = t.bufs
        self.in_offs = np.array([bufs[b, B_OFF] for b in t.inputs], np.int64)
        self.in_sizes = np.array([bufs[b, B_SIZE] for b in t.inputs], np.int64)
        self.out_offs = np.array([bufs[b, B_OFF] for b in t.outputs], np.int64)
        self.out_sizes = np.array([bufs[b, B_SIZE] for b in t.outputs], np.int64)
        wb = [t.inputs[k] for k in t.wrt]
        self.g_offs = np.array([bufs[b, B_OFF] for b in wb], np.int64)
        self.g_sizes = np.array([bufs[b, B_SIZE] for b in wb], np.int64)
        self.roots = np.asarray(t.outputs, np.int64)
        self.emask, self.need = sweeps.reach(t.entries, t.bufs, t.n_entries, self.roots)
        self.seed = np.ones(n_out, t.dtype)

    def pack_args(self, args):
        """Validate ``args`` (each with a leading batch axis) and concatenate each instance's
        inputs into one row of a ``(batch, n_inputs)`` array of the tape's dtype."""
        t = self.tape
        batch, arrs = t.signature.check_batch(args)
        packed = np.empty((batch, int(self.in_sizes.sum())), t.dtype)
        s = 0
        for a, m in zip(arrs, self.in_sizes):
            packed[:, s : s + m] = a.reshape(batch, int(m))
            s += m
        return packed, arrs

    def unpack(self, vals, grads):
        """Per-instance values ``(batch,)`` and gradients (one ``(batch, *shape)`` array per
        differentiated input; a single array when there is one) from the packed rows."""
        t = self.tape
        batch = vals.shape[0]
        out_dt = t.output_dtypes[0] if t.output_dtypes else t.dtype
        values = vals[:, 0].astype(out_dt)
        out = []
        s = 0
        for k, m in zip(t.wrt, self.g_sizes):
            g = grads[:, s : s + m].reshape((batch,) + t.shapes[t.inputs[k]])
            out.append(g.astype(t.input_dtypes[k], copy=False))
            s += m
        return values, (out[0] if len(out) == 1 else tuple(out))

    def redo_failed(self, failed, arrs, vals, grads):
        """Replay the instances a batched sweep stopped on, one by one, through
        :meth:`tape.Tape.value_and_grad`: a failed guard then follows the tape's ``on_change``
        policy (retrace, raise or warn) instead of returning the recorded path's numbers, and a
        bad gather index raises naming the instance. Fills their rows of ``vals``/``grads``."""
        t = self.tape
        for b in failed:
            inst = [a[b] for a in arrs]
            try:
                v, g = t.value_and_grad(*inst)
            except (IndexError, np.linalg.LinAlgError) as e:
                raise type(e)(f"instance {b}: {e}") from None
            except GuardError as e:
                raise GuardError(f"instance {b}: {e}", e.entry, e.source) from None
            vals[b] = np.ravel(v)
            gs = [g] if len(t.wrt) == 1 else list(g)
            s = 0
            for x in gs:
                grads[b, s : s + x.size] = np.ravel(x)
                s += x.size


def _plan(t, gpu=False):
    """The tape's :class:`BatchPlan` (cached). The CPU's batched sweep cannot run callbacks;
    the GPU's runs custom ops with CUDA functions (``gpu=True``: it checks them itself)."""
    if not gpu:
        refuse(t, "batched replay (gradient_batch)")
    key = (t.n_entries, t.n_bufs, t.n_data, tuple(t.inputs), tuple(t.outputs), tuple(t.wrt))
    st = t.extensions()
    plan = st.get("batch")
    if plan is None or plan[0] != key:
        plan = st["batch"] = (key, BatchPlan(t))
    return plan[1]


def gradient_batch(t, *args, n_threads=None):
    """Per-instance value and gradient of a recorded tape with a scalar output.

    Parameters
    ----------
    t : tape.Tape
        Made by :func:`tape.record`; its output must be a scalar.
    *args : array_like
        One array per recorded argument, each with a leading batch axis of the same length:
        instance ``b`` replays ``t`` on ``(args[0][b], args[1][b], ...)``.
    n_threads : int, optional
        Number of parallel chunks (default: Numba's thread count).

    Returns
    -------
    values : ndarray, shape (batch,)
        The output of each instance.
    grads : ndarray or tuple of ndarray
        For each differentiated argument, an array ``(batch, *shape)`` of its gradient (a
        single array when the tape differentiates one argument, as :meth:`Tape.gradient`).

    Notes
    -----
    The tape itself is not modified: every chunk of instances replays on private copies of
    the arenas, so ``t.grads`` and ``t.forward`` results are left as they were.
    """
    if getattr(t, "callbacks", None):
        return _python_instances(t, args)
    plan = _plan(t)
    packed, arrs = plan.pack_args(args)
    batch = packed.shape[0]
    vals = np.empty((batch, int(plan.out_sizes.sum())), t.dtype)
    grads = np.zeros((batch, int(plan.g_sizes.sum())), t.dtype)
    status = np.empty(batch, np.int64)
    if batch:
        chunks = max(1, min(batch, (n_threads or get_num_threads()) * 4))
        sw, pool = t.run_with
        sw.gradient_batch_kernel(
            t.entries, t.bufs, pool, t.data[: t.n_data], t.n_entries, t.n_bufs,
            plan.emask, plan.need, plan.roots, plan.seed, plan.in_offs, plan.in_sizes, packed,
            plan.out_offs, plan.out_sizes, vals, plan.g_offs, plan.g_sizes, grads, status, chunks, True,
        )  # fmt: skip
    failed = np.nonzero(status >= 0)[0]
    if failed.size:
        plan.redo_failed(failed, arrs, vals, grads)
    return plan.unpack(vals, grads)


def _python_instances(t, args):
    """``gradient_batch`` of a tape that calls Python (``tape.autograd.Function``,
    ``tape.custom_op``): instance by instance through :meth:`tape.Tape.value_and_grad`."""
    arrs = [np.asarray(a) for a in args]
    if len(arrs) != len(t.inputs) or not arrs:
        raise TypeError(
            f"gradient_batch: the tape takes {len(t.inputs)} arguments, got {len(arrs)}"
        )
    n = arrs[0].shape[0] if arrs[0].ndim else -1
    if n < 0 or any(a.ndim == 0 or a.shape[0] != n for a in arrs):
        raise ValueError(
            "gradient_batch: every argument needs the same leading batch axis; got shapes "
            f"{[a.shape for a in arrs]}"
        )
    vals, grads = [], []
    for b in range(n):
        try:
            v, g = t.value_and_grad(*[a[b] for a in arrs])
        except (IndexError, np.linalg.LinAlgError) as e:
            raise type(e)(f"instance {b}: {e}") from None
        vals.append(np.asarray(v))
        grads.append(g if isinstance(g, tuple) else (g,))
    k = len(t.wrt)
    gs = tuple(np.stack([g[j] for g in grads]) if n else np.zeros((0,)) for j in range(k))
    return np.stack(vals) if n else np.zeros(0), (gs[0] if k == 1 else gs)


register_extension("gradient_batch", gradient_batch)
