"""The ops of the neural-network front end (:mod:`tape.frontend.nn.functional`):
``cross_entropy``, ``matmul_nt`` and ``logsumexp``. They are registered after every other
family, so that adding them left the other op codes as they were.

``cross_entropy`` is the negative log-softmax of logits picked at a target class, one value
per row, as one entry (where ``log_softmax`` followed by a gather records a chain of ten).
The logits are viewed as ``(outer, n, inner)`` with ``n`` the class axis (the scan block,
:mod:`tape.ops.blocks.scan`): element ``j`` of row ``(o, q)`` is at
``o * n * inner + j * inner + q``. Input 1 holds one class index per row (``outer * inner``
values, written into the float arena: exact below ``2**24`` in float32), in ``-n .. n-1`` (a
negative index counts from the end, as ``take``'s); the forward kernel checks them and stops
the sweep on one out of range. Output element ``(o, q)`` is

    ``y = log(sum_j exp(x_j - m)) - (x_t - m)``

with ``m`` the row's maximum (``0`` where it is not finite), the same shift and the same
operations as ``-log_softmax(x)[t]``. With ``p_j = exp(x_j - m) / sum_k exp(x_k - m)`` the
softmax, the reverse rule is ``dL/dx_j = gy (p_j - [j = t])``; the tangent is
``sum_j p_j tx_j - tx_t``.

``logsumexp`` is ``log(sum_j exp(x_j))`` over the rows of the same ``(outer, n, inner)`` view,
one value per row, as one entry (where ``max``, the shift's guard, ``exp``, ``sum``, ``log``
and ``add`` recorded a chain of nine): ``y = log(sum_j exp(x_j - m)) + m`` with the shift
``m`` of ``cross_entropy``. An empty row gives ``-inf``. The reverse rule is ``dL/dx_j = gy
p_j``, the tangent ``sum_j p_j tx_j`` and the tangent of the reverse ``tgy p_j + gy p_j (tx_j
- sum_k p_k tx_k)``, with ``p`` the row's softmax (computed again from the shift and the sum).

``matmul_nt`` is ``matmul`` with its second operand held transposed (``A[b] @ B[b]^T``, the
same attribute block, ``B[b]`` of ``n x k``): ``linear``'s ``x W^T`` without a copy of
``W.T`` in the forward sweep or the reverse. Its kernels, check and sparsity rule are
``matmul``'s (:mod:`tape.ops.linalg`) with the transposed flag.
"""

import math

import numpy as np

from tape.layout.calls import compiled_only
from tape.layout.columns import E_ATTR, E_IN0, E_IN1, E_OUT
from tape.ops import linalg, registry, validate
from tape.ops import vmath as vm
from tape.ops.blocks import scan as sc
from tape.ops.loops import active, span, view

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)


@_jit
def _block(ipool, p):
    return ipool[p + sc.OUTER], ipool[p + sc.N], ipool[p + sc.INNER]


@_jit
def _shift_sum(x, s, n, inner):
    """``(m, S)`` of the row starting at ``x[s]`` (stride ``inner``): the shift (the row's
    maximum, ``0`` where it is not finite) and ``sum_j exp(x_j - m)``, summed in order."""
    m = x[s]
    for j in range(1, n):
        v = x[s + j * inner]
        if v > m or v != v:
            m = v
    if not abs(m) < math.inf:
        m = 0.0
    total = 0.0 * m  # m is finite here (0 * x[s] is NaN for an infinite x[s])
    for j in range(n):
        total += math.exp(x[s + j * inner] - m)
    return m, total


@_jit
def _exps(x, s, n, inner, ex):
    """:func:`_shift_sum`, with ``exp(x_j - m)`` kept in ``ex`` (the same values and sum)."""
    m = x[s]
    for j in range(1, n):
        v = x[s + j * inner]
        if v > m or v != v:
            m = v
    if not abs(m) < math.inf:
        m = 0.0
    total = 0.0 * m  # m is finite here (0 * x[s] is NaN for an infinite x[s])
    for j in range(n):
        ex[j] = math.exp(x[s + j * inner] - m)
        total += ex[j]
    return total


@_jit
def _target(idx, r, n):
    c = int(idx[r])
    return c + n if c < 0 else c


