"""Device loops: the GPU counterparts of :mod:`tape.ops.loops`, shared by every op.

Every entry function has the signature ``(ph, i, prog, A, base, step, t0, ts, solo, sh)``:

``ph``
    The phase of entry ``i`` to run (see :mod:`tape.gpu._program`).
``prog``, ``A``
    The packed tape and the arena.
``base``, ``step``
    Arena element ``e`` is ``A[ix(e, step, base)]``: ``(0, 1)`` for a single replay, ``(b, n)``
    for instance ``b`` of ``n`` interleaved instances (batched replay).
``t0``, ``ts``
    This thread's first element and the stride (``cuda.grid(1)``, ``cuda.gridsize(1)`` for a
    grid working on one entry; ``0, 1`` for a thread running a whole instance).
``solo``
    True when one thread does the whole entry (batched replay): no other thread writes the
    same adjoint, so no atomics and no block reductions.
``sh``
    A shared float64 array of the block's size, for block reductions.

Accumulation into adjoints is race-free by construction: where each element of an adjoint
has one writer in a phase (same-shape elementwise inputs, reductions' inputs, matrix
products by output element) the loops add plainly; where several elements of the output
feed one input element (broadcasting, ``take`` with repeated indices, a strided copy with a
zero stride) they use ``cuda.atomic.add``; a one-element input sums in a block reduction
first (one atomic per block instead of one per element). Two inputs of one entry may view
the same memory, so each input's adjoint gets its own phase.

The elementwise reverse loops accumulate as the CPU loops (:mod:`tape.ops.loops`) do, through
:func:`masked`: a zero output adjoint contributes exactly zero, whatever the rule computed
(``where(x > 0, sqrt(x), 0)`` at ``x = 0`` has a zero gradient, not ``0 * inf = NaN``), and a
NaN adjoint still propagates. Broadcasting follows the recorder's two layouts: ``SAME``
(ternary entries whose inputs all have the output's size) and ``GENERAL`` blocks, walked as
rows of the innermost axis as on the CPU.
"""

from __future__ import annotations

import math

from numba import cuda, int64, uint64

from tape.gpu._config import DEVICE_JIT
from tape.gpu._program import H_BUFS, H_ENTRIES, H_FLAG, H_GRAD, H_IPOOL, H_STATUS, H_WORK
from tape.layout.columns import (
    B_KIND,
    B_OFF,
    B_SIZE,
    BUF_COLS,
    CONST,
    E_ATTR,
    E_IN0,
    E_IN1,
    E_IN2,
    E_OUT,
    ENTRY_COLS,
    SAME,
)
from tape.ops import masked as _masked
from tape.ops.blocks import broadcast

_dev = cuda.jit(**DEVICE_JIT)
# the broadcast block's positions (tape.ops.blocks.broadcast), as the CPU loops compile them too
ndim_at = _dev(broadcast.ndim_at)
dims_at = _dev(broadcast.dims_at)
row_length_at = _dev(broadcast.row_length_at)
strides_at = _dev(broadcast.strides_at)
inner_stride_at = _dev(broadcast.inner_stride_at)

# reduction kinds (block_reduce, combine)
R_SUM = 0
R_MAX = 1
R_MIN = 2
R_PROD = 3


# ---------------------------------------------------------------- the packed tape


# Indices go through uint64: Numba wraps negative signed indices around (a compare and a
# select per access), which made a third of the kernels' code. Every index here is >= 0.


@_dev
def ix(e, step, base):
    """Arena index of element ``e`` (see the module docstring)."""
    return uint64(e * step + base)


