"""Validation of tapes that come from outside (files, pickles, arrays): see :func:`check_tape`.

Numba does no bounds checking, so a tape file whose arrays were altered (an input index of
``10**9``, a buffer offset past the arena, a stride that walks off a buffer) would make the
compiled sweeps read or write outside the tape's memory. Every index, offset, shape and
attribute block that compiled code follows is therefore checked here, in Python, before any
sweep sees the tape. A tape that passes may still compute nonsense, but only inside its own
arrays; the sweeps never crash on it.

The checks come in three layers:

- the arrays themselves (dtypes, shapes, counts) and the buffer table, vectorised;
- the Wengert list: op codes, how many inputs each op uses, buffer indices (vectorised);
- each op's own attribute block, by the ``check`` of its record in :mod:`tape.registry`
  (``check(t, i, entry)`` raises ``ValueError``). The shared elementwise checks are here; a
  structural op's check sits next to its kernels in ``tape/ops/`` and is written from the
  kernel's code: which offsets it can touch for a given block. The helpers below
  (:func:`block`, :func:`span`, :func:`inside`, ...) are what those checks are made of.

:func:`check_state` checks the raw saved state (JSON metadata, array dtypes) before
:meth:`tape.core.Tape._from_state` parses it, and :func:`malformed` turns whatever a malformed
state still makes the parser raise (``KeyError``, ``TypeError``, ...) into ``ValueError``.
"""

from __future__ import annotations

import contextlib
import json
import math
import zipfile
import zlib
from collections.abc import Mapping

import numpy as np

from tape.layout.columns import (
    ACTIVE,
    B_ALIAS,
    B_KIND,
    B_NDIM,
    B_OFF,
    B_SHAPE,
    B_SIZE,
    BUF_COLS,
    CONST,
    E_ATTR,
    E_IN0,
    E_OP,
    E_OUT,
    ENTRY_COLS,
    GENERAL,
    LEAF,
    SAME,
)
from tape.ops.blocks import broadcast

MAX_DIMS = 64
"""NumPy's limit on the number of dimensions; no shape or block of a real tape has more."""

EMPTY_WORK = 1 << 24
"""Index spaces with a zero dimension hold no element, but a kernel may still loop over the
rows of their other dimensions (and allocate their offsets): the product of the nonzero
dimensions may be at most ``max(len(data), EMPTY_WORK)``, so a crafted ``(2**62, 0)`` block
cannot make a sweep allocate or spin without bound."""

_FLOATS = (np.dtype(np.float64), np.dtype(np.float32))
_KINDS = (CONST, ACTIVE, LEAF)


def _ops():
    # imported lazily: the registry imports this module for the shared elementwise checks
    from tape.ops import registry

    return registry.OPS


# ---------------------------------------------------------------- helpers for op checks


def fail(t, i, msg):
    """Raise ``ValueError`` for entry ``i`` of ``t``: ``invalid tape: entry i (op): msg``."""
    ops = _ops()
    code = int(t.entries[i, E_OP])
    name = ops[code].name if 0 <= code < len(ops) else f"op code {code}"
    raise ValueError(f"invalid tape: entry {i} ({name}): {msg}")


def size(t, b) -> int:
    """Number of elements of buffer ``b``."""
    return int(t.bufs[b, B_SIZE])


def block(t, i, start, n, what):
    """``n`` ints of entry ``i``'s attribute block from its position ``start`` on, as Python
    ints; ``what`` names them in the message if the block does not hold them."""
    p = int(t.entries[i, E_ATTR])
    if p < 0:
        fail(t, i, f"has no attribute block (attr = {p}), but the op reads {what} from one")
    lo, hi = p + start, p + start + n
    if hi > t.n_ipool:
        fail(
            t, i,
            f"its attribute block at ipool[{p}] needs {what} at ipool[{lo}:{hi}], but ipool "
            f"holds {t.n_ipool} ints",
        )  # fmt: skip
    return [int(v) for v in t.ipool[lo:hi]]


def count(t, i, value, what, lo=0, hi=MAX_DIMS):
    """``value`` if ``lo <= value <= hi``, else fail naming ``what``."""
    if not lo <= value <= hi:
        fail(t, i, f"{what} is {value}, expected {lo}..{hi}")
    return value


