"""The ``python -m tape.bench`` problems as pytest-benchmark tests: ``pytest benchmarks/``.

One test per (problem instance, tool); each is grouped by instance so pytest-benchmark's table
compares the tools side by side (``njit-loop``: the time of one call of a loop of gradients in
``@njit`` code, not per gradient). Peers that are not installed, and missing ADBench data, are
skipped. The full comparison (agreement checks, interleaved timing, gradient/objective
ratios) is ``python -m tape.bench``; this is the same code timed by pytest-benchmark.
"""

import pytest

from tape.bench import adbench, ba, gmm, gp, lstm, njit_loop, second, simple
from tape.bench.harness import Opts, Skip

DATA = adbench.find_data_dir()
TOOLS = ("tape", "tape eager", "njit (hand)", "numpy (hand)", "jax jit", "torch", "autograd",
         "drjit", "casadi")  # fmt: skip


def _cases():
    out = []
    out += [c for c in simple.rosenbrock_cases(Opts()) if c.size in (10, 1000, 100_000)]
    out += simple.mlp_cases(Opts()) + simple.mlp_large_cases(Opts()) + simple.linreg_cases(Opts())
    out += gp.gp_cases(Opts()) + gp.gp_x_cases(Opts(quick=True))
    out += njit_loop.njit_loop_cases(Opts(quick=True))
    if DATA is not None:
        out += [c for c in gmm.gmm_cases(Opts(quick=True)) if c.label != "10k d10 K25"]
        out += ba.ba_cases(Opts(quick=True))
        out += lstm.lstm_cases(Opts(quick=True))
    return out


def _second_order_cases():
    """Hessian-vector products, Hessians, Jacobians (dense and by colouring): every tool of
    :mod:`tape.bench.second` (the SciPy solves stay in ``python -m tape.bench``)."""
    out = second.hvp_cases(Opts(data_dir=DATA)) + second.hessian_cases(Opts(quick=True))
    out += second.jacobian_cases(Opts())
    if DATA is not None:
        out += second.ba_jacobian_cases(Opts(data_dir=DATA))[:1]
    return out


CASES = _cases()
PARAMS = [
    pytest.param(case, tool, id=f"{case.problem}[{case.label}]-{tool}")
    for case in CASES
    for tool in (case.builders if case.problem == "njit-loop" else TOOLS)
    if tool in case.builders
] + [
    pytest.param(case, tool, id=f"{case.problem}[{case.label}]-{tool}")
    for case in _second_order_cases()
    for tool in case.builders
]


@pytest.mark.parametrize("case,tool", PARAMS)
def test_gradient(benchmark, case, tool):
    try:
        impl = case.builders[tool]()
    except Skip as e:
        pytest.skip(str(e))
    impl.grad()  # warm-up: jit compilation, first-call caches
    benchmark.group = f"{case.problem} {case.label}"
    benchmark(impl.grad)


def _eager_params():
    from tape.bench.eager import LOOPS, peers

    return [
        pytest.param(loop, T, id=f"eager-{name}-{lib}")
        for name, loop in LOOPS.items()
        for lib, T in peers().items()
    ]


@pytest.mark.parametrize("loop,T", _eager_params())
def test_eager_loop(benchmark, loop, T):
    """The eager training loops of :mod:`tape.bench.eager` (200 steps), tape and PyTorch
    side by side (``python benchmarks/eager_loops.py`` runs them in full)."""
    loop(T, steps=5)  # warm-up
    benchmark.group = f"eager {loop.__name__}"
    benchmark(loop, T, steps=200)
