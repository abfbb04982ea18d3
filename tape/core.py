"""The tape: a Wengert list in five flat arrays, and its replay API.

The same class serves eager mode (each op appends an entry and runs the forward sweep over just
that entry) and record-once/replay-many mode (:func:`tape.record` traces a function into a
tape; :meth:`Tape.forward`, :meth:`Tape.backward` and :meth:`Tape.gradient` replay it). The
array layout is described in :mod:`tape._layout`.
"""

from __future__ import annotations

import io
import json
import math
from typing import NamedTuple

import numpy as np

from tape import registry
from tape._generated import sweeps as S
from tape._layout import (
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

FORMAT_VERSION = 1


class KernelArgs(NamedTuple):
    """What the compiled sweeps take, for calling them from your own ``@njit`` code::

        ka = t.kernel_args()
        tape.sweeps.forward_backward(*ka, True)  # zero, forward, backward; grads in ka.grad

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
    new = np.full((max(n, 2 * cap),) + a.shape[1:], fill, a.dtype)
    new[:cap] = a
    return new


class ReplayError(ValueError):
    """Raised when replay arguments do not match the recorded signature."""


class Tape:
    """A recorded computation: a Wengert list over a flat value arena and adjoint arena.

    Attributes
    ----------
    entries, bufs, ipool : int64 arrays
        The Wengert list, the buffer table and the integer pool (see :mod:`tape._layout`).
        Only the first ``n_entries`` / ``n_bufs`` / ``n_ipool`` rows are in use.
    data, grad : float arrays
        Value arena and adjoint arena (``grad`` is allocated by the first reverse sweep).
    dtype : numpy.dtype
        ``float64`` (default) or ``float32``.
    """

    def __init__(self, dtype=np.float64):
        self.dtype = np.dtype(dtype)
        self.entries = np.empty((8, ENTRY_COLS), np.int64)
        self.bufs = np.empty((16, BUF_COLS), np.int64)
        self.ipool = np.empty(64, np.int64)
        self.data = np.empty(64, self.dtype)
        self.grad = None
        self.n_entries = self.n_bufs = self.n_ipool = self.n_data = 0
        self.shapes: list[tuple] = []  # Python copy of each buffer's shape (hot path reads it)
        self._interned: dict[tuple, int] = {}  # int block (shape, attributes) -> ipool position
        self._consts: dict = {}  # Python number -> its read-only CONST buffer
        self.leaf_bufs: dict[int, int] = {}  # id(leaf tensor) -> its buffer in this tape
        self.leaves: list = []  # [(leaf tensor, buffer)] of eager leaves copied in
        self.recording = False
        self.closed = False  # set by an eager backward: new leaf expressions start elsewhere
        self._merged = None  # (tape, buffer shift) once merged into another tape
        # replay signature (set by tape.record)
        self.inputs: list[int] = []
        self.input_names: list[str] = []
        self.input_dtypes: list = []
        self.wrt: list[int] = []
        self.outputs: list[int] = []
        self._out_single = True
        self._replay = None

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
        key = tuple(ints)
        p = self._interned.get(key)
        if p is None:
            p = self._interned[key] = self._push_ints(key) if key else 0
        return p

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
        if value is not None:
            if size == 1 and not isinstance(value, np.ndarray):
                self.data[off] = value
            else:
                self.data[off:end] = np.ravel(value)
        return self._add_buf(off, size, shape, kind, -1)

    def _add_buf(self, off, size, shape, kind, alias) -> int:
        b = self.n_bufs
        if b >= self.bufs.shape[0]:
            self.bufs = _grow(self.bufs, b + 1)
        self.bufs[b] = (off, size, len(shape), self.intern(shape), kind, alias)
        self.shapes.append(shape)
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
        sp = self.intern(shape)
        p = self.intern(attr) if attr is not None else -1
        n = len(ins)
        status = S.emit(
            self.entries, self.bufs, self.ipool, self.data, i, b, off, size, len(shape), sp, kind,
            code, ins[0] if n > 0 else -1, ins[1] if n > 1 else -1, ins[2] if n > 2 else -1, p,
        )  # fmt: skip
        self.n_data = off + size
        self.n_bufs = b + 1
        self.n_entries = i + 1
        self.shapes.append(shape)
        if status >= 0:
            raise IndexError(self._describe_failure(status))
        return b

    def run_forward(self, start, stop):
        status = S.forward_sweep(self.entries, self.bufs, self.ipool, self.data, start, stop)
        if status >= 0:
            raise IndexError(self._describe_failure(status))

    def _describe_failure(self, i):
        op = registry.OPS[self.entries[i, E_OP]].name
        if op == "take":
            rows = self.ipool[self.entries[i, E_ATTR]]
            idx = self.value(self.entries[i, E_IN0 + 1]).ravel()
            bad = [v for v in idx if v != int(v) or not -rows <= v < rows]
            return (
                f"entry {i} (take): index {bad[0]:g} is out of bounds for an axis of size {rows}"
                " (indices are checked at every replay)"
            )
        return f"entry {i} ({op}) rejected its input data"

    def value(self, b):
        """The current value of buffer ``b`` as a view of the arena (shape restored)."""
        off, size = self.bufs[b, B_OFF], self.bufs[b, B_SIZE]
        return self.data[off : off + size].reshape(self.shapes[b])

    def adjoint(self, b):
        off, size = self.bufs[b, B_OFF], self.bufs[b, B_SIZE]
        return self.grad[off : off + size].reshape(self.shapes[b])

    def ensure_grad(self):
        n = self.data.shape[0]
        if self.grad is None or self.grad.shape[0] != n or self.grad.dtype != self.dtype:
            new = np.zeros(n, self.dtype)
            if self.grad is not None:
                m = min(n, self.grad.shape[0])
                new[:m] = self.grad[:m]
            self.grad = new

    def run_backward(self, roots, seeds, zero_leaves):
        """Reverse sweep from ``roots`` (buffer ids) seeded with ``seeds`` (concatenated).
        Returns the mask of buffers the roots depend on."""
        self.ensure_grad()
        return S.backward(
            self.entries,
            self.bufs,
            self.ipool,
            self.data,
            self.grad,
            self.n_entries,
            self.n_bufs,
            np.asarray(roots, np.int64),
            np.ascontiguousarray(seeds, self.dtype).ravel(),
            zero_leaves,
        )

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
        for leaf, b in other.leaves:
            self.leaves.append((leaf, b + nb))
            self.leaf_bufs.setdefault(id(leaf), b + nb)
        other._merged = (self, nb)
        other.entries = other.bufs = other.ipool = other.data = other.grad = None
        other.leaves, other.leaf_bufs, other.shapes = [], {}, []
        return nb

    # ------------------------------------------------------------ replay

    def _check_replay(self):
        if not self.inputs and not self.outputs:
            raise RuntimeError(
                "this tape was not made by tape.record(); replay methods need a recorded "
                "signature (inputs and outputs)"
            )
        if self._replay is None:
            self._prepare_replay()

    def _prepare_replay(self):
        self.ensure_grad()
        views = [self.value(b) for b in self.inputs]
        self._replay = dict(
            in_views=views,
            out_views=[self.value(b) for b in self.outputs],
            grad_views=[self.adjoint(self.inputs[k]) for k in self.wrt],
            roots=np.asarray(self.outputs, np.int64),
            seed=np.ones(sum(int(self.bufs[b, B_SIZE]) for b in self.outputs), self.dtype),
            fast=[(v.shape, np.dtype(d)) for v, d in zip(views, self.input_dtypes)],
        )

    def _load_args(self, args):
        r = self._replay
        views = r["in_views"]
        if len(args) != len(views):
            n = len(views)
            raise ReplayError(f"this tape takes {n} argument{'s' * (n != 1)} ({', '.join(self.input_names)}), got {len(args)}")
        fast = r["fast"]  # (shape, dtype) per input: arrays that match need no checks
        for k in range(len(views)):
            a = args[k]
            if type(a) is not np.ndarray or (a.shape, a.dtype) != fast[k]:
                a = self._check_arg(k, a, views[k])
            views[k][...] = a

    def _check_arg(self, k, a, view):
        if type(a) is not np.ndarray:
            a = self._coerce(k, a)
        if a.shape != view.shape:
            raise ReplayError(f"argument {k} ({self.input_names[k]}): expected shape {view.shape}, got {a.shape}")
        if a.dtype != self.input_dtypes[k] and not self._castable(k, a.dtype):
            raise ReplayError(
                f"argument {k} ({self.input_names[k]}): cannot use values of dtype {a.dtype} "
                f"for an input recorded as {self.input_dtypes[k]}"
            )
        return a

    def _coerce(self, k, a):
        from tape._tensor import Tensor

        if isinstance(a, Tensor):
            a = a.numpy()
        try:
            a = np.asarray(a)
        except Exception as e:  # noqa: BLE001  (ragged lists and the like)
            raise ReplayError(f"argument {k} ({self.input_names[k]}): not numeric data ({e})") from None
        return a

    def _castable(self, k, dt):
        want = np.dtype(self.input_dtypes[k])
        if dt.kind not in "biuf":
            return False
        if want.kind in "iub":
            return dt.kind in "iub"
        return True

    def forward(self, *args):
        """Replay the recorded computation on new arguments (same shapes as recorded).

        Returns the output(s) as NumPy values (copies); a scalar output comes back as a NumPy
        scalar.
        """
        self._check_replay()
        self._load_args(args)
        self.run_forward(0, self.n_entries)
        return self._outputs()

    def _outputs(self):
        outs = [v.copy()[()] if v.ndim == 0 else v.copy() for v in self._replay["out_views"]]
        return outs[0] if self._out_single else tuple(outs)

    def backward(self, seed=None):
        """Reverse sweep over the last forward replay, accumulating into :attr:`grads`.

        ``seed`` is the adjoint of the output (default 1 for a scalar output; required
        otherwise), or a sequence of them for several outputs.
        """
        self._check_replay()
        self.run_backward(self._replay["roots"], self._seed(seed), zero_leaves=False)

    def _seed(self, seed):
        if seed is None:
            if self._replay["seed"].shape[0] != 1:
                shapes = [self.shapes[b] for b in self.outputs]
                raise RuntimeError(
                    f"backward: the output is not a scalar (shapes {shapes}); pass seed= with the output's shape"
                )
            return self._replay["seed"]
        seeds = [seed] if self._out_single else list(seed)
        if len(seeds) != len(self.outputs):
            raise ValueError(f"backward: expected {len(self.outputs)} seeds, got {len(seeds)}")
        flat = []
        for b, s in zip(self.outputs, seeds):
            s = np.asarray(s, self.dtype)
            if s.shape != self.shapes[b]:
                raise ValueError(f"backward: seed of shape {s.shape} for an output of shape {self.shapes[b]}")
            flat.append(s.ravel())
        return np.concatenate(flat) if flat else np.zeros(0, self.dtype)

    @property
    def grads(self):
        """Accumulated gradients, one array per differentiated argument: views of the adjoint
        arena (they change with every backward; copy them to keep them)."""
        self._check_replay()
        return list(self._replay["grad_views"])

    def zero_grad(self):
        """Zero the accumulated gradients."""
        self._check_replay()
        for v in self._replay["grad_views"]:
            v[...] = 0.0

    def gradient(self, *args, out=None):
        """Gradient of the scalar output at ``args``: zero, forward, backward in one compiled
        call. Returns one array per differentiated argument (a single array if there is one),
        fresh copies unless ``out`` (arrays of the same shapes) is given to fill."""
        r = self._replay
        if r is None:
            self._check_replay()
            r = self._replay
        if r["seed"].shape[0] != 1:
            raise RuntimeError("gradient() needs a scalar output; use forward() and backward(seed=...)")
        self._load_args(args)
        status = S.forward_backward(
            self.entries, self.bufs, self.ipool, self.data, self.grad,
            self.n_entries, self.n_bufs, r["roots"], r["seed"], True,
        )  # fmt: skip
        if status >= 0:
            raise IndexError(self._describe_failure(status))
        views = r["grad_views"]
        if out is not None:
            outs = [out] if len(views) == 1 and isinstance(out, np.ndarray) else list(out)
            for o, v in zip(outs, views):
                o[...] = v
            return out
        if len(views) == 1:
            return views[0].copy()
        return tuple([v.copy() for v in views])

    def value_and_grad(self, *args):
        """``(value, gradient)`` of the scalar output at ``args`` (see :meth:`gradient`)."""
        g = self.gradient(*args)
        return self._outputs(), g

    def gradient_batch(self, *args, n_threads=None):
        """Per-instance values and gradients over a leading batch axis of every argument, in
        parallel on the CPU (:func:`tape.batch.gradient_batch`)."""
        from tape.batch import gradient_batch

        return gradient_batch(self, *args, n_threads=n_threads)

    def to(self, device, **kwargs):
        """``"cuda"`` / ``"cuda:N"``: a :class:`tape.cuda.CudaTape` replaying this tape on an
        NVIDIA GPU (values and gradients stay on the device; needs the ``cuda`` extra).
        ``"cpu"``: the tape itself."""
        if str(device) == "cpu":
            return self
        from tape.cuda import to_device

        return to_device(self, device, **kwargs)

    def kernel_args(self) -> KernelArgs:
        """The tape's arrays and counts as the compiled sweeps take them (see
        :class:`KernelArgs`). The arrays are the tape's own: writes are seen by both."""
        self._check_replay()
        r = self._replay
        return KernelArgs(
            self.entries, self.bufs, self.ipool, self.data, self.grad,
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
        """Bytes in use by the tape's arrays (entries, buffers, pool, value and adjoint arenas)."""
        item = self.dtype.itemsize
        return (
            8 * (self.n_entries * ENTRY_COLS + self.n_bufs * BUF_COLS + self.n_ipool)
            + item * self.n_data * (2 if self.grad is not None else 1)
        )

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
        for i in range(self.n_entries):
            e = self.entries[i]
            ins = ", ".join(f"%{b}" for b in e[E_IN0 : E_IN0 + 3] if b >= 0)
            name = registry.OPS[e[E_OP]].name
            lines.append(f"  {i:4d}  %{e[E_OUT]:<4d} {str(self.shapes[e[E_OUT]]):<12} = {name}({ins})")
        if self.outputs:
            lines.append("  outputs: " + ", ".join(f"%{b} {self.shapes[b]}" for b in self.outputs))
        return "\n".join(lines)

    # ------------------------------------------------------------ persistence

    def _state(self):
        if self._merged is not None:
            raise RuntimeError("this tape was merged into another one")
        ops = sorted({int(c) for c in self.entries[: self.n_entries, E_OP]})
        meta = dict(
            version=FORMAT_VERSION,
            dtype=self.dtype.str,
            inputs=self.inputs,
            input_names=self.input_names,
            input_dtypes=[np.dtype(d).str for d in self.input_dtypes],
            wrt=self.wrt,
            outputs=self.outputs,
            out_single=self._out_single,
            shapes=[list(s) for s in self.shapes],
            op_names={str(c): registry.OPS[c].name for c in ops},
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
        meta = json.loads(str(st["meta"]))
        if meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported tape format version {meta.get('version')}")
        t = cls(np.dtype(meta["dtype"]))
        entries = np.array(st["entries"], np.int64).reshape(-1, ENTRY_COLS)
        # op codes are stored by name: a tape saved by another version of the registry still loads
        for name in meta["op_names"].values():
            if name not in registry.BY_NAME:
                raise ValueError(f"the saved tape uses op {name!r}, which this version of tape does not have")
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
        t.inputs, t.input_names, t.wrt, t.outputs = meta["inputs"], meta["input_names"], meta["wrt"], meta["outputs"]
        t.input_dtypes = [np.dtype(d) for d in meta["input_dtypes"]]
        t._out_single = meta["out_single"]
        from tape._validate import check_tape

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
        with np.load(file, allow_pickle=False) as z:
            return cls._from_state({k: z[k] for k in z.files})


def resolve(tape, buf):
    """Follow merges: the live tape holding ``buf`` and its index there."""
    while tape._merged is not None:
        tape, shift = tape._merged
        buf += shift
    return tape, buf


def load(file) -> Tape:
    """Load a tape saved with :meth:`Tape.save`."""
    return Tape.load(file)
