"""The replay signature of a recorded tape, shared by every replay: CPU (:mod:`tape.core`),
batched CPU (:mod:`tape.batch`) and GPU (:mod:`tape.cuda`).

One place checks and coerces arguments, parses output seeds, and turns a sweep's status (the
index of the entry that stopped it) into the exception the user sees, so the three replays
accept the same arguments and fail with the same messages.

This module imports nothing of the tensor front end.
"""

from __future__ import annotations

import numpy as np

from tape.interpreter.generated import sweeps
from tape.layout.columns import B_SIZE, E_OP
from tape.ops import registry


class ReplayError(ValueError):
    """Raised when replay arguments do not match the recorded signature."""


class CompileError(RuntimeError):
    """A tape cannot be compiled (too many kinds of unit, Python callbacks, or not a recorded
    tape); raised by :meth:`tape.Tape.compile` (:mod:`tape.compiled`)."""


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
        self.out_single = t.single_output
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


def is_guard(t, i) -> bool:
    """Whether entry ``i`` of ``t`` is a guard (a failed status there means another path)."""
    return (
        0 <= i < t.n_entries and t.entries[i, E_OP] >= 0 and registry.OPS[t.entries[i, E_OP]].guard
    )


def stopped_by_guard(t, i) -> bool:
    """Whether a sweep of ``t`` that stopped at entry ``i`` met another path: a guard of
    ``t``, or one inside a :func:`tape.checkpoint` (the callback group it stopped at)."""
    if 0 <= i < t.n_entries and t.entries[i, E_OP] < 0:
        from tape.program.callbacks import failed_guard

        return failed_guard(t) is not None
    return is_guard(t, i)


def failure(t, i, read):
    """The exception for a sweep stopped at entry ``i``: :class:`GuardError` for a guard,
    the op's ``error`` class for an op that rejected its data (``IndexError`` for a gather
    index out of bounds, ``LinAlgError`` for a singular matrix), with the
    text of the op's ``describe_failure`` (:class:`tape.registry.Op`). ``read(b)`` returns
    buffer ``b``'s flat values in the arena the sweep ran on (host or device). Batched replays
    redo a failed instance alone and prefix the message with it (:mod:`tape.batch`)."""
    src = t.sources.get(i, "")
    at = f" at {src}" if src else ""
    if t.entries[i, E_OP] < 0:  # a guard inside a checkpoint (tape.program.callbacks.failed_guard)
        from tape.program.callbacks import entry_name, failed_guard

        inner = failed_guard(t)
        return GuardError(f"inside {entry_name(t, i)}{at}: {inner}", entry=i, source=src)
    op = registry.OPS[t.entries[i, E_OP]]
    text = op.describe_failure(t, i, read, at) if op.describe_failure is not None else None
    if op.guard:
        return GuardError(text, entry=i, source=src)
    return op.error(text or f"entry {i} ({op.name}){at} rejected its input data")


def buffer_reader(t, data):
    """``read(b)`` over a host arena ``data`` laid out as ``t``'s."""

    return lambda b: t.view(data, b).reshape(-1)


def run_entry(t, i, data, entries=None, bufs=None):
    """Run entry ``i`` of tape ``t`` on the value arena ``data`` with its op's own compiled
    function (eager mode compiles only the ops it uses, never the whole sweeps). Returns the
    status (``-1``, or ``i`` when the entry rejected its data)."""
    entries = t.entries if entries is None else entries
    fn = sweeps.FWD[entries[i, E_OP]]
    return fn(i, entries, t.bufs if bufs is None else bufs, t.ipool, data)


def run_entry_back(t, i, data, grad, entries=None, bufs=None):
    """The reverse of entry ``i``: add its contributions to its inputs' adjoints in ``grad``."""
    entries = t.entries if entries is None else entries
    fn = sweeps.REV[entries[i, E_OP]]
    if fn is not None:
        fn(i, entries, t.bufs if bufs is None else bufs, t.ipool, data, grad)
