"""Scans and selection along an axis: cumulative sums and products, sorting permutations,
positions of extrema.

The input is viewed as ``(outer, n, inner)`` with ``n`` the length of the axis, so element
``j`` of row ``(o, q)`` is at ``o * n * inner + j * inner + q`` (a free reshape: no axis is ever
moved). The front ends are in :mod:`tape.frontend.ops.scan`.

``cumsum``, ``cumprod``, ``logcumsumexp`` attribute block: ``[outer, n, inner]``; the output
has the input's layout. ``cumprod``'s rules divide by nothing, so they are exact when elements are zero: with
``y`` the output, ``dL/dx_j = y_{j-1} S_j`` where ``S_j = gy_j + x_{j+1} S_{j+1}`` runs
backwards along the row (``y_{-1} = 1``).

``argsort`` attribute block: ``[outer, n, inner, descending]``; output element ``(o, k, q)`` is
the position along the axis of the ``k``-th smallest (``descending``: largest) element of row
``(o, q)``. The order is stable (ties keep their order, NumPy's ``kind="stable"``); NaN sorts
after every number ascending and before every number descending (as NumPy and PyTorch).

``argmax``, ``argmin`` attribute block: ``[outer, n, inner]``; output element ``(o, q)`` is the
first position of the row's maximum (minimum), or of its first NaN (NumPy's rule).

The index ops have no differentiable input and write integer positions into the float arena
(exact below ``2**24`` in float32, ``2**53`` in float64); ``take`` reads them back as indices.
"""

import numpy as np
from numba import njit

from tape.layout.calls import compiled_only
from tape.layout.columns import B_OFF, E_ATTR, E_IN0, E_OUT
from tape.layout.config import UNCACHED_JIT
from tape.ops import registry, validate
from tape.ops.blocks import scan as sc
from tape.ops.loops import active, view

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)
# the entry kernels that take an op's element loops as an argument: inlined in Numba IR, so the
# loops are constants of each op's kernel (as tape.ops.loops does with rules)
_lanes = njit(inline="always", **UNCACHED_JIT)


@_jit
def _block(ipool, p):
    return ipool[p + sc.OUTER], ipool[p + sc.N], ipool[p + sc.INNER]


@_jit
def _row(a, o, q, n, inner):
    """Row ``(o, q)`` of ``a`` viewed as ``(outer, n, inner)``: a strided view of ``n``."""
    b = o * n * inner + q
    return a[b : b + (n - 1) * inner + 1 : inner]


# ---------------------------------------------------------------- cumsum, cumprod
# Their element loops are written once for both targets (the ops' ``lanes``): element ``j`` of
# lane ``k`` is at ``a[x + j * s + k]``, for ``w`` lanes (adjacent rows of the inner axis).
# The CPU kernels pass the ``inner`` rows of one outer index at a time (the lane loop runs
# over contiguous memory and vectorises; ``w = 1`` walks one row in a register); the GPU runs
# one row per thread (``w = 1``, offsets in its own arena layout). ``g`` is the adjoint arena
# (the data arena's twin on the CPU, the same arena on the GPU) and ``acc`` a scratch of ``w``
# elements (the adjoint dtype on the CPU, float64 on the GPU).


@_jit
def cumsum_lanes(a, x, y, s, n, w):
    """``y_j = x_0 + ... + x_j`` along each lane, summed in order."""
    if w == 1:
        acc = a[x]  # not 0.0 + x: keeps a leading -0.0, as NumPy does
        a[y] = acc
        for j in range(1, n):
            acc += a[x + j * s]
            a[y + j * s] = acc
        return
    for k in range(w):
        a[y + k] = a[x + k]
    for j in range(1, n):
        ys = a[y + j * s : y + j * s + w]
        yp = a[y + (j - 1) * s : y + (j - 1) * s + w]
        xs = a[x + j * s : x + j * s + w]
        for k in range(w):
            ys[k] = yp[k] + xs[k]


