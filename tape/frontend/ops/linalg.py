"""Front ends of the matrix product (:mod:`tape.ops.linalg`): NumPy's ``matmul`` rules, with
1-D, 2-D and N-D operands reshaped (free aliases) to the kernel's batched 3-D form.

The linear algebra helpers (diagonal, diag, trace, tensordot, einsum) are composites of
``matmul``, ``copy``, ``take``, ``sum`` and ``mul`` entries, so they need no derivative rules of
their own."""

import math

import numpy as np

from tape.frontend import tensor
from tape.frontend.ops import movement, reduce
from tape.ops.blocks import matmul as mm
from tape.ops.blocks.copy import c_strides
from tape.ops.linalg import MATMUL


def matmul(a, b):
    """Matrix product with NumPy's ``matmul`` rules.

    A 1-D operand is a vector (its axis is removed from the result); operands of more than two
    dimensions are stacks of matrices whose leading (batch) axes broadcast with NumPy's rules:
    ``(2, 1, 3, 4) @ (5, 4, 2)`` has shape ``(2, 5, 3, 2)``. An operand whose batch is the
    whole broadcast batch, or a single matrix, is read in place; one broadcast along some
    batch axes only is copied to the full batch first.

    Parameters
    ----------
    a, b : Tensor or array_like
        At least 1-D each.

    Returns
    -------
    Tensor
        One ``matmul`` entry (batched over the flattened batch axes).
    """
    a, b = tensor.as_tensor(a), tensor.as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul: operands must be at least 1-D, got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    a2 = tensor.view(a, (1,) + a.shape, 0) if a.ndim == 1 else a
    b2 = tensor.view(b, b.shape + (1,), 0) if b.ndim == 1 else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ValueError(
            f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} are not aligned: "
            f"{k} (last dim of the first) != {k2} ({'first' if b.ndim == 1 else 'second-to-last'} dim of the second)"
        )
    ba, bb = a2.shape[:-2], b2.shape[:-2]
    try:
        batch = np.broadcast_shapes(ba, bb)
    except ValueError:
        raise ValueError(
            f"matmul: batch dimensions {ba} and {bb} of shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast"
        ) from None
    nb = math.prod(batch)
    a3, sa = _batched(a2, ba, batch, nb)
    b3, sb = _batched(b2, bb, batch, nb)
    out = tensor.apply(
        MATMUL, [a3, b3], (nb, m, n) if batch else (m, n), mm.encode(nb, m, k, n, sa, sb)
    )
    shape = batch + (m, n)
    if a.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if b.ndim == 1:
        shape = shape[:-1]
    return out if shape == out.shape else tensor.view(out, shape, 0)


def _batched(x, bx, batch, nb):
    """``x`` (batch axes ``bx``) as the kernel reads it, with its matrix stride: one shared
    matrix (stride 0), or ``nb`` matrices (broadcast to the whole batch first if needed)."""
    r, c = x.shape[-2:]
    if nb == 0:  # an empty batch: no matrix is read
        return tensor.view(x, (0, r, c), 0), r * c
    if math.prod(bx) == 1:
        return tensor.view(x, (r, c), 0), 0
    if (1,) * (len(batch) - len(bx)) + bx != batch:
        x = movement.broadcast_to(x, batch + (r, c))
    return tensor.view(x, (nb, r, c), 0), r * c


def dot(a, b):
    """Inner product of two 1-D tensors (and ``matmul`` otherwise, as ``numpy.dot`` for <= 2-D)."""
    return matmul(a, b)


def outer(a, b):
    """Outer product of two vectors (flattened first, as ``numpy.outer``)."""
    a, b = tensor.as_tensor(a), tensor.as_tensor(b)
    return matmul(tensor.view(a, (a.numel(), 1), 0), tensor.view(b, (1, b.numel()), 0))


# ---------------------------------------------------------------- composites


