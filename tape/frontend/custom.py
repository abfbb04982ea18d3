"""User-defined ops from the user's own functions over NumPy arrays: :func:`custom_op`.

::

    from numba import njit
    import tape as tp

    @njit
    def softclip_fwd(x, c):
        return c * np.tanh(x / c)

    @njit
    def softclip_vjp(gy, y, x, c):
        r = y / c
        return gy * (1.0 - r * r), np.zeros_like(c)

    softclip = tp.custom_op("softclip", softclip_fwd, softclip_vjp)
    y = softclip(x, tp.tensor(2.0))          # eager, with backward()
    t = tp.record(lambda x: softclip(x, 2.0).sum(), x0)   # recorded; replays call them

How a custom op reaches compiled code. An application is recorded as a group of callback
entries (the mechanism of :class:`tape.autograd.Function`, :mod:`tape.program.callbacks`): the
interpreter's compiled sweeps run in segments between the groups, and at a group Python calls
``fwd`` (forward) or ``vjp`` (reverse) on views of the tape's arenas, with no copies of the
inputs. With ``@njit`` functions the cost is one dispatcher call each way, a few microseconds
per application, whatever the sizes; the work inside runs at compiled speed. Eager
``backward()``, every replay (``forward``, ``gradient``, ``value_and_grad``, guards,
retracing), ``gradient_batch`` (instance by instance), ``vjp`` and reverse Jacobians (the
reverse sweep in segments), and forward mode when ``jvp`` is given (the tangent sweep in
segments: ``jvp``, forward Jacobians) take custom ops; so does the compiled tier (below).
Saving, second derivatives and sparsity patterns need every entry as compiled code of the
package: they raise a clear error naming the op.

On the GPU. An op made with ``cuda_fwd=`` and ``cuda_vjp=`` (CUDA device functions over
scalars) replays on the GPU too (``t.to("cuda")``, :func:`tape.cuda.gradient_batch`): the
op is then elementwise, its output has the broadcast shape of its inputs, and one thread
computes one output element (:mod:`tape.gpu._custom`). ::

    from numba import cuda

    @cuda.jit(device=True)
    def softclip_cuda_fwd(x, c):
        return c * math.tanh(x / c)

    @cuda.jit(device=True)
    def softclip_cuda_vjp(gy, y, x, c):
        r = y / c
        d = 1.0 - r * r
        return gy * d, gy * (r - (x / c) * d)

    softclip = tp.custom_op("softclip", softclip_fwd, softclip_vjp,
                            cuda_fwd=softclip_cuda_fwd, cuda_vjp=softclip_cuda_vjp)
"""

from __future__ import annotations

import numpy as np

from tape.frontend import tensor
from tape.layout.columns import B_KIND, CONST
from tape.program import callbacks


