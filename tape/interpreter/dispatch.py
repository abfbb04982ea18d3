"""Dispatch of the interpreter's sweeps through a table of kernel addresses.

The sweeps (:mod:`tape.interpreter.generated.sweeps`) know no op: for entry ``i`` they load the address
of the op's kernel from a table indexed by ``(sweep kind, op code)`` and call it with Numba's
own calling convention (:func:`call_status`, :func:`call_void`), so exceptions raised inside a
kernel propagate. The sweeps therefore compile once per dtype at a fixed cost, whatever the
size of the instruction set, and each op's kernels compile (or load from Numba's cache) on
their own, the first time a tape uses the op: :func:`prepare`.

The tables are one ``int64[N_KINDS, MAX_OPS]`` array per arena dtype, owned by this module.
Compiled code never reads them as a Python global (Numba would freeze this process's addresses
into its on-disk cache); it refers to an external symbol, ``tape_optab_<dtype>``, which this
module binds to the array's memory at import (``llvmlite.binding.add_symbol``), in every
process, before any sweep is compiled or loaded.

A slot holds:

- ``0`` (:data:`NOT_PREPARED`): the op's kernel was not prepared in this process; a sweep that
  reaches such an entry raises ``RuntimeError`` (never runs garbage);
- ``-1`` (:data:`NOTHING`): the op has nothing to do in this sweep (the reverse of an op
  without differentiable inputs); the sweep skips the entry;
- otherwise the address of the compiled kernel, whose signature is fixed per kind
  (:data:`SIGNATURES`): a wrong signature would crash, so the call intrinsics refuse, at
  compile time, arguments of any other type.

Each op has one slot per *entry class* (:data:`NCLS` of them, :func:`entry_class`): how each
input compares with the output (the same size, one element, the whole input to one value, a
row: the output's trailing shape, repeated along its leading axes; a column: the output's
leading shape, each element repeated over a run; other). The sweeps compute an entry's class
from the buffer table and the shapes, so they stay op-agnostic; a slot holds the op's general
kernel, or a kernel generated for that class alone where the op has one (``_fwd_mul_c0``:
equal sizes; ``_fwd_mul_c1``: a one-element first input; ``_fwd_sub_c24``: a second input
that is a row, as a bias; ``_fwd_sub_c30``: a second input that is a column; ``_fwd_sum_c2``:
a full sum). A class kernel has none of the general kernel's other paths, so it compiles in a
fraction of the time: a tape compiles only the paths its entries take.

The compiled tier calls its fused loops the same way: each loop (a unit module's ``unit``,
shared by every tape that has it) gets an id in this process's unit table per dtype
(:func:`register_unit`, symbol ``tape_unittab_<dtype>``), and a compiled tape's pool names the
loop by ``-id`` (:func:`unit_address` range-checks it and refuses an empty slot).
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
import warnings

import llvmlite.binding as ll
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from tape.interpreter import warm as _warm
from tape.layout.calls import compiled_only
from tape.layout.columns import ALL as WHOLE  # ALL: the sweep kinds, below
from tape.layout.columns import (
    B_NDIM,
    B_SHAPE,
    B_SIZE,
    CLASS_BASE,
    COL,
    E_IN0,
    E_IN1,
    E_IN2,
    E_OUT,
    N_CLASSES,
    ONE,
    OTHER,
    ROW,
    SAME_SIZE,
)
from tape.layout.fingerprint import op_fingerprint
from tape.ops.blocks.broadcast import is_col, is_row
from tape.ops.registry import OPS

MAX_OPS = 256
"""Op codes a table has room for (a registry beyond it fails at import)."""

FWD, REV, TAN, HREV = range(4)
N_KINDS = 4
ALL = (FWD, REV, TAN, HREV)
KIND_NAMES = ("fwd", "rev", "tan", "hrev")

NOT_PREPARED = 0
NOTHING = -1
UNPREPARED = -2
"""The status of eager mode's step (``emit``) that found its kernel not prepared."""

DTYPES = (np.dtype(np.float64), np.dtype(np.float32))

_i64 = types.int64
_I2 = types.Array(types.int64, 2, "C")
_I1 = types.Array(types.int64, 1, "C")


