"""Random constructors, the seeded generator and the accelerator query (PyTorch's
``randn``, ``rand``, ``randint``, ``normal``, ``manual_seed``, ``torch.accelerator``).

Random values come from a NumPy ``Generator`` (PCG64): sequences are reproducible after
:func:`manual_seed`, but they are not PyTorch's numbers for the same seed.
"""

from __future__ import annotations

import numpy as np

from tape.frontend import tensor


class Generator:
    """A seeded source of random numbers, as ``torch.Generator`` (backed by NumPy's PCG64)."""

    def __init__(self, device="cpu"):
        tensor.check_device(device, "Generator")
        self._seed = int(np.random.SeedSequence().entropy % (1 << 63))
        self.rng = np.random.default_rng(self._seed)

    def manual_seed(self, seed):
        """Reset the sequence to the one ``seed`` gives; returns the generator."""
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise TypeError(f"manual_seed: expected an int seed, got {seed!r}") from None
        self._seed = seed
        self.rng = np.random.default_rng(seed % (1 << 64))
        return self

    def seed(self):
        """Reseed from the operating system's entropy; returns the new seed."""
        self.manual_seed(int(np.random.SeedSequence().entropy % (1 << 63)))
        return self._seed

    def initial_seed(self):
        """The seed this generator was last seeded with."""
        return self._seed


default_generator = Generator()


def manual_seed(seed):
    """Seed the default generator (every random constructor's source); returns it."""
    return default_generator.manual_seed(seed)


def seed():
    """Seed the default generator from fresh OS entropy and return that seed, as
    ``torch.seed``."""
    return default_generator.seed()


def initial_seed():
    """The seed the default generator was last seeded with, as ``torch.initial_seed``."""
    return default_generator.initial_seed()


def _rng(generator):
    if generator is None:
        return default_generator.rng
    if not isinstance(generator, Generator):
        raise TypeError(f"generator must be a tape.Generator, got {type(generator).__name__}")
    return generator.rng


def _float_dtype(dtype, what):
    dt = tensor.get_default_dtype() if dtype is None else tensor._check_dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"{what}: expected a floating-point dtype, got {dt}")
    return dt


def _new(v, dtype, requires_grad):
    return tensor.Tensor(np.array(v, dtype=dtype), requires_grad=requires_grad)


def _size(size, what):
    if not size:
        raise TypeError(f"{what}() missing the size: pass ints or a tuple (() for a 0-d tensor)")
    return tensor._shape_args(size, what)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Standard normal samples of shape ``size`` (ints or one tuple; ``()`` is 0-d)."""
    tensor.check_device(device, "randn")
    dt = _float_dtype(dtype, "randn")
    return _new(_rng(generator).standard_normal(_size(size, "randn")), dt, requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Uniform samples on ``[0, 1)`` of shape ``size``."""
    tensor.check_device(device, "rand")
    dt = _float_dtype(dtype, "rand")
    return _new(_rng(generator).random(_size(size, "rand")), dt, requires_grad)


def randint(*args, low=None, high=None, size=None, generator=None, dtype=None, device=None,
            requires_grad=False):  # fmt: skip
    """Integers uniform on ``[low, high)``: ``randint(high, size)``,
    ``randint(low, high, size)`` or with keywords (int64 unless ``dtype``)."""
    tensor.check_device(device, "randint")
    if size is None and args and isinstance(args[-1], (tuple, list)):
        size, args = args[-1], args[:-1]
    if len(args) == 2:
        low, high = args
    elif len(args) == 1:
        if high is None:
            high = args[0]
        else:
            low = args[0]
    elif args:
        raise TypeError("randint: expected randint(high, size) or randint(low, high, size)")
    low = 0 if low is None else low
    if high is None:
        raise TypeError("randint: missing high")
    if size is None:
        raise TypeError("randint: missing the size (a tuple)")
    if int(high) <= int(low):
        raise ValueError(f"randint: expected low < high, got low={low} and high={high}")
    v = _rng(generator).integers(int(low), int(high), tensor._shape_args((size,), "randint"))
    dt = np.dtype(np.int64) if dtype is None else tensor._check_dtype(dtype)
    if requires_grad and dt.kind != "f":
        raise RuntimeError("only tensors of floating point dtype can require gradients")
    return _new(v, dt, requires_grad)


def randn_like(x, dtype=None, device=None, requires_grad=False, generator=None):
    """Standard normal samples with ``x``'s shape (and float dtype unless ``dtype``)."""
    x = tensor.as_tensor(x)
    dt = dtype if dtype is not None else (x.dtype if x.dtype.kind == "f" else None)
    return randn(x.shape, generator=generator, dtype=dt, device=device, requires_grad=requires_grad)


