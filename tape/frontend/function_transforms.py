"""Function transforms with JAX's signatures: ``tp.grad``, ``tp.value_and_grad``,
``tp.jacobian``, ``tp.hessian``, ``tp.jvp``, ``tp.vjp`` and ``tp.hvp``.

A transformed function records ``fn`` once per argument shapes and dtypes (:func:`tape.record`)
and replays that tape afterwards; a Python branch on a traced value is a guard, and a replay
whose arguments take another path retraces (``on_change="retrace"``). ``fn`` takes tensors and
returns a tensor (a tuple of tensors where the transform allows several outputs). Values it
closes over are constants of the tape: change them and the cached tape is stale, so make them
arguments instead.
"""

from __future__ import annotations

import functools

import numpy as np

from tape.frontend.record import record
from tape.frontend.tensor import Tensor


def _array(a):
    return np.asarray(a.numpy() if isinstance(a, Tensor) else a)


class _Traced:
    """One function's tapes, keyed by argument shapes and dtypes."""

    def __init__(self, fn, wrt):
        self.fn = fn
        self.wrt = wrt
        self.tapes = {}

    def __call__(self, args):
        arrs = [_array(a) for a in args]
        for k in self.wrt:
            if k >= len(arrs):
                raise ValueError(
                    f"argnums: argument {k} was requested, the function got {len(arrs)}"
                )
        key = tuple((a.shape, a.dtype.str) for a in arrs)
        t = self.tapes.get(key)
        if t is None:
            t = self.tapes[key] = record(self.fn, *arrs, wrt=self.wrt)
        return t, arrs


def _argnums(argnums):
    """``(sorted positions, order of the caller's argnums in them, single)``."""
    single = isinstance(argnums, (int, np.integer))
    nums = (int(argnums),) if single else tuple(int(a) for a in argnums)
    if not nums or len(set(nums)) != len(nums) or min(nums) < 0:
        raise ValueError(
            f"argnums must be a non-negative int or a tuple of distinct ones, got {argnums!r}"
        )
    wrt = sorted(nums)
    return wrt, [wrt.index(a) for a in nums], single


def _per_arg(res, order, single):
    """A per-argument result (single array or tuple in sorted order) in the caller's order."""
    parts = res if isinstance(res, tuple) and len(order) > 1 else (res,)
    return parts[0] if single else tuple(parts[k] for k in order)


def grad(fn, argnums=0):
    """``grad(fn)(*args)``: the gradient of the scalar ``fn`` with respect to argument
    ``argnums`` (an int: one array; a tuple: a tuple of arrays).

    Examples
    --------
    >>> import numpy as np, tape as tp
    >>> tp.grad(lambda x, y: (x * y).sum(), argnums=(0, 1))(np.ones(2), np.arange(2.0))
    (array([0., 1.]), array([1., 1.]))
    """
    wrt, order, single = _argnums(argnums)
    traced = _Traced(fn, wrt)

    @functools.wraps(fn)
    def g(*args):
        t, arrs = traced(args)
        return _per_arg(t.gradient(*arrs), order, single)

    return g


def value_and_grad(fn, argnums=0):
    """``value_and_grad(fn)(*args)`` -> ``(fn(*args), grad(fn, argnums)(*args))``.

    Examples
    --------
    >>> import numpy as np, tape as tp
    >>> value, g = tp.value_and_grad(lambda x: (x * x).sum())(np.array([1.0, 2.0]))
    >>> float(value), g
    (5.0, array([2., 4.]))
    """
    wrt, order, single = _argnums(argnums)
    traced = _Traced(fn, wrt)

    @functools.wraps(fn)
    def g(*args):
        t, arrs = traced(args)
        v, gr = t.value_and_grad(*arrs)
        return v, _per_arg(gr, order, single)

    return g


def jacobian(fn, argnums=0, mode="auto"):
    """``jacobian(fn)(*args)``: JAX's ``jacfwd``/``jacrev`` result (``out.shape + arg.shape``;
    tuples over ``argnums`` when it is a tuple, over the outputs when ``fn`` returns a
    tuple). ``mode``: ``"auto"``, ``"fwd"`` or ``"rev"`` (:meth:`Tape.jacobian`).

    Examples
    --------
    >>> import numpy as np, tape as tp
    >>> tp.jacobian(lambda x: x * x)(np.array([1.0, 2.0]))
    array([[2., 0.],
           [0., 4.]])
    """
    wrt, order, single = _argnums(argnums)
    traced = _Traced(fn, wrt)

    @functools.wraps(fn)
    def g(*args):
        t, arrs = traced(args)
        J = t.jacobian(*arrs, mode=mode)
        if t.single_output:
            return _per_arg(J, order, single)
        return tuple(_per_arg(j, order, single) for j in J)

    return g


