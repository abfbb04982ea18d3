"""Numba compile time per test, from Numba's ``numba:compile`` events.

Every compile in a test costs every CI run, so the suite reports where compile time goes:
:func:`install` listens to Numba's compile events (outermost compiles only: a function
compiled while another compiles is part of the outer one's time), ``conftest.py`` charges the
time to the running test, and the 20 tests that compiled longest are printed at the end of
the run.
"""

from __future__ import annotations

import threading
import time

from numba.core import event

_state = threading.local()
_totals: dict[str, float] = {}
_current = [None]  # nodeid of the running test (None between tests: fixtures of a module)


class _Listener(event.Listener):
    def on_start(self, ev):
        depth = getattr(_state, "depth", 0)
        if depth == 0:
            _state.t0 = time.perf_counter()
        _state.depth = depth + 1

    def on_end(self, ev):
        _state.depth -= 1
        if _state.depth == 0:
            key = _current[0] or "(outside a test: collection, fixtures)"
            _totals[key] = _totals.get(key, 0.0) + time.perf_counter() - _state.t0


def install():
    event.register("numba:compile", _Listener())


def begin(nodeid):
    _current[0] = nodeid


def end():
    _current[0] = None


def report(write, n=20):
    """Write the ``n`` tests that compiled longest, and the total, with ``write(line)``."""
    if not _totals:
        return
    total = sum(_totals.values())
    write(f"Numba compile time in this process: {total:.1f} s; the {n} longest:")
    for key, s in sorted(_totals.items(), key=lambda kv: -kv[1])[:n]:
        write(f"  {s:7.2f} s  {key}")
