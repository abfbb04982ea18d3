"""Functional updates on top of the ``scatter_add`` kernel (:mod:`tape.ops.scatter`):
``x.at[idx].set(v)`` / ``x.at[idx].add(v)`` (JAX's spelling) and ``index_add`` (PyTorch's).
They return new tensors; ``x`` is unchanged, and gradients flow to both ``x`` and ``v``."""

from __future__ import annotations

import math

import numpy as np

from tape.frontend import tensor
from tape.frontend.ops import movement
from tape.ops.blocks import rows as rows_block
from tape.ops.scatter import SCATTER_ADD


def scatter_add(rows, index, n_rows):
    """``(n_rows, *rows.shape[1:])`` zeros with row ``j`` of ``rows`` added at row
    ``index[j]`` (repeated indices accumulate). ``index`` is a 1-D integer array or tensor
    (a traced one is checked at every replay)."""
    rows = tensor.as_tensor(rows)
    idx = movement._index_tensor(index, n_rows, 0)
    if idx.ndim != 1 or rows.ndim == 0 or rows.shape[0] != idx.shape[0]:
        raise ValueError(
            f"scatter_add: {idx.shape[0] if idx.ndim == 1 else idx.shape} indices for rows of "
            f"shape {tuple(rows.shape)}: expected one 1-D index per row"
        )
    rest = rows.shape[1:]
    inner = math.prod(rest)
    flat = tensor.view(rows, (rows.shape[0], inner), 0)
    out = tensor.apply(SCATTER_ADD, [flat, idx], (n_rows, inner), rows_block.encode(n_rows, inner))
    return tensor.view(out, (n_rows,) + rest, 0)


def index_add(x, dim, index, source, *, alpha=1):
    """``x`` with ``alpha * source`` added along ``dim`` at ``index`` (``torch.index_add``):
    slice ``j`` of ``source`` along ``dim`` is added to slice ``index[j]`` of ``x``; repeated
    indices accumulate."""
    x, source = tensor.as_tensor(x), tensor.as_tensor(source)
    nd = x.ndim
    if not -nd <= dim < max(nd, 1):
        raise IndexError(f"index_add: dim {dim} is out of range for a {nd}-D tensor")
    dim %= max(nd, 1)
    n_idx = np.shape(index)[0] if np.ndim(index) == 1 else None
    want = x.shape[:dim] + (n_idx,) + x.shape[dim + 1 :]
    if n_idx is None or source.shape != want:
        raise ValueError(
            f"index_add: source of shape {tuple(source.shape)} does not match x of shape {tuple(x.shape)}, "
            f"dim {dim} and a 1-D index of {n_idx} (expected {want})"
        )
    moved = movement.moveaxis(source, dim, 0) if dim else source
    added = scatter_add(moved * alpha if alpha != 1 else moved, index, x.shape[dim])
    return x + (movement.moveaxis(added, 0, dim) if dim else added)


class _At:
    """``x.at``: index it to get an updater (``x.at[idx].set(v)``, ``.add(v)``)."""

    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __getitem__(self, key):
        return _Update(self.x, key)


class _Update:
    """``x.at[key]``: functional updates of the elements ``x[key]`` selects."""

    __slots__ = ("x", "key")

    def __init__(self, x, key):
        self.x, self.key = x, key

    def _positions(self, op):
        """Flat positions of ``x[key]`` (constant indices), or None for one traced integer
        tensor on the leading axis."""
        key = self.key
        if isinstance(key, tensor.Tensor) and key._tape is not None and key.dtype != np.bool_:
            return None  # a traced mask (with a non-scalar value) is read as a constant below
        if isinstance(key, tuple) and any(
            isinstance(k, tensor.Tensor) and k._tape is not None for k in key
        ):
            raise NotImplementedError(
                f"x.at[...].{op}: a traced index tensor is supported alone (x.at[i], on the "
                "leading axis), not inside a tuple of indices"
            )
        key = _constant_key(key)
        pos = np.arange(self.x.numel(), dtype=np.int64).reshape(self.x.shape)
        try:
            return np.asarray(pos[key])
        except IndexError as e:
            raise IndexError(
                f"x.at[...].{op} on a tensor of shape {tuple(self.x.shape)}: {e}"
            ) from None

    def _scalar_mask(self, v):
        """``(mask, v)`` when the key is a boolean mask of ``x``'s shape and ``v`` one value:
        the update is a ``where`` that reads the mask at every replay (no guard)."""
        key = self.key
        is_mask = (
            isinstance(key, tensor.Tensor) or isinstance(key, np.ndarray)
        ) and key.dtype == np.bool_
        if is_mask and tuple(key.shape) == tuple(self.x.shape) and np.size(v) == 1:
            v = tensor.as_tensor(v)
            return key, tensor.view(v, (), 0) if v.ndim else v
        return None

    def add(self, v):
        """``x`` with ``v`` added at ``x[key]`` (broadcast to its shape); repeated positions
        accumulate, as JAX's ``.add``."""
        x = self.x
        masked = self._scalar_mask(v)
        if masked is not None:
            from tape.frontend.functional import where

            return x + where(masked[0], masked[1], 0.0)
        pos = self._positions("add")
        if pos is None:  # x.at[i] with a traced index tensor: rows of x
            idx = self.key
            shape = tuple(idx.shape) + x.shape[1:]
            rows = movement.broadcast_to(v, shape)
            flat_idx = tensor.view(idx, (idx.numel(),), 0)
            rows = tensor.view(rows, (idx.numel(),) + x.shape[1:], 0)
            return x + scatter_add(rows, flat_idx, x.shape[0])
        vals = movement.broadcast_to(v, pos.shape)
        flat = scatter_add(tensor.view(vals, (pos.size,), 0), pos.reshape(-1), x.numel())
        return x + tensor.view(flat, x.shape, 0)

    def set(self, v):
        """``x`` with ``x[key]`` replaced by ``v`` (broadcast to its shape); where a position
        is selected twice the last value wins, as NumPy's ``x[key] = v``."""
        x = self.x
        masked = self._scalar_mask(v)
        if masked is not None:
            from tape.frontend.functional import where

            return where(masked[0], masked[1], x)
        pos = self._positions("set")
        if pos is None:
            raise NotImplementedError(
                "x.at[i].set(v) with a traced index tensor i: repeated indices at a replay would "
                "add instead of replacing. Use .add, or an index that is constant"
            )
        from tape.frontend.functional import where

        vals = tensor.view(movement.broadcast_to(v, pos.shape), (pos.size,), 0)
        flat_pos = pos.reshape(-1)
        last = len(flat_pos) - 1 - np.unique(flat_pos[::-1], return_index=True)[1]
        last.sort()
        if last.size != flat_pos.size:  # duplicates: keep the last write of each position
            vals = movement.take(vals, last, 0)
            flat_pos = flat_pos[last]
        mask = np.zeros(x.numel(), bool)
        mask[flat_pos] = True
        placed = tensor.view(scatter_add(vals, flat_pos, x.numel()), x.shape, 0)
        return where(mask.reshape(x.shape), placed, x)


def _constant_key(key):
    def one(k):
        if isinstance(k, tensor.Tensor):
            return k.numpy()
        if isinstance(k, list):
            return np.asarray(k)
        return k

    return tuple(one(k) for k in key) if isinstance(key, tuple) else one(key)


def at(x):
    """``x.at``: JAX-style functional updates, ``x.at[idx].set(v)`` and ``x.at[idx].add(v)``,
    returning new tensors (differentiable in ``x`` and ``v``)."""
    return _At(x)
