"""Derivatives beyond the gradient, on a recorded tape: forward mode, vector-Jacobian products,
Jacobians, Hessians and Hessian-vector products, dense or sparse.

Every driver replays the tape's forward sweep at the arguments (guards, retracing and index
checks as for :meth:`Tape.gradient`), then runs the interpreter's sweeps generated from the op
registry (:mod:`tape.interpreter.codegen`):

- ``tangent_sweep``: forward mode, ``k`` directions per pass (vector mode);
- ``reverse_pass``: the reverse sweep, one seed per pass;
- ``tangent_reverse_sweep``: the tangent of a finished reverse sweep (forward-over-reverse),
  ``k`` directions per pass: Hessian-vector products without recording anything again.

On a compiled tape the same passes run the tape's generated code instead: forward mode and
forward-over-reverse the passes of :mod:`tape.compiler.second`, reverse mode (``vjp``,
``jacobian(mode="rev")``) the compiled module's own reverse pass (``vjp_rows``). So on a tape
waiting for automatic promotion (``compile="auto"``) a call by these paths counts toward the
compiled tier as a replay, by the count rule and by its time (:meth:`Tape.counting`); a
tape with Python callbacks, which stays on the interpreter, is not counted.

Shapes and tuples follow JAX. The differentiated arguments are the tape's ``wrt`` arguments
(``tape.record(..., wrt=...)``); "arguments" below means those. Directions are processed in
passes of equal size whose tangent arenas stay in the caches (:data:`CHUNK_BYTES`). Results
are in the tape's arena dtype (float32 tapes give float32 derivatives).

These are the implementations of :meth:`Tape.jvp`, :meth:`Tape.vjp`, :meth:`Tape.jacobian`,
:meth:`Tape.hessian`, :meth:`Tape.hvp` and :meth:`Tape.sparsity`.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np

from tape.interpreter import dispatch as _dispatch
from tape.interpreter.generated import sweeps
from tape.layout.columns import B_ALIAS, B_KIND, B_OFF, B_SIZE, CONST
from tape.program.callbacks import refuse

CHUNK_BYTES = 2 << 20
"""The tangent arenas of one pass (``T`` and ``GT``: ``k`` directions times the arena less its
constants, which no pass touches, twice) are kept under this size where that leaves at least
:data:`CHUNK_MIN` directions per pass.
Small enough that a pass's arenas, and the temporaries its matrix kernels stack the directions
in, stay in the caches and under the allocator's threshold for fresh pages: the small MLP's
dense Hessian (161 directions over a 2,116-element arena, ``python -m tape.bench hessian``)
took 1.1-1.6 ms in one pass of 5.4 MB and 1.0 ms in three passes of 1.8 MB on an AVX-512
machine. On a 2-core AMD EPYC Zen 3 VM (512 KB of L2 per core) its forward-over-reverse pass
took 6.2-6.8 us per direction at 8, 27, 54, 81 and 161 directions a pass: the size of a pass
matters little there."""

CHUNK_MIN = 16
"""Directions per pass below which :data:`CHUNK_BYTES` does not split a pass (the vector-mode
loops compute the values and partials once per pass for all its directions): up to
:data:`CHUNK_MAX_BYTES`. A sparse Jacobian of 14 colours over a 43,340-element arena took
1.25 ms in passes of 3 directions and 1.1 ms in one pass."""

CHUNK_MAX_BYTES = 64 << 20
"""Upper bound on the tangent arenas of one pass (at least one direction)."""

MODES = ("auto", "fwd", "rev")

COMPRESS_MIN = 16
"""Dense Jacobians (forward mode) and Hessians over at least this many argument elements are
evaluated by colouring of their sparsity pattern (:mod:`tape.sparse`) when that needs at most
half as many directions as there are elements; the result is the same dense array."""


class _Plan:
    """Where the differentiated arguments and the outputs of one tape lie in its arena."""

    def __init__(self, tp):
        self.tp = tp
        self.ready = set()  # the sweep kinds whose kernels are prepared (see need())
        self.in_bufs = [tp.inputs[k] for k in tp.wrt]
        self.in_off = [int(tp.bufs[b, B_OFF]) for b in self.in_bufs]
        self.in_size = [int(tp.bufs[b, B_SIZE]) for b in self.in_bufs]
        self.in_shapes = [tuple(tp.shapes[b]) for b in self.in_bufs]
        self.in_col = np.concatenate([[0], np.cumsum(self.in_size)]).astype(np.int64)
        self.n_in = int(self.in_col[-1])
        self.out_off = [int(tp.bufs[b, B_OFF]) for b in tp.outputs]
        self.out_size = [int(tp.bufs[b, B_SIZE]) for b in tp.outputs]
        self.out_shapes = [tuple(tp.shapes[b]) for b in tp.outputs]
        self.out_row = np.concatenate([[0], np.cumsum(self.out_size)]).astype(np.int64)
        self.n_out = int(self.out_row[-1])
        self.roots = np.asarray(tp.outputs, np.int64)
        self.n_data = tp.n_data
        B = tp.bufs[: tp.n_bufs]
        owners = (B[:, B_ALIAS] < 0) & (B[:, B_KIND] == CONST)
        self.n_const = int(B[owners, B_SIZE].sum())
        self._tls = threading.local()  # this thread's arenas (see arenas())
        self.seed = np.ones(1, tp.dtype)
        self.in_offs = np.asarray(self.in_off, np.int64)
        self.in_sizes = np.asarray(self.in_size, np.int64)
        self.in_dtypes = [np.dtype(tp.input_dtypes[k]) for k in tp.wrt]
        self.compiled = None  # the generated derivative passes, once made (see _compiled)
        self.compressed = {}  # "jacobian"/"hessian" -> sparse._Compressed, the last pattern's

    def need(self, *kinds):
        """Prepare the op kernels of the sweep ``kinds`` that a transform runs, the first time
        it asks (forward mode needs no reverse kernels, first order no second-order ones)."""
        todo = set(kinds) - self.ready
        if todo:
            _dispatch.prepare_tape(self.tp, tuple(sorted(todo)))
            self.ready |= todo

    def arenas(self, k):
        """This thread's tangent arenas ``T``, tangent adjoints ``GT`` (``k`` rows each) and
        adjoint arena, reused across calls. ``T`` stays zero outside the arguments: the
        tangent sweep writes every other buffer it reads before reading it, and never writes
        constants."""
        cache = getattr(self._tls, "arenas", None)
        if cache is None or cache[0].shape[0] < k:
            dt = self.tp.dtype
            cache = self._tls.arenas = (
                np.zeros((k, self.n_data), dt), np.zeros((k, self.n_data), dt),
                np.zeros(self.n_data, dt),
            )  # fmt: skip
        T, GT, grad = cache
        return T[:k], GT[:k], grad

    def require_scalar(self):
        """Raise unless the tape has one scalar output (Hessians need one)."""
        if self.n_out != 1:
            raise ValueError(
                f"Hessians need a scalar output; this tape's outputs have shapes {self.out_shapes}"
            )

    def chunk(self, k):
        """Directions per pass for ``k`` directions: as few passes as :data:`CHUNK_BYTES`,
        :data:`CHUNK_MIN` and :data:`CHUNK_MAX_BYTES` allow, of equal sizes (at least one
        direction each)."""
        per = max(1, self.n_data - self.n_const) * self.tp.dtype.itemsize * 2
        cap = CHUNK_MAX_BYTES // per
        most = max(1, min(k, cap, max(CHUNK_BYTES // per, CHUNK_MIN)))
        passes = -(-k // most)
        return max(1, -(-k // passes))

    def seed_inputs(self, arenas, V):
        """Write the rows of ``V`` (directions over the concatenated arguments) into the
        arguments' places of ``arenas`` (one arena per row)."""
        for o, n, c in zip(self.in_off, self.in_size, self.in_col):
            arenas[:, o : o + n] = V[:, c : c + n]

    def read_inputs(self, arenas):
        return np.concatenate(
            [arenas[:, o : o + n] for o, n in zip(self.in_off, self.in_size)], axis=1
        )

    def read_outputs(self, arenas):
        return np.concatenate(
            [arenas[:, o : o + n] for o, n in zip(self.out_off, self.out_size)], axis=1
        )

    def split_in(self, flat):
        """Flat vector over the arguments -> one array per argument (a single array if one)."""
        parts = [
            flat[c : c + n].reshape(s) for c, n, s in zip(self.in_col, self.in_size, self.in_shapes)
        ]
        return parts[0] if len(parts) == 1 else tuple(parts)

    def split_out(self, flat):
        parts = [
            flat[c : c + n].reshape(s)
            for c, n, s in zip(self.out_row, self.out_size, self.out_shapes)
        ]
        return parts[0] if self.tp.single_output else tuple(parts)

    def in_values(self, values, what):
        """Values structured like the arguments (one array per argument, or a single array
        when there is one), checked against their shapes: a list of arrays."""
        vals = _as_list(values, len(self.in_bufs))
        if vals is None:
            raise ValueError(
                f"{what}: expected {len(self.in_bufs)} arrays, one per differentiated argument "
                f"(shapes {self.in_shapes}), got {_describe(values)}"
            )
        out = []
        for k, (v, s, n) in enumerate(zip(vals, self.in_shapes, self.in_size)):
            v = np.asarray(v)
            if v.shape != s and not (v.size == n and v.ndim <= 1 and len(s) <= 1):
                raise ValueError(
                    f"{what}: array {k} has shape {v.shape}, the differentiated argument "
                    f"{self.tp.input_names[self.tp.wrt[k]]!r} has shape {s}"
                )
            out.append(v)
        return out

    def flat_in(self, values, what):
        """One flat vector from values structured like the arguments."""
        out = np.empty(self.n_in, self.tp.dtype)
        for v, c, n in zip(self.in_values(values, what), self.in_col, self.in_size):
            out[c : c + n] = v.ravel()
        return out

    def flat_out(self, values, what):
        vals = _as_list(values, len(self.out_size))
        if vals is None:
            raise ValueError(
                f"{what}: expected {len(self.out_size)} arrays shaped like the outputs "
                f"{self.out_shapes}, got {_describe(values)}"
            )
        out = np.empty(self.n_out, self.tp.dtype)
        for k, (v, s, c, n) in enumerate(zip(vals, self.out_shapes, self.out_row, self.out_size)):
            v = np.asarray(v)
            if v.shape != s:
                raise ValueError(f"{what}: array {k} has shape {v.shape}, output {k} has shape {s}")
            out[c : c + n] = v.ravel()
        return out


