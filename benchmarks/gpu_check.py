"""Device check for tape's GPU path, on a machine with an NVIDIA GPU.

    python benchmarks/gpu_check.py            # the full check, a few minutes (first run compiles)
    python benchmarks/gpu_check.py --quick    # smaller sizes, fewer repeats
    python benchmarks/gpu_check.py --only parity,latency
    python benchmarks/gpu_check.py --quick --json out.json --markdown out.md

Prints, section by section:

(a) parity: every op of the registry, forward values and gradients of a small tape replayed
    on the GPU (one launch per run of entries, and one launch per phase) and batched (one
    thread per instance), against the CPU sweeps;
(b) bandwidth: large elementwise entries, forward and reverse, in GB/s and as a fraction of
    the device's peak memory bandwidth (from its memory clock and bus width), next to a
    device-to-device copy;
(c) batched replay: gradients of a Rosenbrock-10 tape for 10^6 instances per second, on the
    interpreter and the compiled tier, as a fraction of the rate the memory bandwidth allows,
    next to the CPU's ``gradient_batch`` on all cores, ``jax.vmap(jax.grad(f))`` and
    ``torch.func.vmap(torch.func.grad(f))`` on the same GPU when those are installed with GPU
    support;
(d) latency: one replay (forward + backward) of a 50-entry tape of small buffers, with the
    values already on the device and with the host round trip;
(e) custom ops from CUDA device functions: parity with the CPU replay and with the same
    function from registry ops (single and batched), and the gradient replay time of a large
    tape against its registry-op version;
(f) the compiled tier (``CudaTape(t, compile=True)``): a chain of 8 elementwise ops and its
    sum, forward and reverse, against the interpreter's kernels, in GB/s of the bytes the
    fused kernels must move and as a fraction of peak.

With ``--json`` / ``--markdown`` every figure is also written as one JSON file and one
Markdown table, with the device's name and the versions.

Targets on an H200 (issue 4): (b) >= 60% of peak; (c) at least as fast as jax.vmap(jax.grad).
Each section catches its own errors and the script goes on; the exit status is 1 if parity
(or custom-op parity) failed. The first run compiles the kernels (NVVM, then the driver's PTX JIT): about a minute
each; later runs load them from Numba's cache.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


TINY = False  # --tiny: sizes for a smoke test of this script under the CUDA simulator

ROWS: list[dict] = []
"""Every figure printed, as ``{"section", "measure", "value", "unit", "note"}`` rows: written
with ``--json`` and ``--markdown`` (see :func:`_report`)."""
SECTION = [""]


def _row(measure, value, unit, note=""):
    ROWS.append({"section": SECTION[0], "measure": measure, "value": value, "unit": unit,
                 "note": note})  # fmt: skip


def _report(info, ok, json_path, md_path):
    """Write the rows, with the device and versions, as JSON and as a Markdown table (the
    table ``benchmarks/RESULTS.md`` quotes)."""
    import json

    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": info, "parity_ok": ok, "rows": ROWS}, f, indent=1)
    if md_path:
        lines = [f"GPU check on {info.get('name')} ({info.get('versions')}); parity "
                 f"{'OK' if ok else 'FAILED'}", "",
                 "| section | measure | value | unit | note |", "|---|---|---|---|---|"]  # fmt: skip
        for r in ROWS:
            v = r["value"]
            v = f"{v:.4g}" if isinstance(v, float) else str(v)
            lines.append(f"| {r['section']} | {r['measure']} | {v} | {r['unit']} | {r['note']} |")
        with open(md_path, "w") as f:
            f.write("\n".join(lines) + "\n")


def _hr(title):
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def _sync():
    from numba import cuda

    cuda.synchronize()


def _time(fn, reps, warmup=2):
    """Median seconds per call of ``fn`` (synchronised)."""
    if TINY:  # a smoke test of the script: one timed call
        reps, warmup = 1, 0
    for _ in range(warmup):
        fn()
    _sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def device_info():
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    peak = None
    try:
        peak = 2.0 * dev.MEMORY_CLOCK_RATE * 1e3 * dev.GLOBAL_MEMORY_BUS_WIDTH / 8.0
    except Exception:  # noqa: BLE001
        pass
    return name, dev.compute_capability, dev.MULTIPROCESSOR_COUNT, peak


# ---------------------------------------------------------------- (a) parity


def _elementwise_cases(rng):
    from tape.frontend import tensor
    from tape.frontend.testing import sample_inputs
    from tape.ops.registry import OPS

    shapes = {
        "unary": [((37,),), ((),)],
        "binary": [((37,), (37,)), ((), (33,)), ((33,), ()), ((5, 1), (1, 7)), ((3, 6), (6,))],
        "ternary": [((20,), (20,), (20,)), ((4, 1), (1, 5), ())],
    }
    for op in OPS:
        if op.kind == "structural":
            continue
        for shp in shapes[op.kind]:
            xs = sample_inputs(op, shp, rng)
            w = rng.uniform(0.5, 1.5, np.broadcast_shapes(*shp))
            wrt = [k for k, d in enumerate(op.differentiable) if d]
            name = op.name
            yield (
                f"{op.name} {' '.join(str(s) for s in shp)}",
                lambda *a, name=name, w=w: (tensor.elementwise(name, *a) * w).sum(),
                xs,
                wrt,
            )


def _kernel_cases(rng):
    """``(label, fn, args, wrt)`` for the structural ops (``wrt`` None: every argument)."""
    for label, fn, xs in _kernel_fns(rng):
        yield label, fn, xs, None


def _kernel_fns(rng):
    import tape as tp

    x = rng.uniform(0.5, 1.5, (6, 50, 4))
    x[0, 1, :] = x[0, 0, :]
    xz = x.copy()
    xz[1, 2, 1] = 0.0
    xz[2, 0, :] = 0.0
    for name in ("sum", "max", "min", "prod"):
        f = getattr(tp, name)
        arg = xz if name == "prod" else x
        for axis in (None, 1, (0, 2)):
            yield (
                f"{name} axis={axis}",
                lambda a, f=f, axis=axis: (f(a, axis=axis) * 1.3).sum(),
                [arg],
            )
    a, b = rng.standard_normal((30, 20)), rng.standard_normal((20, 10))
    c = rng.standard_normal((4, 30, 20))
    yield (
        "matmul 2d / batched / a@a",
        lambda a, b, c: (a @ b).sum() + ((c @ b) ** 2).sum() + (a[:20] @ a[:20].T @ a[:20]).sum(),
        [a, b, c],
    )
    m = rng.standard_normal((12, 9))
    y = rng.standard_normal((12, 3))
    yield "copy transpose/slice/concat/broadcast", (
        lambda m, y: (tp.transpose(m) * 2.0).sum() + (m[::-1, ::2] ** 2).sum()
        + (tp.concatenate([m, y], axis=1) ** 3).sum() + (tp.broadcast_to(m[:, :1], (12, 9)) * m).sum()
    ), [m, y]  # fmt: skip
    idx = np.array([0, 5, 5, -1, 11, 3], np.int64)
    yield (
        "take (repeated, negative)",
        lambda m, i: (tp.take(m, i, axis=0) ** 2).sum() + tp.take(m, i[:3], axis=1).sum(),
        [m, idx],
    )


@contextlib.contextmanager
def _every_op_dispatch():
    """Replays made inside use the dispatch over every op (``tape/gpu/_generated/kernels.py``,
    which ``gpu_session.sh`` compiles into Numba's cache while the tests start) instead of a
    module per op set (``tape.gpu._replay.kernels_for``): the parity tapes have over a hundred
    op sets, and each would be a compile of its own."""
    from tape.gpu import _replay

    saved = _replay.kernels_for
    _replay.kernels_for = lambda t: _replay._kernels()
    try:
        yield
    finally:
        _replay.kernels_for = saved


def parity(quick):
    with _every_op_dispatch():
        return _parity(quick)


def _parity(quick):
    import tape as tp
    from tape.gpu import CudaTape, gradient_batch
    from tape.transforms.batch import gradient_batch as cpu_batch

    rng = np.random.default_rng(0)
    failures = 0
    worst = 0.0
    n = 0

    def compare(label, got, want, tol):
        nonlocal failures, worst
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        err = 0.0
        for g, w in zip(got, want):
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            if g.size:
                err = max(err, float(np.max(np.abs(g - w) / (1e-12 + np.abs(w)))))
        ok = all(np.allclose(g, w, rtol=tol[0], atol=tol[1]) for g, w in zip(got, want))
        worst = max(worst, err)
        if not ok:
            failures += 1
            print(f"  FAIL {label}: max relative error {err:.2e}", flush=True)
        return ok

    fns = list(_elementwise_cases(rng)) + list(_kernel_cases(rng))
    if TINY:
        fns = fns[::80]
    cases = []
    for dt in (np.float64, np.float32):  # every case in both precisions
        for label, fn, xs, wrt in fns:
            xs = [x.astype(dt) if x.dtype.kind == "f" else x for x in map(np.asarray, xs)]
            cases.append((f"{label} {np.dtype(dt).name}", tp.record(fn, *xs, wrt=wrt), xs))
    for label, t, xs in cases:
        tol = (1e-9, 1e-12) if t.dtype == np.float64 else (2e-4, 1e-5)
        for coop in (True, False):
            mode = "coop" if coop else "per-phase"
            ct = CudaTape(t, cooperative=coop, blocks=None if coop else 7)
            compare(f"{label} [{mode}] forward", ct.forward(*xs), t.forward(*xs), tol)
            if t.wrt:
                compare(f"{label} [{mode}] gradient", ct.gradient(*xs), t.gradient(*xs), tol)
            n += 1
        if t.wrt:
            B = 3 if TINY else 64 if quick else 257
            args = [
                np.stack([x * (1 + 0.01 * b) if x.dtype.kind == "f" else x for b in range(B)])
                for x in xs
            ]
            v, g = gradient_batch(t, *args)
            v2, g2 = cpu_batch(t, *args)
            compare(
                f"{label} [batch]",
                (v,) + (g if isinstance(g, tuple) else (g,)),
                (v2,) + (g2 if isinstance(g2, tuple) else (g2,)),
                tol,
            )
    print(
        f"  {n} tapes (float64 and float32) x 2 launch modes + batched: {failures} failure(s); "
        f"worst relative error {worst:.2e}"
    )
    _row("failures", failures, "cases", f"{n} tapes, float64 and float32, 2 launch modes + batched")
    _row("worst relative error", worst, "")
    return failures == 0


# ---------------------------------------------------------------- (e) custom ops


def _sum_to(g, shape):
    """``g`` summed over the axes where an input of ``shape`` was broadcast."""
    g = np.asarray(g)
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and g.shape[a] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _softclip_op(name="softclip"):
    """softclip(x, c) = c tanh(x / c) as a custom op with NumPy and CUDA functions, for any
    broadcastable ``x`` and ``c`` (also used by tests/test_cuda_sim.py)."""
    import math

    from numba import cuda

    import tape as tp

    @cuda.jit(device=True)
    def fwd_dev(x, c):
        return c * math.tanh(x / c)

    @cuda.jit(device=True)
    def vjp_dev(gy, y, x, c):
        r = y / c
        d = 1.0 - r * r
        return gy * d, gy * (r - (x / c) * d)

    def vjp(gy, y, x, c):
        r = y / c
        d = 1.0 - r * r
        return _sum_to(gy * d, np.shape(x)), _sum_to(gy * (r - (x / c) * d), np.shape(c))

    return tp.custom_op(name, lambda x, c: c * np.tanh(x / c), vjp, out_shape=np.broadcast_shapes,
                        cuda_fwd=fwd_dev, cuda_vjp=vjp_dev)  # fmt: skip


def custom(quick):
    """Custom ops from CUDA device functions: parity with the CPU replay (the op's NumPy
    functions) and with the same function from registry ops, single and batched; then the
    gradient replay time of a large tape against the registry-op version."""
    import tape as tp
    from tape.gpu import CudaTape, gradient_batch

    op = _softclip_op()
    rng = np.random.default_rng(3)

    def f(x, c):
        return (op(x[1:], c) * op(x[:-1], c)).sum() + (tp.sin(op(x, c)) ** 2).sum()

    def ref(x, c):
        s = lambda v: c * tp.tanh(v / c)  # noqa: E731
        return (s(x[1:]) * s(x[:-1])).sum() + (tp.sin(s(x)) ** 2).sum()

    bad = 0
    for n in (5, 1000, 100_000) if not TINY else (5,):
        x = rng.standard_normal(n)
        c = np.array(1.5)
        t, tr = tp.record(f, x, c), tp.record(ref, x, c)
        for coop in (True, False):
            ct = CudaTape(t, cooperative=coop)
            for got, want, what in ((ct.forward(x, c), t.forward(x, c), "value"),
                                    (ct.gradient(x, c), t.gradient(x, c), "gradient vs CPU"),
                                    (ct.gradient(x, c), tr.gradient(x, c), "gradient vs registry ops")):  # fmt: skip
                got = got if isinstance(got, tuple) else (got,)
                want = want if isinstance(want, tuple) else (want,)
                err = max(
                    float(np.max(np.abs(g - w) / (1e-12 + np.abs(w)))) for g, w in zip(got, want)
                )
                ok = err < 1e-9
                bad += not ok
                print(
                    f"  n={n:>7} coop={coop!s:5} {what:25s} max rel err {err:.1e} {'ok' if ok else 'FAIL'}"
                )
    X = rng.standard_normal((512 if not TINY else 3, 16))
    C = rng.uniform(1.0, 2.0, X.shape[0])
    t = tp.record(f, X[0], C[0])
    v, g = gradient_batch(t, X, C)
    err = 0.0
    for b in range(0, X.shape[0], max(1, X.shape[0] // 16)):
        vb, gb = t.value_and_grad(X[b], C[b])
        err = max(err, abs(v[b] - vb) / abs(vb), float(np.max(np.abs(g[0][b] - gb[0]))),
                  abs(float(g[1][b] - gb[1])))  # fmt: skip
    bad += err > 1e-9
    print(
        f"  batched, {X.shape[0]} instances: max error vs CPU {err:.1e} {'ok' if err <= 1e-9 else 'FAIL'}"
    )
    n = 64 if TINY else (1 << 22) if quick else (1 << 24)
    x = rng.standard_normal(n)
    c = np.array(1.5)
    reps = 1 if TINY else 10
    for label, fn in (("custom op (CUDA functions)", f), ("registry ops", ref)):
        ct = CudaTape(tp.record(fn, x, c))
        ct.gradient(x, c)
        s = _time(lambda ct=ct: ct.replay(), reps)
        print(
            f"  n={n:,}: {label:28s} gradient replay {s * 1e3:8.3f} ms  ({len(ct.pieces)} pieces)"
        )
    return bad == 0


# ---------------------------------------------------------------- (b) bandwidth


def bandwidth(quick, peak):
    from numba import cuda

    import tape as tp
    from tape.gpu import CudaTape
    from tape.gpu._program import FWD, REV

    n = 64 if TINY else (1 << 24) if quick else (1 << 26)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n)
    w = rng.standard_normal(n)
    # entries: 0 mul (binary, SAME), 1 exp (unary), 2 sum
    t = tp.record(lambda x, w: tp.exp(x * w).sum(), x, w)
    ct = CudaTape(t)
    ct.gradient(x, w)
    reps = 1 if TINY else 5 if quick else 10

    a = cuda.to_device(x)
    b = cuda.device_array_like(a)
    s_copy = _time(lambda: b.copy_to_device(a), reps)
    rows = [("device-to-device copy (read+write)", 16 * n, s_copy)]
    sweep = ct._sweep
    grid = ct.blocks
    T = ct.threads
    for label, i, mode, nbytes in (
        ("mul  forward  (2 reads, 1 write)", 0, FWD, 24 * n),
        ("exp  forward  (1 read, 1 write)", 1, FWD, 16 * n),
        ("exp  reverse  (4 reads, 1 write)", 1, REV, 40 * n),
        ("mul  reverse  (2 phases: 2 x (5 reads, 1 write))", 0, REV, 96 * n),
    ):
        s = _time(lambda i=i, mode=mode: sweep(grid, T, ct.prog, ct.arena, mode, i, i + 1), reps)
        rows.append((label, nbytes, s))
    print(f"  n = {n:,} float64 elements; cooperative grid {grid} blocks x {T} threads")
    for label, nbytes, s in rows:
        gbs = nbytes / s / 1e9
        frac = f"{100 * nbytes / s / peak:5.1f}% of peak" if peak else ""
        print(f"  {label:50s} {s * 1e3:8.3f} ms  {gbs:8.1f} GB/s  {frac}")
        _row(label, gbs, "GB/s", f"{100 * nbytes / s / peak:.1f}% of peak" if peak else "")
    s_grad = _time(lambda: ct.replay(), reps)
    print(f"  whole gradient replay (3 entries + zero + seed): {s_grad * 1e3:.3f} ms")
    _row("gradient replay, exp(x * w).sum()", s_grad * 1e3, "ms", f"n = {n:,}")


# ---------------------------------------------------------------- (c) batched replay


def batched(quick, peak=None):
    import tape as tp
    from tape.gpu import CudaBatch

    def rosen(x):
        return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

    n = 8 if TINY else 10**5 if quick else 10**6
    rng = np.random.default_rng(2)
    X = rng.standard_normal((n, 10))
    t = tp.record(rosen, X[0])
    reps = 1 if TINY else 5 if quick else 10
    ref = np.array([t.gradient(X[b]) for b in range(0, n, max(1, n // 50))])
    # the least an instance moves: its 10 arguments in, its value and 10 gradients out
    per = 8 * (10 + 1 + 10)
    times = {}
    for label, comp in (("interpreter", False), ("compiled", True)):
        cb = CudaBatch(t, n, compile=comp)
        cb.load(X)
        s = times[label] = _time(lambda cb=cb: cb.run(), reps)
        v, g = cb.results()
        err = np.max(np.abs(g[:: max(1, n // 50)][: len(ref)] - ref))
        bound = f", {100 * n * per / s / peak:.1f}% of the memory-bound rate" if peak else ""
        _row(f"Rosenbrock-10 gradients, {label}", n / s, "instances/s", bound[2:])
        print(f"  tape {label} (Rosenbrock-10, {t.n_entries} entries): {n:,} instances in "
              f"{s * 1e3:.3f} ms = {n / s:,.0f} instances/s{bound} (max |error| vs CPU on a "
              f"sample: {err:.1e})")  # fmt: skip
    s = min(times.values())
    from tape.transforms.batch import gradient_batch as cpu_batch

    s_cpu = _time(lambda: cpu_batch(t, X), 1 if TINY else 3)
    _row("Rosenbrock-10 gradients, CPU gradient_batch (all cores)", n / s_cpu, "instances/s")
    print(f"  CPU gradient_batch (all cores): {s_cpu * 1e3:.3f} ms = {n / s_cpu:,.0f} instances/s "
          f"-> the faster GPU tier takes {s / s_cpu:.3f}x the CPU's time")  # fmt: skip
    try:
        import jax
        import jax.numpy as jnp

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            raise RuntimeError("jax has no GPU device")
        jax.config.update("jax_enable_x64", True)

        def jrosen(x):
            return jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)

        f = jax.jit(jax.vmap(jax.grad(jrosen)))
        Xj = jax.device_put(jnp.asarray(X), gpus[0])
        f(Xj).block_until_ready()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f(Xj).block_until_ready()
            ts.append(time.perf_counter() - t0)
        sj = float(np.median(ts))
        _row("Rosenbrock-10 gradients, jax.vmap(jax.grad)", n / sj, "instances/s")
        print(f"  jax.vmap(jax.grad) (jit, float64): {sj * 1e3:.3f} ms = {n / sj:,.0f} instances/s "
              f"-> tape / jax = {sj / s:.2f}x")  # fmt: skip
    except Exception as e:  # noqa: BLE001
        print(f"  jax: not measured ({type(e).__name__}: {e})")
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device")

        def trosen(x):
            return torch.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)

        f = torch.func.vmap(torch.func.grad(trosen))
        Xt = torch.as_tensor(X, device="cuda")
        f(Xt)
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f(Xt)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        st = float(np.median(ts))
        _row("Rosenbrock-10 gradients, torch.func.vmap(grad)", n / st, "instances/s")
        print(f"  torch.func.vmap(grad) (float64): {st * 1e3:.3f} ms = {n / st:,.0f} instances/s "
              f"-> tape / torch = {st / s:.2f}x")  # fmt: skip
    except Exception as e:  # noqa: BLE001
        print(f"  torch: not measured ({type(e).__name__}: {e})")


# ---------------------------------------------------------------- (d) latency


def latency(quick):
    import tape as tp
    from tape.gpu import CudaTape

    rng = np.random.default_rng(3)
    x0 = rng.standard_normal(16)

    def chain(x):
        y = x
        for k in range(20):
            y = tp.tanh(y * 0.9 + 0.1) if k % 2 else tp.sin(y) * y
        return (y * y).sum()

    t = tp.record(chain, x0)
    print(f"  tape: {t.n_entries} entries, buffers of 16 elements")
    reps = 2 if TINY else 50 if quick else 200
    for coop, comp in ((True, False), (False, False), (True, True)):
        ct = CudaTape(t, cooperative=coop, compile=comp)
        np.testing.assert_allclose(ct.gradient(x0), t.gradient(x0), rtol=1e-10)
        s_dev = _time(lambda: ct.replay(), reps)
        s_host = _time(lambda: ct.gradient(x0), reps)
        how = "compiled tier" if comp else "one launch per run" if coop else "one launch per phase"
        _row(f"gradient replay, {how}, on the device", s_dev * 1e6, "us")
        _row(f"gradient replay, {how}, with host copies", s_host * 1e6, "us")
        print(f"  {how:22s}: "
              f"device-resident replay {s_dev * 1e6:8.1f} us, with host copies {s_host * 1e6:8.1f} us "
              f"({len(ct.pieces)} piece(s))")  # fmt: skip
    s_cpu = _time(lambda: t.gradient(x0), reps, warmup=5)
    print(f"  CPU t.gradient for comparison: {s_cpu * 1e6:.1f} us")
    _row("gradient, CPU t.gradient", s_cpu * 1e6, "us")


# ---------------------------------------------------------------- (f) compiled tier


def compiled(quick, peak):
    import tape as tp
    from tape.gpu import CudaTape

    n = 64 if TINY else (1 << 24) if quick else 100_000_000
    x = np.random.default_rng(4).standard_normal(n)

    def chain(x):  # 8 elementwise ops, then the sum
        y = tp.sin(x) * 0.9
        y = tp.exp(y) + 0.1
        y = tp.tanh(y) * x
        return (tp.cos(y) - 0.2).sum()

    t = tp.record(chain, x)
    want = t.gradient(x)
    reps = 1 if TINY else 5 if quick else 10
    # the fused kernels read x forward, read x and write its adjoint in reverse
    moved = {"forward": 8 * n, "gradient": 24 * n}
    print(f"  n = {n:,} float64 elements, {t.n_entries} entries; bytes counted: forward 8 n, "
          f"gradient 24 n (the least the chain must move)")  # fmt: skip
    for label, ct in (("interpreter", CudaTape(t)), ("compiled", CudaTape(t, compile=True))):
        np.testing.assert_allclose(ct.gradient(x), want, rtol=1e-10, atol=1e-12)
        for what, fn in (("forward", lambda ct=ct: ct.replay(backward=False)),
                         ("gradient", lambda ct=ct: ct.replay())):  # fmt: skip
            s = _time(fn, reps)
            frac = f"{100 * moved[what] / s / peak:5.1f}% of peak" if peak else ""
            _row(f"8-op chain, {label}, {what}", moved[what] / s / 1e9, "GB/s",
                 f"n = {n:,}; {frac.strip()}")  # fmt: skip
            print(f"  {label:12s} {what:9s} {s * 1e3:9.3f} ms  {moved[what] / s / 1e9:8.1f} GB/s "
                  f"{frac}  ({len(ct.pieces)} piece(s))")  # fmt: skip


# ---------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument(
        "--only",
        default="parity,bandwidth,compiled,batched,latency,custom",
        help="comma-separated sections, run in this order",
    )
    ap.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    ap.add_argument("--markdown", metavar="FILE", help="write every figure as a Markdown table")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # simulator smoke test
    args = ap.parse_args(argv)
    global TINY
    TINY = args.tiny

    from tape.gpu import available

    if not available():
        print("no CUDA GPU available: this check needs a real NVIDIA GPU (the simulator tests "
              "are in tests/test_cuda_sim.py)")  # fmt: skip
        return 2
    import numba

    import tape

    try:
        name, cc, sms, peak = device_info()
    except Exception as e:  # noqa: BLE001  (the simulator's fake device)
        name, cc, sms, peak = f"unknown device ({e})", (0, 0), 0, None
    _hr("device")
    print(f"  {name}, compute capability {cc[0]}.{cc[1]}, {sms} SMs, peak memory bandwidth "
          f"{peak / 1e9:,.0f} GB/s" if peak else f"  {name} (peak bandwidth unknown)")  # fmt: skip
    try:
        from importlib.metadata import version

        ncv = version("numba-cuda")
    except Exception:  # noqa: BLE001
        ncv = "?"
    print(f"  numba {numba.__version__}, numba-cuda {ncv}, tape {tape.__version__}")
    t0 = time.perf_counter()
    ok = True
    t_start = time.perf_counter()
    _hr("compile (first use; cached afterwards)")
    try:
        import tape as tp
        from tape.gpu import CudaTape, gradient_batch

        t = tp.record(lambda x: (tp.exp(x) * x).sum(), np.ones(4))
        ct = CudaTape(t)
        ct.gradient(np.ones(4))
        t1 = time.perf_counter()
        print(f"  sweep kernel: {t1 - t0:.1f} s")
        gradient_batch(t, np.ones((3, 4)))
        t2 = time.perf_counter()
        print(f"  batch kernel: {t2 - t1:.1f} s")
        try:
            k = ct._sweep.kernel
            print(f"  sweep kernel: {k.regs_per_thread} registers/thread, cooperative={k.cooperative}, "
                  f"max co-resident blocks of {ct.threads}: {ct.blocks}")  # fmt: skip
        except Exception as e:  # noqa: BLE001
            print(f"  (kernel attributes unavailable: {e})")
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        ok = False
    sections = [("parity", "(a) parity with the CPU sweeps, every op", lambda: parity(args.quick)),
                ("bandwidth", "(b) bandwidth of large elementwise entries", lambda: bandwidth(args.quick, peak)),
                ("batched", "(c) batched replay throughput", lambda: batched(args.quick, peak)),
                ("latency", "(d) latency of a 50-entry tape", lambda: latency(args.quick)),
                ("custom", "(e) custom ops from CUDA device functions", lambda: custom(args.quick)),
                ("compiled", "(f) compiled tier: a fused chain of 8 ops", lambda: compiled(args.quick, peak))]  # fmt: skip
    by_key = {key: (title, fn) for key, title, fn in sections}
    for key in [k for k in args.only.split(",") if k in by_key]:  # in the order given
        title, fn = by_key[key]
        _hr(title)
        SECTION[0] = title.split(")")[0] + ")"
        t0 = time.perf_counter()
        try:
            r = fn()
            if key in ("parity", "custom") and r is False:
                ok = False
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            if key in ("parity", "custom"):
                ok = False
        print(f"  [{time.perf_counter() - t0:.1f} s]", flush=True)
        _row("section time", time.perf_counter() - t0, "s")
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s; parity {'OK' if ok else 'FAILED'}")
    info = {"name": name, "compute_capability": list(cc), "sms": sms, "peak_bytes_per_s": peak,
            "versions": f"numba {numba.__version__}, numba-cuda {ncv}, tape {tape.__version__}",
            "args": argv if argv is not None else sys.argv[1:]}  # fmt: skip
    _report(info, ok, args.json, args.markdown)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
