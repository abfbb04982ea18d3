"""``tape.autograd``: PyTorch's ``torch.autograd``: :func:`grad`, :func:`backward` and
:class:`Function` (user-defined forward and backward in Python) for eager tensors.

Higher-order derivatives come from recorded tapes, not from eager graphs: use
:meth:`tape.Tape.hvp` / :meth:`tape.Tape.hessian` (or :func:`tape.hvp`, :func:`tape.hessian`)
on ``tape.record(fn, x)``.
"""

from __future__ import annotations

import numpy as np

from tape.frontend import tensor as _tensor
from tape.frontend.tensor import Tensor, no_grad
from tape.layout.columns import B_KIND, B_OFF, CONST, LEAF
from tape.program import callbacks as _callbacks
from tape.program.replay import ReplayError

__all__ = ["grad", "backward", "Function", "FunctionCtx", "gradcheck", "gradgradcheck"]


def _seq(x):
    return (x,) if isinstance(x, Tensor) else tuple(x)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False, materialize_grads=False):  # fmt: skip
    """The sum of the gradients of ``outputs`` with respect to ``inputs`` (a tuple with one
    tensor per input), without touching any ``.grad``.

    ``grad_outputs``: the adjoints of ``outputs`` (default 1 for single-element outputs).
    ``inputs`` may be leaves or intermediate tensors of the graph. An input the outputs do
    not depend on raises, unless ``allow_unused`` (it then gets ``None``, or zeros with
    ``materialize_grads``). ``retain_graph`` defaults to ``create_graph``; without it the
    graph is freed as by ``backward()``.

    ``create_graph=True`` returns gradients that are differentiable once more (gradient
    penalties, double backward): each is an output of one node whose backward is a
    Hessian-vector product by forward-over-reverse over the same graph, giving every leaf's
    mixed second derivative at once. The ``inputs`` must then be leaves; differentiating such
    a gradient again with ``create_graph=True`` (third order) raises ``NotImplementedError``.
    """
    if retain_graph is None:
        retain_graph = create_graph
    outs = _seq(outputs)
    ins = _seq(inputs)
    if not outs:
        raise ValueError("grad: outputs is empty")
    for k, o in enumerate(outs):
        if not isinstance(o, Tensor):
            raise TypeError(f"grad: outputs[{k}] is a {type(o).__name__}, not a tensor")
        if not o._rg:
            raise RuntimeError(
                f"grad: element {k} of outputs does not require grad and does not have a grad_fn"
            )
    for k, x in enumerate(ins):
        if not isinstance(x, Tensor):
            raise TypeError(f"grad: inputs[{k}] is a {type(x).__name__}, not a tensor")
        if not x._rg:
            raise RuntimeError(f"grad: element {k} of inputs does not require grad")
    if grad_outputs is None:
        gos = [None] * len(outs)
    else:
        gos = list(grad_outputs) if isinstance(grad_outputs, (list, tuple)) else [grad_outputs]
    if len(gos) != len(outs):
        raise ValueError(f"grad: {len(outs)} outputs but {len(gos)} grad_outputs")
    seeds = []
    for k, (o, g) in enumerate(zip(outs, gos)):
        if g is None:
            if o.numel() != 1:
                raise RuntimeError(
                    f"grad can be implicitly created only for scalar outputs; outputs[{k}] has "
                    f"shape {tuple(o.shape)}: pass grad_outputs"
                )
            seeds.append(np.ones(1))
        else:
            s = np.asarray(g._peek() if isinstance(g, Tensor) else g, np.float64)
            if s.shape != tuple(o.shape):
                raise RuntimeError(
                    f"grad: grad_outputs[{k}] has shape {tuple(s.shape)}, outputs[{k}] has shape {tuple(o.shape)}"
                )
            seeds.append(s.ravel())
    tapes = {id(o._resolve()[0]): o._resolve()[0] for o in outs if o._tape is not None}
    if len(tapes) > 1:
        raise RuntimeError(
            "grad: the outputs belong to separate graphs; differentiate each on its own"
        )
    if not tapes:  # outputs that are leaves themselves
        return tuple(_leaf_only(o_list=outs, seeds=seeds, x=x, allow_unused=allow_unused,
                                materialize=materialize_grads) for x in ins)  # fmt: skip
    (tp,) = tapes.values()
    if tp.recording:
        raise RuntimeError(
            "tape.autograd.grad inside tape.record(): use the recorded tape's drivers"
        )
    roots = np.array([o._resolve()[1] for o in outs], np.int64)
    if tp._written:
        from tape.frontend.tensor import stale

        stale(tp, roots)
    if tp._freed is not None and tp.reaches_freed(roots):
        raise RuntimeError(
            "Trying to backward through the graph a second time: specify retain_graph=True "
            "on the first backward() or grad() call"
        )
    if create_graph:
        for k, x in enumerate(ins):
            if x._tape is not None and not x.is_leaf:
                raise NotImplementedError(
                    f"grad(create_graph=True): inputs[{k}] is not a leaf; differentiable "
                    "gradients are taken with respect to leaf tensors (requires_grad=True)"
                )
    need = tp.run_backward(roots, np.concatenate(seeds), zero_leaves=True)
    res = []
    for k, x in enumerate(ins):
        g = None
        if x._tape is not None and x._resolve()[0] is tp:
            b = x._resolve()[1]
            if need[b]:
                g = tp.adjoint(b).copy()
        else:
            for leaf, lb in tp.leaves:
                if leaf is x and need[lb] and tp.bufs[lb, B_KIND] == LEAF:
                    a = tp.adjoint(lb)
                    g = a.copy() if g is None else g + a
        for j, o in enumerate(outs):  # an output that is itself an input
            if o is x:
                s = seeds[j].reshape(o.shape)
                g = s.copy() if g is None else g + s
        if g is None:
            if not allow_unused:
                raise RuntimeError(
                    f"grad: inputs[{k}] appears to not have been used in the graph. Set "
                    "allow_unused=True if this is the desired behavior."
                )
            res.append(Tensor(np.zeros(x.shape, x.dtype)) if materialize_grads else None)
        else:
            res.append(Tensor(np.asarray(g, dtype=x.dtype).reshape(x.shape)))
    if create_graph:
        return _differentiable(tp, outs, np.concatenate(seeds), ins, res, need)
    if not retain_graph:
        tp.mark_freed(need)
    return tuple(res)


