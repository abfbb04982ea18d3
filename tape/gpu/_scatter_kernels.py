"""GPU entry kernels of ``scatter_add`` (:mod:`tape.ops.scatter`): ``take``'s kernels with
input and output exchanged. Forward: check every index (phase 0), zero the output (phase 1),
add the rows (phase 2, atomics: repeated indices meet). Reverse: a gather of the output's
adjoint rows.

Why the CPU code is not shared: the CPU adds the rows in order in one loop; on the device
the rows are split over threads, which meet at repeated indices (hence the atomics and a
separate phase that zeroes the output first)."""

from __future__ import annotations

from numba import cuda

from tape.gpu._config import DEVICE_JIT
from tape.gpu._kernels import GpuKernel, inner_at, n_rows_at
from tape.gpu._loops import accumulate, active, boff, bsize, ent, goff, ip, ix, reject
from tape.layout.columns import E_ATTR, E_IN0, E_IN1, E_OUT

_dev = cuda.jit(**DEVICE_JIT)


@_dev
def scatter_add_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    ib = ent(prog, i, E_IN1)
    idx = boff(prog, ib)
    n_idx = bsize(prog, ib)
    yb = ent(prog, i, E_OUT)
    y = boff(prog, yb)
    p = ent(prog, i, E_ATTR)
    n_rows = ip(prog, n_rows_at(p))
    inner = ip(prog, inner_at(p))
    if ph == 0:
        for j in range(t0, n_idx, ts):
            v = A[ix(idx + j, step, base)]
            ok = v == v and v >= -n_rows and v < n_rows
            if ok:
                r = int(v)
                ok = r == v
            if not ok:
                reject(i, prog, A, base, step, solo)
        return
    if ph == 1:
        for e in range(t0, bsize(prog, yb), ts):
            A[ix(y + e, step, base)] = 0.0
        return
    for e in range(t0, n_idx * inner, ts):
        j = e // inner
        t = e - j * inner
        r = int(A[ix(idx + j, step, base)])
        if r < 0:
            r += n_rows
        accumulate(A, ix(y + r * inner + t, step, base), A[ix(x + e, step, base)], not solo)


@_dev
def scatter_add_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    ib = ent(prog, i, E_IN1)
    idx = boff(prog, ib)
    n_idx = bsize(prog, ib)
    gx = goff(prog) + boff(prog, a)
    gy = goff(prog) + boff(prog, ent(prog, i, E_OUT))
    p = ent(prog, i, E_ATTR)
    n_rows = ip(prog, n_rows_at(p))
    inner = ip(prog, inner_at(p))
    for e in range(t0, n_idx * inner, ts):
        j = e // inner
        t = e - j * inner
        r = int(A[ix(idx + j, step, base)])
        if r < 0:
            r += n_rows
        A[ix(gx + e, step, base)] += A[ix(gy + r * inner + t, step, base)]


KERNELS = {
    "scatter_add": GpuKernel(scatter_add_fwd, scatter_add_rev, 3, 1, rev_inputs=(0,), checks=(0,)),
}
"""The GPU path of ``scatter_add``, merged into :data:`tape.gpu._kernels.GPU_KERNELS`."""
