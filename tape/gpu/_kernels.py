"""GPU entry kernels of the structural ops (the ``kernel`` ops of the registry): reductions,
strided copy, gather, matrix product, guard.

Each op is one :class:`GpuKernel` record in :data:`GPU_KERNELS`, under the key its registry
record names (``registry.structural(..., gpu=key)``, :attr:`tape.registry.Op.gpu`): its forward
and reverse phase functions (signature in :mod:`tape.gpu._loops`), how many phases each
runs, which input each reverse phase writes, and the scratch it needs. The code generator
fails on a registry op without one, and the tests run every op, so a new structural op cannot
ship without its GPU path.

Reductions are owned by blocks: the elements reducing into one output are split over
``parts`` blocks (``parts = max(1, n_blocks // n_out)``: a full reduction uses the whole grid),
each block combines its share in shared memory and writes one partial to the scratch, and a
second phase combines the partials. No atomics, and the same order on every run.

Why these do not share the CPU's code: a CPU kernel walks its entry in one thread with
vectorised loops (BLAS for the matrix product); here every entry is split over the whole grid,
with phases and barriers between the parts. The scans do share it
(:func:`tape.gpu._scan_kernels.lanes_kernel`): their rows are independent, so a row is one
thread's work on the device and one of a CPU kernel's lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from numba import cuda, uint64

from tape.gpu._config import DEVICE_JIT
from tape.gpu._loops import (
    R_MAX,
    R_MIN,
    R_PROD,
    R_SUM,
    accumulate,
    active,
    block_reduce,
    boff,
    bsize,
    combine,
    ent,
    goff,
    identity,
    ip,
    ix,
    reject,
    udiv,
    woff,
)
from tape.layout.columns import E_ATTR, E_IN0, E_IN1, E_OUT
from tape.ops.blocks import copy as copy_block
from tape.ops.blocks import matmul as mm
from tape.ops.blocks import reduce as reduce_block
from tape.ops.blocks import rows as rows_block
from tape.ops.guard import INT, TRUTH

_dev = cuda.jit(**DEVICE_JIT)

MATMUL_SHARED = 256
"""Shared-memory values a matrix product's tiles may take (the block's scratch ``sh``:
:data:`tape.gpu._config.MAX_THREADS` values): with 256 threads, 16 x 16 outputs per tile and
steps of 8 along the inner dimension."""


@dataclass
class GpuKernel:
    """The GPU path of one structural op.

    Attributes
    ----------
    fwd, rev : device functions
        Phase functions ``(ph, i, prog, A, base, step, t0, ts, solo, sh)``; ``rev`` is None
        for an op without a reverse rule (``rev_phases`` 0).
    fwd_phases, rev_phases : int
        Number of phases (a barrier follows each).
    rev_inputs : tuple or None
        For each reverse phase, the input whose adjoint it writes (the phase is skipped when
        that input has no adjoint), ``-1`` for "always run"; None: run every phase.
    work : callable or None
        ``work(n_out, parts, block) -> int``: scratch elements one entry needs (``block``:
        the integer pool from the entry's attribute block on).
    checks : tuple
        Forward phases that may reject the entry's data (calling
        :func:`tape.gpu._loops.reject`): the kernels read the status after them and stop.
    """

    fwd: Callable
    rev: Callable | None
    fwd_phases: int
    rev_phases: int
    rev_inputs: tuple | None = None
    work: Callable | None = None
    checks: tuple = ()


# ---------------------------------------------------------------- reductions
# attribute block: [nd, in_shape[nd], out_strides[nd]] (0 on reduced axes), read through the
# positions of its codec, tape.ops.blocks.reduce, as the CPU kernels read it

_r_ndim_at = _dev(reduce_block.ndim_at)
_r_dims_at = _dev(reduce_block.dims_at)
_r_strides_at = _dev(reduce_block.strides_at)


@_dev
def _out_index(prog, p, j):
    """Output element that input element ``j`` reduces into."""
    nd = ip(prog, _r_ndim_at(p))
    dims = _r_dims_at(p)
    strides = _r_strides_at(p, nd)
    off = 0
    r = j
    for d in range(nd - 1, -1, -1):
        s = ip(prog, dims + d)
        q = udiv(r, s)
        off += (r - q * s) * ip(prog, strides + d)
        r = q
    return off


@_dev
def _group_size(prog, p):
    nd = ip(prog, _r_ndim_at(p))
    dims = _r_dims_at(p)
    strides = _r_strides_at(p, nd)
    n = 1
    for d in range(nd):
        if ip(prog, strides + d) == 0:
            n *= ip(prog, dims + d)
    return n


@_dev
def _in_index(prog, p, o, r):
    """Input element number ``r`` of output ``o``'s group (C order over the reduced axes)."""
    nd = ip(prog, _r_ndim_at(p))
    dims = _r_dims_at(p)
    strides = _r_strides_at(p, nd)
    idx = 0
    cs = 1
    for d in range(nd - 1, -1, -1):
        s = ip(prog, dims + d)
        os = ip(prog, strides + d)
        if os == 0:
            q = udiv(r, s)
            k = r - q * s
            r = q
        else:
            k = udiv(o, os)
            k -= udiv(k, s) * s
        idx += k * cs
        cs *= s
    return idx