def _leaf_only(o_list, seeds, x, allow_unused, materialize):
    g = None
    for o, s in zip(o_list, seeds):
        if o is x:
            g = s.reshape(o.shape) if g is None else g + s.reshape(o.shape)
    if g is None:
        if not allow_unused:
            raise RuntimeError(
                "grad: an input appears to not have been used in the graph. Set "
                "allow_unused=True if this is the desired behavior."
            )
        return Tensor(np.zeros(x.shape, x.dtype)) if materialize else None
    return Tensor(np.asarray(g, dtype=x.dtype))


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """``tensors[k].backward(grad_tensors[k])`` for every tensor, as ``torch.autograd.backward``:
    gradients accumulate into the leaves' ``.grad``. ``inputs`` (leaves) restricts which
    leaves accumulate."""
    ts = _seq(tensors)
    if grad_tensors is None:
        gs = [None] * len(ts)
    else:
        gs = [grad_tensors] if isinstance(grad_tensors, Tensor) else list(grad_tensors)
    if len(gs) != len(ts):
        raise ValueError(f"backward: {len(ts)} tensors but {len(gs)} grad_tensors")
    if inputs is not None:
        ins = _seq(inputs)
        grads = grad(ts, ins, gs if grad_tensors is not None else None, retain_graph,
                     create_graph, allow_unused=True)  # fmt: skip
        for x, g in zip(ins, grads):
            if g is not None:
                x._accumulate(g._value)
        return None
    for k, (t, g) in enumerate(zip(ts, gs)):
        last = k == len(ts) - 1
        t.backward(g, retain_graph=retain_graph if last else True, create_graph=create_graph)
    return None


class _FunctionMeta(type):
    def __call__(cls, *args, **kwargs):
        raise RuntimeError(
            f"{cls.__name__}: autograd.Function is not instantiated: call "
            f"{cls.__name__}.apply(*args)"
        )