def _as_list(values, n):
    """Values given one per argument (or output): a tuple or list of ``n``; with ``n == 1``
    also the array itself (a list is then array data, a 1-tuple a container)."""
    if n == 1:
        return [values[0]] if isinstance(values, tuple) and len(values) == 1 else [values]
    if isinstance(values, (tuple, list)) and len(values) == n:
        return list(values)
    return None


def _describe(v):
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)}"
    return f"an array of shape {np.shape(v)}"


# ---------------------------------------------------------------- sweeps


def _forward(t, args, compiled=False):
    """Replay the forward sweep at ``args``: ``(plan, values)``, every entry's value written
    (on the interpreter: a compiled forward keeps intermediates in registers). ``compiled``:
    the tape's own forward where compiled code that needs only the values it stores follows:
    ``True``, its generated derivative passes (:func:`_compiled`); ``"reverse"``, its reverse
    pass (:func:`_jac_rev_rows`)."""
    if compiled and t.tier == "compiled" and not t.callbacks:
        tp, ws = t.run_replay(args, False)
        if tp is t and (compiled == "reverse" or _compiled(_plan(tp)) is not None):
            return _plan(tp), ws.data
    tp, ws = t.run_replay(args, False, interp=True)
    return _plan(tp), ws.data


def _counting(t, what):
    """A derivative call (``what``) on ``t`` counts toward its automatic promotion
    (:meth:`Tape.counting`) where the compiled tier runs it: on a tape without Python
    callbacks."""
    return contextlib.nullcontext() if t.callbacks else t.counting(what)


