"""Device loops: the GPU counterparts of :mod:`tape._loops`, shared by every op.

Every entry function has the signature ``(ph, i, prog, A, base, step, t0, ts, solo, sh)``:

``ph``
    The phase of entry ``i`` to run (see :mod:`tape.cuda._program`).
``prog``, ``A``
    The packed tape and the arena.
``base``, ``step``
    Arena element ``e`` is ``A[e * step + base]``: ``(0, 1)`` for a single replay, ``(b, n)``
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
has one writer in a phase (same-shape elementwise inputs, gathers by output, matrix
products by output element) the loops add plainly; where several elements of the output
feed one input element (broadcasting, ``take`` with repeated indices, a strided copy with a
zero stride) they use ``cuda.atomic.add``; a scalar broadcast input sums in a block reduction
first (one atomic per block instead of one per element).
"""

from __future__ import annotations

import math

from numba import cuda

from tape._layout import (
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
    SCALAR0,
    SCALAR1,
)
from tape.cuda._config import DEVICE_JIT
from tape.cuda._program import H_BUFS, H_ENTRIES, H_GRAD, H_IPOOL, H_WORK

_dev = cuda.jit(**DEVICE_JIT)

# reduction kinds (block_reduce, combine)
R_SUM = 0
R_MAX = 1
R_MIN = 2
R_PROD = 3


# ---------------------------------------------------------------- the packed tape


@_dev
def ent(prog, i, c):
    return prog[prog[H_ENTRIES] + i * ENTRY_COLS + c]


@_dev
def boff(prog, b):
    return prog[prog[H_BUFS] + b * BUF_COLS + B_OFF]


@_dev
def bsize(prog, b):
    return prog[prog[H_BUFS] + b * BUF_COLS + B_SIZE]


@_dev
def active(prog, b):
    return prog[prog[H_BUFS] + b * BUF_COLS + B_KIND] != CONST


@_dev
def ip(prog, k):
    return prog[prog[H_IPOOL] + k]


@_dev
def goff(prog):
    return prog[H_GRAD]


@_dev
def woff(prog):
    return prog[H_WORK]


@_dev
def bcast(prog, p, k, j):
    """Offset into input ``k`` of output element ``j`` of a GENERAL broadcast block at ``p``
    (``[mode, nd, shape[nd], strides_0[nd], ...]``), computed without a table."""
    nd = ip(prog, p + 1)
    off = 0
    r = j
    for d in range(nd - 1, -1, -1):
        s = ip(prog, p + 2 + d)
        q = r // s
        off += (r - q * s) * ip(prog, p + 2 + nd * (1 + k) + d)
        r = q
    return off


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
    """``A[idx] += sum of acc over the block`` (one atomic per block); plain in solo mode."""
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


# ---------------------------------------------------------------- unary
# The same-shape loops are unrolled by four with the loads of a group before its stores: all
# buffers are views of one arena, so the compiler may not move a load above a store, and a
# plain loop would wait a full memory latency per element.


