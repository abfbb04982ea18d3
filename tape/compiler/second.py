"""Forward mode and forward-over-reverse on the compiled tier: the tangent sweep and the
Hessian-vector product pass generated for one tape, with the gradient's fusion.

The derivative drivers (:mod:`tape.transforms.derivatives`) replay the forward sweep on the
interpreter, which writes every entry's value, then run the interpreter's ``tangent_sweep`` and
``hvp_pass``: a pass over the arena per entry and direction. For a compiled tape they run the
passes made here instead, with the same contracts:

- the tangent sweep (:meth:`Passes.tangent`): the tangents of the outputs (and of every value
  a later unit reads) for each direction (row) of ``T``, the arguments' tangents seeded and
  ``T`` zero elsewhere, as :func:`tape.interpreter.generated.sweeps.tangent_sweep` over the
  whole tape. Tangents of values a fused loop keeps in registers are not written.
- forward-over-reverse (:meth:`Passes.hvp`), as ``hvp_pass``: the reverse pass seeded with
  ``seeds`` (the adjoints in ``grad``), the tangent sweep of ``T`` and the tangent of the
  reverse pass (the tangent adjoints ``GT``, one arena per direction). ``GT`` and ``grad`` are
  zeroed where they are read (the arguments among them), not whole. Only the adjoints that a
  second-order term reads are computed (:func:`adjoints_read`): the reverse rules of the
  linear parts between the arguments and the first nonlinear entry do not run.

The units are the compiled tier's (:class:`tape.compiler.analyse.Plan`): a fused group of
elementwise entries is one loop over its elements per direction, with tangents and adjoints in
registers; only values read outside the loop go through ``T``, ``grad`` and ``GT``. Values the
compiled forward stores are loaded and the others computed again, so ``data`` may come from
the compiled forward or the interpreter's (which writes every value). An entry the tier does
not fuse runs the interpreter's kernels for its op through the dispatch table, as in the
compiled gradient. The rules are the op registry's: ``tangent = sum_k masked(r_k(x, y, t_k),
t_k)`` and, for the tangent adjoint of input ``k``, ``masked(r_k(x, y, gt_y), gt_y) + g_y *
sum_j H_kj t_j`` (:mod:`tape.ops.loops`), so the numbers are the interpreter's to rounding.

A tape's module holds its fused loops alone, with their offsets written in (named by its
text, cached by Numba beside it); each loop compiles on its own and is called through its
address by two generic drivers (:func:`tangent_pass`, :func:`hvp_pass`) that read the tape's
tables, so no code of the tape's is compiled twice into a caller (a driver that called the
loops directly compiled for 26 s on GMM's 15 groups, the loops themselves in 11 s). Tapes
with more than :data:`MAX_GROUPS` fused groups, and tapes with Python callbacks, keep the
interpreter's drivers.
"""

from __future__ import annotations

import re
import threading
from typing import NamedTuple

import numpy as np
from numba import njit, types

from tape.compiler.analyse import CALLBACK_OP, Call, Group, Plan
from tape.compiler.cache import load_module
from tape.compiler.emit import Gen, rule_names
from tape.compiler.params import BLOCK, BLOCK_MIN
from tape.interpreter import dispatch as _dispatch
from tape.interpreter.generated import sweeps as interp_sweeps
from tape.layout.calls import array_type, entry_point
from tape.layout.columns import ACTIVE, B_ALIAS, B_KIND, B_OFF, B_SIZE, CONST, E_OUT
from tape.layout.config import SWEEP_JIT
from tape.layout.views import borrow as _borrow
from tape.layout.views import span as _span
from tape.layout.views import table as _table
from tape.ops.registry import LINEAR

MAX_GROUPS = 256
"""Fused groups beyond which a tape's derivative drivers stay on the interpreter: the module
is a function per group with its offsets written in, and Numba's compile time grows with it."""

_LOCK = threading.Lock()

OPAQUE_MIN = 8
"""Rows (or flat loops) from this many elements on get a bound the optimiser cannot see in
the vector-mode tangent loops (:func:`tape.compiler.emit.opaque`), so that they vectorise;
shorter ones are unrolled (into scalar code), which costs them less than the vector code's
runtime checks."""

_AT_J = re.compile(r"\b(\w+)\[j\]")
"""Element ``j`` of a view in a loop's text."""

_HESS_AT = {1: {(0, 0): 0}, 2: {(0, 0): 0, (0, 1): 1, (1, 0): 1, (1, 1): 2}}
"""Arity -> ``(k, j)`` -> the index in ``Op.hess`` of the second partial ``H_kj`` (upper
triangle, row by row)."""


def derivative_module(t):
    """The derivative passes (:class:`Passes`) of compiled tape ``t``, made (and compiled) on
    first use, or ``None`` where the interpreter's drivers run instead (see the module
    docstring)."""
    st = t.extensions()
    if "second" in st:
        return st["second"]
    with _LOCK:
        if "second" not in st:
            g = generate(t)
            st["second"] = None if g is None else Passes(g, t.dtype)
    return st["second"]


class Passes:
    """One tape's generated fused loops, their addresses, and the program the generic
    drivers (:func:`tangent_pass`, :func:`hvp_pass`) run them by. The drivers compile once
    per process and dtype (and load from Numba's cache after that), whatever the tape: a
    tape's own code is its fused loops, each compiled on its own."""

    def __init__(self, g, dtype):
        self.module = load_module(g.source, "tape_second")
        d1, d2 = _dispatch._arena(dtype, 1), _dispatch._arena(dtype, 2)
        tan_sig, hrev_sig = types.none(d1, d2), types.none(d1, d1, d2, d2)
        who = "the derivative passes' fused loops"
        self.addr = np.array(
            [_dispatch._address(getattr(self.module, n), tan_sig, who) for n in g.tan_units]
            + [_dispatch._address(getattr(self.module, n), hrev_sig, who) for n in g.hrev_units]
            + [0], np.int64)  # fmt: skip
        rev = g.rev_rows.copy()
        rev[rev[:, 0] == 0, 1] += len(g.tan_units)  # one address table for both kinds
        parts = (g.zero, g.roots, g.tan_rows, rev)
        self.prog = np.concatenate(
            [np.array([len(x) for x in parts] + [len(g.tan_rows) - g.sums], np.int64)]
            + [x.ravel() for x in parts]
        )
        """The program: ``[n_zero, n_roots, n_tan, n_rev, n_tan_hvp]``, then the zero ranges
        (``[offset, size]``), the roots (``[offset, size]``, seeded in this order), the tangent
        rows and the reverse rows (``[what, a, b]``: a fused loop at ``addr[a]`` (``what`` 0),
        or entry ``b`` of op ``a`` through the interpreter's table: its reverse and
        tangent-of-reverse kernels (``what`` 1), or the latter alone where no rule reads the
        adjoints the former would make (``what`` 2: :func:`adjoints_read`)). Forward-over-reverse
        runs the first ``n_tan_hvp`` tangent rows: not those of the final sums that its
        reverse loops take (:meth:`tape.compiler.emit.Gen.sum_in_reverse`), whose tangents
        nothing reads."""
        self.TABLE_CALLS = g.calls
        self.source = g.source
        self._many_units, self._tan_sig, self._many = g.many_units, tan_sig, None

    def addresses(self, k):
        """The address table for ``k`` directions: for more than one, the tangent loops'
        vector-mode versions (compiled on first use: a Jacobian's or a Hessian's)."""
        if k == 1:
            return self.addr
        if self._many is None:
            with _LOCK:
                if self._many is None:
                    who = "the derivative passes' fused loops"
                    many = [_dispatch._address(getattr(self.module, n), self._tan_sig, who)
                            for n in self._many_units]  # fmt: skip
                    a = self.addr.copy()
                    a[: len(many)] = many
                    self._many = a
        return self._many

    def tangent(self, entries, bufs, ipool, data, T):
        """The tangent sweep (``tangent_sweep``'s contract over the whole tape)."""
        tangent_pass(entries, bufs, ipool, data, T, self.prog, self.addresses(T.shape[0]))

    def hvp(self, entries, bufs, ipool, data, grad, T, GT, seeds):
        """Forward-over-reverse (``hvp_pass``'s contract)."""
        hvp_pass(entries, bufs, ipool, data, grad, T, GT, seeds, self.prog,
                 self.addresses(T.shape[0]))  # fmt: skip

    def one_call(self, t, off, seeds, k=None):
        """The HVP (and JVP) of compiled tape ``t`` (whose derivative passes these are) in one
        compiled call (:class:`OneCall`), for its one argument, at arena offset ``off``;
        ``seeds``: the output's adjoint. With ``k``, its dense Hessian or forward-mode
        Jacobian in one call, ``k`` directions per pass."""
        return OneCall(t, self, off, seeds, k)