def _plan(tp):
    """The tape's :class:`_Plan`, made on first use."""
    st = tp.extensions()
    plan = st.get("derivatives")
    if plan is None:
        plan = st["derivatives"] = _Plan(tp)
    return plan


def _tangents(plan, data, V):
    """Tangent arenas (one per row of ``V``, directions over the arguments): this thread's
    arenas, valid until the next call. A tape with Python callbacks runs the sweep in
    segments; each callback group writes its outputs' tangents with its own ``tangent``
    (a :func:`tape.custom_op` given ``jvp``, a :func:`tape.checkpoint`), and others raise."""
    tp = plan.tp
    T = plan.arenas(V.shape[0])[0]
    plan.seed_inputs(T, V)
    if tp.callbacks:
        plan.need(_dispatch.FWD, _dispatch.TAN)
        lo = 0
        from tape.program.callbacks import groups

        for s, e, call in groups(tp):
            sweeps.tangent_sweep(tp.entries, tp.bufs, tp.ipool, data, T, lo, s)
            tangent = getattr(call, "tangent", None)
            if tangent is None:
                raise NotImplementedError(
                    f"forward mode: {call.label} has no tangent rule (a tape.autograd.Function "
                    "runs in reverse mode only); use vjp()/jacobian(mode='rev'), or write it "
                    "as a tape.custom_op with jvp="
                )
            tangent(tp, data, T)
            lo = e
        sweeps.tangent_sweep(tp.entries, tp.bufs, tp.ipool, data, T, lo, tp.n_entries)
        return T
    mod = _compiled(plan)
    if mod is not None:
        mod.tangent(tp.entries, tp.bufs, tp.ipool, data, T)
    else:
        plan.need(_dispatch.FWD, _dispatch.TAN)
        sweeps.tangent_sweep(tp.entries, tp.bufs, tp.ipool, data, T, 0, tp.n_entries)
    return T