def _arena(dt, nd):
    return types.Array(types.float64 if dt == np.float64 else types.float32, nd, "C")


def signature_types(kind, dtype):
    """The argument types of a ``kind`` kernel on arenas of ``dtype`` (after the entry index):
    ``(i, entries, bufs, ipool, data[, grad][, T[, GT]])``."""
    d1, d2 = _arena(dtype, 1), _arena(dtype, 2)
    head = (_i64, _I2, _I2, _I1, d1)
    return {
        FWD: head,
        REV: head + (d1,),
        TAN: head + (d2,),
        HREV: head + (d1, d2, d2),
    }[kind]


RESTYPES = {FWD: types.int64, REV: types.none, TAN: types.none, HREV: types.none}

SIGNATURES = {
    (k, np.dtype(dt)): RESTYPES[k](*signature_types(k, dt)) for k in range(N_KINDS) for dt in DTYPES
}
"""Numba signature of every (kind, dtype) kernel."""

if len(OPS) > MAX_OPS:  # pragma: no cover
    raise RuntimeError(f"{len(OPS)} ops registered; the dispatch tables hold {MAX_OPS}")

# ---------------------------------------------------------------- entry classes

NCLS = N_CLASSES
"""Entry classes (:mod:`tape.layout.columns`): ``c0 + CLASS_BASE * c1 + CLASS_BASE**2 * c2``
for the classes ``ck`` of inputs 0, 1, 2."""


_CLASS_BASE2 = CLASS_BASE * CLASS_BASE


@njit(inline="always")
def _size_class(bufs, b, n):
    """The class of input buffer ``b`` of an entry whose output has ``n`` elements, by their
    sizes: OTHER stands for rows and columns too (:func:`_shape_class`)."""
    if b < 0:
        return SAME_SIZE
    s = bufs[b, B_SIZE]
    if s == n:
        return SAME_SIZE
    if n == 1:
        return WHOLE
    if s == 1:
        return ONE
    return OTHER


@compiled_only
def _shape_class(bufs, ipool, b, o):
    """ROW if input ``b`` (of more than one element, fewer than output ``o``) is a row of
    the output: its last axes, as many as hold its elements, are the output's last axes (its
    other axes are units); COL if it is a column: its axes, padded with leading unit axes to
    the output's, as many as hold its elements, are the output's first axes; else OTHER
    (checked tapes: the shapes lie in ``ipool``). Compiled once and called only for the
    inputs that sizes alone leave OTHER: inlined into :func:`entry_class`, its loops cost
    the sweeps 0.8 s more to compile, and a call for every entry 20% more time per entry."""
    s = bufs[b, B_SIZE]  # > 1, so no axis of b is 0
    nb = bufs[b, B_NDIM]
    pb = bufs[b, B_SHAPE]
    no = bufs[o, B_NDIM]
    po = bufs[o, B_SHAPE]
    p = 1
    j = 1
    while p < s and j <= nb and j <= no and ipool[pb + nb - j] == ipool[po + no - j]:
        p *= ipool[pb + nb - j]
        j += 1
    if p == s:
        return ROW
    if nb > no:
        return OTHER
    p = 1
    k = 0
    while p < s and k < no:
        d = ipool[pb + k - (no - nb)] if k >= no - nb else 1
        if d != ipool[po + k]:
            return OTHER
        p *= d
        k += 1
    return COL if p == s else OTHER


@njit(inline="always")
def entry_class(entries, bufs, ipool, i):
    """The class of entry ``i`` (``0 .. NCLS-1``), from its buffers' sizes and shapes alone."""
    o = entries[i, E_OUT]
    if o < 0:
        return 0
    n = bufs[o, B_SIZE]
    c0 = _size_class(bufs, entries[i, E_IN0], n)
    c1 = _size_class(bufs, entries[i, E_IN1], n)
    c2 = _size_class(bufs, entries[i, E_IN2], n)
    if c0 == OTHER:
        c0 = _shape_class(bufs, ipool, entries[i, E_IN0], o)
    if c1 == OTHER:
        c1 = _shape_class(bufs, ipool, entries[i, E_IN1], o)
    if c2 == OTHER:
        c2 = _shape_class(bufs, ipool, entries[i, E_IN2], o)
    return c0 + CLASS_BASE * c1 + _CLASS_BASE2 * c2


