"""Custom ops on the GPU: the user's CUDA device functions, run between the replay's launches.

A :func:`tape.custom_op` made with ``cuda_fwd=`` and ``cuda_vjp=`` is elementwise on the GPU:

- ``cuda_fwd(x0, x1, ...) -> y``: one output element from one element of each input, the
  inputs broadcast to the output's shape (which must be their broadcast shape);
- ``cuda_vjp(gy, y, x0, x1, ...) -> (g0, g1, ...)``: that element's contribution to each
  input's cotangent (a one-input op may return ``g0`` alone).

Calling convention. The replay stops its launches at the op's group of entries (as the CPU
sweeps stop for a callback, :mod:`tape.program.callbacks`) and launches a wrapper kernel generated
for the op's arity, with the user's functions compiled in: one thread per output element
(per instance and element in batched replay), a grid-stride loop. The forward writes ``y``
into the arena; the reverse adds each cotangent to its input's adjoint with
``cuda.atomic.add``, so broadcast inputs (several output elements per input element) and
inputs viewing the same memory (``x[1:]`` and ``x[:-1]``) are summed without races. A
constant input (no adjoint) gets nothing. As on the CPU, what ``cuda_vjp`` returns is added
as it is: a zero ``gy`` contributes whatever the function makes of it.

Cost: two extra launches per application and replay (a few microseconds each), the
arithmetic of the user's functions, and in the reverse one atomic add per input and output
element (per instance when batched): a broadcast scalar input takes them all on one address.
The wrappers are compiled once per op, arity and dtype in each process (the user's functions
are not in Numba's disk cache): well under a second.

The wrappers read each input's offset, whether it has an adjoint, and its strides over the
output's axes (zero where it is broadcast) from a small int64 array made per application
(:func:`meta`); axes that every input walks contiguously are merged first, so the usual
cases (same shapes, a scalar against an array) index with one multiplication.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint64

from tape.gpu._config import DEVICE_JIT, SIMULATOR
from tape.gpu._program import H_STATUS, OK
from tape.layout.columns import B_KIND, B_OFF, CONST

# meta layout: [size, y_off, gy_off, nd, shape[nd], then per input k at in_at(k):
#               off, goff (-1: no adjoint), strides[nd]]
M_SIZE, M_Y, M_GY, M_ND, M_SHAPE = 0, 1, 2, 3, 4


def _merged(out_shape, in_shapes):
    """``(shape, strides per input)`` of the broadcast walk, adjacent axes merged where every
    input allows it (the strides of an input are 0 on its broadcast axes)."""
    nd = len(out_shape)
    strides = []
    for s in in_shapes:
        s = (1,) * (nd - len(s)) + tuple(s)
        st, acc = [0] * nd, 1
        for d in range(nd - 1, -1, -1):
            st[d] = 0 if s[d] == 1 and out_shape[d] != 1 else acc
            acc *= s[d]
        strides.append(st)
    shape = list(out_shape)
    d = len(shape) - 2
    while d >= 0:
        if all(st[d] == st[d + 1] * shape[d + 1] for st in strides):
            shape[d] *= shape[d + 1]
            del shape[d + 1]
            for st in strides:
                st[d] = st[d + 1]
                del st[d + 1]
        d -= 1
    if not shape:  # a 0-d output: one element
        shape, strides = [1], [[0] for _ in strides]
    return shape, strides


def meta(t, call, grad_off, need):
    """The int64 array the wrappers read for one application ``call`` of tape ``t`` (see the
    module docstring). An input gets an adjoint offset only when it is not a constant and
    the reverse sweep needs it (``need``)."""
    out = call.outs[0]
    shape, strides = _merged(tuple(call.out_shapes[0]), [tuple(s) for s in call.in_shapes])
    size = int(np.prod(call.out_shapes[0], dtype=np.int64))
    y = int(t.bufs[out, B_OFF])
    m = [size, y, grad_off + y, len(shape), *shape]
    for b, st in zip(call.ins, strides):
        off = int(t.bufs[b, B_OFF])
        has_adjoint = t.bufs[b, B_KIND] != CONST and bool(need[b])
        m.extend([off, grad_off + off if has_adjoint else -1, *st])
    return np.array(m, np.int64)


# ---------------------------------------------------------------- device helpers

_dev = cuda.jit(**DEVICE_JIT)


@_dev
def _in_off(m, p, nd, j):
    """Element offset in the input described at ``m[p]`` of output element ``j``."""
    if nd == 1:
        return j * m[p + 2]
    r = j
    off = 0
    for d in range(nd - 1, -1, -1):
        s = m[M_SHAPE + d]
        q = r // s
        off += (r - q * s) * m[p + 2 + d]
        r = q
    return off


def cotangents(name, arity):
    """``as_tuple(g)`` for the reverse wrapper of op ``name`` with ``arity`` inputs: the
    ``cuda_vjp`` result as a tuple (a one-input op may return its cotangent alone), refused
    unless it holds one cotangent per input (at compile time on a GPU, at run time under the
    simulator)."""

    def wrong(k):
        return (
            f"custom_op {name!r}: cuda_vjp returned {k} cotangent(s) for {arity} input(s) "
            "(return a tuple with one per input)"
        )

    def as_tuple(x):
        x = x if isinstance(x, tuple) else (x,)
        if len(x) != arity:
            raise ValueError(wrong(len(x)))
        return x

    if SIMULATOR:
        return as_tuple
    from numba import types as nbt
    from numba.core.errors import TypingError

    try:
        from numba.cuda.extending import overload
    except ImportError:  # an older numba-cuda: numba's own, for the cuda target
        from numba.core.extending import overload

    @overload(as_tuple, target="cuda")
    def _impl(x):
        k = len(x.types) if isinstance(x, nbt.BaseTuple) else 1
        if k != arity:
            raise TypingError(wrong(k))
        if isinstance(x, nbt.BaseTuple):
            return lambda x: x
        return lambda x: (x,)

    return as_tuple


def _device_fn(f):
    """``f`` as the wrappers call it: plain Python functions and ``@njit`` functions compiled
    as device functions; CUDA device functions and functions Numba's CUDA target knows
    (``math.sin``) as they are."""
    import types

    from numba.core.registry import CPUDispatcher

    if isinstance(f, CPUDispatcher):
        f = f.py_func
    if isinstance(f, types.FunctionType):
        return cuda.jit(device=True)(f)
    return f


# ---------------------------------------------------------------- the wrapper kernels

_LOOP = """
def {name}(prog, A, m, n, flag):
    if flag < 0 and prog[H_STATUS] != OK:
        return  # an earlier entry stopped this replay
    nd = m[M_ND]
    y = m[M_Y]
    gy = m[M_GY]
    t0 = cuda.grid(1)
    ts = cuda.gridsize(1)
    for t in range(t0, m[M_SIZE] * n, ts):
        j = t
        b = 0
        if n != 1:
            j = t // n
            b = t - j * n
        if flag >= 0 and A[uint64(flag * n + b)] != 0.0:
            continue  # batched replay: an entry stopped this instance
{loads}
{body}
"""


def _source(arity):
    """Python source of the wrappers ``fwd`` and ``rev`` for ``arity`` inputs (the user's
    functions are the globals ``FWD`` and ``VJP``)."""
    loads, adds, xs = [], [], []
    for k in range(arity):
        p = f"(M_SHAPE + nd + {k} * (2 + nd))"
        loads.append(f"        o{k} = _in_off(m, {p}, nd, j)")
        loads.append(f"        x{k} = A[uint64((m[{p}] + o{k}) * n + b)]")
        adds.append(f"        if m[{p} + 1] >= 0:")
        adds.append(f"            cuda.atomic.add(A, uint64((m[{p} + 1] + o{k}) * n + b), g[{k}])")
        xs.append(f"x{k}")
    xs = ", ".join(xs)
    fwd = f"        A[uint64((y + j) * n + b)] = FWD({xs})"
    rev = "\n".join(
        [
            f"        g = as_tuple(VJP(A[uint64((gy + j) * n + b)], A[uint64((y + j) * n + b)], {xs}))"
        ]
        + adds
    )
    return "".join(
        _LOOP.format(name=name, loads="\n".join(loads), body=body)
        for name, body in (("fwd", fwd), ("rev", rev))
    )


def kernels(op, arity):
    """The forward and reverse wrapper kernels of custom op ``op`` for ``arity`` inputs (made
    once per op and arity; Numba compiles them per dtype on first launch). Both take
    ``(prog, A, m, n, flag)``: the packed tape (for its status), the arena, the application's
    :func:`meta`, the number of interleaved instances (1 for a single replay) and the arena
    offset of the per-instance flag (-1 for a single replay)."""
    got = op._gpu.get(arity)
    if got is None:
        scope = {
            "cuda": cuda,
            "uint64": uint64,
            "H_STATUS": H_STATUS,
            "OK": OK,
            "M_ND": M_ND,
            "M_SIZE": M_SIZE,
            "M_Y": M_Y,
            "M_GY": M_GY,
            "M_SHAPE": M_SHAPE,
            "_in_off": _in_off,
            "as_tuple": cotangents(op.name, arity),
            "FWD": _device_fn(op.cuda_fwd),
            "VJP": _device_fn(op.cuda_vjp),
        }
        exec(compile(_source(arity), f"<tape custom_op {op.name!r} on the GPU>", "exec"), scope)
        got = op._gpu[arity] = (cuda.jit(scope["fwd"]), cuda.jit(scope["rev"]))
    return got


class GpuCall:
    """One custom-op application of a tape, ready to launch: its wrapper kernels, the
    device copy of its :func:`meta`, and whether its reverse has work (the roots depend on it
    and some input has an adjoint)."""

    def __init__(self, t, call, program, launcher, n=1):
        self.label = call.label
        fk, rk = kernels(call.fn, len(call.ins))
        m = meta(t, call, program.grad_off, program.need)
        self.meta = cuda.to_device(m)
        self.size = int(m[M_SIZE]) * n
        out = call.outs[0]
        self.needed = bool(program.need[out]) and t.bufs[out, B_KIND] != CONST
        self.has_rev = self.needed and any(t.bufs[b, B_KIND] != CONST and program.need[b]
                                           for b in call.ins)  # fmt: skip
        self._fwd = launcher(fk)
        self._rev = launcher(rk)
        n_in = len(call.ins)
        for what, k in (("cuda_fwd", self._fwd), ("cuda_vjp", self._rev)):
            try:
                k.kernel  # noqa: B018  (compiles now, on a GPU: the user's functions' errors)
            except Exception as e:  # noqa: BLE001  (Numba's typing or lowering error)
                ours = [ln.strip() for ln in str(e).splitlines() if "custom_op '" in ln]
                raise TypeError(
                    (ours[0].split(": ", 1)[-1] + "\n" if ours else "")
                    + f"custom_op {call.fn.name!r}: {what} does not compile as the GPU replay "
                    f"calls it (cuda_fwd(x0, ..., x{n_in - 1}) -> y, cuda_vjp(gy, y, x0, ..., "
                    f"x{n_in - 1}) -> {n_in} cotangent(s), on scalars of the tape's dtype): "
                    f"{type(e).__name__}: {str(e)[:1500]}"
                ) from e

    def launch(self, reverse, threads, prog, A, n, flag):
        if reverse and not self.has_rev:
            return
        blocks = max(1, min((self.size + threads - 1) // threads, 4096))
        (self._rev if reverse else self._fwd)(blocks, threads, prog, A, self.meta, n, flag)
