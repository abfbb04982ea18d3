"""Replay a recorded tape on an NVIDIA GPU: :class:`CudaTape` and :func:`gradient_batch`.

Arguments, seeds and failures go through the replay signature shared with the CPU replays
(:mod:`tape.program.replay`), so the GPU accepts the same arguments, returns results in the same
dtypes and fails with the same messages; this module adds only what is about device arrays.

A replay that a guard stops (its arguments would take another path than the recorded one)
is not answered from the recorded path: with ``on_change="raise"`` it raises
:class:`tape.GuardError`; otherwise that call runs on the CPU tape, which retraces (or warns
and continues, ``on_change="warn"``), and its results are written back to the device.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba import types as nbt

from tape.gpu import _config as config
from tape.gpu._program import (
    BACKWARD,
    FWD,
    GRADIENT,
    H_PHASES,
    H_STATUS,
    INIT,
    OK,
    PHASE_COLS,
    REV,
    SEED,
    ZERO_ACT,
    ZERO_LEAF,
    Program,
    pieces,
    segments,
)
from tape.layout.columns import B_OFF, B_SIZE, E_OP
from tape.program.callbacks import groups, refuse_gpu
from tape.program.replay import ReplayError, failure, is_guard
from tape.transforms.batch import _plan as _batch_plan

_NO_GPU = (
    "no CUDA GPU is available ({why}). To run tape's GPU path without one, use Numba's CUDA "
    "simulator: set NUMBA_ENABLE_CUDASIM=1 in the environment before numba is imported (it is "
    "slow, ~microseconds per element: keep sizes tiny)."
)


def available() -> bool:
    """Whether a CUDA GPU (or the simulator) can run tape's kernels."""
    if config.SIMULATOR:
        return True
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001  (driver missing or broken)
        return False


def require_device():
    if config.SIMULATOR:
        return
    try:
        ok = cuda.is_available()
        why = "numba.cuda.is_available() is False"
    except Exception as e:  # noqa: BLE001
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        raise RuntimeError(_NO_GPU.format(why=why))


_FRESH = []


def _kernels():
    """The generated kernels, checked once per process against the sources they were
    generated from: a stale dispatch would run the wrong op for an op code, silently."""
    from tape.gpu._generated import kernels

    if not _FRESH:
        from tape.gpu import _codegen

        try:
            fresh = kernels.FINGERPRINT == _codegen.fingerprint()
        except OSError:  # sources not readable (zipped install): nothing to compare
            fresh = True
        if not fresh:
            raise RuntimeError(
                "tape's generated GPU kernels are stale (an op or a GPU kernel changed): run "
                "`python -m tape.gpu._codegen`"
            )
        _FRESH.append(True)
    return kernels


_BY_SET: dict = {}


def kernels_for(t):
    """The GPU dispatch and kernels for the ops tape ``t`` uses: generated for that op set,
    written to the tape cache directory and loaded, once per set and process (Numba caches
    its compile per file). A device compiles the rules of these ops only, not the branches of
    every op in the registry."""
    from tape.gpu import _codegen

    full = _kernels()  # checks the sources against the committed dispatch once
    codes = tuple(sorted({int(c) for c in t.entries[: t.n_entries, E_OP] if c >= 0}))
    if not codes:
        return full
    mod = _BY_SET.get(codes)
    if mod is None:
        from tape.compiler.cache import load_module

        mod = _BY_SET[codes] = load_module(_codegen.generate(codes), "tape_gpu")
        mod.OPS = codes
    return mod


def _check_threads(threads):
    if threads is None:
        threads = config.SIM_THREADS if config.SIMULATOR else config.THREADS
    threads = int(threads)
    if threads < 1 or threads > config.MAX_THREADS or threads & (threads - 1):
        raise ValueError(
            f"threads must be a power of two in [1, {config.MAX_THREADS}], got {threads}"
        )
    return threads


def _numba_type(dtype):
    return nbt.float64 if np.dtype(dtype) == np.float64 else nbt.float32