def _compiled(plan):
    """The generated derivative passes of a compiled tape (:mod:`tape.compiler.second`), with
    the interpreter kernels they call prepared, or ``None``: the interpreter's sweeps run (a
    tape on the interpreter, or one the generator leaves there)."""
    tp = plan.tp
    if tp.callbacks or tp.tier != "compiled":
        return None
    mod = plan.compiled
    if mod is None:
        from tape.compiler.second import derivative_module

        mod = derivative_module(tp)
        if mod is None:
            return None
        for kind, code in mod.TABLE_CALLS:
            _dispatch.prepare((code,), tp.dtype, (kind,))
        plan.compiled = mod
    return mod


def _hvp_pass(plan, data, grad, T, GT):
    """Forward-over-reverse after a forward sweep (``hvp_pass``'s contract): generated code for
    a compiled tape, the interpreter's drivers otherwise."""
    tp = plan.tp
    mod = _compiled(plan)
    if mod is not None:
        mod.hvp(tp.entries, tp.bufs, tp.ipool, data, grad, T, GT, plan.seed)
    else:
        plan.need(*_dispatch.ALL)
        sweeps.hvp_pass(tp.entries, tp.bufs, tp.ipool, data, grad, T, GT, tp.n_entries,
                        tp.n_bufs, plan.roots, plan.seed)  # fmt: skip


def _second(plan, what):
    """Second derivatives and sparsity patterns need every entry as a registry op."""
    refuse(plan.tp, what)


def _hvp_rows(plan, data, V):
    """``V @ H`` for the scalar output's Hessian ``H`` over the arguments (rows of ``V`` are
    directions)."""
    tp = plan.tp
    plan.require_scalar()
    _second(plan, "second derivatives")
    out = np.empty((V.shape[0], plan.n_in), tp.dtype)
    step = plan.chunk(V.shape[0])
    for a in range(0, V.shape[0], step):
        Vc = V[a : a + step]
        T, GT, grad = plan.arenas(Vc.shape[0])
        plan.seed_inputs(T, Vc)
        _hvp_pass(plan, data, grad, T, GT)
        out[a : a + step] = plan.read_inputs(GT)
    return out


def _jac_fwd_rows(plan, data, V):
    """``J @ v`` for each row ``v`` of ``V``, as rows: ``(len(V), n_out)``."""
    out = np.empty((V.shape[0], plan.n_out), plan.tp.dtype)
    step = plan.chunk(V.shape[0])
    for a in range(0, V.shape[0], step):
        out[a : a + step] = plan.read_outputs(_tangents(plan, data, V[a : a + step]))
    return out


def _jac_rev_rows(plan, data, U):
    """``J^T u`` for each row ``u`` of ``U``, as rows: ``(len(U), n_in)``, one reverse pass
    per row in one compiled call: the compiled tape's own reverse pass (fused loops,
    adjoints in registers) on a compiled tape, after its forward or the interpreter's (which
    writes every value it stores), else the interpreter's."""
    tp = plan.tp
    out = np.empty((U.shape[0], plan.n_in), tp.dtype)
    grad = plan.arenas(1)[2]
    if tp.tier == "compiled" and not tp.callbacks:
        sw, pool = tp.prepared_sweeps()  # (the interpreter kernels its unfused entries call)
    else:
        plan.need(_dispatch.FWD, _dispatch.REV)
        sw, pool = sweeps, tp.ipool
    if tp.callbacks:  # the reverse sweep in segments around the callbacks, row by row
        roots = np.asarray(plan.roots, np.int64)
        for r in range(U.shape[0]):
            tp.callback_sweeps.backward(tp.entries, tp.bufs, tp.ipool, data, grad, tp.n_entries,
                                  tp.n_bufs, roots, np.ascontiguousarray(U[r], tp.dtype), True)  # fmt: skip
            out[r] = plan.read_inputs(grad[None, :])[0]
        return out
    sw.vjp_rows(tp.entries, tp.bufs, pool, data, grad, tp.n_entries, tp.n_bufs, plan.roots,
                np.ascontiguousarray(U, tp.dtype), plan.in_offs, plan.in_sizes, out)  # fmt: skip
    return out


# ---------------------------------------------------------------- drivers