def dims(t, i, ds, what) -> int:
    """Check the extents ``ds`` of an index space (non-negative, bounded work); returns the
    number of its elements."""
    for k, d in enumerate(ds):
        if d < 0:
            fail(t, i, f"{what} {tuple(ds)} has a negative extent at axis {k}")
    work = math.prod(d for d in ds if d)
    limit = max(t.n_data, EMPTY_WORK)
    if work > limit:
        fail(t, i, f"{what} {tuple(ds)} spans {work} positions, more than the limit {limit}")
    return math.prod(ds)


def span(ds, strides, base=0):
    """``(lowest, highest)`` offset ``base + sum_k idx_k * strides_k`` over every multi-index
    of extents ``ds`` (any stride sign), or ``None`` if the space is empty."""
    lo = hi = base
    for d, s in zip(ds, strides):
        if d == 0:
            return None
        lo += min(0, (d - 1) * s)
        hi += max(0, (d - 1) * s)
    return lo, hi


def inside(t, i, what, b, sp):
    """Fail unless the offsets ``sp = (lo, hi)`` (``None``: none) lie in buffer ``b``."""
    if sp is None:
        return
    n = size(t, b)
    lo, hi = sp
    if lo < 0 or hi >= n:
        fail(
            t, i,
            f"reaches offsets {lo}..{hi} of {what} (buffer {b}), which has {n} elements "
            f"(offsets 0..{n - 1})",
        )  # fmt: skip


def equal_sizes(t, i, what, b, expected, because):
    """Fail unless buffer ``b`` (``what``) has ``expected`` elements."""
    n = size(t, b)
    if n != expected:
        fail(t, i, f"{what} (buffer {b}) has {n} elements, expected {expected} ({because})")


def later_writer(t, i, b) -> int:
    """The first entry ``j >= i`` whose output memory overlaps buffer ``b``'s memory, or
    ``-1``. (Only forward entries write the value arena, each into its output buffer.)"""
    lo, n = int(t.bufs[b, B_OFF]), size(t, b)
    if n == 0:
        return -1
    outs = t.entries[i : t.n_entries, E_OUT]
    o_lo = t.bufs[outs, B_OFF]
    o_n = t.bufs[outs, B_SIZE]
    hit = np.flatnonzero((o_n > 0) & (o_lo < lo + n) & (lo < o_lo + o_n))
    return i + int(hit[0]) if hit.size else -1


def producer(t, b, before) -> str:
    """The op that wrote buffer ``b`` (or the buffer it views) last before entry ``before``,
    for messages: ``"exp at entry 3"``, ``"argument 0"`` or ``"a constant"``."""
    root = int(t.bufs[b, B_ALIAS]) if t.bufs[b, B_ALIAS] >= 0 else b
    for j in range(before - 1, -1, -1):
        out = int(t.entries[j, E_OUT])
        if out == b or out == root:
            return f"{_ops()[t.entries[j, E_OP]].name} at entry {j}"
    if b in t.inputs:
        return f"argument {t.inputs.index(b)}"
    return "a constant"


# ---------------------------------------------------------------- elementwise checks


def check_unary(t, i, e):
    """Unary loops index the input at the output's positions (no attribute block)."""
    equal_sizes(t, i, "input 0", e[E_IN0], size(t, e[E_OUT]), "unary ops map elements one to one")