_call_tan = _dispatch._caller(
    "tangent fused loop", types.none,
    lambda dt: (_dispatch._arena(dt, 1), _dispatch._arena(dt, 2)), 0,
)  # fmt: skip
"""``_call_tan(addr, (data, T))``: a tangent loop of a tape's module."""
_call_hrev = _dispatch._caller(
    "forward-over-reverse fused loop", types.none,
    lambda dt: (_dispatch._arena(dt, 1),) * 2 + (_dispatch._arena(dt, 2),) * 2, 0,
)  # fmt: skip
"""``_call_hrev(addr, (data, grad, T, GT))``: a tangent-of-reverse loop of a tape's module."""


_HEAD = 5
"""The length of :attr:`Passes.prog`'s header."""


@njit(**SWEEP_JIT)
def tangent_pass(entries, bufs, ipool, data, T, prog, addr):
    """Run the tangent rows of ``prog`` (see :attr:`Passes.prog`) in order: fused loops
    through their addresses, other entries through the interpreter's tangent kernels.
    Writes ``T``."""
    _tangent_rows(entries, bufs, ipool, data, T, prog, addr, prog[2])


@njit(**SWEEP_JIT)
def _tangent_rows(entries, bufs, ipool, data, T, prog, addr, n):
    """The first ``n`` tangent rows of ``prog``."""
    entries, bufs, ipool, data = _borrow(entries), _borrow(bufs), _borrow(ipool), _borrow(data)
    T = _borrow(T)
    at = _HEAD + 2 * prog[0] + 2 * prog[1]
    for k in range(n):
        r = at + 3 * k
        if prog[r] == 0:
            _call_tan(addr[prog[r + 1]], (data, T))
            continue
        i = prog[r + 2]
        a = interp_sweeps._kernel(_dispatch.TAN, prog[r + 1], i, entries, bufs, ipool, data)
        if a != _dispatch.NOTHING:
            _dispatch.call_tan(a, (i, entries, bufs, ipool, data, T))


@njit(**SWEEP_JIT)
def hvp_pass(entries, bufs, ipool, data, grad, T, GT, seeds, prog, addr):
    """Forward-over-reverse by ``prog`` (see :attr:`Passes.prog`): zero its adjoint memory
    in ``grad`` and every row of ``GT``, add ``seeds`` at its roots, run its tangent rows,
    then its reverse rows: fused loops, and entries through the interpreter's reverse and
    tangent-of-reverse kernels. Writes ``grad`` (the adjoints that the tangent-of-reverse
    rules read: :func:`adjoints_read`), ``T`` (not the tangents of the final sums that the
    reverse loops take: see :attr:`Passes.prog`) and ``GT``."""
    entries, bufs, ipool, data = _borrow(entries), _borrow(bufs), _borrow(ipool), _borrow(data)
    grad, T, GT = _borrow(grad), _borrow(T), _borrow(GT)
    z = _HEAD
    for k in range(prog[0]):
        g = grad[prog[z + 2 * k] : prog[z + 2 * k] + prog[z + 2 * k + 1]]
        for q in range(g.shape[0]):
            g[q] = 0.0
        for d in range(GT.shape[0]):
            h = GT[d, prog[z + 2 * k] : prog[z + 2 * k] + prog[z + 2 * k + 1]]
            for q in range(h.shape[0]):
                h[q] = 0.0
    at, s = z + 2 * prog[0], 0
    for k in range(prog[1]):
        for q in range(prog[at + 2 * k + 1]):
            grad[prog[at + 2 * k] + q] += seeds[s + q]
        s += prog[at + 2 * k + 1]
    _tangent_rows(entries, bufs, ipool, data, T, prog, addr, prog[4])
    at += 2 * prog[1] + 3 * prog[2]
    for k in range(prog[3]):
        r = at + 3 * k
        if prog[r] == 0:
            _call_hrev(addr[prog[r + 1]], (data, grad, T, GT))
            continue
        op, i = prog[r + 1], prog[r + 2]
        if prog[r] == 1:
            a = interp_sweeps._kernel(_dispatch.REV, op, i, entries, bufs, ipool, data)
            if a != _dispatch.NOTHING:
                _dispatch.call_rev(a, (i, entries, bufs, ipool, data, grad))
        a = interp_sweeps._kernel(_dispatch.HREV, op, i, entries, bufs, ipool, data)
        if a != _dispatch.NOTHING:
            _dispatch.call_hrev(a, (i, entries, bufs, ipool, data, grad, T, GT))


@njit(**SWEEP_JIT)
def hvp_one(entries, bufs, ipool, data, grad, T, GT, seeds, prog, addr, v, off, out):
    """:func:`hvp_pass` for one direction ``v`` of the argument at offset ``off`` of the arena
    (seeded into ``T[0]``), its tangent adjoints copied to ``out``."""
    t0 = T[0, off : off + v.shape[0]]
    for q in range(v.shape[0]):
        t0[q] = v[q]
    hvp_pass(entries, bufs, ipool, data, grad, T, GT, seeds, prog, addr)
    g0 = GT[0, off : off + out.shape[0]]
    for q in range(out.shape[0]):
        out[q] = g0[q]


_call_fwd = _dispatch._caller(
    "compiled forward sweep", types.int64,
    lambda dt: (_dispatch._I2, _dispatch._I2, _dispatch._I1, _dispatch._arena(dt, 1),
                types.int64, types.int64), 3,
)  # fmt: skip
"""``_call_fwd(addr, (entries, bufs, ipool, data, start, stop))``: a compiled tape's
``forward_sweep``."""