@_jit
def cross_entropy_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    idx = view(bufs, data, entries[i, E_IN1])
    y = view(bufs, data, entries[i, E_OUT])
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    for r in range(idx.shape[0]):
        v = idx[r]
        # the range first: int() of NaN, inf or a huge float is undefined behaviour
        if not (v >= -n and v < n):
            return i
        if int(v) != v:
            return i
    for o in range(outer):
        for q in range(inner):
            r = o * inner + q
            s = o * n * inner + q
            m, total = _shift_sum(x, s, n, inner)
            t = _target(idx, r, n)
            y[r] = math.log(total) - (x[s + t * inner] - m)
    return -1


@_jit
def cross_entropy_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    x = view(bufs, data, a)
    idx = view(bufs, data, entries[i, E_IN1])
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, entries[i, E_OUT])
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    ex = np.empty(n, np.float64)
    for o in range(outer):
        for q in range(inner):
            r = o * inner + q
            g = gy[r]
            if g == 0.0:  # a zero adjoint contributes exactly zero (no 0 * inf)
                continue
            s = o * n * inner + q
            w = g / _exps(x, s, n, inner, ex)
            t = _target(idx, r, n)
            for j in range(n):
                v = ex[j] * w
                gx[s + j * inner] += v - g if j == t else v


@_jit
def _tangent(x, tx, s, n, inner, m, total, t):
    """``sum_j p_j tx_j - tx_t`` for the row at ``s`` (zero tangents contribute nothing)."""
    acc = 0.0 * m
    for j in range(n):
        u = tx[s + j * inner]
        if u != 0.0:
            acc += math.exp(x[s + j * inner] - m) / total * u
    u = tx[s + t * inner]
    if u != 0.0:
        acc -= u
    return acc


@_jit
def cross_entropy_jvp(i, entries, bufs, ipool, data, T):
    x = view(bufs, data, entries[i, E_IN0])
    idx = view(bufs, data, entries[i, E_IN1])
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], entries[i, E_IN0])
        ty = view(bufs, T[d], entries[i, E_OUT])
        for o in range(outer):
            for q in range(inner):
                r = o * inner + q
                s = o * n * inner + q
                m, total = _shift_sum(x, s, n, inner)
                ty[r] = _tangent(x, tx, s, n, inner, m, total, _target(idx, r, n))


@_jit
def cross_entropy_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    # the tangent of gx_j += gy (p_j - [j = t]): tgy (p_j - [j = t]) + gy p_j (tx_j - sum_k p_k tx_k)
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    io = entries[i, E_OUT]
    x = view(bufs, data, a)
    idx = view(bufs, data, entries[i, E_IN1])
    gy = view(bufs, grad, io)
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], a)
        tgx = view(bufs, GT[d], a)
        tgy = view(bufs, GT[d], io)
        for o in range(outer):
            for q in range(inner):
                r = o * inner + q
                s = o * n * inner + q
                t = _target(idx, r, n)
                m, total = _shift_sum(x, s, n, inner)
                g = gy[r]
                dg = tgy[r]
                mean = 0.0 * m
                if g != 0.0:
                    mean = _tangent(x, tx, s, n, inner, m, total, t) + tx[s + t * inner]
                for j in range(n):
                    e = s + j * inner
                    p = math.exp(x[e] - m) / total
                    v = 0.0 * m
                    if dg != 0.0:
                        v += dg * (p - 1.0) if j == t else dg * p
                    if g != 0.0:
                        v += g * p * (tx[e] - mean)
                    tgx[e] += v


# ---------------------------------------------------------------- logsumexp
# In float64, with the vectorisable exp and log of tape.ops.vmath (the elementwise ops'). The
# loops run across rows, innermost (contiguous, so they vectorise), each row's shift and sum
# in scratch arrays: rows over an inner axis in place, short rows along the last axis copied
# side by side (_row_block); a long row along the last axis is walked element by element.
# The same operations in the same order per row, so the same bits in every layout. The
# derivatives compute the softmax again as p_j = exp(x_j - m) / S from the shift m and the
# sum S, not as exp(x_j - y): y is rounded at its own magnitude, which would cost the
# gradient of float32 logits near 300 two decimal digits.


SHORT_ROWS = 64
"""Rows along the last axis shorter than this are taken :data:`ROW_BLOCK` at a time, copied
side by side (transposed), so that the loops run across rows and vectorise."""
ROW_BLOCK = 256


