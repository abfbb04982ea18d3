"""Compiled replay drivers that take a tape's kernel arguments as one value, for your own
``@njit`` code::

    import tape as tp
    from numba import njit

    @njit
    def descend(ka, off, n, lr, steps):
        for _ in range(steps):
            status = tp.kernels.gradient(ka)
            if status >= 0:          # a guard or a gather index stopped the sweep
                return status
            for j in range(n):
                ka.data[off + j] -= lr * ka.grad[off + j]
        return -1

    t = tp.record(f, x0)
    ka = t.workspace()               # private arenas (or t.kernel_args(): this thread's own)
    off, n = t.input_slice(0)
    descend(ka, off, n, 1e-3, 100)

``forward(ka)``
    Replay forward; writes ``ka.data``; returns the status.
``backward(ka)``
    Reverse sweep over the last forward, seeded with ``ka.seeds``; leaf gradients in
    ``ka.grad`` accumulate.
``gradient(ka)``
    Zero the leaf gradients, forward, backward; returns the forward status.

The status is ``-1`` when the sweep ran to the end, or the index of the entry that stopped it:
``t.is_guard(status)`` tells a failed guard (the arguments take another path than the
recording: replay from Python, which retraces, or record again) from a gather index out of
bounds. The functions live in the generated sweeps and are re-exported here.

The sweeps call each entry's op kernel through a table of addresses that is filled per process:
``t.workspace()`` and ``t.kernel_args()`` compile (or load from Numba's cache) the kernels of
the tape's ops and fill their slots, so get ``ka`` from one of them in the process that runs
your ``@njit`` code (``tape.interpreter.dispatch.prepare_tape(t)`` does the same for arrays of your own).
A sweep that meets an op whose kernel this process has not prepared raises ``RuntimeError``.
"""

from tape.interpreter.generated.sweeps import ka_backward as backward
from tape.interpreter.generated.sweeps import ka_forward as forward
from tape.interpreter.generated.sweeps import ka_gradient as gradient

__all__ = ["forward", "backward", "gradient"]