class _Call:
    """One recorded application of a :class:`CustomOp` (the interface of
    :class:`tape.autograd.Call`)."""

    __slots__ = ("fn", "ins", "in_shapes", "outs", "out_shapes", "out_dtypes", "ctx")
    compiled_ok = True  # the compiled tier calls fwd and vjp from generated code

    @property
    def label(self):
        return self.fn.name

    def _inputs(self, tp, data):
        return [tp.view(data, b).reshape(s) for b, s in zip(self.ins, self.in_shapes)]

    def forward(self, tp, data, tls):
        """``fwd`` on the arena's input values; the output written in place."""
        y = self.fn._value(self._inputs(tp, data), self.out_shapes[0], at="replay")
        tp.view(data, self.outs[0])[...] = y

    def tangent(self, tp, data, tensor):
        """Forward mode: ``jvp`` on the inputs' tangents, one call per direction (row of the
        tangent arenas ``T``); the output's tangent written there."""
        fn = self.fn
        if fn.jvp is None:
            raise NotImplementedError(
                f"forward mode: custom_op {fn.name!r} was made without jvp=; give "
                "jvp(y, *inputs, *tangents) -> output tangent, or use reverse mode"
            )
        xs = self._inputs(tp, data)
        o = self.outs[0]
        y = tp.view(data, o).reshape(self.out_shapes[0])
        for r in range(tensor.shape[0]):
            ts = [tp.view(tensor[r], b).reshape(sh) for b, sh in zip(self.ins, self.in_shapes)]
            ty = np.asarray(fn.jvp(y, *xs, *ts))
            if ty.shape != y.shape and ty.size != y.size:
                raise ValueError(
                    f"custom_op {fn.name!r}: jvp returned shape {tuple(ty.shape)}, the output has "
                    f"shape {tuple(y.shape)}"
                )
            tp.view(tensor[r], o)[...] = ty.reshape(tp.shapes[o])

    def gpu_problem(self):
        """Why GPU replay cannot run this application (None if it can)."""
        fn = self.fn
        if fn.cuda_fwd is None:
            return (
                f"custom_op {fn.name!r} has no CUDA device functions: make it with "
                "custom_op(..., cuda_fwd=, cuda_vjp=) to replay it on the GPU"
            )
        try:
            ok = np.broadcast_shapes(*self.in_shapes) == tuple(self.out_shapes[0])
        except ValueError:
            ok = False
        if not ok:
            return (
                f"custom_op {fn.name!r}: its CUDA functions run elementwise, so its output must "
                f"have the broadcast shape of its inputs {[tuple(s) for s in self.in_shapes]}; "
                f"this application's output has shape {tuple(self.out_shapes[0])}"
            )
        return None

    def backward(self, tp, data, grad, need, ctx):
        """``vjp`` on the output's adjoint; the cotangents added to the inputs' adjoints."""
        o = self.outs[0]
        if not need[o] or tp.bufs[o, B_KIND] == CONST:
            return
        xs = self._inputs(tp, data)
        y = tp.view(data, o).reshape(self.out_shapes[0])
        gy = tp.view(grad, o).reshape(self.out_shapes[0])
        for b, g in zip(self.ins, self.fn._cotangents(gy, y, xs)):
            if tp.bufs[b, B_KIND] != CONST and need[b]:
                tp.view(grad, b)[...] += g.reshape(tp.shapes[b])


class CustomOp:
    """An op made by :func:`custom_op`; call it on tensors (or arrays and numbers)."""

    def __init__(self, name, fwd, vjp, jvp=None, out_shape=None, cuda_fwd=None, cuda_vjp=None):
        for what, f in (("fwd", fwd), ("vjp", vjp)):
            if not callable(f):
                raise TypeError(f"custom_op {name!r}: {what} must be callable, got {f!r}")
        for what, f in (("jvp", jvp), ("cuda_fwd", cuda_fwd), ("cuda_vjp", cuda_vjp)):
            if f is not None and not callable(f):
                raise TypeError(f"custom_op {name!r}: {what} must be callable or None, got {f!r}")
        if (cuda_fwd is None) != (cuda_vjp is None):
            raise TypeError(
                f"custom_op {name!r}: give cuda_fwd and cuda_vjp together (the GPU replay "
                "runs both sweeps), or neither"
            )
        if out_shape is not None and not callable(out_shape):
            raise TypeError(f"custom_op {name!r}: out_shape must be callable or None")
        self.name = str(name)
        self.__name__ = self.name
        self.fwd, self.vjp, self.jvp, self.out_shape = fwd, vjp, jvp, out_shape
        self.cuda_fwd, self.cuda_vjp = cuda_fwd, cuda_vjp
        self._gpu = {}  # the GPU kernels, per arity (tape.gpu._custom)

    def __repr__(self):
        return f"<tape.custom_op {self.name!r}>"

    def _shape(self, shapes):
        if self.out_shape is None:
            return tuple(shapes[0])
        try:
            return tuple(int(s) for s in self.out_shape(*shapes))
        except Exception as e:  # noqa: BLE001  (the user's function: say whose)
            raise ValueError(
                f"custom_op {self.name!r}: out_shape{tuple(shapes)} failed: {e}"
            ) from e

    def _value(self, xs, shape, at="call"):
        y = np.asarray(self.fwd(*xs))
        if y.shape != tuple(shape):
            raise ValueError(
                f"custom_op {self.name!r}: fwd returned shape {tuple(y.shape)} at {at}, expected "
                f"{tuple(shape)} (out_shape of input shapes {[x.shape for x in xs]})"
            )
        if y.dtype.kind not in "fiub":
            raise TypeError(f"custom_op {self.name!r}: fwd returned dtype {y.dtype}, not a number")
        return y

    def _cotangents(self, gy, y, xs):
        res = self.vjp(gy, y, *xs)
        gs = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        if len(gs) != len(xs):
            raise ValueError(
                f"custom_op {self.name!r}: vjp returned {len(gs)} cotangents for {len(xs)} inputs"
            )
        out = []
        for k, (g, x) in enumerate(zip(gs, xs)):
            g = np.asarray(g)
            if g.shape != x.shape:
                raise ValueError(
                    f"custom_op {self.name!r}: vjp cotangent {k} has shape {tuple(g.shape)}, "
                    f"input {k} has shape {tuple(x.shape)}"
                )
            out.append(g)
        return out

    def __call__(self, *inputs):
        if not inputs:
            raise TypeError(f"custom_op {self.name!r} needs at least one input")
        ts = [_as_float(x) for x in inputs]
        shape = self._shape([t.shape for t in ts])
        y = self._value([t._peek() for t in ts], shape)
        grad_on = tensor.is_grad_enabled()
        rec, eager = tensor.tapes_of(ts)
        need = grad_on and any(t._rg for t in ts)
        dtype = np.result_type(*[t.dtype for t in ts])
        if rec is None and not need:
            return tensor.Tensor(y.astype(dtype, copy=False))
        target = rec if rec is not None else tensor._union(eager, ts)
        if dtype.itemsize > target.dtype.itemsize:
            target.promote(dtype)
        call = _Call()
        call.fn = self
        call.ins = [tensor._buffer_in(target, t, grad_on) for t in ts]
        call.in_shapes = [t.shape for t in ts]
        call.ctx = None
        active = grad_on and any(target.bufs[b, B_KIND] != CONST for b in call.ins)
        (b,) = callbacks.add_group(target, call, [y.astype(target.dtype, copy=False)], [active])
        return tensor.Tensor._traced(target, b, shape, dtype, active, self.name)