@_dev
def unary_fwd(f, ph, i, prog, A, base, step, t0, ts, solo, sh):
    x = boff(prog, ent(prog, i, E_IN0))
    o = ent(prog, i, E_OUT)
    y = boff(prog, o)
    n = bsize(prog, o)
    j = t0
    while j + 3 * ts < n:
        a0 = A[(x + j) * step + base]
        a1 = A[(x + j + ts) * step + base]
        a2 = A[(x + j + 2 * ts) * step + base]
        a3 = A[(x + j + 3 * ts) * step + base]
        A[(y + j) * step + base] = f(a0)
        A[(y + j + ts) * step + base] = f(a1)
        A[(y + j + 2 * ts) * step + base] = f(a2)
        A[(y + j + 3 * ts) * step + base] = f(a3)
        j += 4 * ts
    while j < n:
        A[(y + j) * step + base] = f(A[(x + j) * step + base])
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
    j = t0
    while j + 3 * ts < n:
        e0 = j
        e1 = j + ts
        e2 = j + 2 * ts
        e3 = j + 3 * ts
        c0 = r(A[(x + e0) * step + base], A[(y + e0) * step + base], A[(gy + e0) * step + base])
        c1 = r(A[(x + e1) * step + base], A[(y + e1) * step + base], A[(gy + e1) * step + base])
        c2 = r(A[(x + e2) * step + base], A[(y + e2) * step + base], A[(gy + e2) * step + base])
        c3 = r(A[(x + e3) * step + base], A[(y + e3) * step + base], A[(gy + e3) * step + base])
        h0 = A[(gx + e0) * step + base]
        h1 = A[(gx + e1) * step + base]
        h2 = A[(gx + e2) * step + base]
        h3 = A[(gx + e3) * step + base]
        A[(gx + e0) * step + base] = h0 + c0
        A[(gx + e1) * step + base] = h1 + c1
        A[(gx + e2) * step + base] = h2 + c2
        A[(gx + e3) * step + base] = h3 + c3
        j += 4 * ts
    while j < n:
        A[(gx + j) * step + base] += r(
            A[(x + j) * step + base], A[(y + j) * step + base], A[(gy + j) * step + base]
        )
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
    if mode == SAME:
        j = t0
        while j + 3 * ts < n:
            u0 = A[(a + j) * step + base]
            u1 = A[(a + j + ts) * step + base]
            u2 = A[(a + j + 2 * ts) * step + base]
            u3 = A[(a + j + 3 * ts) * step + base]
            v0 = A[(b + j) * step + base]
            v1 = A[(b + j + ts) * step + base]
            v2 = A[(b + j + 2 * ts) * step + base]
            v3 = A[(b + j + 3 * ts) * step + base]
            A[(y + j) * step + base] = f(u0, v0)
            A[(y + j + ts) * step + base] = f(u1, v1)
            A[(y + j + 2 * ts) * step + base] = f(u2, v2)
            A[(y + j + 3 * ts) * step + base] = f(u3, v3)
            j += 4 * ts
        while j < n:
            A[(y + j) * step + base] = f(A[(a + j) * step + base], A[(b + j) * step + base])
            j += ts
    elif mode == SCALAR0:
        s = A[a * step + base]
        for j in range(t0, n, ts):
            A[(y + j) * step + base] = f(s, A[(b + j) * step + base])
    elif mode == SCALAR1:
        s = A[b * step + base]
        for j in range(t0, n, ts):
            A[(y + j) * step + base] = f(A[(a + j) * step + base], s)
    else:
        for j in range(t0, n, ts):
            o0 = bcast(prog, p, 0, j)
            o1 = bcast(prog, p, 1, j)
            A[(y + j) * step + base] = f(A[(a + o0) * step + base], A[(b + o1) * step + base])


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
    if mode == SAME:
        j = t0
        while j + 1 * ts < n:
            e1 = j + ts
            c0 = r(A[(a + j) * step + base], A[(b + j) * step + base],
                   A[(y + j) * step + base], A[(gy + j) * step + base])  # fmt: skip
            c1 = r(A[(a + e1) * step + base], A[(b + e1) * step + base],
                   A[(y + e1) * step + base], A[(gy + e1) * step + base])  # fmt: skip
            h0 = A[(gk + j) * step + base]
            h1 = A[(gk + e1) * step + base]
            A[(gk + j) * step + base] = h0 + c0
            A[(gk + e1) * step + base] = h1 + c1
            j += 2 * ts
        while j < n:
            A[(gk + j) * step + base] += r(A[(a + j) * step + base], A[(b + j) * step + base],
                                           A[(y + j) * step + base], A[(gy + j) * step + base])  # fmt: skip
            j += ts
    elif mode == SCALAR0 or mode == SCALAR1:
        s_is0 = mode == SCALAR0
        if s_is0:
            s = A[a * step + base]
        else:
            s = A[b * step + base]
        if s_is0 == (k == 0):
            # the scalar input: its adjoint sums over the whole output
            acc = 0.0
            for j in range(t0, n, ts):
                if s_is0:
                    acc += r(s, A[(b + j) * step + base], A[(y + j) * step + base], A[(gy + j) * step + base])
                else:
                    acc += r(A[(a + j) * step + base], s, A[(y + j) * step + base], A[(gy + j) * step + base])
            add_scalar(A, gk * step + base, acc, solo, sh)
        else:
            for j in range(t0, n, ts):
                if s_is0:
                    c = r(s, A[(b + j) * step + base], A[(y + j) * step + base], A[(gy + j) * step + base])
                else:
                    c = r(A[(a + j) * step + base], s, A[(y + j) * step + base], A[(gy + j) * step + base])
                A[(gk + j) * step + base] += c
    else:
        # several output elements may read one input element: atomics unless one writer
        atomic = (not solo) and bsize(prog, target) < n
        for j in range(t0, n, ts):
            o0 = bcast(prog, p, 0, j)
            o1 = bcast(prog, p, 1, j)
            c = r(A[(a + o0) * step + base], A[(b + o1) * step + base],
                  A[(y + j) * step + base], A[(gy + j) * step + base])  # fmt: skip
            ok = o0 if k == 0 else o1
            accumulate(A, (gk + ok) * step + base, c, atomic)