def jvp(t, *args, tangents):
    """``(value, tangent)``: the outputs at ``args`` and their directional derivative along
    ``tangents`` (one array per differentiated argument, or a single array), one forward
    sweep and one tangent sweep. Structured like :meth:`Tape.forward`'s result. Both in one
    compiled call for a compiled tape's common case (as :func:`hvp`), with one output of the
    arena's dtype."""
    st = t.extension_state
    fast = st.get("jvp") if st is not None else None
    if fast is not None and len(args) == 1:
        # one argument, differentiated, 1-d, and ``tangents`` an array of its recorded shape
        # and dtype (the arena's): one compiled call (tape.compiler.second.jvp_args)
        _, call, (shape, dt), oo, oshape, n = fast
        v = tangents[0] if type(tangents) is tuple and len(tangents) == 1 else tangents
        if type(v) is np.ndarray and v.shape == shape and v.dtype is dt:
            ws = _one_call_workspace(t, fast, args[0])
            if ws is not None:
                y, ty = np.empty(n, dt), np.empty(n, dt)
                if call.jvp(ws.data, args[0], v, y, ty, oo) < 0:
                    ws.ok = True  # the whole forward ran: backward() may follow
                    return _as_output(y, oshape), ty.reshape(oshape)
                # the sweep stopped (a failed guard, a rejected index): the checked path
    with _counting(t, "jvp"):
        return _jvp(t, args, tangents, fast)


def _jvp(t, args, tangents, fast):
    """:func:`jvp` by passes (its checked path); makes the one call where it applies."""
    plan, data = _forward(t, args, compiled=True)
    v = plan.flat_in(tangents, "jvp: tangents")
    out = _jac_fwd_rows(plan, data, v[None, :])[0]
    value = plan.tp.outputs_of(plan.tp.thread_workspace())
    if _one_arg(t, plan, fast) and _one_output(t) and plan.compiled is not None:
        _keep_one_call(t, "jvp", plan, plan.compiled.one_call(t, plan.in_off[0], plan.seed))
    return value, _cast_out(plan, plan.split_out(out))


def vjp(t, *args, cotangent):
    """``(value, grads)``: the outputs at ``args`` and ``J^T u`` for the cotangent ``u``
    (shaped like the outputs), structured like :meth:`Tape.gradient`'s result. Both in one
    compiled call for a compiled tape's common case (as :func:`jvp`)."""
    st = t.extension_state
    fast = st.get("vjp") if st is not None else None
    if fast is not None and len(args) == 1:
        # one argument, differentiated, 1-d, and one output of the arena's dtype, with a
        # cotangent of its shape and dtype (or a real number, for a 0-d output): one
        # compiled call (tape.compiler.second.vjp_args)
        _, call, (shape, dt), oo, oshape, _ = fast
        u = cotangent[0] if type(cotangent) is tuple and len(cotangent) == 1 else cotangent
        if not oshape and type(u) in _REALS:
            u = np.array([u], dt)
        elif type(u) is np.ndarray and u.shape == oshape and u.dtype is dt:
            u = u if len(oshape) == 1 else u.reshape(-1)
        else:
            u = None
        ws = None if u is None else _one_call_workspace(t, fast, args[0])
        if ws is not None:
            y, g = np.empty(u.shape[0], dt), np.empty(shape, dt)
            if call.vjp(ws.data, args[0], u, y, g, oo) < 0:
                ws.ok = True  # the whole forward ran: backward() may follow
                return _as_output(y, oshape), g
            # the sweep stopped (a failed guard, a rejected index): the checked path
    with _counting(t, "vjp"):
        return _vjp(t, args, cotangent, fast)


def _vjp(t, args, cotangent, fast):
    """:func:`vjp` by a reverse pass (its checked path); makes the one call where it
    applies."""
    plan, data = _forward(t, args, compiled="reverse")
    u = plan.flat_out(cotangent, "vjp: cotangent")
    g = _jac_rev_rows(plan, data, u[None, :])[0]
    value = plan.tp.outputs_of(plan.tp.thread_workspace())
    if _one_arg(t, plan, fast) and _one_output(t) and t.tier == "compiled" and not t.callbacks:
        from tape.compiler.second import OneCall

        _keep_one_call(t, "vjp", plan, OneCall(t, None, plan.in_off[0], plan.seed, rev=True))
    return value, _cast_in(plan, plan.split_in(g))


def _keep_one_call(t, what, plan, call):
    """Keep ``call``, the one call of :func:`jvp` or :func:`vjp` (``what``) for tape ``t``'s
    current compiled code, with the argument's recorded ``(shape, dtype)``, the output's
    arena offset, shape and size."""
    shape = plan.out_shapes[0]
    t.extensions()[what] = (t.run_with[0], call, t.replay_state()["fast"][0],
                            plan.out_off[0], shape, math.prod(shape))  # fmt: skip