(HV_NE, HV_WE, HV_NB, HV_WB, HV_NPOOL, HV_NPROG, HV_NADDR, HV_FWD, HV_OFF, HV_ND, HV_NS,
 HV_REV, HV_ROOT, HV_NIN) = range(14)  # fmt: skip
HV_LEN = 14
"""The header of :func:`hvp_args`'s ``ints``: the tables' sizes, the forward's address, the
argument's offset in the arena, the arena's length and the number of seeds; for
:func:`vjp_args`, the address of the reverse pass (``vjp_rows``), the output's buffer and the
argument's size."""

_call_rev = _dispatch._caller(
    "compiled reverse pass", types.none,
    lambda dt: (_dispatch._I2, _dispatch._I2, _dispatch._I1, _dispatch._arena(dt, 1),
                _dispatch._arena(dt, 1), types.int64, types.int64, _dispatch._I1,
                _dispatch._arena(dt, 2), _dispatch._I1, _dispatch._I1, _dispatch._arena(dt, 2)), 3,
)  # fmt: skip
"""``_call_rev(addr, (entries, bufs, ipool, data, grad, n_entries, n_bufs, roots, U, offs,
sizes, out))``: a compiled tape's ``vjp_rows``."""


@njit(inline="always")
def _begin(ints, data, x, stop):
    """A one call's start (:class:`OneCall`): argument ``x`` into ``data``, then the compiled
    forward (``stop`` -1: the part the one-call gradient runs; the number of entries: the
    whole tape). Returns its status and views of the tables in ``ints`` (the entries, the
    buffers, the compiled pool, the program and the loops' addresses)."""
    at = HV_LEN
    entries = _table(ints, at, ints[HV_NE], ints[HV_WE])
    at += ints[HV_NE] * ints[HV_WE]
    bufs = _table(ints, at, ints[HV_NB], ints[HV_WB])
    at += ints[HV_NB] * ints[HV_WB]
    pool = _span(ints, at, ints[HV_NPOOL])
    prog = _span(ints, at + ints[HV_NPOOL], ints[HV_NPROG])
    addr = _span(ints, at + ints[HV_NPOOL] + ints[HV_NPROG], ints[HV_NADDR])
    d = _span(data, ints[HV_OFF], x.shape[0])
    for q in range(x.shape[0]):
        d[q] = x[q]
    st = _call_fwd(ints[HV_FWD], (entries, bufs, pool, data, np.int64(0), stop))
    return st, entries, bufs, pool, prog, addr


@njit(**SWEEP_JIT)
def hvp_args(ints, data, scratch, x, v, out):
    """A compiled tape's HVP for its one argument ``x`` and direction ``v`` (flat, of the
    arena's dtype), in one call: ``x`` into ``data``, the compiled forward (the part the
    one-call gradient runs: ``stop`` -1), then :func:`hvp_one`. ``ints``: the header
    (``HV_*``), then the entry and buffer tables, the compiled pool, the program and the
    loops' addresses (:class:`OneCall`); ``scratch``: ``grad``, ``T``, ``GT`` (one row each)
    and the seeds. Returns the forward's status (``-1``: ``out`` holds the product;
    otherwise nothing after the forward ran)."""
    nd, off = ints[HV_ND], ints[HV_OFF]
    st, entries, bufs, pool, prog, addr = _begin(ints, data, x, np.int64(-1))
    if st >= 0:
        return st
    grad = _span(scratch, 0, nd)
    T = _table(scratch, nd, 1, nd)
    GT = _table(scratch, 2 * nd, 1, nd)
    seeds = _span(scratch, 3 * nd, ints[HV_NS])
    hvp_one(entries, bufs, pool, data, grad, T, GT, seeds, prog, addr, v, off, out)
    return -1


@njit(inline="always")
def _seed_directions(scratch, nd, off, n, d0, m):
    """The argument's tangents (``n`` at ``off``) in the ``m`` arenas of ``T`` that follow
    ``grad`` in ``scratch`` (``nd`` each): the directions ``e_d0 .. e_{d0 + m - 1}``."""
    for j in range(m):
        t = _span(scratch, (1 + j) * nd + off, n)
        for q in range(n):
            t[q] = 0.0
        t[d0 + j] = 1.0


@njit(**SWEEP_JIT)
def hessian_args(ints, data, scratch, x, H, k):
    """A compiled tape's dense Hessian for its one argument ``x`` (flat, of the arena's
    dtype) into ``H`` (``n x n``), in one call: ``x`` into ``data``, the compiled forward (as
    :func:`hvp_args`), then :func:`hvp_pass` for the directions ``e_0 .. e_{n-1}``, ``k`` per
    pass, row ``d`` of ``H`` the product with ``e_d``. ``ints`` as for :func:`hvp_args`, its
    loops' addresses the vector-mode ones; ``scratch``: ``grad``, ``T`` and ``GT`` (``k`` rows
    each) and the seeds. Returns the forward's status (``-1``: ``H`` holds the Hessian;
    otherwise nothing after the forward ran)."""
    nd, off, n = ints[HV_ND], ints[HV_OFF], x.shape[0]
    st, entries, bufs, pool, prog, addr = _begin(ints, data, x, np.int64(-1))
    if st >= 0:
        return st
    grad = _span(scratch, 0, nd)
    seeds = _span(scratch, (1 + 2 * k) * nd, ints[HV_NS])
    for d0 in range(0, n, k):
        m = min(k, n - d0)
        T = _table(scratch, nd, m, nd)  # zero outside the argument (see Plan.arenas)
        GT = _table(scratch, (1 + k) * nd, m, nd)
        _seed_directions(scratch, nd, off, n, d0, m)
        hvp_pass(entries, bufs, pool, data, grad, T, GT, seeds, prog, addr)
        for j in range(m):
            g = _span(scratch, (1 + k + j) * nd + off, n)
            for q in range(n):
                H[d0 + j, q] = g[q]
    return -1


@njit(**SWEEP_JIT)
def jacobian_args(ints, data, scratch, x, J, k, oo):
    """A compiled tape's dense forward-mode Jacobian for its one argument ``x`` (flat, of the
    arena's dtype) into ``J`` (output elements x ``n``), in one call: ``x`` into ``data``,
    the whole compiled forward, then :func:`tangent_pass` for the directions ``e_0 ..
    e_{n-1}``, ``k`` per pass, column ``d`` of ``J`` the output's tangent (at arena offset
    ``oo``) for ``e_d``. ``ints`` and ``scratch`` as for :func:`hessian_args`. Returns the
    forward's status (``-1``: ``J`` holds the Jacobian; otherwise nothing after the forward
    ran)."""
    nd, off, n = ints[HV_ND], ints[HV_OFF], x.shape[0]
    st, entries, bufs, pool, prog, addr = _begin(ints, data, x, ints[HV_NE])
    if st >= 0:
        return st
    no = J.shape[0]
    for d0 in range(0, n, k):
        m = min(k, n - d0)
        T = _table(scratch, nd, m, nd)  # zero outside the argument (see Plan.arenas)
        _seed_directions(scratch, nd, off, n, d0, m)
        tangent_pass(entries, bufs, pool, data, T, prog, addr)
        for j in range(m):
            y = _span(scratch, (1 + j) * nd + oo, no)
            for r in range(no):
                J[r, d0 + j] = y[r]
    return -1