def check_broadcast(t, i, e):
    """Binary and ternary entries: a SAME block (ternary only: every input has the output's
    size) or a GENERAL block ``[mode, nd, dims[nd], strides_0[nd], strides_1[nd], ...]``
    (see :mod:`tape.layout.columns` and ``tape.ops.loops``)."""
    n_in = _ops()[int(e[E_OP])].arity
    out = int(e[E_OUT])
    n = size(t, out)
    (mode,) = block(t, i, 0, 1, "the broadcast mode")
    if mode == SAME and n_in == 3:
        for k in range(n_in):
            equal_sizes(t, i, f"input {k}", e[E_IN0 + k], n, "a SAME block loops over the output")
        return
    if mode != GENERAL:
        want = "GENERAL (3)" if n_in == 2 else "SAME (0) or GENERAL (3)"
        fail(t, i, f"broadcast mode {mode}, expected {want}")
    # binary loops read the innermost axis as rows: they need one
    (nd,) = block(t, i, broadcast.ndim_at(0), 1, "the number of axes")
    count(t, i, nd, "the number of broadcast axes", lo=1 if n_in == 2 else 0)
    block(t, i, broadcast.dims_at(0), nd * (1 + n_in), f"{nd} extents and {n_in} x {nd} strides")
    b = broadcast.decode(t.ipool, int(e[E_ATTR]), n_in)  # inside the pool: checked above
    ds = list(b.dims)
    total = dims(t, i, ds, "the broadcast shape")
    if total != n:
        fail(t, i, f"broadcast shape {tuple(ds)} has {total} elements, but the output has {n}")
    strides = [list(st) for st in b.strides]
    for k, st in enumerate(strides):
        # The recorder only emits strides >= 0 (0 where an input is broadcast); the binary
        # reverse's contiguous fast path would read a negative-stride operand as a run.
        if any(s < 0 for s in st):
            fail(t, i, f"input {k} has broadcast strides {tuple(st)}; strides must be >= 0")
    if n_in == 2:
        # the kernels of one entry class (tape.interpreter.dispatch.entry_class) read an input
        # of the output's size element by element and a one-element input as one value, as
        # the recorder's blocks say (rows and columns: at the end); a block that says
        # otherwise is refused
        contiguous, step = [0] * nd, 1
        for ax in range(nd - 1, -1, -1):
            contiguous[ax] = step
            step *= ds[ax]
        for k, st in enumerate(strides):
            sk = size(t, int(e[E_IN0 + k]))
            long = [ax for ax in range(nd) if ds[ax] > 1]
            if sk == n and n > 1 and any(st[ax] != contiguous[ax] for ax in long):
                fail(t, i, f"input {k} has the output's {n} elements but broadcast strides "
                     f"{tuple(st)}, not {tuple(contiguous)}")  # fmt: skip
            if sk == 1 and n > 1 and any(st[ax] != 0 for ax in long):
                fail(t, i, f"input {k} has one element but broadcast strides {tuple(st)}, "
                     "not zeros")  # fmt: skip
    if n_in == 3:
        # ternary loops index each input through its full table of strided offsets
        for k, st in enumerate(strides):
            inside(t, i, f"input {k}", e[E_IN0 + k], span(ds, st))
        return
    # Binary loops (tape.ops.loops.binary_fwd / binary_rev): one row per multi-index of the
    # outer axes, starting at that multi-index . outer strides; along the row, element j at
    # start + j * inner stride. An input with inner stride 0 has its row start read (and,
    # reversed, its adjoint written) even when the row is empty.
    if 0 not in ds[:-1]:  # else no rows at all
        for k, st in enumerate(strides):
            if ds[-1]:
                inside(t, i, f"input {k}", e[E_IN0 + k], span(ds, st))
            if st[-1] == 0:
                inside(t, i, f"input {k}", e[E_IN0 + k], span(ds[:-1], st[:-1]))
    # A row (an input of the output's trailing shape; tape.layout.columns.ROW): the kernels of
    # its entry class read run after run of the output against the whole input; a column
    # (tape.layout.columns.COL): one value over each run. A block that walks it otherwise,
    # inside the buffer or not, is refused.
    long = [ax for ax in range(nd) if ds[ax] > 1]
    for k, st in enumerate(strides):
        b = int(e[E_IN0 + k])
        sk = size(t, b)
        if 1 < sk < n and broadcast.is_row(t.shapes[b], t.shapes[out]):
            want, what = broadcast.row_strides(ds, sk), "row"
        elif 1 < sk < n and broadcast.is_col(t.shapes[b], t.shapes[out]):
            want, what = broadcast.col_strides(ds, sk, n), "column"
        else:
            continue
        if want is None or any(st[ax] != want[ax] for ax in long):
            fail(t, i, f"input {k} is a {what} of the output ({t.shapes[b]} of "
                 f"{t.shapes[out]}) but has broadcast strides {tuple(st)}")  # fmt: skip


