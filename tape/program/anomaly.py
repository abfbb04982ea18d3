"""Anomaly mode (:func:`tape.detect_anomaly`): checking sweeps that stop at the first entry
producing NaN or infinity, forward or reverse, and name it.

The checking sweeps run the ordinary compiled sweeps one entry at a time and look at what each
entry wrote, so nothing in the compiled code changes and the normal path pays one flag test
per replay when the mode is off.
"""

from __future__ import annotations

import threading

import numpy as np

from tape.interpreter.generated import sweeps
from tape.layout.columns import B_KIND, CONST, E_IN0, E_OP, E_OUT
from tape.ops import registry
from tape.program.replay import run_entry, run_entry_back


class _State(threading.local):
    depth = 0  # nesting of detect_anomaly() in this thread (a class default: no getattr miss)


_state = _State()
ON = 0  # threads inside detect_anomaly(), all together: the replay path tests this global first
_lock = threading.Lock()


class AnomalyError(RuntimeError):
    """An entry produced NaN or infinity while :func:`detect_anomaly` was on. Attributes:
    ``entry``, ``op``, ``source`` (``file:line`` where the entry was recorded), ``phase``
    (``"forward"`` or ``"backward"``)."""

    def __init__(self, msg, entry, op, source, phase):
        super().__init__(msg)
        self.entry, self.op, self.source, self.phase = entry, op, source, phase


def enabled() -> bool:
    return ON > 0 and _state.depth > 0


class detect_anomaly:
    """Context manager (PyTorch's name) that checks every entry for NaN and infinity.

    Inside it, eager ops and tape replays (:meth:`tape.Tape.forward`, :meth:`~tape.Tape.gradient`,
    ``backward``) run checking sweeps that stop at the first entry whose output (forward) or
    input adjoints (reverse) contain NaN or infinity, and raise :class:`AnomalyError` naming
    the op, the entry, the shapes and the ``file:line`` of the user's code that recorded it.
    Eager ops record their source line only while the mode is on. Checking is slow (one
    compiled call and one NumPy test per entry): use it to find a NaN, not in production.

    ::

        with tape.detect_anomaly():
            t.gradient(x)     # AnomalyError: entry 3 (log) produced nan ... at model.py:37
    """

    def __init__(self, check_nan=True):
        self.check_nan = check_nan

    def __enter__(self):
        global ON
        self._prev = _state.depth
        _state.depth = self._prev + (1 if self.check_nan else 0)
        with _lock:
            ON += 1
        return self

    def __exit__(self, *exc):
        global ON
        _state.depth = self._prev
        with _lock:
            ON -= 1
        return False

    def __call__(self, fn):
        def wrapper(*a, **k):
            with detect_anomaly(self.check_nan):
                return fn(*a, **k)

        wrapper.__name__ = getattr(fn, "__name__", "wrapper")
        wrapper.__doc__ = fn.__doc__
        return wrapper


def _bad(arena, t, b):
    v = t.view(arena, b)
    return not np.isfinite(v).all(), v


def _error(t, i, phase, b, v):
    name = registry.OPS[t.entries[i, E_OP]].name
    kind = "nan" if np.isnan(v).any() else "inf"
    ins = [int(x) for x in t.entries[i, E_IN0:E_OUT] if x >= 0]
    shapes = ", ".join(str(t.shapes[x]) for x in ins)
    src = t.sources.get(i, "")
    what = "its output" if phase == "forward" else f"the adjoint of its input %{b}"
    return AnomalyError(
        f"{phase}: entry {i} ({name}) produced {kind} in {what}; inputs of shapes ({shapes}), "
        f"output of shape {t.shapes[int(t.entries[i, E_OUT])]}"
        + (f", recorded at {src}" if src else " (source line unknown: record it with the mode on)"),
        i,
        name,
        src,
        phase,
    )


def check_entries(t, data, start, stop):
    """Eager: entries ``start .. stop-1`` have run; raise for the first non-finite output."""
    for i in range(start, stop):
        b = int(t.entries[i, E_OUT])
        bad, v = _bad(data, t, b)
        if bad:
            raise _error(t, i, "forward", b, v)


def _no_callbacks(t):
    """The checked sweeps run registry ops entry by entry: a tape that calls Python
    (``autograd.Function``, ``custom_op``, ``checkpoint``) is refused, never half-checked."""
    from tape.program.callbacks import refuse

    refuse(t, "detect_anomaly()")


def forward(t, data, start, stop):
    """Checked forward sweep over ``data``: returns the sweep status as the compiled sweep."""
    _no_callbacks(t)
    for i in range(start, stop):
        st = run_entry(t, i, data)
        if st >= 0:
            return st
        b = int(t.entries[i, E_OUT])
        bad, v = _bad(data, t, b)
        if bad:
            raise _error(t, i, "forward", b, v)
    return -1


def backward(t, data, grad, roots, seeds, zero_leaves):
    """Checked :func:`tape.sweeps.backward`; returns the buffer mask like it."""
    _no_callbacks(t)
    if not np.isfinite(seeds).all():
        raise AnomalyError(
            "backward: the seed (output adjoint) contains nan or inf", -1, "", "", "backward"
        )
    emask, need = sweeps.reach(t.entries, t.bufs, t.n_entries, roots)
    sweeps.zero_adjoints(t.bufs, grad, need, t.n_bufs, zero_leaves)
    sweeps.add_seeds(t.bufs, grad, roots, seeds)
    for i in range(t.n_entries - 1, -1, -1):
        if not emask[i]:
            continue
        run_entry_back(t, i, data, grad)
        for b in t.entries[i, E_IN0:E_OUT]:
            if b >= 0 and t.bufs[b, B_KIND] != CONST:
                bad, v = _bad(grad, t, int(b))
                if bad:
                    raise _error(t, i, "backward", int(b), v)
    return need


def replay(t, ws, grad, roots, seeds):
    """A checked replay on workspace ``ws``: forward, then (``grad``) backward zeroing leaves.
    Returns the forward status."""
    st = forward(t, ws.data, 0, t.n_entries)
    if st >= 0 or not grad:
        return st
    backward(t, ws.data, ws.grad, roots, seeds, True)
    return -1