def _as_output(y, shape):
    """The output's elements ``y`` (flat, a fresh array) as :meth:`Tape.forward` gives an
    output of ``shape``: a NumPy scalar for a 0-d one."""
    if not shape:
        return y[0]
    return y if len(shape) == 1 else y.reshape(shape)


def jacobian(t, *args, mode="auto", sparse=False):
    """The Jacobian of the outputs with respect to the differentiated arguments.

    ``mode``: ``"fwd"`` (tangent sweeps, several directions per pass), ``"rev"`` (one reverse
    sweep per output element) or ``"auto"`` (forward when the arguments have no more elements
    than the outputs). Dense result, as JAX's ``jacfwd``/``jacrev``: for one output and one
    argument an array of shape ``out.shape + arg.shape``; a tuple over the arguments for
    several arguments; a tuple over the outputs (each as above) for several outputs.

    ``sparse=True``: a ``scipy.sparse.csr_matrix`` of shape ``(total output elements, total
    argument elements)`` (outputs and arguments flattened and concatenated), from the
    sparsity pattern (:meth:`Tape.sparsity`) and a column colouring: as many tangent
    directions as colours (``mode`` is ignored). Entries outside the pattern are structural
    zeros.
    """
    if mode not in MODES:
        raise ValueError(f"jacobian: mode must be one of {MODES}, got {mode!r}")
    st = t.extension_state
    fast = st.get("jacobian") if st is not None and not sparse else None
    if fast is not None and len(args) == 1 and mode in fast[3]:
        # a compiled tape's dense forward-mode Jacobian in one compiled call (see hessian)
        _, call, (shape, dt), _, oo, out_shape = fast
        ws = _one_call_workspace(t, fast, args[0])
        if ws is not None:
            J = np.empty((math.prod(out_shape), shape[0]), dt)
            if call.jacobian(ws.data, args[0], J, oo) < 0:
                return J.reshape(out_shape + shape)
    with _counting(t, f"jacobian {mode} {sparse}"):
        return _jacobian(t, args, mode, sparse, fast)


def _jacobian(t, args, mode, sparse, fast):
    """:func:`jacobian` by passes (its checked path)."""
    # reverse mode chosen up front runs after the compiled forward; "auto" looks at the
    # sparsity pattern first, which needs every value (the interpreter's forward)
    plan, data = _forward(t, args, compiled="reverse" if mode == "rev" and not sparse else False)
    if sparse:
        from tape.transforms import sparse as SP

        _second(plan, "jacobian(sparse=True)")
        return SP.sparse_jacobian(plan, data)
    pat = _compressible(plan, data, "jacobian") if mode != "rev" else None
    if mode == "auto":
        mode = "fwd" if pat is not None or plan.n_in <= plan.n_out else "rev"
    if pat is not None:
        from tape.transforms import sparse as SP

        J = SP.dense(plan, data, pat, "jacobian")
    elif mode == "fwd":
        J = _jac_fwd_rows(plan, data, np.eye(plan.n_in, dtype=plan.tp.dtype)).T
        _one_call_jacobian(t, plan, fast)
    else:
        J = _jac_rev_rows(plan, data, np.eye(plan.n_out, dtype=plan.tp.dtype))
    return _blocks(plan, np.ascontiguousarray(J))


def _compressible(plan, data, which):
    """The sparsity patterns when colouring pays for a dense ``which`` (see
    :data:`COMPRESS_MIN`), else None."""
    if plan.n_in < COMPRESS_MIN or (which == "hessian" and plan.n_out != 1) or plan.tp.callbacks:
        return None
    from tape.transforms import sparse as SP

    pat = SP.patterns(plan, data)
    n = pat.n_jacobian_colors if which == "jacobian" else pat.n_hessian_colors
    return pat if 2 * n <= plan.n_in else None


def _blocks(plan, J):
    """Split a flat ``(n_out, n_in)`` Jacobian into JAX's nesting."""
    outs = []
    for r, m, so in zip(plan.out_row, plan.out_size, plan.out_shapes):
        row = [
            J[r : r + m, c : c + n].reshape(so + si)
            for c, n, si in zip(plan.in_col, plan.in_size, plan.in_shapes)
        ]
        outs.append(row[0] if len(row) == 1 else tuple(row))
    return outs[0] if plan.tp.single_output else tuple(outs)


