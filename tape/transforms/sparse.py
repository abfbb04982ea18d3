"""Sparse Jacobians and Hessians: sparsity patterns propagated over the tape, column
colourings, and compressed evaluation.

**Patterns.** Every element of every buffer gets the set of argument elements it depends on,
as the rows of a sparse boolean matrix, propagated entry by entry in recording order. Each
op's record says which input elements an output element depends on (elementwise ops: from
the broadcast shapes; structural ops: ``Op.sparsity``). The Hessian's pattern collects, for each
op with a nonzero second partial between two of its inputs (``Op.hess`` for elementwise ops,
``Op.sparsity``'s pairs for structural ops), the outer product of those inputs' sets. Patterns
are structural: a superset of the nonzeros at any argument values, except through gather
indices, whose values they follow.

**Colouring.** Columns that share no row get one colour (a greedy distance-2 colouring,
largest degree first); one tangent direction per colour then gives every entry of the
Jacobian (``J S``, with ``S`` the colour indicator). The Hessian uses the same colouring of its
own pattern (direct recovery from ``H S``; star colouring, which exploits symmetry and needs
fewer colours, is not implemented).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from numba import njit

from tape.layout.columns import B_ALIAS, B_OFF, B_SIZE, E_IN0, E_OP, E_OUT
from tape.ops import registry


class Sparsity(NamedTuple):
    """Sparsity patterns over the flattened, concatenated outputs and differentiated
    arguments (boolean ``scipy.sparse.csr_matrix``), with their column colourings."""

    jacobian: sp.csr_matrix
    """``(total output elements, total argument elements)``."""
    hessian: sp.csr_matrix | None
    """``(total argument elements,) * 2`` for a scalar output, else None."""
    jacobian_colors: np.ndarray
    """Colour of each Jacobian column; ``jacobian_colors.max() + 1`` tangent directions."""
    hessian_colors: np.ndarray | None
    """Colour of each Hessian column (None without a Hessian)."""
    jacobian_nz: tuple
    """``(rows, cols)`` of the Jacobian pattern's entries."""
    hessian_nz: tuple | None
    """``(rows, cols)`` of the Hessian pattern's entries (None without a Hessian)."""

    @property
    def n_jacobian_colors(self) -> int:
        return int(self.jacobian_colors.max()) + 1 if self.jacobian_colors.size else 0

    @property
    def n_hessian_colors(self) -> int:
        c = self.hessian_colors
        return int(c.max()) + 1 if c is not None and c.size else 0


def _bool(m):
    m = sp.csr_matrix(m)
    m.sum_duplicates()
    m.data[:] = 1
    m.eliminate_zeros()
    return m


def _elementwise_deps(t, i, op):
    """Dependencies of an elementwise entry, from the broadcast shapes."""
    e = t.entries[i]
    out_shape = tuple(t.shapes[e[E_OUT]])
    deps = []
    for k in range(op.arity):
        b = int(e[E_IN0 + k])
        shape = tuple(t.shapes[b])
        idx = np.broadcast_to(
            np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape), out_shape
        )
        deps.append((k, np.arange(idx.size), idx.ravel()))
    return deps


