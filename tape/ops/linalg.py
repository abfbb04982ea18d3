"""Linear algebra: batched matrix product through BLAS.

``matmul_nt`` (registered in :mod:`tape.ops.nn`) is the same product with ``B[b]`` held
transposed, as ``n x k`` (``x W^T`` for a weight ``W`` of shape ``(out, in)``, without copying
``W.T``): the kernels below take the flag ``tb`` and hand it to BLAS.

``matmul`` attribute block (:mod:`tape.ops.blocks.matmul`): ``[batch, m, k, n, stride_a,
stride_b]``: output matrix ``b`` is ``A[b] @ B[b]`` with ``A[b]`` starting at ``b * stride_a``
(``0``: one matrix shared by the whole batch, whose adjoint then sums over the batch). One- and two-dimensional operands are reshaped
to this form by the front end, :mod:`tape.frontend.ops.linalg` (reshapes are free aliases).
"""

import numpy as np

from tape.layout.calls import compiled_only
from tape.layout.columns import B_OFF, B_SIZE, E_ATTR, E_IN0, E_IN1, E_OUT
from tape.ops import registry, validate
from tape.ops.blas import gemm_acc
from tape.ops.blocks import matmul as mm
from tape.ops.loops import active, add2, mat, put2, view

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)


@_jit
def _fwd(tb, i, entries, bufs, ipool, data):
    A = view(bufs, data, entries[i, E_IN0])
    B = view(bufs, data, entries[i, E_IN1])
    Y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, m, k, n, sa, sb = _block(ipool, p)
    if m * n == 0:
        return -1
    for b in range(nb):
        y = mat(Y, b * m * n, m, n)
        if k == 0:
            y[:] = 0.0
            continue
        a = mat(A, b * sa, m, k)
        bb = mat(B, b * sb, n, k) if tb else mat(B, b * sb, k, n)
        gemm_acc(a, False, bb, tb, y, 0.0)  # (np.dot costs the kernel a second of compile)
    return -1


@_jit
def matmul_fwd(i, entries, bufs, ipool, data):
    return _fwd(False, i, entries, bufs, ipool, data)


@_jit
def matmul_nt_fwd(i, entries, bufs, ipool, data):
    return _fwd(True, i, entries, bufs, ipool, data)


