"""Batched replay on the CPU: one tape, many independent argument sets, in parallel.

``gradient_batch(t, *args)`` takes each argument with a leading batch axis and returns the
per-instance values of the (scalar) output and the per-instance gradients, batch axis first.
Instances run in parallel over Numba's ``prange``; each worker chunk has its own copy of the
value and adjoint arenas, so no two threads ever write the same memory (DESIGN.md section 3:
parallelise only over independent instances).

The compiled driver here calls the cached sweeps of :mod:`tape._generated.sweeps`. Numba links
the callees' code into the caller and re-optimises it, so compiling the driver costs ~30 s;
it must be cached. But Numba's cache is keyed on this file alone: a regenerated sweep module
would leave a cached driver running stale rules. So this file records the fingerprint of the
sweeps it was last refreshed against (``SWEEPS_FINGERPRINT``, rewritten by
``python -m tape.batch --refresh``, which also changes this file and so invalidates Numba's
cache); the driver is cached only while that fingerprint matches the sweeps, and compiled
afresh (slow but never stale) otherwise. A test fails while the line is stale.

The GPU version, one thread per instance, is :func:`tape.cuda.gradient_batch`.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from tape._generated import sweeps as S
from tape._layout import B_OFF, B_SIZE
from tape.core import ReplayError

__all__ = ["gradient_batch", "BatchPlan"]

# the sweeps' fingerprint the cached driver was built against (`python -m tape.batch --refresh`)
SWEEPS_FINGERPRINT = "5786fe717861087adf9b1168c1b7137566ac6ac42d40700fa4bb5f4ab0ee8cdc"


def _gradient_batch(entries, bufs, ipool, data0, n_entries, n_bufs, emask, need, roots, seed,
                    in_offs, in_sizes, args, out_offs, out_sizes, vals, g_offs, g_sizes, grads,
                    status, n_chunks, i0, yes):  # fmt: skip
    """Replay ``args.shape[0]`` instances (``args[b]``: the instance's inputs, concatenated).

    Writes ``vals[b]`` (the outputs, concatenated), ``grads[b]`` (the adjoints of the
    differentiated inputs, concatenated) and ``status[b]`` (``-1``, or the entry that rejected
    the instance's data; its values and gradients are then left untouched).

    ``i0`` (0) and ``yes`` (True) are arguments, not literals, so that the sweeps are called
    with the signatures already in their cache (a literal would compile a new specialisation).
    """
    n = args.shape[0]
    for c in prange(n_chunks):
        lo = c * n // n_chunks
        hi = (c + 1) * n // n_chunks
        if lo >= hi:
            continue
        # One private arena per chunk, reused across its instances: constants stay in place,
        # every entry rewrites its output in full, and the reverse pass zeroes what it reads.
        data = data0.copy()
        grad = np.zeros_like(data0)
        for b in range(lo, hi):
            a = args[b]
            s = 0
            for k in range(in_offs.shape[0]):
                o = in_offs[k]
                m = in_sizes[k]
                data[o : o + m] = a[s : s + m]
                s += m
            st = S.forward_sweep(entries, bufs, ipool, data, i0, n_entries)
            status[b] = st
            if st >= 0:
                continue
            S.zero_adjoints(bufs, grad, need, n_bufs, yes)
            s = 0
            for r in roots:
                o = bufs[r, B_OFF]
                m = bufs[r, B_SIZE]
                g = grad[o : o + m]
                for j in range(m):
                    g[j] += seed[s + j]
                s += m
            S.reverse_sweep(entries, bufs, ipool, data, grad, emask, i0, n_entries)
            _gather(data, out_offs, out_sizes, vals[b])
            _gather(grad, g_offs, g_sizes, grads[b])


@njit(nogil=True)
def _gather(arena, offs, sizes, out):
    s = 0
    for k in range(offs.shape[0]):
        o = offs[k]
        m = sizes[k]
        out[s : s + m] = arena[o : o + m]
        s += m


def is_fresh() -> bool:
    """Whether :data:`SWEEPS_FINGERPRINT` matches the generated sweeps (the driver is then
    cached on disk)."""
    return SWEEPS_FINGERPRINT == S.FINGERPRINT


_gradient_batch = njit(parallel=True, nogil=True, error_model="numpy", cache=is_fresh())(
    _gradient_batch
)


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
        Entries and buffers the outputs depend on (:func:`tape._generated.sweeps.reach`).
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
        self.emask, self.need = S.reach(t.entries, t.bufs, t.n_entries, self.roots)
        self.seed = np.ones(n_out, t.dtype)

    def pack_args(self, args):
        """Validate ``args`` (each with a leading batch axis) and concatenate each instance's
        inputs into one row of a ``(batch, n_inputs)`` array of the tape's dtype."""
        t = self.tape
        n = len(t.inputs)
        if len(args) != n:
            names = ", ".join(t.input_names)
            raise ReplayError(
                f"this tape takes {n} argument{'s' * (n != 1)} ({names}), each with a leading "
                f"batch axis; got {len(args)}"
            )
        arrs = []
        batch = None
        for k, a in enumerate(args):
            a = t._coerce(k, a) if type(a) is not np.ndarray else a
            shape = t.shapes[t.inputs[k]]
            if a.ndim != len(shape) + 1 or a.shape[1:] != shape:
                raise ReplayError(
                    f"argument {k} ({t.input_names[k]}): expected shape (batch, "
                    f"{', '.join(map(str, shape))}{',' if len(shape) == 1 else ''}), got {a.shape}"
                )
            if batch is None:
                batch = a.shape[0]
            elif a.shape[0] != batch:
                raise ReplayError(
                    f"argument {k} ({t.input_names[k]}): batch size {a.shape[0]} differs from "
                    f"argument 0's {batch}"
                )
            if a.dtype != t.dtype and not t._castable(k, a.dtype):
                raise ReplayError(
                    f"argument {k} ({t.input_names[k]}): cannot use values of dtype {a.dtype} "
                    f"for an input recorded as {t.input_dtypes[k]}"
                )
            arrs.append(a.reshape(batch, -1))
        if batch is None:
            raise ReplayError("gradient_batch needs at least one argument (it sets the batch size)")
        packed = np.empty((batch, int(self.in_sizes.sum())), t.dtype)
        s = 0
        for a, m in zip(arrs, self.in_sizes):
            packed[:, s : s + m] = a
            s += m
        return packed

    def unpack(self, vals, grads):
        """Per-instance values ``(batch,)`` and gradients (one ``(batch, *shape)`` array per
        differentiated input; a single array when there is one) from the packed rows."""
        t = self.tape
        batch = vals.shape[0]
        values = vals[:, 0].copy()
        out = []
        s = 0
        for k, m in zip(t.wrt, self.g_sizes):
            out.append(grads[:, s : s + m].reshape((batch,) + t.shapes[t.inputs[k]]))
            s += m
        return values, (out[0] if len(out) == 1 else tuple(out))

    def failure(self, status, first_entry_of):
        """The IndexError to raise for the first failed instance, or None."""
        bad = np.nonzero(status >= 0)[0]
        if bad.size == 0:
            return None
        b = int(bad[0])
        i = int(first_entry_of(b))
        return IndexError(
            f"instance {b}: entry {i} ({self._op_name(i)}) rejected its data "
            "(an index out of bounds; indices are checked at every replay)"
        )

    def _op_name(self, i):
        from tape import registry
        from tape._layout import E_OP

        return registry.OPS[self.tape.entries[i, E_OP]].name


def _plan(t):
    key = (t.n_entries, t.n_bufs, t.n_data, tuple(t.inputs), tuple(t.outputs), tuple(t.wrt))
    plan = getattr(t, "_batch_plan", None)
    if plan is None or plan[0] != key:
        plan = (key, BatchPlan(t))
        t._batch_plan = plan
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
    plan = _plan(t)
    packed = plan.pack_args(args)
    batch = packed.shape[0]
    vals = np.empty((batch, int(plan.out_sizes.sum())), t.dtype)
    grads = np.zeros((batch, int(plan.g_sizes.sum())), t.dtype)
    status = np.empty(batch, np.int64)
    if batch:
        chunks = max(1, min(batch, (n_threads or get_num_threads()) * 4))
        _gradient_batch(
            t.entries, t.bufs, t.ipool, t.data[: t.n_data], t.n_entries, t.n_bufs,
            plan.emask, plan.need, plan.roots, plan.seed, plan.in_offs, plan.in_sizes, packed,
            plan.out_offs, plan.out_sizes, vals, plan.g_offs, plan.g_sizes, grads, status, chunks, 0, True,
        )  # fmt: skip
    err = plan.failure(status, lambda b: status[b])
    if err is not None:
        raise err
    return plan.unpack(vals, grads)


def refresh() -> bool:
    """Rewrite :data:`SWEEPS_FINGERPRINT` in this file to the current sweeps' fingerprint.
    Returns True if the file changed."""
    import re
    from pathlib import Path

    path = Path(__file__)
    text = path.read_text()
    new = re.sub(
        r'^SWEEPS_FINGERPRINT = "[0-9a-f]*"$',
        f'SWEEPS_FINGERPRINT = "{S.FINGERPRINT}"',
        text,
        count=1,
        flags=re.M,
    )
    if new == text:
        return False
    path.write_text(new)
    return True


if __name__ == "__main__":
    import sys

    if "--check" in sys.argv[1:]:
        if not is_fresh():
            print("tape/batch.py is stale: run `python -m tape.batch --refresh`", file=sys.stderr)
            sys.exit(1)
        print("tape/batch.py matches the generated sweeps")
    elif "--refresh" in sys.argv[1:]:
        print("updated tape/batch.py" if refresh() else "tape/batch.py already up to date")
    else:
        print("usage: python -m tape.batch --check | --refresh", file=sys.stderr)
        sys.exit(2)
