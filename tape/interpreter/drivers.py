"""The drivers of the compiled sweeps: reachability, zeroing, the reverse pass with its seeds,
eager mode's one-entry step, batched replay, and the drivers that take a tape's kernel
arguments as one value (:mod:`tape.kernels`).

This module is not imported. Its text is copied, in two parts, into generated modules:

- ``python -m tape.interpreter.codegen`` copies both parts into ``tape/interpreter/generated/sweeps.py``, after the
  generated ``forward_sweep`` and ``reverse_sweep`` of the interpreter;
- :mod:`tape.compiled` copies the shared part into each compiled tape's module, after that
  tape's own ``forward_sweep``, ``reach`` and ``reverse_pass``.

Numba's on-disk cache is keyed on the file of the cached function alone, so drivers compiled
from a file of their own would keep calling stale sweeps after an op changed. It is a real
module so that it is linted and read like one; the import of the generated sweeps below is
there for the linter and is not copied.
"""

import numpy as np
from numba import njit, prange

from tape.interpreter import dispatch
from tape.interpreter.generated.sweeps import (
    _kernel,
    forward_sweep,
    reverse_sweep,
    tangent_reverse_sweep,
    tangent_sweep,
)
from tape.layout.columns import ACTIVE, B_ALIAS, B_KIND, B_OFF, B_SIZE, E_IN0, E_OUT, LEAF
from tape.layout.config import SWEEP_JIT
from tape.layout.views import borrow as _borrow


# ---- interpreter drivers: copied into tape/interpreter/generated/sweeps.py ----
@njit(inline="always", **SWEEP_JIT)
def reach(entries, bufs, n_entries, roots):
    """Entries and buffers the ``roots`` depend on: ``(entry_mask, buf_mask)``.

    Entries outside the mask are skipped by the reverse sweep, so other heads recorded on the
    same tape (and their ``0 * inf``) never touch these gradients.
    """
    need = np.empty(bufs.shape[0], np.bool_)  # (np.zeros compiles a fill of its own: 0.15 s)
    need[:] = False
    emask = np.empty(n_entries, np.bool_)
    emask[:] = False
    for r in roots:
        need[r] = True
        if bufs[r, B_ALIAS] >= 0:
            need[bufs[r, B_ALIAS]] = True
    for i in range(n_entries - 1, -1, -1):
        if not need[entries[i, E_OUT]]:
            continue
        emask[i] = True
        for c in range(E_IN0, E_OUT):
            b = entries[i, c]
            if b >= 0:
                need[b] = True
                if bufs[b, B_ALIAS] >= 0:
                    need[bufs[b, B_ALIAS]] = True
    return emask, need


@njit(inline="always", **SWEEP_JIT)
def zero_adjoints(bufs, grad, need, n_bufs, zero_leaves):
    """Zero the adjoints of the needed intermediates (and of the leaves if ``zero_leaves``).
    Writes ``grad``."""
    for b in range(n_bufs):
        if not need[b] or bufs[b, B_ALIAS] >= 0:
            continue
        k = bufs[b, B_KIND]
        if k == ACTIVE or (zero_leaves and k == LEAF):
            o = bufs[b, B_OFF]
            grad[o : o + bufs[b, B_SIZE]] = 0.0


@njit(inline="always", **SWEEP_JIT)
def add_seeds(bufs, grad, roots, seeds):
    """Add ``seeds`` (the roots' adjoints, concatenated) to the roots' adjoints. Writes
    ``grad``."""
    s = 0
    for r in roots:
        o = bufs[r, B_OFF]
        n = bufs[r, B_SIZE]
        g = grad[o : o + n]
        for j in range(n):
            g[j] += seeds[s + j]
        s += n


