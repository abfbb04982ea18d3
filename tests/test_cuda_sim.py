"""The GPU path (tape.cuda) without a GPU: Numba's CUDA simulator, PTX compilation, and the
real-GPU tests (marked ``gpu``, skipped without one).

The simulator must be switched on before numba is imported, so in the normal test run
:func:`test_simulator_suite` runs this file again in a subprocess with
``NUMBA_ENABLE_CUDASIM=1``, where the simulator tests below are collected instead; the CPU
suite's own process never imports ``numba.cuda``. To see them one by one::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/test_cuda_sim.py -v

Every op of the registry runs forward and reverse on the simulated device and is compared
with the CPU sweeps on the same tape (tiny sizes: a simulated thread is a Python thread).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import _background
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
IN_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
needs_numba_cuda = pytest.mark.skipif(
    not HAS_NUMBA_CUDA, reason="numba-cuda is not installed (pip install -e '.[cuda]')"
)


def _looks_like_gpu():
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidiactl")


def _run(args, env_extra, timeout):
    env = dict(os.environ, **env_extra)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


if not IN_SIM:
    # ------------------------------------------------------------ normal test process

    # Runs on the second core while the main process works (tests/_background.py).
    _background.register_simulator_suite("cuda_sim", __file__, "test_simulator_suite")

    @needs_numba_cuda
    def test_simulator_suite():
        """Every simulator test below, in a subprocess with the simulator on."""
        r = _background.result("cuda_sim")
        tail = (r.stdout[-6000:] + "\n" + r.stderr[-3000:]).strip()
        print(tail)
        assert r.returncode == 0, f"simulator tests failed:\n{tail}"

    _PTX_CODE = (
        "import sys\n"
        "try:\n"
        "    from numba.cuda.cudadrv import nvvm\n"
        "    nvvm.NVVM()\n"
        "except Exception as e:\n"
        "    print('SKIP', type(e).__name__, e); sys.exit(0)\n"
        "from tape.gpu._ptx import assemble, compile_all, ptxas\n"
        "every = compile_all(dtypes=('float64',))\n"
        "for (k, dt), (ptx, s) in every.items():\n"
        "    assert '.entry' in ptx, k\n"
        "    print(k, dt, len(ptx), round(s, 1))\n"
        "    if k == 'sweep' and ptxas():\n"
        "        assemble(ptx)  # the cooperative kernel's link step\n"
        "        print('sweep assembled as relocatable code')\n"
        # a custom op's wrappers, with the user's device functions and a one-input vjp
        # returning its cotangent alone (the as_tuple overload)
        "import math, numpy as np, tape as tp\n"
        "from numba import cuda, types as nbt\n"
        "from tape.gpu import _custom\n"
        "from tape.gpu._ptx import _target_cc\n"
        "dev = cuda.jit(device=True)(lambda x, c: c * math.tanh(x / c))\n"
        "op2 = tp.custom_op('c2', np.add, np.add, cuda_fwd=dev,\n"
        "                   cuda_vjp=lambda gy, y, x, c: (gy * c, gy * x))\n"
        "op1 = tp.custom_op('c1', np.sin, np.cos, cuda_fwd=math.sin,\n"
        "                   cuda_vjp=lambda gy, y, x: gy * math.cos(x))\n"
        "i64 = nbt.int64\n"
        "with _target_cc((9, 0)):\n"
        "    for op, n in ((op2, 2), (op1, 1)):\n"
        "        for kern in _custom.kernels(op, n):\n"
        "            for f in (nbt.float64, nbt.float32):\n"
        "                sig = (i64[::1], f[::1], i64[::1], i64, i64)\n"
        "                ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))\n"
        "                assert '.entry' in ptx and (kern is not _custom.kernels(op, n)[1] or 'atom' in ptx)\n"
        "few = tp.custom_op('few', np.add, np.add, cuda_fwd=lambda a, b: a * b,\n"
        "                   cuda_vjp=lambda gy, y, a, b: gy * b)\n"
        "try:\n"
        "    with _target_cc((9, 0)):\n"
        "        cuda.compile_ptx(_custom.kernels(few, 2)[1].py_func, sig, cc=(9, 0))\n"
        "    raise AssertionError('a vjp with too few cotangents compiled')\n"
        "except Exception as e:\n"
        "    assert \"'few': cuda_vjp returned 1 cotangent(s) for 2\" in str(e), e\n"
        "print('custom op wrappers compiled')\n"
        # one tape's op set: the device compiles its rules only
        "from tape.gpu._replay import kernels_for\n"
        "t = tp.record(lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(),\n"
        "              np.ones(8))\n"
        "full = every[('sweep', 'float64')]  # compiled above: the sweep of every op\n"
        "K = kernels_for(t)\n"
        "few = compile_all(dtypes=('float64',), module=K, kernels=('sweep',))[('sweep', 'float64')]\n"
        "assert '.entry' in few[0] and len(few[0]) < len(full[0]), (len(few[0]), len(full[0]))\n"
        "print('sweep of every op:', len(full[0]), 'chars,', round(full[1], 1), 's; of the',\n"
        "      len(K.OPS), 'ops of a Rosenbrock tape:', len(few[0]), 'chars,', round(few[1], 1), 's')\n"
        # the compiled tier's kernels for a tape: forward, reverse (atomic adds into the
        # adjoint of x, which x[1:] and x[:-1] share), the folded sum's zeroing
        "from tape.gpu._ptx import compile_fused\n"
        "for dt in ('float64', 'float32'):\n"
        "    tr = tp.record(lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(),\n"
        "                   np.ones(8, dt))\n"
        "    fused = compile_fused(tr, dtype=dt)\n"
        "    assert sorted(fused) == ['fwd0', 'rev0', 'zero0', 'zero_leaves'], sorted(fused)\n"
        "    assert all('.entry' in p for p, _ in fused.values()) and 'atom' in fused['rev0'][0]\n"
        "    if ptxas():\n"
        "        assemble(fused['rev0'][0])\n"
        "print('fused kernels compiled')\n"
    )
    _background.register(
        "ptx", ["-c", _PTX_CODE], {"NUMBA_ENABLE_CUDASIM": "0"}, timeout=1200,
        wanted=lambda item: item.name == "test_ptx_compiles_for_cc90",
    )  # fmt: skip

    @needs_numba_cuda
    def test_ptx_compiles_for_cc90():
        """Every kernel, with every rule and op kernel inlined, compiles to PTX for sm_90: Numba's
        type inference and NVVM catch what the simulator lets through. The cooperative sweep
        is then assembled as its link on a GPU does (relocatable, under the register cap),
        which failed on an H200 before the cap covered every function. Needs the toolkit
        wheels (numba-cuda[cu12]); skipped without them."""
        r = _background.result("ptx")
        if r.stdout.startswith("SKIP"):
            pytest.skip(f"CUDA toolkit (NVVM) not available: {r.stdout.strip()}")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]

    @needs_numba_cuda
    def test_cpu_path_never_imports_numba_cuda():
        code = (
            "import sys, numpy as np, tape as tp\n"
            "from tape.batch import gradient_batch\n"
            "t = tp.record(lambda x: (x * x).sum(), np.ones(3))\n"
            "t.gradient(np.ones(3)); gradient_batch(t, np.ones((2, 3)))\n"
            "assert not any(m == 'numba.cuda' or m.startswith('numba.cuda.') or m.startswith('tape.gpu')"
            " for m in sys.modules), sorted(m for m in sys.modules if 'cuda' in m)\n"
        )
        r = _run(["-c", code], {}, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr

    @needs_numba_cuda
    @pytest.mark.skipif(_looks_like_gpu(), reason="a GPU is present")
    def test_no_gpu_error_says_how_to_use_the_simulator():
        code = (
            "import numpy as np, tape as tp\n"
            "from tape.gpu import CudaTape\n"
            "t = tp.record(lambda x: (x * x).sum(), np.ones(3))\n"
            "try:\n"
            "    CudaTape(t)\n"
            "except RuntimeError as e:\n"
            "    assert 'NUMBA_ENABLE_CUDASIM' in str(e), e; print('ok')\n"
        )
        r = _run(["-c", code], {"NUMBA_ENABLE_CUDASIM": "0"}, timeout=600)
        assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr

    # ------------------------------------------------------------ real GPU

    def _gpu():
        if not HAS_NUMBA_CUDA or not _looks_like_gpu():
            pytest.skip("no NVIDIA GPU")
        from numba import cuda

        if not cuda.is_available():
            pytest.skip("no usable CUDA GPU")

    @pytest.mark.gpu
    def test_gpu_rosenbrock_gradient_and_batch():
        _gpu()
        import tape as tp
        from tape.gpu import CudaTape, gradient_batch
        from tape.transforms.batch import gradient_batch as cpu_batch

        def rosen(x):
            return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

        rng = np.random.default_rng(0)
        t = tp.record(rosen, rng.standard_normal(1000))
        x = rng.standard_normal(1000)
        ct = CudaTape(t)
        np.testing.assert_allclose(ct.gradient(x), t.gradient(x), rtol=1e-12, atol=1e-9)
        t10 = tp.record(rosen, rng.standard_normal(10))
        X = rng.standard_normal((4096, 10))
        v, g = gradient_batch(t10, X)
        v2, g2 = cpu_batch(t10, X)
        np.testing.assert_allclose(g, g2, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(v, v2, rtol=1e-12)

    @pytest.mark.gpu
    def test_gpu_large_entries_multi_block():
        _gpu()
        import tape as tp
        from tape.gpu import CudaTape

        rng = np.random.default_rng(1)
        x = rng.standard_normal(200_000)
        w = rng.standard_normal((300, 200))
        t = tp.record(
            lambda x, w: (tp.tanh(x) * x).sum() + tp.max(w, axis=0).sum() + (w @ w.T).prod(),
            x,
            w * 0.01,
        )
        for coop in (True, False):
            ct = CudaTape(t, cooperative=coop)
            for a, b in zip(ct.gradient(x, w * 0.01), t.gradient(x, w * 0.01)):
                np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)

    @pytest.mark.gpu
    def test_gpu_custom_op_from_cuda_functions():
        """A custom op's CUDA device functions on the device: against the CPU replay and the
        same function from registry ops, single (both launch modes) and batched."""
        _gpu()
        sys.path.insert(0, str(ROOT / "benchmarks"))
        try:
            from gpu_check import custom
        finally:
            sys.path.pop(0)
        assert custom(quick=True)

else:
    # ------------------------------------------------------------ under the simulator
    import tape as tp
    from tape.frontend import tensor
    from tape.frontend.testing import sample_inputs as sample
    from tape.gpu import CudaTape, gradient_batch
    from tape.ops.registry import OPS

    THREADS = 8  # every simulated thread is a Python thread: keep blocks small

    ELEMENTWISE = [op for op in OPS if op.kind != "structural"]
    SHAPES = {
        "unary": [((5,),), ((),)],
        "binary": [((5,), (5,)), ((), (4,)), ((4,), ()), ((3, 1), (1, 4)), ((2, 3), (3,))],
        "ternary": [((4,), (4,), (4,)), ((3, 1), (1, 4), ())],
    }

    def weighted(out_shape, rng):
        # a non-uniform output adjoint: sum(f(...) * w)
        return rng.uniform(0.5, 1.5, out_shape)

    def check(t, args, rtol=1e-12, atol=1e-12, **kw):
        """The device replay of ``t`` against the CPU sweeps: forward values and gradients."""
        ct = CudaTape(t, threads=kw.pop("threads", THREADS), **kw)
        want_v = t.forward(*args)
        got_v = ct.forward(*args)
        np.testing.assert_allclose(got_v, want_v, rtol=rtol, atol=atol)
        if t.wrt:
            want = t.gradient(*args)
            got = ct.gradient(*args)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        return ct

    def test_a_device_replays_with_the_dispatch_of_its_tapes_ops(rng):
        # the device's kernels for a tape hold the branches of that tape's ops only, one module
        # per op set (shared by tapes of the same set), and replay as the CPU sweeps do
        import re

        from tape.ops.registry import BY_NAME

        x = rng.uniform(0.5, 1.5, 6)
        t = tp.record(lambda a: (tp.exp(a) * a).sum(), x)
        ct = check(t, [x])
        codes = {BY_NAME[n].code for n in ("exp", "mul", "sum")}
        assert set(ct._K.OPS) == codes
        branches = {int(c) for c in re.findall(r"op == (\d+):", ct._K.SOURCE)}
        assert branches == codes
        t2 = tp.record(lambda a: (a * tp.exp(a)).sum() * 2.0, x)  # the same ops
        assert CudaTape(t2, threads=THREADS)._K is ct._K

    @pytest.mark.parametrize("op", ELEMENTWISE, ids=lambda o: o.name)
    def test_elementwise_op_matches_cpu(op, rng):
        for shapes in SHAPES[op.kind]:
            xs = sample(op, shapes, rng)
            out_shape = np.broadcast_shapes(*shapes)
            w = weighted(out_shape, rng)
            wrt = [k for k, d in enumerate(op.differentiable) if d]
            t = tp.record(lambda *a: (tensor.elementwise(op, *a) * w).sum(), *xs, wrt=wrt)
            rtol, atol = op.tol
            check(t, xs, rtol=rtol, atol=atol)

    def _reduction_cases():
        for name in ("sum", "max", "min", "prod"):
            for axis, keep in ((None, False), (0, False), (1, True), ((0, 2), False), (-1, False)):
                yield name, axis, keep

    @pytest.mark.parametrize("name,axis,keep", list(_reduction_cases()))
    def test_reduction_matches_cpu(name, axis, keep, rng):
        x = rng.uniform(0.5, 1.5, (3, 4, 2))
        if name in ("max", "min"):
            x[0, 1, :] = x[0, 0, :]  # ties share the adjoint
        if name == "prod":
            x[1, 2, 1] = 0.0  # one zero in a group
            x[2, 0, :] = 0.0  # two zeros
        f = getattr(tp, name)
        out_shape = np.asarray(getattr(np, name)(x, axis=axis, keepdims=keep)).shape
        w = weighted(out_shape, rng)
        t = tp.record(lambda a: (f(a, axis=axis, keepdims=keep) * w).sum(), x)
        check(t, [x])

    @pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
    def test_reduction_split_over_blocks(name, rng):
        # without grid barriers (one launch per phase), a full reduction is split over the
        # blocks and the partials combined in a second phase; the simulator runs several blocks
        x = rng.uniform(0.5, 1.5, (40,))
        x[7] = x[3] if name in ("max", "min") else x[7]
        f = getattr(tp, name)
        t = tp.record(lambda a: f(a * a) + f(a.reshape(5, 8), axis=0).sum(), x)
        check(t, [x], cooperative=False, blocks=3)

    def test_broadcast_and_scatter_accumulate_across_blocks(rng):
        # atomics: a scalar and a row broadcast against a matrix, a gather with repeated rows
        x = rng.standard_normal((6, 5))
        s = rng.standard_normal(())
        r = rng.standard_normal((5,))
        idx = np.array([0, 2, 2, 5, -1, 0, 0], np.int64)
        t = tp.record(
            lambda x, s, r, i: ((x * s + r) ** 2).sum() + (tp.take(x, i, axis=0) * 1.5).sum()
            + tp.broadcast_to(r, (4, 5)).prod(),
            x, s, r, idx,
        )  # fmt: skip
        check(t, [x, s, r, idx], cooperative=False, blocks=3)
        check(t, [x, s, r, idx])

    def test_movement_ops_match_cpu(rng):
        x = rng.standard_normal((3, 4))
        y = rng.standard_normal((3, 2))
        w = rng.standard_normal((2, 3, 4))

        def f(x, y):
            a = tp.transpose(x) * 2.0  # strided copy
            b = x[::-1, ::2]  # negative strides
            c = tp.concatenate([x, y], axis=1)
            d = tp.stack([x, x * x], axis=0)
            e = tp.broadcast_to(x[:, :1], (3, 4))
            return a.sum() + (b * b).sum() + (c**3).sum() + (d * w).sum() + (e * x).sum()

        t = tp.record(f, x, y)
        check(t, [x, y])

    def test_take_matches_cpu_and_checks_indices(rng):
        x = rng.standard_normal((5, 5))
        idx = np.array([[4, 0], [-1, 4]], np.int64)
        t = tp.record(
            lambda x, i: (tp.take(x, i, axis=0) ** 2).sum() + tp.take(x, i[0], axis=1).sum(), x, idx
        )
        ct = check(t, [x, idx])
        with pytest.raises(IndexError, match="take"):
            ct.gradient(x, np.array([[5, 0], [0, 0]]))
        with pytest.raises(IndexError):
            ct.forward(x, np.array([[0, -6], [0, 0]]))
        # the failure is not sticky
        np.testing.assert_allclose(ct.gradient(x, idx), t.gradient(x, idx), rtol=1e-12)

    def test_cross_entropy_matches_cpu(rng):
        # one thread per row; class axis 1 of (N, C) and (N, C, d), a weighted mean, and rows
        # whose logits are large (shifted by their maximum)
        x = rng.standard_normal((6, 4)) * 3
        x[2] += 800.0
        z = rng.standard_normal((3, 4, 2))
        labels = np.array([0, 3, 1, 1, 2, 3])
        labels3 = np.array([[0, 3], [2, 2], [1, 0]])
        w = np.array([0.5, 2.0, 1.0, 1.5])
        F = tp.nn.functional

        def f(x, z):
            return (
                F.cross_entropy(x, labels)
                + F.cross_entropy(z, labels3, reduction="sum") * 0.5
                + F.cross_entropy(x, labels, weight=tp.tensor(w), ignore_index=1)
            )

        t = tp.record(f, x, z)
        check(t, [x, z])
        check(t, [x, z], cooperative=False, blocks=2)

    def test_logsumexp_matches_cpu(rng):
        # one thread per row: the last axis, a middle axis (strided rows) and all axes, with
        # a row of large values (shifted by its maximum)
        x = rng.standard_normal((5, 4))
        x[1] += 800.0
        z = rng.standard_normal((2, 3, 2))

        def f(x, z):
            return (
                tp.logsumexp(x, axis=1).sum()
                + (tp.logsumexp(z, axis=1) * tp.tensor([[1.0, 2.0], [3.0, 4.0]])).sum()
                + tp.logsumexp(z)
            )

        t = tp.record(f, x, z)
        check(t, [x, z])

    def test_matmul_matches_cpu(rng):
        a = rng.standard_normal((3, 4))
        b = rng.standard_normal((4, 2))
        c = rng.standard_normal((2, 3, 4))
        v = rng.standard_normal(4)
        sq = rng.standard_normal((3, 3))

        def f(a, b, c, v, sq):
            return (
                (a @ b).sum() * 0.5
                + ((c @ b) ** 2).sum()  # batched, B shared by the batch
                + (v @ b).sum()
                + (a @ v).sum()  # 1-D operands
                + (sq @ sq).sum()  # both inputs one buffer: two reverse phases
                + tp.outer(v, v).sum()
                + (tp.nn.functional.linear(c, a) ** 2).sum()  # matmul_nt: a held as n x k
                + tp.nn.functional.linear(sq, sq).sum() * 0.5  # ... both inputs one buffer
            )

        t = tp.record(f, a, b, c, v, sq)
        check(t, [a, b, c, v, sq])
        check(t, [a, b, c, v, sq], cooperative=False, blocks=2)

    def test_matmul_in_tiles_across_blocks(rng):
        # products larger than a tile in every dimension and not multiples of it, over more
        # than one step of the inner dimension, on a grid of several blocks; an operand shared
        # by the batch gets its adjoint summed over it
        a = rng.standard_normal((2, 9, 19))
        b = rng.standard_normal((19, 17))
        w = rng.standard_normal((9, 19))
        x = rng.standard_normal((2, 19, 3))
        h = rng.standard_normal((17, 19))

        def f(a, b, w, x, h):
            return (
                ((a @ b) ** 2).sum()  # B shared by the batch
                + (tp.tanh(w @ x) ** 2).sum()  # A shared by the batch
                + ((tp.nn.functional.linear(a, h) * 0.5) ** 2).sum()  # matmul_nt
            )

        t = tp.record(f, a, b, w, x, h)
        args = [a, b, w, x, h]
        # tiles of 2 x 16 and steps of 14 (32 threads), of 1 x 8 and steps of 16 (8 threads)
        check(t, args, threads=32, rtol=1e-11, atol=1e-11)
        check(t, args, threads=8, cooperative=False, blocks=3, rtol=1e-11, atol=1e-11)

    def test_factorisation_ops_match_cpu(rng):
        # cholesky, triangular and general solves (a batch sharing one matrix: atomics),
        # slogdet, and their rejections of singular / indefinite data
        import tape.frontend.linalg as la

        x = rng.standard_normal((4, 4))
        y = rng.standard_normal(4)
        a = rng.standard_normal((3, 3)) + 3 * np.eye(3)
        bs = rng.standard_normal((2, 3, 2))

        def f(x, y, a, bs):
            k = x @ x.T + 4 * tp.eye(4)
            low = la.cholesky(k)
            z = la.solve_triangular(low, y, lower=True)
            u = la.solve_triangular(low.T, y)  # upper
            return ((z * z).sum() + la.logdet_cholesky(low) + (u * 0.5).sum()
                    + (la.solve(a, bs) ** 2).sum() + la.slogdet(a)[1] * 1.5)  # fmt: skip

        t = tp.record(f, x, y, a, bs)
        check(t, [x, y, a, bs], rtol=1e-10, atol=1e-12)
        check(t, [x, y, a, bs], rtol=1e-10, atol=1e-12, cooperative=False, blocks=2)
        ct = CudaTape(t, threads=THREADS)
        with pytest.raises(np.linalg.LinAlgError, match="singular"):
            ct.forward(x, y, np.zeros((3, 3)), bs)
        t2 = tp.record(lambda s: la.cholesky(s).sum(), np.eye(3))
        with pytest.raises(np.linalg.LinAlgError, match="positive definite"):
            CudaTape(t2, threads=THREADS).forward(-np.eye(3))
        X = rng.standard_normal((5, 4, 4))
        v, g = gradient_batch(t, X, np.tile(y, (5, 1)), np.tile(a, (5, 1, 1)),
                              np.tile(bs, (5, 1, 1, 1)), threads=THREADS)  # fmt: skip
        for b in range(5):
            want = t.gradient(X[b], y, a, bs)
            np.testing.assert_allclose(g[0][b], want[0], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(v[b], t.forward(X[b], y, a, bs), rtol=1e-12)

    def test_spectral_ops_match_cpu(rng):
        # eigh (Jacobi on the device, LAPACK on the CPU: the same ascending order and
        # eigenvector signs) and qr (Householder, diag(R) > 0), batched, and their rejections
        import tape.frontend.linalg as la

        a = rng.standard_normal((2, 3, 3))
        x = rng.standard_normal((4, 3))
        wv, wq = rng.uniform(0.5, 1.5, (2, 3, 3)), rng.uniform(0.5, 1.5, (4, 3))

        def f(a, x):
            w, v = la.eigh(a)
            q, r = la.qr(x)
            return (v * wv).sum() + (w**2).sum() + (q * wq).sum() + (r * r[0]).sum()

        t = tp.record(f, a, x)
        check(t, [a, x], rtol=1e-10, atol=1e-12)
        tv = tp.record(lambda a, x: tp.concatenate([la.eigh(a)[1].reshape(-1), la.qr(x).Q.reshape(-1)]),
                       a, x)  # fmt: skip
        np.testing.assert_allclose(CudaTape(tv, threads=THREADS).forward(a, x), tv.forward(a, x),
                                   rtol=1e-10, atol=1e-12)  # fmt: skip
        rank1 = np.outer(np.arange(1.0, 5.0), [1.0, 2.0, 3.0])
        with pytest.raises(np.linalg.LinAlgError, match="rank deficient"):
            CudaTape(t, threads=THREADS).forward(a, rank1)
        A = rng.standard_normal((3, 2, 3, 3))
        v, g = gradient_batch(t, A, np.tile(x, (3, 1, 1)), threads=THREADS)
        for b in range(3):
            np.testing.assert_allclose(g[0][b], t.gradient(A[b], x)[0], rtol=1e-10, atol=1e-12)

    def test_overlapping_views_of_one_input(rng):
        # x[1:] and x[:-1] view the same adjoint memory: the reverse takes one input per phase
        def rosen(x):
            return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

        x = rng.standard_normal(12)
        check(tp.record(rosen, x), [x])
        check(tp.record(lambda x: (x[1:] * x[:-1]).sum(), x), [x], cooperative=False, blocks=2)

    def test_runs_of_small_and_large_entries(rng):
        # `small` decides which entries share a launch; every split gives the same result
        x = rng.standard_normal(40)
        y = rng.standard_normal(3)

        def f(x, y):
            a = tp.tanh(x) * 2.0
            b = (y * y).sum()
            c = tp.exp(y).sum() * b
            return (a * a).sum() * c + tp.sin(x).sum()

        t = tp.record(f, x, y)
        for small, min_run in ((8, 1), (8, 3), (1000, 8), (0, 1)):
            ct = check(t, [x, y], small=small, min_run=min_run)
            if small == 8 and min_run == 1:
                assert len(ct.runs) > 1

    def test_float32_tape(rng):
        x = rng.standard_normal(7).astype(np.float32)
        t = tp.record(lambda x: (tp.tanh(x) * tp.exp(x * 0.5)).sum() + tp.max(x), x)
        assert t.dtype == np.float32
        check(t, [x], rtol=1e-5, atol=1e-6)

    def test_derivatives_beyond_the_gradient_run_on_the_cpu_tape(rng):
        x = rng.standard_normal(6)
        t = tp.record(lambda x: (tp.sin(x[1:]) * x[:-1]).sum(), x)
        ct = t.to("cuda")
        np.testing.assert_array_equal(ct.hessian(x), t.hessian(x))
        np.testing.assert_array_equal(ct.hvp(x, v=x), t.hvp(x, v=x))
        np.testing.assert_array_equal(ct.jvp(x, tangents=x)[1], t.jvp(x, tangents=x)[1])
        np.testing.assert_array_equal(ct.jacobian(x), t.jacobian(x))

    def test_zero_and_accumulate_semantics(rng):
        x = rng.standard_normal(6)
        t = tp.record(lambda x: (x * tp.sin(x)).sum(), x)
        ct = CudaTape(t, threads=THREADS)
        g1 = t.gradient(x)
        ct.forward(x)
        ct.zero_grad()
        ct.backward()
        np.testing.assert_allclose(ct.grads[0], g1, rtol=1e-12)
        ct.backward()  # leaf gradients accumulate
        np.testing.assert_allclose(ct.grads[0], 2 * g1, rtol=1e-12)
        ct.zero_grad()
        np.testing.assert_allclose(ct.grads[0], 0.0)
        ct.backward()
        ct.backward()
        np.testing.assert_allclose(ct.gradient(x), g1, rtol=1e-12)  # gradient() zeroes first
        # the host tape is untouched by device replays
        t.zero_grad()
        np.testing.assert_allclose(t.grads[0], 0.0)

    def test_backward_with_seed_for_vector_output(rng):
        x = rng.standard_normal((2, 3))
        t = tp.record(lambda x: tp.exp(x) * x.sum(axis=0), x)
        ct = CudaTape(t, threads=THREADS)
        u = rng.standard_normal((2, 3))
        np.testing.assert_allclose(ct.forward(x), t.forward(x), rtol=1e-12)
        ct.zero_grad()
        ct.backward(u)
        t.zero_grad()
        t.backward(u)
        np.testing.assert_allclose(ct.grads[0], t.grads[0], rtol=1e-12)
        with pytest.raises(RuntimeError, match="not a scalar"):
            ct.backward()
        with pytest.raises(RuntimeError, match="scalar"):
            ct.gradient(x)

    def test_device_arrays_without_copy(rng):
        x = rng.standard_normal(5)
        t = tp.record(lambda x: (x**3).sum(), x)
        ct = CudaTape(t, threads=THREADS)
        ct.gradient(x)
        dg = ct.device_grads[0]
        np.testing.assert_allclose(dg.copy_to_host(), 3 * x**2, rtol=1e-12)
        ct.backward()  # the view sees the accumulation: it is the arena itself
        np.testing.assert_allclose(dg.copy_to_host(), 6 * x**2, rtol=1e-12)
        # inputs written on the device, replayed with no host transfer
        x2 = rng.standard_normal(5)
        ct.device_inputs[0].copy_to_device(x2)
        ct.replay()
        np.testing.assert_allclose(ct.device_grads[0].copy_to_host(), 3 * x2**2, rtol=1e-12)
        np.testing.assert_allclose(ct.device_value().copy_to_host(), (x2**3).sum(), rtol=1e-12)
        # a device array as an argument
        from numba import cuda

        np.testing.assert_allclose(ct.gradient(cuda.to_device(x)), 3 * x**2, rtol=1e-12)

    def test_replay_argument_errors(rng):
        t = tp.record(lambda x, y: (x * y).sum(), np.ones(3), np.ones(3))
        ct = CudaTape(t, threads=THREADS)
        with pytest.raises(tp.ReplayError, match="takes 2 arguments"):
            ct.forward(np.ones(3))
        with pytest.raises(tp.ReplayError, match="shape"):
            ct.forward(np.ones(3), np.ones(4))

    # ------------------------------------------------------------ batched replay

    def test_gradient_batch_matches_cpu_per_instance(rng):
        def rosen(x):
            return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

        t = tp.record(rosen, np.zeros(6))
        X = rng.standard_normal((21, 6))
        v, g = gradient_batch(t, X, threads=THREADS)
        assert v.shape == (21,) and g.shape == (21, 6)
        np.testing.assert_allclose(g, np.array([t.gradient(x) for x in X]), rtol=1e-12)
        np.testing.assert_allclose(v, np.array([t.forward(x) for x in X]), rtol=1e-12)

    def test_gradient_batch_every_op_kind(rng):
        # reductions, copies, gathers, matmul and broadcasting, one thread per instance
        w = rng.standard_normal((3, 4))

        def f(x, y, i):
            z = tp.tanh(x @ w) * y  # (2, 4) * (4,)
            return (tp.max(z, axis=1).sum() + tp.prod(tp.take(z, i, axis=1) + 2.0)
                    + tp.transpose(z).sum() * tp.min(x) + tp.where(x > 0, x, 0.0).sum())  # fmt: skip

        x0, y0, i0 = rng.standard_normal((2, 3)), rng.standard_normal(4), np.array([0, 3, 3])
        t = tp.record(f, x0, y0, i0)
        B = 9
        X = rng.standard_normal((B, 2, 3))
        Y = rng.standard_normal((B, 4))
        idx = rng.integers(-4, 4, (B, 3))
        v, (gx, gy) = gradient_batch(t, X, Y, idx, threads=THREADS)
        for b in range(B):
            want = t.gradient(X[b], Y[b], idx[b])
            np.testing.assert_allclose(gx[b], want[0], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(gy[b], want[1], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(v[b], t.forward(X[b], Y[b], idx[b]), rtol=1e-12)
        bad = idx.copy()
        bad[4, 1] = 7
        with pytest.raises(IndexError, match="instance 4"):
            gradient_batch(t, X, Y, bad, threads=THREADS)
        v3, _ = gradient_batch(t, X, Y, idx, threads=THREADS)  # not sticky
        np.testing.assert_allclose(v3, v)

    def test_gradient_batch_float32_and_odd_sizes(rng):
        x0 = np.ones(4, np.float32)
        t = tp.record(lambda x: (tp.sigmoid(x) * x).sum(), x0)
        for B in (1, 5):
            X = rng.standard_normal((B, 4)).astype(np.float32)
            v, g = gradient_batch(t, X, threads=4)
            assert v.dtype == np.float32 and g.dtype == np.float32
            np.testing.assert_allclose(
                g, np.array([t.gradient(x) for x in X]), rtol=1e-5, atol=1e-6
            )
            np.testing.assert_allclose(v, np.array([t.forward(x) for x in X]), rtol=1e-5)

    # ------------------------------------------------------------ one semantics with the CPU

    def test_zero_adjoint_never_evaluates_a_rule(rng):
        # where(x > 0, sqrt(x), 0) at x = 0: the sqrt rule gives 0 * inf there; the masked
        # accumulate discards it, as on the CPU. A NaN adjoint still propagates.
        x = np.array([0.0, 1.0, 4.0, 0.0, 2.0])
        w = np.array([1.0, 2.0, np.nan, 1.0, 1.0])
        f = lambda x: (tp.where(x > 0, tp.sqrt(x), 0.0) * w).sum() + tp.sqrt(x[1:3]).sum()
        t = tp.record(f, x)
        want = t.gradient(x)
        assert want[0] == 0.0 and want[3] == 0.0 and np.isnan(want[2])
        for kw in ({}, {"cooperative": False, "blocks": 2}):
            np.testing.assert_array_equal(CudaTape(t, threads=THREADS, **kw).gradient(x), want)
        X = np.stack([x, x[::-1], x + 1.0])
        _, g = gradient_batch(t, X, threads=THREADS)
        np.testing.assert_array_equal(g, np.array([t.gradient(xb) for xb in X]))

    def test_results_in_the_recorded_dtypes(rng):
        # a float32 argument on a float64 arena (a float64 constant joined it): float32
        # gradients, as on the CPU; outputs in the dtype the function returned
        c = np.array([1.0, 2.0, 3.0])
        x = np.array([0.5, -1.0, 2.0], np.float32)
        t = tp.record(lambda x: (x * c).sum(), x)
        assert t.dtype == np.float64
        ct = CudaTape(t, threads=THREADS)
        for got, want in ((ct.gradient(x), t.gradient(x)), (ct.grads[0], t.grads[0])):
            assert got.dtype == want.dtype == np.float32
            np.testing.assert_array_equal(got, want)
        v, g = ct.value_and_grad(x)
        wv, wg = t.value_and_grad(x)
        assert np.asarray(v).dtype == np.asarray(wv).dtype and g.dtype == wg.dtype
        vb, gb = gradient_batch(t, np.stack([x, 2 * x]), threads=THREADS)
        wb = t.gradient_batch(np.stack([x, 2 * x]))
        assert vb.dtype == wb[0].dtype and gb.dtype == wb[1].dtype == np.float32
        np.testing.assert_array_equal(gb, wb[1])

    # ------------------------------------------------------------ guards

    def _branchy(x):
        if x.sum() > 0:
            return (x * x).sum()
        return (x * x * x).sum()

    def _while(y):
        while y.sum() < 10:
            y = y * 2
        return (y * y).sum()

    def _escape_float(x):
        return (x * float(x[0])).sum()

    def _escape_int(x):
        return (x * int(x[1] * 2)).sum()

    def _escape_array(x):
        return (x * np.asarray(x)).sum()

    GUARDED = [_branchy, _while, _escape_float, _escape_int, _escape_array]
    POINTS = [
        np.array([-1.0, -2.0, 0.5]),
        np.array([0.1, 0.2, 0.3]),
        np.array([1.0, 2.0, 3.0]),
        np.array([-3.0, 1.0, 1.0]),
    ]

    def _fresh(fn, x):
        return tp.record(fn, x).value_and_grad(x)

    @pytest.mark.parametrize("fn", GUARDED, ids=lambda f: f.__name__)
    def test_guards_retrace_on_device(fn):
        # a guard that fails on the device: the call runs on the CPU tape, which retraces
        t = tp.record(fn, POINTS[2])
        ct = CudaTape(t, threads=THREADS)
        for x in POINTS:
            fv, fg = _fresh(fn, x)
            v, g = ct.value_and_grad(x)
            assert v == fv
            np.testing.assert_array_equal(g, fg)
            np.testing.assert_array_equal(ct.grads[0], fg)  # the device holds this call's
            assert ct.device_value().copy_to_host()[0] == fv
            assert ct.forward(x) == fv
        assert t.retraces >= 1

    def test_guards_in_every_launch_plan():
        # the guard stops a later launch (runs of small and large entries) or a one-launch-
        # per-phase replay; every thread leaves together and the next replay is clean
        def f(x):
            y = tp.tanh(x) * 2.0
            z = (y * y).sum()
            if z > 1.0:
                return (tp.sin(x) * z).sum()
            return (tp.cos(x) * z).sum()

        x1 = np.linspace(-0.5, 1.0, 12)
        x2 = x1 * 0.01
        t = tp.record(f, x1)
        for kw in ({"small": 4, "min_run": 1}, {"cooperative": False, "blocks": 2}, {}):
            ct = CudaTape(t, threads=THREADS, **kw)
            for x in (x1, x2, x1):
                fv, fg = _fresh(f, x)
                v, g = ct.value_and_grad(x)
                np.testing.assert_allclose(v, fv, rtol=1e-12)
                np.testing.assert_allclose(g, fg, rtol=1e-12)

    def test_guard_raise_on_device_is_the_cpu_error():
        t = tp.record(_branchy, np.ones(3), on_change="raise")
        ct = CudaTape(t, threads=THREADS)
        with pytest.raises(tp.GuardError) as cpu:
            t.gradient(-np.ones(3))
        for call in (ct.gradient, ct.forward, ct.value_and_grad):
            with pytest.raises(tp.GuardError) as gpu:
                call(-np.ones(3))
            assert str(gpu.value) == str(cpu.value)
            assert gpu.value.entry == cpu.value.entry and gpu.value.source == cpu.value.source
        np.testing.assert_array_equal(ct.gradient(np.ones(3)), 2 * np.ones(3))  # not sticky

    def test_guard_on_a_loaded_tape_raises_on_device():
        import pickle

        u = pickle.loads(pickle.dumps(tp.record(_branchy, np.ones(3))))
        ct = CudaTape(u, threads=THREADS)
        np.testing.assert_array_equal(ct.gradient(np.ones(3)), 2 * np.ones(3))
        with pytest.raises(tp.GuardError, match="cannot retrace"):
            ct.gradient(-np.ones(3))

    def test_guard_warn_on_device_warns_and_stays_on_the_recorded_path():
        import warnings

        t = tp.record(_branchy, np.ones(3), on_change="warn")
        ct = CudaTape(t, threads=THREADS)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            g1 = ct.gradient(-np.ones(3))
            g2 = ct.gradient(-2 * np.ones(3))
        assert sum(issubclass(x.category, tp.GuardWarning) for x in w) == 1
        np.testing.assert_array_equal(g1, -2 * np.ones(3))  # d/dx sum(x*x): recorded path
        np.testing.assert_array_equal(g2, -4 * np.ones(3))

    def test_device_state_after_a_call_on_the_cpu():
        t = tp.record(_branchy, np.ones(3))
        ct = CudaTape(t, threads=THREADS)
        xn = np.array([-1.0, -2.0, 0.5])
        fv, fg = _fresh(_branchy, xn)
        assert ct.forward(xn) == fv  # ran on the CPU tape (retraced)
        ct.zero_grad()
        ct.backward()  # the CPU tape's reverse sweep, added to the device gradients
        np.testing.assert_array_equal(ct.grads[0], fg)
        ct.backward()
        np.testing.assert_array_equal(ct.device_grads[0].copy_to_host(), 2 * fg)
        # inputs written on the device, replayed: the guard fails there too
        ct.device_inputs[0].copy_to_device(xn)
        ct.replay()
        np.testing.assert_array_equal(ct.grads[0], fg)
        assert ct.device_value().copy_to_host()[0] == fv
        # back on the recorded path, everything runs on the device again
        x = np.array([1.0, 2.0, 3.0])
        np.testing.assert_array_equal(ct.gradient(x), 2 * x)
        ct.backward()
        np.testing.assert_array_equal(ct.grads[0], 4 * x)

    def test_gradient_batch_redoes_instances_that_leave_the_path():
        X = np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [0.5, 0.5, -2.0], [2.0, -1.0, 0.0]])
        t = tp.record(_branchy, X[0])
        vals, grads = gradient_batch(t, X, threads=THREADS)
        for b, x in enumerate(X):
            fv, fg = _fresh(_branchy, x)
            assert vals[b] == fv
            np.testing.assert_array_equal(grads[b], fg)
        strict = tp.record(_branchy, X[0], on_change="raise")
        with pytest.raises(tp.GuardError, match="instance 1"):
            gradient_batch(strict, X, threads=THREADS)
        vals, _ = gradient_batch(strict, X[[0, 3]], threads=THREADS)  # not sticky
        np.testing.assert_array_equal(vals, [14.0, 5.0])

    def test_gradient_batch_guards_gathers_and_float32(rng):
        def f(x, i):
            y = tp.take(x, i, axis=0) * 2.0
            if y.sum() > 0:
                return (y * y).sum()
            return tp.exp(y).sum()

        x0 = np.array([0.5, 1.0, -0.25, 2.0], np.float32)
        t = tp.record(f, x0, np.array([0, 3, 3]))
        B = 7
        X = rng.standard_normal((B, 4)).astype(np.float32)
        idx = rng.integers(-4, 4, (B, 3))
        v, g = gradient_batch(t, X, idx, threads=4)
        wv, wg = t.gradient_batch(X, idx)
        assert v.dtype == wv.dtype and g.dtype == wg.dtype == np.float32
        np.testing.assert_allclose(v, wv, rtol=1e-6)
        np.testing.assert_allclose(g, wg, rtol=1e-6)
        assert t.retraces >= 1
        bad = idx.copy()
        bad[5, 2] = 4
        with pytest.raises(IndexError, match="instance 5"):
            gradient_batch(t, X, bad, threads=4)

    # ------------------------------------------------------------ custom ops on the device

    import math

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from gpu_check import _softclip_op
    finally:
        sys.path.pop(0)

    SOFTCLIP = _softclip_op("softclip_gpu")  # NumPy and CUDA functions, any broadcast

    def _sin_vjp(gy, y, x):  # plain Python, one cotangent alone (not a tuple)
        return gy * math.cos(x)

    SIN = tp.custom_op(
        "sin_gpu", np.sin, lambda gy, y, x: gy * np.cos(x), cuda_fwd=math.sin, cuda_vjp=_sin_vjp
    )

    def _softclip_ref(x, c):  # the same function from registry ops
        return c * tp.tanh(x / c)

    def _custom_cases(rng):
        """(name, f with the custom ops, f from registry ops, arguments): the op at the start,
        middle and end of a tape; overlapping views of one input; a scalar, a row and a
        column broadcast (atomics into one adjoint element); a constant input."""
        x = rng.standard_normal(7)
        c = np.array(1.5)
        m = rng.standard_normal((3, 4))
        row = rng.uniform(1.0, 2.0, (1, 4))
        col = rng.uniform(1.0, 2.0, (3, 1))
        w = rng.uniform(0.5, 1.5, (3, 4))
        yield ("views and a scalar",
               lambda x, c, op=SOFTCLIP: (op(x[1:], c) * op(x[:-1], c)).sum() + SIN(x).sum(),
               lambda x, c: (_softclip_ref(x[1:], c) * _softclip_ref(x[:-1], c)).sum()
               + tp.sin(x).sum(),
               [x, c])  # fmt: skip
        yield ("2-d broadcasts",
               lambda m, row, col: (SOFTCLIP(m, row) * w).sum() + (SOFTCLIP(col, row) ** 2).sum(),
               lambda m, row, col: (_softclip_ref(m, row) * w).sum()
               + (_softclip_ref(col, row) ** 2).sum(),
               [m, row, col])  # fmt: skip
        yield ("a constant input, op last",
               lambda x: SIN(SOFTCLIP(x * 2.0, 1.7)).sum(),
               lambda x: tp.sin(_softclip_ref(x * 2.0, 1.7)).sum(),
               [x])  # fmt: skip

    def test_custom_op_matches_cpu_and_registry_ops(rng):
        """The op's CUDA functions on the device against the same tape on the CPU (the op's
        NumPy functions) and against the function written with registry ops; every launch
        plan, batched replay and float32."""
        for name, f, ref, args in _custom_cases(rng):
            t = tp.record(f, *args)
            want = tp.record(ref, *args).gradient(*args)
            want = want if isinstance(want, tuple) else (want,)
            for kw in ({}, {"cooperative": False, "blocks": 3}, {"small": 2, "min_run": 1},
                       {"compile": True}):  # fmt: skip
                ct = check(t, args, **kw)
                got = ct.gradient(*args)
                got = got if isinstance(got, tuple) else (got,)
                for g, w_ in zip(got, want):
                    np.testing.assert_allclose(g, w_, rtol=1e-12, atol=1e-12, err_msg=name)
            B = 4
            bargs = [np.stack([a + 0.1 * k for k in range(B)]) for a in args]
            bargs = [np.abs(a) + 1.0 if a.ndim == 1 and a.shape[0] == B and args[0].ndim == 0
                     else a for a in bargs]  # fmt: skip
            for comp in (False, True):  # the interpreter, the compiled tier
                v, g = gradient_batch(t, *bargs, threads=THREADS, compile=comp)
                g = g if isinstance(g, tuple) else (g,)
                for b in range(B):
                    inst = [a[b] for a in bargs]
                    want_b = t.gradient(*inst)
                    want_b = want_b if isinstance(want_b, tuple) else (want_b,)
                    np.testing.assert_allclose(v[b], t.forward(*inst), rtol=1e-12, err_msg=name)
                    for gb, w_ in zip(g, want_b):
                        np.testing.assert_allclose(gb[b], w_, rtol=1e-12, atol=1e-12, err_msg=name)
        x = rng.standard_normal(6).astype(np.float32)
        t32 = tp.record(lambda x: (SOFTCLIP(x, np.float32(1.5)) * x).sum(), x)
        assert t32.dtype == np.float32
        check(t32, [x], rtol=1e-5, atol=1e-6)

    def test_custom_op_output_seeded_backward(rng):
        # the op's output is the tape's output: zeroing and seeding launch on their own
        x = rng.standard_normal(5)
        t = tp.record(lambda x: SOFTCLIP(x, 1.2), x)
        seed = rng.standard_normal(5)
        ct = CudaTape(t, threads=THREADS)
        np.testing.assert_allclose(ct.forward(x), t.forward(x), rtol=1e-12)
        t.zero_grad()
        t.backward(seed)
        ct.zero_grad()
        ct.backward(seed)
        ct.backward(seed)  # accumulates, as on the CPU
        np.testing.assert_allclose(ct.grads[0], 2 * t.grads[0], rtol=1e-12)

    def test_custom_op_after_a_failed_guard_runs_on_the_cpu(rng):
        def f(x):
            y = SOFTCLIP(x, 1.5)
            return (y * y).sum() if float(x.sum()) > 0 else SIN(y).sum()

        x = np.abs(rng.standard_normal(5))
        t = tp.record(f, x)
        ct = CudaTape(t, threads=THREADS)
        np.testing.assert_allclose(ct.gradient(x), t.gradient(x), rtol=1e-12)
        want = tp.record(f, -x).gradient(-x)
        np.testing.assert_allclose(ct.gradient(-x), want, rtol=1e-12)

    def test_custom_op_that_does_not_compile_is_named(monkeypatch):
        # on a GPU the wrappers compile when the tape moves there: Numba's error for the user's
        # functions comes back as a TypeError naming the op and the calling convention
        from tape.gpu import _replay as replay

        def broken(self):
            raise RuntimeError("tuple index out of range")

        monkeypatch.setattr(replay._Launcher, "kernel", property(broken))
        t = tp.record(lambda x: SOFTCLIP(x, 1.5).sum(), np.ones(3))
        with pytest.raises(TypeError, match=r"softclip_gpu.*cuda_fwd.*2 cotangent.*tuple index"):
            CudaTape(t, threads=THREADS)

    @pytest.mark.parametrize("returned", [1, 3])
    def test_custom_op_wrong_number_of_cotangents_is_refused(returned):
        # the CPU refuses it too; on a GPU the compile refuses it (tests/test_cuda_sim.py's
        # PTX test), here the simulated thread raises
        out = (lambda gy, y, a, b: gy * b) if returned == 1 else (lambda gy, y, a, b: (gy,) * 3)
        op = tp.custom_op(
            f"vjp{returned}", lambda a, b: a * b, lambda gy, y, a, b: (gy * b, gy * a),
            cuda_fwd=lambda a, b: a * b, cuda_vjp=out,
        )  # fmt: skip
        x = np.arange(4.0)
        ct = CudaTape(tp.record(lambda x: op(x, x * 2).sum(), x), threads=THREADS)
        with pytest.raises(ValueError, match=f"vjp{returned}.*returned {returned} cotangent"):
            ct.gradient(x)

    def test_docs_custom_op_gpu_example_runs(rng):
        # the page's first two blocks: the @njit functions, then the CUDA device functions
        page = ROOT / "docs" / "guides" / "custom_ops.md"
        blocks = [b.split("```", 1)[0] for b in page.read_text().split("```python\n")[1:3]]
        scope = {"np": np, "tp": tp}
        for code in blocks:
            exec(compile(code, f"<{page.name}>", "exec"), scope)
        ct, t = scope["ct"], scope["ct"].cpu()
        x = rng.standard_normal(5)
        np.testing.assert_allclose(ct.gradient(x), t.gradient(x), rtol=1e-12)
        np.testing.assert_allclose(ct.gradient(x), 1 - np.tanh(x / 2) ** 2, rtol=1e-12)

    def test_cooperative_build_failure_falls_back_to_per_phase_launches():
        # on a device where the cooperative sweep fails to build (it failed to link on an
        # H200 before the register cap), the tape warns once and replays per phase
        from tape.gpu import _replay as replay

        class Broken:
            argtypes = ("broken for this test",)

            @property
            def kernel(self):
                raise RuntimeError("ptxas error: entry function calls function with regcount 254")

        replay._SWEEP_LOADS.pop(Broken.argtypes, None)
        with pytest.warns(RuntimeWarning, match="regcount 254.*one launch per phase"):
            assert replay._loads(Broken()) is False
        assert replay._loads(Broken()) is False  # remembered: no second build, no second warning

    def test_gpu_check_script_runs(capsys, tmp_path):
        """benchmarks/gpu_check.py, every section at smoke-test sizes: a device session should
        not be the first to run it. Its figures come back as JSON and a Markdown table."""
        import json

        sys.path.insert(0, str(ROOT / "benchmarks"))
        try:
            import gpu_check
        finally:
            sys.path.pop(0)
        js, md = tmp_path / "check.json", tmp_path / "check.md"
        assert gpu_check.main(["--tiny", "--json", str(js), "--markdown", str(md)]) == 0
        out, err = capsys.readouterr()
        assert "parity OK" in out and "Traceback" not in out + err, (out + err)[-3000:]
        got = json.loads(js.read_text())
        assert got["parity_ok"] and got["device"]["name"]
        sections = {r["section"] for r in got["rows"]}
        assert sections == {"(a)", "(b)", "(c)", "(d)", "(e)", "(f)"}, sections
        assert any("8-op chain, compiled, gradient" == r["measure"] for r in got["rows"])
        table = md.read_text().splitlines()
        assert table[2] == "| section | measure | value | unit | note |"
        assert len(table) == 4 + len(got["rows"])

    # ------------------------------------------------------------ the compiled tier

    _K, _D, _N = 3, 4, 6

    def _gmm_like(means, q, xT):
        # (d, n) - (K, d, 1): a three-axis broadcast, read as tiles and blocks of rows
        xc = xT - means.reshape((_K, _D, 1))
        z = tp.exp(q).reshape((_K, _D, 1)) * xc
        main = q.sum(1).reshape((_K, 1)) - 0.5 * (z * z).sum(1)
        return tp.logsumexp(main, 0).sum()

    def _compiled_cases(rng):
        """Tapes that make each kind of fused code: ``(name, fn, args, code)``, ``code``: what
        the generated text must hold."""
        atomic, block_sum = "cuda.atomic.add(", "add_scalar("
        return [
            # overlapping views of one input: atomic adds into its adjoint
            ("rosenbrock", lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(),
             (rng.standard_normal(23),), {atomic, block_sum}),
            # a scalar input (its adjoint summed per block), a folded sum, values read by
            # other units
            ("chain_scalar", lambda x, s: ((tp.exp(tp.sin(x) * s) * x) ** 2).sum() + x.sum() * s,
             (rng.standard_normal(37), np.array(0.7)), {block_sum}),
            # a matrix product between fused loops, a bias read by every row
            ("mlp", lambda W, b, X: (tp.tanh(X @ W + b) ** 2).sum(),
             (rng.standard_normal((5, 7)), rng.standard_normal(7), rng.standard_normal((9, 5))),
             {atomic, "e // 7", "+ e] = t"}),  # the product's adjoint: assigned
            ("gmm_like", _gmm_like, (rng.standard_normal((_K, _D)), rng.standard_normal((_K, _D)),
                                     rng.standard_normal((_D, _N))), {"(r % 4)", "(r // 4)"}),
            # one value per row
            ("per_row", lambda a, c: (tp.sin(a * c) * a).sum(),
             (rng.standard_normal((4, 5)), rng.standard_normal((4, 1))), {atomic}),
            # a sum over rows folded into the loop (atomic adds into its rows)
            ("sum_over_rows", lambda x: ((tp.tanh(x) * x).sum(0) ** 2).sum(),
             (rng.standard_normal((3, 4, 5)),), {"(r // 3) * 20 + j, v"}),
            # a zero output adjoint never evaluates a rule: sqrt's rule at 0 is 0 * inf
            ("where_sqrt", lambda x: tp.where(x > 0, tp.sqrt(x), 0.0).sum(),
             (np.array([0.0, 1.0, 4.0, 0.0, 0.25]),), {"_masked("}),
        ]  # fmt: skip

    def test_compiled_tier_matches_the_cpu_tape(rng):
        """``compile=True``: every case's values and gradients as the CPU sweeps give them, in
        both launch modes, with the code each case is there for."""
        for name, fn, args, code in _compiled_cases(rng):
            rec = [np.where(a == 0.0, 1.0, a) for a in args]  # record away from the kink
            t = tp.record(fn, *rec)
            for coop in (True, False):
                ct = check(t, list(args), compile=True, cooperative=coop)
                assert ct.compiled and any(p[0] == "call" for p in ct.pieces), name
            missing = {c for c in code if c not in ct.fused.text}
            assert not missing, (name, missing, ct.fused.text)
            # adjoints the compiled sweep neither zeroes nor writes first are never read: with
            # every adjoint NaN beforehand, the gradient is the same
            g0 = ct.program.grad_off
            ct.arena[g0 : g0 + t.n_data].copy_to_device(np.full(t.n_data, np.nan))
            want = t.gradient(*args)
            for g, w in zip(
                *(x if isinstance(x, tuple) else (x,) for x in (ct.gradient(*args), want))
            ):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)

    def test_compiled_tier_batched_matches_the_cpu_batch(rng):
        """``gradient_batch(..., compile=True)``: one thread per instance walks each fused
        loop; every case against the CPU's batched replay."""
        from tape.transforms.batch import gradient_batch as cpu_batch

        for name, fn, args, _ in _compiled_cases(rng):
            t = tp.record(fn, *[np.where(a == 0.0, 1.0, a) for a in args])
            stacked = [np.stack([a, a + 0.1 * rng.standard_normal(a.shape), a - 0.2]) for a in args]
            v, g = gradient_batch(t, *stacked, threads=4, compile=True)
            v2, g2 = cpu_batch(t, *stacked)
            np.testing.assert_allclose(v, v2, rtol=1e-12, atol=1e-12)
            for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (g, g2))):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
            batch = t.extensions()["gpu_batch"]
            assert batch.compiled and any(p[0] == "call" for p in batch.pieces), name
            assert "atomic" not in batch.fused.text and "add_scalar(" not in batch.fused.text
        # a compiled CudaTape's batches are compiled too
        ct = CudaTape(t, threads=THREADS, compile=True)
        ct.gradient_batch(*stacked, threads=4)
        assert t.extensions()["gpu_batch"].compiled

    def test_compiled_tier_runs_a_chain_as_one_kernel_each_way(rng):
        x = rng.standard_normal(50)

        def chain(x):
            y = x
            for f in (tp.sin, tp.exp, tp.tanh, tp.cos):
                y = f(y) * 0.9 + 0.1
            return y.sum()

        t = tp.record(chain, x)
        ct = check(t, [x], compile=True)
        assert len(ct.pieces) == 1 and ct.pieces[0][0] == "call", ct.pieces
        # of the intermediate adjoints only the sum's is zeroed: the others live in registers;
        # x's is assigned by the reverse loop where a gradient zeroed the leaves
        from tape.gpu._program import H_N_ZACT, H_N_ZLEAF

        prog = ct.program.prog
        assert prog[H_N_ZACT] == 1 < CudaTape(t, threads=THREADS).program.prog[H_N_ZACT]
        assert prog[H_N_ZLEAF] == 0 and "if zl:" in ct.fused.text
        # forward, reverse, the sum's zeroing, zero_grad's
        assert ct.fused.text.count("@cuda.jit") == 4
        assert "CudaTape" in repr(ct) and "compiled" in repr(ct)
        assert CudaTape(t, threads=THREADS).compile() is not None
        # record(..., device="cuda", compile=True): the GPU's compiled tier, not the CPU's
        ct = tp.record(chain, x, device="cuda", compile=True)
        assert ct.compiled and ct.tape.tier != "compiled"
        np.testing.assert_allclose(ct.gradient(x), t.gradient(x), rtol=1e-12)
        assert not tp.record(chain, x, device="cuda").compiled

    def test_compiled_tier_float32(rng):
        x = rng.standard_normal(9).astype(np.float32)
        t = tp.record(lambda x: (tp.tanh(x) * tp.exp(x * 0.5)).sum() + tp.max(x), x)
        check(t, [x], rtol=1e-5, atol=1e-6, compile=True)

    def test_compiled_tier_accumulates_and_zeroes_like_the_cpu_tape(rng):
        x = rng.standard_normal(6)
        t = tp.record(lambda x: (x * tp.sin(x)).sum() + (tp.exp(x) * x).sum(), x)
        ct = CudaTape(t, threads=THREADS, compile=True)
        ct.forward(x)
        ct.backward()
        ct.backward()
        want = t.gradient(x)
        np.testing.assert_allclose(ct.grads[0], 2 * want, rtol=1e-12)
        ct.zero_grad()
        np.testing.assert_array_equal(ct.grads[0], 0.0)
        np.testing.assert_allclose(ct.gradient(x), want, rtol=1e-12)

    def test_compiled_tier_leaves_the_recorded_path_as_the_interpreter_does():
        # the guard is an interpreter entry between fused loops; a failed one runs on the CPU
        t = tp.record(_branchy, np.array([1.0, 2.0, 3.0]))
        ct = t.to("cuda", threads=THREADS, compile=True)
        assert any(p[0] == "run" for p in ct.pieces)  # the guard
        for x in (np.array([1.0, 2.0, 3.0]), np.array([-1.0, -2.0, 0.5]), np.array([2.0, 1, 0])):
            np.testing.assert_allclose(ct.gradient(x), _fresh(_branchy, x)[1], rtol=1e-12)

    # ------------------------------------------------------------ the generated file

    def test_generated_kernels_are_fresh():
        from tape.gpu import _codegen

        assert _codegen.TARGET.read_text() == _codegen.generate(), (
            "tape/gpu/_generated/kernels.py is stale: run `python -m tape.gpu._codegen`"
        )

    def test_every_registry_op_has_a_gpu_path():
        from tape.gpu._kernels import GPU_KERNELS
        from tape.gpu._program import gpu_spec

        for op in OPS:
            fwd, rev, _, _, checks = gpu_spec(op)
            assert fwd >= 1 and rev >= (1 if any(op.differentiable) else 0), op.name
            if op.kind == "structural":
                assert op.gpu in GPU_KERNELS, op.name
                if checks:  # it may reject data: a failed status must say why
                    assert op.describe_failure is not None, op.name
