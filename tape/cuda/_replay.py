"""Replay a recorded tape on an NVIDIA GPU: :class:`CudaTape` and :func:`gradient_batch`."""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba import types as nbt

from tape._layout import B_OFF, B_SIZE, E_OP
from tape.batch import _plan as _batch_plan
from tape.core import ReplayError
from tape.cuda import _config as C
from tape.cuda._program import (
    BACKWARD,
    FWD,
    GRADIENT,
    H_PHASES,
    H_STATUS,
    H_STATUS_INST,
    OK,
    REV,
    SEED,
    ZERO_ACT,
    ZERO_LEAF,
    Program,
    segments,
)

_NO_GPU = (
    "no CUDA GPU is available ({why}). To run tape's GPU path without one, use Numba's CUDA "
    "simulator: set NUMBA_ENABLE_CUDASIM=1 in the environment before numba is imported (it is "
    "slow, ~microseconds per element: keep sizes tiny)."
)


def available() -> bool:
    """Whether a CUDA GPU (or the simulator) can run tape's kernels."""
    if C.SIMULATOR:
        return True
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001  (driver missing or broken)
        return False


def require_device():
    if C.SIMULATOR:
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
    from tape.cuda._generated import kernels

    if not _FRESH:
        from tape.cuda import _codegen

        try:
            fresh = kernels.FINGERPRINT == _codegen.fingerprint()
        except OSError:  # sources not readable (zipped install): nothing to compare
            fresh = True
        if not fresh:
            raise RuntimeError(
                "tape's generated GPU kernels are stale (an op or a GPU kernel changed): run "
                "`python -m tape.cuda._codegen`"
            )
        _FRESH.append(True)
    return kernels


def _check_threads(threads):
    if threads is None:
        threads = C.SIM_THREADS if C.SIMULATOR else C.THREADS
    threads = int(threads)
    if threads < 1 or threads > C.MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two in [1, {C.MAX_THREADS}], got {threads}")
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
        self._direct = not C.SIMULATOR

    @property
    def kernel(self):
        """The compiled kernel (compiles on first use; None under the simulator)."""
        if self._kernel is None and not C.SIMULATOR:
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
        if C.SIMULATOR:
            return 1
        return max(1, int(self.kernel.max_cooperative_grid_blocks(block)))