@njit(cache=True, nogil=True)
def entry_classes(entries, bufs, ipool, rows):
    """:func:`entry_class` of the entries ``rows`` (an int array), as an int64 array (compiled:
    eager ``backward`` asks for every entry's class at each step)."""
    cls = np.empty(rows.shape[0], np.int64)
    for j in range(rows.shape[0]):
        cls[j] = entry_class(entries, bufs, ipool, rows[j])
    return cls


def _shape(bufs, ipool, b):
    p, nd = int(bufs[b, B_SHAPE]), int(bufs[b, B_NDIM])
    return ipool[p : p + nd].tolist()


def classes_of(entries, bufs, ipool, rows):
    """:func:`entry_class` of the entries ``rows`` (an int array), as an int64 array, computed
    with NumPy: for the Python paths that need the classes once (a tape's preparation, a
    recording's entries from an empty cache), where compiling :func:`entry_classes` would
    cost more than it saves. ``tests/test_eager_paths.py`` checks that the two agree."""
    rows = np.asarray(rows, np.int64)
    out = entries[rows, E_OUT]
    n = np.where(out >= 0, bufs[np.maximum(out, 0), B_SIZE], 0)
    cls = np.zeros(rows.shape[0], np.int64)
    for k, col in enumerate((E_IN0, E_IN1, E_IN2)):
        b = entries[rows, col]
        s = bufs[np.maximum(b, 0), B_SIZE]
        c = np.where(n == 1, WHOLE, np.where(s == 1, ONE, OTHER))
        c = np.where((b < 0) | (s == n), SAME_SIZE, c)
        for j in np.flatnonzero((c == OTHER) & (out >= 0)):  # rows, columns, other broadcasts
            shape, of = _shape(bufs, ipool, b[j]), _shape(bufs, ipool, out[j])
            c[j] = ROW if is_row(shape, of) else COL if is_col(shape, of) else OTHER
        cls += CLASS_BASE**k * c
    return np.where(out >= 0, cls, 0)


TABLES = {dt: np.zeros((N_KINDS, MAX_OPS * NCLS), np.int64) for dt in DTYPES}
"""The address tables, per arena dtype: slot ``(kind, op * NCLS + class)`` (see the module
docstring)."""
_FULL = {dt: np.zeros((N_KINDS, MAX_OPS), bool) for dt in DTYPES}
"""Per dtype, ``(kind, op)``: every class slot of the op is filled."""


def _symbol(dtype) -> str:
    return f"tape_optab_{np.dtype(dtype).name}"


for _dt, _tab in TABLES.items():
    ll.add_symbol(_symbol(_dt), _tab.ctypes.data)

_LOCK = threading.Lock()
_FUNCS: dict = {}  # (kind, code, name, dtype) -> a dispatcher whose address sits in the table


# ---------------------------------------------------------------- compiled side


def _reader(symbol_of, size, what):
    """An intrinsic ``read(row, col, data)``: element ``row * width + col`` of the external
    int64 table ``symbol_of(dtype)`` (``size`` elements) of ``data``'s dtype. Indices are the
    caller's to range-check."""
    width = size[1]

    def read(typingctx, row, col, data):
        if not isinstance(data, types.Array) or data.dtype not in (types.float64, types.float32):
            raise TypingError(f"tape {what}: arena of type {data} is not a float64/float32 array")
        name = symbol_of(str(data.dtype))

        def codegen(context, builder, sig, args):
            r = context.cast(builder, args[0], sig.args[0], types.int64)
            c = context.cast(builder, args[1], sig.args[1], types.int64)
            mod = builder.module
            gv = mod.globals.get(name)
            if gv is None:
                gv = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(64), size[0] * width), name)
                gv.linkage = "external"
            idx = builder.add(builder.mul(r, ir.Constant(ir.IntType(64), width)), c)
            ptr = builder.gep(gv, [ir.Constant(ir.IntType(64), 0), idx])
            return builder.load(ptr)

        return types.int64(row, col, data), codegen

    read.__name__ = f"read_{what.replace(' ', '_')}"
    return intrinsic(read)