@_jit
def cumsum_rev_lanes(a, g, x, y, gx, gy, s, n, w, acc):
    """``dL/dx_j = sum_{k >= j} gy_k``: a cumulative sum backwards."""
    for k in range(w):
        acc[k] = 0.0
    if w == 1:
        t = acc[0]
        for j in range(n - 1, -1, -1):
            t += g[gy + j * s]
            g[gx + j * s] += t
        return
    for j in range(n - 1, -1, -1):
        gys = g[gy + j * s : gy + j * s + w]
        gxs = g[gx + j * s : gx + j * s + w]
        for k in range(w):
            acc[k] += gys[k]
            gxs[k] += acc[k]


@_jit
def cumprod_lanes(a, x, y, s, n, w):
    """``y_j = x_0 * ... * x_j`` along each lane, multiplied in order."""
    if w == 1:
        acc = a[x]
        a[y] = acc
        for j in range(1, n):
            acc *= a[x + j * s]
            a[y + j * s] = acc
        return
    for k in range(w):
        a[y + k] = a[x + k]
    for j in range(1, n):
        ys = a[y + j * s : y + j * s + w]
        yp = a[y + (j - 1) * s : y + (j - 1) * s + w]
        xs = a[x + j * s : x + j * s + w]
        for k in range(w):
            ys[k] = yp[k] * xs[k]


@_jit
def cumprod_rev_lanes(a, g, x, y, gx, gy, s, n, w, acc):
    """``dL/dx_j = y_{j-1} S_j`` with ``S_j = gy_j + x_{j+1} S_{j+1}``: no division, exact
    with zeros; each lane walked on its own (the recursion runs along the lane)."""
    for k in range(w):
        t = g[gy + (n - 1) * s + k]
        for j in range(n - 1, -1, -1):
            e = j * s + k
            if j < n - 1:
                t = g[gy + e] + a[x + e + s] * t
            if j > 0:
                g[gx + e] += a[y + e - s] * t
            else:
                g[gx + e] += t


@_lanes
def lanes_fwd(f, i, entries, bufs, ipool, data):
    """The CPU entry kernel of an op with element loops ``f`` (its record's ``lanes``): the
    ``inner`` rows of each outer index as ``inner`` lanes."""
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        return -1
    x = bufs[entries[i, E_IN0], B_OFF]
    y = bufs[entries[i, E_OUT], B_OFF]
    m = n * inner
    for o in range(outer):
        f(data, x + o * m, y + o * m, inner, n, inner)
    return -1


@_lanes
def lanes_rev(f, i, entries, bufs, ipool, data, grad):
    """The CPU reverse kernel of an op with element loops ``f``: adds to the input's adjoint."""
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        return
    x = bufs[a, B_OFF]
    y = bufs[entries[i, E_OUT], B_OFF]
    acc = np.empty(inner, grad.dtype)
    m = n * inner
    for o in range(outer):
        f(data, grad, x + o * m, y + o * m, x + o * m, y + o * m, inner, n, inner, acc)


@_lanes
def rows_jvp(f, i, entries, bufs, ipool, data, T):
    """The tangent kernel of a scan whose tangent rule ``f(xs, ys, txs, tys, n)`` runs along
    one row (strided views of ``n`` elements), for every row and direction."""
    a = entries[i, E_IN0]
    o_ = entries[i, E_OUT]
    x = view(bufs, data, a)
    y = view(bufs, data, o_)
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        return
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], a)
        ty = view(bufs, T[d], o_)
        for o in range(outer):
            for q in range(inner):
                f(_row(x, o, q, n, inner), _row(y, o, q, n, inner), _row(tx, o, q, n, inner),
                  _row(ty, o, q, n, inner), n)  # fmt: skip