@njit(**SWEEP_JIT)
def jvp_args(ints, data, scratch, x, v, y, ty, oo):
    """A compiled tape's JVP for its one argument ``x`` along ``v`` (flat, of the arena's
    dtype), in one call: ``x`` into ``data``, the whole compiled forward, then
    :func:`tangent_pass` for ``v``; the output at arena offset ``oo`` into ``y`` and its
    tangent into ``ty`` (flat, of the output's length). ``ints`` and ``scratch`` as for
    :func:`hvp_args`. Returns the forward's status (``-1``: done; otherwise nothing after
    the forward ran)."""
    nd, off = ints[HV_ND], ints[HV_OFF]
    st, entries, bufs, pool, prog, addr = _begin(ints, data, x, ints[HV_NE])
    if st >= 0:
        return st
    T = _table(scratch, nd, 1, nd)  # zero outside the argument (see Plan.arenas)
    t0 = _span(scratch, nd + off, v.shape[0])
    for q in range(v.shape[0]):
        t0[q] = v[q]
    tangent_pass(entries, bufs, pool, data, T, prog, addr)
    yo = _span(data, oo, y.shape[0])
    to = _span(scratch, nd + oo, ty.shape[0])
    for r in range(y.shape[0]):
        y[r] = yo[r]
        ty[r] = to[r]
    return -1


@njit(**SWEEP_JIT)
def vjp_args(ints, data, scratch, x, u, y, g, oo):
    """A compiled tape's VJP for its one argument ``x`` (flat, of the arena's dtype) and the
    cotangent ``u`` of its one output (flat), in one call: ``x`` into ``data``, the whole
    compiled forward, then the compiled reverse pass (``vjp_rows``, by its address) seeded
    with ``u``; the output at arena offset ``oo`` into ``y`` (flat) and ``J^T u`` into ``g``.
    ``ints`` as for :func:`hvp_args`, with ``HV_REV`` and ``HV_ROOT`` set; ``scratch``:
    ``grad``, then room for ``u`` and ``J^T u``. Returns the forward's status (``-1``: done;
    otherwise nothing after the forward ran)."""
    nd = ints[HV_ND]
    st, entries, bufs, pool, _, _ = _begin(ints, data, x, ints[HV_NE])
    if st >= 0:
        return st
    grad = _span(scratch, 0, nd)
    U = _table(scratch, nd, 1, u.shape[0])
    out = _table(scratch, 2 * nd, 1, g.shape[0])
    for r in range(u.shape[0]):
        U[0, r] = u[r]
    # the output's buffer, the argument's offset and size: cells of the header
    roots = _span(ints, HV_ROOT, 1)
    offs = _span(ints, HV_OFF, 1)
    sizes = _span(ints, HV_NIN, 1)
    _call_rev(ints[HV_REV], (entries, bufs, pool, data, grad, ints[HV_NE], ints[HV_NB], roots,
                             U, offs, sizes, out))  # fmt: skip
    yo = _span(data, oo, y.shape[0])
    for r in range(y.shape[0]):
        y[r] = yo[r]
    for q in range(g.shape[0]):
        g[q] = out[0, q]
    return -1


class OneCall:
    """A compiled tape's HVP from Python in one compiled call (:func:`hvp_args`), or its JVP
    (:func:`jvp_args`, :meth:`jvp`): a few arrays to dispatch instead of the forward's and
    the passes' thirteen (at Rosenbrock n = 10, two calls and their arguments cost three
    times the gradient). Its integer
    array is made once, from the tape's tables and compiled pool as they are after the
    compile (they do not change afterwards); each thread has its scratch arena. Call it
    with this thread's workspace's value arena (``t.fast_workspace().data``).

    With ``k`` (directions per pass), the dense Hessian (:func:`hessian_args`,
    :meth:`hessian`) or forward-mode Jacobian (:func:`jacobian_args`, :meth:`jacobian`) in one
    call instead: the tangent loops' vector-mode versions, and scratch for ``k``
    directions. With ``rev``, the VJP (:func:`vjp_args`, :meth:`vjp`), which needs no
    derivative passes (``passes`` may be ``None``)."""

    def __init__(self, t, passes, off, seeds, k=None, rev=False):
        sw, pool = t.run_with
        dt = np.dtype(t.dtype)
        d1 = _dispatch._arena(dt, 1)
        sig = types.int64(_dispatch._I2, _dispatch._I2, _dispatch._I1, d1, types.int64,
                          types.int64)  # fmt: skip
        fwd = _dispatch._address(sw.forward_sweep, sig, "the one calls")
        ne, nb = t.n_entries, t.n_bufs
        E, B = t.entries[:ne], t.bufs[:nb]
        head = np.zeros(HV_LEN, np.int64)
        head[[HV_NE, HV_WE, HV_NB, HV_WB]] = ne, E.shape[1], nb, B.shape[1]
        head[[HV_FWD, HV_OFF, HV_ND, HV_NS]] = fwd, off, t.n_data, len(seeds)
        if rev:  # the VJP's (vjp_args): the compiled reverse pass, one output, one argument
            c2 = _dispatch._arena(dt, 2)
            i1, i = _dispatch._I1, types.int64
            rsig = types.none(_dispatch._I2, _dispatch._I2, i1, d1, d1, i, i, i1, c2, i1, i1, c2)
            head[HV_REV] = _dispatch._address(sw.vjp_rows, rsig, "the VJP's one call")
            head[HV_ROOT] = t.outputs[0]
            head[HV_NIN] = t.bufs[t.inputs[0], B_SIZE]
        if passes is None:  # (the VJP's runs no derivative pass)
            prog = addr = np.zeros(0, np.int64)
        else:
            prog = passes.prog
            addr = passes.addr if k is None else passes.addresses(max(k, 2))
        head[[HV_NPOOL, HV_NPROG, HV_NADDR]] = len(pool), len(prog), len(addr)
        parts = [head, E.ravel(), B.ravel(), pool, prog, addr]
        self.ints = np.concatenate(parts).astype(np.int64)
        self.seeds = np.asarray(seeds, dt)
        self.n_data, self.dtype, self.k = t.n_data, dt, k
        self._tls = threading.local()
        # the calls' entries, past Numba's dispatch (its typing of six or seven arguments
        # cost ~130 ns of an HVP's ~2 us at Rosenbrock n = 10): compiled for the argument
        # and direction in any layout (callers check their shape and dtype), the rest C
        # (made at first use: a tape's dense one call is a Hessian's or a Jacobian's)
        i1, a1, c2, i = _dispatch._I1, array_type(dt, 1), _dispatch._arena(dt, 2), types.int64
        self._sigs = {
            hvp_args: (i1, d1, d1, a1, a1, d1),
            hessian_args: (i1, d1, d1, a1, c2, i),
            jacobian_args: (i1, d1, d1, a1, c2, i, i),
            jvp_args: (i1, d1, d1, a1, a1, d1, d1, i),
            vjp_args: (i1, d1, d1, a1, a1, d1, d1, i),
        }
        self._entries = {}

    def _entry(self, fn):
        e = self._entries.get(fn)
        if e is None:
            e = self._entries[fn] = entry_point(fn, None, self._sigs[fn])
        return e

    def _scratch(self, rows):
        """This thread's scratch: ``grad``, then ``rows`` arenas each of ``T`` and ``GT``, then
        the seeds. ``T`` stays zero outside the argument (see Plan.arenas)."""
        s = getattr(self._tls, "scratch", None)
        if s is None:
            nd = self.n_data
            s = self._tls.scratch = np.zeros((1 + 2 * rows) * nd + len(self.seeds), self.dtype)
            s[(1 + 2 * rows) * nd :] = self.seeds
        return s

    def __call__(self, data, x, v, out):
        """The HVP at ``x`` in direction ``v`` into ``out`` (flat arrays of the argument's
        length); returns the forward's status (``-1``: done)."""
        return self._entry(hvp_args)(self.ints, data, self._scratch(1), x, v, out)

    def hessian(self, data, x, H):
        """The dense Hessian at ``x`` (flat) into ``H`` (``n x n``); returns the forward's
        status (``-1``: done)."""
        return self._entry(hessian_args)(self.ints, data, self._scratch(self.k), x, H, self.k)

    def jvp(self, data, x, v, y, ty, oo):
        """The JVP at ``x`` along ``v`` (flat arrays of the argument's length): the output at
        arena offset ``oo`` into ``y``, its tangent into ``ty`` (flat, of the output's
        length); returns the forward's status (``-1``: done)."""
        return self._entry(jvp_args)(self.ints, data, self._scratch(1), x, v, y, ty, oo)

    def vjp(self, data, x, u, y, g, oo):
        """The VJP at ``x`` for the output's cotangent ``u`` (flat): the output at arena
        offset ``oo`` into ``y`` (flat), ``J^T u`` into ``g`` (flat, of the argument's
        length); returns the forward's status (``-1``: done). Made with ``rev=True``."""
        return self._entry(vjp_args)(self.ints, data, self._scratch(1), x, u, y, g, oo)

    def jacobian(self, data, x, J, oo):
        """The forward-mode Jacobian at ``x`` (flat) of the output at arena offset ``oo``
        into ``J`` (output elements x ``n``); returns the forward's status (``-1``: done)."""
        return self._entry(jacobian_args)(self.ints, data, self._scratch(self.k), x, J, self.k, oo)