class Function(metaclass=_FunctionMeta):
    """A differentiable operation with its own ``forward`` and ``backward``, as
    ``torch.autograd.Function``::

        class Cube(tape.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x ** 3

            @staticmethod
            def backward(ctx, grad_output):
                (x,) = ctx.saved_tensors
                return grad_output * 3 * x ** 2

        y = Cube.apply(x)

    ``forward(ctx, *args)`` gets the arguments (tensors as plain values, outside any graph)
    and returns a tensor or a tuple of them; ``backward(ctx, *grad_outputs)`` gets one
    adjoint per output and returns one gradient (or None) per argument of ``forward``. Use
    ``ctx.save_for_backward(*tensors)`` / ``ctx.saved_tensors``, ``ctx.needs_input_grad`` and
    ``ctx.mark_non_differentiable(*outputs)``; other values can be kept as attributes of
    ``ctx``.

    It works in eager mode and inside :func:`tape.record`: a replay runs ``forward`` and
    ``backward`` as Python callbacks between segments of the interpreter's sweeps. Such a
    tape does not compile, batch, move to a GPU, save, or take forward-mode and second-order
    drivers (they need every entry as compiled code): those raise.
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("subclasses of autograd.Function implement forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("subclasses of autograd.Function implement backward(ctx, ...)")

    @classmethod
    def apply(cls, *args, **kwargs):
        """Run ``forward`` on ``args`` and connect its outputs to the graph."""
        if kwargs:
            raise TypeError(f"{cls.__name__}.apply takes positional arguments only")
        return _apply(cls, args)


# ---------------------------------------------------------------- a Function call


class Call:
    """One recorded Function application: the class, the arguments (tensor positions hold
    ``None``), the tensor inputs' buffers and dtypes, the outputs' buffers, shapes and
    dtypes, and the eager call's context."""

    __slots__ = ("fn", "args", "tensor_pos", "ins", "in_dtypes", "outs", "out_shapes",
                 "out_dtypes", "out_pos", "ctx", "needs")  # fmt: skip

    @property
    def label(self):
        """How entries and messages name the call."""
        return f"{self.fn.__name__}.apply"

    def forward(self, tp, data, tls):
        """Run the Function's ``forward`` on the values in arena ``data``; write its outputs
        there. The context is kept per thread for the backward that follows."""
        args = list(self.args)
        for k, b, dt in zip(self.tensor_pos, self.ins, self.in_dtypes):
            args[k] = Tensor(np.array(tp.view(data, b), dtype=dt))
        ctx = FunctionCtx(self.needs)
        with no_grad():
            res = self.fn.forward(ctx, *args)
        outs = res if isinstance(res, (tuple, list)) else (res,)
        if len(outs) <= self.out_pos[-1]:
            raise _replay_error(self, f"returned {len(outs)} outputs")
        for b, pos, shape in zip(self.outs, self.out_pos, self.out_shapes):
            v = outs[pos]
            v = v._peek() if isinstance(v, Tensor) else np.asarray(v)
            if v.shape != shape:
                raise _replay_error(
                    self, f"output {pos} has shape {tuple(v.shape)}, recorded {tuple(shape)}"
                )
            tp.view(data, b)[...] = v
        tls[id(self)] = ctx

    def backward(self, tp, data, grad, need, ctx):
        """Run the Function's ``backward`` on the outputs' adjoints and add what it returns to
        the inputs' adjoints."""
        if ctx is None:
            raise RuntimeError(f"{self.fn.__name__}.backward: no forward ran on this thread")
        gouts = []
        for b, shape, dt in zip(self.outs, self.out_shapes, self.out_dtypes):
            if need[b] and tp.bufs[b, B_KIND] != CONST:
                gouts.append(Tensor(np.array(tp.view(grad, b), dtype=dt)))
            elif ctx.materialize_grads:
                gouts.append(Tensor(np.zeros(shape, dt)))
            else:
                gouts.append(None)
        with no_grad():
            res = self.fn.backward(ctx, *gouts)
        gins = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        n = len(self.args)
        if len(gins) != n:
            raise RuntimeError(
                f"{self.fn.__name__}.backward returned an incorrect number of gradients "
                f"(expected {n}, got {len(gins)})"
            )
        for k, b in zip(self.tensor_pos, self.ins):
            g = gins[k]
            if g is None or tp.bufs[b, B_KIND] == CONST or not need[b]:
                continue
            g = g._peek() if isinstance(g, Tensor) else np.asarray(g, np.float64)
            tp.view(grad, b)[...] += _sum_to(self.fn.__name__, k, g, tp.shapes[b])