@_lanes
def rows_hvp(f, i, entries, bufs, ipool, data, grad, T, GT):
    """The forward-over-reverse kernel of a scan whose rule
    ``f(xs, ys, gys, txs, gtxs, gtys, ty, n)`` adds one row's tangent adjoints into ``gtxs``
    (``ty``: a scratch row of ``n``), for every row and direction."""
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    o_ = entries[i, E_OUT]
    x = view(bufs, data, a)
    y = view(bufs, data, o_)
    gy = view(bufs, grad, o_)
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        return
    ty = np.empty(n, T.dtype)
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], a)
        gtx = view(bufs, GT[d], a)
        gty = view(bufs, GT[d], o_)
        for o in range(outer):
            for q in range(inner):
                f(_row(x, o, q, n, inner), _row(y, o, q, n, inner), _row(gy, o, q, n, inner),
                  _row(tx, o, q, n, inner), _row(gtx, o, q, n, inner), _row(gty, o, q, n, inner),
                  ty, n)  # fmt: skip


@_jit
def cumsum_fwd(i, entries, bufs, ipool, data):
    return lanes_fwd(cumsum_lanes, i, entries, bufs, ipool, data)


@_jit
def cumsum_rev(i, entries, bufs, ipool, data, grad):
    lanes_rev(cumsum_rev_lanes, i, entries, bufs, ipool, data, grad)


@_jit
def cumprod_fwd(i, entries, bufs, ipool, data):
    return lanes_fwd(cumprod_lanes, i, entries, bufs, ipool, data)


@_jit
def cumprod_rev(i, entries, bufs, ipool, data, grad):
    lanes_rev(cumprod_rev_lanes, i, entries, bufs, ipool, data, grad)


# ---------------------------------------------------------------- logcumsumexp


@_jit
def logcumsumexp_lanes(a, x, y, s, n, w):
    """``y_j = log(exp(x_0) + ... + exp(x_j))``, as ``y_j = logaddexp(y_{j-1}, x_j)`` in
    order: no overflow, NumPy's ``np.logaddexp.accumulate``."""
    if w == 1:
        acc = a[x]
        a[y] = acc
        for j in range(1, n):
            acc = np.logaddexp(acc, a[x + j * s])
            a[y + j * s] = acc
        return
    for k in range(w):
        a[y + k] = a[x + k]
    for j in range(1, n):
        ys = a[y + j * s : y + j * s + w]
        yp = a[y + (j - 1) * s : y + (j - 1) * s + w]
        xs = a[x + j * s : x + j * s + w]
        for k in range(w):
            ys[k] = np.logaddexp(yp[k], xs[k])


@_jit
def logcumsumexp_rev_lanes(a, g, x, y, gx, gy, s, n, w, acc):
    """``dL/dx_j = sum_{k >= j} gy_k exp(x_j - y_k) = exp(x_j - y_j) R_j`` with
    ``R_j = gy_j + exp(y_j - y_{j+1}) R_{j+1}``: every exponential is of a number <= 0, so
    nothing overflows. NaN where a row starts with -inf (as ``logaddexp``'s rule: the
    derivative is not defined there)."""
    for k in range(w):
        t = g[gy + (n - 1) * s + k]
        for j in range(n - 1, -1, -1):
            e = j * s + k
            if j < n - 1:
                t = g[gy + e] + np.exp(a[y + e] - a[y + e + s]) * t
            g[gx + e] += np.exp(a[x + e] - a[y + e]) * t


@_jit
def logcumsumexp_fwd(i, entries, bufs, ipool, data):
    return lanes_fwd(logcumsumexp_lanes, i, entries, bufs, ipool, data)


@_jit
def logcumsumexp_rev(i, entries, bufs, ipool, data, grad):
    lanes_rev(logcumsumexp_rev_lanes, i, entries, bufs, ipool, data, grad)


@_jit
def _lcse_tangent_row(xs, ys, txs, tys, n):
    # ty_j = sum_{k <= j} exp(x_k - y_j) tx_k = exp(y_{j-1} - y_j) ty_{j-1} + exp(x_j - y_j) tx_j
    acc = np.exp(xs[0] - ys[0]) * txs[0]
    tys[0] = acc
    for j in range(1, n):
        acc = np.exp(ys[j - 1] - ys[j]) * acc + np.exp(xs[j] - ys[j]) * txs[j]
        tys[j] = acc