slot = _reader(_symbol, (N_KINDS, MAX_OPS * NCLS), "sweeps")
"""``slot(kind, key, data)``: table entry ``(kind, key)`` (``key = op * NCLS + class``) of the
table of ``data``'s dtype (``key`` range-checked by the caller)."""


def _fits(got, want):
    """An argument of type ``got`` passes where a compiled function takes ``want`` (an index
    of any integer type, a flag of any boolean type; arrays exactly)."""
    if got == want:
        return True
    if want == types.int64:
        return isinstance(got, types.Integer)
    return want == types.boolean and isinstance(got, types.Boolean)


def _caller(what, restype, want_of, data_at):
    """An intrinsic ``call(addr, args)`` that calls the compiled function at ``addr`` with the
    tuple ``args``, with Numba's calling convention (its exceptions propagate). The function
    takes ``want_of(dtype)`` for arenas of ``dtype`` (the array at ``data_at``) and returns
    ``restype``; other argument types are refused at compile time (a call would crash)."""

    def call(typingctx, addr, args):
        got = tuple(args.types) if isinstance(args, types.BaseTuple) else (args,)
        data = got[data_at] if len(got) > data_at else None
        ok = isinstance(data, types.Array) and data.dtype in (types.float64, types.float32)
        want = want_of(np.dtype(str(data.dtype)) if ok else np.float64)
        if not (
            ok
            and len(got) == len(want)
            and all(_fits(g, w) for g, w in zip(got, want))
            and isinstance(addr, types.Integer)
        ):
            raise TypingError(
                f"tape sweeps: a {what} takes {want}, got {got} (the sweeps need "
                "C-contiguous, writable int64 tape arrays and float64 or float32 arenas)"
            )

        def codegen(context, builder, sig, llargs):
            vals = list(cgutils.unpack_tuple(builder, llargs[1], len(got)))
            vals = [context.cast(builder, v, g, w) for v, g, w in zip(vals, got, want)]
            fnty = context.call_conv.get_function_type(restype, want)
            fn = builder.inttoptr(llargs[0], fnty.as_pointer())
            status, res = context.call_conv.call_function(builder, fn, restype, want, vals)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return res if restype != types.none else context.get_dummy_value()

        return restype(addr, args), codegen

    call.__name__ = f"call_{what.replace(' ', '_')}"
    return intrinsic(call)


def _make(kind):
    return _caller(
        f"{KIND_NAMES[kind]} kernel", RESTYPES[kind], lambda dt: signature_types(kind, dt), 4
    )


call_fwd = _make(FWD)
"""``call_fwd(addr, (i, entries, bufs, ipool, data)) -> status``."""
call_rev = _make(REV)
"""``call_rev(addr, (i, entries, bufs, ipool, data, grad))``."""
call_tan = _make(TAN)
"""``call_tan(addr, (i, entries, bufs, ipool, data, T))``."""
call_hrev = _make(HREV)
"""``call_hrev(addr, (i, entries, bufs, ipool, data, grad, T, GT))``."""


# ---------------------------------------------------------------- compiled tier's units

UNIT_CAP = 1 << 16
"""Fused loops (per dtype) a process can register (see :func:`register_unit`)."""

UNIT_TABLES = {dt: np.zeros(UNIT_CAP, np.int64) for dt in DTYPES}
"""Addresses of the compiled tier's shared fused loops, per arena dtype, by unit id (0: none).
A compiled tape's unit table (in its integer pool) names a loop by ``-id``; like the kernel
tables, compiled code reads them only through the external symbol ``tape_unittab_<dtype>``."""


def _unit_symbol(dtype) -> str:
    return f"tape_unittab_{np.dtype(dtype).name}"


for _dt, _tab in UNIT_TABLES.items():
    ll.add_symbol(_unit_symbol(_dt), _tab.ctypes.data)