@_jit
def _row_block(x, o0, n, outer, rows, m, tot, ex):
    """Rows ``o0 ..`` (at most :data:`ROW_BLOCK`) of ``x`` viewed as ``(outer, n)``, copied
    into ``rows`` as ``(n, k)``, and their shifts and sums (:func:`_shift_sums`, across the
    rows); returns ``k``."""
    k = min(ROW_BLOCK, outer - o0)
    for r in range(k):
        xr = span(x, (o0 + r) * n, n)
        for j in range(n):
            rows[j * k + r] = xr[j]
    _shift_sums(rows, np.int64(0), n, k, m, tot, ex)
    return k


@_jit
def _shift_sums(x, o, n, inner, m, tot, ex):
    """The shift ``m[q]`` and the sum ``tot[q] = sum_j exp(x_j - m[q])`` of rows ``(o, q)``
    of ``x`` viewed as ``(outer, n, inner)``, ``n >= 1`` (``ex``: scratch of ``n``)."""
    if inner == 1:
        xo = span(x, o * n, n)
        mm = float(xo[0])
        for j in range(1, n):
            v = float(xo[j])
            mm = v if (v > mm or v != v) else mm
        mm = mm if abs(mm) < math.inf else 0.0
        for j in range(n):
            ex[j] = vm.exp(xo[j] - mm)
        total = 0.0
        for j in range(n):
            total += ex[j]
        m[0] = mm
        tot[0] = total
        return
    xs = span(x, o * n * inner, inner)
    for q in range(inner):
        m[q] = xs[q]
    for j in range(1, n):
        xs = span(x, (o * n + j) * inner, inner)
        for q in range(inner):
            v = float(xs[q])
            c = m[q]
            m[q] = v if (v > c or v != v) else c
    for q in range(inner):
        c = m[q]
        m[q] = c if abs(c) < math.inf else 0.0
        tot[q] = 0.0
    for j in range(n):
        xs = span(x, (o * n + j) * inner, inner)
        for q in range(inner):
            tot[q] += vm.exp(xs[q] - m[q])


@_jit
def logsumexp_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        for r in range(y.shape[0]):
            y[r] = -math.inf
        return -1
    if inner == 1 and n < SHORT_ROWS and outer > 1:  # rows side by side, as inner ones
        m, tot, ex = np.empty(ROW_BLOCK), np.empty(ROW_BLOCK), np.empty(n)
        rows = np.empty(n * ROW_BLOCK)
        for o0 in range(0, outer, ROW_BLOCK):
            k = _row_block(x, o0, n, outer, rows, m, tot, ex)
            for r in range(k):
                y[o0 + r] = vm.log(tot[r]) + m[r]
        return -1
    m, tot, ex = np.empty(inner), np.empty(inner), np.empty(n)
    for o in range(outer):
        _shift_sums(x, o, n, inner, m, tot, ex)
        yo = span(y, o * inner, inner)
        for q in range(inner):
            yo[q] = vm.log(tot[q]) + m[q]
    return -1


@_jit
def logsumexp_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    x = view(bufs, data, a)
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, entries[i, E_OUT])
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        return
    if inner == 1 and n < SHORT_ROWS and outer > 1:  # rows side by side, as inner ones
        m, tot, ex = np.empty(ROW_BLOCK), np.empty(ROW_BLOCK), np.empty(n)
        rows = np.empty(n * ROW_BLOCK)
        for o0 in range(0, outer, ROW_BLOCK):
            k = _row_block(x, o0, n, outer, rows, m, tot, ex)
            g = span(gy, o0, k)
            for r in range(k):
                tot[r] = g[r] / tot[r]
            for j in range(n):
                pj = span(rows, j * k, k)
                for r in range(k):
                    pj[r] = vm.exp(pj[r] - m[r]) * tot[r]
            for r in range(k):
                if g[r] != 0.0:  # a zero adjoint contributes exactly zero (no 0 * inf)
                    gr = span(gx, (o0 + r) * n, n)
                    for j in range(n):
                        gr[j] += rows[j * k + r]
        return
    m, tot, ex = np.empty(inner), np.empty(inner), np.empty(n)
    w = np.empty(inner)
    for o in range(outer):
        gyo = span(gy, o * inner, inner)
        if inner == 1 and gyo[0] == 0.0:
            continue  # a zero adjoint contributes exactly zero (no 0 * inf)
        _shift_sums(x, o, n, inner, m, tot, ex)
        if inner == 1:  # the row's exps are in ex
            g = gyo[0] / tot[0]
            go = span(gx, o * n, n)
            for j in range(n):
                go[j] += ex[j] * g
            continue
        for q in range(inner):
            w[q] = gyo[q] / tot[q]
        for j in range(n):
            xs = span(x, (o * n + j) * inner, inner)
            gs = span(gx, (o * n + j) * inner, inner)
            for q in range(inner):
                v = vm.exp(xs[q] - m[q]) * w[q]
                gs[q] += v if gyo[q] != 0.0 else 0.0