@_jit
def _lcse_hvp_row(xs, ys, gys, txs, gtxs, gtys, ty, n):
    # the tangent of gx_j = E_j R_j (E_j = exp(x_j - y_j), F_j = exp(y_j - y_{j+1})):
    # tE_j = E_j (tx_j - ty_j), tF_j = F_j (ty_j - ty_{j+1}), tR_j = gty_j + tF_j R_{j+1} +
    # F_j tR_{j+1}; ty recomputed by the tangent rule
    _lcse_tangent_row(xs, ys, txs, ty, n)
    r = gys[n - 1]
    tr = gtys[n - 1]
    for j in range(n - 1, -1, -1):
        if j < n - 1:
            f = np.exp(ys[j] - ys[j + 1])
            tr = gtys[j] + f * (ty[j] - ty[j + 1]) * r + f * tr
            r = gys[j] + f * r
        e = np.exp(xs[j] - ys[j])
        gtxs[j] += e * (txs[j] - ty[j]) * r + e * tr


@_jit
def logcumsumexp_jvp(i, entries, bufs, ipool, data, T):
    rows_jvp(_lcse_tangent_row, i, entries, bufs, ipool, data, T)


@_jit
def logcumsumexp_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    rows_hvp(_lcse_hvp_row, i, entries, bufs, ipool, data, grad, T, GT)


EXACT_ROW = 64
"""Rows up to this length take ``cumprod``'s tangent in the reverse rule's association."""


@_jit
def _cumprod_tangent_row(xs, ys, txs, tys, n):
    if n <= EXACT_ROW:
        # d y_j / d x_i = y_{i-1} (x_{i+1} (... x_j)), multiplied in the order the reverse
        # rule's S recursion multiplies it, so that forward and reverse Jacobians (one-hot
        # directions and adjoints) agree to the bit; O(n^2), hence short rows only
        for j in range(n):
            acc = 0.0 * txs[0]
            suf = 1.0 + 0.0 * xs[0]
            for k in range(j, -1, -1):
                if k < j:
                    suf = xs[k + 1] * suf
                t = txs[k]
                if t != 0.0:  # a zero tangent contributes exactly zero (no 0 * inf)
                    if k > 0:
                        acc += ys[k - 1] * suf * t
                    else:
                        acc += suf * t
            tys[j] = acc
        return
    # ty_j = ty_{j-1} x_j + y_{j-1} tx_j: the product rule, step by step (exact with zeros;
    # the same values as above up to rounding)
    tys[0] = txs[0]
    for j in range(1, n):
        tys[j] = tys[j - 1] * xs[j] + ys[j - 1] * txs[j]


@_jit
def _cumprod_hvp_row(xs, ys, gys, txs, gtxs, gtys, ty, n):
    # the tangent of gx_j = y_{j-1} S_j: ty_{j-1} S_j + y_{j-1} tS_j, with
    # tS_j = gty_j + tx_{j+1} S_{j+1} + x_{j+1} tS_{j+1} (ty recomputed: no division)
    ty[0] = txs[0]
    for j in range(1, n):
        ty[j] = ty[j - 1] * xs[j] + ys[j - 1] * txs[j]
    s = gys[n - 1]
    ts = gtys[n - 1]
    for j in range(n - 1, -1, -1):
        if j < n - 1:
            ts = gtys[j] + txs[j + 1] * s + xs[j + 1] * ts
            s = gys[j] + xs[j + 1] * s
        if j > 0:
            gtxs[j] += ty[j - 1] * s + ys[j - 1] * ts
        else:
            gtxs[j] += ts


@_jit
def cumprod_jvp(i, entries, bufs, ipool, data, T):
    rows_jvp(_cumprod_tangent_row, i, entries, bufs, ipool, data, T)


@_jit
def cumprod_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    rows_hvp(_cumprod_hvp_row, i, entries, bufs, ipool, data, grad, T, GT)


# ---------------------------------------------------------------- argsort


