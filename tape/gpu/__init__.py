"""tape on NVIDIA GPUs (numba-cuda): replay a recorded tape on the device, one instance or many.

Imported lazily: ``import tape`` never imports this package or ``numba.cuda``. Install the
extra (``pip install -e '.[cuda]'``); without a GPU, set ``NUMBA_ENABLE_CUDASIM=1`` before
numba is imported to run everything in Numba's CUDA simulator (slowly).

::

    import tape as tp
    from tape.gpu import CudaTape, gradient_batch

    t = tp.record(f, x0)
    ct = CudaTape(t)              # or t.to("cuda")
    g = ct.gradient(x1)           # NumPy in, NumPy out; values stay on the device
    ct.device_grads               # device arrays, no copy
    values, grads = gradient_batch(t, X)   # X: (batch, *x0.shape), one thread per instance

How it runs (see :mod:`tape.gpu._program` and the generated ``_generated/kernels.py``):
one kernel walks the packed tape with the whole grid on each entry and a barrier after each
phase (a block barrier for runs of small entries, launched as one block; a grid barrier in a
cooperative launch for large ones), so a replay is one launch for most tapes. The rules are
the CPU rules translated to device functions (:mod:`tape.gpu._rules`); structural ops have
GPU kernels in :mod:`tape.gpu._kernels`. The results are the CPU replay's: same semantics
(``tests/test_conformance.py`` runs one table of cases on every backend), same argument
checks and errors, same dtypes. A replay whose arguments leave the recorded path (a failed
guard) raises or runs on the CPU tape, following ``on_change`` (see :class:`CudaTape`).
Custom ops made with CUDA device functions (``tp.custom_op(..., cuda_fwd=, cuda_vjp=)``) run
between the launches as kernels of their own (:mod:`tape.gpu._custom`).
"""

from tape.gpu._replay import CudaBatch, CudaTape, available, gradient_batch

__all__ = ["CudaTape", "CudaBatch", "gradient_batch", "available", "to_device"]

# ---------------------------------------------------------------- PyTorch's torch.cuda queries
# A script written for PyTorch asks ``torch.cuda.is_available()`` before it puts tensors on
# the GPU. tape's tensors always live on the CPU (a recorded tape replays on the GPU:
# ``t.to("cuda")``), so these answer as a CPU-only PyTorch does, and ``available()`` says
# whether tapes can replay on a GPU here.

_NO_CUDA_TENSORS = (
    "tape's tensors live on the CPU (tape has no CUDA tensors); record a tape and replay it on "
    "a GPU with t.to('cuda') (tape.cuda.available() says whether one can run here)"
)


def is_available() -> bool:
    """Whether tensors can be placed on a CUDA device: never in tape, as in a CPU-only PyTorch
    (see :func:`available` for replaying tapes on a GPU)."""
    return False


def device_count() -> int:
    """CUDA devices tensors can use: 0 (see :func:`is_available`)."""
    return 0


def is_initialized() -> bool:
    return False


def manual_seed(seed) -> None:
    """Seed the CUDA generators: there are none, so, as PyTorch without CUDA, nothing happens."""
    int(seed)


manual_seed_all = manual_seed


def synchronize(device=None) -> None:
    """Wait for CUDA tensor work: there is none."""


def empty_cache() -> None:
    """Free cached CUDA tensor memory: there is none."""


def _no_cuda(*args, **kwargs):
    raise AssertionError(_NO_CUDA_TENSORS)


current_device = get_device_name = get_device_properties = set_device = _no_cuda


def to_device(t, device="cuda", **kwargs):
    """``t.to(device)``: a :class:`CudaTape` for ``"cuda"`` (``"cuda:0"``), ``t`` for ``"cpu"``."""
    dev = str(device)
    if dev == "cpu":
        return t
    if dev == "cuda" or dev.startswith("cuda:"):
        if dev.startswith("cuda:"):
            from numba import cuda

            cuda.select_device(int(dev.split(":", 1)[1]))
        return CudaTape(t, **kwargs)
    raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda'")
