"""Builders shared by the scalar-objective problems: one per tool, from one formula.

A problem is ``f(B, params, consts) -> scalar`` written against a backend ``B`` (see
:mod:`tape.bench.backends`). ``params`` are differentiated, ``consts`` are data. Every tool
runs that formula in its natural style:

- tape: ``tp.record`` once (constants captured), then ``t.gradient(*params)`` per call;
  objective ``t.forward(*params)``; on the interpreter (``tape``) and on the compiled tier
  (``tape compiled``).
- tape eager: leaves with ``requires_grad=True``, PyTorch style: clear ``.grad``, build the
  loss, ``loss.backward()``.
- JAX: ``jax.jit(jax.grad(f, argnums=params))`` in float64, data passed as jit arguments,
  inputs already on the device, ``block_until_ready`` on the result.
- PyTorch: eager CPU float64, like tape eager.
- HIPS autograd: ``autograd.grad``.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from tape.bench import backends
from tape.bench.harness import Impl, Skip


@functools.cache
def backend(name):
    cls = dict(
        numpy=backends.NumpyB, tape=backends.TapeB, torch=backends.TorchB, jax=backends.JaxB,
        autograd=backends.AutogradB,
    )[name]  # fmt: skip
    try:
        return cls()
    except ImportError as e:
        raise Skip(f"{name} is not installed") from e


def tape_replay(f, params, consts, compile=False):
    """Record once, replay per call: on the interpreter (``compile=False``) or on the compiled
    tier (``compile=True``; its compile time lands in the ``first`` column)."""
    import tape as tp

    B = backend("tape")
    cs = [tp.tensor(c) if np.asarray(c).dtype.kind == "f" else np.asarray(c) for c in consts]
    n = len(params)
    try:
        t = tp.record(lambda *ps: f(B, ps, cs), *params, wrt=list(range(n)), compile=compile)
    except tp.CompileError as e:
        raise Skip(str(e).split(":")[0]) from None
    note = f"{len(t)} entries"
    if compile:
        fused = re.search(r"\((\d+) fused loops\)", t.compiled_source)
        note += f", {fused.group(1) if fused else '?'} fused loops"
    impl = Impl(grad=lambda: t.gradient(*params), value=lambda: t.forward(*params), note=note)
    impl.tape, impl.args = t, params  # for tape.bench.profile
    return impl


def tape_eager(f, params, consts):
    import tape as tp

    B = backend("tape")
    cs = [tp.tensor(c) if np.asarray(c).dtype.kind == "f" else np.asarray(c) for c in consts]
    ps = [tp.tensor(p, requires_grad=True) for p in params]
    return _eager(f, B, ps, cs, tp.no_grad)


def _eager(f, B, ps, cs, no_grad):
    """Eager (PyTorch-style) gradient and value of ``f`` for tape and torch alike."""

    def grad():
        for p in ps:
            p.grad = None
        loss = f(B, ps, cs)
        loss.backward()
        return [p.grad for p in ps]

    def value():
        with no_grad():
            return f(B, ps, cs)

    return Impl(grad=grad, value=value)


def jax_jit(f, params, consts):
    B = backend("jax")
    jax = B.jax
    xs = [B.jnp.asarray(p) for p in params]
    cs = [B.jnp.asarray(c) for c in consts]
    n = len(xs)

    def fj(*a):
        return f(B, a[:n], a[n:])

    g = jax.jit(jax.grad(fj, argnums=tuple(range(n))))
    v = jax.jit(fj)
    return Impl(
        grad=lambda: jax.block_until_ready(g(*xs, *cs)),
        value=lambda: jax.block_until_ready(v(*xs, *cs)),
    )


def torch_eager(f, params, consts):
    B = backend("torch")
    torch = B.torch
    ps = [torch.tensor(np.asarray(p), dtype=torch.float64, requires_grad=True) for p in params]
    cs = [B.const(c) for c in consts]
    return _eager(f, B, ps, cs, torch.no_grad)


def autograd_grad(f, params, consts):
    B = backend("autograd")
    n = len(params)
    cs = [np.asarray(c) for c in consts]
    g = B.autograd.grad(lambda *ps: f(B, ps, cs), list(range(n)))
    return Impl(grad=lambda: g(*params), value=lambda: f(B, params, cs))


def scalar_builders(f, params, consts=(), *, hand=None, eager=True):
    """``{tool: builder}`` for a scalar objective ``f(B, params, consts)``."""
    params = [np.ascontiguousarray(p, np.float64) for p in params]
    out = {
        "tape": lambda: tape_replay(f, params, consts),
        "tape compiled": lambda: tape_replay(f, params, consts, compile=True),
    }
    if eager:
        out["tape eager"] = lambda: tape_eager(f, params, consts)
    if hand is not None:
        out["njit (hand)"] = hand
    out["jax jit"] = lambda: jax_jit(f, params, consts)
    out["torch"] = lambda: torch_eager(f, params, consts)
    out["autograd"] = lambda: autograd_grad(f, params, consts)
    return out