def _sum_to(name, k, g, shape):
    """``g`` summed down to ``shape`` where it was broadcast (as PyTorch accepts)."""
    if g.shape == shape:
        return g
    try:
        if np.broadcast_shapes(g.shape, shape) != g.shape:
            raise ValueError
    except ValueError:
        raise RuntimeError(
            f"{name}.backward: gradient {k} has shape {tuple(g.shape)}, but input {k} has shape {tuple(shape)}"
        ) from None
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(a for a, s in enumerate(shape) if s == 1 and g.shape[a] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _replay_error(call, what):
    return ReplayError(
        f"{call.fn.__name__}.forward {what} at replay: a tape replays the shapes it recorded"
    )


class FunctionCtx:
    """The ``ctx`` of :class:`tape.autograd.Function`'s ``forward`` and ``backward``."""

    def __init__(self, needs=()):
        self.needs_input_grad = tuple(needs)
        self.saved_tensors = ()
        self.non_differentiable = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors):
        """Keep tensors (or None) for ``backward``, as ``ctx.saved_tensors``."""
        for k, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(
                    f"save_for_backward can only save tensors (or None), got {type(t).__name__} "
                    f"at position {k}; keep other values as attributes of ctx"
                )
        self.saved_tensors = tuple(tensors)

    def mark_non_differentiable(self, *tensors):
        """Outputs that get no gradient (their adjoints in ``backward`` are zeros)."""
        self.non_differentiable = tuple(tensors)

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)

    def mark_dirty(self, *tensors):
        raise NotImplementedError(
            "mark_dirty: in-place autograd.Functions are not supported; return a new tensor"
        )


def _apply(fn, args):
    """``fn.apply(*args)``: run ``fn.forward`` now; record it when gradients or a recording
    need it (see the module docstring)."""
    grad_on = _tensor.is_grad_enabled()
    rec, eager = _tensor.tapes_of(args)
    needs = tuple(isinstance(a, Tensor) and a._rg and grad_on for a in args)
    ctx = FunctionCtx(needs)
    plain = [Tensor(a._peek()) if isinstance(a, Tensor) else a for a in args]
    with no_grad():
        res = fn.forward(ctx, *plain)
    single = not isinstance(res, (tuple, list))
    outs = (res,) if single else tuple(res)
    if rec is None and not any(needs):
        return res
    tensors = [k for k, a in enumerate(args) if isinstance(a, Tensor)]
    out_pos = [k for k, o in enumerate(outs) if isinstance(o, Tensor)]
    if not out_pos:
        if rec is not None:
            raise NotImplementedError(
                f"{fn.__name__}.forward returned no tensor: inside tape.record() a Function "
                "must return tensors"
            )
        return res
    target = rec if rec is not None else _tensor._union(eager, [args[k] for k in tensors])
    for o in (outs[k] for k in out_pos):
        if o.dtype.kind == "f" and o.dtype.itemsize > target.dtype.itemsize:
            target.promote(o.dtype)
    ins = [_tensor._buffer_in(target, args[k], grad_on) for k in tensors]
    active = grad_on and any(
        needs[k] or target.bufs[b, B_KIND] != CONST for k, b in zip(tensors, ins)
    )
    nondiff = {id(t) for t in ctx.non_differentiable}
    call = Call()
    call.fn = fn
    call.args = tuple(None if isinstance(a, Tensor) else a for a in args)
    call.tensor_pos = tensors
    call.ins = ins
    call.in_dtypes = [args[k].dtype for k in tensors]
    call.out_pos = out_pos
    call.ctx = ctx
    call.needs = needs
    result = list(outs)
    diff = [active and outs[p].dtype.kind == "f" and id(outs[p]) not in nondiff for p in out_pos]
    bufs = _callbacks.add_group(target, call, [outs[p]._peek() for p in out_pos], diff)
    for pos, b, d in zip(out_pos, bufs, diff):
        o = outs[pos]
        if d:
            result[pos] = Tensor._traced(target, b, tuple(o.shape), o.dtype, True, fn.__name__)
        elif target.recording:  # recomputed at every replay, but no gradient: a leaf
            result[pos] = Tensor._traced(target, b, tuple(o.shape), o.dtype, False, None)
        else:
            result[pos] = o  # eager: a plain tensor outside the graph, as in PyTorch
    return result[0] if single else tuple(result)


