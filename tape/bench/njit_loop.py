"""A tape's gradient called inside a user's ``@njit`` loop, against a hand-written ``@njit``
gradient in the same loop: the fixed cost per call where an ODE right-hand side, a Newton
step or an MCMC proposal calls a small gradient millions of times from compiled code.

Rosenbrock (:func:`tape.bench.simple.rosenbrock`); the timed call runs ``batch`` gradients in
one ``@njit`` loop and the times are per gradient. Tools:

- ``njit (hand)``: :func:`hand_grad`, writing into a given array (no allocation);
- ``tape``: ``tp.kernels.gradient(ka)``, the interpreter's kernel-argument driver (any tape;
  ``ka = t.workspace()``);
- ``tape compiled``: ``t.kernels.gradient(ka)``, the compiled tier's driver
  (``tp.record(..., compile=True)``);
- ``tape njit_gradient``: ``t.njit_gradient(x, g, work)``, the compiled tape as a plain
  ``@njit`` function of its arguments and a workspace (``work = t.njit_workspace()``),
  compiled into the loop.

``--quick``: n=10 only, without ``tape compiled`` (its loop takes seconds to compile).
``benchmarks/njit_overhead.py`` times the same loops with its own repeats, and the calls from
Python beside them.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from tape.bench import simple
from tape.bench.harness import Case, Impl, Problem


def rosen(x):
    import tape as tp

    return simple.rosenbrock(tp, [x], ())


@njit(cache=True, error_model="numpy")
def hand_grad(x, g):
    """Rosenbrock's gradient into ``g`` (one fused loop); returns the value."""
    n = x.shape[0]
    for i in range(n):
        g[i] = 0.0
    f = 0.0
    for i in range(n - 1):
        a = x[i + 1] - x[i] * x[i]
        b = 1.0 - x[i]
        f += 100.0 * a * a + b * b
        g[i] += -400.0 * a * x[i] - 2.0 * b
        g[i + 1] += 200.0 * a
    return f


@njit(cache=True)
def loop_hand(x, g, calls):
    s = 0.0
    for _ in range(calls):
        hand_grad(x, g)
        s += g[0]
    return s


@functools.cache
def make_ka_loop(kernels):
    """A loop calling ``kernels.gradient(ka)`` (a module global: Numba binds it at compile);
    one per kernels module (the interpreter's serves every tape)."""
    K = kernels

    @njit
    def loop(ka, calls):
        s = 0.0
        for _ in range(calls):
            K.gradient(ka)
            s += ka.grad[0]
        return s

    return loop


def make_njit_loop(fn):
    """A loop calling ``fn(x, g, work)`` (a tape's :attr:`~tape.Tape.njit_gradient`)."""

    @njit
    def loop(x, g, work, calls):
        s = 0.0
        for _ in range(calls):
            fn(x, g, work)
            s += g[0]
        return s

    return loop


def loaded_workspace(t, x):
    """``t.workspace()`` with ``x`` written where the tape reads its argument."""
    ka = t.workspace()
    off, m = t.input_slice(0)
    ka.data[off : off + m] = x
    return ka


def loop_builders(x, batch, kernels_loop=True):
    """``{tool: builder}`` for the loop of ``batch`` gradients at ``x``; ``kernels_loop``:
    the compiled tier's ``t.kernels.gradient(ka)`` too (its loop takes seconds to compile)."""
    import tape as tp

    compiled = functools.cache(lambda: tp.record(rosen, x, compile=True))
    note = f"{batch} gradients per @njit call"

    def hand():
        g = np.empty_like(x)
        return Impl(grad=lambda: (loop_hand(x, g, batch), g)[1], grad_np=np.copy, batch=batch,
                    note=note)  # fmt: skip

    def kernels(t, kernels):
        ka = loaded_workspace(t, x)
        loop = make_ka_loop(kernels)
        off, m = t.input_slice(0)
        return Impl(grad=lambda: loop(ka, batch), grad_np=lambda _: ka.grad[off : off + m].copy(),
                    batch=batch, note=f"{len(t)} entries, {note}")  # fmt: skip

    def interpreter():
        return kernels(tp.record(rosen, x, compile=False), tp.kernels)

    def compiled_kernels():
        t = compiled()
        return kernels(t, t.kernels)

    def njit_gradient():
        t = compiled()
        fn, work, g = t.njit_gradient, t.njit_workspace(), np.empty_like(x)
        loop = make_njit_loop(fn)
        return Impl(grad=lambda: (loop(x, g, work, batch), g)[1], grad_np=np.copy, batch=batch,
                    note=f"{len(t)} entries, {note}")  # fmt: skip

    out = {"njit (hand)": hand, "tape": interpreter, "tape compiled": compiled_kernels,
           "tape njit_gradient": njit_gradient}  # fmt: skip
    if not kernels_loop:
        del out["tape compiled"]
    return out


def njit_loop_cases(opts):
    out = []
    for n in (10,) if opts.quick else (10, 1000):
        x = np.random.default_rng(0).uniform(-1.0, 2.0, n)
        tools = loop_builders(x, 2000 if n <= 100 else 200, kernels_loop=not opts.quick)
        out.append(Case("njit-loop", f"rosenbrock n={n}", n, tools))
    return out


PROBLEMS = [
    Problem(
        "njit-loop",
        "Rosenbrock gradient called inside a user's @njit loop (time per gradient)",
        "n",
        njit_loop_cases,
    )
]