def _pattern_pass(plan, data, hessian):
    """Propagate the patterns; returns ``(jacobian pattern, hessian pattern or None)``."""
    from tape.interpreter.generated import sweeps

    tp = plan.tp
    n = plan.n_in
    owner_rows: dict[int, sp.csr_matrix] = {}

    def owner(b):
        a = int(tp.bufs[b, B_ALIAS])
        o = b if a < 0 else a
        return o, int(tp.bufs[b, B_OFF] - tp.bufs[o, B_OFF]), int(tp.bufs[b, B_SIZE])

    def read(b):
        o, d, size = owner(b)
        P = owner_rows.get(o)
        if P is None:
            return sp.csr_matrix((size, n), dtype=np.int8)
        return P[d : d + size]

    def write(b, M):
        o, d, size = owner(b)
        total = int(tp.bufs[o, B_SIZE])
        if d or size != total:
            M = sp.vstack(
                [
                    sp.csr_matrix((d, n), dtype=np.int8),
                    M,
                    sp.csr_matrix((total - d - size, n), dtype=np.int8),
                ],
                format="csr",
            )
        old = owner_rows.get(o)
        owner_rows[o] = _bool(M if old is None else old + M)

    for b, c, size in zip(plan.in_bufs, plan.in_col, plan.in_size):
        write(
            b,
            sp.csr_matrix(
                (np.ones(size, np.int8), (np.arange(size), c + np.arange(size))), shape=(size, n)
            ),
        )
    emask = None
    if hessian:
        emask = sweeps.reach(tp.entries, tp.bufs, tp.n_entries, plan.roots)[0]
    H = sp.csr_matrix((n, n), dtype=np.int8)
    for i in range(tp.n_entries):
        op = registry.OPS[int(tp.entries[i, E_OP])]
        if not any(op.differentiable):
            continue
        if op.kind == "structural":
            deps, pairs = op.sparsity(tp, i, data)
        else:
            deps = _elementwise_deps(tp, i, op)
            pairs = []
            if hessian:
                ks = range(op.arity)
                upper = [(a, c) for a in ks for c in ks if a <= c]
                for (a, c), h in zip(upper, op.hess):
                    if h is not None:
                        pairs.append((a, deps[a][1], deps[a][2], c, deps[c][1], deps[c][2]))
        out = int(tp.entries[i, E_OUT])
        size = int(tp.bufs[out, B_SIZE])
        M = None
        ins = {}
        for dep in deps:
            k = dep[0]
            if not op.differentiable[k]:
                continue
            b = int(tp.entries[i, E_IN0 + k])
            P = ins.get(k)
            if P is None:
                P = ins[k] = read(b)
            if P.nnz == 0:
                continue
            if len(dep) == 3:  # element pairs
                factors = ((dep[1], dep[2], (size, P.shape[0])),)
            else:  # a product of factors
                factors = dep[1]
            part = P
            for rows, cols, shape in reversed(factors):
                F = sp.csr_matrix((np.ones(len(rows), np.int8), (rows, cols)), shape=shape)
                part = _bool(F @ part)
            M = part if M is None else M + part
        if M is not None:
            write(out, _bool(M))
        if hessian and emask[i]:
            for k, gk, ek, l, gl, el in pairs:
                Pk = ins.get(k)
                Pk = read(int(tp.entries[i, E_IN0 + k])) if Pk is None else Pk
                Pl = ins.get(l)
                Pl = read(int(tp.entries[i, E_IN0 + l])) if Pl is None else Pl
                if Pk.nnz == 0 or Pl.nnz == 0:
                    continue
                ng = int(max(np.max(gk, initial=-1), np.max(gl, initial=-1))) + 1
                Rk = sp.csr_matrix((np.ones(len(gk), np.int8), (gk, ek)), shape=(ng, Pk.shape[0]))
                Rl = sp.csr_matrix((np.ones(len(gl), np.int8), (gl, el)), shape=(ng, Pl.shape[0]))
                A = _bool(Rk @ Pk)
                B = _bool(Rl @ Pl)
                C = A.T @ B
                H = _bool(H + C + C.T)
    J = sp.vstack([read(b) for b in tp.outputs], format="csr") if tp.outputs else None
    return _bool(J).astype(bool), (_bool(H).astype(bool) if hessian else None)


@njit(cache=True, nogil=True)
def _greedy_colour(indptr, indices, order, n):
    """Greedy colouring of the graph with adjacency ``(indptr, indices)`` in ``order``."""
    colour = np.full(n, -1, np.int64)
    mark = np.full(n + 1, -1, np.int64)
    for v in order:
        for p in range(indptr[v], indptr[v + 1]):
            c = colour[indices[p]]
            if c >= 0:
                mark[c] = v
        c = 0
        while mark[c] == v:
            c += 1
        colour[v] = c
    return colour


def column_colouring(P):
    """Colours of the columns of pattern ``P`` such that no two columns sharing a row have
    one colour (greedy, largest degree first)."""
    P = sp.csr_matrix(P, dtype=np.int8)
    n = P.shape[1]
    if n == 0:
        return np.zeros(0, np.int64)
    G = sp.csr_matrix(P.T @ P)
    G.setdiag(0)
    G.eliminate_zeros()
    deg = np.diff(G.indptr)
    order = np.argsort(-deg, kind="stable").astype(np.int64)
    return _greedy_colour(G.indptr.astype(np.int64), G.indices.astype(np.int64), order, n)


def _key(plan, data):
    """What a pattern depends on beyond the tape: the gather indices in ``data``."""
    tp = plan.tp
    idx = plan.__dict__.get("_index_bufs")
    if idx is None:
        from tape.ops.movement import TAKE

        takes = np.flatnonzero(tp.entries[: tp.n_entries, E_OP] == TAKE.code)
        idx = plan._index_bufs = [int(tp.entries[i, E_IN0 + 1]) for i in takes]
    if not idx:
        return ""
    parts = [np.asarray(tp.view(data, b)).tobytes() for b in idx]
    return hashlib.sha256(b"".join(parts)).hexdigest()


