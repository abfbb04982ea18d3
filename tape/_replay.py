"""The replay signature of a recorded tape, shared by every replay: CPU (:mod:`tape.core`),
batched CPU (:mod:`tape.batch`) and GPU (:mod:`tape.cuda`).

One place checks and coerces arguments, parses output seeds, and turns a sweep's status (the
index of the entry that stopped it) into the exception the user sees, so the three replays
accept the same arguments and fail with the same messages.

This module imports nothing of the tensor front end.
"""

from __future__ import annotations

import numpy as np

from tape import registry
from tape._layout import B_OFF, B_SIZE, E_ATTR, E_IN0, E_IN1, E_OP


class ReplayError(ValueError):
    """Raised when replay arguments do not match the recorded signature."""


class GuardError(RuntimeError):
    """A replay would have taken another path than the recorded one.

    Raised (with ``on_change="raise"``, or for a tape that cannot retrace) when a guard fails:
    a value that left the tape during recording (a Python ``if`` on a tensor, ``float(x)``,
    ``x.item()``, ``np.asarray(x)``) differs at the new arguments. Attributes: ``entry`` (the
    guard's entry index), ``source`` (``file:line`` of the user's code that made it).
    """

    def __init__(self, msg, entry=-1, source=""):
        super().__init__(msg)
        self.entry = entry
        self.source = source


def _plural(n, word):
    return f"{n} {word}{'s' * (n != 1)}"


class Signature:
    """Argument names, shapes and dtypes, differentiated positions and outputs of a tape.

    Attributes
    ----------
    names : list of str
    shapes : list of tuple
        Shape of each argument.
    dtypes : list of numpy.dtype
        Dtype each argument was recorded with.
    wrt : list of int
        Differentiated argument positions.
    out_shapes : list of tuple
    out_single : bool
        The function returned one tensor (not a tuple).
    dtype : numpy.dtype
        The arena dtype.
    """

    def __init__(self, t):
        self.names = list(t.input_names)
        self.shapes = [t.shapes[b] for b in t.inputs]
        self.dtypes = [np.dtype(d) for d in t.input_dtypes]
        self.wrt = list(t.wrt)
        self.out_shapes = [t.shapes[b] for b in t.outputs]
        self.out_single = t._out_single
        self.dtype = t.dtype
        self.n_seed = int(sum(int(t.bufs[b, B_SIZE]) for b in t.outputs))

    def _name(self, k):
        return f"argument {k} ({self.names[k]})"

    def check_count(self, args, batched=False):
        n = len(self.shapes)
        if len(args) != n:
            extra = ", each with a leading batch axis;" if batched else ","
            raise ReplayError(
                f"this tape takes {_plural(n, 'argument')} ({', '.join(self.names)}){extra} "
                f"got {len(args)}"
            )

    def coerce(self, k, a):
        """``a`` as a NumPy array (tensors and lists are converted), not yet checked."""
        if type(a) is np.ndarray:
            return a
        try:
            a = np.asarray(a)
        except Exception as e:  # noqa: BLE001  (ragged lists and the like)
            raise ReplayError(f"{self._name(k)}: not numeric data ({e})") from None
        return a

    def check_dtype(self, k, dt):
        want = self.dtypes[k]
        ok = dt.kind in "biuf" and (want.kind not in "iub" or dt.kind in "iub")
        if dt != want and not ok:
            raise ReplayError(
                f"{self._name(k)}: cannot use values of dtype {dt} for an input recorded as {want}"
            )

    def check_arg(self, k, a):
        """Argument ``k`` as a checked NumPy array of the recorded shape."""
        a = self.coerce(k, a)
        if a.shape != self.shapes[k]:
            raise ReplayError(f"{self._name(k)}: expected shape {self.shapes[k]}, got {a.shape}")
        self.check_dtype(k, a.dtype)
        return a

    def check_args(self, args):
        self.check_count(args)
        return [self.check_arg(k, a) for k, a in enumerate(args)]

    def check_batch(self, args):
        """Arguments with a leading batch axis: ``(batch, [arrays])``."""
        self.check_count(args, batched=True)
        out = []
        batch = None
        for k, a in enumerate(args):
            a = self.coerce(k, a)
            shape = self.shapes[k]
            if a.ndim != len(shape) + 1 or a.shape[1:] != shape:
                want = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")
                raise ReplayError(f"{self._name(k)}: expected shape (batch, {want}), got {a.shape}")
            if batch is None:
                batch = a.shape[0]
            elif a.shape[0] != batch:
                raise ReplayError(
                    f"{self._name(k)}: batch size {a.shape[0]} differs from argument 0's {batch}"
                )
            self.check_dtype(k, a.dtype)
            out.append(a)
        if batch is None:
            raise ReplayError("batched replay needs at least one argument (it sets the batch size)")
        return batch, out

    def seeds(self, seed):
        """The output adjoints, concatenated into one flat array of the arena dtype."""
        if seed is None:
            if self.n_seed != 1:
                raise RuntimeError(
                    f"backward: the output is not a scalar (shapes {self.out_shapes}); pass "
                    "seed= with the output's shape"
                )
            return np.ones(1, self.dtype)
        seeds = [seed] if self.out_single else list(seed)
        if len(seeds) != len(self.out_shapes):
            raise ValueError(f"backward: expected {len(self.out_shapes)} seeds, got {len(seeds)}")
        flat = []
        for shape, s in zip(self.out_shapes, seeds):
            s = np.asarray(s, self.dtype)
            if s.shape != shape:
                raise ValueError(
                    f"backward: seed of shape {s.shape} for an output of shape {shape}"
                )
            flat.append(s.ravel())
        return np.concatenate(flat) if flat else np.zeros(0, self.dtype)

    def require_scalar(self, what="gradient()"):
        if self.n_seed != 1:
            raise RuntimeError(
                f"{what} needs a scalar output (this tape returns shapes {self.out_shapes}); use "
                "forward() and backward(seed=...)"
            )