def hessian(t, *args, sparse=False):
    """The Hessian of the scalar output with respect to the differentiated arguments: shape
    ``arg.shape + arg.shape`` for one argument, a tuple of tuples of blocks ``H[i][j]`` of
    shape ``arg_i.shape + arg_j.shape`` for several. Forward-over-reverse: one reverse sweep,
    then tangent sweeps of the reverse sweep, several directions per pass.

    ``sparse=True``: a ``scipy.sparse.csr_matrix`` over the flattened, concatenated arguments,
    from the Hessian's sparsity pattern and a column colouring (as many directions as
    colours).

    A compiled tape with one 1-d argument whose dense Hessian takes no colouring (fewer than
    :data:`COMPRESS_MIN` elements, or a pattern that no argument can change and that
    colouring would not halve) computes it in one compiled call (forward, then every pass),
    as :func:`hvp` does its product."""
    st = t.extension_state
    fast = st.get("hessian") if st is not None and not sparse else None
    if fast is not None and len(args) == 1:
        _, call, (shape, dt) = fast
        ws = _one_call_workspace(t, fast, args[0])
        if ws is not None:
            H = np.empty(shape + shape, dt)
            if call.hessian(ws.data, args[0], H) < 0:
                return H
            # the sweep stopped (a failed guard, a rejected index): the checked path
    with _counting(t, f"hessian {sparse}"):
        return _hessian(t, args, sparse, fast)


def _hessian(t, args, sparse, fast):
    """:func:`hessian` by passes (its checked path)."""
    plan, data = _forward(t, args)
    _second(plan, "hessian()")
    if sparse:
        from tape.transforms import sparse as SP

        return SP.sparse_hessian(plan, data)
    pat = _compressible(plan, data, "hessian")
    if pat is not None:
        from tape.transforms import sparse as SP

        H = SP.dense(plan, data, pat, "hessian")
    else:
        H = _hvp_rows(plan, data, np.eye(plan.n_in, dtype=plan.tp.dtype))
        _one_call_hessian(t, plan, fast)
    if len(plan.in_shapes) == 1:
        s = plan.in_shapes[0]
        return H.reshape(s + s)
    blocks = [
        tuple(
            H[ci : ci + ni, cj : cj + nj].reshape(si + sj)
            for cj, nj, sj in zip(plan.in_col, plan.in_size, plan.in_shapes)
        )
        for ci, ni, si in zip(plan.in_col, plan.in_size, plan.in_shapes)
    ]
    return blocks[0][0] if len(blocks) == 1 else tuple(blocks)


def _one_call_workspace(t, fast, a):
    """This thread's workspace for a one call ``fast`` (``(sweeps, call, (shape, dtype),
    ...)``, as :func:`hvp`, :func:`hessian`, :func:`jacobian`, :func:`jvp` and :func:`vjp`
    keep it) at argument ``a``, or ``None``
    where the checked path runs: the tape compiled again since, ``a`` not an array of the
    recorded shape and dtype, a retraced variant or anomaly mode."""
    sw, _, (shape, dt) = fast[:3]
    if t.run_with[0] is sw and type(a) is np.ndarray and a.shape == shape and a.dtype is dt:
        return t.fast_workspace()
    return None


_REALS = (float, int, np.float64, np.float32)
"""The types of a 0-d output's cotangent that :func:`vjp`'s one call takes as a number."""


def _one_arg(t, plan, fast):
    """Whether compiled tape ``t`` can take a one call (:class:`tape.compiler.second.OneCall`)
    not made yet for its current compiled code (``fast``, the one made before, or ``None``):
    one argument, differentiated, 1-d, of the arena's dtype, and not a retraced variant."""
    r = t.replay_state()
    return (
        plan.tp is t and len(t.inputs) == 1 and list(t.wrt) == [0]
        and len(plan.in_shapes[0]) == 1 and r["fast"][0][1] == t.dtype == plan.in_dtypes[0]
        and (fast is None or fast[0] is not t.run_with[0])
    )  # fmt: skip


def _one_output(t):
    """Whether tape ``t`` has one output, of the arena's dtype and not in a tuple or list (as
    a JVP's or a VJP's one call returns it)."""
    return t.single_output and t.replay_state()["out_dtypes"][0] == t.dtype


def _one_call_jacobian(t, plan, fast):
    """Make :func:`jacobian`'s one call (forward mode) for compiled tape ``t`` after a dense
    forward-mode Jacobian by passes, where it applies: one differentiated 1-d argument of the
    arena's dtype, one output, and a pattern that no argument can change (so colouring never
    pays where it did not here). ``mode="auto"`` takes it where it chose forward mode."""
    if not _one_call_ok(t, plan, fast) or not t.single_output:
        return
    passes = _compiled(plan)
    if passes is not None:
        modes = ("fwd", "auto") if plan.n_in <= plan.n_out else ("fwd",)
        call = passes.one_call(t, plan.in_off[0], plan.seed, plan.chunk(plan.n_in))
        t.extensions()["jacobian"] = (t.run_with[0], call, t.replay_state()["fast"][0], modes,
                                      plan.out_off[0], plan.out_shapes[0])  # fmt: skip