def patterns(plan, data) -> Sparsity:
    """The patterns and colourings of ``plan``'s tape at ``data`` (cached on the tape per
    gather indices)."""
    tp = plan.tp
    key = _key(plan, data)
    cache = tp.extensions().setdefault("sparsity", {})
    hit = cache.get(key)
    if hit is not None:
        return hit
    J, H = _pattern_pass(plan, data, plan.n_out == 1)
    res = Sparsity(
        J, H, column_colouring(J), None if H is None else column_colouring(H), J.nonzero(),
        None if H is None else H.nonzero(),
    )  # fmt: skip
    if len(cache) > 8:
        cache.clear()
    cache[key] = res
    return res


def _seeds(colours, n_colours, n, dtype):
    V = np.zeros((n_colours, n), dtype)
    V[colours, np.arange(n)] = 1.0
    return V


class _Compressed(NamedTuple):
    """How the compressed ``which`` of one pattern is made and laid out (see
    :func:`_compression`)."""

    pattern: Sparsity
    seeds: np.ndarray  # one direction per colour
    take: np.ndarray  # flat positions of the entries in the product rows
    put: np.ndarray  # ... in the dense matrix, row by row
    order: np.ndarray  # the entries in CSR order (rows, then columns)
    indices: np.ndarray  # the CSR column indices and row pointers
    indptr: np.ndarray


def _compression(plan, pat, which):
    """The :class:`_Compressed` ``which`` (``"jacobian"`` or ``"hessian"``) of pattern
    ``pat``: the seed directions, one per colour, the flat positions of the pattern's entries
    in the product rows (row ``colour of column c``, element ``r`` for entry ``(r, c)``) and in
    the dense matrix, and the CSR layout. Made once per pattern and kept on the plan (a
    Hessian or Jacobian called again at other arguments reuses them)."""
    hit = plan.compressed.get(which)
    if hit is not None and hit.pattern is pat:
        return hit
    if which == "hessian":
        colours, n_colours, (rows, cols), width = (pat.hessian_colors, pat.n_hessian_colors,
                                                   pat.hessian_nz, plan.n_in)  # fmt: skip
    else:
        colours, n_colours, (rows, cols), width = (pat.jacobian_colors, pat.n_jacobian_colors,
                                                   pat.jacobian_nz, plan.n_out)  # fmt: skip
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    put = rows * plan.n_in + cols
    order = np.argsort(put, kind="stable")
    n_rows = plan.n_in if which == "hessian" else plan.n_out
    hit = _Compressed(
        pat, _seeds(colours, n_colours, plan.n_in, plan.tp.dtype),
        colours[cols].astype(np.int64) * width + rows, put, order, cols[order],
        np.searchsorted(rows[order], np.arange(n_rows + 1)),
    )  # fmt: skip
    plan.compressed[which] = hit
    return hit


def _entries(plan, data, pat, which):
    """The values of ``which``'s pattern entries (in the pattern's order), and how the
    compression lays them out (:class:`_Compressed`)."""
    from tape.transforms.derivatives import _hvp_rows, _jac_fwd_rows

    c = _compression(plan, pat, which)
    rows = _hvp_rows if which == "hessian" else _jac_fwd_rows
    B = np.ascontiguousarray(rows(plan, data, c.seeds))  # row k: the product with seed k
    return B.ravel()[c.take], c


def jacobian_entries(plan, data, pat):
    """The Jacobian's values on ``pat.jacobian_nz``, by forward mode, one direction per
    column colour."""
    return _entries(plan, data, pat, "jacobian")[0]


def hessian_entries(plan, data, pat):
    """The Hessian's values on ``pat.hessian_nz``, one Hessian-vector product direction per
    colour."""
    return _entries(plan, data, pat, "hessian")[0]


def dense(plan, data, pat, which):
    """The dense Jacobian ``(n_out, n_in)`` or Hessian ``(n_in, n_in)`` from its compressed
    products: zero off the pattern."""
    vals, c = _entries(plan, data, pat, which)
    n_rows = plan.n_in if which == "hessian" else plan.n_out
    M = np.zeros(n_rows * plan.n_in, plan.tp.dtype)
    M[c.put] = vals
    return M.reshape(n_rows, plan.n_in)


def _csr(plan, data, pat, which, shape):
    """The compressed ``which`` as a ``csr_matrix`` of ``shape``, laid out from the pattern's
    CSR structure (kept per pattern; the matrix gets copies of it)."""
    vals, c = _entries(plan, data, pat, which)
    return sp.csr_matrix((vals[c.order], c.indices.copy(), c.indptr.copy()), shape=shape)


def sparse_jacobian(plan, data):
    """The Jacobian as ``csr_matrix`` by colouring."""
    pat = patterns(plan, data)
    return _csr(plan, data, pat, "jacobian", pat.jacobian.shape)


def sparse_hessian(plan, data):
    """The Hessian as ``csr_matrix`` by colouring."""
    plan.require_scalar()
    pat = patterns(plan, data)
    return _csr(plan, data, pat, "hessian", pat.hessian.shape)