def diagonal(x, offset=0, axis1=0, axis2=1, *, dim1=None, dim2=None):
    """The diagonal of ``x`` over ``axis1`` and ``axis2`` (``numpy.diagonal``,
    ``torch.diagonal``).

    Parameters
    ----------
    x : Tensor or array_like
        At least 2-D.
    offset : int
        Above (positive) or below (negative) the main diagonal.
    axis1, axis2 : int
        The two axes (PyTorch: ``dim1``, ``dim2``); they are removed and the diagonal is
        appended as the last axis.

    Returns
    -------
    Tensor
        A strided copy of ``x`` (one ``copy`` entry).
    """
    x = tensor.as_tensor(x)
    axis1 = axis1 if dim1 is None else dim1
    axis2 = axis2 if dim2 is None else dim2
    if x.ndim < 2:
        raise ValueError(f"diagonal: the input must be at least 2-D, got shape {tuple(x.shape)}")
    offset = movement._int("diagonal", "offset", offset)
    a1 = movement._axis(axis1, x.ndim, "diagonal")
    a2 = movement._axis(axis2, x.ndim, "diagonal")
    if a1 == a2:
        raise ValueError(
            f"diagonal: axis1 and axis2 must be different axes, got {axis1} and {axis2} for "
            f"shape {tuple(x.shape)}"
        )
    n1, n2 = x.shape[a1], x.shape[a2]
    st = c_strides(x.shape)
    if offset >= 0:
        length, start = min(n1, n2 - offset), offset * st[a2]
    else:
        length, start = min(n1 + offset, n2), -offset * st[a1]
    if length <= 0:
        length, start = 0, 0
    rest = [a for a in range(x.ndim) if a not in (a1, a2)]
    shape = [x.shape[a] for a in rest] + [length]
    strides = [st[a] for a in rest] + [st[a1] + st[a2]]
    return movement.strided(x, shape, start, strides)


def trace(x, offset=0, axis1=0, axis2=1):
    """Sum along a diagonal (``numpy.trace``): :func:`diagonal` summed over its last axis.

    Returns
    -------
    Tensor
        0-d for a 2-D ``x``; the other axes remain otherwise.
    """
    return reduce.sum(diagonal(x, offset, axis1, axis2), -1)


def diag(v, k=0):
    """A 2-D tensor with the 1-D ``v`` on its ``k``-th diagonal and zeros elsewhere, or the
    ``k``-th diagonal of a 2-D ``v`` (``numpy.diag``).

    Returns
    -------
    Tensor
        From a 1-D ``v``: one ``take`` from ``v`` followed by a zero, at constant positions
        (exact: the zeros are copied, not computed). From a 2-D ``v``: :func:`diagonal`.
    """
    v = tensor.as_tensor(v)
    k = movement._int("diag", "k", k)
    if v.ndim == 2:
        return diagonal(v, k)
    if v.ndim != 1:
        raise ValueError(f"diag: the input must be 1-D or 2-D, got shape {tuple(v.shape)}")
    n = v.shape[0]
    m = n + abs(k)
    idx = np.full((m, m), n, np.int64)  # position n: the appended zero
    i = np.arange(n)
    idx[i + max(-k, 0), i + max(k, 0)] = i
    padded = movement.concatenate([v, tensor.zeros(1, dtype=v.dtype)])
    return movement.take(padded, idx, 0)


def tensordot(a, b, axes=2, *, dims=None):
    """Sum of products over the given axes of ``a`` and ``b`` (``numpy.tensordot``;
    ``torch.tensordot``'s ``dims=``).

    Parameters
    ----------
    a, b : Tensor or array_like
    axes : int or (sequence, sequence)
        ``N``: the last ``N`` axes of ``a`` with the first ``N`` of ``b``; a pair: the axes of
        ``a`` and of ``b`` to contract, in matching order.

    Returns
    -------
    Tensor
        ``a``'s free axes then ``b``'s: transposes and one 2-D ``matmul``.
    """
    a, b = tensor.as_tensor(a), tensor.as_tensor(b)
    if dims is not None:
        axes = dims
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        nax = int(axes)
        if nax < 0 or nax > a.ndim or nax > b.ndim:
            raise ValueError(
                f"tensordot: axes={nax} needs operands of at least {nax} dimensions and "
                f"non-negative; got shapes {tuple(a.shape)} and {tuple(b.shape)}"
            )
        ax_a, ax_b = list(range(a.ndim - nax, a.ndim)), list(range(nax))
    else:
        try:
            if isinstance(axes, str):
                raise TypeError
            ax_a, ax_b = axes
        except (TypeError, ValueError):
            raise TypeError(
                f"tensordot: axes must be an int or a pair of sequences of ints, got {axes!r}"
            ) from None
        ax_a = movement._axes("tensordot", ax_a, a.ndim)
        ax_b = movement._axes("tensordot", ax_b, b.ndim)
        if len(ax_a) != len(ax_b):
            raise ValueError(
                f"tensordot: {len(ax_a)} axes of a {tuple(a.shape)} against {len(ax_b)} of b {tuple(b.shape)}: "
                "expected as many of each"
            )
    for p, q in zip(ax_a, ax_b):
        if a.shape[p] != b.shape[q]:
            raise ValueError(
                f"tensordot: shape mismatch: axis {p} of a {tuple(a.shape)} has size {a.shape[p]} but "
                f"axis {q} of b {tuple(b.shape)} has size {b.shape[q]}"
            )
    free_a = [d for d in range(a.ndim) if d not in ax_a]
    free_b = [d for d in range(b.ndim) if d not in ax_b]
    at = movement.transpose(a, free_a + list(ax_a))
    bt = movement.transpose(b, list(ax_b) + free_b)
    sa = tuple(a.shape[d] for d in free_a)
    sb = tuple(b.shape[d] for d in free_b)
    kk = math.prod(a.shape[d] for d in ax_a)
    out = matmul(tensor.view(at, (math.prod(sa), kk), 0), tensor.view(bt, (kk, math.prod(sb)), 0))
    return tensor.view(out, sa + sb, 0)


