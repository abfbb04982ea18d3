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
- Dr.Jit (formulas of vectors only): LLVM backend, ``drjit.llvm.ad.Float64``, the gradient
  (``dr.enable_grad``, ``dr.backward``) inside a ``dr.freeze`` function, so that a call
  replays the recorded kernels instead of tracing again; ``dr.sync_thread()`` on the result.
  The formula as written: a slice is a gather, its adjoint a scatter-add (Rosenbrock
  n=1e5 on one thread of a loaded AMD EPYC: 2.8 ms; explicit gathers with
  ``mode=dr.ReduceMode.Direct``, 1.5 ms).
- CasADi (formulas of vectors and constant matrices): an ``MX`` expression, its symbolic
  ``ca.gradient`` (``ca.jacobian``, ``ca.hessian``, ``ca.jtimes`` for the derivatives of
  :mod:`tape.bench.second`) as a ``ca.Function``, called through ``Function.buffer`` on NumPy
  arrays (a plain call converts its arguments to ``DM`` and back: Rosenbrock's gradient at
  n=1e5 took 9.9 ms a plain call, 0.8 ms through the buffer). ``MX`` rather than ``SX``: its
  vector operations are single nodes (Rosenbrock's gradient at n=1,000: 6.7 us against 31 us
  with ``SX``; its Hessian: 0.43 ms against 2.5 ms).
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
        autograd=backends.AutogradB, drjit=backends.DrJitB, casadi=backends.CasadiB,
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


def _vectors_only(tool, params):
    if any(np.ndim(p) > 1 for p in params):
        raise Skip(f"{tool}: this benchmark passes it vector arguments only")


def drjit_frozen(f, params, consts):
    B = backend("drjit")
    _vectors_only("drjit", params)
    dr, F64 = B.dr, B.Float64
    xs = [F64(np.ravel(p)) for p in params]
    cs = [B.const(c) for c in consts]

    @dr.freeze
    def grad(xs, cs):
        xs = [F64(x) for x in xs]
        dr.enable_grad(xs)
        dr.backward(f(B, xs, cs))
        return [dr.grad(x) for x in xs]

    value = dr.freeze(lambda xs, cs: f(B, xs, cs))

    def call(fn):
        r = fn(xs, cs)
        dr.sync_thread()  # the LLVM backend's kernels run on its thread pool
        return r

    impl = Impl(
        grad=lambda: call(grad), value=lambda: call(value),
        grad_np=lambda r: np.concatenate([np.ravel(g.numpy()) for g in r]),
        value_np=lambda r: np.ravel(r.numpy()),
        note=f"LLVM backend, dr.freeze, {dr.thread_count()} threads",
    )  # fmt: skip
    impl.frozen = grad  # its n_recordings: 1 (traced once, replayed since)
    return impl


def casadi_buffered(F, args):
    """``call()`` evaluating the ``ca.Function`` ``F`` on the NumPy ``args`` through
    ``F.buffer()``: the arguments are read and the results written in place, no ``DM``
    conversion. ``call()`` returns the results: one float64 array per output, its nonzeros
    (column-major for a dense matrix: densify outputs with sparse patterns)."""
    args = [np.ascontiguousarray(np.ravel(a, order="F"), np.float64) for a in args]
    outs = [np.empty(F.nnz_out(k)) for k in range(F.n_out())]
    buf, trigger = F.buffer()
    for k, a in enumerate(args):
        buf.set_arg(k, memoryview(a))
    for k, o in enumerate(outs):
        buf.set_res(k, memoryview(o))

    def call():
        trigger()
        return outs

    call.keep = (buf, args)  # the buffer reads and writes these arrays
    return call


def casadi_symbols(f, params, consts, tool="casadi"):
    """``(ca, symbols, expression)``: ``f`` on ``MX`` columns of the parameters' sizes."""
    B = backend("casadi")
    _vectors_only(tool, params)
    if any(np.asarray(c).dtype.kind != "f" for c in consts):
        raise Skip(f"{tool}: this benchmark passes it float constants only")
    ca = B.ca
    xs = [ca.MX.sym(f"x{k}", np.size(p)) for k, p in enumerate(params)]
    return ca, xs, f(B, xs, [B.const(c) for c in consts])


def casadi_function(f, params, consts):
    ca, xs, y = casadi_symbols(f, params, consts)
    G = ca.Function("gradient", xs, [ca.densify(ca.gradient(y, x)) for x in xs])
    V = ca.Function("objective", xs, [y])
    return Impl(grad=casadi_buffered(G, params), value=casadi_buffered(V, params),
                note="MX Function, called through Function.buffer")  # fmt: skip


def scalar_builders(f, params, consts=(), *, hand=None, eager=True, vector_peers=False):
    """``{tool: builder}`` for a scalar objective ``f(B, params, consts)``; ``vector_peers``:
    Dr.Jit and CasADi too (``f`` of vector arguments, see :mod:`tape.bench.backends`)."""
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
    if vector_peers:
        out["drjit"] = lambda: drjit_frozen(f, params, consts)
        out["casadi"] = lambda: casadi_function(f, params, consts)
    return out