class _Launcher:
    """Launches one kernel with fixed argument types. On a real GPU the kernel is compiled
    for those types on first use and launched directly (``_Kernel.launch``), skipping
    Numba's per-call argument typing; under the simulator, or if that fails, through the
    ordinary ``kernel[grid, block](...)``."""

    def __init__(self, dispatcher, argtypes):
        self.dispatcher = dispatcher
        self.argtypes = tuple(argtypes)
        self._kernel = None
        self._direct = not config.SIMULATOR

    @property
    def kernel(self):
        """The compiled kernel (compiles on first use; None under the simulator)."""
        if self._kernel is None and not config.SIMULATOR:
            self._kernel = self.dispatcher.compile(self.argtypes)
        return self._kernel

    def __call__(self, grid, block, *args):
        if self._direct:
            try:
                self.kernel.launch(args, (grid, 1, 1), (block, 1, 1), 0, 0)
                return
            except Exception as e:  # noqa: BLE001  (another numba-cuda: use the dispatcher)
                import warnings

                warnings.warn(
                    f"direct kernel launch failed ({e}); using the dispatcher", stacklevel=2
                )
                self._direct = False
        self.dispatcher[grid, block](*args)

    def max_cooperative_blocks(self, block):
        if config.SIMULATOR:
            return 1
        return max(1, int(self.kernel.max_cooperative_grid_blocks(block)))


def _plan(t, program, runs, dtype, n=1):
    """``runs`` cut at ``t``'s custom-op groups: ``[("run", a, b, large) | ("call",
    GpuCall), ...]`` (:func:`tape.gpu._program.pieces`)."""
    gs = groups(t) if t.callbacks else []
    if not gs:
        return [("run", a, b, large) for a, b, large in runs]
    from tape.gpu._custom import GpuCall

    arr = _numba_type(dtype)[::1]
    i64 = nbt.int64

    def launcher(k):
        return _Launcher(k, (i64[::1], arr, i64[::1], i64, i64))

    gpu = [(s, e, GpuCall(t, call, program, launcher, n)) for s, e, call in gs]
    return pieces(runs, gpu)


def _compiled_pieces(t, plan, units, large):
    """The launch plan of the compiled tier (:func:`tape.gpu._fused.build`'s ``units``) as
    :func:`_run_pieces` takes it: interpreter runs (``large(a, b)``: on the full grid), fused
    units, and the custom ops' calls of the interpreter's plan ``plan``."""
    calls = {id(call): pc[1] for (_, _, call), pc in
             zip(groups(t), [pc for pc in plan if pc[0] == "call"])}  # fmt: skip
    out = []
    for x in units:
        if x[0] == "run":
            out.append(("run", x[1], x[2], large(x[1], x[2])))
        elif x[0] == "callback":
            out.append(("call", calls[id(x[1])]))
        else:
            out.append(("call", x[1]))
    return out


def _run_pieces(plan, mode, launch, call):
    """Run ``mode`` (FWD and/or the reverse bits) over ``plan`` (:func:`_plan`):
    ``launch(mode, start, stop, large)`` runs the package's kernel over a run of entries,
    ``call(gpu_call, reverse)`` a custom op's. The zeroing and seeding ride on the last run's
    launch when it is the last piece (one launch for a tape of one run)."""
    fwd = mode & FWD
    back = mode & ~FWD
    fused = False
    if fwd:
        for k, pc in enumerate(plan):
            if pc[0] == "call":
                call(pc[1], False)
                continue
            tail = back if k == len(plan) - 1 else 0
            launch(FWD | tail, pc[1], pc[2], pc[3])
            fused = bool(tail)
    if not back:
        return
    todo = list(reversed(plan))
    if fused:
        todo = todo[1:]
    elif todo and todo[0][0] == "run":
        _, a, b, large = todo.pop(0)
        launch(back, a, b, large)
    else:  # a custom op ends the tape: zero and seed alone, on the full grid if any run has it
        launch(back & ~REV, 0, 0, any(pc[0] == "run" and pc[3] for pc in plan))
    if back & REV:
        for pc in todo:
            if pc[0] == "call":
                call(pc[1], True)
            else:
                launch(REV, pc[1], pc[2], pc[3])


_SWEEP_LOADS = {}  # argument types -> whether the cooperative sweep built (once per process)