def unit_signature_types(rev, dtype):
    """The argument types of a fused loop on arenas of ``dtype``: ``(data, P)``, reverse ones
    ``(data, grad, P, zl)`` (each array argument is several machine arguments in Numba's
    calling convention: a call through an address passes only what the loops read)."""
    d1 = _arena(dtype, 1)
    return (d1, d1, _I1, types.boolean) if rev else (d1, _I1)


_unit_slot = _reader(_unit_symbol, (1, UNIT_CAP), "units")

call_unit_fwd = _caller(
    "forward fused loop", types.none, lambda dt: unit_signature_types(False, dt), 0
)
"""``call_unit_fwd(addr, (data, P))``."""
call_unit_rev = _caller(
    "reverse fused loop", types.none, lambda dt: unit_signature_types(True, dt), 0
)
"""``call_unit_rev(addr, (data, grad, P, zl))``."""


@njit(inline="always")
def unit_address(uid, data):
    """The address of fused loop ``uid`` for arenas like ``data``: range-checked, and never
    that of a loop this process did not register."""
    if uid <= 0 or uid >= UNIT_CAP:
        raise ValueError(
            "compiled tape: a unit table names no fused loop (kernel arguments taken in "
            "another process, or changed)"
        )
    a = _unit_slot(0, uid, data)
    if a == 0:
        raise RuntimeError(
            "compiled tape: a fused loop this process has not compiled for this dtype (kernel "
            "arguments taken in another process)"
        )
    return a


_UNITS: dict = {}  # (dispatcher, rev, dtype) -> unit id; keeps the dispatchers alive


def register_unit(fn, rev, dtype) -> int:
    """Compile (or load from Numba's cache) fused loop ``fn`` (a unit module's ``unit``) for
    arenas of ``dtype``, put its address in the unit table and return its id (the same id
    for the same loop every time in a process)."""
    dt = np.dtype(dtype)
    key = (fn, bool(rev), dt)
    uid = _UNITS.get(key)
    if uid is not None:
        return uid
    with _LOCK:
        uid = _UNITS.get(key)
        if uid is not None:
            return uid
        uid = len(_UNITS) + 1
        if uid >= UNIT_CAP:
            raise RuntimeError(f"tape: more than {UNIT_CAP - 1} fused loops in one process")
        sig = types.none(*unit_signature_types(rev, dt))
        UNIT_TABLES[dt][uid] = _address(fn, sig, "the compiled tier's fused loops")
        _UNITS[key] = uid
        return uid


# ---------------------------------------------------------------- Python side


def op_module(code):
    """The generated module of op ``code`` (imported on first use; a warning if it is stale:
    an op rule changed and ``python -m tape.interpreter.codegen`` was not run)."""
    op = OPS[code]
    mod = importlib.import_module(f"tape.interpreter.generated.ops.{op.name}")
    if code not in _CHECKED:
        _CHECKED.add(code)
        try:
            fresh = mod.FINGERPRINT == op_fingerprint(op)
        except OSError:  # sources not readable (a zipped install): nothing to compare
            fresh = True
        if not fresh:
            warnings.warn(
                f"tape's generated module of op {op.name!r} is stale (its rules changed): run "
                "`python -m tape.interpreter.codegen`",
                stacklevel=3,
            )
    return mod


_CHECKED: set = set()


def function(kind_name, code, cls=None):
    """The compiled per-op function of op ``code`` for sweep kind ``kind_name`` (``fwd``,
    ``rev``, ``tan``, ``hrev``): the kernel generated for entry class ``cls``
    (``_<kind_name>_<op>_c<cls>``) where the op has one, else the general kernel
    ``_<kind_name>_<op>``; ``None`` when the op has none."""
    mod = op_module(code)
    name = f"_{kind_name}_{OPS[code].name}"
    if cls is not None:
        fn = getattr(mod, f"{name}_c{cls}", None)
        if fn is not None:
            return fn
    return getattr(mod, name, None)


