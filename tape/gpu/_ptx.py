"""Compile every GPU kernel to PTX without a GPU (``cuda.compile_ptx``).

The simulator runs kernels as Python and checks no types; compiling to PTX runs Numba's type
inference and NVVM on every kernel and every rule, catching what the simulator lets through.
Needs the CUDA toolkit wheels (``pip install 'numba-cuda[cu12]'``: NVVM and libdevice) and
must run in a process **without** ``NUMBA_ENABLE_CUDASIM``.
"""

from __future__ import annotations

import contextlib
import time

KERNELS = ("sweep", "step", "batch")


@contextlib.contextmanager
def _target_cc(cc):
    """Compile device functions for ``cc`` even where no GPU is present: numba-cuda asks the
    current device for its compute capability when a kernel calls a device function."""
    import numba.cuda.dispatcher as D

    class _Device:
        compute_capability = cc

    saved = D.get_current_device
    D.get_current_device = lambda: _Device()
    try:
        yield
    finally:
        D.get_current_device = saved


def signatures(dtype):
    from numba import types as nbt

    f = nbt.float64 if dtype == "float64" else nbt.float32
    i64 = nbt.int64
    return {
        "sweep": (i64[::1], f[::1], i64, i64, i64),
        "step": (i64[::1], f[::1], i64, i64, i64),
        "batch": (i64[::1], f[::1], f[::1], i64, i64, i64, i64),
    }


def compile_all(cc=(9, 0), dtypes=("float64", "float32"), module=None, kernels=KERNELS):
    """PTX of every kernel for every dtype: ``{(kernel, dtype): (ptx, seconds)}``, of the
    dispatch for every op, or of ``module`` (:func:`tape.gpu._replay.kernels_for`: one op
    set's)."""
    from numba import cuda

    from tape.gpu._config import LAUNCH_BOUNDS

    if module is None:
        from tape.gpu._generated import kernels as module
    K = module

    out = {}
    with _target_cc(cc):
        for dt in dtypes:
            for name, sig in signatures(dt).items():
                if name not in kernels:
                    continue
                t0 = time.perf_counter()
                ptx, _ = cuda.compile_ptx(
                    getattr(K, name).py_func, sig, cc=cc, launch_bounds=LAUNCH_BOUNDS
                )
                out[(name, dt)] = (ptx, time.perf_counter() - t0)
    return out


def compile_fused(t, cc=(9, 0), dtype="float64"):
    """PTX of every kernel the GPU's compiled tier generates for tape ``t``
    (:mod:`tape.gpu._fused`): ``{name: (ptx, seconds)}``."""
    from numba import cuda
    from numba import types as nbt

    from tape.gpu._config import LAUNCH_BOUNDS
    from tape.gpu._fused import build
    from tape.gpu._program import Program

    src, _ = build(t, Program(t, n_blocks=1).grad_off, {"zl": 1}, lambda k, types: k)
    arr = (nbt.float64 if dtype == "float64" else nbt.float32)[::1]
    out = {}
    with _target_cc(cc):
        for name in sorted(src.names):
            t0 = time.perf_counter()
            sig = (arr, nbt.int64) if name.startswith("rev") else (arr,)
            ptx, _ = cuda.compile_ptx(
                getattr(src.module, name).py_func, sig, cc=cc, launch_bounds=LAUNCH_BOUNDS
            )
            out[name] = (ptx, time.perf_counter() - t0)
    return out


def ptxas():
    """Path of ``ptxas`` from the CUDA toolkit wheels (or on the PATH), or None."""
    import shutil
    from pathlib import Path

    try:
        import nvidia.cuda_nvcc as nvcc

        p = Path(list(nvcc.__path__)[0]) / "bin" / "ptxas"
        if p.exists():
            return str(p)
    except ImportError:
        pass
    return shutil.which("ptxas")


def assemble(ptx, cc=(9, 0)):
    """Assemble ``ptx`` as the link of a cooperative kernel does: relocatable code (each
    device function on its own, as when linking the device runtime) under the linker's
    register cap (:data:`tape.gpu._config.MAX_REGISTERS`). Returns ptxas's messages; raises
    ``RuntimeError`` with them if it fails (a real GPU would fail to load the kernel)."""
    import os
    import subprocess
    import tempfile

    from tape.gpu._config import MAX_REGISTERS

    exe = ptxas()
    if exe is None:
        raise FileNotFoundError("ptxas not found (pip install 'numba-cuda[cu12]')")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run(
            [exe, f"-arch=sm_{cc[0]}{cc[1]}", "-c", f"-maxrregcount={MAX_REGISTERS}", "-o",
             os.path.join(d, "k.o"), src],
            capture_output=True, text=True,
        )  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"ptxas failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r.stderr


if __name__ == "__main__":
    import sys

    dts = tuple(sys.argv[1:]) or ("float64", "float32")
    for (name, dt), (ptx, s) in compile_all(dtypes=dts).items():
        print(f"{name:6s} {dt:8s} {len(ptx):9d} chars of PTX in {s:6.1f} s")