@_dev
def binary_rev(r0, r1, d0, d1, ph, i, prog, A, base, step, t0, ts, solo, sh):
    # one phase per input: the two inputs may view the same memory (x[1:] * x[:-1])
    if ph == 0:
        if d0:
            _binary_rev_one(r0, 0, i, prog, A, base, step, t0, ts, solo, sh)
    elif d1:
        _binary_rev_one(r1, 1, i, prog, A, base, step, t0, ts, solo, sh)


# ---------------------------------------------------------------- ternary


@_dev
def ternary_fwd(f, ph, i, prog, A, base, step, t0, ts, solo, sh):
    a = boff(prog, ent(prog, i, E_IN0))
    b = boff(prog, ent(prog, i, E_IN1))
    c = boff(prog, ent(prog, i, E_IN2))
    o = ent(prog, i, E_OUT)
    y = boff(prog, o)
    n = bsize(prog, o)
    p = ent(prog, i, E_ATTR)
    if ip(prog, p) == SAME:
        for j in range(t0, n, ts):
            A[(y + j) * step + base] = f(
                A[(a + j) * step + base], A[(b + j) * step + base], A[(c + j) * step + base]
            )
    else:
        for j in range(t0, n, ts):
            A[(y + j) * step + base] = f(
                A[(a + bcast(prog, p, 0, j)) * step + base],
                A[(b + bcast(prog, p, 1, j)) * step + base],
                A[(c + bcast(prog, p, 2, j)) * step + base],
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
    if ip(prog, p) == SAME:
        for j in range(t0, n, ts):
            A[(gk + j) * step + base] += r(
                A[(a + j) * step + base], A[(b + j) * step + base], A[(c + j) * step + base],
                A[(y + j) * step + base], A[(gy + j) * step + base],
            )  # fmt: skip
    else:
        atomic = (not solo) and bsize(prog, target) < n
        for j in range(t0, n, ts):
            o0 = bcast(prog, p, 0, j)
            o1 = bcast(prog, p, 1, j)
            o2 = bcast(prog, p, 2, j)
            v = r(
                A[(a + o0) * step + base], A[(b + o1) * step + base], A[(c + o2) * step + base],
                A[(y + j) * step + base], A[(gy + j) * step + base],
            )  # fmt: skip
            ok = o0 if k == 0 else (o1 if k == 1 else o2)
            accumulate(A, (gk + ok) * step + base, v, atomic)


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