def _one_call_ok(t, plan, fast):
    """Whether a one-call dense Hessian or Jacobian applies to tape ``t`` (and is not made
    yet for its current compiled code, ``fast``): one differentiated 1-d argument of the
    arena's dtype, and a sparsity pattern that does not depend on the argument (fewer than
    :data:`COMPRESS_MIN` elements: never coloured; else no gather, whose indices could change
    it)."""
    if not _one_arg(t, plan, fast):
        return False
    if plan.n_in >= COMPRESS_MIN:
        from tape.transforms import sparse as SP

        if SP._key(plan, t.data) != "":  # (gathers: the pattern depends on their indices)
            return False
    return True


def _one_call_hessian(t, plan, fast):
    """Make :func:`hessian`'s one call for compiled tape ``t`` after a dense Hessian by
    passes, where it applies (:func:`_one_call_ok`)."""
    if not _one_call_ok(t, plan, fast):
        return
    passes = _compiled(plan)
    if passes is not None:
        call = passes.one_call(t, plan.in_off[0], plan.seed, plan.chunk(plan.n_in))
        t.extensions()["hessian"] = (t.run_with[0], call, t.replay_state()["fast"][0])


def hvp(t, *args, v):
    """The Hessian of the scalar output times ``v`` (structured like the gradient: one array
    per differentiated argument, or a single array), structured like :meth:`Tape.gradient`'s
    result. Costs one forward, one reverse, one tangent and one forward-over-reverse sweep
    (on a compiled tape, less the forward and tangent loops of a final sum that the reverse
    loop takes), all four in one compiled call for a compiled tape's common case."""
    st = t.extension_state
    fast = st.get("hvp") if st is not None else None
    if fast is not None and len(args) == 1:
        # a compiled tape's common call: one argument, differentiated, 1-d, and ``v`` arrays
        # of its recorded shape and dtype, which is the arena's (checked as the one-call
        # gradient checks its argument): one compiled call (tape.compiler.second.OneCall)
        _, call, (shape, dt) = fast
        if type(v) is tuple and len(v) == 1:
            v = v[0]
        if type(v) is np.ndarray and v.shape == shape and v.dtype is dt:
            ws = _one_call_workspace(t, fast, args[0])
            if ws is not None:
                out = np.empty(shape, dt)
                if call(ws.data, args[0], v, out) < 0:
                    return out
                # the sweep stopped (a failed guard, a rejected index): the checked path
    with _counting(t, "hvp"):
        return _hvp(t, args, v, fast)


def _hvp(t, args, v, fast):
    """:func:`hvp` by passes (its checked path)."""
    plan, data = _forward(t, args, compiled=True)
    _second(plan, "hvp()")
    vals = plan.in_values(v, "hvp: v")
    plan.require_scalar()
    T, GT, grad = plan.arenas(1)
    for a, o, n in zip(vals, plan.in_off, plan.in_size):
        T[0, o : o + n] = a.ravel()
    _hvp_pass(plan, data, grad, T, GT)
    out = [
        GT[0, o : o + n].reshape(s).astype(d)
        for o, n, s, d in zip(plan.in_off, plan.in_size, plan.in_shapes, plan.in_dtypes)
    ]
    # the one call, made once (anomaly mode takes this path at every call)
    if _one_arg(t, plan, fast) and plan.compiled is not None:
        call = plan.compiled.one_call(t, plan.in_off[0], plan.seed)
        t.extensions()["hvp"] = (t.run_with[0], call, t.replay_state()["fast"][0])
    return out[0] if len(out) == 1 else tuple(out)


def sparsity(t, *args):
    """The sparsity patterns (:class:`tape.sparse.Sparsity`) at ``args`` (default: the
    recorded arguments). They depend on the arguments only through gather indices."""
    from tape.transforms import sparse as SP

    if args:
        plan, data = _forward(t, args)
    else:
        t.replay_state()
        plan, data = _plan(t), t.data
    _second(plan, "sparsity()")
    return SP.patterns(plan, data)


def _cast_in(plan, g):
    """Derivatives with respect to the arguments in the arguments' dtypes."""
    dts = [np.dtype(plan.tp.input_dtypes[k]) for k in plan.tp.wrt]
    if isinstance(g, tuple):
        return tuple(a.astype(d, copy=False) for a, d in zip(g, dts))
    return g.astype(dts[0], copy=False)


def _cast_out(plan, v):
    dts = [d if d.kind == "f" else plan.tp.dtype for d in plan.tp.replay_state()["out_dtypes"]]
    if isinstance(v, tuple):
        return tuple(a.astype(d, copy=False) for a, d in zip(v, dts))
    return v.astype(dts[0], copy=False)