@njit(**SWEEP_JIT)
def eager_reverse(entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, seeds, zero_leaves):
    """Eager ``backward``'s compiled part, in one call: :func:`reach`, :func:`zero_adjoints`,
    :func:`add_seeds`, and the reverse sweep itself when every entry it would run has its
    kernel in the table and none is a callback. Returns ``(emask, order, need, swept)``: the
    entry mask, the entries to run (last first), the buffer mask, and whether the sweep ran
    (if not, the caller runs ``order``, preparing the kernels it lacks). Writes ``grad``."""
    emask, need = reach(entries, bufs, n_entries, roots)
    zero_adjoints(bufs, grad, need, n_bufs, zero_leaves)
    add_seeds(bufs, grad, roots, seeds)
    k = 0
    swept = True
    for i in range(n_entries):
        if emask[i]:
            k += 1
            op = entries[i, 0]
            if op < 0 or op >= dispatch.MAX_OPS:  # a callback (or a code _kernel refuses)
                swept = False
            elif swept:
                key = op * dispatch.NCLS + dispatch.entry_class(entries, bufs, ipool, i)
                swept = dispatch.slot(dispatch.REV, key, data) != dispatch.NOT_PREPARED
    order = np.empty(k, np.int64)
    j = 0
    for i in range(n_entries - 1, -1, -1):
        if emask[i]:
            order[j] = i
            j += 1
    if swept:
        reverse_sweep(entries, bufs, ipool, data, grad, emask, np.int64(0), n_entries)
    return emask, order, need, swept


@njit(inline="always", **SWEEP_JIT)
def put_entry(
    entries, bufs, n_entries, n_bufs, off, size, ndim, shape, kind, op, in0, in1, in2, attr
):
    """Eager mode's bookkeeping, before :func:`emit` runs the entry: add output buffer
    ``n_bufs`` and entry ``n_entries`` (the arrays have room; the caller checked). Writes
    ``entries`` and ``bufs``."""
    b = bufs[n_bufs]
    b[0] = off
    b[1] = size
    b[2] = ndim
    b[3] = shape
    b[4] = kind
    b[5] = -1
    e = entries[n_entries]
    e[0] = op
    e[1] = in0
    e[2] = in1
    e[3] = in2
    e[4] = n_bufs
    e[5] = attr


@njit(**SWEEP_JIT)
def emit(
    entries, bufs, ipool, data, n_entries, n_bufs, off, size, ndim, shape, kind, op, in0, in1, in2,
    attr
):  # fmt: skip
    """Eager mode's step: put entry ``n_entries`` (op ``op``) and run it. Returns its status:
    ``-1``, ``n_entries`` when it rejected its data, or ``dispatch.UNPREPARED`` (and nothing
    run) when this process has not prepared the op's kernel for the entry's class and
    ``data``'s dtype: prepare it and call again."""
    entries, bufs, ipool, data = _borrow(entries), _borrow(bufs), _borrow(ipool), _borrow(data)
    put_entry(entries, bufs, n_entries, n_bufs, off, size, ndim, shape, kind, op, in0, in1, in2,
              attr)  # fmt: skip
    if 0 <= op < dispatch.MAX_OPS:  # (else _kernel raises)
        key = op * dispatch.NCLS + dispatch.entry_class(entries, bufs, ipool, n_entries)
        if dispatch.slot(dispatch.FWD, key, data) == dispatch.NOT_PREPARED:
            return dispatch.UNPREPARED
    return dispatch.call_fwd(
        _kernel(dispatch.FWD, op, n_entries, entries, bufs, ipool, data),
        (n_entries, entries, bufs, ipool, data),
    )


@njit(inline="always", **SWEEP_JIT)
def reverse_pass(
    entries, bufs, ipool, data, grad, n_entries, n_bufs, emask, need, roots, seeds, zero_leaves
):
    """Zero the needed intermediate adjoints (the leaves' too if ``zero_leaves``), add
    ``seeds`` (the roots' adjoints, concatenated) and sweep back over the entries in ``emask``
    (``emask`` and ``need`` come from :func:`reach`). Writes ``grad``."""
    zero_adjoints(bufs, grad, need, n_bufs, zero_leaves)
    add_seeds(bufs, grad, roots, seeds)
    reverse_sweep(entries, bufs, ipool, data, grad, emask, np.int64(0), n_entries)


