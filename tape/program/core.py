"""The tape: a Wengert list in five flat arrays, and its replay API.

The same class serves eager mode (each op appends an entry and runs the forward sweep over just
that entry) and record-once/replay-many mode (:func:`tape.record` traces a function into a
tape; :meth:`Tape.forward`, :meth:`Tape.backward` and :meth:`Tape.gradient` replay it). The
array layout is described in :mod:`tape.layout.columns`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import threading
import warnings
from time import perf_counter as _now
from typing import NamedTuple

import numpy as np

from tape.interpreter import dispatch as _dispatch
from tape.interpreter.generated import sweeps
from tape.layout.calls import entry_point, gradient_signature
from tape.layout.columns import (
    ACTIVE,
    B_ALIAS,
    B_KIND,
    B_OFF,
    B_SIZE,
    BUF_COLS,
    CONST,
    E_ATTR,
    E_IN0,
    E_OP,
    E_OUT,
    ENTRY_COLS,
    LEAF,
)
from tape.ops import registry
from tape.program import anomaly as _anomaly
from tape.program.callbacks import (
    CALLBACK,
    CallbackSweeps,
    eager_backward,
    entry_name,
    python_free,
    refuse,
    refuse_gpu,
)
from tape.program.replay import (
    CompileError,
    GuardError,
    Signature,
    buffer_reader,
    failure,
    is_guard,
    run_entry,
    stopped_by_guard,
)

FORMAT_VERSION = 1

_EXTENSIONS: dict = {}
"""Replays that sit on top of the tape register themselves here (``"gradient_batch"`` by
:mod:`tape.batch`, ``"compile"`` by :mod:`tape.compiled`; ``"to_cuda"`` and
``"derivatives"``, loaders of :mod:`tape.cuda` and :mod:`tape.derivatives`, by the package),
so this module imports none of them."""


def register_extension(name, fn):
    _EXTENSIONS[name] = fn


_PREPARE_LOCK = threading.Lock()
_NOT_COUNTED = contextlib.nullcontext()  # Tape.counting on a tape not waiting for promotion

_PLAIN: dict = {}  # a tuple subclass (the front end's Size) -> the equal plain tuple


def _plain(shape):
    """``shape`` as a plain tuple, as the tape's shapes list holds them (one per shape)."""
    p = _PLAIN.get(shape)
    if p is None:
        if len(_PLAIN) > 4096:
            _PLAIN.clear()
        p = _PLAIN[shape] = tuple(shape)
    return p


class GuardWarning(RuntimeWarning):
    """A replay continued on the recorded path past a failed guard (``on_change="warn"``)."""


class _Miss(Exception):
    """A retraced variant's guard failed: try the next variant (internal)."""


class _Workspace:
    """One replay's private memory: a value arena (a copy of the tape's recorded values,
    constants included) and an adjoint arena, with views of the arguments, outputs and
    gradients."""

    __slots__ = ("arena", "data", "grad", "in_views", "out_views", "grad_views", "ok")

    def __init__(self, t):
        self.ok = False  # the last forward on this workspace ran to the end
        n = t.n_data
        # one allocation, so that the compiled tier's gradient() call passes it as one array
        self.arena = np.empty(2 * n, t.dtype)
        self.data, self.grad = self.arena[:n], self.arena[n:]
        self.data[...] = t.data[:n]
        self.grad[...] = 0

        self.in_views = [t.view(self.data, b) for b in t.inputs]
        self.out_views = [t.view(self.data, b) for b in t.outputs]
        self.grad_views = [t.view(self.grad, t.inputs[k]) for k in t.wrt]


_ndarray = np.ndarray  # a global, not an attribute lookup, on the hot path


def _emit_cached() -> bool:
    """Whether Numba's cache holds eager mode's step (``sweeps.emit``) or this process has
    it: where it does not, recordings put their entries from Python (:meth:`Tape._emit_cold`)."""
    if _EMIT_CACHED:
        return True
    try:
        found = os.path.exists(sweeps.emit._cache._cache_file._index_path)
    except AttributeError:  # caching off, or another Numba: compile it, as eager mode does
        found = True
    if found or sweeps.emit.signatures:
        _EMIT_CACHED.append(True)
    return bool(_EMIT_CACHED)


_EMIT_CACHED: list = []

_EMIT = {}
"""Eager mode's step (``sweeps.emit``) by the dtype of the value arena, called without
Numba's dispatch (:func:`tape.layout.calls.entry_point`): a tape's ``entries``, ``bufs``,
``ipool`` and ``data`` are always fresh C-ordered arrays (made by ``np.empty``, ``_grow``,
``astype`` or ``np.array``, or C-ordered views of one such array), and its other
arguments integers, so their types follow from ``data``'s dtype."""


def _direct_ok(args, d):
    """Whether ``args`` can take a compiled tape's one-call gradient ``d`` (``Tape._direct``):
    arrays of the recorded dtypes and numbers of axes, in any layout. Their shapes are checked
    in the call (``tape.compiler.args.ARGS_DIFFER``)."""
    checks = d[1]
    if len(args) != len(checks):
        return False
    for a, (nd, dt) in zip(args, checks):
        if type(a) is not _ndarray or a.dtype is not dt or a.ndim != nd:
            return False
    return True


class KernelArgs(NamedTuple):
    """A tape's program and one workspace, as the compiled drivers take them, for calling
    them from your own ``@njit`` code::

        ka = t.workspace()                # or t.kernel_args(): this thread's default one
        status = tape.kernels.gradient(ka)  # zero, forward, backward; grads in ka.grad

    ``data[off:off + n]`` / ``grad[off:off + n]`` with ``(off, n) = t.input_slice(k)`` are
    argument ``k``'s value and gradient; write new argument values there before a replay.
    """

    entries: np.ndarray
    bufs: np.ndarray
    ipool: np.ndarray
    data: np.ndarray
    grad: np.ndarray
    n_entries: int
    n_bufs: int
    roots: np.ndarray
    seeds: np.ndarray


def _grow(a, n, fill=0):
    """``a`` with room for at least ``n`` rows (amortised doubling)."""
    cap = a.shape[0]
    if n <= cap:
        return a
    shape = (max(n, 2 * cap),) + a.shape[1:]
    # zeros come from calloc: pages past the copied part are not touched until written
    new = np.zeros(shape, a.dtype) if fill == 0 else np.full(shape, fill, a.dtype)
    new[:cap] = a
    return new


