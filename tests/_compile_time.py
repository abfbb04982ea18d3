"""Numba compile time per test, from Numba's ``numba:compile`` events.

Every compile in a test costs every CI run, so the suite reports where compile time goes:
:func:`install` listens to Numba's compile events (outermost compiles only: a function
compiled while another compiles is part of the outer one's time), ``conftest.py`` charges the
time to the running test, and the 20 tests that compiled longest are printed at the end of
the run.
"""

from __future__ import annotations

import json
import os
import threading
import time

from numba.core import event

_state = threading.local()
_totals: dict[str, float] = {}
_current = [None]  # nodeid of the running test (None between tests: fixtures of a module)
_by_function: dict[str, float] = {}  # outermost compiled function -> seconds


class _Listener(event.Listener):
    def on_start(self, ev):
        depth = getattr(_state, "depth", 0)
        if depth == 0:
            _state.t0 = time.perf_counter()
            py = getattr(ev.data.get("dispatcher"), "py_func", None)
            _state.name = f"{getattr(py, '__module__', '?')}.{getattr(py, '__qualname__', '?')}"
        _state.depth = depth + 1

    def on_end(self, ev):
        _state.depth -= 1
        if _state.depth == 0:
            key = _current[0] or "(outside a test: collection, fixtures)"
            dt = time.perf_counter() - _state.t0
            _totals[key] = _totals.get(key, 0.0) + dt
            _by_function[_state.name] = _by_function.get(_state.name, 0.0) + dt


def install():
    event.register("numba:compile", _Listener())


def begin(nodeid):
    _current[0] = nodeid


def end():
    _current[0] = None


def report(write, n=20):
    """Write the ``n`` tests that compiled longest, and the total, with ``write(line)``.

    With ``TAPE_COMPILE_TIMES=FILE`` set, every test's and every outermost compiled
    function's seconds are also written to ``FILE`` as JSON (``{"tests": ..., "functions":
    ...}``), for a look at where a whole run's compile time goes."""
    if not _totals:
        return
    dump = os.environ.get("TAPE_COMPILE_TIMES")
    if dump:
        with open(dump, "w") as fh:
            json.dump({"tests": _totals, "functions": _by_function}, fh, indent=0)
    total = sum(_totals.values())
    write(f"Numba compile time in this process: {total:.1f} s; the {n} longest:")
    for key, s in sorted(_totals.items(), key=lambda kv: -kv[1])[:n]:
        write(f"  {s:7.2f} s  {key}")