ELEMENTWISE_CHECKS = {"unary": check_unary, "binary": check_broadcast, "ternary": check_broadcast}
"""The shared check of each elementwise kind (:func:`tape.registry.elementwise` uses it)."""


# ---------------------------------------------------------------- the tape


def _bad(msg):
    raise ValueError(f"invalid tape: {msg}")


def _is_index(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_tape(t) -> None:
    """Raise ``ValueError`` naming what is wrong if ``t``'s arrays could make compiled code
    read or write outside them; return ``None`` for a valid tape.

    Checks the arrays (dtypes, shapes, counts), the buffer table (each buffer inside the
    arena, its shape in ``ipool`` and equal to ``t.shapes``, its kind, its alias), the entries
    (op codes, inputs used by each op, buffer indices, then each op's ``check`` on its
    attribute block) and the replay signature (``inputs``, ``outputs``, ``wrt``, names and
    dtypes).
    """
    _check_arrays(t)
    _check_buffers(t)
    _check_entries(t)
    _check_signature(t)


def _check_arrays(t):
    try:
        dtype = np.dtype(t.dtype)
    except TypeError:
        _bad(f"dtype {t.dtype!r} is not a NumPy dtype")
    if dtype not in _FLOATS:
        _bad(f"dtype {dtype}: tapes are float64 or float32")
    for name, cols in (("entries", ENTRY_COLS), ("bufs", BUF_COLS), ("ipool", None)):
        a = getattr(t, name)
        shape = "(n, 6)" if cols else "1-D"
        if (
            not isinstance(a, np.ndarray)
            or a.dtype != np.int64
            or a.ndim != (2 if cols else 1)
            or (cols and a.shape[1] != cols)
        ):
            got = (
                f"{a.dtype} array of shape {a.shape}"
                if isinstance(a, np.ndarray)
                else type(a).__name__
            )
            _bad(f"{name} must be an int64 array of shape {shape}, got {got}")
    d = t.data
    if not isinstance(d, np.ndarray) or d.dtype != dtype or d.ndim != 1:
        got = (
            f"{d.dtype} array of shape {d.shape}" if isinstance(d, np.ndarray) else type(d).__name__
        )
        _bad(f"data must be a 1-D {dtype} array (the tape's dtype), got {got}")
    g = t.grad
    if g is not None and (not isinstance(g, np.ndarray) or g.dtype != dtype or g.shape != d.shape):
        _bad("grad must be None or an array of data's dtype and shape")
    for a in (t.entries, t.bufs, t.ipool, d) + ((g,) if g is not None else ()):
        if not a.flags.c_contiguous:
            _bad("the tape's arrays must be C-contiguous (the compiled sweeps take C arrays)")
    for name, arr in (
        ("n_entries", t.entries),
        ("n_bufs", t.bufs),
        ("n_ipool", t.ipool),
        ("n_data", d),
    ):
        v = getattr(t, name)
        if not _is_index(v) or not 0 <= v <= arr.shape[0]:
            _bad(f"{name} is {v!r}, expected an int in 0..{arr.shape[0]}")


def _first(mask):
    return int(np.flatnonzero(mask)[0])


def _check_buffers(t):
    nb, nd_, np_ = int(t.n_bufs), int(t.n_data), int(t.n_ipool)
    B = t.bufs[:nb]
    off, sz, ndim, sp, kind, alias = (
        B[:, c] for c in (B_OFF, B_SIZE, B_NDIM, B_SHAPE, B_KIND, B_ALIAS)
    )
    # each comparison on its own, so no int64 sum can overflow
    bad = (off < 0) | (sz < 0) | (off > nd_) | (sz > nd_ - off)
    if bad.any():
        b = _first(bad)
        _bad(
            f"buffer {b}: offset {off[b]} and size {sz[b]} do not lie inside the value arena "
            f"of {nd_} elements"
        )
    bad = (ndim < 0) | (ndim > MAX_DIMS)
    if bad.any():
        b = _first(bad)
        _bad(f"buffer {b}: ndim is {ndim[b]}, expected 0..{MAX_DIMS}")
    bad = (sp < 0) | (sp > np_ - ndim)
    if bad.any():
        b = _first(bad)
        _bad(
            f"buffer {b}: its shape at ipool[{sp[b]}:{sp[b]} + {ndim[b]}] is outside ipool "
            f"({np_} ints)"
        )
    bad = ~np.isin(kind, _KINDS)
    if bad.any():
        b = _first(bad)
        _bad(f"buffer {b}: kind {kind[b]}, expected CONST (0), ACTIVE (1) or LEAF (2)")
    _check_aliases(t, B, nb)
    # shapes: blocks are interned, so there are few distinct (position, ndim) pairs
    shapes = t.shapes
    if not isinstance(shapes, list) or len(shapes) != nb:
        n = len(shapes) if isinstance(shapes, list) else type(shapes).__name__
        _bad(f"the shapes list has {n} entries, but the tape has {nb} buffers")
    if nb == 0:
        return
    pairs, first, inv = np.unique(
        np.stack([sp, ndim], 1), axis=0, return_index=True, return_inverse=True
    )
    inv = inv.ravel()
    canon = []
    for (p, n), b in zip(pairs.tolist(), first.tolist()):
        dims_ = tuple(int(v) for v in t.ipool[p : p + n])
        if any(v < 0 for v in dims_):
            _bad(f"buffer {b}: shape {dims_} has a negative extent")
        canon.append(dims_)
    prods = np.array([min(math.prod(c), 1 << 62) for c in canon], np.int64)
    bad = prods[inv] != sz
    if bad.any():
        b = _first(bad)
        _bad(
            f"buffer {b}: shape {canon[inv[b]]} holds {math.prod(canon[inv[b]])} elements, but "
            f"its size is {sz[b]}"
        )
    for b in range(nb):
        s = shapes[b]
        c = canon[inv[b]]
        if type(s) is not tuple or s != c or not all(_is_index(v) for v in s):
            _bad(f"buffer {b}: the shapes list says {s!r}, but the buffer table says {c}")


def _check_aliases(t, B, nb):
    alias = B[:, B_ALIAS]
    idx = np.arange(nb)
    bad = (alias != -1) & ((alias < 0) | (alias >= nb) | (alias == idx))
    if bad.any():
        b = _first(bad)
        _bad(f"buffer {b}: alias {alias[b]}, expected -1 or another buffer's index (0..{nb - 1})")
    views = np.flatnonzero(alias >= 0)
    if views.size == 0:
        return
    root = alias[views]
    bad = B[root, B_ALIAS] != -1
    if bad.any():
        b = int(views[_first(bad)])
        _bad(
            f"buffer {b}: aliases buffer {alias[b]}, which is itself a view (views alias the owner)"
        )
    lo, n = B[views, B_OFF], B[views, B_SIZE]
    r_lo, r_n = B[root, B_OFF], B[root, B_SIZE]
    bad = (lo < r_lo) | (lo - r_lo > r_n - n)
    if bad.any():
        b = int(views[_first(bad)])
        r = int(alias[b])
        _bad(
            f"buffer {b} (offset {B[b, B_OFF]}, size {B[b, B_SIZE]}) views buffer {r}, but does "
            f"not lie inside its memory (offset {B[r, B_OFF]}, size {B[r, B_SIZE]})"
        )


def _check_entries(t):
    ops = _ops()
    ne, nb = int(t.n_entries), int(t.n_bufs)
    E = t.entries[:ne]
    code = E[:, E_OP]
    bad = (code < 0) | (code >= len(ops))
    if bad.any():
        i = _first(bad)
        _bad(f"entry {i}: op code {code[i]}, expected 0..{len(ops) - 1}")
    uses = np.array([op.n_inputs for op in ops], np.int64)[code]
    for k in range(3):
        col = E[:, E_IN0 + k]
        used = uses > k
        bad = used & ((col < 0) | (col >= nb))
        if bad.any():
            i = _first(bad)
            fail(t, i, f"input {k} is buffer {col[i]}, but the tape has {nb} buffers (0..{nb - 1})")
        bad = ~used & (col != -1)
        if bad.any():
            i = _first(bad)
            fail(t, i, f"uses {uses[i]} input(s), but input slot {k} holds {col[i]} instead of -1")
    out = E[:, E_OUT]
    bad = (out < 0) | (out >= nb)
    if bad.any():
        i = _first(bad)
        fail(t, i, f"output is buffer {out[i]}, but the tape has {nb} buffers (0..{nb - 1})")
    attr = E[:, E_ATTR]
    bad = (attr < -1) | (attr > t.n_ipool)
    if bad.any():
        i = _first(bad)
        fail(t, i, f"attribute position {attr[i]}, expected -1 or 0..{t.n_ipool}")
    if ne == 0:
        return
    for op in ops:
        if op.check is None:
            rows = np.flatnonzero(code == op.code)
            if rows.size:
                fail(
                    t,
                    int(rows[0]),
                    "this op has no validation rule, so a tape using it cannot be loaded",
                )
    # Elementwise checks see only the op, its block and the buffer sizes: run them once per
    # distinct combination. Kernel checks may look at more (take reads its index values).
    kernel = np.array([op.kind == "structural" for op in ops])[code]
    todo = np.flatnonzero(kernel).tolist()
    ew = np.flatnonzero(~kernel)
    if ew.size:
        ins = E[ew, E_IN0 : E_OUT + 1]
        sizes = np.where(ins >= 0, t.bufs[np.maximum(ins, 0), B_SIZE], -1)
        keys = np.concatenate([E[ew, E_OP : E_OP + 1], E[ew, E_ATTR : E_ATTR + 1], sizes], 1)
        _, first = np.unique(keys, axis=0, return_index=True)
        todo.extend(ew[first].tolist())
    for i in sorted(todo):
        ops[int(code[i])].check(t, i, E[i])


def _check_signature(t):
    nb = int(t.n_bufs)

    def index_list(name, n, what):
        v = getattr(t, name)
        if not isinstance(v, list) or not all(_is_index(b) and 0 <= b < n for b in v):
            _bad(f"{name} must be a list of {what} (0..{n - 1}), got {v!r:.200}")
        return v

    inputs = index_list("inputs", nb, "buffer indices")
    outputs = index_list("outputs", nb, "buffer indices")
    index_list("wrt", len(inputs), "argument positions")
    names, dtypes = t.input_names, t.input_dtypes
    if (
        not isinstance(names, list)
        or len(names) != len(inputs)
        or not all(isinstance(s, str) for s in names)
    ):
        _bad(
            f"input_names must be a list of {len(inputs)} strings (one per input), "
            f"got {names!r:.200}"
        )
    if not isinstance(dtypes, list) or len(dtypes) != len(inputs):
        _bad(
            f"input_dtypes must be a list of {len(inputs)} dtypes (one per input), "
            f"got {dtypes!r:.200}"
        )
    for k, d in enumerate(dtypes):
        if not isinstance(d, np.dtype) or d.kind not in "biuf":
            _bad(f"input_dtypes[{k}] is {d!r}, expected a numeric NumPy dtype")
    single = t.single_output
    if not isinstance(single, (bool, np.bool_)):
        _bad(f"out_single must be a bool, got {single!r}")
    if single and len(outputs) != 1:
        _bad(f"out_single is set, but the tape has {len(outputs)} outputs")


# ---------------------------------------------------------------- the saved state

_STATE_KEYS = ("entries", "bufs", "ipool", "data", "meta")


def _meta_error(key, want, got):
    raise ValueError(f"invalid tape file: meta[{key!r}] must be {want}, got {got!r:.200}")


def check_state(st, version) -> dict:
    """Check the raw state :meth:`tape.core.Tape._state` makes (arrays and JSON metadata)
    before it is parsed; returns the parsed metadata. ``ValueError`` names what is wrong."""
    if not isinstance(st, Mapping):
        raise ValueError(
            f"invalid tape file: expected a mapping of arrays, got {type(st).__name__}"
        )
    missing = [k for k in _STATE_KEYS if k not in st]
    if missing:
        raise ValueError(f"invalid tape file: missing {', '.join(missing)}")
    try:
        meta = json.loads(str(st["meta"]))
    except ValueError as e:
        raise ValueError(f"invalid tape file: the metadata is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(
            f"invalid tape file: the metadata is a {type(meta).__name__}, not an object"
        )
    if meta.get("version") != version:
        raise ValueError(f"unsupported tape format version {meta.get('version')!r:.50}")
    missing = [k for k in _META_TYPES if k not in meta]
    if missing:
        raise ValueError(f"invalid tape file: the metadata lacks {', '.join(missing)}")
    for key, (want, ok) in _META_TYPES.items():
        if not ok(meta[key]):
            _meta_error(key, want, meta[key])
    dtype = _dtype(meta["dtype"])
    if dtype is None or dtype not in _FLOATS:  # (dtype(None) is float64: test for None first)
        _meta_error("dtype", "'<f8' or '<f4'", meta["dtype"])
    for d in meta["input_dtypes"]:
        if _dtype(d) is None or _dtype(d).kind not in "biuf":
            _meta_error("input_dtypes", "a list of numeric dtypes", meta["input_dtypes"])
    arrays = {}
    for key in ("entries", "bufs", "ipool", "data"):
        a = st[key]
        if not isinstance(a, np.ndarray):
            raise ValueError(f"invalid tape file: {key} is a {type(a).__name__}, not an array")
        want = "f" if key == "data" else "iu"
        if a.dtype.kind not in want:
            raise ValueError(
                f"invalid tape file: {key} has dtype {a.dtype}, expected "
                + ("floats" if key == "data" else "integers")
            )
        shape_ok = (
            a.ndim == 1 if key in ("ipool", "data") else (a.ndim == 2 and a.shape[1] == ENTRY_COLS)
        )
        if not shape_ok:
            want = "1-D" if key in ("ipool", "data") else "(n, 6)"
            raise ValueError(f"invalid tape file: {key} has shape {a.shape}, expected {want}")
        arrays[key] = a
    saved = {int(c) for c in meta["op_names"]}
    codes = np.unique(arrays["entries"][:, E_OP])
    unknown = [int(c) for c in codes if int(c) not in saved]
    if unknown:
        raise ValueError(
            f"invalid tape file: entries use op code {unknown[0]}, which the file's op_names "
            f"({len(saved)} ops) does not list"
        )
    return meta


def _dtype(s):
    """``numpy.dtype(s)``, or ``None`` if ``s`` names no dtype."""
    try:
        return np.dtype(s)
    except (TypeError, ValueError, OverflowError):
        return None


def _list_of(ok):
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


def _json_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _op_names(v) -> bool:
    if not isinstance(v, dict):
        return False
    for k, name in v.items():
        if (
            not isinstance(name, str)
            or not (k.isascii() and k.lstrip("-").isdigit())
            or len(k) > 18
        ):
            return False
    return True


_META_TYPES = {
    "dtype": ("a dtype string", lambda v: isinstance(v, str)),
    "inputs": ("a list of ints", _list_of(_json_int)),
    "input_names": ("a list of strings", _list_of(lambda x: isinstance(x, str))),
    "input_dtypes": ("a list of dtype strings", _list_of(lambda x: isinstance(x, str))),
    "wrt": ("a list of ints", _list_of(_json_int)),
    "outputs": ("a list of ints", _list_of(_json_int)),
    "out_single": ("a bool", lambda v: isinstance(v, bool)),
    "shapes": ("a list of lists of ints", _list_of(_list_of(_json_int))),
    "op_names": ("an object mapping op codes to op names", _op_names),
}


@contextlib.contextmanager
def malformed(what="invalid tape file"):
    """Turn what a malformed saved state makes the parser raise (missing keys, wrong types,
    broken archives) into ``ValueError``; ``ValueError`` and I/O errors pass unchanged."""
    try:
        yield
    except (
        LookupError,
        TypeError,
        AttributeError,
        ArithmeticError,
        RecursionError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
    ) as e:
        raise ValueError(f"{what}: {type(e).__name__}: {e}") from e