def einsum(subscripts, *operands):
    """Einstein summation (``numpy.einsum``, ``torch.einsum``) over a subscripts string.

    Explicit (``"ij,jk->ik"``) and implicit (``"ij,jk"``: the labels appearing once, sorted)
    outputs, ``...`` for broadcast leading axes, a label repeated within one operand for its
    diagonal (``"ii->i"``, ``"ii"``: the trace), and labels left out of the output summed.
    Axes of length 1 broadcast against the same label's longer axes, as NumPy.

    Parameters
    ----------
    subscripts : str
    *operands : Tensor or array_like

    Returns
    -------
    Tensor
        Recorded as strided copies (diagonals, transposes), ``sum`` for labels one operand
        sums away, and one ``matmul`` (batched over the shared output labels) or elementwise
        ``mul`` per pair of operands, contracted left to right.
    """
    if not isinstance(subscripts, str):
        raise TypeError(
            "einsum: the first argument must be a subscripts string such as 'ij,jk->ik', got "
            f"{type(subscripts).__name__}"
        )
    ops = [tensor.as_tensor(o) for o in operands]
    if not ops:
        raise ValueError("einsum: need at least one operand")
    spec = subscripts.replace(" ", "")
    if spec.count("->") > 1:
        raise ValueError(f"einsum: {subscripts!r} has more than one '->'")
    lhs, arrow, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise ValueError(
            f"einsum: {subscripts!r} names {len(terms)} operand(s), got {len(ops)} "
            f"(shapes {[o.shape for o in ops]})"
        )
    # labels: letters; the axes under '...' get ints, right-aligned across the operands
    parsed = []
    n_ell = 0
    for k, (term, t) in enumerate(zip(terms, ops)):
        letters, ell = _einsum_term(subscripts, term, f"operand {k}")
        if ell is None:
            if len(letters) != t.ndim:
                raise ValueError(
                    f"einsum: operand {k} has shape {tuple(t.shape)} ({t.ndim} dimensions) but its "
                    f"subscripts {term!r} name {len(letters)}"
                )
            e = 0
        else:
            e = t.ndim - len(letters)
            if e < 0:
                raise ValueError(
                    f"einsum: operand {k} has shape {tuple(t.shape)} ({t.ndim} dimensions), fewer than "
                    f"its subscripts {term!r} name"
                )
        parsed.append((letters, ell, e))
        n_ell = max(n_ell, e)
    labelled = []
    for letters, ell, e in parsed:
        labels = list(letters)
        if ell is not None:
            labels[ell:ell] = list(range(n_ell - e, n_ell))
        labelled.append(labels)
    sizes, first = {}, {}
    for k, (labels, t) in enumerate(zip(labelled, ops)):
        own = {}
        for lab, s in zip(labels, t.shape):
            if own.setdefault(lab, s) != s:
                raise ValueError(
                    f"einsum: label {lab!r} is repeated in operand {k} (shape {tuple(t.shape)}) over "
                    f"axes of different sizes {own[lab]} and {s}"
                )
        for lab, s in own.items():
            old = sizes.get(lab)
            if old is None or old == 1:
                sizes[lab], first[lab] = s, k
            elif s not in (1, old):
                name = "an axis under '...'" if isinstance(lab, int) else f"label {lab!r}"
                raise ValueError(
                    f"einsum: {name} has size {old} in operand {first[lab]} and {s} in operand "
                    f"{k} (shapes {[o.shape for o in ops]}); they must match or be 1"
                )
    if arrow:
        letters, ell = _einsum_term(subscripts, rhs, "the output")
        if len(set(letters)) != len(letters):
            raise ValueError(f"einsum: the output {rhs!r} repeats a label")
        known = {lab for labels in labelled for lab in labels}
        for lab in letters:
            if lab not in known:
                raise ValueError(f"einsum: output label {lab!r} appears in no operand")
        out = list(letters)
        if ell is not None:
            out[ell:ell] = list(range(n_ell))
        elif any(sizes[e] != 1 for e in range(n_ell)):
            raise ValueError(
                f"einsum: {subscripts!r}: the operands' '...' axes are not in the output, which "
                "has no '...' to keep them"
            )
    else:
        counts = {}
        for labels in labelled:
            for lab in labels:
                if not isinstance(lab, int):
                    counts[lab] = counts.get(lab, 0) + 1
        out = list(range(n_ell)) + sorted((c for c, m in counts.items() if m == 1), key=ord)
    # each operand: its diagonals taken, its length-1 broadcast axes dropped
    terms = [
        _einsum_prepare(t, labels, sizes, k) for k, (t, labels) in enumerate(zip(ops, labelled))
    ]
    keep_out = set(out)
    cur, cur_l = terms[0]
    for j in range(1, len(terms)):
        t, lt = terms[j]
        later = keep_out.union(*[set(lb) for _, lb in terms[j + 1 :]])
        cur, cur_l = _einsum_sum(cur, cur_l, later | set(lt))
        t, lt = _einsum_sum(t, lt, later | set(cur_l))
        cur, cur_l = _einsum_pair(cur, cur_l, t, lt, later)
    cur, cur_l = _einsum_sum(cur, cur_l, keep_out)
    return movement.transpose(cur, [cur_l.index(lab) for lab in out]) if cur_l else cur