class Generated(NamedTuple):
    """What :func:`generate` makes of a tape."""

    source: str  # the module of its fused loops
    tan_units: list  # the names of its tangent loops (tan_rows index them)
    many_units: list  # ... and of their vector-mode versions, in the same order
    hrev_units: list  # ... and of its tangent-of-reverse loops (rev_rows index them)
    tan_rows: np.ndarray  # [what, a, b] rows: see tangent_pass
    rev_rows: np.ndarray  # ... see hvp_pass
    zero: np.ndarray  # [offset, size] rows of adjoint memory to zero
    roots: np.ndarray  # [offset, size] rows of the outputs (seeded in this order)
    calls: tuple  # (sweep kind, op code) of the interpreter kernels the tables name
    sums: int  # the last tangent rows: final sums whose reverse loops take them again


class _Unit:
    """The text of one fused group's two loops (tangent, and tangent of the reverse).

    Every buffer is read through a view (``_span``) indexed by the loop's range variables,
    so no index needs a wraparound test; over rows, a view that runs along them is cut to
    the row first. Views of ``T`` and ``GT`` are made per direction."""

    def __init__(self, gen: Gen, u: int, g: Group):
        self.gen, self.p, self.u, self.g = gen, gen.p, u, g
        self.rows = g.rows > 1
        self.M = g.m if self.rows else g.n
        self.views: dict[str, tuple] = {}  # name -> (arena, buffer, kind)

    # -- where an operand lies --------------------------------------------------------
    def at(self, arena, b, kind="full"):
        """Element ``(r, j)`` of buffer ``b`` read as ``kind`` in ``arena`` (``data``,
        ``tr``: the direction's tangents, ``grad`` or ``gr``: its tangent adjoints)."""
        key = kind if isinstance(kind, str) else f"{kind[0]}{kind[1]}"
        name = f"{arena[0] if arena != 'gr' else 'h'}{b}_{key}"
        self.views[name] = (arena, b, kind)
        if kind == "scalar":
            return f"{name}[0]"
        if kind == "per_row":
            return f"{name}[r]"
        if kind != "row" and self.rows:
            return f"{name}_r[j]"
        return f"{name}[j]"

    def view_lines(self, arenas):
        """The views of ``arenas``, whole, then (in the loop over rows) cut to the row."""
        whole, per_row = [], []
        for name, (arena, b, kind) in self.views.items():
            if arena not in arenas:
                continue
            off, n = int(self.p.B[b, B_OFF]), int(self.p.B[b, B_SIZE])
            whole.append(f"{name} = _span({arena}, {off}, {n})")
            if self.rows and kind not in ("scalar", "per_row", "row"):
                row = (
                    "r" if kind == "full" else f"(r {'%' if kind[0] == 'tile' else '//'} {kind[1]})"
                )
                per_row.append(f"{name}_r = _span({name}, {row} * {self.M}, {self.M})")
        return whole, per_row

    def local(self, b):
        """The register name stem of operand ``b`` if this group makes it, else ``None``."""
        p = self.p
        ob = int(p.owner[b])
        return ob if p.made_by.get(ob) == self.u and p.full(b) else None

    def operands(self, i):
        """``[(value, tangent or None), ...]`` of entry ``i``'s inputs (``None``: zero)."""
        p = self.p
        out = []
        for k, b in enumerate(p.ins[i]):
            ob = self.local(b)
            if ob is not None:
                out.append((f"v{ob}", f"t{ob}"))
                continue
            kind = p.kind(i, k)
            dyn = p.dyn[int(p.owner[b])] and p.B[b, B_KIND] != CONST
            out.append((self.at("data", b, kind), self.at("tr", b, kind) if dyn else None))
        return out

    def forward_lines(self):
        """Each entry's value (loaded where the compiled forward stores it, else computed
        again) and tangent, in order."""
        p, gen = self.p, self.gen
        lines = []
        for i in self.g.entries:
            o = int(p.E[i, E_OUT])
            ops = self.operands(i)
            args = [v for v, _ in ops]
            if gen.stored(self.u, i):
                lines.append(f"v{o} = {self.at('data', o)}")
            else:  # kept in registers by the compiled forward: computed again
                lines.append(f"v{o} = {gen.value(i, args)}")
            terms = [
                f"_masked({gen.rule(i, k, args, f'v{o}', t)}, {t})"
                for k, (_, t) in enumerate(ops)
                if t is not None and p.ops[i].differentiable[k]
            ]
            lines.append(f"t{o} = {' + '.join(terms) if terms else '0.0'}")
        return lines

    def fold_at(self, arena):
        """``(source owner, element of the sum in arena)`` of the group's folded sum."""
        g, p = self.g, self.p
        src = int(p.owner[p.ins[g.fold][0]])
        so = int(p.E[g.fold, E_OUT])
        return src, so, self.at(arena, so, ("block", g.fold_rows) if g.fold_rows else "scalar")

    def function(self, name, args, body, pre_d=(), pre_r=(), post_r=(), post_d=()):
        """The function: views, then per direction, per row and per element."""
        top, _ = self.view_lines(("data", "grad"))
        d_views, _ = self.view_lines(("tr", "gr"))
        _, rows = self.view_lines(("data", "grad", "tr", "gr"))
        out = ['@njit(fastmath={"reassoc"}, **UNIT_JIT)', f"def {name}({args}):"]
        out += [f"    {x}" for x in top]
        out += ["    for d in range(T.shape[0]):", "        tr = T[d]"]
        if "GT" in args:
            out.append("        gr = GT[d]")
        out += [f"        {x}" for x in (*d_views, *pre_d)]
        depth = 2
        if self.rows:
            out.append(f"        for r in range({self.g.rows}):")
            out += [f"            {x}" for x in (*rows, *pre_r)]
            depth = 3
        pad = "    " * depth
        out.append(f"{pad}for j in range({self.M}):")
        out += [f"{pad}    {x}" for x in body]
        out += [f"{pad}{x}" for x in post_r]
        out += [f"        {x}" for x in post_d]
        return out + ["", ""]

    # -- tangent ----------------------------------------------------------------------
    def tangent(self, name):
        p, g = self.p, self.g
        body = self.forward_lines()
        for i in g.entries:
            o = int(p.E[i, E_OUT])
            if p.external(o, self.u):
                body.append(f"{self.at('tr', o)} = t{o}")
        pre, post = [], []
        if g.fold >= 0:
            src, so, at = self.fold_at("tr")
            if g.fold_rows:
                n = int(p.B[so, B_SIZE])
                pre = [f"for q in range({n}):", f"    {at.split('_r[')[0].split('[')[0]}[q] = 0.0"]
                body.append(f"{at} += t{src}")
            else:
                pre = ["ft = 0.0"]
                body.append(f"ft += t{src}")
                post = [f"{at} = ft"]
        return self.function(name, "data, T", body, pre_d=pre, post_d=post)

    def tangent_many(self, name):
        """The tangent loop for several directions (vector mode): each block of elements
        computes its values and its entries' partials once (``r_k(x, y, 1)``: the rules are
        linear in their adjoint) into scratch arrays, then every direction's tangents are
        products and sums of those, in a loop that vectorises."""
        p, gen, g = self.p, self.gen, self.g
        blk = min(BLOCK, self.M)
        vals, parts, tans, scratch = [], [], [], []
        for i in g.entries:
            o = int(p.E[i, E_OUT])
            ops = self.operands(i)
            args = [v for v, _ in ops]
            if gen.stored(self.u, i):
                vals.append(f"v{o} = {self.at('data', o)}")
            else:
                vals.append(f"v{o} = {gen.value(i, args)}")
            terms = []
            for k, (_, t) in enumerate(ops):
                if t is None or not p.ops[i].differentiable[k]:
                    continue
                q = f"q{o}_{k}"
                scratch.append(q)
                parts.append(f"{q}[jj] = {gen.rule(i, k, args, f'v{o}', '1.0')}")
                terms.append(f"_masked({q}[jj] * {t}, {t})")
            tans.append(f"t{o} = {' + '.join(terms) if terms else '0.0'}")
        for i in g.entries:
            o = int(p.E[i, E_OUT])
            if p.external(o, self.u):
                tans.append(f"{self.at('tr', o)} = t{o}")
        pre, post = [], []
        if g.fold >= 0:
            src, so, at = self.fold_at("tr")
            if g.fold_rows:
                off, n = int(p.B[so, B_OFF]), int(p.B[so, B_SIZE])
                pre = ["for d in range(K):", f"    for q in range({n}):",
                       f"        T[d, {off} + q] = 0.0"]  # fmt: skip
                tans.append(f"{at} += t{src}")
            else:
                pre = ["ft = np.zeros(K, T.dtype)"]
                tans.append(f"ft[d] += t{src}")
                post = ["for d in range(K):", f"    T[d, {int(p.B[so, B_OFF])}] = ft[d]"]
        sub = lambda xs: [_AT_J.sub(r"\1_[jj]", x) for x in xs]  # noqa: E731
        vals, parts, tans = sub(vals), sub(parts), sub(tans)
        used = sorted(
            {m for line in vals + parts + tans for m in re.findall(r"\b(\w+)_\[jj\]", line)}
        )
        top, _ = self.view_lines(("data",))
        d_views, _ = self.view_lines(("tr",))
        _, rows = self.view_lines(("data",))
        _, tr_rows = self.view_lines(("tr",))
        data_used = [v for v in used if v.startswith("d")]
        tr_used = [v for v in used if v.startswith("t")]
        out = ['@njit(fastmath={"reassoc"}, **UNIT_JIT)', f"def {name}(data, T):"]
        out += ["    K = T.shape[0]"] + [f"    {x}" for x in top]
        out += [f"    {q} = np.empty({blk}, data.dtype)" for q in scratch]
        out += [f"    {x}" for x in pre]
        # a bound LLVM cannot see from 8 elements on (see tape.compiler.emit.opaque)
        bound = f"_opaque({self.M})" if self.M >= OPAQUE_MIN else str(self.M)
        inner = [f"for j0 in range(0, {self.M}, {blk}):", f"    m = min({blk}, {bound} - j0)"]
        inner += [f"    {v}_ = _span({v}, j0, m)" for v in data_used]
        inner += ["    for jj in range(m):"] + [f"        {x}" for x in vals + parts]
        inner += ["    for d in range(K):", "        tr = T[d]"]
        inner += [f"        {x}" for x in d_views + (tr_rows if self.rows else [])]
        inner += [f"        {v}_ = _span({v}, j0, m)" for v in tr_used]
        inner += ["        for jj in range(m):"] + [f"            {x}" for x in tans]
        if self.rows:
            inner = [f"for r in range({g.rows}):"] + [f"    {x}" for x in (*rows, *inner)]
        out += [f"    {x}" for x in inner]
        out += [f"    {x}" for x in post]
        return out + ["", ""]

    # -- tangent of the reverse -------------------------------------------------------
    def hrev(self, name, touched, assigned, read):
        """The forward-over-reverse loop. ``touched``: the owners whose adjoint memory a unit
        that runs earlier in the reverse pass wrote (updated here); ``assigned``: the owners
        whose adjoint (and tangent adjoint) this loop assigns rather than adds to, as their
        first contribution over the whole buffer (added to here; they need no zeroing);
        ``read``: per owner, whether a tangent-of-reverse rule reads its adjoint
        (:func:`adjoints_read`): the loop neither loads nor writes the others' adjoints (it
        takes them as zero: no second-order term it computes reads them)."""
        p, gen, g = self.p, self.gen, self.g
        body = self.forward_lines()
        for i in g.entries:
            if p.emask[i]:
                o = int(p.E[i, E_OUT])
                if p.external(o, self.u):
                    a = self.at("grad", o) if read[int(p.owner[o])] else "0.0"
                    body += [f"a{o} = {a}", f"g{o} = {self.at('gr', o)}"]
                else:
                    body += [f"a{o} = 0.0", f"g{o} = 0.0"]
        if g.fold >= 0 and p.emask[g.fold]:
            src, so, ga = self.fold_at("grad")
            if read[int(p.owner[int(p.E[g.fold, E_OUT])])]:
                body.append(f"a{src} += {ga}")
            body.append(f"g{src} += {self.fold_at('gr')[2]}")
        # contributions to a buffer read outside the loop: summed per element (elementwise
        # kinds), per row (per_row) or over the loop (scalar), then added to the arenas
        acc: dict[tuple, tuple[str, str]] = {}
        contrib = []
        for i in reversed(g.entries):
            if not p.emask[i]:
                continue
            op = p.ops[i]
            o = int(p.E[i, E_OUT])
            ops = self.operands(i)
            args = [v for v, _ in ops]
            for k, b in enumerate(p.ins[i]):
                ob = int(p.owner[b])
                if not op.differentiable[k] or p.B[b, B_KIND] == CONST or not p.dyn[ob]:
                    continue
                ca = f"_masked({gen.rule(i, k, args, f'v{o}', f'a{o}')}, a{o})"
                cg = f"_masked({gen.rule(i, k, args, f'v{o}', f'g{o}')}, g{o})"
                terms = []
                for j, (_, tj) in enumerate(ops):
                    h = _HESS_AT.get(len(ops), {}).get((k, j))
                    if tj is None or h is None or op.hess[h] is None:
                        continue
                    terms.append(f"_masked(_h_{op.name}_{h}({', '.join(args)}, v{o}) * {tj}, {tj})")
                if terms:
                    cg += f" + _masked(a{o} * ({' + '.join(terms)}), a{o})"
                loc = self.local(b)
                if loc is not None:
                    contrib += [f"a{loc} += {ca}", f"g{loc} += {cg}"]
                    continue
                kind = p.kind(i, k)
                key = (b, kind if isinstance(kind, str) else tuple(kind))
                if key not in acc:
                    n = len(acc)
                    acc[key] = (f"ea{n}" if read[ob] else None, f"eg{n}")
                ea, eg = acc[key]
                contrib += ([f"{ea} += {ca}"] if ea else []) + [f"{eg} += {cg}"]
        pre_d, pre_r, post_r, post_d, elem = [], [], [], [], []
        first = self.first_writes(acc, touched)
        assigned |= first
        for (b, kind), (ea, eg) in acc.items():
            ga, gg = self.at("grad", b, kind), self.at("gr", b, kind)
            init = ([f"{ea} = 0.0"] if ea else []) + [f"{eg} = 0.0"]
            add = (["if d == 0:", f"    {ga} += {ea}"] if ea else []) + [f"{gg} += {eg}"]
            if kind == "scalar":
                pre_d += init
                post_d += add
            elif kind == "per_row":
                pre_r += init
                post_r += add
            else:
                body += init
                elem.append((ea, eg, ga, gg, "=" if int(p.owner[b]) in first else "+="))
        touched.update(int(p.owner[b]) for b, _ in acc)
        body += contrib
        if self.M < BLOCK_MIN:
            for ea, eg, ga, gg, op in elem:
                body += (["if d == 0:", f"    {ga} {op} {ea}"] if ea else []) + [f"{gg} {op} {eg}"]
            return self.function(name, "data, grad, T, GT", body, pre_d, pre_r, post_r, post_d)
        return self.blocked(name, body, elem, pre_d, pre_r, post_r, post_d)

    def first_writes(self, acc, touched):
        """The owners whose adjoint this loop may assign (``acc``: its contributions to
        buffers read outside it, ``(buffer, kind) -> names``): an intermediate's whole
        memory, read elementwise by this loop alone among its contributions, that no unit
        earlier in the reverse pass wrote, and that this unit does not make. As in the
        compiled gradient (:meth:`tape.compiler.emit.Gen.first_adds`), assigning spares the
        zeroing: of the adjoint and of every direction's tangent adjoint here."""
        p, B = self.p, self.p.B
        owners = [int(p.owner[b]) for b, _ in acc]
        aliased = set(p.owner[B[:, B_ALIAS] >= 0].tolist()) if self.rows else set()
        out = set()
        for (b, kind), o in zip(acc, owners):
            if (
                kind == "full" and o not in touched and owners.count(o) == 1
                and p.made_by.get(o) != self.u and B[o, B_KIND] == ACTIVE
                and int(B[b, B_OFF]) == int(B[o, B_OFF]) and self.g.n == int(B[o, B_SIZE])
                and (not self.rows or (b == o and o not in aliased))
            ):  # fmt: skip
                out.add(o)
        return out

    def blocked(self, name, body, elem, pre_d, pre_r, post_r, post_d):
        """A long loop (flat, or over long rows) in blocks of ``BLOCK`` elements: the
        contributions to buffers read outside the loop go to scratch arrays (in the L1
        cache), added to the arenas by loops of their own, so the main loop stores nothing
        that may alias what it loads and vectorises (as the gradient's ``_block_loop``)."""
        blk = min(BLOCK, self.M)
        keep = []
        for ea, eg, _, _, _ in elem:
            keep += ([f"b{ea}[jj] = {ea}"] if ea else []) + [f"b{eg}[jj] = {eg}"]
        used = sorted({m for line in body for m in _AT_J.findall(line)}
                      | {m for e in elem for m in _AT_J.findall((e[2] if e[0] else "") + e[3])})  # fmt: skip
        main = [_AT_J.sub(r"\1_[jj]", x) for x in body + keep]
        top, _ = self.view_lines(("data", "grad"))
        d_views, _ = self.view_lines(("tr", "gr"))
        out = ['@njit(fastmath={"reassoc"}, **UNIT_JIT)', f"def {name}(data, grad, T, GT):"]
        out += [f"    {x}" for x in top]
        for name_ in (x for ea, eg, _, _, _ in elem for x in (ea, eg) if x):
            out.append(f"    b{name_} = np.empty({blk}, data.dtype)")
        out += ["    for d in range(T.shape[0]):", "        tr = T[d]", "        gr = GT[d]"]
        out += [f"        {x}" for x in (*d_views, *pre_d)]
        inner = [f"for j0 in range(0, {self.M}, {blk}):", f"    m = min({blk}, {self.M} - j0)"]
        inner += [f"    {v}_ = _span({v}, j0, m)" for v in used]
        inner += ["    for jj in range(m):"] + [f"        {x}" for x in main]
        for ea, eg, ga, gg, op in elem:
            ga, gg = (_AT_J.sub(r"\1_[jj]", x) for x in (ga, gg))
            if ea:
                inner += ["    if d == 0:", "        for jj in range(m):", f"            {ga} {op} b{ea}[jj]"]  # fmt: skip
            inner += ["    for jj in range(m):", f"        {gg} {op} b{eg}[jj]"]
        if self.rows:
            _, rows = self.view_lines(("data", "grad", "tr", "gr"))
            inner = [f"for r in range({self.g.rows}):"] + [
                f"    {x}" for x in (*rows, *pre_r, *inner, *post_r)
            ]
        out += [f"        {x}" for x in inner]
        out += [f"        {x}" for x in post_d]
        return out + ["", ""]


