"""The one accumulate rule both targets' reverse loops use (CPU: :mod:`tape.ops.loops`, GPU:
:mod:`tape.gpu._loops`), so they give the same numbers.

A plain function: each target compiles it its own way (``njit(inline="always")`` on the CPU, a
CUDA device function on the GPU). Imports nothing.
"""


def masked(c, g):
    """What a reverse rule's value ``c`` adds to an input adjoint where the output adjoint is
    ``g``: ``c``, or exactly zero where ``g`` is zero.

    A select, not a product: ``c`` may be inf or NaN where an unused branch's rule was
    evaluated (``where(x > 0, sqrt(x), 0)`` at ``x = 0``), and ``0 * inf`` would be NaN. A NaN
    ``g`` is not zero, so it still propagates. The select keeps the loops vectorised.
    """
    return c if g != 0.0 else 0.0