# what a partial reduction combines, per input element x of output y[o]
V_X = 0  # x
V_TIE = 1  # 1 if x == y[o] (ties of max / min)
V_ZERO = 2  # 1 if x == 0
V_NONZERO = 3  # x, or 1 if x == 0 (product of the nonzero elements)


@_dev
def _value(vk, v, yo):
    if vk == V_X:
        return v
    if vk == V_TIE:
        return 1.0 if v == yo else 0.0
    if vk == V_ZERO:
        return 1.0 if v == 0.0 else 0.0
    return 1.0 if v == 0.0 else v


@_dev
def _partials(kind, vk, slot, i, prog, A, base, step, solo, sh):
    """Partial reductions of every output group into scratch ``[slot, slot + n_out * parts)``."""
    p = ent(prog, i, E_ATTR)
    x = boff(prog, ent(prog, i, E_IN0))
    o = ent(prog, i, E_OUT)
    y = boff(prog, o)
    n_out = bsize(prog, o)
    R = _group_size(prog, p)
    W = woff(prog) + slot
    if solo:
        for k in range(n_out):
            yo = A[ix(y + k, step, base)]
            acc = identity(kind)
            for r in range(R):
                acc = combine(
                    kind, acc, _value(vk, A[ix(x + _in_index(prog, p, k, r), step, base)], yo)
                )
            A[ix(W + k, step, base)] = acc
        return
    nb = cuda.gridDim.x
    parts = max(1, nb // max(n_out, 1))
    lane = cuda.threadIdx.x
    nl = cuda.blockDim.x
    for t in range(cuda.blockIdx.x, n_out * parts, nb):
        k = t // parts
        part = t - k * parts
        lo = part * R // parts
        hi = (part + 1) * R // parts
        yo = A[uint64(y + k)]
        acc = identity(kind)
        for r in range(lo + lane, hi, nl):
            acc = combine(kind, acc, _value(vk, A[uint64(x + _in_index(prog, p, k, r))], yo))
        tot = block_reduce(sh, acc, kind)
        if lane == 0:
            A[uint64(W + t)] = tot


@_dev
def _n_parts(n_out, solo):
    if solo:
        return 1
    return max(1, cuda.gridDim.x // max(n_out, 1))


@_dev
def _combined(kind, slot, k, parts, prog, A, base, step):
    W = woff(prog) + slot
    acc = identity(kind)
    for q in range(parts):
        acc = combine(kind, acc, A[ix(W + k * parts + q, step, base)])
    return acc


@_dev
def _reduce_fwd(kind, ph, i, prog, A, base, step, t0, ts, solo, sh):
    if ph == 0:
        _partials(kind, V_X, 0, i, prog, A, base, step, solo, sh)
        return
    o = ent(prog, i, E_OUT)
    y = boff(prog, o)
    n_out = bsize(prog, o)
    parts = _n_parts(n_out, solo)
    for k in range(t0, n_out, ts):
        A[ix(y + k, step, base)] = _combined(kind, 0, k, parts, prog, A, base, step)


@_dev
def sum_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _reduce_fwd(R_SUM, ph, i, prog, A, base, step, t0, ts, solo, sh)


@_dev
def max_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _reduce_fwd(R_MAX, ph, i, prog, A, base, step, t0, ts, solo, sh)


@_dev
def min_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _reduce_fwd(R_MIN, ph, i, prog, A, base, step, t0, ts, solo, sh)


@_dev
def prod_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _reduce_fwd(R_PROD, ph, i, prog, A, base, step, t0, ts, solo, sh)


@_dev
def sum_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    o = ent(prog, i, E_OUT)
    gx = goff(prog) + boff(prog, a)
    gy = goff(prog) + boff(prog, o)
    n = bsize(prog, a)
    p = ent(prog, i, E_ATTR)
    if bsize(prog, o) == 1:
        g = A[ix(gy, step, base)]
        for j in range(t0, n, ts):
            A[ix(gx + j, step, base)] += g
    else:
        for j in range(t0, n, ts):
            A[ix(gx + j, step, base)] += A[ix(gy + _out_index(prog, p, j), step, base)]


@_dev
def _extreme_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # the adjoint goes to the arg-extremum; ties share it evenly
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    o = ent(prog, i, E_OUT)
    n_out = bsize(prog, o)
    parts = _n_parts(n_out, solo)
    share = n_out * parts  # scratch slot of each output's share of the adjoint
    if ph == 0:
        _partials(R_SUM, V_TIE, 0, i, prog, A, base, step, solo, sh)
        return
    W = woff(prog)
    y = boff(prog, o)
    gy = goff(prog) + y
    if ph == 1:
        for k in range(t0, n_out, ts):
            count = _combined(R_SUM, 0, k, parts, prog, A, base, step)
            A[ix(W + share + k, step, base)] = A[ix(gy + k, step, base)] / count
        return
    x = boff(prog, a)
    gx = goff(prog) + x
    p = ent(prog, i, E_ATTR)
    for j in range(t0, bsize(prog, a), ts):
        k = _out_index(prog, p, j)
        if A[ix(x + j, step, base)] == A[ix(y + k, step, base)]:
            A[ix(gx + j, step, base)] += A[ix(W + share + k, step, base)]


@_dev
def prod_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # d prod / d x_j is the product of the others: exact with zeros among them (no y / x_j)
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    o = ent(prog, i, E_OUT)
    n_out = bsize(prog, o)
    parts = _n_parts(n_out, solo)
    m = n_out * parts
    if ph == 0:
        _partials(R_SUM, V_ZERO, 0, i, prog, A, base, step, solo, sh)
        _partials(R_PROD, V_NONZERO, m, i, prog, A, base, step, solo, sh)
        return
    W = woff(prog)
    if ph == 1:
        for k in range(t0, n_out, ts):
            A[ix(W + 2 * m + k, step, base)] = _combined(R_SUM, 0, k, parts, prog, A, base, step)
            A[ix(W + 2 * m + n_out + k, step, base)] = _combined(
                R_PROD, m, k, parts, prog, A, base, step
            )
        return
    x = boff(prog, a)
    gx = goff(prog) + x
    gy = goff(prog) + boff(prog, o)
    p = ent(prog, i, E_ATTR)
    for j in range(t0, bsize(prog, a), ts):
        k = _out_index(prog, p, j)
        zeros = A[ix(W + 2 * m + k, step, base)]
        nz = A[ix(W + 2 * m + n_out + k, step, base)]
        v = A[ix(x + j, step, base)]
        if zeros == 0.0:
            A[ix(gx + j, step, base)] += A[ix(gy + k, step, base)] * (nz / v)
        elif zeros == 1.0 and v == 0.0:
            A[ix(gx + j, step, base)] += A[ix(gy + k, step, base)] * nz


def _reduce_work(n_out, parts, block):
    return 2 * n_out * parts + 2 * n_out


# ---------------------------------------------------------------- copy
# attribute block: [nd, shape[nd], in_off, in_strides[nd], out_off, out_strides[nd]], read
# through the positions of its codec, tape.ops.blocks.copy

_c_ndim_at = _dev(copy_block.ndim_at)
_c_dims_at = _dev(copy_block.dims_at)
_c_in_off_at = _dev(copy_block.in_off_at)
_c_in_strides_at = _dev(copy_block.in_strides_at)
_c_out_off_at = _dev(copy_block.out_off_at)
_c_out_strides_at = _dev(copy_block.out_strides_at)


@_dev
def _copy_n(prog, p):
    nd = ip(prog, _c_ndim_at(p))
    dims = _c_dims_at(p)
    n = 1
    for d in range(nd):
        n *= ip(prog, dims + d)
    return n


@_dev
def _copy_at(prog, p, j):
    nd = ip(prog, _c_ndim_at(p))
    dims = _c_dims_at(p)
    ins = _c_in_strides_at(p, nd)
    outs = _c_out_strides_at(p, nd)
    src = ip(prog, _c_in_off_at(p, nd))
    dst = ip(prog, _c_out_off_at(p, nd))
    r = j
    for d in range(nd - 1, -1, -1):
        s = ip(prog, dims + d)
        q = udiv(r, s)
        k = r - q * s
        r = q
        src += k * ip(prog, ins + d)
        dst += k * ip(prog, outs + d)
    return src, dst


@_dev
def copy_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    y = boff(prog, ent(prog, i, E_OUT))
    p = ent(prog, i, E_ATTR)
    for j in range(t0, _copy_n(prog, p), ts):
        s, d = _copy_at(prog, p, j)
        A[ix(y + d, step, base)] = A[ix(x + s, step, base)]


@_dev
def copy_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    gx = goff(prog) + boff(prog, a)
    gy = goff(prog) + boff(prog, ent(prog, i, E_OUT))
    p = ent(prog, i, E_ATTR)
    nd = ip(prog, _c_ndim_at(p))
    # a zero input stride (broadcast_to) sends several output elements to one input element
    atomic = False
    if not solo:
        for d in range(nd):
            if ip(prog, _c_in_strides_at(p, nd) + d) == 0 and ip(prog, _c_dims_at(p) + d) > 1:
                atomic = True
    for j in range(t0, _copy_n(prog, p), ts):
        s, d = _copy_at(prog, p, j)
        accumulate(A, ix(gx + s, step, base), A[ix(gy + d, step, base)], atomic)


# ---------------------------------------------------------------- take
# attribute block: [n_rows, inner] (tape.ops.blocks.rows); input 1 holds the row indices (as
# floats)

n_rows_at = _dev(rows_block.n_rows_at)
inner_at = _dev(rows_block.inner_at)


@_dev
def take_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    ib = ent(prog, i, E_IN1)
    idx = boff(prog, ib)
    n_idx = bsize(prog, ib)
    y = boff(prog, ent(prog, i, E_OUT))
    p = ent(prog, i, E_ATTR)
    n_rows = ip(prog, n_rows_at(p))
    inner = ip(prog, inner_at(p))
    if ph == 0:
        # indices are data: check them all before any is used (the kernel stops on a bad one)
        for j in range(t0, n_idx, ts):
            v = A[ix(idx + j, step, base)]
            ok = v == v and v >= -n_rows and v < n_rows
            if ok:
                r = int(v)
                ok = r == v
            if not ok:
                reject(i, prog, A, base, step, solo)
        return
    for e in range(t0, n_idx * inner, ts):
        j = e // inner
        t = e - j * inner
        r = int(A[ix(idx + j, step, base)])
        if r < 0:
            r += n_rows
        A[ix(y + e, step, base)] = A[ix(x + r * inner + t, step, base)]


@_dev
def take_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    # a scatter-add: repeated indices accumulate, so atomics unless one thread does it all
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
        accumulate(A, ix(gx + r * inner + t, step, base), A[ix(gy + e, step, base)], not solo)


# ---------------------------------------------------------------- matmul
# attribute block: [batch, m, k, n, stride_a, stride_b] (tape.ops.blocks.matmul; matmul_nt holds
# B[b] as n x k). The forward and both reverse phases are one product each, C = op(P) op(Q), made
# by _gemm in tiles: each block computes TM x TN outputs, loading TM x TK of op(P) and TK x TN
# of op(Q) into shared memory per step of the inner dimension, so each value read from the
# arena serves TN (or TM) multiply-adds instead of one. Each output element has one writer:
# the reverse phases need no atomics (dA in phase 0, dB in phase 1: A and B may be the same
# buffer, as in a @ a). An operand shared by every batch (stride 0) gets its adjoint summed
# over the batches, inside the product.


@_dev
def _tile(A, step, base, sh, s0, nr, nc, r0, c0, R, C, o, rs, cs):
    """``sh[s0:]`` = the ``nr x nc`` block at ``(r0, c0)`` of the ``R x C`` matrix at arena
    element ``o`` (strides ``rs``, ``cs``), row by row, zero outside the matrix; the block's
    threads share the work."""
    for ll in range(cuda.threadIdx.x, nr * nc, cuda.blockDim.x):
        lr = ll // nc
        lc = ll - lr * nc
        v = 0.0
        if r0 + lr < R and c0 + lc < C:
            v = A[ix(o + (r0 + lr) * rs + (c0 + lc) * cs, step, base)]
        sh[s0 + ll] = v


@_dev
def _gemm(A, base, step, solo, sh, nbo, nbi, M, N, K, po, ps, pr, pc, qo, qs, qr, qc,
          co, cs, cr, cc, add):  # fmt: skip
    """``C[o] (+)= sum over i < nbi of op(P)[o + i] @ op(Q)[o + i]`` for batches ``o < nbo``
    (one of ``nbo``, ``nbi`` is 1): element ``(r, q)`` of ``op(P)[b]`` is at arena element
    ``po + b * ps + r * pr + q * pc``, and likewise for ``Q`` and ``C``. ``add``: add to
    ``C`` instead of storing. ``solo``: this thread alone (batched replay); else the whole
    grid, in tiles (every thread of each block must call this)."""
    if solo:
        for o in range(nbo):
            for r in range(M):
                for c in range(N):
                    acc = 0.0
                    for i in range(nbi):
                        pp = po + (o + i) * ps + r * pr
                        qq = qo + (o + i) * qs + c * qc
                        for q in range(K):
                            acc += A[ix(pp + q * pc, step, base)] * A[ix(qq + q * qr, step, base)]
                    at = ix(co + o * cs + r * cr + c * cc, step, base)
                    if add:
                        A[at] += acc
                    else:
                        A[at] = acc
        return
    T = cuda.blockDim.x
    tn = min(16, T)
    tm = T // tn
    tk = min(16, MATMUL_SHARED // (tm + tn))
    tid = cuda.threadIdx.x
    ty = tid // tn
    tx = tid - ty * tn
    rows = (M + tm - 1) // tm
    cols = (N + tn - 1) // tn
    for tile in range(cuda.blockIdx.x, nbo * rows * cols, cuda.gridDim.x):
        o = tile // (rows * cols)
        rem = tile - o * rows * cols
        r0 = (rem // cols) * tm
        c0 = (rem - (rem // cols) * cols) * tn
        acc = 0.0
        for i in range(nbi):
            pb = po + (o + i) * ps
            qb = qo + (o + i) * qs
            for k0 in range(0, K, tk):
                _tile(A, step, base, sh, 0, tm, tk, r0, k0, M, K, pb, pr, pc)
                _tile(A, step, base, sh, tm * tk, tk, tn, k0, c0, K, N, qb, qr, qc)
                cuda.syncthreads()
                for q in range(tk):
                    acc += sh[ty * tk + q] * sh[tm * tk + q * tn + tx]
                cuda.syncthreads()
        if r0 + ty < M and c0 + tx < N:
            at = ix(co + o * cs + (r0 + ty) * cr + (c0 + tx) * cc, step, base)
            if add:
                A[at] += acc
            else:
                A[at] = acc


@_dev
def _matmul_fwd(tb, ph, i, prog, A, base, step, t0, ts, solo, sh):
    p = ent(prog, i, E_ATTR)
    nb = ip(prog, p + mm.BATCH)
    m = ip(prog, p + mm.M)
    kk = ip(prog, p + mm.K)
    n = ip(prog, p + mm.N)
    # op(B)[q, c] at q * bq + c * bc of B[b]: B is k x n, or n x k held transposed
    bq = 1 if tb else n
    bc = kk if tb else 1
    _gemm(A, base, step, solo, sh, nb, 1, m, n, kk,
          boff(prog, ent(prog, i, E_IN0)), ip(prog, p + mm.STRIDE_A), kk, 1,
          boff(prog, ent(prog, i, E_IN1)), ip(prog, p + mm.STRIDE_B), bq, bc,
          boff(prog, ent(prog, i, E_OUT)), m * n, n, 1, False)  # fmt: skip


@_dev
def _matmul_rev(tb, ph, i, prog, A, base, step, t0, ts, solo, sh):
    ia = ent(prog, i, E_IN0)
    ib = ent(prog, i, E_IN1)
    a = boff(prog, ia)
    b = boff(prog, ib)
    gyo = goff(prog) + boff(prog, ent(prog, i, E_OUT))
    p = ent(prog, i, E_ATTR)
    nb = ip(prog, p + mm.BATCH)
    m = ip(prog, p + mm.M)
    kk = ip(prog, p + mm.K)
    n = ip(prog, p + mm.N)
    sa = ip(prog, p + mm.STRIDE_A)
    sb = ip(prog, p + mm.STRIDE_B)
    bq = 1 if tb else n  # op(B)[q, c] at q * bq + c * bc of B[b], as in the forward
    bc = kk if tb else 1
    if not active(prog, ia if ph == 0 else ib):
        return
    # one call of _gemm for both phases (each call site is its own copy of the tiled loops)
    if ph == 0:
        # dA[b] += dY[b] @ op(B)[b]^T (m x k), summed over the batches when A is shared
        nbo = nb if sa != 0 else 1
        M, N, K = m, kk, n
        po, ps, pr, pc = gyo, m * n, n, 1
        qo, qs, qr, qc = b, sb, bc, bq
        co, cs, cr, cc = goff(prog) + a, sa, kk, 1
    else:
        # d op(B)[b] += A[b]^T @ dY[b] (k x n), written where B holds op(B)[q, c]; summed over
        # the batches when B is shared
        nbo = nb if sb != 0 else 1
        M, N, K = kk, n, m
        po, ps, pr, pc = a, sa, 1, kk
        qo, qs, qr, qc = gyo, m * n, n, 1
        co, cs, cr, cc = goff(prog) + b, sb, bq, bc
    _gemm(A, base, step, solo, sh, nbo, nb // nbo, M, N, K,
          po, ps, pr, pc, qo, qs, qr, qc, co, cs, cr, cc, True)  # fmt: skip


@_dev
def matmul_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _matmul_fwd(False, ph, i, prog, A, base, step, t0, ts, solo, sh)


@_dev
def matmul_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _matmul_rev(False, ph, i, prog, A, base, step, t0, ts, solo, sh)


@_dev
def matmul_nt_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _matmul_fwd(True, ph, i, prog, A, base, step, t0, ts, solo, sh)


@_dev
def matmul_nt_rev(ph, i, prog, A, base, step, t0, ts, solo, sh):
    _matmul_rev(True, ph, i, prog, A, base, step, t0, ts, solo, sh)


# ---------------------------------------------------------------- guard
# attribute block: [mode]; input 0 the traced value, input 1 its value at record time. The
# same tests as tape/ops/guard.py; the output is never written and there is no reverse.


@_dev
def guard_fwd(ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    ref = boff(prog, ent(prog, i, E_IN1))
    mode = ip(prog, ent(prog, i, E_ATTR))
    n = 1 if mode == TRUTH else bsize(prog, ent(prog, i, E_IN0))
    for j in range(t0, n, ts):
        v = A[ix(x + j, step, base)]
        r = A[ix(ref + j, step, base)]
        if mode == TRUTH:
            bad = (v != 0.0) != (r != 0.0)
        elif mode == INT:
            bad = not (v == v and abs(v) < 9.2e18)
            if not bad:
                bad = int(v) != r
        else:
            bad = v != r and not (v != v and r != r)  # NaN matches NaN
        if bad:
            reject(i, prog, A, base, step, solo)


# ---------------------------------------------------------------- the table

GPU_KERNELS = {
    "sum": GpuKernel(sum_fwd, sum_rev, 2, 1, work=_reduce_work),
    "max": GpuKernel(max_fwd, _extreme_rev, 2, 3, work=_reduce_work),
    "min": GpuKernel(min_fwd, _extreme_rev, 2, 3, work=_reduce_work),
    "prod": GpuKernel(prod_fwd, prod_rev, 2, 3, work=_reduce_work),
    "copy": GpuKernel(copy_fwd, copy_rev, 1, 1),
    "take": GpuKernel(take_fwd, take_rev, 2, 1, checks=(0,)),
    "matmul": GpuKernel(matmul_fwd, matmul_rev, 1, 2, rev_inputs=(0, 1)),
    "matmul_nt": GpuKernel(matmul_nt_fwd, matmul_nt_rev, 1, 2, rev_inputs=(0, 1)),
    "guard": GpuKernel(guard_fwd, None, 1, 0, checks=(0,)),
}
"""The GPU path of every ``kernel`` op of the registry, by the key its record names
(:attr:`tape.registry.Op.gpu`)."""

# the op families kept in files of their own (they import GpuKernel from this module)
from tape.gpu import _factor_kernels, _scan_kernels, _scatter_kernels, _spectral_kernels  # noqa: E402, I001

for _family in (_scan_kernels, _factor_kernels, _scatter_kernels, _spectral_kernels):
    GPU_KERNELS.update(_family.KERNELS)