jacrev = functools.partial(jacobian, mode="rev")
jacrev.__doc__ = """``jacrev(fn, argnums=0)(*args)``: :func:`jacobian` by reverse mode, one
reverse sweep per output element (JAX's ``jax.jacrev``)."""
jacfwd = functools.partial(jacobian, mode="fwd")
jacfwd.__doc__ = """``jacfwd(fn, argnums=0)(*args)``: :func:`jacobian` by forward mode, tangent
sweeps that carry several directions at once (JAX's ``jax.jacfwd``)."""


def hessian(fn, argnums=0):
    """``hessian(fn)(*args)``: the Hessian of the scalar ``fn`` (``arg.shape + arg.shape``;
    tuples of tuples of blocks when ``argnums`` is a tuple), by forward-over-reverse.

    Examples
    --------
    >>> import numpy as np, tape as tp
    >>> tp.hessian(lambda x: (x**3).sum())(np.array([1.0, 2.0]))
    array([[ 6.,  0.],
           [ 0., 12.]])
    """
    wrt, order, single = _argnums(argnums)
    traced = _Traced(fn, wrt)

    @functools.wraps(fn)
    def g(*args):
        t, arrs = traced(args)
        H = t.hessian(*arrs)
        if single:
            return H
        if len(order) == 1:
            return ((H,),)
        return tuple(tuple(H[a][b] for b in order) for a in order)

    return g


def _all_floats(primals):
    wrt = [k for k, a in enumerate(primals) if _array(a).dtype.kind == "f"]
    if len(wrt) != len(primals):
        bad = [k for k in range(len(primals)) if k not in wrt]
        raise TypeError(f"primals {bad} are not floating point: they have no tangents")
    return wrt


def _tuple(x, what):
    if not isinstance(x, (tuple, list)):
        raise TypeError(
            f"{what} must be a tuple or list (one entry per argument), got {type(x).__name__}"
        )
    return tuple(x)


_TRACED_CACHE_ATTR = "_tape_traced"


def _traced_for(fn, wrt):
    """A cache of tapes per function for the transforms called with ``fn`` directly
    (``jvp``, ``vjp``, ``hvp``), kept on the function when it allows attributes."""
    key = tuple(wrt)
    store = getattr(fn, _TRACED_CACHE_ATTR, None)
    if store is None:
        store = {}
        try:
            setattr(fn, _TRACED_CACHE_ATTR, store)
        except (AttributeError, TypeError):
            pass
    traced = store.get(key)
    if traced is None:
        traced = store[key] = _Traced(fn, list(wrt))
    return traced


def jvp(fn, primals, tangents):
    """``(fn(*primals), J @ tangents)``: forward mode over every argument (JAX's ``jvp``:
    ``primals`` and ``tangents`` are tuples of the same structure)."""
    primals = _tuple(primals, "jvp: primals")
    tangents = _tuple(tangents, "jvp: tangents")
    if len(tangents) != len(primals):
        raise ValueError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    t, arrs = _traced_for(fn, _all_floats(primals))(primals)
    return t.jvp(*arrs, tangents=tangents)


def vjp(fn, *primals):
    """``(fn(*primals), vjp_fn)``; ``vjp_fn(cotangent)`` returns a tuple with one cotangent per
    primal (JAX's ``vjp``)."""
    t, arrs = _traced_for(fn, _all_floats(primals))(primals)
    value = t.forward(*arrs)

    def vjp_fn(cotangent):
        _, g = t.vjp(*arrs, cotangent=cotangent)
        return g if isinstance(g, tuple) else (g,)

    return value, vjp_fn


def hvp(fn, primals, v):
    """The Hessian of the scalar ``fn`` at ``primals`` times ``v`` (both tuples over the
    arguments), the same as JAX's ``jvp(grad(fn), primals, v)[1]`` over every argument:
    one array for one argument, a tuple for several. Forward-over-reverse on the recorded
    tape."""
    primals = _tuple(primals, "hvp: primals")
    v = _tuple(v, "hvp: v")
    if len(v) != len(primals):
        raise ValueError(f"hvp: {len(primals)} primals but {len(v)} directions")
    t, arrs = _traced_for(fn, _all_floats(primals))(primals)
    return t.hvp(*arrs, v=v)