def class_kernel(kind, code, cls, dtype):
    """The kernel that runs op ``code``'s entries of class ``cls`` in sweep ``kind`` on arenas
    of ``dtype``: the class's own kernel or the op's general kernel, which runs them too, with
    the same numbers (the tests compare them bit for bit), whichever is cheaper to have: one
    this process has compiled or loaded, else one in Numba's cache, else the class's own
    (the faster compile). ``None`` when the op has no ``kind`` kernel."""
    general = function(KIND_NAMES[kind], code)
    own = function(KIND_NAMES[kind], code, cls)
    if own is general:
        return own
    sig = SIGNATURES[(kind, np.dtype(dtype))].args
    for have in (lambda f: sig in f.overloads, lambda f: _cached(f, sig)):
        for fn in (own, general):
            if have(fn):
                return fn
    return own


def _cached(fn, sig) -> bool:
    """Whether Numba's on-disk cache holds dispatcher ``fn`` compiled for argument types
    ``sig`` (a load, not a compile)."""
    try:
        cache = fn._cache
        return cache._index_key(sig, fn.targetctx.codegen()) in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001  (caching off, another Numba: as if not cached)
        return False


class Kernel:
    """An op's kernel ``fn`` of sweep kind ``kind``, callable from Python with the kernel's
    own arguments (``k(i, entries, bufs, ipool, data, ...)``, the tape's C-ordered arrays).
    The kernels compile without an entry for Python callers
    (:func:`tape.layout.calls.compiled_only`), so the call goes through the sweeps'
    ``fwd_at`` / ``rev_at`` / ``tan_at`` / ``hrev_at`` with the kernel's address for the
    arena's dtype (compiled, or loaded from Numba's cache, at the first call for it)."""

    __slots__ = ("fn", "kind", "_at")

    def __init__(self, fn, kind):
        self.fn = fn
        self.kind = kind
        self._at = {}

    def __call__(self, i, entries, bufs, ipool, data, *rest):
        dt = data.dtype
        a = self._at.get(dt)
        if a is None:
            sig = SIGNATURES.get((self.kind, dt))
            if sig is None:
                raise TypeError(f"tape: arenas are float64 or float32, not {dt}")
            a = self._at[dt] = _address(self.fn, sig, "Python's calls")
        return _trampolines()[self.kind](a, i, entries, bufs, ipool, data, *rest)

    def __repr__(self):
        return f"Kernel({self.fn.__name__}, {KIND_NAMES[self.kind]})"


@functools.cache
def _trampolines():
    from tape.interpreter.generated import sweeps  # (it imports this module)

    return (sweeps.fwd_at, sweeps.rev_at, sweeps.tan_at, sweeps.hrev_at)


class PerOp:
    """``table[code]``: one kind of per-op function (the op's general kernel, as a
    :class:`Kernel`, callable from Python), looked up (and its module imported) on first use.
    Eager mode's per-entry paths and the per-entry checks call these."""

    def __init__(self, kind_name):
        self.kind_name = kind_name
        self.kind = KIND_NAMES.index(kind_name)
        self._fns = [False] * len(OPS)

    def __getitem__(self, code):
        fn = self._fns[code]
        if fn is False:
            fn = function(self.kind_name, code)
            fn = self._fns[code] = None if fn is None else Kernel(fn, self.kind)
        return fn

    def __len__(self):
        return len(OPS)