@njit(**SWEEP_JIT)
def hvp_pass(entries, bufs, ipool, data, grad, T, GT, n_entries, n_bufs, roots, seeds):
    """Forward-over-reverse after a forward sweep: a reverse pass seeded with ``seeds``
    (adjoints in ``grad``), the tangent sweep of ``T`` (the arguments' tangents seeded, one
    direction per row, zero elsewhere) and the tangent of the reverse pass (``GT``, zeroed
    first: the tangent adjoints, one arena per direction). Writes ``grad``, ``T`` and
    ``GT``."""
    emask, need = reach(entries, bufs, n_entries, roots)
    reverse_pass(entries, bufs, ipool, data, grad, n_entries, n_bufs, emask, need, roots, seeds,
                 np.bool_(True))  # fmt: skip
    tangent_sweep(entries, bufs, ipool, data, T, np.int64(0), n_entries)
    GT[:, :] = 0.0
    tangent_reverse_sweep(entries, bufs, ipool, data, grad, T, GT, emask, np.int64(0), n_entries)


# ---- shared drivers: copied into the generated sweeps and every compiled tape ----
@njit(inline="always", **SWEEP_JIT)
def backward(entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, seeds, zero_leaves):
    """One reverse pass: zero the intermediates, add ``seeds`` (the roots' adjoints,
    concatenated) and sweep. Leaf adjoints accumulate. Writes ``grad``; returns the buffer
    mask of what the roots depend on."""
    emask, need = reach(entries, bufs, n_entries, roots)
    reverse_pass(entries, bufs, ipool, data, grad, n_entries, n_bufs, emask, need, roots, seeds,
                 zero_leaves)  # fmt: skip
    return need


@njit(**SWEEP_JIT)
def forward_backward(
    entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, seeds, zero_leaves
):
    """Replay the forward sweep, then :func:`backward`. Writes ``data`` and ``grad``.
    Returns ``-1``, or the index of the entry that rejected its data (gradients untouched)."""
    status = forward_sweep(entries, bufs, ipool, data, np.int64(0), n_entries)
    if status >= 0:
        return status
    backward(entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, seeds, zero_leaves)
    return -1


@njit(**SWEEP_JIT)
def vjp_rows(entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, U, offs, sizes, out):
    """Reverse mode, one pass per row ``u`` of ``U`` (seeds over the roots, concatenated):
    row ``r`` of ``out`` gets ``J^T u``, the adjoints of the buffers at ``offs`` / ``sizes``
    (the arguments) concatenated. Writes ``grad`` and ``out``. A compiled tape's copy runs
    its own reverse pass (``vjp`` and ``jacobian(mode="rev")`` of :mod:`tape.derivatives`),
    after its own forward or the interpreter's."""
    emask, need = reach(entries, bufs, n_entries, roots)
    for r in range(U.shape[0]):
        reverse_pass(entries, bufs, ipool, data, grad, n_entries, n_bufs, emask, need, roots,
                     U[r], np.bool_(True))  # fmt: skip
        c = 0
        for k in range(offs.shape[0]):
            for j in range(sizes[k]):  # a loop: a slice assignment's check compiles for 2 s
                out[r, c + j] = grad[offs[k] + j]
            c += sizes[k]