# ---------------------------------------------------------------- PyTorch's gradcheck


def _check_inputs(what, inputs):
    inputs = _seq(inputs)
    wrt = [k for k, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not wrt:
        raise ValueError(
            f"{what} expects at least one input tensor to require gradient, but none of them "
            "have requires_grad=True."
        )
    return inputs, wrt


def _values_of(inputs):
    return [x._peek() if isinstance(x, Tensor) else np.asarray(x) for x in inputs]


def gradcheck(func, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True,
              **flags):  # fmt: skip
    """PyTorch's ``torch.autograd.gradcheck(func, inputs, ...)``: compare the gradient of
    ``func`` with respect to the ``inputs`` that require grad with central finite
    differences (:func:`tape.gradcheck`, float64). Returns True; on a mismatch raises
    :class:`tape.GradcheckError` (a ``RuntimeError``), or returns False with
    ``raise_exception=False``. Forward mode is checked against reverse mode unless
    ``check_forward_ad=False`` is passed (PyTorch's default is not to check it; here it is).
    PyTorch's other flags (``fast_mode``, ...) are accepted and change nothing."""
    from tape.frontend.testing import GradcheckError
    from tape.frontend.testing import gradcheck as _gradcheck

    inputs, wrt = _check_inputs("gradcheck", inputs)
    try:
        return _gradcheck(func, *_values_of(inputs), eps=eps, atol=atol, rtol=rtol, wrt=wrt,
                          check_forward_ad=bool(flags.get("check_forward_ad", True)))
    except GradcheckError:
        if raise_exception:
            raise
        return False


def gradgradcheck(func, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3,
                  gen_non_contig_grad_outputs=False, raise_exception=True, **flags):  # fmt: skip
    """PyTorch's ``torch.autograd.gradgradcheck``: second derivatives of ``func`` (through
    ``<grad_outputs, func(inputs)>``, random ``grad_outputs`` unless given) against finite
    differences of its gradient: Hessian-vector products of the recorded tape
    (:func:`tape.gradcheck` with ``order=2``). Returns True, raises
    :class:`tape.GradcheckError`, or returns False with ``raise_exception=False``."""
    from tape.frontend.testing import GradcheckError
    from tape.frontend.testing import gradcheck as _gradcheck

    inputs, wrt = _check_inputs("gradgradcheck", inputs)
    vals = _values_of(inputs)
    with no_grad():
        outs = func(*[_tensor.tensor(v) for v in vals])
    outs = _seq(outs)
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        us = [rng.standard_normal(o.shape) for o in outs]
    else:
        us = [g._peek() if isinstance(g, Tensor) else np.asarray(g, np.float64)
              for g in _seq(grad_outputs)]  # fmt: skip

    def scalar(*args):
        total = None
        for o, u in zip(_seq(func(*args)), us):
            term = (o * u).sum()
            total = term if total is None else total + term
        return total

    try:
        return _gradcheck(scalar, *vals, eps=eps, atol=atol, rtol=rtol, wrt=wrt, order=2)
    except GradcheckError:
        if raise_exception:
            raise
        return False


# ---------------------------------------------------------------- create_graph=True


class _SecondOrder:
    """What the node of a differentiable gradient needs: the graph's outputs and seeds, the
    gradients' inputs, the leaves the node feeds, and the gradient values."""

    def __init__(self, outs, seeds, ins, leaves, values):
        self.outs, self.seeds, self.ins, self.leaves, self.values = outs, seeds, ins, leaves, values

    def hvp(self, us):
        """For each leaf ``l``: ``d/dl <u, grad_x y>`` = the Hessian-vector product of the
        graph at ``l``, with the tangent ``u_k`` on input ``k`` (forward-over-reverse)."""
        from tape.interpreter import dispatch
        from tape.interpreter.generated import sweeps

        tp = self.outs[0]._resolve()[0]
        roots = np.array([o._resolve()[1] for o in self.outs], np.int64)
        if tp._freed is not None and tp.reaches_freed(roots):
            raise RuntimeError(
                "Trying to backward through the graph a second time: the graph of a "
                "create_graph=True gradient was freed by a backward() without retain_graph"
            )
        n = tp.n_entries
        emask, need = sweeps.reach(tp.entries, tp.bufs, n, roots)
        sub = np.ascontiguousarray(tp.entries[:n][np.asarray(emask[:n], bool)])
        if (sub[:, 0] < 0).any():
            raise NotImplementedError(
                "the gradient of a create_graph=True gradient passes through an "
                "autograd.Function or a custom op, or through another create_graph=True "
                "gradient (third order): they have first derivatives only"
            )
        dt = tp.dtype
        dispatch.prepare(np.unique(sub[:, 0]), dt, (dispatch.REV, dispatch.TAN, dispatch.HREV))
        m = tp.data.shape[0]
        T = np.zeros((1, m), dt)
        GT = np.zeros((1, m), dt)
        grad = np.zeros(m, dt)
        bufs = tp.bufs
        for x, u in zip(self.ins, us):
            if u is None:
                continue
            u = np.asarray(u._peek() if isinstance(u, Tensor) else u, dt).ravel()
            for leaf, lb in tp.leaves:
                if leaf is x:
                    off = bufs.item(lb, B_OFF)
                    T[0, off : off + u.size] = u
        seeds = np.ascontiguousarray(self.seeds, dt)
        sweeps.hvp_pass(sub, bufs, tp.ipool, tp.data, grad, T, GT, sub.shape[0], tp.n_bufs,
                        roots, seeds)  # fmt: skip
        out = []
        for leaf_t in self.leaves:
            g = None
            for leaf, lb in tp.leaves:
                if leaf is leaf_t and need[lb] and bufs[lb, B_KIND] == LEAF:
                    off = bufs.item(lb, B_OFF)
                    a = GT[0, off : off + leaf_t.numel()]
                    g = a.copy() if g is None else g + a
            out.append(None if g is None else Tensor(g.astype(leaf_t.dtype).reshape(leaf_t.shape)))
        return out


class _GradientNode(Function):
    """The node of the gradients ``grad(..., create_graph=True)`` returns: its inputs are
    the graph's leaves, its backward the Hessian-vector product (:meth:`_SecondOrder.hvp`)."""

    @staticmethod
    def forward(ctx, state, *leaves):
        ctx.state = state
        return tuple(Tensor(np.array(v, copy=True)) for v in state.values)

    @staticmethod
    def backward(ctx, *us):
        return (None, *ctx.state.hvp(us))


def _differentiable(tp, outs, seeds, ins, res, need):
    leaves, seen = [], set()
    for leaf, lb in tp.leaves:  # true leaves (not views of them, which share their memory)
        if leaf._rg and leaf._op is None and need[lb] and id(leaf) not in seen:
            seen.add(id(leaf))
            leaves.append(leaf)
    pos = [k for k, r in enumerate(res) if r is not None]
    if not pos:
        return tuple(res)
    state = _SecondOrder(
        list(outs), seeds, [ins[k] for k in pos], leaves, [res[k]._peek() for k in pos]
    )
    got = _GradientNode.apply(state, *leaves)
    got = (got,) if isinstance(got, Tensor) else tuple(got)
    out = list(res)
    for k, g in zip(pos, got):
        out[k] = g
    return tuple(out)


def backward_create_graph(t, gradient, inputs=None):
    """``t.backward(gradient, create_graph=True)``: every leaf's (or ``inputs``') gradient
    accumulates into ``.grad`` as a tensor that is differentiable once more."""
    tp = t._resolve()[0] if t._tape is not None else None
    if inputs is None:
        if tp is None:
            inputs = [t] if t._rg else []
        else:
            inputs, seen = [], set()
            for leaf, _ in tp.leaves:
                if leaf._rg and leaf._op is None and id(leaf) not in seen:
                    seen.add(id(leaf))
                    inputs.append(leaf)
    gs = grad(t, inputs, None if gradient is None else [gradient], create_graph=True,
              allow_unused=True)  # fmt: skip
    for x, g in zip(inputs, gs):
        if g is not None:
            x.grad = g if x.grad is None else x.grad + g