def prepare(codes, dtype, kinds=(FWD, REV), meanwhile=None, speculate=True, also=(),
            classes=None):  # fmt: skip
    """Compile (or load from Numba's cache) the kernels of the ops ``codes`` for arenas of
    ``dtype`` and every sweep kind in ``kinds``, and put their addresses in the table. Cheap
    when they are already there. Call it before a sweep runs an entry of these ops (the
    replay methods, ``t.workspace()`` and ``t.kernel_args()`` do).

    ``classes`` (one entry class per code, :func:`entry_class`): prepare those classes'
    slots, with the kernel generated for the class where the op has one
    (:func:`class_kernel`). Without it, the op's general kernel fills every class slot still
    empty (it runs entries of any class).

    Kernels missing from Numba's cache compile partly in helper processes
    (:mod:`tape.interpreter.warm`): once one of the list compiles, the rest goes to the helpers and this
    process works from the other end; a kernel that another process is compiling is loaded
    from the cache when that one is done (``meanwhile()``, if given, runs before that wait:
    other work to compile). ``speculate``: a forward kernel that compiled hands the op's
    reverse kernel to a helper (:data:`tape.interpreter.warm.SPECULATE`); ``also``: other jobs a helper
    takes then (the compiled tier's runtime, for a recording that will compile)."""
    dt = np.dtype(dtype)
    tab = TABLES.get(dt)
    if tab is None:
        raise TypeError(f"tape: arenas are float64 or float32, not {dt}")
    full = _FULL[dt]
    if classes is None:
        want = [(k, int(c), None) for k in kinds for c in codes if 0 <= c < len(OPS)]
        todo = [x for x in want if not full[x[0], x[1]]]
    else:
        want = [
            (k, int(c), int(q)) for k in kinds for c, q in zip(codes, classes)
            if 0 <= c < len(OPS) and 0 <= q < NCLS
        ]  # fmt: skip
        todo = [x for x in want if tab[x[0], x[1] * NCLS + x[2]] == 0]
    if not todo:
        return
    with _LOCK:
        groups: dict = {}  # (kind, code, job class) -> slots to fill with that kernel
        for k, c, q in dict.fromkeys(todo):
            fn = function(KIND_NAMES[k], c) if q is None else class_kernel(k, c, q, dt)
            if fn is None:
                tab[k, c * NCLS : (c + 1) * NCLS] = NOTHING
                full[k, c] = True
                continue
            own = fn is not function(KIND_NAMES[k], c)
            g = groups.setdefault((k, c, q if own else None), [fn, set()])
            g[1].add(q)
        pending = [(k, c, q, fn, slots) for (k, c, q), (fn, slots) in groups.items()]
        if pending and speculate and _warm.compile_helpers() > 0:
            speculate_driver(dt)

        def speculate_after(x):  # a forward kernel compiled: a helper takes the reverse one
            k, c, q = x[:3]
            for k2 in _warm.SPECULATE.get(k, ()) if speculate else ():
                fn = function(KIND_NAMES[k2], c) if q is None else class_kernel(k2, c, q, dt)
                if tab[k2, c * NCLS + (q or 0)] == 0 and fn is not None:
                    own = fn is not function(KIND_NAMES[k2], c)
                    _warm.submit([_warm.op_job(k2, c, dt, q if own else None)])
            if also:
                _warm.submit(also)

        _warm.compile_all(
            pending, lambda x: _warm.op_job(x[0], x[1], dt, x[2]),
            lambda x: _fill(tab, x[0], x[1], x[3], x[4], dt), speculate_after, meanwhile,
        )  # fmt: skip


def compile_kernel(kind, code, dtype, cls=None):
    """Compile op ``code``'s kernel of sweep ``kind`` (for entry class ``cls``, or the
    general one) for ``dtype`` into Numba's cache (or find it there), without touching this
    process's table (a helper process's work)."""
    dt = np.dtype(dtype)
    fn = function(KIND_NAMES[kind], code, cls)
    if fn is not None:
        fn.compile(SIGNATURES[(kind, dt)].args)


def serve_helper():
    """A helper process of :mod:`tape.interpreter.warm`: build the jobs named on standard input."""

    def op(dtype, rest):
        kind, code, *cls = (int(v) for v in rest.split(":"))
        compile_kernel(kind, code, dtype, cls[0] if cls else None)

    _warm.serve({**_warm.HANDLERS, "op": op})


def _address(fn, sig, who):
    """Compile (or load from Numba's cache) dispatcher ``fn`` for the argument types of
    ``sig`` and return the address of the compiled function; refused if it returns another
    type than ``sig`` says (``who`` calls it expecting that: a call would crash)."""
    # by the argument types alone: the key eager mode's calls compile and cache under
    fn.compile(sig.args)
    cres = fn.overloads[sig.args]
    if cres.signature.return_type != sig.return_type:
        raise TypeError(
            f"tape: {fn.__name__} returns {cres.signature.return_type}, {who} expect "
            f"{sig.return_type}"
        )
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)


