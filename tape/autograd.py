"""``tape.autograd``: PyTorch's ``torch.autograd``: :func:`grad`, :func:`backward` and
:class:`Function` (user-defined forward and backward in Python) for eager tensors.

Higher-order derivatives come from recorded tapes, not from eager graphs: use
:meth:`tape.Tape.hvp` / :meth:`tape.Tape.hessian` (or :func:`tape.hvp`, :func:`tape.hessian`)
on ``tape.record(fn, x)``.
"""

from __future__ import annotations

import numpy as np

from tape import _callbacks
from tape._callbacks import FunctionCtx
from tape._layout import B_KIND, LEAF
from tape._tensor import Tensor

__all__ = ["grad", "backward", "Function", "FunctionCtx"]

CREATE_GRAPH = (
    "tape.autograd.grad(create_graph=True): eager graphs are first order. For second "
    "derivatives record the function and use the tape's drivers: t = tape.record(fn, x); "
    "t.hvp(x, v=v) or t.hessian(x) (or the transforms tape.hvp(fn, (x,), (v,)) and "
    "tape.hessian(fn)(x))"
)


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
    graph is freed as by ``backward()``. ``create_graph=True`` raises ``NotImplementedError``
    naming the drivers to use instead.
    """
    if create_graph:
        raise NotImplementedError(CREATE_GRAPH)
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
                    f"shape {o.shape}: pass grad_outputs"
                )
            seeds.append(np.ones(1))
        else:
            s = np.asarray(g._peek() if isinstance(g, Tensor) else g, np.float64)
            if s.shape != tuple(o.shape):
                raise RuntimeError(
                    f"grad: grad_outputs[{k}] has shape {s.shape}, outputs[{k}] has shape {o.shape}"
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
        from tape._tensor import stale

        stale(tp, roots)
    if tp._freed is not None and tp.reaches_freed(roots):
        raise RuntimeError(
            "Trying to backward through the graph a second time: specify retain_graph=True "
            "on the first backward() or grad() call"
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
    if not (retain_graph or False):
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
        return _callbacks.apply(cls, args)
