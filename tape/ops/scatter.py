"""Scatter-add: the transpose of ``take``, for functional updates (``x.at[i].add(v)``,
``x.at[i].set(v)``, ``index_add``).

``scatter_add`` attribute block: ``[n_rows, inner]``: the output is ``(n_rows, inner)``, zeroed,
and input row ``j`` is added into output row ``index[j]`` (negative indices count from the
end); repeated indices accumulate. Indices are data: the forward kernel checks them before it
writes anything and stops the sweep on a bad one. The reverse is a gather of the output's
adjoint rows. The front ends are in :mod:`tape.frontend.ops.scatter`.
"""

import numpy as np

from tape.layout.calls import compiled_only
from tape.layout.columns import E_ATTR, E_IN0, E_IN1, E_OUT
from tape.ops import registry
from tape.ops.blocks import rows as rows_block
from tape.ops.loops import active, view
from tape.ops.movement import check_take, inner_at, n_rows_at, take_failure

_jit = compiled_only  # (tape.layout.calls: no entry for calls from Python)


@_jit
def _rows(v, n_rows):
    r = int(v)
    return r + n_rows if r < 0 else r


@_jit
def scatter_add_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    idx = view(bufs, data, entries[i, E_IN1])
    y = view(bufs, data, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    n_rows = ipool[n_rows_at(p)]
    inner = ipool[inner_at(p)]
    for j in range(idx.shape[0]):
        v = idx[j]
        if not (v >= -n_rows and v < n_rows):  # the range first: int() of NaN is undefined
            return i
        if int(v) != v:
            return i
    y[:] = 0.0
    for j in range(idx.shape[0]):
        r = _rows(idx[j], n_rows)
        for t in range(inner):
            y[r * inner + t] += x[j * inner + t]
    return -1


@_jit
def scatter_add_rev(i, entries, bufs, ipool, data, grad):
    a = entries[i, E_IN0]
    if not active(bufs, a):
        return
    idx = view(bufs, data, entries[i, E_IN1])
    gx = view(bufs, grad, a)
    gy = view(bufs, grad, entries[i, E_OUT])
    p = entries[i, E_ATTR]
    n_rows = ipool[n_rows_at(p)]
    inner = ipool[inner_at(p)]
    for j in range(idx.shape[0]):
        r = _rows(idx[j], n_rows)
        for t in range(inner):
            gx[j * inner + t] += gy[r * inner + t]


@_jit
def scatter_add_jvp(i, entries, bufs, ipool, data, T):
    # the forward scatter on tangents, with the indices read from the values (checked there)
    idx = view(bufs, data, entries[i, E_IN1])
    p = entries[i, E_ATTR]
    n_rows = ipool[n_rows_at(p)]
    inner = ipool[inner_at(p)]
    for d in range(T.shape[0]):
        tx = view(bufs, T[d], entries[i, E_IN0])
        ty = view(bufs, T[d], entries[i, E_OUT])
        ty[:] = 0.0
        for j in range(idx.shape[0]):
            r = _rows(idx[j], n_rows)
            for t in range(inner):
                ty[r * inner + t] += tx[j * inner + t]


def scatter_add_sparsity(t, i, data):
    """Output row ``index[j]`` depends on input row ``j`` (for these indices)."""
    p = int(t.entries[i, E_ATTR])
    n_rows, inner = rows_block.decode(t.ipool, p)
    idx = t.view(data, int(t.entries[i, E_IN1])).ravel().astype(np.int64) % max(n_rows, 1)
    j = np.arange(idx.shape[0] * inner)
    return [(0, idx[j // inner] * inner + j % inner, j)], []


def check_scatter_add(t, i, e):
    """Validation of a ``scatter_add`` entry: ``take``'s with input and output exchanged (the
    input is one row per index, the output ``n_rows`` rows)."""
    e = list(e)
    e[E_IN0], e[E_OUT] = e[E_OUT], e[E_IN0]
    check_take(t, i, e)


SCATTER_ADD = registry.structural(
    "scatter_add", scatter_add_fwd, scatter_add_rev, module=__name__, n_inputs=2,
    differentiable=(True, False), check=check_scatter_add, gpu="scatter_add",
    describe_failure=take_failure, jvp=scatter_add_jvp, hvp=registry.LINEAR,
    sparsity=scatter_add_sparsity,
)  # fmt: skip
