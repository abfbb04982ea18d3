"""tape: reverse-mode automatic differentiation on a flat Wengert list, compiled with Numba.

Eager, PyTorch-style::

    import tape as tp
    w = tp.tensor(2.0, requires_grad=True)
    loss = (3 * w - 1).square()
    loss.backward()
    w.grad            # tensor(30.)

Record once, replay many::

    t = tp.record(lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(), x0)
    g = t.gradient(x1)

The documentation (``docs/``, built with Sphinx) has the full tour.
"""

from tape import _aliases

_aliases.install()  # tape.nn, tape.cuda, tape.core, ...: the public names of layer modules

# isort: split
from tape import ops as _ops  # noqa: F401  (fills the registry before anything compiles)

# isort: split
from tape.compiler import compiled
from tape.compiler.compiled import CompileError
from tape.frontend.checkpoint import checkpoint
from tape.frontend.custom import CustomOp, custom_op
from tape.frontend.function_transforms import (
    grad,
    hessian,
    hvp,
    jacfwd,
    jacobian,
    jacrev,
    jvp,
    value_and_grad,
    vjp,
)
from tape.frontend.functional import *  # noqa: F401,F403
from tape.frontend.functional import __all__ as _functional_all
from tape.frontend.ops.creation import (
    Generator,
    accelerator,
    as_tensor,
    default_generator,
    from_numpy,
    initial_seed,
    manual_seed,
    normal,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    seed,
)
from tape.frontend.record import record
from tape.frontend.tensor import (
    GradFn,
    Size,
    Tensor,
    arange,
    bool_,
    device,
    empty,
    empty_like,
    enable_grad,
    eye,
    float32,
    float64,
    full,
    full_like,
    get_default_device,
    get_default_dtype,
    inference_mode,
    int32,
    int64,
    is_grad_enabled,
    linspace,
    no_grad,
    ones,
    ones_like,
    set_default_device,
    set_default_dtype,
    set_grad_enabled,
    tensor,
    zeros,
    zeros_like,
)
from tape.frontend.testing import GradcheckError, gradcheck
from tape.interpreter.generated import sweeps
from tape.interpreter.generated import sweeps as _sweeps
from tape.program import core as _core
from tape.program import kernels
from tape.program.anomaly import AnomalyError, detect_anomaly
from tape.program.core import GuardWarning, KernelArgs, Tape, load
from tape.program.replay import GuardError, ReplayError
from tape.transforms import batch as _batch  # noqa: F401  (registers Tape.gradient_batch)

# isort: split
from tape.frontend import linalg  # after tape.functional, which it builds on

# isort: split
from tape.frontend import numpy_api  # noqa: F401,I001  (NumPy and SciPy calls on tensors record)

__version__ = "0.1.0"

double = float64
float = float32  # noqa: A001  (torch.float is float32)
long = int64
int = int32  # noqa: A001  (torch.int is int32)
bool = bool_  # noqa: A001

__all__ = [
    "Tape", "KernelArgs", "sweeps", "kernels", "compiled", "linalg", "CompileError", "Tensor", "Size", "GradFn", "ReplayError", "GuardError", "GuardWarning", "detect_anomaly", "AnomalyError", "GradcheckError", "record", "load", "gradcheck", "custom_op", "CustomOp", "checkpoint",
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like",
    "arange", "linspace", "eye", "no_grad", "enable_grad", "is_grad_enabled",
    "set_grad_enabled", "inference_mode",
    "float64", "float32", "int64", "int32", "bool_", "warmup",
    "randn", "rand", "randint", "randn_like", "rand_like", "normal", "manual_seed", "seed",
    "initial_seed", "Generator", "default_generator", "empty", "empty_like", "device",
    "accelerator", "set_default_device", "get_default_device", "set_default_dtype",
    "get_default_dtype", "double", "long",
    "grad", "value_and_grad", "jacobian", "jacfwd", "jacrev", "hessian", "jvp", "vjp", "hvp",
] + list(_functional_all)  # fmt: skip


def _to_cuda(t, device, **kwargs):
    # tape.cuda (and numba.cuda) load only when a tape is first moved to a GPU
    from tape.gpu import to_device

    return to_device(t, device, **kwargs)


_core.register_extension("to_cuda", _to_cuda)


def _derivatives():
    # tape.derivatives (and SciPy's sparse module) load when a tape first needs them; the
    # module is kept, as an import statement costs a call ~0.3 us even once it is loaded
    global _DERIVATIVES
    if _DERIVATIVES is None:
        from tape.transforms import derivatives

        _DERIVATIVES = derivatives
    return _DERIVATIVES


_DERIVATIVES = None


_core.register_extension("derivatives", _derivatives)


_LAZY = ("autograd", "optimize", "sparse", "derivatives", "optim", "nn", "cuda", "distributed")
_UNSUPPORTED_DTYPES = (
    "half",
    "float16",
    "bfloat16",
    "complex64",
    "complex128",
    "cfloat",
    "cdouble",
)


def __getattr__(name):
    # submodules that import SciPy's optimisers or are rarely needed load on first use
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"tape.{name}")
    if name in _UNSUPPORTED_DTYPES:
        raise TypeError(
            f"tape.{name}: tape computes in float32 and float64 only (and int64/bool data); "
            "use tape.float32 or tape.float64"
        )
    raise AttributeError(f"module 'tape' has no attribute {name!r}")


def _check_fresh():
    import warnings

    from tape.layout.fingerprint import sweeps_fingerprint

    try:
        fresh = _sweeps.FINGERPRINT == sweeps_fingerprint()
    except OSError:  # sources not readable (zipped install): nothing to compare
        return
    if not fresh:
        warnings.warn(
            "tape's generated sweeps are stale (a driver changed): run `python -m tape.interpreter.codegen`",
            stacklevel=2,
        )


_check_fresh()
_aliases.install()  # the public names of the modules imported above
_aliases.keep_transforms()  # from tape.transforms import grad, as before the layer folders


def warmup(dtypes=("float64",)):
    """Compile (or load from Numba's cache) the sweeps and drivers for ``dtypes`` now, with the
    kernels of ``mul`` and ``sum``, instead of at the first replay (the other ops compile the
    first time a tape uses them). A cold compile takes a few seconds; a cached load well under
    one."""
    import numpy as np

    for d in dtypes:
        t = record(lambda x: (x * x).sum(), np.ones(2, np.dtype(d)))
        t.gradient(np.ones(2, np.dtype(d)))
