"""The fixed cost of a tape's gradient called from ``@njit`` code and from Python.

``python benchmarks/njit_overhead.py [--reps R] [--sizes 10,1000]``

Rosenbrock (``tape.bench.simple.rosenbrock``) at each size, against a hand-written ``@njit``
gradient that writes into a given array (no allocation). Inside an ``@njit`` loop:

- ``hand``: the hand-written gradient, called in the loop;
- ``t.kernels.gradient(ka)``: the compiled tier's kernel-argument driver (``tp.record(...,
  compile=True)``, ``ka = t.workspace()``);
- ``tp.kernels.gradient(ka)``: the interpreter's (any tape);
- ``t.njit_gradient(x, g, work)``: the compiled tape as a plain ``@njit`` function of its
  arguments and a workspace (``work = t.njit_workspace()``).

From Python: the hand gradient called from Python, ``t.gradient(x)``, ``t.gradient(x, out=g)``
and ``t.njit_gradient(x, g, work)``.

Each figure is the median over ``R`` repeats of the mean time per call over a batch of calls
(ns); the ratio is to the hand gradient in the same setting. The loops are
:mod:`tape.bench.njit_loop`'s (``python -m tape.bench njit-loop`` runs them in the benchmark's
harness, with its agreement check and interleaved timing). Set ``NUMBA_CACHE_DIR`` /
``TAPE_CACHE_DIR`` to keep compiled code between runs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time

import numpy as np

import tape as tp
from tape.bench.njit_loop import (
    hand_grad,
    loaded_workspace,
    loop_hand,
    make_ka_loop,
    make_njit_loop,
    rosen,
)


def per_call(run, calls, reps):
    """Median, min and max over ``reps`` of the ns per call of ``run(calls)``."""
    run(max(1, calls // 10))  # warm (compiles)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        run(calls)
        ts.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(ts), min(ts), max(ts)


def py_loop(f):
    def run(c):
        for _ in range(c):
            f()

    return run


def cpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def bench(n, reps):
    x = np.random.default_rng(0).uniform(-1.0, 2.0, n)
    g = np.empty(n)
    calls = 200_000 if n <= 100 else 20_000
    pcalls = calls // 4
    rows = []

    tc = tp.record(rosen, x, compile=True)
    ti = tp.record(rosen, x, compile=False)
    kac, kai = loaded_workspace(tc, x), loaded_workspace(ti, x)
    # the results agree before anything is timed
    ref = np.empty(n)
    hand_grad(x, ref)
    np.testing.assert_allclose(tc.gradient(x), ref, rtol=1e-12, atol=1e-12)

    h = per_call(lambda c: loop_hand(x, g, c), calls, reps)
    rows.append(("@njit loop", "hand", h, h))
    loop_c = make_ka_loop(tc.kernels)
    rows.append(
        (
            "@njit loop",
            "t.kernels.gradient(ka) compiled",
            per_call(lambda c: loop_c(kac, c), calls, reps),
            h,
        )
    )
    loop_i = make_ka_loop(tp.kernels)
    rows.append(
        (
            "@njit loop",
            "tp.kernels.gradient(ka) interpreter",
            per_call(lambda c: loop_i(kai, c), calls, reps),
            h,
        )
    )
    ng = getattr(tc, "njit_gradient", None)
    if ng is not None:
        work = tc.njit_workspace()
        loop_n = make_njit_loop(ng)
        rows.append(("@njit loop", "t.njit_gradient(x, g, work)",
                     per_call(lambda c: loop_n(x, g, work, c), calls, reps), h))  # fmt: skip

    hp = per_call(py_loop(lambda: hand_grad(x, g)), pcalls, reps)
    rows.append(("Python", "hand_grad(x, g)", hp, hp))

    def py(name, f):
        rows.append(("Python", name, per_call(py_loop(f), pcalls, reps), hp))

    py("t.gradient(x)", lambda: tc.gradient(x))
    try:
        tc.gradient(x, out=g)
        py("t.gradient(x, out=g)", lambda: tc.gradient(x, out=g))
    except TypeError:
        pass
    if ng is not None:
        py("t.njit_gradient(x, g, work)", lambda: ng(x, g, work))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--sizes", default="10,1000")
    a = p.parse_args(argv)
    print(f"CPU: {cpu()}; numba, medians of {a.reps} repeats (min-max in brackets)")
    print(f"{'n':>6}  {'where':<10}  {'what':<38} {'ns/call':>9}  {'[min-max]':>17}  {'x hand':>7}")
    for n in [int(s) for s in a.sizes.split(",")]:
        for where, what, (med, lo, hi), base in bench(n, a.reps):
            print(
                f"{n:>6}  {where:<10}  {what:<38} {med:9.1f}  [{lo:7.1f}-{hi:7.1f}]  "
                f"{med / base[0]:7.2f}"
            )


if __name__ == "__main__":
    main()