class CudaTape:
    """A recorded tape replaying on the GPU; values and adjoints stay on the device.

    ``forward``, ``backward``, ``gradient``, ``zero_grad`` and ``grads`` mean what they mean
    on :class:`tape.Tape`; the arguments and returned arrays are NumPy arrays (copied across),
    and :attr:`device_grads`, :meth:`device_value`, :attr:`arena` give the device arrays
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
        reductions under the simulator).
    small, min_run : int
        See :data:`tape.cuda._config.SMALL` and :data:`~tape.cuda._config.MIN_RUN`.

    Notes
    -----
    Launch plan: the entries are split into runs; a run of small entries (every buffer at
    most ``small`` elements) is one launch of a single block (block barriers between
    entries), a run of large entries one cooperative launch of ``blocks`` blocks whose threads
    stride over each entry's elements (grid barriers between entries). ``gradient`` is one
    launch for a tape of one run.
    """

    def __init__(self, t, threads=None, blocks=None, cooperative=True, small=None, min_run=None):
        require_device()
        t._check_replay()
        self.tape = t
        self.dtype = t.dtype
        self.threads = _check_threads(threads)
        self.cooperative = bool(cooperative)
        K = _kernels()
        self._K = K
        arr = _numba_type(t.dtype)[::1]
        i64 = nbt.int64
        self._sweep = _Launcher(K.sweep, (i64[::1], arr, i64, i64, i64))
        self._step = _Launcher(K.step, (i64[::1], arr, i64, i64, i64))
        if C.SIMULATOR and cooperative:
            big = 1
        elif blocks is not None:
            big = int(blocks)
        elif cooperative:
            big = self._sweep.max_cooperative_blocks(self.threads)
        else:
            big = 4 * self._step.max_cooperative_blocks(self.threads)
        self.blocks = max(1, big)
        self.program = p = Program(t, n_blocks=self.blocks)
        small = C.SMALL if small is None else small
        min_run = C.MIN_RUN if min_run is None else min_run
        self.runs = segments(p.entry_size, small, min_run)
        self.prog = cuda.to_device(p.prog)
        self.arena = cuda.to_device(p.arena(t))
        """The device arena: values ``[0, n_data)``, adjoints ``[n_data, 2 n_data)``, scratch,
        seeds (see :mod:`tape.cuda._program`)."""
        self._inputs = [
            (int(t.bufs[b, B_OFF]), int(t.bufs[b, B_SIZE]), t.shapes[b]) for b in t.inputs
        ]
        self._outputs = [
            (int(t.bufs[b, B_OFF]), int(t.bufs[b, B_SIZE]), t.shapes[b]) for b in t.outputs
        ]
        self._wrt = [self._inputs[k] for k in t.wrt]
        offs = [o for o, _, _ in self._inputs]
        sizes = [n for _, n, _ in self._inputs]
        self._contiguous_inputs = all(
            offs[k + 1] == offs[k] + sizes[k] for k in range(len(offs) - 1)
        )
        self._seed_is_one = True
        self._has_take = any(t.entries[i, E_OP] == _op_code("take") for i in range(t.n_entries))

    # ------------------------------------------------------------ launches

    def _grid(self, large):
        return self.blocks if large else 1

    def _run(self, mode):
        """Run ``mode`` (FWD and/or the reverse bits) over the whole tape in as few launches as
        the run plan allows."""
        runs = self.runs
        fwd = mode & FWD
        back = mode & ~FWD
        if not runs:
            if back:
                self._launch(back, 0, 0, False)
            return
        if fwd:
            for k, (a, b, large) in enumerate(runs):
                last = k == len(runs) - 1
                self._launch(FWD | (back if last else 0), a, b, large)
            if back:
                for a, b, large in reversed(runs[:-1]):
                    self._launch(REV, a, b, large)
        elif back:
            a, b, large = runs[-1]
            self._launch(back, a, b, large)
            if back & REV:
                for a, b, large in reversed(runs[:-1]):
                    self._launch(REV, a, b, large)

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
                for ph in range(int(prog[ph_at + 3 * i])):
                    step(grid, self.threads, self.prog, self.arena, FWD, i, ph)
        if mode & (ZERO_ACT | ZERO_LEAF):
            step(grid, self.threads, self.prog, self.arena, mode & (ZERO_ACT | ZERO_LEAF), 0, 0)
        if mode & SEED:
            step(grid, self.threads, self.prog, self.arena, SEED, 0, 0)
        if mode & REV:
            for i in range(stop - 1, start - 1, -1):
                if not p.emask[i]:
                    continue
                mask = int(prog[ph_at + 3 * i + 2])
                for ph in range(int(prog[ph_at + 3 * i + 1])):
                    if (mask >> ph) & 1:
                        step(grid, self.threads, self.prog, self.arena, REV, i, ph)

    def _check_status(self):
        st = self.prog[H_STATUS : H_STATUS + 1].copy_to_host()
        i = int(st[0])
        if i != OK:
            self.prog[H_STATUS : H_STATUS + 2].copy_to_device(np.array([OK, -1], np.int64))
            raise IndexError(self._describe_failure(i))

    def _describe_failure(self, i):
        t = self.tape
        from tape import registry
        from tape._layout import E_ATTR, E_IN1

        op = registry.OPS[t.entries[i, E_OP]].name
        if op == "take":
            rows = int(t.ipool[t.entries[i, E_ATTR]])
            b = int(t.entries[i, E_IN1])
            off, size = int(t.bufs[b, B_OFF]), int(t.bufs[b, B_SIZE])
            idx = self.arena[off : off + size].copy_to_host()
            bad = [v for v in idx if v != v or v != int(v) or not -rows <= v < rows]
            if bad:
                return (
                    f"entry {i} (take): index {bad[0]:g} is out of bounds for an axis of size "
                    f"{rows} (indices are checked at every replay)"
                )
        return f"entry {i} ({op}) rejected its input data"

    # ------------------------------------------------------------ arguments

    def _load_args(self, args):
        t = self.tape
        n = len(self._inputs)
        if len(args) != n:
            raise ReplayError(
                f"this tape takes {n} argument{'s' * (n != 1)} ({', '.join(t.input_names)}), got {len(args)}"
            )
        host = []
        for k, (a, (off, size, shape)) in enumerate(zip(args, self._inputs)):
            d = _device_array(a)
            if d is not None:
                if d.shape != shape or d.dtype != self.dtype:
                    raise ReplayError(
                        f"argument {k} ({t.input_names[k]}): a device array must have shape "
                        f"{shape} and dtype {self.dtype}, got {d.shape} {d.dtype}"
                    )
                self.arena[off : off + size].copy_to_device(d.reshape(size) if size else d)
                continue
            if type(a) is not np.ndarray:
                a = t._coerce(k, a)
            if a.shape != shape:
                raise ReplayError(
                    f"argument {k} ({t.input_names[k]}): expected shape {shape}, got {a.shape}"
                )
            if a.dtype != self.dtype and not t._castable(k, a.dtype):
                raise ReplayError(
                    f"argument {k} ({t.input_names[k]}): cannot use values of dtype {a.dtype} "
                    f"for an input recorded as {t.input_dtypes[k]}"
                )
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
        for off, size, shape in self._outputs:
            v = (
                self.arena[off : off + size].copy_to_host().reshape(shape)
                if size
                else np.zeros(shape, self.dtype)
            )
            outs.append(v[()] if v.ndim == 0 else v)
        return outs[0] if self.tape._out_single else tuple(outs)

    # ------------------------------------------------------------ the replay API

    def forward(self, *args):
        """Replay on new arguments (NumPy or device arrays of the recorded shapes); returns the
        output(s) as NumPy values, like :meth:`tape.Tape.forward`."""
        self._load_args(args)
        self._run(FWD)
        if self._has_take:
            self._check_status()
        return self._outputs_host()

    def backward(self, seed=None):
        """Reverse sweep over the last forward replay; leaf gradients accumulate on the device
        (like :meth:`tape.Tape.backward`)."""
        if seed is None:
            if self.program.n_seed != 1:
                raise RuntimeError(
                    "backward: the output is not a scalar; pass seed= with the output's shape"
                )
            self._set_seed_one()
        else:
            s = self.tape._seed(seed)
            self.arena[self.program.seed_off : self.program.seed_off + s.shape[0]].copy_to_device(
                np.ascontiguousarray(s, self.dtype)
            )
            self._seed_is_one = False
        self._run(BACKWARD)

    def _set_seed_one(self):
        if not self._seed_is_one:
            p = self.program
            self.arena[p.seed_off : p.seed_off + p.n_seed].copy_to_device(
                np.ones(p.n_seed, self.dtype)
            )
            self._seed_is_one = True

    def gradient(self, *args):
        """Zero the gradients, replay forward and backward: one array per differentiated
        argument (a single array if there is one), copied to the host."""
        if self.program.n_seed != 1:
            raise RuntimeError(
                "gradient() needs a scalar output; use forward() and backward(seed=...)"
            )
        self._set_seed_one()
        self._load_args(args)
        self._run(GRADIENT)
        if self._has_take:
            self._check_status()
        g = self.grads
        return g[0] if len(g) == 1 else tuple(g)

    def value_and_grad(self, *args):
        g = self.gradient(*args)
        return self._outputs_host(), g

    def zero_grad(self):
        """Zero the accumulated gradients (on the device)."""
        self._launch(ZERO_LEAF, 0, 0, False)

    @property
    def grads(self):
        """Accumulated gradients, copied to the host (one array per differentiated argument)."""
        out = []
        for off, size, shape in self._wrt:
            g0 = self.program.grad_off + off
            out.append(
                self.arena[g0 : g0 + size].copy_to_host().reshape(shape)
                if size
                else np.zeros(shape, self.dtype)
            )
        return out

    @property
    def device_grads(self):
        """The gradients as device arrays (views of :attr:`arena`, no copy)."""
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
        buffers: no host transfer at all."""
        if backward:
            self._set_seed_one()
        self._run(GRADIENT if backward else FWD)

    def gradient_batch(self, *args, threads=None):
        """Batched replay on the GPU (see :func:`gradient_batch`)."""
        return gradient_batch(self.tape, *args, threads=threads)

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
            f"<CudaTape {self.tape.n_entries} entries, {len(self.runs)} launch(es) per sweep, "
            f"{self.threads} threads x {self.blocks} blocks, {self.dtype}>"
        )


def _device_array(a):
    """``a`` as a Numba device array if it lives on the GPU (any CUDA array interface)."""
    if cuda.devicearray.is_cuda_ndarray(a):
        return a
    if hasattr(a, "__cuda_array_interface__") and hasattr(cuda, "as_cuda_array"):
        return cuda.as_cuda_array(a)
    return None


def _op_code(name):
    from tape import registry

    return registry.BY_NAME[name].code


# ---------------------------------------------------------------- batched replay


class CudaBatch:
    """Batched replay of one tape on the GPU: ``n`` independent instances, one thread each.

    Made once per (tape, batch size); :meth:`run` replays on the arguments in place. The
    arena of instance ``b`` is interleaved in :attr:`arena` (element ``e`` at
    ``e * n + b``), so that a warp reads 32 adjacent values.
    """

    def __init__(self, t, n, threads=None):
        require_device()
        self.tape = t
        self.n = int(n)
        self.plan = _batch_plan(t)
        self.program = p = Program(t, n_blocks=1)
        self.threads = _check_threads(threads)
        K = _kernels()
        arr = _numba_type(t.dtype)[::1]
        i64 = nbt.int64
        self._batch = _Launcher(K.batch, (i64[::1], arr, arr, i64, i64))
        self.prog = cuda.to_device(p.prog)
        self.template = cuda.to_device(p.arena(t))
        self.rows = p.seed_off  # values, adjoints and scratch of one instance
        self.arena = cuda.device_array(self.rows * max(self.n, 1), t.dtype)

    def load(self, packed):
        """Copy packed arguments ``(n, n_inputs)`` (host) into the instances' input rows."""
        pl = self.plan
        s = 0
        n = self.n
        for off, size in zip(pl.in_offs, pl.in_sizes):
            off, size = int(off), int(size)
            if size:
                rows = np.ascontiguousarray(packed[:, s : s + size].T)
                self.arena[off * n : (off + size) * n].copy_to_device(rows.reshape(-1))
            s += size

    def run(self, mode=GRADIENT):
        if self.n == 0:
            return
        blocks = (self.n + self.threads - 1) // self.threads
        self._batch(blocks, self.threads, self.prog, self.template, self.arena, self.n, mode)

    def _rows(self, offs, sizes, region):
        n = self.n
        out = []
        for off, size in zip(offs, sizes):
            off, size = int(off) + region, int(size)
            out.append(self.arena[off * n : (off + size) * n].copy_to_host().reshape(size, n).T)
        return np.concatenate(out, axis=1) if out else np.zeros((n, 0), self.tape.dtype)

    def results(self):
        """``(values, grads)`` as :func:`tape.batch.gradient_batch` returns them."""
        pl = self.plan
        st = self.prog[H_STATUS : H_STATUS_INST + 1].copy_to_host()
        if int(st[0]) != OK:
            self.prog[H_STATUS : H_STATUS_INST + 1].copy_to_device(np.array([OK, -1], np.int64))
            raise IndexError(
                f"instance {int(st[1])}: entry {int(st[0])} ({pl._op_name(int(st[0]))}) rejected its "
                "data (an index out of bounds; indices are checked at every replay)"
            )
        vals = self._rows(pl.out_offs, pl.out_sizes, 0)
        grads = self._rows(pl.g_offs, pl.g_sizes, self.program.grad_off)
        return pl.unpack(vals, np.ascontiguousarray(grads))

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


def gradient_batch(t, *args, threads=None):
    """Per-instance value and gradient of a recorded tape with a scalar output, on the GPU
    (one thread per instance). Same arguments and results as :func:`tape.batch.gradient_batch`.
    """
    plan = _batch_plan(t)
    packed = plan.pack_args(args)
    n = packed.shape[0]
    cache = getattr(t, "_cuda_batch", None)
    if cache is None or cache.n != n or cache.plan is not plan:
        cache = CudaBatch(t, n, threads=threads)
        t._cuda_batch = cache
    cache.load(packed)
    cache.run()
    return cache.results()
