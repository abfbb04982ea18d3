"""One semantics for every backend: a table of cases, each run on every backend.

Each case is a small function, the points to evaluate it at, and the value and gradient
expected there, computed independently of tape (NumPy formulas; :func:`test_table_itself`
checks the smooth ones against central finite differences of a NumPy reference). Every case
runs on

``eager``
    ``tp.tensor(..., requires_grad=True)``, the function, ``backward()``;
``replay``
    ``tp.record(fn, *record_at)`` replayed at each point (``value_and_grad``);
``batch``
    the same tape, every point as one instance of ``t.gradient_batch``;
``compiled``, ``compiled_batch``
    the same on the compiled tier (``tp.record(..., compile=True)``);
``cuda_sim``, ``cuda_sim_batch``, ``cuda_sim_compiled``, ``cuda_sim_compiled_batch``
    ``t.to("cuda")``, ``tape.cuda.gradient_batch``, and both on the GPU's compiled tier
    (``compile=True``) under Numba's CUDA simulator, in one
    subprocess with ``NUMBA_ENABLE_CUDASIM=1`` (the mechanism of ``tests/test_cuda_sim.py``:
    the simulator must be on before numba is imported), or in this process when it already
    runs under the simulator;
``gpu``, ``gpu_batch``, ``gpu_compiled``, ``gpu_compiled_batch``
    the same on a real GPU (marked ``gpu``; skipped without one).

The tape is recorded at ``record_at`` (default: the first point), away from the kinks, ties
and zeros the points sit on, so the replay backends decide those at replay time, and a guard
case crosses its branch. A case with ``accumulate`` runs ``backward()`` twice after one
forward on the backends that keep gradients (eager, single replays): leaf gradients must
double, and intermediate adjoints must not (they are zeroed at the start of every reverse
sweep, so 3x or 4x would show a leak); batched replays return a fresh gradient per call, so
there a second call must give the same result.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import _background
import numpy as np
import pytest

import tape as tp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the simulator runner of test_cuda_sim, also when run as a script
from test_cuda_sim import HAS_NUMBA_CUDA, IN_SIM, _looks_like_gpu  # noqa: E402


@dataclass
class Case:
    """One row of the table.

    Attributes
    ----------
    name : str
    fn : callable
        Takes tensors, returns a scalar tensor.
    points : list of tuple
        ``(args, value, grads)``: arguments, the expected value and the expected gradient of
        each differentiated argument, computed without tape.
    wrt : tuple of int
        Differentiated argument positions.
    record_at : tuple or None
        Arguments to record at (default: the first point's).
    ref : callable or None
        NumPy reference of ``fn`` for the finite-difference check of the table itself (smooth
        cases only).
    rtol, atol : float
    accumulate : bool
        Check two ``backward()`` after one forward (see the module docstring).
    """

    name: str
    fn: Callable
    points: list
    wrt: tuple = (0,)
    record_at: tuple | None = None
    ref: Callable | None = None
    rtol: float = 1e-12
    atol: float = 1e-12
    accumulate: bool = False


def _others_prod(x):
    """d prod(x) / d x_j: the product of the other elements (exact with zeros)."""
    return np.array([np.prod(np.delete(x, j)) for j in range(x.size)])


def _branchy(x):
    if x.sum() > 0:
        return (x * x).sum()
    return (x * x * x).sum()


def _branchy_ref(x):
    return (x * x).sum() if x.sum() > 0 else (x * x * x).sum()


def _cases():
    cases = []

    # a zero output adjoint never evaluates a rule: sqrt's rule at 0 is 0 * inf
    x = np.array([0.0, 1.0, 4.0, 0.0, 0.25])
    pos = np.where(x > 0, x, 1.0)
    cases.append(Case(
        "where_sqrt_kink", lambda x: tp.where(x > 0, tp.sqrt(x), 0.0).sum(),
        [((x,), np.sqrt(x).sum(), (np.where(x > 0, 0.5 / np.sqrt(pos), 0.0),))],
        record_at=(np.arange(1.0, 6.0),),
    ))  # fmt: skip

    # max / min split the adjoint evenly between ties
    cases.append(Case(
        "max_ties", lambda x: tp.max(x),
        [((np.array([1.0, 3.0, 3.0]),), 3.0, (np.array([0.0, 0.5, 0.5]),))],
        record_at=(np.array([1.0, 2.0, 3.0]),),
    ))  # fmt: skip
    cases.append(Case(
        "min_ties", lambda x: tp.min(x),
        [((np.array([2.0, 1.0, 5.0, 1.0]),), 1.0, (np.array([0.0, 0.5, 0.0, 0.5]),))],
        record_at=(np.array([4.0, 3.0, 2.0, 1.0]),),
    ))  # fmt: skip
    w = np.array([1.0, 3.0])
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    cases.append(Case(
        "max_axis_ties", lambda x: (tp.max(x, axis=1) * w).sum(),
        [((x,), 3.0 + 6.0, (np.array([[0.0, 0.5, 0.5], [1.0, 1.0, 1.0]]),))],
        record_at=(np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]),),
    ))  # fmt: skip

    # prod is exact with zeros: one zero, two zeros
    for name, x in (("prod_one_zero", [2.0, 0.0, 3.0]), ("prod_two_zeros", [2.0, 0.0, 0.0, 3.0])):
        x = np.array(x)
        cases.append(Case(
            name, lambda x: tp.prod(x), [((x,), np.prod(x), (_others_prod(x),))],
            record_at=(np.arange(1.0, x.size + 1.0),),
        ))  # fmt: skip

    # a gather with repeated indices accumulates (a scatter-add); the indices are data
    x = np.array([1.0, -2.0, 3.0])
    idx = np.array([0, 2, 0, 0])
    wg = np.array([1.0, 2.0, 3.0, 4.0])
    cases.append(Case(
        "gather_repeated", lambda x, i: (x[i] * wg).sum(),
        [((x, idx), (x[idx] * wg).sum(), (np.bincount(idx, weights=wg, minlength=3),))],
        record_at=(x, np.array([1, 1, 2, 0])),
        ref=lambda x, i: (x[i] * wg).sum(),
    ))  # fmt: skip

    # a broadcast (3, 1) + (1, 4), reduced over an axis
    a = np.array([[0.5], [-1.0], [2.0]])
    b = np.array([[1.0, -0.5, 0.25, 2.0]])
    wb = np.array([1.0, -2.0, 0.5, 3.0])
    s = a + b
    cases.append(Case(
        "broadcast_reduce", lambda a, b: (((a + b) ** 2).sum(axis=0) * wb).sum(),
        [((a, b), ((s**2).sum(axis=0) * wb).sum(),
          ((2 * s * wb).sum(axis=1, keepdims=True), (2 * s * wb).sum(axis=0, keepdims=True)))],
        wrt=(0, 1), ref=lambda a, b: (((a + b) ** 2).sum(axis=0) * wb).sum(),
    ))  # fmt: skip

    # leaf gradients accumulate over backward() calls, intermediate adjoints do not
    x = np.array([0.3, -1.2, 2.0])

    def fan_out(x):
        s = tp.sin(x)  # used three times: its adjoint sums three contributions
        return (s * s + s).sum()

    cases.append(Case(
        "accumulate_leaves_only", fan_out,
        [((x,), (np.sin(x) ** 2 + np.sin(x)).sum(), (2 * np.sin(x) * np.cos(x) + np.cos(x),))],
        ref=lambda x: (np.sin(x) ** 2 + np.sin(x)).sum(), accumulate=True,
    ))  # fmt: skip

    # float32 end to end: float32 value and gradient, within float32 rounding of float64
    x32 = np.array([-1.5, -0.2, 0.3, 1.1], np.float32)
    x64 = x32.astype(np.float64)
    th, ex = np.tanh(x64), np.exp(0.5 * x64)
    cases.append(Case(
        "float32", lambda x: (tp.tanh(x) * tp.exp(x * 0.5)).sum(),
        [((x32,), (th * ex).sum(), ((1 - th**2) * ex + 0.5 * th * ex,))],
        ref=lambda x: (np.tanh(x) * np.exp(0.5 * x)).sum(), rtol=1e-5, atol=1e-6,
    ))  # fmt: skip

    # a Python `if` on a tensor: a guard; recorded on one side, replayed on both
    xp = np.array([1.0, 2.0, 3.0])
    xn = np.array([-1.0, -2.0, 0.5])
    cases.append(Case(
        "guard_both_branches", _branchy,
        [((xp,), (xp**2).sum(), (2 * xp,)), ((xn,), (xn**3).sum(), (3 * xn**2,))],
        ref=_branchy_ref,
    ))  # fmt: skip
    return cases


CASES = _cases()
BY_NAME = {c.name: c for c in CASES}


# ---------------------------------------------------------------- the backends
# Each returns, per point, ``(value, grads)`` as NumPy values.


def _record(case, compile=False):
    at = case.record_at or case.points[0][0]
    return tp.record(case.fn, *at, wrt=list(case.wrt), compile=compile)


def run_eager(case):
    out = []
    for args, _, _ in case.points:
        xs = [tp.tensor(a, requires_grad=k in case.wrt) for k, a in enumerate(args)]
        y = case.fn(*xs)
        if case.accumulate:
            y.backward(retain_graph=True)
        y.backward()
        out.append((y.numpy(), tuple(xs[k].grad.numpy() for k in case.wrt)))
    return out


def _single(t, case):
    """Per point on a single-replay tape (CPU ``Tape`` or ``CudaTape``)."""
    out = []
    for args, _, _ in case.points:
        if case.accumulate:
            v = t.forward(*args)
            t.zero_grad()
            t.backward()
            t.backward()
            g = tuple(np.array(x) for x in t.grads)
        else:
            v, g = t.value_and_grad(*args)
            g = g if isinstance(g, tuple) else (g,)
        out.append((v, g))
    return out


def _batched(gradient_batch, case):
    """Every point as one instance (twice over); with ``accumulate``, the second of two
    calls."""
    n = len(case.points[0][0])
    pts = case.points * 2
    stacked = [np.stack([p[0][k] for p in pts]) for k in range(n)]
    for _ in range(2 if case.accumulate else 1):
        vals, grads = gradient_batch(*stacked)
    grads = grads if isinstance(grads, tuple) else (grads,)
    return [(vals[b], tuple(g[b] for g in grads)) for b in range(len(pts))]


def run_replay(case):
    return _single(_record(case), case)


def run_batch(case):
    return _batched(_record(case).gradient_batch, case)


def run_compiled(case):
    t = _record(case, compile=True)
    assert t.tier == "compiled"
    return _single(t, case)


def run_compiled_batch(case):
    return _batched(_record(case, compile=True).gradient_batch, case)


def run_cuda(case):
    return _single(_record(case).to("cuda", threads=8), case)


def run_cuda_compiled(case):
    return _single(_record(case).to("cuda", threads=8, compile=True), case)


def run_cuda_compiled_batch(case):
    from tape.gpu import gradient_batch

    t = _record(case)
    return _batched(lambda *a: gradient_batch(t, *a, threads=4, compile=True), case)


def run_cuda_batch(case):
    from tape.gpu import gradient_batch

    t = _record(case)
    return _batched(lambda *a: gradient_batch(t, *a, threads=4), case)


RUNNERS = {
    "eager": run_eager,
    "replay": run_replay,
    "batch": run_batch,
    "compiled": run_compiled,
    "compiled_batch": run_compiled_batch,
    "cuda_sim": run_cuda,
    "cuda_sim_batch": run_cuda_batch,
    "cuda_sim_compiled": run_cuda_compiled,
    "cuda_sim_compiled_batch": run_cuda_compiled_batch,
    "gpu": run_cuda,
    "gpu_batch": run_cuda_batch,
    "gpu_compiled": run_cuda_compiled,
    "gpu_compiled_batch": run_cuda_compiled_batch,
}
ACCUMULATING = {"eager", "replay", "compiled", "cuda_sim", "gpu"} | {
    "cuda_sim_compiled",
    "gpu_compiled",
}
SIM = ("cuda_sim", "cuda_sim_batch", "cuda_sim_compiled", "cuda_sim_compiled_batch")


def simulate():
    """Every case on the simulator backends: ``{(backend, case): result or error text}``.
    Runs in a process with the simulator on."""
    out = {}
    for backend in SIM:
        for case in CASES:
            try:
                out[backend, case.name] = RUNNERS[backend](case)
            except Exception:  # noqa: BLE001  (reported by the test of that case)
                out[backend, case.name] = traceback.format_exc()
    return out


_SIM_OUT = Path(tempfile.gettempdir()) / f"tape-conformance-sim-{os.getpid()}.pkl"
if not IN_SIM and HAS_NUMBA_CUDA:
    # Runs on the second core while the main process works (tests/_background.py).
    _background.register(
        "conformance_sim",
        [str(Path(__file__)), str(_SIM_OUT)],
        {"NUMBA_ENABLE_CUDASIM": "1"},
        timeout=1800,
        wanted=lambda item: (
            item.originalname == "test_conformance" and item.callspec.params.get("backend") in SIM
        ),
    )


@pytest.fixture(scope="module")
def sim_results():
    """The simulator backends' results, from one subprocess for the whole table."""
    if IN_SIM:
        return simulate()
    if not HAS_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')")
    r = _background.result("conformance_sim")
    try:
        assert r.returncode == 0 and _SIM_OUT.exists(), r.stdout[-3000:] + r.stderr[-6000:]
        with open(_SIM_OUT, "rb") as f:
            return pickle.load(f)
    finally:
        _SIM_OUT.unlink(missing_ok=True)


def _gpu():
    if IN_SIM or not HAS_NUMBA_CUDA or not _looks_like_gpu():
        pytest.skip("no NVIDIA GPU")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no usable CUDA GPU")


BACKENDS = [
    "eager",
    "replay",
    "batch",
    "compiled",
    "compiled_batch",
    "cuda_sim",
    "cuda_sim_batch",
    "cuda_sim_compiled",
    "cuda_sim_compiled_batch",
] + [
    pytest.param(b, marks=pytest.mark.gpu)
    for b in ("gpu", "gpu_batch", "gpu_compiled", "gpu_compiled_batch")
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_conformance(case, backend, request):
    if backend in SIM:
        got = request.getfixturevalue("sim_results")[backend, case.name]
        if isinstance(got, str):
            pytest.fail(f"{backend} raised:\n{got}")
    else:
        if backend.startswith("gpu"):
            _gpu()
        got = RUNNERS[backend](case)
    factor = 2.0 if case.accumulate and backend in ACCUMULATING else 1.0
    n = len(case.points)
    assert len(got) % n == 0
    for b, (value, grads) in enumerate(got):
        args, want_v, want_g = case.points[b % n]
        value = np.asarray(value)
        # results come back in the dtypes of the arguments, as the CPU replay returns them
        floats = [np.asarray(a).dtype for a in args if np.asarray(a).dtype.kind == "f"]
        assert value.dtype == np.result_type(*floats), (b, value.dtype)
        np.testing.assert_allclose(value, want_v, rtol=case.rtol, atol=case.atol)
        assert len(grads) == len(case.wrt)
        for k, g, w in zip(case.wrt, grads, want_g):
            g = np.asarray(g)
            assert g.dtype == np.asarray(args[k]).dtype and g.shape == np.shape(args[k])
            np.testing.assert_allclose(
                g, factor * w, rtol=case.rtol, atol=case.atol, err_msg=f"point {b}, arg {k}"
            )


def _fd(ref, args, k, eps=1e-6):
    """Central differences of ``ref`` with respect to argument ``k``, in float64."""
    args = [np.array(a, np.float64) if np.asarray(a).dtype.kind == "f" else a for a in args]
    x = args[k]
    g = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        old = x[j]
        x[j] = old + eps
        up = ref(*args)
        x[j] = old - eps
        down = ref(*args)
        x[j] = old
        g[j] = (up - down) / (2 * eps)
    return g


@pytest.mark.parametrize("case", [c for c in CASES if c.ref is not None], ids=lambda c: c.name)
def test_table_itself(case):
    """The table's smooth expectations agree with finite differences of a NumPy reference."""
    for args, want_v, want_g in case.points:
        args64 = [np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else a for a in args]
        np.testing.assert_allclose(case.ref(*args64), want_v, rtol=1e-12)
        for k, w in zip(case.wrt, want_g):
            np.testing.assert_allclose(_fd(case.ref, args64, k), w, rtol=1e-6, atol=1e-8)


if __name__ == "__main__":
    # the simulator run for sim_results: python tests/test_conformance.py OUT.pkl
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run with NUMBA_ENABLE_CUDASIM=1"
    with open(sys.argv[1], "wb") as f:
        pickle.dump(simulate(), f)