def _ranges(B, owners):
    """``(offset, size)`` of the owners' memory, adjacent ones merged."""
    spans = sorted((int(B[o, B_OFF]), int(B[o, B_SIZE])) for o in owners)
    out: list[list[int]] = []
    for off, n in spans:
        if out and off <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], off + n - out[-1][0])
        else:
            out.append([off, n])
    return out


def _reads_adjoint(p, i):
    """Whether entry ``i``'s tangent-of-reverse rule reads the adjoint of its output: a
    second partial ``H_kj`` that is not identically zero, between inputs ``k`` and ``j`` that
    both carry tangents (``gt_k += g_y * sum_j H_kj t_j``). Structural ops other than the
    :data:`LINEAR` ones are taken to read it."""
    op = p.ops[i]
    if op.kind == "structural":
        return op.hvp is not None and op.hvp is not LINEAR
    ins = p.ins[i]
    at = _HESS_AT.get(len(ins), {})
    carries = [op.differentiable[k] and p.B[b, B_KIND] != CONST for k, b in enumerate(ins)]
    return any(carries[k] and carries[j] and op.hess[h] is not None for (k, j), h in at.items())


def adjoints_read(p):
    """``(runs, read)``: the entries whose reverse rule forward-over-reverse runs (``bool``
    per entry, within ``p.emask``), and the buffers whose adjoint it computes (``bool`` per
    memory owner: a view's adjoint is its owner's). An adjoint is read where a
    tangent-of-reverse rule reads it (an entry that :func:`_reads_adjoint`), or where the
    reverse rule of an entry that runs reads it; an entry's reverse rule runs where the
    adjoint of one of its inputs is read. A Hessian-vector product returns tangent adjoints
    only, so the adjoints that flow only into linear parts of the tape (the arguments' own
    adjoints, a matrix product's operands made by gathers and differences) are not computed.
    Found to a fixed point."""
    E, B, owner = p.E, p.B, p.owner
    read = np.zeros(len(B), bool)  # adjoint memory that some rule reads, by owner
    runs = np.zeros(len(E), bool)
    order = [i for i in p.live if p.emask[i]]
    for i in order:  # the rules that read their output's adjoint themselves
        if _reads_adjoint(p, i):
            read[owner[E[i, E_OUT]]] = True
    changed = True
    while changed:
        changed = False
        for i in order:
            if not runs[i] and any(read[owner[b]] for b in p.ins[i] if B[b, B_KIND] != CONST):
                runs[i] = changed = True
                o = owner[E[i, E_OUT]]
                read[o] = True
    return runs, read