def _loads(launcher):
    """Whether the cooperative sweep kernel compiles and loads on this device (it is linked
    with the device runtime for its grid barrier, which can fail where the per-phase kernel
    does not); if not, warn (once per process and dtype), and the tape runs one launch per
    phase."""
    known = _SWEEP_LOADS.get(launcher.argtypes)
    if known is not None:
        return known
    try:
        launcher.kernel  # noqa: B018  (compiles, links and loads)
        _SWEEP_LOADS[launcher.argtypes] = True
        return True
    except Exception as e:  # noqa: BLE001  (a toolkit or driver failure: take the other path)
        import warnings

        _SWEEP_LOADS[launcher.argtypes] = False
        warnings.warn(
            f"tape's cooperative GPU sweep failed to build on this device ({type(e).__name__}: "
            f"{str(e)[:300]}); replaying with one launch per phase (cooperative=False) instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return False


class CudaTape:
    """A recorded tape replaying on the GPU; values and adjoints stay on the device.

    ``forward``, ``backward``, ``gradient``, ``value_and_grad``, ``zero_grad`` and ``grads``
    mean what they mean on :class:`tape.Tape`; the arguments and returned arrays are NumPy
    arrays (copied across; results in the dtypes the CPU replay returns), and
    :attr:`device_grads`, :meth:`device_value`, :attr:`arena` give the device arrays
    themselves, without a copy, for use in your own ``numba.cuda`` kernels.

    Parameters
    ----------
    t : tape.Tape
        A tape made by :func:`tape.record`. Its arrays are copied to the device once; the host
        tape is not changed by device replays.
    threads : int, optional
        Threads per block (a power of two, at most 256; default 256, 32 under the simulator).
    blocks : int, optional
        Grid size for entries with large buffers (default: as many blocks as can be
        co-resident, which a grid-wide barrier needs; always 1 under the simulator, whose grid
        barrier is only correct for one block).
    cooperative : bool
        True (default): each launch replays a run of entries with barriers in between (grid
        barriers need a cooperative launch). False: one launch per phase of each entry, no
        grid barriers (for devices without cooperative launch, and to test multi-block
        reductions under the simulator). If the cooperative kernel fails to build on the
        device, the tape warns and takes the per-phase path.
    small, min_run : int
        See :data:`tape.gpu._config.SMALL` and :data:`~tape.gpu._config.MIN_RUN`.

    Notes
    -----
    Launch plan: the entries are split into runs; a run of small entries (every buffer at
    most ``small`` elements) is one launch of a single block (block barriers between
    entries), a run of large entries one cooperative launch of ``blocks`` blocks whose threads
    stride over each entry's elements (grid barriers between entries). ``gradient`` is one
    launch for a tape of one run.

    Guards: a tape recorded through a Python ``if`` on a tensor (or ``float(x)``, ...) checks
    at every replay that the new arguments take the recorded path. When they do not, the call
    (``forward``, ``gradient``, ``value_and_grad``, ``replay``) raises
    :class:`tape.GuardError` if ``t.on_change == "raise"``, and otherwise **runs on the CPU
    tape** (``t.forward`` / ``t.value_and_grad``, which retrace or warn as ``on_change``
    says; the CPU tape's replay state on this thread changes as if it had been called). Its
    outputs and gradients are then written to the device, and a following :meth:`backward`
    also runs on the CPU tape (adding to the device gradients), until the next replay that
    passes its guards on the device. Those calls cost a host round trip and a CPU replay.
    """

    def __init__(
        self,
        t,
        threads=None,
        blocks=None,
        cooperative=True,
        small=None,
        min_run=None,
        compile=False,
    ):
        refuse_gpu(t, "CudaTape")
        require_device()
        self._sig = sig = t.signature  # also checks that t was recorded
        self.tape = t
        self.dtype = t.dtype
        self.threads = _check_threads(threads)
        self.cooperative = bool(cooperative)
        K = kernels_for(t)
        self._K = K
        arr = _numba_type(t.dtype)[::1]
        i64 = nbt.int64
        self._sweep = _Launcher(K.sweep, (i64[::1], arr, i64, i64, i64))
        self._step = _Launcher(K.step, (i64[::1], arr, i64, i64, i64))
        if self.cooperative and not config.SIMULATOR:
            self.cooperative = _loads(self._sweep)
        cooperative = self.cooperative
        if config.SIMULATOR and cooperative:
            big = 1
        elif blocks is not None:
            big = int(blocks)
        elif cooperative:
            big = self._sweep.max_cooperative_blocks(self.threads)
        else:
            big = 4 * self._step.max_cooperative_blocks(self.threads)
        self.blocks = max(1, big)
        self.program = p = Program(t, n_blocks=self.blocks)
        small = config.SMALL if small is None else small
        min_run = config.MIN_RUN if min_run is None else min_run
        self.small = small
        self.runs = segments(p.entry_size, small, min_run)
        self.pieces = _plan(t, p, self.runs, t.dtype)
        self.fused = None
        """After :meth:`compile`: the generated source (:class:`tape.gpu._fused.Source`)."""
        self._sweep_state = {"zl": 1}  # read by the compiled reverse kernels (see _run)
        self._zero_leaves = None  # zero_grad's kernel on the compiled tier
        self._arr = arr
        self.prog = cuda.to_device(p.prog)
        self.arena = cuda.to_device(p.arena(t))
        """The device arena: values ``[0, n_data)``, adjoints ``[n_data, 2 n_data)``, scratch,
        flag, seeds (see :mod:`tape.gpu._program`)."""
        self._inputs = [
            (int(t.bufs[b, B_OFF]), int(t.bufs[b, B_SIZE]), t.shapes[b]) for b in t.inputs
        ]
        self._outputs = [
            (int(t.bufs[b, B_OFF]), int(t.bufs[b, B_SIZE]), t.shapes[b]) for b in t.outputs
        ]
        self._wrt = [self._inputs[k] for k in t.wrt]
        self._fast = list(zip(sig.shapes, sig.dtypes))  # arguments that need no checks
        self._grad_dtypes = [np.dtype(t.input_dtypes[k]) for k in t.wrt]
        self._out_dtypes = [np.dtype(d) for d in (t.output_dtypes or [t.dtype] * len(t.outputs))]
        offs = [o for o, _, _ in self._inputs]
        sizes = [n for _, n, _ in self._inputs]
        self._contiguous_inputs = all(
            offs[k + 1] == offs[k] + sizes[k] for k in range(len(offs) - 1)
        )
        self._seed_is_one = True
        # entries that can stop a replay (gathers, guards): only then is there a status to read
        self._checks = p.n_checks > 0
        # the last replay ran on the CPU tape (a guard failed): backward() runs there too
        self._host_last = False
        if compile:
            self.compile()

    def compile(self):
        """Replay with device code generated for this tape (the GPU's compiled tier,
        :mod:`tape.gpu._fused`): each fused group of elementwise entries (with the sum that
        folds them) becomes one kernel forward and one reverse, its intermediates in
        registers; the other entries run on the interpreter's kernels as before, custom ops
        on their own. Same results, to rounding (a folded sum and atomic adds add in another
        order). Batched replays of this tape (:meth:`gradient_batch`) are compiled too.
        Returns ``self``."""
        if self.fused is not None:
            return self
        from tape.gpu._fused import build

        src, units = build(self.tape, self.program.grad_off, self._sweep_state, _Launcher)
        self.program.zero_only(self.tape.bufs, src.zeroed)
        self.prog = cuda.to_device(self.program.prog)
        size = self.program.entry_size
        self.pieces = _compiled_pieces(
            self.tape, self.pieces, units, lambda a, b: bool(size[a:b].max() > self.small)
        )
        self.fused = src
        return self

    @property
    def compiled(self):
        """Whether this tape replays with generated code (see :meth:`compile`)."""
        return self.fused is not None

    # ------------------------------------------------------------ launches

    def _grid(self, large):
        return self.blocks if large else 1

    def _run(self, mode):
        """Run ``mode`` (FWD and/or the reverse bits) over the whole tape in as few launches as
        the run plan allows (custom ops launch their own kernels between runs)."""
        self._sweep_state["zl"] = 1 if mode & ZERO_LEAF else 0
        _run_pieces(self.pieces, mode, self._launch, self._call)

    def _call(self, gc, reverse):
        gc.launch(reverse, self.threads, self.prog, self.arena, 1, -1)

    def _launch(self, mode, start, stop, large):
        grid = self._grid(large)
        if self.cooperative:
            self._sweep(grid, self.threads, self.prog, self.arena, mode, start, stop)
            return
        # one launch per phase, no grid barrier: the launch boundary is the barrier
        p = self.program
        prog = p.prog
        ph_at = int(prog[H_PHASES])
        step = self._step
        if mode & FWD:
            for i in range(start, stop):
                for ph in range(int(prog[ph_at + PHASE_COLS * i])):
                    step(grid, self.threads, self.prog, self.arena, FWD, i, ph)
        if mode & (ZERO_ACT | ZERO_LEAF):
            step(grid, self.threads, self.prog, self.arena, mode & (ZERO_ACT | ZERO_LEAF), 0, 0)
        if mode & SEED:
            step(grid, self.threads, self.prog, self.arena, SEED, 0, 0)
        if mode & REV:
            for i in range(stop - 1, start - 1, -1):
                if not p.emask[i]:
                    continue
                mask = int(prog[ph_at + PHASE_COLS * i + 2])
                for ph in range(int(prog[ph_at + PHASE_COLS * i + 1])):
                    if (mask >> ph) & 1:
                        step(grid, self.threads, self.prog, self.arena, REV, i, ph)

    # ------------------------------------------------------------ failures

    def _stopped_at(self):
        """The entry that stopped the last replay, or None; the status is reset (a failure is
        not sticky)."""
        if not self._checks:
            return None
        i = int(self.prog[H_STATUS : H_STATUS + 1].copy_to_host()[0])
        if i == OK:
            return None
        self.prog[H_STATUS : H_STATUS + 1].copy_to_device(np.array([OK], np.int64))
        return i

    def _read(self, b):
        """Buffer ``b``'s values in the device arena (for failure messages)."""
        off, size = int(self.tape.bufs[b, B_OFF]), int(self.tape.bufs[b, B_SIZE])
        return self.arena[off : off + size].copy_to_host() if size else np.zeros(0, self.dtype)

    def _on_host(self, i, args, grad):
        """Entry ``i`` stopped the device replay on ``args``: raise (a bad gather index, or a
        failed guard under ``on_change="raise"``) or run the call on the CPU tape and write
        its results to the device. Returns ``(value, gradient or None)``."""
        t = self.tape
        if not is_guard(t, i) or t.on_change == "raise":
            raise failure(t, i, self._read)
        host = [self._host_arg(k, a) for k, a in enumerate(args)]
        g = None
        if grad:
            v, g = t.value_and_grad(*host)
            gs = [g] if len(self._wrt) == 1 else list(g)
            for (off, size, _), x in zip(self._wrt, gs):
                self._put(self.program.grad_off + off, size, x)
        else:
            v = t.forward(*host)
        vs = [v] if self._sig.out_single else list(v)
        for (off, size, _), x in zip(self._outputs, vs):
            self._put(off, size, x)
        self._host_last = True
        return v, g

    def _put(self, off, size, x):
        if size:
            self.arena[off : off + size].copy_to_device(
                np.ascontiguousarray(np.ravel(x), self.dtype)
            )

    def _host_arg(self, k, a):
        d = _device_array(a) if type(a) is not np.ndarray else None
        if d is None:
            return a
        return d.copy_to_host().astype(self._sig.dtypes[k], copy=False)

    # ------------------------------------------------------------ arguments

    def _load_args(self, args):
        sig = self._sig
        n = len(self._inputs)
        if len(args) != n:
            sig.check_count(args)
        host = []
        for k, (a, (off, size, shape)) in enumerate(zip(args, self._inputs)):
            if type(a) is not np.ndarray:
                d = _device_array(a)
                if d is not None:
                    if d.shape != shape or d.dtype != self.dtype:
                        raise ReplayError(
                            f"argument {k} ({sig.names[k]}): a device array must have shape "
                            f"{shape} and dtype {self.dtype}, got {d.shape} {d.dtype}"
                        )
                    self.arena[off : off + size].copy_to_device(d.reshape(size) if size else d)
                    continue
            if type(a) is not np.ndarray or (a.shape, a.dtype) != self._fast[k]:
                a = sig.check_arg(k, a)
            host.append((off, size, a))
        if not host:
            return
        if self._contiguous_inputs and len(host) == n and n > 1:
            # one transfer for all arguments
            lo = host[0][0]
            buf = np.concatenate([np.ravel(a).astype(self.dtype, copy=False) for _, _, a in host])
            self.arena[lo : lo + buf.shape[0]].copy_to_device(buf)
            return
        for off, size, a in host:
            if size:
                self.arena[off : off + size].copy_to_device(
                    np.ascontiguousarray(a, self.dtype).reshape(size)
                )

    def _outputs_host(self):
        outs = []
        for (off, size, shape), d in zip(self._outputs, self._out_dtypes):
            v = (
                self.arena[off : off + size].copy_to_host().reshape(shape)
                if size
                else np.zeros(shape, self.dtype)
            )
            v = v.astype(d, copy=False)
            outs.append(v[()] if v.ndim == 0 else v)
        return outs[0] if self._sig.out_single else tuple(outs)

    # ------------------------------------------------------------ the replay API

    def forward(self, *args):
        """Replay on new arguments (NumPy or device arrays of the recorded shapes); returns the
        output(s) as NumPy values, like :meth:`tape.Tape.forward`."""
        self._load_args(args)
        self._run(FWD)
        i = self._stopped_at()
        if i is not None:
            return self._on_host(i, args, False)[0]
        self._host_last = False
        return self._outputs_host()

    def backward(self, seed=None):
        """Reverse sweep over the last forward replay; leaf gradients accumulate on the device
        (like :meth:`tape.Tape.backward`)."""
        if self._host_last:
            self._backward_on_host(seed)
            return
        if seed is None and self.program.n_seed == 1:
            self._set_seed_one()
        else:
            s = self._sig.seeds(seed)
            self.arena[self.program.seed_off : self.program.seed_off + s.shape[0]].copy_to_device(
                np.ascontiguousarray(s, self.dtype)
            )
            self._seed_is_one = False
        self._run(BACKWARD)

    def _backward_on_host(self, seed):
        # the last forward ran on the CPU tape (another path than the device's): its reverse
        # sweep runs there, and its contribution is added to the device gradients
        t = self.tape
        t.zero_grad()
        t.backward(seed)
        for (off, size, _), g in zip(self._wrt, t.grads):
            if size:
                dev = self.arena[self.program.grad_off + off : self.program.grad_off + off + size]
                dev.copy_to_device(dev.copy_to_host() + np.ravel(g).astype(self.dtype))

    def _set_seed_one(self):
        if not self._seed_is_one:
            p = self.program
            self.arena[p.seed_off : p.seed_off + p.n_seed].copy_to_device(
                np.ones(p.n_seed, self.dtype)
            )
            self._seed_is_one = True

    def _value_and_grad(self, args):
        """``(value or None, gradient)``: the value only when the call ran on the host."""
        if self.program.n_seed != 1:
            self._sig.require_scalar()
        self._set_seed_one()
        self._load_args(args)
        self._run(GRADIENT)
        i = self._stopped_at()
        if i is not None:
            return self._on_host(i, args, True)
        self._host_last = False
        g = self.grads
        return None, g[0] if len(g) == 1 else tuple(g)

    def gradient(self, *args):
        """Zero the gradients, replay forward and backward: one array per differentiated
        argument (a single array if there is one), copied to the host in each argument's
        recorded dtype."""
        return self._value_and_grad(args)[1]

    def value_and_grad(self, *args):
        """``(value, gradient)`` of the scalar output at ``args`` (see :meth:`gradient`)."""
        if self.program.n_seed != 1:
            self._sig.require_scalar("value_and_grad()")
        v, g = self._value_and_grad(args)
        return (self._outputs_host() if v is None else v), g

    def zero_grad(self):
        """Zero the accumulated gradients (on the device)."""
        if self.fused is not None:  # its program zeroes only the leaves no kernel assigns
            if self._zero_leaves is None:
                self._zero_leaves = _Launcher(self.fused.module.zero_leaves, (self._arr,))
            self._zero_leaves(1, self.threads, self.arena)
            return
        self._launch(ZERO_LEAF, 0, 0, False)

    @property
    def grads(self):
        """Accumulated gradients, copied to the host (one array per differentiated argument,
        in its recorded dtype)."""
        out = []
        for (off, size, shape), d in zip(self._wrt, self._grad_dtypes):
            g0 = self.program.grad_off + off
            g = (
                self.arena[g0 : g0 + size].copy_to_host().reshape(shape)
                if size
                else np.zeros(shape, self.dtype)
            )
            out.append(g.astype(d, copy=False))
        return out

    @property
    def device_grads(self):
        """The gradients as device arrays (views of :attr:`arena`, no copy; arena dtype)."""
        out = []
        for off, size, shape in self._wrt:
            g0 = self.program.grad_off + off
            out.append(
                self.arena[g0 : g0 + size].reshape(shape) if shape else self.arena[g0 : g0 + size]
            )
        return out

    def device_value(self, k=0):
        """Output ``k`` as a device array (a view of :attr:`arena`, no copy)."""
        off, size, shape = self._outputs[k]
        v = self.arena[off : off + size]
        return v.reshape(shape) if shape else v

    @property
    def device_inputs(self):
        """The input buffers as device arrays (views: writing them sets the next replay's
        arguments, then call :meth:`replay` instead of :meth:`forward`)."""
        return [
            self.arena[o : o + n].reshape(s) if s else self.arena[o : o + n]
            for o, n, s in self._inputs
        ]

    def replay(self, backward=True):
        """Forward (and, by default, zero + backward) on the values already in the device input
        buffers: no host transfer at all (unless a guard fails: see the class notes)."""
        if backward:
            self._set_seed_one()
        self._run(GRADIENT if backward else FWD)
        i = self._stopped_at()
        if i is not None:
            args = [
                self.arena[o : o + n].copy_to_host().reshape(s).astype(d, copy=False)
                for (o, n, s), d in zip(self._inputs, self._sig.dtypes)
            ]
            self._on_host(i, args, backward)
            return
        self._host_last = False

    def gradient_batch(self, *args, threads=None):
        """Batched replay on the GPU (see :func:`gradient_batch`), compiled if this tape is
        (:meth:`compile`)."""
        return gradient_batch(self.tape, *args, threads=threads, compile=self.compiled)

    # Derivatives beyond the gradient have no GPU sweeps yet: they run on the CPU tape (same
    # signatures and results as tape.Tape's; arguments and results are NumPy arrays).

    def jvp(self, *args, tangents):
        """:meth:`tape.Tape.jvp`, on the CPU tape."""
        return self.tape.jvp(*args, tangents=tangents)

    def vjp(self, *args, cotangent):
        """:meth:`tape.Tape.vjp`, on the CPU tape."""
        return self.tape.vjp(*args, cotangent=cotangent)

    def jacobian(self, *args, mode="auto", sparse=False):
        """:meth:`tape.Tape.jacobian`, on the CPU tape."""
        return self.tape.jacobian(*args, mode=mode, sparse=sparse)

    def hessian(self, *args, sparse=False):
        """:meth:`tape.Tape.hessian`, on the CPU tape."""
        return self.tape.hessian(*args, sparse=sparse)

    def hvp(self, *args, v):
        """:meth:`tape.Tape.hvp`, on the CPU tape."""
        return self.tape.hvp(*args, v=v)

    def sparsity(self, *args):
        """:meth:`tape.Tape.sparsity`, on the CPU tape."""
        return self.tape.sparsity(*args)

    def synchronize(self):
        cuda.synchronize()

    def cpu(self):
        """The host tape (unchanged by device replays)."""
        return self.tape

    def to(self, device):
        if str(device).startswith("cuda"):
            return self
        if device == "cpu":
            return self.tape
        raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda'")

    def __repr__(self):
        return (
            f"<CudaTape {self.tape.n_entries} entries, {len(self.pieces)} launch(es) per sweep, "
            f"{self.threads} threads x {self.blocks} blocks, {self.dtype}"
            f"{', compiled' if self.compiled else ''}>"
        )


def _device_array(a):
    """``a`` as a Numba device array if it lives on the GPU (any CUDA array interface)."""
    if cuda.devicearray.is_cuda_ndarray(a):
        return a
    if hasattr(a, "__cuda_array_interface__") and hasattr(cuda, "as_cuda_array"):
        return cuda.as_cuda_array(a)
    return None


# ---------------------------------------------------------------- batched replay


class CudaBatch:
    """Batched replay of one tape on the GPU: ``n`` independent instances, one thread each.

    Made once per (tape, batch size); :meth:`load` checks and copies the arguments,
    :meth:`run` replays, :meth:`results` returns what :func:`tape.batch.gradient_batch`
    returns. The arena of instance ``b`` is interleaved in :attr:`arena` (element ``e`` at
    ``e * n + b``), so that a warp reads 32 adjacent values.

    An instance stopped by an entry (a gather index out of bounds, a guard whose recorded
    path the instance leaves) is redone alone on the CPU tape by :meth:`results`, as
    :func:`tape.batch.gradient_batch` does: a guard then follows the tape's ``on_change``
    policy, a bad index raises naming the instance. Its results are written back to the
    device arena.
    """

    def __init__(self, t, n, threads=None, compile=False):
        refuse_gpu(t, "gradient_batch on the GPU")
        require_device()
        self.tape = t
        self.n = int(n)
        self.plan = _batch_plan(t, gpu=True)
        self.program = p = Program(t, n_blocks=1)
        self.threads = _check_threads(threads)
        K = kernels_for(t)
        arr = _numba_type(t.dtype)[::1]
        i64 = nbt.int64
        self._batch = _Launcher(K.batch, (i64[::1], arr, arr, i64, i64, i64, i64))
        self.pieces = _plan(t, p, [(0, p.n_entries, False)], t.dtype, self.n)
        self.compiled = bool(compile)
        """Replays with the GPU's compiled tier: fused loops of one thread per instance
        (:mod:`tape.gpu._fused`), the other entries on the batched interpreter kernel."""
        self._sweep_state = {"zl": 1}
        self.fused = None
        """When compiled: the generated source (:class:`tape.gpu._fused.Source`)."""
        if self.compiled:
            from tape.gpu._fused import build

            src, units = build(t, p.grad_off, self._sweep_state, _Launcher, batched=True)
            self.fused = src
            p.zero_only(t.bufs, src.zeroed)
            self.pieces = _compiled_pieces(t, self.pieces, units, lambda a, b: False)
        self.prog = cuda.to_device(p.prog)
        self.template = cuda.to_device(p.arena(t))
        self.rows = p.seed_off  # values, adjoints, scratch and flag of one instance
        self.arena = cuda.device_array(self.rows * max(self.n, 1), t.dtype)
        self._arrs = None  # the host arguments of the last load (for redoing instances)

    def load(self, *args):
        """Check the arguments (each with a leading batch axis of length ``n``, as for
        :func:`gradient_batch`) and copy them into the instances' input rows."""
        packed, arrs = self.plan.pack_args(args)
        if packed.shape[0] != self.n:
            raise ReplayError(
                f"batch size {packed.shape[0]}, but this CudaBatch was made for {self.n}"
            )
        self._load(packed, arrs)

    def _load(self, packed, arrs):
        pl = self.plan
        s = 0
        n = self.n
        for off, size in zip(pl.in_offs, pl.in_sizes):
            off, size = int(off), int(size)
            if size:
                rows = np.ascontiguousarray(packed[:, s : s + size].T)
                self.arena[off * n : (off + size) * n].copy_to_device(rows.reshape(-1))
            s += size
        self._arrs = arrs

    def run(self, mode=GRADIENT):
        """Replay every instance (``mode`` as for :meth:`CudaTape._run`); the first launch
        also copies the constants into each instance and clears its flag."""
        if self.n == 0:
            return
        blocks = (self.n + self.threads - 1) // self.threads
        first = [INIT]
        self._sweep_state["zl"] = 1 if mode & ZERO_LEAF else 0

        def launch(mode, start, stop, large):
            mode |= first.pop() if first else 0
            self._batch(blocks, self.threads, self.prog, self.template, self.arena, self.n,
                        mode, start, stop)  # fmt: skip

        def call(gc, reverse):
            if first:
                launch(0, 0, 0, False)
            gc.launch(reverse, self.threads, self.prog, self.arena, self.n,
                      self.program.flag_off)  # fmt: skip

        _run_pieces(self.pieces, mode, launch, call)

    def stopped(self):
        """Instances of the last :meth:`run` that an entry stopped, as an index array; the
        status is reset (a failure is not sticky)."""
        if not self.program.n_checks or self.n == 0:
            return np.zeros(0, np.int64)
        if int(self.prog[H_STATUS : H_STATUS + 1].copy_to_host()[0]) == OK:
            return np.zeros(0, np.int64)
        self.prog[H_STATUS : H_STATUS + 1].copy_to_device(np.array([OK], np.int64))
        f = self.program.flag_off * self.n
        return np.nonzero(self.arena[f : f + self.n].copy_to_host())[0]

    def _rows(self, offs, sizes, region):
        n = self.n
        out = []
        for off, size in zip(offs, sizes):
            off, size = int(off) + region, int(size)
            out.append(self.arena[off * n : (off + size) * n].copy_to_host().reshape(size, n).T)
        return np.concatenate(out, axis=1) if out else np.zeros((n, 0), self.tape.dtype)

    def _put_rows(self, offs, sizes, region, rows):
        n = self.n
        s = 0
        for off, size in zip(offs, sizes):
            off, size = int(off) + region, int(size)
            if size:
                block = np.ascontiguousarray(rows[:, s : s + size].T, self.tape.dtype)
                self.arena[off * n : (off + size) * n].copy_to_device(block.reshape(-1))
            s += size

    def results(self):
        """``(values, grads)`` of the last :meth:`run`, as :func:`tape.batch.gradient_batch`
        returns them (stopped instances redone on the CPU tape)."""
        pl = self.plan
        g0 = self.program.grad_off
        vals = self._rows(pl.out_offs, pl.out_sizes, 0)
        grads = np.ascontiguousarray(self._rows(pl.g_offs, pl.g_sizes, g0))
        failed = self.stopped()
        if failed.size:
            pl.redo_failed(failed, self._arrs, vals, grads)
            self._put_rows(pl.out_offs, pl.out_sizes, 0, vals)
            self._put_rows(pl.g_offs, pl.g_sizes, g0, grads)
        return pl.unpack(vals, grads)

    def device_grads(self):
        """Per differentiated argument, a device array ``(size, n)`` (instance-minor: the
        layout the kernel writes), without a copy."""
        pl = self.plan
        n = self.n
        g0 = self.program.grad_off
        return [
            self.arena[(int(o) + g0) * n : (int(o) + g0 + int(m)) * n].reshape(int(m), n)
            for o, m in zip(pl.g_offs, pl.g_sizes)
        ]


def gradient_batch(t, *args, threads=None, compile=False):
    """Per-instance value and gradient of a recorded tape with a scalar output, on the GPU
    (one thread per instance). Same arguments, results and failures as
    :func:`tape.batch.gradient_batch` (instances that leave the recorded path are redone on
    the CPU tape, see :class:`CudaBatch`). ``compile=True``: with the GPU's compiled tier
    (fused loops, see :meth:`CudaTape.compile`).
    """
    refuse_gpu(t, "gradient_batch on the GPU")
    plan = _batch_plan(t, gpu=True)
    packed, arrs = plan.pack_args(args)
    n = packed.shape[0]
    threads = _check_threads(threads)
    st = t.extensions()
    cache = st.get("gpu_batch")
    if (
        cache is None or cache.n != n or cache.plan is not plan or cache.threads != threads
        or cache.compiled != bool(compile)
    ):  # fmt: skip
        cache = st["gpu_batch"] = CudaBatch(t, n, threads=threads, compile=compile)
    cache._load(packed, arrs)
    cache.run()
    return cache.results()