@_jit
def _lse_probs(x, o, n, inner, m, tot, ex, P):
    """``P[j * inner + q] = p_j``, the softmax of rows ``(o, q)`` of ``x`` (viewed as ``(outer,
    n, inner)``), from their shifts and sums (and, for ``inner == 1``, the exponentials that
    :func:`_shift_sums` left in ``ex``); computed once per row for every direction."""
    if inner == 1:
        for j in range(n):
            P[j] = ex[j] / tot[0]
        return
    for j in range(n):
        xs = span(x, (o * n + j) * inner, inner)
        ps = span(P, j * inner, inner)
        for q in range(inner):
            ps[q] = vm.exp(xs[q] - m[q]) / tot[q]


@_jit
def _lse_means(P, tx, o, n, inner, mean):
    """``mean[q] = sum_j p_j tx_j`` for the rows ``(o, q)`` (zero tangents contribute
    nothing), ``P`` from :func:`_lse_probs`."""
    for q in range(inner):
        mean[q] = 0.0
    for j in range(n):
        ps = span(P, j * inner, inner)
        ts = span(tx, (o * n + j) * inner, inner)
        for q in range(inner):
            u = float(ts[q])
            v = ps[q] * u
            mean[q] += v if u != 0.0 else 0.0


@_jit
def logsumexp_jvp(i, entries, bufs, ipool, data, T):
    x = view(bufs, data, entries[i, E_IN0])
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    m, tot, ex, mean = np.empty(inner), np.empty(inner), np.empty(n), np.empty(inner)
    P = np.empty(n * inner)
    for o in range(outer):
        if n > 0:
            _shift_sums(x, o, n, inner, m, tot, ex)
            _lse_probs(x, o, n, inner, m, tot, ex, P)
        for d in range(T.shape[0]):
            tx = view(bufs, T[d], entries[i, E_IN0])
            ty = span(view(bufs, T[d], entries[i, E_OUT]), o * inner, inner)
            _lse_means(P, tx, o, n, inner, mean)
            for q in range(inner):
                ty[q] = mean[q]


@_jit
def logsumexp_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    # the tangent of gx_j += gy p_j: tgy p_j + gy p_j (tx_j - sum_k p_k tx_k)
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    io = entries[i, E_OUT]
    x = view(bufs, data, a)
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        return
    go = span(view(bufs, grad, io), 0, outer * inner)
    m, tot, ex, mean = np.empty(inner), np.empty(inner), np.empty(n), np.empty(inner)
    P = np.empty(n * inner)
    for o in range(outer):
        _shift_sums(x, o, n, inner, m, tot, ex)
        _lse_probs(x, o, n, inner, m, tot, ex, P)
        g = span(go, o * inner, inner)
        for d in range(T.shape[0]):
            tx = view(bufs, T[d], a)
            tgx = view(bufs, GT[d], a)
            dg = span(view(bufs, GT[d], io), o * inner, inner)
            _lse_means(P, tx, o, n, inner, mean)
            for j in range(n):
                ps = span(P, j * inner, inner)
                ts = span(tx, (o * n + j) * inner, inner)
                hs = span(tgx, (o * n + j) * inner, inner)
                for q in range(inner):
                    p = ps[q]
                    v = dg[q] * p if dg[q] != 0.0 else 0.0
                    w = g[q] * p * (ts[q] - mean[q])
                    hs[q] += v + (w if g[q] != 0.0 else 0.0)