def _as_float(x):
    t = tensor.as_tensor(x)
    if t.dtype.kind != "f":
        if t._tape is not None:
            raise TypeError(
                "custom_op inputs are float tensors (or constant arrays); got a traced "
                f"{t.dtype} tensor"
            )
        t = tensor.tensor(t.numpy().astype(np.float64))
    return t


def custom_op(name, fwd, vjp, jvp=None, out_shape=None, *, cuda_fwd=None, cuda_vjp=None):
    """A new op from the user's functions over NumPy arrays (``@njit`` functions run at
    compiled speed; plain Python functions work too).

    Parameters
    ----------
    name : str
        How entries, ``grad_fn`` and error messages name the op.
    fwd : callable
        ``fwd(*inputs) -> output``: arrays in, one array out.
    vjp : callable
        ``vjp(gy, y, *inputs) -> tuple of input cotangents`` (one array of each input's shape;
        a single array for a one-input op): the reverse rule.
    jvp : callable, optional
        ``jvp(y, *inputs, *tangents) -> output tangent`` (one tangent per input, zeros for
        constants): the forward-mode rule, used by ``t.jvp``, ``t.jacobian(mode="fwd")`` and
        the transforms built on them. Without it forward mode raises, naming the op.
    out_shape : callable, optional
        ``out_shape(*input_shapes) -> shape``; default: the first input's shape.
    cuda_fwd, cuda_vjp : callable, optional
        The op on the GPU, elementwise: ``cuda_fwd(x0, x1, ...) -> y`` and
        ``cuda_vjp(gy, y, x0, x1, ...) -> (g0, g1, ...)`` on scalars (one element of each
        input, broadcast to the output's shape; a one-input op may return ``g0`` alone),
        CUDA device functions (``@numba.cuda.jit(device=True)``; plain Python functions and
        ``@njit`` functions are compiled as device functions). Give both or neither. With
        them, ``t.to("cuda")`` and :func:`tape.cuda.gradient_batch` replay tapes holding the
        op on the GPU; without them they raise, naming the op. The output must have the
        broadcast shape of the inputs there. See :mod:`tape.gpu._custom`.

    Returns
    -------
    CustomOp
        ``op(*tensors)`` records the op eagerly or inside :func:`tape.record`; check it with
        :func:`tape.gradcheck`. See :mod:`tape.custom` for how it runs and what it costs.
    """
    return CustomOp(
        name, fwd, vjp, jvp=jvp, out_shape=out_shape, cuda_fwd=cuda_fwd, cuda_vjp=cuda_vjp
    )