def _einsum_term(subscripts, term, what):
    """The letters of one term and the position of its ``...`` (None if it has none)."""
    ell = None
    if "..." in term:
        if term.count("...") > 1:
            raise ValueError(f"einsum: {what} {term!r} of {subscripts!r} has more than one '...'")
        ell = term.index("...")
        term = term.replace("...", "")
    for c in term:
        if not (c.isascii() and c.isalpha()):
            raise ValueError(
                f"einsum: invalid subscript {c!r} in {what} {term!r} of {subscripts!r}: "
                "expected letters, ',', '->' and '...'"
            )
    return term, ell


def _einsum_prepare(t, labels, sizes, k):
    """Operand ``k`` with one axis per distinct label: a repeated label's diagonal (one
    strided copy), and axes of length 1 that broadcast against a longer axis dropped."""
    uniq = list(dict.fromkeys(labels))
    if len(uniq) < len(labels):
        st = c_strides(t.shape)
        shape, strides = [], []
        for lab in uniq:
            where = [d for d, lb in enumerate(labels) if lb == lab]
            ns = {t.shape[d] for d in where}
            if len(ns) > 1:
                raise ValueError(
                    f"einsum: label {lab!r} is repeated in operand {k} (shape {tuple(t.shape)}) over "
                    f"axes of different sizes {sorted(ns)}"
                )
            shape.append(t.shape[where[0]])
            strides.append(sum(st[d] for d in where))
        t = movement.strided(t, shape, 0, strides)
        labels = uniq
    drop = [d for d, lab in enumerate(labels) if t.shape[d] == 1 and sizes[lab] != 1]
    if drop:
        t = tensor.view(t, tuple(s for d, s in enumerate(t.shape) if d not in drop), 0)
        labels = [lab for d, lab in enumerate(labels) if d not in drop]
    return t, list(labels)


def _einsum_sum(t, labels, keep):
    """``t`` summed over its labels not in ``keep``."""
    axes = tuple(d for d, lab in enumerate(labels) if lab not in keep)
    if not axes:
        return t, labels
    return reduce.sum(t, axes), [lab for lab in labels if lab in keep]


def _einsum_pair(a, la, b, lb, keep):
    """The product of two operands summed over the labels they share that ``keep`` does not
    hold: a ``matmul`` batched over the shared labels kept, or an elementwise product when
    nothing is summed. Result labels: shared kept, then ``a``'s own, then ``b``'s own."""
    batch = [lab for lab in la if lab in lb and lab in keep]
    summed = [lab for lab in la if lab in lb and lab not in keep]
    fa = [lab for lab in la if lab not in lb]
    fb = [lab for lab in lb if lab not in la]
    at = movement.transpose(a, [la.index(lab) for lab in batch + fa + summed])
    bt = movement.transpose(b, [lb.index(lab) for lab in batch + summed + fb])
    nbatch = at.shape[: len(batch)]
    sa = at.shape[len(batch) : len(batch) + len(fa)]
    sb = bt.shape[len(bt.shape) - len(fb) :]
    if not summed:
        y = tensor.elementwise(
            "mul",
            tensor.view(at, nbatch + sa + (1,) * len(fb), 0),
            tensor.view(bt, nbatch + (1,) * len(fa) + sb, 0),
        )
        return y, batch + fa + fb
    kk = math.prod(at.shape[len(batch) + len(fa) :])
    lead = (math.prod(nbatch),) if batch else ()
    y = matmul(
        tensor.view(at, lead + (math.prod(sa), kk), 0),
        tensor.view(bt, lead + (kk, math.prod(sb)), 0),
    )
    return tensor.view(y, nbatch + sa + sb, 0), batch + fa + fb