def generate(t):
    """What tape ``t``'s derivative passes are made of (:class:`Generated`), or ``None``
    where its drivers stay on the interpreter (callbacks, too many groups)."""
    if t.callbacks or not t.outputs:
        return None
    p = Plan(t)
    if any(p.ops[i] is CALLBACK_OP for i in p.live):
        return None
    groups = [u for u, unit in enumerate(p.units) if isinstance(unit, Group)]
    if len(groups) > MAX_GROUPS:
        return None
    gen = Gen(p)
    B = p.B
    funcs: list[str] = []
    tan_units, hrev_units, tan_rows, rev_rows, calls = [], [], [], [], set()
    for u, unit in enumerate(p.units):
        if isinstance(unit, Call):
            i = unit.entries[0]
            if B[int(p.E[i, E_OUT]), B_KIND] != CONST:
                tan_rows.append((1, p.ops[i].code, i))
                calls.add((_dispatch.TAN, p.ops[i].code))
            continue
        funcs += _Unit(gen, u, unit).tangent(f"_tan{u}")
        funcs += _Unit(gen, u, unit).tangent_many(f"_tanv{u}")
        tan_rows.append((0, len(tan_units), 0))
        tan_units.append(f"_tan{u}")
    runs, read = adjoints_read(p)
    touched = {int(p.owner[b]) for b in t.outputs}  # adjoint memory written so far (seeded)
    assigned: set[int] = set()  # ... and first written whole by a loop: not zeroed
    for u in range(len(p.units) - 1, -1, -1):
        unit = p.units[u]
        if isinstance(unit, Call):
            i = unit.entries[0]
            if p.emask[i]:
                # the reverse kernel too, unless no rule reads the adjoints it would make; the
                # tangent-of-reverse kernel adds to its inputs' tangent adjoints either way
                both = bool(runs[i])
                rev_rows.append((1 if both else 2, p.ops[i].code, i))
                calls.add((_dispatch.HREV, p.ops[i].code))
                if both:
                    calls.add((_dispatch.REV, p.ops[i].code))
                touched.update(int(p.owner[b]) for b in p.ins[i])
            continue
        if any(p.emask[i] for i in unit.entries) or (unit.fold >= 0 and p.emask[unit.fold]):
            funcs += _Unit(gen, u, unit).hrev(f"_hrev{u}", touched, assigned, read)
            rev_rows.append((0, len(hrev_units), 0))
            hrev_units.append(f"_hrev{u}")
    # adjoint memory read or added to: zeroed first (the arguments' too, which the drivers
    # read whether or not the output depends on them)
    in_regs = {
        o for o, u in p.made_by.items()
        if isinstance(p.units[u], Group) and not p.external(o, u)
    }  # fmt: skip
    zero = {
        o for o in range(len(t.bufs[: t.n_bufs]))
        if p.rneed[o] and p.dyn[o] and B[o, B_ALIAS] < 0 and B[o, B_KIND] != CONST
        and o not in in_regs and o not in assigned
    }  # fmt: skip
    zero |= {int(p.owner[b]) for b in t.inputs}
    roots = [(int(B[r, B_OFF]), int(B[r, B_SIZE])) for r in t.outputs]
    ops = [p.ops[i] for i in p.live]
    hess = []
    for op in sorted({op for op in ops if op.kind != "structural"}, key=lambda op: op.code):
        hess += [f'_h_{op.name}_{h} = BY_NAME["{op.name}"].hess[{h}]'
                 for h, f in enumerate(op.hess) if f is not None]  # fmt: skip
    src = [
        '"""The fused loops of one tape\'s forward mode and forward-over-reverse: GENERATED by',
        f"tape.compiler.second. Do not edit. {len(p.units)} units ({len(groups)} fused groups) of",
        f'{t.n_entries} entries; tape.compiler.second\'s drivers run them by their tables."""',
        "",
        "import numpy as np",
        "from numba import njit",
        "",
        "from tape.layout.config import UNIT_JIT",
        "from tape.ops.loops import masked as _masked",
        "from tape.layout.views import span as _span",
        "from tape.compiler.emit import opaque as _opaque",
        "from tape.compiler.emit import outline_rule as _outline_rule",
        "from tape.ops.registry import BY_NAME",
        "",
        *rule_names(ops),
        *hess,
        "",
        "",
        *funcs,
    ]

    def table(rows, width):
        return np.array(rows, np.int64).reshape(-1, width)

    many_units = [f"_tanv{n[4:]}" for n in tan_units]
    sums = 0  # the final sums' units, each a fused group with one tangent row
    while sums < len(p.units) and gen.sum_in_reverse(len(p.units) - 1 - sums):
        sums += 1
    return Generated("\n".join(src), tan_units, many_units, hrev_units, table(tan_rows, 3),
                     table(rev_rows, 3), table(_ranges(B, zero), 2), table(roots, 2),
                     tuple(sorted(calls)), sums)  # fmt: skip