@_jit
def before(a, b, descending):
    """Whether ``a`` sorts strictly before ``b``: NaN after every number ascending, before
    every number descending; equal values (and two NaNs) are tied."""
    if descending:
        return a > b or (a != a and b == b)
    return a < b or (a == a and b != b)


@_jit
def _merge_sort(keys, descending, idx, tmp):
    """Stable argsort of ``keys`` (bottom-up merge sort); returns the array holding it
    (``idx`` or ``tmp``)."""
    n = keys.shape[0]
    for j in range(n):
        idx[j] = j
    src = idx
    dst = tmp
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            a = lo
            b = mid
            k = lo
            while a < mid and b < hi:
                # the right run wins only when strictly before: ties keep their order
                if before(keys[src[b]], keys[src[a]], descending):
                    dst[k] = src[b]
                    b += 1
                else:
                    dst[k] = src[a]
                    a += 1
                k += 1
            while a < mid:
                dst[k] = src[a]
                a += 1
                k += 1
            while b < hi:
                dst[k] = src[b]
                b += 1
                k += 1
        src, dst = dst, src
        width *= 2
    return src


@_jit
def argsort_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    outer, n, inner = _block(ipool, p)
    descending = ipool[p + sc.DESCENDING] != 0
    if n == 0:
        return -1
    keys = np.empty(n, data.dtype)
    idx = np.empty(n, np.int64)
    tmp = np.empty(n, np.int64)
    for o in range(outer):
        for q in range(inner):
            row = _row(x, o, q, n, inner)
            for k in range(n):
                keys[k] = row[k]
            perm = _merge_sort(keys, descending, idx, tmp)
            ys = _row(y, o, q, n, inner)
            for k in range(n):
                ys[k] = perm[k]
    return -1


# ---------------------------------------------------------------- argmax, argmin