def check_logsumexp(t, i, e):
    """Validation of a ``logsumexp`` entry: the input is read as ``(outer, n, inner)``, the
    output holds one value per row."""
    outer, n, inner = _check_view(t, i, e)
    validate.equal_sizes(t, i, "the output", e[E_OUT], outer * inner, "one value per row")


def _rows(t, i):
    return sc.decode(t.ipool, int(t.entries[i, E_ATTR]))


def sparsity(t, i, data):
    """Output ``(o, q)`` depends on every element of row ``(o, q)`` of the logits, and every
    two of them interact (group: the row)."""
    outer, n, inner = _rows(t, i)
    e = np.arange(outer * n * inner)
    row = (e // max(n * inner, 1)) * inner + e % max(inner, 1)
    return [(0, row, e)], [(0, row, e, 0, row, e)]


def _check_view(t, i, e):
    """The ``(outer, n, inner)`` view of input 0 of entry ``i`` (its attribute block, the
    view's extents, input 0's size), validated: ``cross_entropy``'s and ``logsumexp``'s."""
    outer, n, inner = validate.block(t, i, 0, sc.SIZE, "outer, n and inner")
    validate.dims(t, i, [outer, n, inner], "the (outer, n, inner) view")
    validate.equal_sizes(
        t, i, "input 0", e[E_IN0], outer * n * inner, f"it is read as {outer} x {n} x {inner}"
    )  # fmt: skip
    return outer, n, inner


def check(t, i, e):
    """Validation of a ``cross_entropy`` entry: the logits are read as ``(outer, n, inner)``,
    the indices and the output hold one value per row. The forward kernel checks the indices;
    the reverse kernel reads them again unchecked, so no later entry may write them and the
    saved values must be in range."""
    idx, y = e[E_IN1], e[E_OUT]
    outer, n, inner = _check_view(t, i, e)
    validate.equal_sizes(t, i, "input 1", idx, outer * inner, "one class index per row")
    validate.equal_sizes(t, i, "the output", y, outer * inner, "one value per row")
    j = validate.later_writer(t, i, idx)
    if j >= 0:
        validate.fail(
            t, i,
            f"entry {j} writes the memory of its index buffer {idx} after the indices are "
            "checked (the reverse sweep reads them unchecked)",
        )  # fmt: skip
    v = t.view(t.data, int(idx)).ravel()
    with np.errstate(invalid="ignore"):
        ok = (v == np.floor(v)) & (v >= -n) & (v < n)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        validate.fail(t, i, f"class index {v[k]:g} (row {k}) is out of range for {n} classes")


def failure(t, i, read, at):
    """Why a ``cross_entropy`` entry stopped the sweep: the first class index out of range."""
    n = _rows(t, i).n
    idx = np.asarray(read(int(t.entries[i, E_IN1]))).ravel()
    bad = [v for v in idx if not -n <= v < n or v != int(v)]
    if not bad:
        return None
    return (
        f"entry {i} (cross_entropy){at}: Target {bad[0]:g} is out of bounds for {n} classes "
        "(class indices are checked at every replay)"
    )


CROSS_ENTROPY = registry.structural(
    "cross_entropy", cross_entropy_fwd, cross_entropy_rev, module=__name__, n_inputs=2,
    differentiable=(True, False), check=check, gpu="cross_entropy", dtype=("like", (0,)),
    describe_failure=failure, jvp=cross_entropy_jvp, hvp=cross_entropy_hvp, sparsity=sparsity,
)  # fmt: skip
MATMUL_NT = registry.structural(
    "matmul_nt", linalg.matmul_nt_fwd, linalg.matmul_nt_rev, module=linalg.__name__, n_inputs=2,
    differentiable=(True, True), check=linalg.check, gpu="matmul_nt", jvp=linalg.matmul_nt_jvp,
    hvp=linalg.matmul_nt_hvp, sparsity=linalg.sparsity_nt, may_stop=False,
)  # fmt: skip
LOGSUMEXP = registry.structural(
    "logsumexp", logsumexp_fwd, logsumexp_rev, module=__name__, n_inputs=1,
    differentiable=(True,), check=check_logsumexp, gpu="logsumexp", dtype=("like", (0,)),
    jvp=logsumexp_jvp, hvp=logsumexp_hvp, sparsity=sparsity, may_stop=False,
)  # fmt: skip