@_dev
def udiv(a, b):
    """``a // b`` for ``a >= 0, b > 0`` without the sign fix-ups of Python's floor division."""
    return int64(uint64(a) // uint64(b))


@_dev
def ent(prog, i, c):
    return prog[uint64(prog[uint64(H_ENTRIES)] + i * ENTRY_COLS + c)]


@_dev
def _brow(prog, b, c):
    return prog[uint64(prog[uint64(H_BUFS)] + b * BUF_COLS + c)]


@_dev
def boff(prog, b):
    return _brow(prog, b, B_OFF)


@_dev
def bsize(prog, b):
    return _brow(prog, b, B_SIZE)


@_dev
def active(prog, b):
    return _brow(prog, b, B_KIND) != CONST


@_dev
def ip(prog, k):
    return prog[uint64(prog[uint64(H_IPOOL)] + k)]


@_dev
def goff(prog):
    return prog[uint64(H_GRAD)]


@_dev
def woff(prog):
    return prog[uint64(H_WORK)]


@_dev
def in_off(mode, prog, p, k, j):
    """Offset into input ``k`` of output element ``j``: ``j`` itself under ``SAME``; under a
    ``GENERAL`` block at ``p`` (``[mode, nd, shape[nd], strides_0[nd], ...]``), the start of
    ``j``'s row in input ``k`` plus its column times the row stride, as the CPU loops walk
    it, computed without a table. Equal shapes and scalars are one row (``nd == 1``): no
    division at all."""
    if mode == SAME:
        return j
    nd = ip(prog, ndim_at(p))
    st = strides_at(p, nd, k)  # input k's strides
    if nd == 1:
        return j * ip(prog, st)
    m = ip(prog, row_length_at(p, nd))  # row length: the innermost axis
    r = udiv(j, m)
    off = (j - r * m) * ip(prog, inner_stride_at(p, nd, k))
    d0 = dims_at(p)
    for d in range(nd - 2, -1, -1):
        s = ip(prog, d0 + d)
        q = udiv(r, s)
        off += (r - q * s) * ip(prog, st + d)
        r = q
    return off


@_dev
def reject(i, prog, A, base, step, solo):
    """Entry ``i`` found bad data (a gather index out of bounds, a failed guard): record it
    in ``prog[H_STATUS]`` (the earliest such entry wins), and in batched replay (``solo``)
    raise this instance's flag, so that only this instance stops and the host can tell which
    instances to redo."""
    cuda.atomic.min(prog, H_STATUS, i)
    if solo:
        A[ix(prog[uint64(H_FLAG)], step, base)] = 1.0


# ---------------------------------------------------------------- reductions


@_dev
def identity(kind):
    if kind == R_MAX:
        return -math.inf
    if kind == R_MIN:
        return math.inf
    if kind == R_PROD:
        return 1.0
    return 0.0


@_dev
def combine(kind, a, b):
    # max / min propagate NaN, as the CPU kernels do
    if kind == R_SUM:
        return a + b
    if kind == R_PROD:
        return a * b
    if a != a:
        return a
    if b != b:
        return b
    if kind == R_MAX:
        return b if b > a else a
    return b if b < a else a


@_dev
def block_reduce(sh, v, kind):
    """Combine ``v`` over the block (every thread of the block must call this; the block
    size must be a power of two). Every thread gets the result."""
    t = cuda.threadIdx.x
    sh[t] = v
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            sh[t] = combine(kind, sh[t], sh[t + s])
        cuda.syncthreads()
        s //= 2
    r = sh[0]
    cuda.syncthreads()
    return r


@_dev
def add_scalar(A, idx, acc, solo, sh):
    """``A[idx] += sum of acc over the block`` (one atomic per block); plain in solo mode.
    ``idx`` is an arena index (:func:`ix`)."""
    if solo:
        A[idx] += acc
    else:
        tot = block_reduce(sh, acc, R_SUM)
        if cuda.threadIdx.x == 0:
            cuda.atomic.add(A, idx, tot)


@_dev
def accumulate(A, idx, v, atomic):
    if atomic:
        cuda.atomic.add(A, idx, v)
    else:
        A[idx] += v


# ---------------------------------------------------------------- elementwise
# One call site per rule and loop (the rules inline their libdevice math: every extra copy is
# kilobytes of PTX and seconds of ptxas). Instead of unrolling, each loop loads the next
# element's operands before it works on the current one: all buffers are views of one arena,
# so the compiler may not move a load above a store, and a plain loop would wait a full
# memory latency per element.


masked = _dev(_masked.masked)  # the CPU loops' accumulate rule, compiled for the device


@_dev
def unary_fwd(f, ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    o = ent(prog, i, E_OUT)
    y = boff(prog, o)
    n = bsize(prog, o)
    u = 0.0
    j = t0  # the element being loaded; the one before it is computed
    while j < n + ts:
        un = 0.0
        if j < n:
            un = A[ix(x + j, step, base)]
        if j != t0:
            A[ix(y + j - ts, step, base)] = f(u)
        u = un
        j += ts


@_dev
def unary_rev(r, ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = ent(prog, i, E_IN0)
    if not active(prog, a):
        return
    o = ent(prog, i, E_OUT)
    x = boff(prog, a)
    y = boff(prog, o)
    gx = goff(prog) + x
    gy = goff(prog) + y
    n = bsize(prog, o)
    u = 0.0
    v = 0.0
    g = 0.0
    j = t0
    while j < n + ts:
        un = 0.0
        vn = 0.0
        gn = 0.0
        if j < n:
            un = A[ix(x + j, step, base)]
            vn = A[ix(y + j, step, base)]
            gn = A[ix(gy + j, step, base)]
        if j != t0:
            A[ix(gx + j - ts, step, base)] += masked(r(u, v, g), g)
        u = un
        v = vn
        g = gn
        j += ts


# ---------------------------------------------------------------- binary


@_dev
def binary_fwd(f, ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = boff(prog, ent(prog, i, E_IN0))
    b = boff(prog, ent(prog, i, E_IN1))
    o = ent(prog, i, E_OUT)
    y = boff(prog, o)
    n = bsize(prog, o)
    p = ent(prog, i, E_ATTR)
    mode = ip(prog, p)
    u = 0.0
    v = 0.0
    j = t0
    while j < n + ts:
        un = 0.0
        vn = 0.0
        if j < n:
            un = A[ix(a + in_off(mode, prog, p, 0, j), step, base)]
            vn = A[ix(b + in_off(mode, prog, p, 1, j), step, base)]
        if j != t0:
            A[ix(y + j - ts, step, base)] = f(u, v)
        u = un
        v = vn
        j += ts


@_dev
def _binary_rev_one(r, k, i, prog, A, base, step, t0, ts, solo, sh):
    ia = ent(prog, i, E_IN0)
    ib = ent(prog, i, E_IN1)
    target = ia if k == 0 else ib
    if not active(prog, target):
        return
    o = ent(prog, i, E_OUT)
    a = boff(prog, ia)
    b = boff(prog, ib)
    y = boff(prog, o)
    gy = goff(prog) + y
    gk = goff(prog) + boff(prog, target)
    n = bsize(prog, o)
    p = ent(prog, i, E_ATTR)
    mode = ip(prog, p)
    # a one-element input sums over the whole output (block reduction, one atomic per
    # block); another input smaller than the output (broadcast) gets atomics; otherwise each
    # of its elements has one writer
    scalar = bsize(prog, target) == 1
    atomic = (not solo) and bsize(prog, target) < n
    acc = 0.0
    u = 0.0
    v = 0.0
    w = 0.0
    g = 0.0
    dst = 0
    j = t0
    while j < n + ts:
        un = 0.0
        vn = 0.0
        wn = 0.0
        gn = 0.0
        dn = 0
        if j < n:
            o0 = in_off(mode, prog, p, 0, j)
            o1 = in_off(mode, prog, p, 1, j)
            un = A[ix(a + o0, step, base)]
            vn = A[ix(b + o1, step, base)]
            wn = A[ix(y + j, step, base)]
            gn = A[ix(gy + j, step, base)]
            dn = o0 if k == 0 else o1
        if j != t0:
            c = masked(r(u, v, w, g), g)
            if scalar:
                acc += c
            else:
                accumulate(A, ix(gk + dst, step, base), c, atomic)
        u = un
        v = vn
        w = wn
        g = gn
        dst = dn
        j += ts
    if scalar:
        add_scalar(A, ix(gk, step, base), acc, solo, sh)


@_dev
def binary_rev(r0, r1, d0, d1, ph, i, prog, A, base, step, t0, ts, solo, sh):
    # one phase per input: the two inputs may view the same memory (x[1:] * x[:-1])
    if ph == 0:
        if d0:
            _binary_rev_one(r0, 0, i, prog, A, base, step, t0, ts, solo, sh)
    elif d1:
        _binary_rev_one(r1, 1, i, prog, A, base, step, t0, ts, solo, sh)


# ---------------------------------------------------------------- ternary (SAME or GENERAL)


@_dev
def ternary_fwd(f, ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = boff(prog, ent(prog, i, E_IN0))
    b = boff(prog, ent(prog, i, E_IN1))
    c = boff(prog, ent(prog, i, E_IN2))
    o = ent(prog, i, E_OUT)
    y = boff(prog, o)
    n = bsize(prog, o)
    p = ent(prog, i, E_ATTR)
    mode = ip(prog, p)
    for j in range(t0, n, ts):
        A[ix(y + j, step, base)] = f(
            A[ix(a + in_off(mode, prog, p, 0, j), step, base)],
            A[ix(b + in_off(mode, prog, p, 1, j), step, base)],
            A[ix(c + in_off(mode, prog, p, 2, j), step, base)],
        )


@_dev
def _ternary_rev_one(r, k, i, prog, A, base, step, t0, ts, solo, sh):
    ia = ent(prog, i, E_IN0)
    ib = ent(prog, i, E_IN1)
    ic = ent(prog, i, E_IN2)
    target = ia if k == 0 else (ib if k == 1 else ic)
    if not active(prog, target):
        return
    o = ent(prog, i, E_OUT)
    a = boff(prog, ia)
    b = boff(prog, ib)
    c = boff(prog, ic)
    y = boff(prog, o)
    gy = goff(prog) + y
    gk = goff(prog) + boff(prog, target)
    n = bsize(prog, o)
    p = ent(prog, i, E_ATTR)
    mode = ip(prog, p)
    atomic = (not solo) and bsize(prog, target) < n
    for j in range(t0, n, ts):
        g = A[ix(gy + j, step, base)]
        v = r(
            A[ix(a + in_off(mode, prog, p, 0, j), step, base)],
            A[ix(b + in_off(mode, prog, p, 1, j), step, base)],
            A[ix(c + in_off(mode, prog, p, 2, j), step, base)],
            A[ix(y + j, step, base)],
            g,
        )
        accumulate(A, ix(gk + in_off(mode, prog, p, k, j), step, base), masked(v, g), atomic)


@_dev
def ternary_rev(r0, r1, r2, d0, d1, d2, ph, i, prog, A, base, step, t0, ts, solo, sh):
    if ph == 0:
        if d0:
            _ternary_rev_one(r0, 0, i, prog, A, base, step, t0, ts, solo, sh)
    elif ph == 1:
        if d1:
            _ternary_rev_one(r1, 1, i, prog, A, base, step, t0, ts, solo, sh)
    elif d2:
        _ternary_rev_one(r2, 2, i, prog, A, base, step, t0, ts, solo, sh)