class Tape:
    """A recorded computation: a Wengert list over a flat value arena and adjoint arena.

    Attributes
    ----------
    entries, bufs, ipool : int64 arrays
        The Wengert list, the buffer table and the integer pool (see :mod:`tape.layout.columns`).
        Only the first ``n_entries`` / ``n_bufs`` / ``n_ipool`` rows are in use.
    data, grad : float arrays
        Value arena and adjoint arena (``grad`` is allocated by the first reverse sweep).
    dtype : numpy.dtype
        ``float64`` (default) or ``float32``.
    """

    run_with = (sweeps, None)
    _interp_ready = False  # the interpreter's kernels of this tape's ops are in the table
    _compiled_ready = None  # the compiled module whose table calls are prepared
    """``(sweeps, pool)``: the compiled code replays run (the interpreter's sweeps, or this
    tape's compiled module once :meth:`compile` ran) and the integer pool they take (``ipool``,
    or ``ipool`` with the compiled tier's tables appended). One attribute, read once per
    replay, so a replay never pairs one tier's code with the other's pool."""

    _direct = None
    """``(ints, checks, one, entry, gshape)`` when :meth:`gradient` can replay in one compiled
    call (a compiled tape with a scalar output and gradients in the arena dtype), else
    ``None``: the tape's integer arrays end to end, the arguments' ``(ndim, dtype)``, the
    only one's (``None`` for several), the entry point of ``gradient_args`` for arguments of
    those dtypes and numbers of axes in any layout (:mod:`tape.compiler.args`,
    :func:`_direct_ok`) and the shape of the gradient where there is one (``None`` for
    several: ``out`` is then checked as a list)."""

    _direct_fwd = None
    """``[forward_args, signature, entry, seen]`` when :meth:`forward` can replay in one
    compiled call (a tape with :attr:`_direct`, replayed by the shared runtime; see
    :meth:`_run_direct`), else ``None``: the runtime's ``forward_args_<n>``, the types it is
    compiled for, its entry point (made at the second call: ``seen`` marks the first, which
    takes the checked path)."""

    # Immutable defaults live on the class (an instance assignment replaces them): eager mode
    # makes a tape per training step, and each attribute set here costs it time.
    grad = None  # the adjoint arena, made by the first reverse sweep
    n_entries = n_bufs = n_ipool = n_data = 0
    _freed = None  # eager: bool per buffer, True once a backward without retain_graph used it
    speculate = True  # an op's first use here starts the compile of its reverse kernel
    cold_jobs = ()  # ... and of these (tape.interpreter.warm jobs: a recording that will compile)
    callbacks = None  # {call id: tape.autograd.Call}: autograd.Function calls
    recording = False
    lift = None  # the front end's hook while recording a checkpoint's sub-tape (tape.checkpoint)
    closed = False  # set by an eager backward: new leaf expressions start elsewhere
    _merged = None  # (tape, buffer shift) once merged into another tape
    single_output = True  # the recorded function returned one value (not a tuple)
    extension_state: dict | None = None
    """See :meth:`extensions`."""
    _replay = None
    on_change = "retrace"  # what to do when a guard fails at replay (see tape.record)
    retracer = None  # callable(*args) -> a new Tape of the same function, set by tape.record
    max_variants = 8
    retraces = 0
    _tls = None  # per-thread default workspace and last variant (made for replay)
    _variants_lock = None
    _n_replays = 0  # the compiled tier (tape.compiled): replays so far ...
    compile_after = None  # ... and the count that promotes
    _replay_s = 0.0  # seconds of counted replays on the interpreter so far ...
    compile_after_seconds = None  # ... and the seconds that promote, in the background ...
    compile_min_replays = 0  # ... from this replay on ...
    compile_cost = None  # ... weighed against this estimate of the compile (s; _worth_compiling)
    compiling = None  # the background thread compiling this tape (automatic promotion)
    _counted = frozenset()  # the transforms that counted a call (Tape.counting)

    def __init__(self, dtype=np.float64, capacity=64):
        """An empty tape; ``capacity``: the value arena's first size (it grows as needed)."""
        self.dtype = dtype = np.dtype(dtype)
        self.entries = np.empty((32, ENTRY_COLS), np.int64)
        self.bufs = np.empty((64, BUF_COLS), np.int64)
        self.ipool = np.empty(128, np.int64)
        # every entry writes its whole output and every buffer with a value is filled when
        # made, so the arena needs no zeroing (replays rerun the entries on copies of it)
        self.data = np.empty(max(int(capacity), 64), dtype)
        self.shapes: list[tuple] = []  # Python copy of each buffer's shape (hot path reads it)
        self._interned: dict[tuple, int] = {}  # int block (shape, attributes) -> ipool position
        self._consts: dict = {}  # Python number -> its read-only CONST buffer
        self.leaf_bufs: dict[int, int] = {}  # id(leaf tensor) -> its buffer in this tape
        self.leaf_vers: dict[int, int] = {}  # id(leaf tensor) -> its version when copied in
        self.leaves: list = []  # [(leaf tensor, buffer)] of eager leaves copied in
        self._written: set = set()  # root buffers rebound by x[key] = v (Tensor.__setitem__)
        # replay signature (set by tape.record)
        self.inputs: list[int] = []
        self.input_names: list[str] = []
        self.input_dtypes: list = []
        self.wrt: list[int] = []
        self.outputs: list[int] = []
        self.output_dtypes: list = []
        # source lines: entry -> "file:line" of the user's code (recordings; eager entries in
        # anomaly mode), kept by save/load, shown by print(t) and in error messages
        self.sources: dict[int, str] = {}
        self._variants: list[Tape] = []  # retraced tapes, most recently used first
        self._warned: set = set()

    # ------------------------------------------------------------ building

    def _push_ints(self, ints) -> int:
        k = len(ints)
        p = self.n_ipool
        if p + k > self.ipool.shape[0]:
            self.ipool = _grow(self.ipool, p + k)
        self.ipool[p : p + k] = ints
        self.n_ipool = p + k
        return p

    def intern(self, ints) -> int:
        """Position of the int block ``ints`` in ``ipool``, pushed once per tape (shapes and
        attribute blocks repeat; blocks are read-only)."""
        key = ints if ints.__class__ is tuple else tuple(ints)
        p = self._interned.get(key)
        if p is None:
            p = self._interned[key] = self._push_ints(key) if key else 0
        return p

    def share_ints(self, other):
        """Start an empty tape with ``other``'s int pool and its index of blocks (eager mode:
        each training step's new tape records the same shapes and attribute blocks)."""
        n = other.n_ipool
        if n > self.ipool.shape[0]:
            self.ipool = np.empty(n, np.int64)
        self.ipool[:n] = other.ipool[:n]
        self.n_ipool = n
        self._interned = other._interned.copy()

    def constant(self, value) -> int:
        """A 0-d CONST buffer holding the Python number ``value``, shared per tape."""
        key = (value, math.copysign(1.0, value))  # keeps 0.0 and -0.0 apart
        b = self._consts.get(key)
        if b is None:
            b = self.new_buffer((), CONST, value)
            if value == value:  # a NaN never matches itself: do not keep it
                self._consts[key] = b
        return b

    def _alloc(self, size) -> int:
        off = self.n_data
        if off + size > self.data.shape[0]:
            self.data = _grow(self.data, off + size)
        self.n_data = off + size
        return off

    def new_buffer(self, shape, kind, value=None) -> int:
        """Add a buffer of ``shape`` that owns fresh arena memory (filled from ``value``)."""
        size = 1
        for n in shape:
            size *= n
        off = self.n_data
        end = off + size
        if end > self.data.shape[0]:
            self.data = _grow(self.data, end)
        self.n_data = end
        if value is None:
            pass
        elif value.__class__ is np.ndarray:
            if size == 1:
                self.data[off] = value.item()
            else:
                self.data[off:end] = value.ravel()
        elif size == 1 and not isinstance(value, np.ndarray):
            self.data[off] = value
        else:
            self.data[off:end] = np.ravel(value)
        return self._add_buf(off, size, shape, kind, -1)

    def copy_in(self, x, kind, ver) -> int:
        """Eager mode: a new buffer of ``kind`` (``LEAF`` or ``CONST``) holding a copy of the
        value of tensor ``x`` (which owns it), remembered with ``x``'s version ``ver`` so the
        tape reuses it until ``x`` is written in place."""
        b = self.new_buffer(x.shape, kind, x._value)
        key = id(x)
        self.leaf_bufs[key] = b
        self.leaf_vers[key] = ver
        self.leaves.append((x, b))  # keeps x alive, so its id stays unique
        return b

    def _add_buf(self, off, size, shape, kind, alias) -> int:
        b = self.n_bufs
        if b >= self.bufs.shape[0]:
            self.bufs = _grow(self.bufs, b + 1)
        self.bufs[b] = (off, size, len(shape), self.intern(shape), kind, alias)
        self.shapes.append(shape if shape.__class__ is tuple else _plain(shape))
        self.n_bufs = b + 1
        return b

    def alias(self, b, shape, delta=0) -> int:
        """A buffer viewing ``size(shape)`` elements of ``b``'s memory from ``delta`` on."""
        row = self.bufs[b]
        root = row[B_ALIAS] if row[B_ALIAS] >= 0 else b
        return self._add_buf(row[B_OFF] + delta, math.prod(shape), shape, row[B_KIND], root)

    def add_entry(self, code, ins, out, attr=None) -> int:
        i = self.n_entries
        if i >= self.entries.shape[0]:
            self.entries = _grow(self.entries, i + 1, -1)
        p = self.intern(attr) if attr is not None else -1
        n = len(ins)
        if n == 1:
            self.entries[i] = (code, ins[0], -1, -1, out, p)
        elif n == 2:
            self.entries[i] = (code, ins[0], ins[1], -1, out, p)
        else:
            self.entries[i] = (code, ins[0], ins[1], ins[2], out, p)
        self.n_entries = i + 1
        return i

    def emit(self, code, ins, shape, kind, attr=None) -> int:
        """Add an output buffer of ``shape`` and one entry computing it, and run the entry:
        eager mode's step, in one compiled call. Returns the output buffer."""
        size = 1
        for n in shape:
            size *= n
        off = self.n_data
        if off + size > self.data.shape[0]:
            self.data = _grow(self.data, off + size)
        b = self.n_bufs
        if b >= self.bufs.shape[0]:
            self.bufs = _grow(self.bufs, b + 1)
        i = self.n_entries
        if i >= self.entries.shape[0]:
            self.entries = _grow(self.entries, i + 1, -1)
        interned = self._interned  # intern(), inline for the tuples eager ops pass
        sp = interned.get(shape) if shape.__class__ is tuple else None
        if sp is None:
            sp = self.intern(shape)
        if attr is None:
            p = -1
        else:
            p = interned.get(attr) if attr.__class__ is tuple else None
            if p is None:
                p = self.intern(attr)
        n = len(ins)
        args = (
            self.entries, self.bufs, self.ipool, self.data, i, b, off, size, len(shape), sp, kind,
            code, ins[0] if n > 0 else -1, ins[1] if n > 1 else -1, ins[2] if n > 2 else -1, p,
        )  # fmt: skip
        step = _EMIT.get(self.data.dtype)
        if step is None and self.recording and not _emit_cached():
            status = self._emit_cold(args)  # a recording from an empty cache: no eager step
        else:
            if step is None:  # the tape's arrays are always C-ordered, of int64 and one dtype
                step = _EMIT[self.data.dtype] = entry_point(sweeps.emit, args)
            status = step(*args)
            if status == _dispatch.UNPREPARED:  # the op's first use in this process (class)
                self._prepare_forward(code, i)
                status = step(*args)
        self.n_data = off + size
        self.n_bufs = b + 1
        self.n_entries = i + 1
        self.shapes.append(shape if shape.__class__ is tuple else _plain(shape))
        if status >= 0:
            raise failure(self, status, buffer_reader(self, self.data))
        return b

    def _prepare_forward(self, code, i):
        """Prepare the forward kernel of entry ``i`` (op ``code``) for its entry class;
        returns the class."""
        cls = _dispatch.classes_of(self.entries, self.bufs, self.ipool, np.array([i]))
        _dispatch.prepare((code,), self.dtype, (_dispatch.FWD,), speculate=self.speculate,
                          also=self.cold_jobs, classes=cls)  # fmt: skip
        return int(cls[0])

    def _emit_cold(self, args):
        """:func:`sweeps.emit`'s work done from Python: put the entry and run its forward
        kernel through the table. A recording takes this path while Numba's cache lacks eager
        mode's step, whose compile (0.5-0.6 s) would otherwise delay the recording's first
        op kernel; the per-op cost of the Python path, a few microseconds, is a recording's
        once. Returns the entry's status, as ``emit`` does."""
        entries, bufs, ipool, data, i, b, off, size, nd, sp, kind, code, in0, in1, in2, p = args
        if not 0 <= code < _dispatch.MAX_OPS:
            raise ValueError("tape sweeps: an entry's op code is outside the instruction set")
        bufs[b, : B_ALIAS + 1] = (off, size, nd, sp, kind, -1)
        entries[i, : E_ATTR + 1] = (code, in0, in1, in2, b, p)
        cls = self._prepare_forward(code, i)
        a = _dispatch.TABLES[data.dtype][_dispatch.FWD, code * _dispatch.NCLS + cls]
        if a == _dispatch.NOTHING:
            return -1
        return sweeps.fwd_at(a, i, entries, bufs, ipool, data)

    def run_forward(self, start, stop):
        """Eager: run entries ``start .. stop-1`` on the tape's own arena, entry by entry."""
        for i in range(start, stop):
            status = run_entry(self, i, self.data)
            if status >= 0:
                raise failure(self, status, buffer_reader(self, self.data))

    def view(self, arena, b):
        """Buffer ``b`` in ``arena`` (the tape's value or adjoint arena, or a workspace's, all
        laid out alike), as a view with its shape."""
        off, size = self.bufs[b, B_OFF], self.bufs[b, B_SIZE]
        return arena[off : off + size].reshape(self.shapes[b])

    def value(self, b):
        """The current value of buffer ``b`` as a view of the arena (shape restored)."""
        return self.view(self.data, b)

    def adjoint(self, b):
        return self.view(self.grad, b)

    def ensure_grad(self):
        """An adjoint arena covering the buffers made so far (not the value arena's spare
        capacity: an eager tape reserves room for the next steps, and zeroing it is wasted)."""
        n = self.n_data
        g = self.grad
        if g is None or g.shape[0] < n or g.dtype != self.dtype:
            new = np.zeros(max(n, 1), self.dtype)
            if g is not None:
                m = min(n, g.shape[0])
                new[:m] = g[:m]
            self.grad = new

    def run_backward(self, roots, seeds, zero_leaves):
        """Reverse sweep from ``roots`` (buffer ids) seeded with ``seeds`` (concatenated).
        Returns the mask of buffers the roots depend on."""
        self.ensure_grad()
        if _anomaly.enabled():
            refuse(self, "detect_anomaly()")
            return _anomaly.backward(
                self, self.data, self.grad, np.asarray(roots, np.int64),
                np.ascontiguousarray(seeds, self.dtype).ravel(), zero_leaves,
            )  # fmt: skip
        entries, bufs, ipool, data, grad = self.entries, self.bufs, self.ipool, self.data, self.grad
        emask, order, need, swept = sweeps.eager_reverse(
            entries, bufs, ipool, data, grad, self.n_entries, self.n_bufs,
            np.asarray(roots, np.int64), np.ascontiguousarray(seeds, self.dtype).ravel(),
            zero_leaves,
        )  # fmt: skip
        if swept:  # every kernel in the table, no callback: the compiled sweep ran
            return need
        # prepare the reverse kernels the table lacks (all at once: the helpers share the
        # work), then sweep the runs of entries between callbacks, last first
        codes = entries[order, E_OP]
        ops = codes != CALLBACK
        if ops.any():
            classes = _dispatch.entry_classes(entries, bufs, ipool, order[ops])
            pairs = sorted(set(zip(codes[ops].tolist(), classes.tolist())))
            _dispatch.prepare([c for c, _ in pairs], self.dtype, (_dispatch.REV,),
                              speculate=False, classes=[q for _, q in pairs])  # fmt: skip
        done = set()  # autograd.Function calls already run
        stop = self.n_entries
        for i in order[~ops].tolist():  # the callbacks, last first
            sweeps.reverse_sweep(entries, bufs, ipool, data, grad, emask, i + 1, stop)
            eager_backward(self, i, emask, need, done)
            stop = i
        sweeps.reverse_sweep(entries, bufs, ipool, data, grad, emask, 0, stop)
        return need

    def promote(self, dtype):
        """Widen the arenas to ``dtype`` (a float32 tape joined by float64 values)."""
        dtype = np.dtype(dtype)
        if dtype.itemsize > self.dtype.itemsize:
            self.dtype = dtype
            self.data = self.data.astype(dtype)
            if self.grad is not None:
                self.grad = self.grad.astype(dtype)

    def merge(self, other: Tape) -> int:
        """Append ``other``'s entries and buffers to this tape; returns the buffer shift.
        ``other`` forwards to this tape afterwards (tensors resolve lazily)."""
        self.promote(other.dtype)
        nb, ni, nd = self.n_bufs, self.n_ipool, self.n_data
        bufs = other.bufs[: other.n_bufs].copy()
        bufs[:, B_OFF] += nd
        bufs[:, 3] += ni
        alias = bufs[:, B_ALIAS]
        alias[alias >= 0] += nb
        ent = other.entries[: other.n_entries].copy()
        cols = ent[:, E_IN0:]  # in0, in1, in2, out, attr
        cols[:, :4][cols[:, :4] >= 0] += nb
        attr = ent[:, E_ATTR]
        attr[attr >= 0] += ni
        self._push_ints(other.ipool[: other.n_ipool])
        off = self._alloc(other.n_data)
        self.data[off : off + other.n_data] = other.data[: other.n_data]
        self.bufs = _grow(self.bufs, nb + len(bufs))
        self.bufs[nb : nb + len(bufs)] = bufs
        self.n_bufs = nb + len(bufs)
        ne = self.n_entries
        self.entries = _grow(self.entries, ne + len(ent), -1)
        self.entries[ne : ne + len(ent)] = ent
        self.n_entries = ne + len(ent)
        self.shapes.extend(other.shapes)
        for i, src in other.sources.items():
            self.sources[i + ne] = src
        self._written.update(r + nb for r in other._written)
        if other.callbacks:
            for call in other.callbacks.values():
                call.ins = [b + nb for b in call.ins]
                call.outs = [b + nb for b in call.outs]
            self.callbacks = {**(self.callbacks or {}), **other.callbacks}
        for leaf, b in other.leaves:
            self.leaves.append((leaf, b + nb))
            if id(leaf) not in self.leaf_bufs:
                self.leaf_bufs[id(leaf)] = b + nb
                self.leaf_vers[id(leaf)] = other.leaf_vers.get(id(leaf), 0)
        if other._freed is not None:
            moved = np.zeros(nb + other.n_bufs, np.bool_)
            k = min(other.n_bufs, other._freed.shape[0])
            moved[nb : nb + k] = other._freed[:k]
            self.mark_freed(moved)
        other._merged = (self, nb)
        other.entries = other.bufs = other.ipool = other.data = other.grad = None
        other.leaves, other.leaf_bufs, other.leaf_vers, other.shapes = [], {}, {}, []
        return nb

    def mark_freed(self, need):
        """Eager graphs: the buffers in ``need`` (a reverse sweep's mask) were used by a
        ``backward`` without ``retain_graph``; a later one through them raises, as in PyTorch."""
        m = self._freed
        if m is None:
            self._freed = need
            return
        if m.shape[0] < need.shape[0]:
            m = self._freed = np.concatenate([m, np.zeros(need.shape[0] - m.shape[0], np.bool_)])
        m[: need.shape[0]] |= need

    def reaches_freed(self, roots) -> bool:
        """Whether a reverse sweep from ``roots`` would go through an intermediate that a
        ``backward`` without ``retain_graph`` already used (leaves and constants do not count:
        separate graphs may share them)."""
        _, need = sweeps.reach(self.entries, self.bufs, self.n_entries, roots)
        n = min(self.n_bufs, self._freed.shape[0])
        return bool((need[:n] & self._freed[:n] & (self.bufs[:n, B_KIND] == ACTIVE)).any())

    # ------------------------------------------------------------ replay
    #
    # The program (entries, bufs, ipool and the recorded values in ``data``) is shared and
    # never written by a replay; every replay runs on a workspace, a private copy of the value
    # arena and an adjoint arena. Each thread has its own default workspace, so the replay
    # methods are safe to call from many threads at once (the sweeps release the GIL).

    def replay_state(self) -> dict:
        """The replay's per-tape state (signature, roots, seed, output dtypes), made on first
        use; raises unless the tape was recorded with a signature. Part of the interface the
        layers above (transforms, the GPU, checkpoints) extend replay through."""
        if not self.inputs and not self.outputs:
            raise RuntimeError(
                "this tape was not made by tape.record(); replay methods need a recorded "
                "signature (inputs and outputs)"
            )
        if self._replay is None:
            with _PREPARE_LOCK:  # one thread makes the per-thread state all threads share
                if self._replay is None:
                    self._prepare_replay()
        return self._replay

    def extensions(self) -> dict:
        """The per-tape state of the layers that extend replay (``"batch"``: the batched plan,
        ``"derivatives"``, ``"sparsity"``, ``"gpu_batch"``), each under a key of its own: they
        cache what they derive from a tape here, never in attributes of their own."""
        st = self.extension_state
        if st is None:
            st = self.extension_state = {}
        return st

    def _prepare_replay(self):
        self._tls = threading.local()
        self._variants_lock = threading.Lock()
        self._compile_lock = threading.Lock()
        sig = Signature(self)
        if self.callbacks:
            self.callback_sweeps = CallbackSweeps(self)  # the interpreter, around the callbacks
            if self.tier == "interpreter":
                self.run_with = (self.callback_sweeps, self.ipool)
        elif self.run_with[0] is sweeps:
            self.run_with = (sweeps, self.ipool)
        self._replay = dict(
            sig=sig,
            roots=np.asarray(self.outputs, np.int64),
            seed=np.ones(sig.n_seed, self.dtype),
            fast=[(s, d) for s, d in zip(sig.shapes, sig.dtypes)],
            grad_dtypes=[np.dtype(self.input_dtypes[k]) for k in self.wrt],
            # gradient()'s fast path: a scalar output, gradients in the arena dtype
            simple=sig.n_seed == 1
            and all(np.dtype(self.input_dtypes[k]) == self.dtype for k in self.wrt),
            out_dtypes=[
                np.dtype(d) for d in (self.output_dtypes or [self.dtype] * len(self.outputs))
            ],
        )

    def _kernels_ready(self, sw, meanwhile=None):
        """Put the op kernels that a replay through ``sw`` calls in the dispatch table
        (:func:`tape.interpreter.dispatch.prepare`): every op's forward and reverse kernel for the
        interpreter, the few a compiled module calls for a compiled tape (``TABLE_CALLS``).
        ``meanwhile()`` (the replay's driver compile) runs before waiting for kernels that
        helper processes are compiling."""
        if sw is sweeps or isinstance(sw, CallbackSweeps):
            _dispatch.prepare_tape(self, meanwhile=meanwhile)
            self._interp_ready = True
        else:
            for kind, code in sw.TABLE_CALLS:
                _dispatch.prepare((code,), self.dtype, (kind,))
            self._compiled_ready = sw

    def prepared_sweeps(self):
        """``(sweeps, pool)`` of the tier this tape replays on (:attr:`run_with`), with the
        op kernels those sweeps call prepared in this process. Part of the replay interface."""
        sw, pool = self.run_with
        if sw is not self._compiled_ready and not self._interp_ready:
            self._kernels_ready(sw)
        return sw, pool

    def count_replay(self):
        """Count one replay toward the compiled tier (``compile="auto"`` compiles the tape at
        its :attr:`compile_after`-th replay); for replays that run the sweeps themselves."""
        self._n_replays += 1
        if self._n_replays == self.compile_after:
            self._promote()

    def counting(self, what):
        """A context in which what runs counts toward the compiled tier as one replay: at
        the :attr:`compile_after`-th (:meth:`count_replay`, before it runs), and by the time
        it takes (promotion by time, :attr:`compile_after_seconds`), except the first call of
        each ``what`` (a transform's name), which compiles or loads its kernels and drivers
        (a replay's time leaves its compile out). Nothing (a shared empty context, no
        generator) on a tape not waiting for automatic promotion. For the derivative
        transforms' checked paths, which run compiled code once the tape is promoted. Part of
        the replay interface."""
        if self.tier != "interpreter" or (
            self.compile_after is None and self.compile_after_seconds is None
        ):
            return _NOT_COUNTED
        return self._counting(what)

    @contextlib.contextmanager
    def _counting(self, what):
        self.count_replay()  # (may promote: the count rule compiles in this thread)
        if what not in self._counted:
            self._counted = self._counted | {what}
            yield
            return
        t0 = _now()
        try:
            yield
        finally:
            if self.compile_after_seconds is not None:
                self._timed(t0)

    def _driver_ready(self, sw, call):
        """Prepare the op kernels of a replay through ``sw.forward_backward(*call)`` and the
        driver itself: the driver compiles while helper processes compile op kernels, unless
        a helper is compiling it already (then it is loaded once the kernels are ready)."""
        self._kernels_ready(sw, lambda: _dispatch.precompile_driver(sw, call, wait=False))
        _dispatch.precompile_driver(sw, call, wait=True)  # loads it if a helper compiled it

    def _interpreter_ready(self):
        if not self._interp_ready:
            self._kernels_ready(sweeps)

    @property
    def signature(self) -> Signature:
        """The replay signature (argument names, shapes, dtypes; see :mod:`tape.program.replay`)."""
        return self.replay_state()["sig"]

    def thread_workspace(self):
        """This thread's default workspace (made on first use): the arenas :meth:`run_replay`
        ran on, for reading its values and adjoints."""
        ws = getattr(self._tls, "ws", None)
        if ws is None:
            ws = self._tls.ws = _Workspace(self)
        return ws

    def workspace(self) -> KernelArgs:
        """A private set of value and adjoint arenas with the tape's program, for calling the
        sweeps from your own ``@njit`` code without sharing memory with other replays (one per
        thread). Its arrays are fresh; :meth:`input_slice` tells where to write arguments."""
        r = self.replay_state()
        self._interpreter_ready()  # tape.kernels replays any tape on the interpreter
        ws = _Workspace(self)
        return KernelArgs(
            self.entries, self.bufs, self.run_with[1], ws.data, ws.grad,
            self.n_entries, self.n_bufs, r["roots"], r["seed"],
        )  # fmt: skip

    def _load_args(self, ws, args):
        views = ws.in_views
        if len(args) != len(views):
            self._replay["sig"].check_count(args)
        fast = self._replay["fast"]  # (shape, dtype) per input: arrays that match need no checks
        for k in range(len(views)):
            a = args[k]
            if type(a) is not np.ndarray or (a.shape, a.dtype) != fast[k]:
                a = self._replay["sig"].check_arg(k, a)
            views[k][...] = a

    def run_replay(self, args, grad, interp=False):
        """Load ``args`` into this thread's workspace and replay (forward, and with ``grad``
        zero + backward). Returns ``(tape, workspace)`` of the tape that ran: this one or, after
        a failed guard, a retraced variant. ``interp``: on the interpreter whatever the tier
        (every entry's value written: the derivative drivers need them)."""
        r = self._replay
        if r is None:
            r = self.replay_state()
        if not interp:  # derivative drivers (interp) run on the interpreter: no promotion
            self._n_replays += 1
            if self._n_replays == self.compile_after:
                self._promote()
        ws = self.thread_workspace()
        ws.ok = False  # until the sweep finishes: a backward over a half-run forward is refused
        if self._variants:
            self._tls.active = None
        self._load_args(ws, args)
        t0 = 0.0
        if _anomaly.ON and _anomaly.enabled():
            status = _anomaly.replay(self, ws, grad, r["roots"], r["seed"])
        elif grad:
            sw, pool = self.run_with
            if sw is not self._compiled_ready and not self._interp_ready:
                call = (
                    self.entries, self.bufs, pool, ws.data, ws.grad,
                    self.n_entries, self.n_bufs, r["roots"], r["seed"], True,
                )  # fmt: skip
                self._driver_ready(sw, call)
            if self.compile_after_seconds is not None and not interp:
                t0 = _now()
            status = sw.forward_backward(
                self.entries, self.bufs, pool, ws.data, ws.grad,
                self.n_entries, self.n_bufs, r["roots"], r["seed"], True,
            )  # fmt: skip
        else:
            interp_sw = self.callback_sweeps if self.callbacks else sweeps
            sw, pool = (interp_sw, self.ipool) if interp else self.run_with
            if sw is not self._compiled_ready and not self._interp_ready:
                self._kernels_ready(sw)
            if self.compile_after_seconds is not None and not interp:
                t0 = _now()
            status = sw.forward_sweep(self.entries, self.bufs, pool, ws.data, 0, self.n_entries)
        if t0:
            self._timed(t0)
        if status < 0:
            ws.ok = True
            return self, ws
        return self._recover(status, ws, args, grad, interp)

    def _recover(self, status, ws, args, grad, interp=False):
        """A sweep stopped at entry ``status``: raise, or follow the ``on_change`` policy."""
        if not stopped_by_guard(self, status):
            raise failure(self, status, buffer_reader(self, ws.data))
        policy = self.on_change
        if policy == "_variant":
            raise _Miss
        if policy == "warn":
            return self._resume_past_guards(status, ws, grad)
        if policy != "retrace" or self.retracer is None:
            err = failure(self, status, buffer_reader(self, ws.data))
            if policy == "retrace":
                err.args = (
                    err.args[0] + " (this tape cannot retrace: it has no function, as a tape "
                    "loaded from a file or unpickled; record it again with tape.record)",
                )
            raise err
        for v in list(self._variants):  # a snapshot: other threads may reorder the list
            try:
                _, vws = v.run_replay(args, grad, interp)
            except _Miss:
                continue
            with self._variants_lock:  # most recently used first
                if v in self._variants:
                    self._variants.remove(v)
                    self._variants.insert(0, v)
            self._tls.active = v
            return v, vws
        v = self.retracer(*args)
        v.on_change = "_variant"
        try:
            _, vws = v.run_replay(args, grad, interp)
        except _Miss:
            raise GuardError(
                "the function took another path when traced again at the same arguments (its "
                "control flow depends on something other than its arguments)"
            ) from None
        with self._variants_lock:
            self.retraces += 1
            self._variants.insert(0, v)
            del self._variants[self.max_variants :]
        self._tls.active = v
        return v, vws

    def _resume_past_guards(self, status, ws, grad):
        """``on_change="warn"``: warn once per guard, then continue on the recorded path."""
        r = self._replay
        while status >= 0:
            if not is_guard(self, status):
                raise failure(self, status, buffer_reader(self, ws.data))
            if status not in self._warned:
                self._warned.add(status)
                warnings.warn(str(failure(self, status, buffer_reader(self, ws.data))) + " (continuing on "
                              "the recorded path: on_change='warn')", GuardWarning, stacklevel=4)  # fmt: skip
            # the interpreter (compiled code runs whole tapes only), in segments around callbacks
            self._interpreter_ready()
            fs = self.callback_sweeps.forward_sweep if self.callbacks else sweeps.forward_sweep
            status = fs(self.entries, self.bufs, self.ipool, ws.data, status + 1, self.n_entries)
        ws.ok = True
        if grad:
            sw, pool = self.run_with
            sw.backward(
                self.entries, self.bufs, pool, ws.data, ws.grad,
                self.n_entries, self.n_bufs, r["roots"], r["seed"], True,
            )  # fmt: skip
        self._tls.active = None
        return self, ws

    def last_replay(self):
        """The tape (this one or a retraced variant) and workspace of this thread's last
        replay."""
        v = getattr(self._tls, "active", None)
        tp = self if v is None else v
        return tp, tp.thread_workspace()

    def forward(self, *args):
        """Replay the recorded computation on new arguments (same shapes as recorded).

        Returns the output(s) as NumPy values (copies, in the dtype the function returned); a
        scalar output comes back as a NumPy scalar.
        """
        f = self._direct_fwd
        if f is not None:  # a compiled tape's forward in one compiled call, from its second
            entry = f[2]  # call on (a forward called once compiles nothing more)
            if entry is None and f[3]:
                entry = f[2] = entry_point(f[0], None, f[1])
            f[3] = True
            got = None if entry is None else self._run_direct(args, entry)
            if got is not None:
                return got[0].outputs_of(got[1])
        tp, ws = self.run_replay(args, False)
        return tp.outputs_of(ws)

    def outputs_of(self, ws):
        """The outputs a replay left in workspace ``ws``, as :meth:`forward` returns them."""
        if self.single_output:  # the common case, without the loop: one output
            v, d = ws.out_views[0], self._replay["out_dtypes"][0]
            if v.ndim == 0:
                return v[()] if v.dtype == d else v.astype(d)[()]
            return v.copy() if v.dtype == d else v.astype(d)
        outs = []
        for v, d in zip(ws.out_views, self._replay["out_dtypes"]):
            v = v.astype(d, copy=True)
            outs.append(v[()] if v.ndim == 0 else v)
        return outs[0] if self.single_output else tuple(outs)

    def backward(self, seed=None):
        """Reverse sweep over this thread's last forward replay, accumulating into
        :attr:`grads`.

        ``seed`` is the adjoint of the output (default 1 for a scalar output; required
        otherwise), or a sequence of them for several outputs.
        """
        self.replay_state()
        tp, ws = self.last_replay()
        if not ws.ok:
            raise RuntimeError(
                "backward: no complete forward replay on this thread to go back through (the "
                "last one raised, or none ran): call forward(*args) first"
            )
        r = tp._replay
        seeds = r["seed"] if seed is None and r["sig"].n_seed == 1 else r["sig"].seeds(seed)
        if _anomaly.enabled():
            if tp.tier == "compiled":  # a compiled forward leaves intermediates unwritten
                tp._interpreter_ready()
                sweeps.forward_sweep(tp.entries, tp.bufs, tp.ipool, ws.data, 0, tp.n_entries)
            _anomaly.backward(tp, ws.data, ws.grad, r["roots"], seeds, False)
            return
        sw, pool = tp.run_with
        if sw is not tp._compiled_ready and not tp._interp_ready:
            tp._kernels_ready(sw)
        sw.backward(
            tp.entries, tp.bufs, pool, ws.data, ws.grad,
            tp.n_entries, tp.n_bufs, r["roots"], seeds, False,
        )  # fmt: skip

    @property
    def grads(self):
        """Accumulated gradients of this thread's replays, one array per differentiated
        argument: views of the adjoint workspace (they change with every backward; copy them to
        keep them), or copies when the argument's dtype differs from the arena's."""
        self.replay_state()
        tp, ws = self.last_replay()
        return [
            v if v.dtype == d else v.astype(d)
            for v, d in zip(ws.grad_views, tp._replay["grad_dtypes"])
        ]

    def zero_grad(self):
        """Zero this thread's accumulated gradients."""
        self.replay_state()
        for tp in [self, *self._variants]:
            if getattr(tp._tls, "ws", None) is not None:
                for v in tp._tls.ws.grad_views:
                    v[...] = 0.0

    def gradient(self, *args, out=None):
        """Gradient of the scalar output at ``args``: zero, forward, backward in one compiled
        call. Returns one array per differentiated argument (a single array if there is one),
        in each argument's recorded dtype, fresh copies unless ``out`` (arrays of the same
        shapes) is given to fill."""
        d = self._direct
        if d is not None and not self._variants and not _anomaly.ON:
            # a compiled tape's common call, inlined: one compiled call (see _run_direct)
            ints, _, one, entry, gshape = d
            if one is not None and len(args) == 1:  # the arguments' checks cost as much as
                a = args[0]  # the sweeps of a small tape: one array's are written out
                ok = type(a) is _ndarray and a.dtype is one[1] and a.ndim == one[0]
            else:
                ok = _direct_ok(args, d)
            if ok:  # (their shapes are checked in the call: tape.compiler.args)
                try:
                    ws = self._tls.ws
                except AttributeError:
                    ws = self.thread_workspace()
                v = ws.grad_views
                if out is None:
                    outs = None
                elif type(out) is _ndarray and out.shape == gshape:
                    outs = out  # one array, of its gradient's shape: the common call
                else:  # checked before anything runs: no replay is half done
                    outs = self._check_out(out, v)
                # (raises only before it writes; one array passed as it is: a call with *args
                # costs more)
                status = entry(ints, ws.arena, a) if one else entry(ints, ws.arena, *args)
                if status == -1:
                    ws.ok = True
                    if outs is None:
                        return v[0].copy() if len(v) == 1 else tuple([g.copy() for g in v])
                    if outs is out:
                        out[...] = v[0]
                        return out
                    for o, g in zip(outs, v):
                        o[...] = g
                    return out
                if status >= 0:  # a guard stopped the sweep
                    ws.ok = False
                    tp, ws = self._recover(status, ws, args, True)
                    return tp._grads_out(ws, out)
                # else an argument is not of its recorded shape: nothing ran, and the checked
                # path below says which
        r = self._replay
        if r is None:
            r = self.replay_state()
        if r["simple"] and out is None and not self._variants and not _anomaly.ON:
            # the common call, inlined (a replay from Python costs little more than the sweep)
            self._n_replays += 1
            if self._n_replays == self.compile_after:
                self._promote()
            ws = getattr(self._tls, "ws", None) or self.thread_workspace()
            ws.ok = False
            self._load_args(ws, args)
            sw, pool = self.run_with
            call = (
                self.entries, self.bufs, pool, ws.data, ws.grad,
                self.n_entries, self.n_bufs, r["roots"], r["seed"], True,
            )  # fmt: skip
            if sw is not self._compiled_ready and not self._interp_ready:
                self._driver_ready(sw, call)
            if self.compile_after_seconds is None:
                status = sw.forward_backward(*call)
            else:  # promotion by time pending: the sweep's time counts
                t0 = _now()
                status = sw.forward_backward(*call)
                self._timed(t0)
            if status < 0:
                ws.ok = True
                v = ws.grad_views
                return v[0].copy() if len(v) == 1 else tuple([g.copy() for g in v])
            tp, ws = self._recover(status, ws, args, True)
            return tp._grads_out(ws, out)
        if r["sig"].n_seed != 1:
            r["sig"].require_scalar()
        tp, ws = self.run_replay(args, True)
        return tp._grads_out(ws, out)

    def fast_workspace(self):
        """This thread's workspace for a short path that loads the arguments and runs the
        sweeps itself in compiled code (the HVP's one call), or ``None`` where the checked
        path must run instead (retraced variants, anomaly mode). It is marked as holding no
        complete forward, so ``backward()`` does not go back through what the short path
        leaves. Part of the replay interface."""
        if self._variants or _anomaly.ON:
            return None
        ws = getattr(self._tls, "ws", None) or self.thread_workspace()
        ws.ok = False
        return ws

    def _run_direct(self, args, forward=None):
        """A compiled tape's replay for :meth:`gradient` in one compiled call (load, zero,
        forward, backward; ``gradient_args`` of :mod:`tape.compiled`), or with ``forward``
        (the entry point of the runtime's ``forward_args_<n>``, :attr:`_direct_fwd`) for
        :meth:`forward` (load, the whole forward): ``(tape, workspace)`` of the tape that ran
        (this one or, after a failed guard, a retraced variant), or ``None`` where the call
        takes the checked path instead (a retraced variant exists, anomaly mode, or
        arguments that are not arrays of the recorded shapes and dtypes)."""
        d = self._direct
        if d is None or self._variants or _anomaly.ON or not _direct_ok(args, d):
            return None
        ws = getattr(self._tls, "ws", None) or self.thread_workspace()
        status = (forward or d[3])(d[0], ws.arena, *args)  # raises only before it writes
        if status == -1:
            ws.ok = True
            return self, ws
        if status < 0:  # an argument is not of its shape: nothing ran
            return None
        ws.ok = False
        return self._recover(status, ws, args, forward is None)

    @staticmethod
    def _check_out(out, views):
        """``out`` of :meth:`gradient` as a list of arrays, one per differentiated argument,
        each of its gradient's shape (a broadcast into a larger array would hide a mistake)."""
        if type(out) is _ndarray and len(views) == 1:
            if out.shape != views[0].shape:
                raise ValueError(f"gradient(out=): an array of shape {views[0].shape} expected, "
                                 f"got {out.shape}")  # fmt: skip
            return (out,)
        outs = [out] if len(views) == 1 and isinstance(out, np.ndarray) else list(out)
        if len(outs) != len(views):
            raise ValueError(f"gradient(out=): {len(views)} arrays expected, got {len(outs)}")
        for k, (o, v) in enumerate(zip(outs, views)):
            if not isinstance(o, np.ndarray) or o.shape != v.shape:
                raise ValueError(f"gradient(out=): array {k} must be an array of shape {v.shape}"
                                 f", got {getattr(o, 'shape', type(o).__name__)}")  # fmt: skip
        return outs

    def _grads_out(self, ws, out):
        views = ws.grad_views
        if out is not None:
            for o, v in zip(self._check_out(out, views), views):
                o[...] = v
            return out
        dts = self._replay["grad_dtypes"]
        if len(views) == 1:
            v = views[0]
            return v.copy() if v.dtype == dts[0] else v.astype(dts[0])
        return tuple([v.copy() if v.dtype == d else v.astype(d) for v, d in zip(views, dts)])

    def value_and_grad(self, *args):
        """``(value, gradient)`` of the scalar output at ``args`` (see :meth:`gradient`)."""
        r = self._replay
        if r is None or r["sig"].n_seed != 1:
            self.replay_state()["sig"].require_scalar("value_and_grad()")
        tp, ws = self._run_direct(args) or self.run_replay(args, True)
        return tp.outputs_of(ws), tp._grads_out(ws, None)

    def gradient_batch(self, *args, n_threads=None):
        """Per-instance values and gradients over a leading batch axis of every argument, in
        parallel on the CPU (:func:`tape.batch.gradient_batch`)."""
        return _EXTENSIONS["gradient_batch"](self, *args, n_threads=n_threads)

    # ------------------------------------------------------------ beyond the gradient
    # (tape.derivatives: forward mode, Jacobians, Hessians, sparse patterns)

    def jvp(self, *args, tangents):
        """``(value, tangent)``: outputs at ``args`` and their derivative along ``tangents``
        (one array per differentiated argument), by forward mode
        (:func:`tape.derivatives.jvp`)."""
        return _EXTENSIONS["derivatives"]().jvp(self, *args, tangents=tangents)

    def vjp(self, *args, cotangent):
        """``(value, grads)``: outputs at ``args`` and ``J^T cotangent``, structured like
        :meth:`gradient` (:func:`tape.derivatives.vjp`)."""
        return _EXTENSIONS["derivatives"]().vjp(self, *args, cotangent=cotangent)

    def jacobian(self, *args, mode="auto", sparse=False):
        """Jacobian at ``args``: ``mode`` ``"auto"``, ``"fwd"`` or ``"rev"``; ``sparse=True``
        gives a ``scipy.sparse.csr_matrix`` by colouring (:func:`tape.derivatives.jacobian`)."""
        return _EXTENSIONS["derivatives"]().jacobian(self, *args, mode=mode, sparse=sparse)

    def hessian(self, *args, sparse=False):
        """Hessian of the scalar output at ``args`` by forward-over-reverse
        (:func:`tape.derivatives.hessian`)."""
        return _EXTENSIONS["derivatives"]().hessian(self, *args, sparse=sparse)

    def hvp(self, *args, v):
        """Hessian-vector product at ``args``, structured like :meth:`gradient`
        (:func:`tape.derivatives.hvp`)."""
        return _EXTENSIONS["derivatives"]().hvp(self, *args, v=v)

    def sparsity(self, *args):
        """Jacobian and Hessian sparsity patterns (:func:`tape.derivatives.sparsity`)."""
        return _EXTENSIONS["derivatives"]().sparsity(self, *args)

    def to(self, device, **kwargs):
        """``"cuda"`` / ``"cuda:N"``: a :class:`tape.cuda.CudaTape` replaying this tape on an
        NVIDIA GPU (values and gradients stay on the device; needs the ``cuda`` extra).
        ``"cpu"``: the tape itself."""
        if str(device) == "cpu":
            return self
        if not str(device).startswith("cuda"):
            raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
        refuse_gpu(self, f"to({str(device)!r})")
        return _EXTENSIONS["to_cuda"](self, device, **kwargs)

    # ------------------------------------------------------------ compiled tier

    def compile(self):
        """Switch this tape's replays to code generated for its structure (:mod:`tape.compiled`):
        units instead of entries, fused elementwise loops, adjoints in registers. Compiles now
        (seconds for a new structure; a structure compiled before, in any process, loads from
        Numba's cache) and returns the tape. Values and gradients are the interpreter's, to
        rounding. Raises :class:`tape.compiled.CompileError` for tapes the tier does not take
        (needing more than ``tape.compiled.MAX_UNIT_KINDS`` kinds of unit)."""
        self.replay_state()
        if self.callbacks and not python_free(self):
            refuse(self, "compile()", CompileError)
        with self._compile_lock:  # one compile, however many threads promote at once
            if self.tier == "interpreter":
                self._compile_now()
        self.compile_after = self.compile_after_seconds = None  # nothing left to promote
        return self

    def _compile_now(self):
        mod, pool = _EXTENSIONS["compile"](self)
        r = self._replay
        self._kernels_ready(mod)  # the interpreter kernels its unfused entries call
        ws = _Workspace(self)  # compile by running once on a scratch workspace
        if r["simple"] and hasattr(mod, "gradient_args"):
            # gradient()'s one-call path; forward_backward (the checked path) compiles when
            # first used: each compiled caller links the sweeps again (seconds for a long tape)
            # the tape's integer arrays become views of one array, which gradient_args takes
            ne, nb = self.n_entries, self.n_bufs
            ints = np.concatenate([self.entries[:ne].ravel(), self.bufs[:nb].ravel(), pool])
            we, wb = self.entries.shape[1], self.bufs.shape[1]
            self.entries = ints[: ne * we].reshape(ne, we)
            self.bufs = ints[ne * we : ne * we + nb * wb].reshape(nb, wb)
            pool = ints[ne * we + nb * wb :]
            args = [np.asarray(v, d).reshape(s) for v, (s, d) in zip(ws.in_views, r["fast"])]
            fast = tuple(r["fast"])
            # called from Python without Numba's dispatch, for arguments of the recorded dtypes
            # and numbers of axes in any layout (see _direct_ok, tape.compiler.args)
            entry = entry_point(mod.gradient_args, args, gradient_signature(self.dtype, fast))
            entry(ints, ws.arena, *args)
            checks = tuple((len(shape), np.dtype(d)) for shape, d in fast)
            one = checks[0] if len(checks) == 1 else None
            gshape = ws.grad_views[0].shape if len(self.wrt) == 1 else None
            self._direct = (ints, checks, one, entry, gshape)
            fwd = getattr(mod, "forward_args", None)  # (the shared runtime's, for n arguments)
            if fwd is not None:
                self._direct_fwd = [fwd, gradient_signature(self.dtype, fast), None, False]
        else:
            mod.forward_backward(
                self.entries, self.bufs, pool, ws.data, ws.grad,
                self.n_entries, self.n_bufs, r["roots"], r["seed"], True,
            )  # fmt: skip
        self.run_with = (mod, pool)

    def _timed(self, t0):
        """A counted replay on the interpreter that started at ``t0`` (``perf_counter``) is
        over: promotion by time (:data:`tape.compiled.AUTO_SECONDS`) once the replays so far
        took :attr:`compile_after_seconds` in all."""
        self._replay_s += _now() - t0
        limit = self.compile_after_seconds
        if (
            limit is not None
            and self._replay_s >= limit
            and self._n_replays >= self.compile_min_replays
            and self.run_with[0] is sweeps
        ):  # fmt: skip
            self._promote(background=True)

    def _promote(self, background=False):
        """Automatic promotion (``tape.record(..., compile="auto")``): compile at the
        ``compile_after``-th replay, or, ``background``, in a thread of its own while replays
        go on on the interpreter (promotion by time: a replay that long runs mostly outside
        Python's lock, so the compile and the replays share the machine). A tape the tier does
        not take stays on the interpreter."""
        if self.callbacks and not python_free(self):
            self.compile_after = self.compile_after_seconds = None
            return  # Python callbacks (autograd.Function) run on the interpreter
        if not self._worth_compiling():
            return
        self.compile_after = self.compile_after_seconds = None
        if background:
            # a daemon: a process that ends meanwhile does not wait for it (Numba writes its
            # cache files whole, so nothing is left half written)
            th = self.compiling = threading.Thread(
                target=self._compile_promoted, name="tape-compile", daemon=True
            )
            th.start()
        else:
            self._compile_promoted()

    def _worth_compiling(self):
        """Whether a promotion rule that fired may compile now: yes where the compile is
        estimated (:attr:`compile_cost`, :func:`tape.compiler.compiled.compile_estimate`,
        made once; ``0`` where Numba's cache holds its code) to cost no more than the replays
        on the interpreter have taken so far. Otherwise the count rule is dropped and
        promotion by time waits until the replays have taken the estimated time. Replays that
        are not timed (promotion by time off, a checkpoint's sub-tape) are not weighed: the
        count rule compiles as it says. A tape the tier does not take is never promoted."""
        spent = self._replay_s
        if spent == 0.0:
            return True
        with self._compile_lock:  # estimated once, however many threads replay
            cost = self.compile_cost
            if cost is None:
                try:
                    cost = self.compile_cost = _EXTENSIONS["compile_estimate"](self)
                except CompileError:
                    self.compile_after = self.compile_after_seconds = None
                    return False
        if cost <= spent:
            return True
        self.compile_after = None
        self.compile_after_seconds = cost
        return False

    def _compile_promoted(self):
        """:meth:`compile` for automatic promotion: a tape the tier does not take stays on the
        interpreter, and a failure becomes a warning (a replay must not fail because
        promotion did)."""
        try:
            self.compile()
        except Exception as e:  # noqa: BLE001  (a replay must not fail because promotion did)
            if not isinstance(e, CompileError):
                warnings.warn(
                    f"tape: compiling this tape failed, it stays on the interpreter ({e!r})",
                    RuntimeWarning, stacklevel=5,
                )  # fmt: skip

    @property
    def tier(self) -> str:
        """``"compiled"`` after :meth:`compile` (or promotion), else ``"interpreter"``."""
        sw = self.run_with[0]
        return "interpreter" if sw is sweeps or isinstance(sw, CallbackSweeps) else "compiled"

    @property
    def compiled_source(self):
        """The generated source of the compiled tier (``None`` on the interpreter)."""
        sw = self.run_with[0]
        return None if sw is sweeps else sw.SOURCE

    @property
    def kernels(self):
        """``forward(ka)``, ``backward(ka)``, ``gradient(ka)`` for ``@njit`` code, of this
        tape's tier: :mod:`tape.kernels` on the interpreter, the compiled module's own once
        compiled (``tape.kernels`` still replays a compiled tape correctly, on the
        interpreter)."""
        sw = self.run_with[0]
        if sw is sweeps:
            from tape.program import kernels

            return kernels
        return _EXTENSIONS["compiled_kernels"](sw)

    @property
    def njit_gradient(self):
        """The gradient as a plain ``@njit`` function of the arguments, ``fn(x0, .., g0, ..,
        work)``: loads ``x0, ..`` (arrays of the recorded shapes), replays in ``work`` and
        writes the gradient of each differentiated argument into ``g0, ..`` (arrays of the
        same shapes). ``work`` is the caller's, from :meth:`njit_workspace`. Call it from your
        own ``@njit`` code, where Numba compiles it into the caller::

            g = t.njit_gradient

            @njit
            def descend(x, lr, steps, work):
                gx = np.empty_like(x)
                for _ in range(steps):
                    g(x, gx, work)
                    x -= lr * gx
                return x

            descend(x, 1e-3, 100, t.njit_workspace())

        One ``work`` per thread (each Python thread, each chunk of a ``prange`` loop, its
        own): the function keeps no state of its own, so calls with their own ``work`` run in
        parallel. ``work``'s type, size and marker (another tape's is refused) and the shapes
        are checked first (``ValueError``); a failed guard raises ``RuntimeError``. Made on
        first use (the tape's own compiled module, whatever :attr:`tier`; not for tapes with
        Python callbacks). An ``@njit(cache=True)`` caller is cached by Numba (see
        :func:`tape.compiled.njit_gradient` for what that means when the tape changes)."""
        return self._njit()[0]

    def njit_workspace(self):
        """A fresh workspace for :attr:`njit_gradient` (``fn(x0, .., g0, .., work)``): a 1-D
        array of the tape's dtype, the value arena (with the tape's constants), the adjoint
        arena and a marker of this tape, owned by the caller. One per thread; do not write
        into it."""
        return self._njit()[1].copy()

    def _njit(self):
        """``(fn, work)``: :attr:`njit_gradient` and the workspace it copies, made once."""
        st = self.extensions()
        fw = st.get("njit_gradient")
        if fw is None:
            self.replay_state()
            if self.callbacks and not python_free(self):
                refuse(self, "njit_gradient", CompileError)
            with self._compile_lock:
                fw = st.get("njit_gradient")
                if fw is None:
                    fw = st["njit_gradient"] = _EXTENSIONS["njit_gradient"](self)
        return fw

    def is_guard(self, status) -> bool:
        """Whether a sweep status (the entry index a sweep stopped at, as returned by
        ``tape.sweeps.forward_backward``) is a failed guard: the replay's arguments would take
        another path than the recorded one (see ``docs/guides/replay_safety.md``)."""
        return stopped_by_guard(self, int(status))

    def kernel_args(self) -> KernelArgs:
        """The tape's program and this thread's default workspace, as the compiled sweeps take
        them (see :class:`KernelArgs`). The arenas are the ones :meth:`forward`,
        :meth:`gradient` and :attr:`grads` use on this thread: writes are seen by both. Use
        :meth:`workspace` for arenas of your own."""
        r = self.replay_state()
        self._interpreter_ready()  # tape.kernels replays any tape on the interpreter
        ws = self.thread_workspace()
        return KernelArgs(
            self.entries, self.bufs, self.run_with[1], ws.data, ws.grad,
            self.n_entries, self.n_bufs, r["roots"], r["seed"],
        )  # fmt: skip

    def input_slice(self, k):
        """``(offset, size)`` of argument ``k`` in the value arena (and the adjoint arena)."""
        b = self.inputs[k]
        return int(self.bufs[b, B_OFF]), int(self.bufs[b, B_SIZE])

    def output_slice(self, k=0):
        """``(offset, size)`` of output ``k`` in the value arena."""
        b = self.outputs[k]
        return int(self.bufs[b, B_OFF]), int(self.bufs[b, B_SIZE])

    # ------------------------------------------------------------ inspection

    def __len__(self):
        return self.n_entries

    @property
    def nbytes(self) -> int:
        """Bytes in use by the tape's arrays (entries, buffers, pool, value arena, and the
        adjoint arena of an eager tape); each replay workspace adds a value and an adjoint
        arena of ``n_data`` elements per thread."""
        item = self.dtype.itemsize
        return 8 * (
            self.n_entries * ENTRY_COLS + self.n_bufs * BUF_COLS + self.n_ipool
        ) + item * self.n_data * (2 if self.grad is not None else 1)

    def __repr__(self):
        return (
            f"<Tape {self.n_entries} entries, {self.n_bufs} buffers, {self.dtype}, "
            f"{self.nbytes / 1024:.1f} KiB>"
        )

    def __str__(self):
        kinds = {CONST: "const", ACTIVE: "active", LEAF: "grad"}
        lines = [repr(self)]
        for k, b in enumerate(self.inputs):
            lines.append(
                f"  input {k} {self.input_names[k]}: %{b} {self.shapes[b]} {kinds[self.bufs[b, B_KIND]]}"
            )
        guards = []
        for i in range(self.n_entries):
            e = self.entries[i]
            ins = ", ".join(f"%{b}" for b in e[E_IN0 : E_IN0 + 3] if b >= 0)
            name = entry_name(self, i)
            src = self.sources.get(i)
            line = f"  {i:4d}  %{e[E_OUT]:<4d} {str(self.shapes[e[E_OUT]]):<12} = {name}({ins})"
            lines.append(f"{line:<60}  # {src}" if src else line)
            if is_guard(self, i):
                guards.append(i)
        if self.outputs:
            lines.append("  outputs: " + ", ".join(f"%{b} {self.shapes[b]}" for b in self.outputs))
        if guards:
            from tape.ops.guard import MODES

            lines.append(f"  guards ({len(guards)}; on_change={self.on_change!r}):")
            for i in guards:
                mode = MODES[int(self.ipool[self.entries[i, E_ATTR]])]
                lines.append(
                    f"    entry {i}: {mode} of %{self.entries[i, E_IN0]} at {self.sources.get(i, '?')}"
                )
        return "\n".join(lines)

    def to_dot(self, file=None, max_entries=5000) -> str:
        """Graphviz source of the Wengert list: entries (op, shape, source line), arguments,
        constants, guards and outputs (see :mod:`tape.program.dot`). Written to ``file`` (a path)
        when given; returned either way. Render with ``dot -Tsvg tape.dot -o tape.svg``."""
        from tape.program.dot import to_dot

        src = to_dot(self, max_entries)
        if file is not None:
            with open(file, "w") as f:
                f.write(src)
        return src

    # ------------------------------------------------------------ persistence

    def _state(self):
        if self._merged is not None:
            raise RuntimeError("this tape was merged into another one")
        refuse(self, "saving or pickling")
        ops = sorted({int(c) for c in self.entries[: self.n_entries, E_OP]})
        meta = dict(
            version=FORMAT_VERSION,
            dtype=self.dtype.str,
            inputs=self.inputs,
            input_names=self.input_names,
            input_dtypes=[np.dtype(d).str for d in self.input_dtypes],
            wrt=self.wrt,
            outputs=self.outputs,
            out_single=self.single_output,
            shapes=[list(s) for s in self.shapes],
            op_names={str(c): registry.OPS[c].name for c in ops},
            output_dtypes=[np.dtype(d).str for d in self.output_dtypes],
            sources={str(i): src for i, src in self.sources.items()},
            on_change=self.on_change,
        )
        return dict(
            entries=self.entries[: self.n_entries].copy(),
            bufs=self.bufs[: self.n_bufs].copy(),
            ipool=self.ipool[: self.n_ipool].copy(),
            data=self.data[: self.n_data].copy(),
            meta=json.dumps(meta),
        )

    @classmethod
    def _from_state(cls, st):
        """A tape from the arrays and metadata :meth:`_state` makes. Tape files and pickles
        are untrusted input: anything malformed raises ``ValueError`` before compiled code
        sees the tape (:mod:`tape.ops.validate`)."""
        from tape.ops.validate import check_state, malformed

        with malformed():
            check_state(st, FORMAT_VERSION)
            return cls._parse_state(st)

    @classmethod
    def _parse_state(cls, st):
        meta = json.loads(str(st["meta"]))
        if meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported tape format version {meta.get('version')}")
        t = cls(np.dtype(meta["dtype"]))
        entries = np.array(st["entries"], np.int64).reshape(-1, ENTRY_COLS)
        # op codes are stored by name: a tape saved by another version of the registry still loads
        for name in meta["op_names"].values():
            if name not in registry.BY_NAME:
                raise ValueError(
                    f"the saved tape uses op {name!r}, which this version of tape does not have"
                )
        remap = {int(c): registry.BY_NAME[n].code for c, n in meta["op_names"].items()}
        if len(entries):
            entries[:, E_OP] = [remap[int(c)] for c in entries[:, E_OP]]
        t.entries, t.n_entries = np.ascontiguousarray(entries), len(entries)
        t.bufs = np.array(st["bufs"], np.int64).reshape(-1, BUF_COLS)
        t.n_bufs = len(t.bufs)
        t.ipool = np.array(st["ipool"], np.int64)
        t.n_ipool = len(t.ipool)
        t.data = np.array(st["data"], t.dtype)
        t.n_data = len(t.data)
        t.shapes = [tuple(s) for s in meta["shapes"]]
        t.inputs, t.input_names, t.wrt, t.outputs = (
            meta["inputs"],
            meta["input_names"],
            meta["wrt"],
            meta["outputs"],
        )
        t.input_dtypes = [np.dtype(d) for d in meta["input_dtypes"]]
        t.single_output = meta["out_single"]
        _load_optional_meta(t, meta)
        from tape.ops.validate import check_tape

        check_tape(t)
        return t

    def __getstate__(self):
        return self._state()

    def __setstate__(self, st):
        self.__dict__.update(Tape._from_state(st).__dict__)

    def save(self, file):
        """Save to a ``.npz`` file (path or file object). Reload with :func:`tape.load`."""
        np.savez(file, **self._state())

    @classmethod
    def load(cls, file):
        """Load a tape saved with :meth:`save`."""
        if isinstance(file, (bytes, bytearray)):
            file = io.BytesIO(file)
        from tape.ops.validate import malformed

        with malformed(), np.load(file, allow_pickle=False) as z:  # a broken archive: ValueError
            st = {k: z[k] for k in z.files}
        return cls._from_state(st)


def _load_optional_meta(t, meta):
    """Meta keys a tape file may lack (older files): source lines, output dtypes, policy."""
    try:
        t.output_dtypes = [np.dtype(str(d)) for d in meta.get("output_dtypes", [])]
        srcs = meta.get("sources", {})
        t.sources = {int(i): str(v) for i, v in srcs.items()} if isinstance(srcs, dict) else {}
        on_change = meta.get("on_change", "retrace")
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"corrupt tape file: bad optional metadata ({e})") from None
    if on_change not in ("retrace", "raise", "warn"):
        raise ValueError(f"corrupt tape file: on_change={on_change!r}")
    if t.output_dtypes and (
        len(t.output_dtypes) != len(t.outputs) or any(d.kind not in "biuf" for d in t.output_dtypes)
    ):
        raise ValueError("corrupt tape file: output_dtypes does not match the outputs")
    t.on_change = on_change


def resolve(tape, buf):
    """Follow merges: the live tape holding ``buf`` and its index there."""
    while tape._merged is not None:
        tape, shift = tape._merged
        buf += shift
    return tape, buf


def load(file) -> Tape:
    """Load a tape saved with :meth:`Tape.save`."""
    return Tape.load(file)