# ---------------------------------------------------------------- failures

GUARD = registry.BY_NAME["guard"].code
TAKE = registry.BY_NAME["take"].code


def is_guard(t, i) -> bool:
    """Whether entry ``i`` of ``t`` is a guard (a failed status there means another path)."""
    return 0 <= i < t.n_entries and t.entries[i, E_OP] == GUARD


def failure(t, i, read, instance=None):
    """The exception for a sweep stopped at entry ``i``: :class:`GuardError` for a guard,
    ``IndexError`` for a gather index out of bounds. ``read(b)`` returns buffer ``b``'s flat
    values in the arena the sweep ran on (host or device)."""
    where = "" if instance is None else f"instance {instance}: "
    op = t.entries[i, E_OP]
    src = t.sources.get(i, "")
    at = f" at {src}" if src else ""
    if op == GUARD:
        from tape.ops.guard import MODES

        mode = int(t.ipool[t.entries[i, E_ATTR]])
        b = int(t.entries[i, E_IN0])
        made_by = _producer(t, b, i)
        now = np.asarray(read(b))
        was = np.asarray(read(int(t.entries[i, E_IN1])))
        return GuardError(
            f"{where}guard at entry {i} ({MODES[mode]} of %{b}, made by {made_by}) recorded{at}: "
            f"recorded {_short(was)}, now {_short(now)}. The recorded tape follows another path "
            "here; retrace (on_change='retrace'), or make the choice with tape.where",
            entry=i,
            source=src,
        )
    name = registry.OPS[op].name
    if op == TAKE:
        rows = int(t.ipool[t.entries[i, E_ATTR]])
        idx = np.asarray(read(int(t.entries[i, E_IN1]))).ravel()
        bad = [v for v in idx if v != v or v != int(v) or not -rows <= v < rows]
        if bad:
            return IndexError(
                f"{where}entry {i} (take){at}: index {bad[0]:g} is out of bounds for an axis of "
                f"size {rows} (indices are checked at every replay)"
            )
    return IndexError(f"{where}entry {i} ({name}){at} rejected its input data")


def _producer(t, b, before):
    """The op that wrote buffer ``b`` (or its alias root), for messages."""
    root = int(t.bufs[b, 5]) if t.bufs[b, 5] >= 0 else b
    for j in range(before - 1, -1, -1):
        out = int(t.entries[j, 4])
        if out == b or out == root:
            return f"{registry.OPS[t.entries[j, E_OP]].name} at entry {j}"
    if b in t.inputs:
        return f"argument {t.inputs.index(b)}"
    return "a constant"


def _short(a):
    a = np.asarray(a)
    if a.size == 1:
        return f"{a.reshape(()).item():.17g}"
    return np.array2string(a.ravel(), threshold=6, precision=6)


def buffer_reader(t, data):
    """``read(b)`` over a host arena ``data`` laid out as ``t``'s."""

    def read(b):
        o, n = int(t.bufs[b, B_OFF]), int(t.bufs[b, B_SIZE])
        return data[o : o + n]

    return read