def rand_like(x, dtype=None, device=None, requires_grad=False, generator=None):
    """Uniform ``[0, 1)`` samples with ``x``'s shape."""
    x = tensor.as_tensor(x)
    dt = dtype if dtype is not None else (x.dtype if x.dtype.kind == "f" else None)
    return rand(x.shape, generator=generator, dtype=dt, device=device, requires_grad=requires_grad)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad=False):  # fmt: skip
    """Normal samples: ``normal(mean, std, size)`` with numbers, or elementwise with tensor
    ``mean`` and/or ``std`` (broadcast together), as ``torch.normal``. The result is a new
    leaf (no gradient flows to ``mean`` or ``std``)."""
    tensor.check_device(device, "normal")
    m = np.asarray(mean._peek() if isinstance(mean, tensor.Tensor) else mean, np.float64)
    s = np.asarray(std._peek() if isinstance(std, tensor.Tensor) else std, np.float64)
    if np.any(s < 0):
        raise ValueError("normal: expected all std >= 0")
    if size is None:
        if not (isinstance(mean, tensor.Tensor) or isinstance(std, tensor.Tensor)):
            raise TypeError("normal: pass size= when mean and std are numbers")
        size = np.broadcast_shapes(m.shape, s.shape)
    shape = tensor._shape_args((size,), "normal")
    z = _rng(generator).standard_normal(shape)
    like = [t.dtype for t in (mean, std) if isinstance(t, tensor.Tensor) and t.dtype.kind == "f"]
    dt = _float_dtype(dtype if dtype is not None else (like[0] if like else None), "normal")
    return _new(m + s * z, dt, requires_grad)


class _Accelerator:
    """``tape.accelerator``, as ``torch.accelerator``: which device eager tensors may use
    besides the CPU. None: eager tensors live on the CPU, and GPUs run recorded tapes
    (``Tape.to("cuda")``), so scripts that pick ``"cuda"`` when an accelerator is available
    run on the CPU here."""

    @staticmethod
    def is_available():
        return False

    @staticmethod
    def current_accelerator(check_available=False):
        return None

    @staticmethod
    def device_count():
        return 0

    def __repr__(self):
        return "<tape.accelerator: none for eager tensors (GPU replay: Tape.to('cuda'))>"


accelerator = _Accelerator()


# ---------------------------------------------------------------- tensors over NumPy memory


def from_numpy(ndarray) -> tensor.Tensor:
    """A tensor over ``ndarray``'s memory, as PyTorch's ``torch.from_numpy``: a write to one
    shows in the other, and ``t.numpy()`` gives the array back. The array must hold a dtype
    tensors keep (float64, float32, int64, bool) in C order; anything else raises rather than
    copy (:func:`tape.tensor` copies)."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray (got {type(ndarray).__name__})")
    dt = ndarray.dtype
    if dt.kind not in "biuf" or tensor._check_dtype(dt) != dt:
        held = (
            f"hold {dt} data as {tensor._check_dtype(dt)}" if dt.kind in "biuf" else "are numeric"
        )
        raise TypeError(
            f"from_numpy: tensors {held}, so the memory of an array of dtype {dt} cannot be "
            "shared; tape.tensor(a) converts a copy"
        )
    if not ndarray.flags.c_contiguous:
        raise ValueError(
            f"from_numpy: tensors are C-contiguous and this array (shape {tuple(ndarray.shape)}, strides "
            f"{ndarray.strides}) is not, so its memory cannot be shared; tape.tensor(a) copies it"
        )
    return tensor.Tensor(ndarray)


def as_tensor(data, dtype=None, device=None) -> tensor.Tensor:
    """``data`` as a tensor, as PyTorch's ``torch.as_tensor``: a tensor of the same dtype is
    returned as it is (another dtype: converted); a NumPy array of a dtype tensors keep, in C
    order, is shared (:func:`from_numpy`), not copied; anything else is copied
    (:func:`tape.tensor`)."""
    tensor.check_device(device, "as_tensor")
    if isinstance(data, tensor.Tensor):
        return data if dtype is None or np.dtype(dtype) == data.dtype else data.to(dtype)
    if (
        isinstance(data, np.ndarray)
        and (dtype is None or np.dtype(dtype) == data.dtype)
        and data.dtype.kind in "biuf"
        and tensor._check_dtype(data.dtype) == data.dtype
        and data.flags.c_contiguous
    ):
        return tensor.Tensor(data)
    return tensor.tensor(data, dtype=dtype)
