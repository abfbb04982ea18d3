"""Every numba-cuda option tape uses, in one place (the GPU counterpart of tape/layout/config.py).

Globals are compile-time constants in CUDA kernels too (and frozen into Numba's cache), so
nothing here may change at run time.
"""

from numba import config as _numba_config

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)
"""True under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported)."""

MAX_THREADS = 256
"""Largest block size (a power of two): the size of the shared-memory scratch used by block
reductions. Blocks must be a power of two no larger than this."""

THREADS = 256
"""Default threads per block on a real GPU (the simulator defaults to fewer: each simulated
thread is a Python thread)."""

SIM_THREADS = 32
"""Default threads per block under the simulator."""

SMALL = 8192
"""Entries whose buffers all have at most this many elements run in a one-block launch (a
block barrier instead of a grid-wide barrier between entries); larger ones in a launch of as
many blocks as can be co-resident (a cooperative launch, grid-wide barriers)."""

MIN_RUN = 8
"""A run of fewer small entries than this between large ones is not worth its own launch
(a launch costs about as much as several grid barriers): it joins the large launch."""

LAUNCH_BOUNDS = (MAX_THREADS, 3)
"""At most MAX_THREADS threads per block, at least 3 blocks per SM: caps registers at
65536 / (3 * 256) = 85 per thread. Uncapped, ptxas (sm_90) gave the sweep kernel 150 registers
(one 256-thread block per SM: 12.5% occupancy, too few loads in flight for streaming entries);
capped at 80 it spilled ~380 bytes, in the large op paths rather than the streaming loops.
Measured statically only (no GPU was available): revisit with benchmarks/gpu_check.py."""

MAX_REGISTERS = 65536 // (LAUNCH_BOUNDS[0] * LAUNCH_BOUNDS[1]) // 8 * 8
"""The register cap those launch bounds give (80), applied to every function of a kernel.
The cooperative ``sweep`` is linked with the device runtime (its grid barrier), so ptxas
compiles each device function it calls separately; the launch bounds cap only the kernel
itself, and the link failed on an H200 ("entry function with max regcount of 80 calls
function with regcount of 254": ``reverse_phase``). The linker's ``-maxrregcount`` caps them
all (``tape.gpu._ptx.assemble`` reproduces that link step with ptxas, without a GPU)."""

KERNEL_JIT = (
    {} if SIMULATOR else dict(cache=True, launch_bounds=LAUNCH_BOUNDS, max_registers=MAX_REGISTERS)
)
"""Options of the kernels in ``tape/gpu/_generated/kernels.py`` (the simulator takes neither).
They are cached: that file is generated and carries a fingerprint of every source compiled in
(the same scheme as the CPU sweeps), so a rule change rewrites it and Numba recompiles."""

DEVICE_JIT = dict(device=True)
"""Options of the device functions (rules, loops, op kernels)."""