@njit(parallel=True, **SWEEP_JIT)
def gradient_batch_kernel(
    entries,
    bufs,
    ipool,
    data0,
    n_entries,
    n_bufs,
    emask,
    need,
    roots,
    seed,
    in_offs,
    in_sizes,
    args,
    out_offs,
    out_sizes,
    vals,
    g_offs,
    g_sizes,
    grads,
    status,
    n_chunks,
    yes,
):
    """Batched replay (:func:`tape.batch.gradient_batch`): ``args.shape[0]`` instances, row
    ``b`` of ``args`` holding instance ``b``'s inputs concatenated. Writes ``vals[b]`` (the
    outputs), ``grads[b]`` (the differentiated inputs' adjoints) and ``status[b]`` (``-1``, or
    the entry that rejected the instance's data; its rows are then left untouched).

    Chunks of instances run in parallel, each on private copies of the arenas, so no two
    threads write the same memory. ``yes`` (True) is an argument, not a literal, so the sweeps
    are called with the signatures already compiled.
    """
    n = args.shape[0]
    for c in prange(n_chunks):
        lo = c * n // n_chunks
        hi = (c + 1) * n // n_chunks
        if lo >= hi:
            continue
        # constants stay in place; every entry rewrites its output; the reverse pass zeroes
        # what it reads
        data = data0.copy()
        grad = np.zeros_like(data0)
        for b in range(lo, hi):
            a = args[b]
            s = 0
            for k in range(in_offs.shape[0]):
                o = in_offs[k]
                m = in_sizes[k]
                for j in range(m):  # a loop: see _gather
                    data[o + j] = a[s + j]
                s += m
            st = forward_sweep(entries, bufs, ipool, data, np.int64(0), n_entries)
            status[b] = st
            if st >= 0:
                continue
            reverse_pass(entries, bufs, ipool, data, grad, n_entries, n_bufs, emask, need, roots,
                         seed, yes)  # fmt: skip
            _gather(data, out_offs, out_sizes, vals[b])
            _gather(grad, g_offs, g_sizes, grads[b])


@njit(**SWEEP_JIT)
def _gather(arena, offs, sizes, out):
    s = 0
    for k in range(offs.shape[0]):
        o = offs[k]
        m = sizes[k]
        # a loop, not a slice assignment: its shape check's error message takes 2 s to
        # compile, in every compiled tape's module that copies this function
        for j in range(m):
            out[s + j] = arena[o + j]
        s += m


# ---------------------------------------------------------------- one-value drivers
# Each array of ``ka`` is passed on as a view holding no reference (``_borrow``): a field read
# takes a reference, and where the callee can raise Numba keeps its atomic increment and
# decrement per call (7 arrays: 771 against 301 ns per compiled Rosenbrock n = 10 gradient in a
# user's @njit loop on a Xeon, 2,821 against 1,151 ns on the interpreter).


@njit(**SWEEP_JIT)
def ka_forward(ka):
    """Forward replay over ``ka`` (a :class:`tape.KernelArgs`: ``t.kernel_args()`` or
    ``t.workspace()``). Writes ``ka.data``. Returns ``-1``, or the entry that stopped the sweep
    (a failed guard when ``t.is_guard(status)``, else a gather index out of bounds)."""
    # np.int64(0), np.bool_(...): the types Python callers pass. A literal would make Numba
    # compile a second specialisation of the sweeps.
    return forward_sweep(_borrow(ka.entries), _borrow(ka.bufs), _borrow(ka.ipool),
                         _borrow(ka.data), np.int64(0), ka.n_entries)  # fmt: skip


@njit(**SWEEP_JIT)
def ka_backward(ka):
    """Reverse sweep over the last forward on ``ka``, seeded with ``ka.seeds``: intermediate
    adjoints are zeroed first, leaf gradients in ``ka.grad`` accumulate."""
    backward(_borrow(ka.entries), _borrow(ka.bufs), _borrow(ka.ipool), _borrow(ka.data),
             _borrow(ka.grad), ka.n_entries, ka.n_bufs, _borrow(ka.roots), _borrow(ka.seeds),
             np.bool_(False))  # fmt: skip


@njit(**SWEEP_JIT)
def ka_gradient(ka):
    """Zero the leaf gradients, replay forward and backward on ``ka``: the gradients of the
    scalar output are in ``ka.grad`` (``t.input_slice(k)`` says where). Returns the forward
    status as :func:`ka_forward` (``-1``: done; otherwise the gradients are untouched)."""
    return forward_backward(_borrow(ka.entries), _borrow(ka.bufs), _borrow(ka.ipool),
                            _borrow(ka.data), _borrow(ka.grad), ka.n_entries, ka.n_bufs,
                            _borrow(ka.roots), _borrow(ka.seeds), np.bool_(True))  # fmt: skip