def _fill(tab, k, c, fn, slots, dt):
    """Put ``fn``'s address in the class slots ``slots`` of op ``c`` in sweep ``k`` (``None``
    among them: every empty slot of the op); returns whether Numba compiled it (it was not in
    the cache)."""
    misses = sum(fn.stats.cache_misses.values())
    addr = _address(fn, SIGNATURES[(k, dt)], f"the {KIND_NAMES[k]} sweeps")
    _FUNCS[(k, c, fn.__name__, dt)] = fn
    row = tab[k, c * NCLS : (c + 1) * NCLS]
    for q in slots:
        if q is None:
            row[row == NOT_PREPARED] = addr
            _FULL[dt][k, c] = True
        else:
            row[q] = addr
    return sum(fn.stats.cache_misses.values()) > misses


def prepare_tape(t, kinds=(FWD, REV), dtype=None, meanwhile=None):
    """:func:`prepare` the ops of tape ``t`` (its recorded entries, by entry class) for its
    arena dtype."""
    n = t.n_entries
    ops = t.entries[:n, 0]
    rows = np.flatnonzero(ops >= 0)
    keys = np.unique(ops[rows] * NCLS + classes_of(t.entries, t.bufs, t.ipool, rows))
    prepare(
        keys // NCLS, t.dtype if dtype is None else dtype, kinds, meanwhile, classes=keys % NCLS
    )


def precompile(fn, args):
    """Compile dispatcher ``fn`` (or load it from Numba's cache) for the types of ``args``,
    as a call would, without calling it."""
    fn.compile(tuple(fn.typeof_pyval(a) for a in args))


# ---------------------------------------------------------------- the gradient driver, early
# ``forward_backward`` (what ``t.gradient`` and ``t.value_and_grad`` call) knows no op, so in a
# process whose cache lacks it a helper can compile it while this process records: the first
# op kernel that is not in the cache hands it over (:func:`speculate_driver`), and the replay
# then loads it (:func:`precompile_driver`) instead of compiling it after the recording.


def driver_job(dtype) -> str:
    """The helper job of the interpreter's ``forward_backward`` for arenas of ``dtype``."""
    return f"driver {np.dtype(dtype).name} forward_backward"


def _driver_args(dtype):
    """Arguments of the types a replay passes ``forward_backward`` (only their types count)."""
    i2 = np.zeros((1, 1), np.int64)
    i1 = np.zeros(1, np.int64)
    d = np.zeros(1, dtype)
    return (i2, i2, i1, d, d, 1, 1, i1, d, True)


def _sweeps():
    from tape.interpreter.generated import sweeps

    return sweeps


_DRIVER_SENT: set = set()


def speculate_driver(dtype):
    """Hand the gradient driver of ``dtype`` to a helper, once per process and only where
    Numba's cache has no entry of it yet (a process that compiles op kernels from an empty
    cache will compile it too)."""
    dt = np.dtype(dtype)
    if dt in _DRIVER_SENT:
        return
    _DRIVER_SENT.add(dt)
    try:
        cached = os.path.exists(_sweeps().forward_backward._cache._cache_file._index_path)
    except AttributeError:  # no cache (caching off) or another Numba: nothing to hand over
        return
    if not cached:
        _warm.submit([driver_job(dt)])


def precompile_driver(sw, args, wait):
    """Compile ``sw.forward_backward`` for ``args`` (or load it from Numba's cache). For the
    interpreter's sweeps, under the job's lock: where a helper is compiling it, wait for it
    (``wait``) or return ``False`` at once and let a later call load it."""
    sweeps = _sweeps()
    if sw is not sweeps:
        if hasattr(sw.forward_backward, "compile"):  # a compiled tape's (callbacks: Python)
            precompile(sw.forward_backward, args)
        return True
    dt = np.dtype(args[3].dtype)
    done = _warm.locked(
        driver_job(dt), lambda: precompile(sweeps.forward_backward, args) or True, wait
    )
    return done is not None


def _build_driver(dtype, name):
    if name == "forward_backward":
        precompile(_sweeps().forward_backward, _driver_args(np.dtype(dtype)))


_warm.register("driver", _build_driver)


def prepared(kind, code, dtype, cls=0) -> bool:
    """Whether table slot ``(kind, code)`` of ``dtype``, entry class ``cls``, is filled in
    this process."""
    return TABLES[np.dtype(dtype)][kind, code * NCLS + cls] != NOT_PREPARED