@_jit
def _rev(tb, i, entries, bufs, ipool, data, grad):
    ia = entries[i, E_IN0]
    ib = entries[i, E_IN1]
    act_a = active(bufs, ia)
    act_b = active(bufs, ib)
    A = view(bufs, data, ia)
    B = view(bufs, data, ib)
    gA = view(bufs, grad, ia)
    gB = view(bufs, grad, ib)
    gY = view(bufs, grad, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    nb, m, k, n, sa, sb = _block(ipool, p)
    if m * n * k == 0:
        return
    for b in range(nb):
        gy = mat(gY, b * m * n, m, n)
        a = mat(A, b * sa, m, k)
        # added into the adjoints by BLAS itself (beta = 1): no temporary, no second pass
        if tb:  # B held as n x k: gA += gY B, gB += gY^T A
            if act_a:
                gemm_acc(gy, False, mat(B, b * sb, n, k), False, mat(gA, b * sa, m, k))
            if act_b:
                gemm_acc(gy, True, a, False, mat(gB, b * sb, n, k))
        else:
            if act_a:
                gemm_acc(gy, False, mat(B, b * sb, k, n), True, mat(gA, b * sa, m, k))
            if act_b:
                gemm_acc(a, True, gy, False, mat(gB, b * sb, k, n))


@_jit
def matmul_rev(i, entries, bufs, ipool, data, grad):
    _rev(False, i, entries, bufs, ipool, data, grad)


@_jit
def matmul_nt_rev(i, entries, bufs, ipool, data, grad):
    _rev(True, i, entries, bufs, ipool, data, grad)


@_jit
def _jvp(tb, i, entries, bufs, ipool, data, T):
    # tY = tA @ op(B) + A @ op(tB) for every direction (row of T) at once (op(B): B, or B^T
    # for matmul_nt): the directions' tA are stacked into one tall matrix and their op(tB)
    # side by side, so each term is one product (through gemm_acc: np.dot costs each kernel
    # seconds of compile)
    ia = entries[i, E_IN0]
    ib = entries[i, E_IN1]
    io = entries[i, E_OUT]
    act_a = active(bufs, ia)
    act_b = active(bufs, ib)
    A = view(bufs, data, ia)
    B = view(bufs, data, ib)
    nb, m, k, n, sa, sb = _block(ipool, entries[i, E_ATTR])
    K = T.shape[0]
    oa, ob, oy = bufs[ia, B_OFF], bufs[ib, B_OFF], bufs[io, B_OFF]
    if m * n * k == 0 or not (act_a or act_b):
        for d in range(K):
            T[d, oy : oy + nb * m * n] = 0.0
        return
    for b in range(nb):
        a = mat(A, b * sa, m, k)
        bb = mat(B, b * sb, n, k) if tb else mat(B, b * sb, k, n)
        py = oy + b * m * n
        if K == 1:  # one direction: the products go into the tangent arena, no copies; the
            # first assigns it (beta = 0: its old values are not read), the second adds
            y = mat(T[0], py, m, n)
            beta = 0.0
            if act_a:
                gemm_acc(mat(T[0], oa + b * sa, m, k), False, bb, tb, y, beta)
                beta = 1.0
            if act_b:
                tB = mat(T[0], ob + b * sb, n, k) if tb else mat(T[0], ob + b * sb, k, n)
                gemm_acc(a, False, tB, tb, y, beta)
            continue
        # only the directions whose tangent of the operand is not all zero (a Hessian's or a
        # Jacobian's seeds are columns of the identity: most of them miss most operands); the
        # first term assigns the output's tangent (zero for the directions it skips), the
        # second adds to it
        if act_a:
            ds = _nonzero_rows(T, oa + b * sa, m * k)
            J = ds.shape[0]
            tA = np.empty((J * m, k), T.dtype)
            for j in range(J):
                put2(tA[j * m : (j + 1) * m], mat(T[ds[j]], oa + b * sa, m, k))
            y1 = np.empty((J * m, n), T.dtype)
            if J:  # (BLAS refuses empty matrices)
                gemm_acc(tA, False, bb, tb, y1, 0.0)
            _first_term(T, ds, py, m, n, y1, True)
        if act_b:
            ds = _nonzero_rows(T, ob + b * sb, k * n)
            J = ds.shape[0]
            tB = np.empty((k, J * n), T.dtype)
            for j in range(J):
                if tb:
                    put2(tB[:, j * n : (j + 1) * n], mat(T[ds[j]], ob + b * sb, n, k).T)
                else:
                    put2(tB[:, j * n : (j + 1) * n], mat(T[ds[j]], ob + b * sb, k, n))
            y2 = np.empty((m, J * n), T.dtype)
            if J:
                gemm_acc(a, False, tB, False, y2, 0.0)
            if act_a:  # the second term
                for j in range(J):
                    add2(mat(T[ds[j]], py, m, n), y2[:, j * n : (j + 1) * n])
            else:
                _first_term(T, ds, py, m, n, y2, False)


@_jit
def _first_term(T, ds, py, m, n, Y, stacked):
    """The first term of :func:`_jvp`'s product tangents into the output's tangents at ``py``
    (``m x n`` per direction): assigned for the directions ``ds`` (ascending) from their
    blocks of ``Y`` (stacked by rows, or side by side), zero for the others."""
    j = 0
    for d in range(T.shape[0]):
        if j < ds.shape[0] and ds[j] == d:
            y = mat(T[d], py, m, n)
            if stacked:
                put2(y, Y[j * m : (j + 1) * m])
            else:
                put2(y, Y[:, j * n : (j + 1) * n])
            j += 1
        else:
            T[d, py : py + m * n] = 0.0


@_jit
def _nonzero_rows(T, off, size):
    """The rows ``d`` of ``T`` (directions) with a nonzero element in ``T[d, off : off + size]``."""
    out = np.empty(T.shape[0], np.int64)
    J = 0
    for d in range(T.shape[0]):
        for q in range(off, off + size):
            if T[d, q] != 0.0:
                out[J] = d
                J += 1
                break
    return out[:J]


@_jit
def matmul_jvp(i, entries, bufs, ipool, data, T):
    _jvp(False, i, entries, bufs, ipool, data, T)


@_jit
def matmul_nt_jvp(i, entries, bufs, ipool, data, T):
    _jvp(True, i, entries, bufs, ipool, data, T)


@_jit
def _hvp(tb, i, entries, bufs, ipool, data, grad, T, GT):
    # the tangent of gA += gY op(B)^T and g op(B) += A^T gY (op(B) = B^T for matmul_nt, whose
    # gB is then the transpose), for every direction (row of T / GT) at once: the directions'
    # matrices are stacked so that each term is one product
    ia = entries[i, E_IN0]
    ib = entries[i, E_IN1]
    io = entries[i, E_OUT]
    act_a = active(bufs, ia)
    act_b = active(bufs, ib)
    A = view(bufs, data, ia)
    B = view(bufs, data, ib)
    gY = view(bufs, grad, io)
    nb, m, k, n, sa, sb = _block(ipool, entries[i, E_ATTR])
    if m * n * k == 0:
        return
    K = T.shape[0]
    oa, ob, oy = bufs[ia, B_OFF], bufs[ib, B_OFF], bufs[io, B_OFF]
    for b in range(nb):
        pa, pb, py = oa + b * sa, ob + b * sb, oy + b * m * n
        gy = mat(gY, b * m * n, m, n)
        a = mat(A, b * sa, m, k)
        bb = mat(B, b * sb, n, k) if tb else mat(B, b * sb, k, n)
        if K == 1:  # one direction (a Hessian-vector product): products added in place
            _hvp_one(tb, act_a, act_b, a, bb, gy, T[0], GT[0], pa, pb, py, m, k, n)
            continue
        # each term over the directions whose tangent factor is not all zero (see _jvp):
        # those with a nonzero gt_Y for the terms in gt_Y, a nonzero tangent of the other
        # operand for the others
        dy = _nonzero_rows(GT, py, m * n)
        Jy = dy.shape[0]
        gty = np.empty((Jy * m, n), T.dtype)  # the directions' gt_Y, stacked
        gty_cols = np.empty((m, Jy * n), T.dtype)  # ... side by side
        for j in range(Jy):
            g = mat(GT[dy[j]], py, m, n)
            put2(gty[j * m : (j + 1) * m], g)
            put2(gty_cols[:, j * n : (j + 1) * n], g)
        if act_a:
            ga1 = np.empty((Jy * m, k), T.dtype)
            if Jy:  # (BLAS refuses empty matrices)
                gemm_acc(gty, False, bb, not tb, ga1, 0.0)
            for j in range(Jy):
                add2(mat(GT[dy[j]], pa, m, k), ga1[j * m : (j + 1) * m])
            if act_b:
                db = _nonzero_rows(T, pb, k * n)
                Jb = db.shape[0]
                tbt = np.empty((n, Jb * k), T.dtype)  # op(tB)^T side by side
                for j in range(Jb):
                    if tb:
                        put2(tbt[:, j * k : (j + 1) * k], mat(T[db[j]], pb, n, k))
                    else:
                        put2(tbt[:, j * k : (j + 1) * k], mat(T[db[j]], pb, k, n).T)
                ga2 = np.empty((m, Jb * k), T.dtype)
                if Jb:
                    gemm_acc(gy, False, tbt, False, ga2, 0.0)
                for j in range(Jb):
                    add2(mat(GT[db[j]], pa, m, k), ga2[:, j * k : (j + 1) * k])
        if act_b:
            da = _nonzero_rows(T, pa, m * k) if act_a else dy[:0]
            Ja = da.shape[0]
            if tb:
                # gB (n x k) gets gt_Y^T A + gY^T tA
                gb1 = np.empty((Jy * n, k), T.dtype)
                if Jy:
                    gemm_acc(gty_cols, True, a, False, gb1, 0.0)
                for j in range(Jy):
                    add2(mat(GT[dy[j]], pb, n, k), gb1[j * n : (j + 1) * n])
                if Ja:
                    ta = np.empty((m, Ja * k), T.dtype)
                    for j in range(Ja):
                        put2(ta[:, j * k : (j + 1) * k], mat(T[da[j]], pa, m, k))
                    gb2 = np.empty((n, Ja * k), T.dtype)
                    gemm_acc(gy, True, ta, False, gb2, 0.0)
                    for j in range(Ja):
                        add2(mat(GT[da[j]], pb, n, k), gb2[:, j * k : (j + 1) * k])
            else:
                gb1 = np.empty((k, Jy * n), T.dtype)
                if Jy:
                    gemm_acc(a, True, gty_cols, False, gb1, 0.0)
                for j in range(Jy):
                    add2(mat(GT[dy[j]], pb, k, n), gb1[:, j * n : (j + 1) * n])
                if Ja:
                    tat = np.empty((Ja * k, m), T.dtype)
                    for j in range(Ja):
                        put2(tat[j * k : (j + 1) * k], mat(T[da[j]], pa, m, k).T)
                    gb2 = np.empty((Ja * k, n), T.dtype)
                    gemm_acc(tat, False, gy, False, gb2, 0.0)
                    for j in range(Ja):
                        add2(mat(GT[da[j]], pb, k, n), gb2[j * k : (j + 1) * k])


@_jit
def _hvp_one(tb, act_a, act_b, a, bb, gy, t, gt, pa, pb, py, m, k, n):
    # one direction of _hvp, each term one product added into the tangent adjoints (BLAS,
    # beta = 1): gt_A += gt_Y op(B)^T + gY op(tB)^T; gt_B += A^T gt_Y + tA^T gY (matmul_nt:
    # gt_B += gt_Y^T A + gY^T tA)
    gty = mat(gt, py, m, n)
    if act_a:
        ga = mat(gt, pa, m, k)
        gemm_acc(gty, False, bb, not tb, ga)
        if act_b:
            if tb:
                gemm_acc(gy, False, mat(t, pb, n, k), False, ga)
            else:
                gemm_acc(gy, False, mat(t, pb, k, n), True, ga)
    if act_b:
        if tb:
            gb = mat(gt, pb, n, k)
            gemm_acc(gty, True, a, False, gb)
            if act_a:
                gemm_acc(gy, True, mat(t, pa, m, k), False, gb)
        else:
            gb = mat(gt, pb, k, n)
            gemm_acc(a, True, gty, False, gb)
            if act_a:
                gemm_acc(mat(t, pa, m, k), True, gy, False, gb)


@_jit
def matmul_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    _hvp(False, i, entries, bufs, ipool, data, grad, T, GT)


@_jit
def matmul_nt_hvp(i, entries, bufs, ipool, data, grad, T, GT):
    _hvp(True, i, entries, bufs, ipool, data, grad, T, GT)


@_jit
def _block(ipool, p):
    return (
        ipool[p + mm.BATCH], ipool[p + mm.M], ipool[p + mm.K], ipool[p + mm.N],
        ipool[p + mm.STRIDE_A], ipool[p + mm.STRIDE_B],
    )  # fmt: skip


def _sparsity(tb):
    """The sparsity rule of ``matmul`` (``tb`` False) or ``matmul_nt`` (``B[b]`` held as
    ``n x k``)."""

    def sparsity(t, i, data):
        nb, m, k, n, sa, sb = mm.decode(t.ipool, int(t.entries[i, E_ATTR]))
        size_a = int(t.bufs[t.entries[i, E_IN0], B_SIZE])
        size_b = int(t.bufs[t.entries[i, E_IN1], B_SIZE])

        def ones(rows, cols, shape):  # a 0/1 factor, as tape.sparse takes it
            return rows.ravel(), cols.ravel(), shape

        b, r, j = np.meshgrid(np.arange(nb), np.arange(m), np.arange(k), indexing="ij")
        rows_a = ones(b * m + r, b * sa + r * k + j, (nb * m, size_a))  # (b, r) <- A[b][r, :]
        b2, j2, c2 = np.meshgrid(np.arange(nb), np.arange(k), np.arange(n), indexing="ij")
        eb = b2 * sb + (c2 * k + j2 if tb else j2 * n + c2)  # where B[b][j, c] is held
        cols_b = ones(b2 * n + c2, eb, (nb * n, size_b))  # (b, c) <- B[b][:, c]
        bo, ro, co = np.meshgrid(np.arange(nb), np.arange(m), np.arange(n), indexing="ij")
        out = (bo * m + ro) * n + co
        spread_a = ones(out, bo * m + ro, (nb * m * n, nb * m))
        spread_b = ones(out, bo * n + co, (nb * m * n, nb * n))
        deps = [(0, (spread_a, rows_a)), (1, (spread_b, cols_b))]
        ea = (b * sa + r * k + j).ravel()
        return deps, [(0, (b * k + j).ravel(), ea, 1, (b2 * k + j2).ravel(), eb.ravel())]

    sparsity.__doc__ = """Output ``(b, r, c)`` depends on row ``r`` of ``A[b]`` and column ``c`` of
    ``op(B[b])``, given as two factors each (rows, then their broadcast): linear in the sizes,
    where the element pairs would be ``m n k`` per matrix. ``A[b][r, j]`` and ``op(B[b])[j, c]``
    interact (group ``(b, j)``)."""
    return sparsity


sparsity = _sparsity(False)
sparsity_nt = _sparsity(True)


def check(t, i, e):
    """Validation of a ``matmul`` (or ``matmul_nt``) entry: the output is ``batch`` matrices
    of ``m x n``; input 0 is read as ``batch`` matrices of ``m x k`` starting ``stride_a``
    apart, input 1 as ``k x n`` (``matmul_nt``: ``n x k``) matrices ``stride_b`` apart. (The CPU kernels skip empty products; the GPU's
    reverse still visits every element of the input adjoints, so both extents are checked
    whenever they are nonempty.)"""
    a, b, y = e[E_IN0], e[E_IN1], e[E_OUT]
    names = mm.Matmul._fields
    validate.block(t, i, 0, mm.SIZE, ", ".join(names))
    ints = mm.decode(t.ipool, int(e[E_ATTR]))
    for name, v in zip(names, ints):
        validate.count(t, i, v, name, hi=1 << 62)
    nb, m, k, n, sa, sb = ints
    validate.equal_sizes(t, i, "the output", y, nb * m * n, f"{nb} matrices of {m} x {n}")
    if nb and m * k:
        validate.inside(t, i, "input 0", a, (0, (nb - 1) * sa + m * k - 1))
    if nb and k * n:
        validate.inside(t, i, "input 1", b, (0, (nb - 1) * sb + k * n - 1))


MATMUL = registry.structural(
    "matmul", matmul_fwd, matmul_rev, module=__name__, n_inputs=2, differentiable=(True, True),
    check=check, gpu="matmul", method=True, jvp=matmul_jvp, hvp=matmul_hvp, sparsity=sparsity, operators=("__matmul__",), reflected=("__rmatmul__",),
    may_stop=False,
)  # fmt: skip