@_jit
def _arg_extreme(is_max, i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    y = view(bufs, data, entries[i, E_OUT])
    outer, n, inner = _block(ipool, entries[i, E_ATTR])
    if n == 0:
        return -1
    for o in range(outer):
        for q in range(inner):
            xs = _row(x, o, q, n, inner)
            best = xs[0]
            at = 0
            if best == best:
                for j in range(1, n):
                    v = xs[j]
                    if v != v:  # the first NaN wins, as in NumPy
                        at = j
                        break
                    if (is_max and v > best) or (not is_max and v < best):
                        best = v
                        at = j
            y[o * inner + q] = at
    return -1


@_jit
def argmax_fwd(i, entries, bufs, ipool, data):
    return _arg_extreme(True, i, entries, bufs, ipool, data)


@_jit
def argmin_fwd(i, entries, bufs, ipool, data):
    return _arg_extreme(False, i, entries, bufs, ipool, data)


# ---------------------------------------------------------------- sparsity


def _blocks(t, i):
    return sc.decode(t.ipool, int(t.entries[i, E_ATTR]))


def _scan_sparsity(nonlinear):
    """Output ``j`` of a row depends on the row's inputs ``0..j``: a dense lower triangle per
    row, given as ``ceil(log2 n)`` factors ``I + shift by 2**k`` along the axis (whose boolean
    product reaches every shift ``0..n-1``), linear in the size where the pairs would be
    quadratic. ``cumprod``: every two elements of a row interact (group: the row)."""

    def sparsity(t, i, data):
        outer, n, inner = _blocks(t, i)
        size = outer * n * inner
        e = np.arange(size)
        j = (e // max(inner, 1)) % max(n, 1)
        factors = []
        s = 1
        while s < n:
            keep = e[j >= s]
            rows = np.concatenate([e, keep])
            cols = np.concatenate([e, keep - s * inner])
            factors.append((rows, cols, (size, size)))
            s *= 2
        if not factors:
            factors.append((e, e, (size, size)))
        pairs = []
        if nonlinear:
            group = (e // max(n * inner, 1)) * inner + e % max(inner, 1)
            pairs.append((0, group, e, 0, group, e))
        return [(0, tuple(factors))], pairs

    sparsity.__doc__ = _scan_sparsity.__doc__
    return sparsity


# ---------------------------------------------------------------- validation


def _check_rows(t, i, e, n_flags, out_size):
    """The block's ``outer, n, inner`` (and ``n_flags`` flags after them): the input holds
    exactly ``outer * n * inner`` elements, the output ``out_size(outer, n, inner)``."""
    x, y = e[E_IN0], e[E_OUT]
    ints = validate.block(
        t, i, 0, sc.SIZE + n_flags, "outer, n and inner" + " and a flag" * n_flags
    )
    outer, n, inner = ints[:3]
    validate.dims(t, i, [outer, n, inner], "the (outer, n, inner) view")
    for flag in ints[3:]:
        if flag not in (0, 1):
            validate.fail(t, i, f"flag {flag} in the attribute block, expected 0 or 1")
    validate.equal_sizes(
        t, i, "input 0", x, outer * n * inner, f"it is read as {outer} x {n} x {inner}"
    )  # fmt: skip
    validate.equal_sizes(t, i, "the output", y, out_size(outer, n, inner), "the block's shape")
    return outer, n, inner


def check_scan(t, i, e):
    """Validation of a ``cumsum`` / ``cumprod`` entry: input and output are both read as
    ``(outer, n, inner)``."""
    _check_rows(t, i, e, 0, lambda o, n, q: o * n * q)


def check_argsort(t, i, e):
    """Validation of an ``argsort`` entry: as a scan, plus the ``descending`` flag."""
    _check_rows(t, i, e, 1, lambda o, n, q: o * n * q)


def check_arg_extreme(t, i, e):
    """Validation of an ``argmax`` / ``argmin`` entry: one output per row ``(o, q)``; a row
    must not be empty (its position would be no index at all)."""
    outer, n, inner = _check_rows(t, i, e, 0, lambda o, n, q: o * q)
    if n == 0 and outer * inner:
        validate.fail(t, i, f"takes the position of an extreme of {outer * inner} empty rows")


LINEAR = registry.LINEAR
CUMSUM = registry.structural(
    "cumsum", cumsum_fwd, cumsum_rev, module=__name__, n_inputs=1, differentiable=(True,),
    check=check_scan, lanes=(cumsum_lanes, cumsum_rev_lanes), method=True, jvp=LINEAR,
    hvp=LINEAR, sparsity=_scan_sparsity(False),
    may_stop=False,
)  # fmt: skip
CUMPROD = registry.structural(
    "cumprod", cumprod_fwd, cumprod_rev, module=__name__, n_inputs=1, differentiable=(True,),
    check=check_scan, lanes=(cumprod_lanes, cumprod_rev_lanes), method=True, jvp=cumprod_jvp,
    hvp=cumprod_hvp,
    sparsity=_scan_sparsity(True),
    may_stop=False,
)  # fmt: skip
LOGCUMSUMEXP = registry.structural(
    "logcumsumexp", logcumsumexp_fwd, logcumsumexp_rev, module=__name__, n_inputs=1,
    differentiable=(True,), check=check_scan, dtype="float", method=True,
    lanes=(logcumsumexp_lanes, logcumsumexp_rev_lanes), jvp=logcumsumexp_jvp,
    hvp=logcumsumexp_hvp, sparsity=_scan_sparsity(True), may_stop=False,
)  # fmt: skip
ARGSORT = registry.structural(
    "argsort", argsort_fwd, None, module=__name__, n_inputs=1, differentiable=(False,),
    check=check_argsort, gpu="argsort",
    may_stop=False,
)  # fmt: skip
ARGMAX = registry.structural(
    "argmax", argmax_fwd, None, module=__name__, n_inputs=1, differentiable=(False,),
    check=check_arg_extreme, gpu="argmax",
    may_stop=False,
)  # fmt: skip
ARGMIN = registry.structural(
    "argmin", argmin_fwd, None, module=__name__, n_inputs=1, differentiable=(False,),
    check=check_arg_extreme, gpu="argmin",
    may_stop=False,
)  # fmt: skip
