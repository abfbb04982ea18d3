"""The compiled tier's limits and sizes, shared by its passes (:mod:`tape.compiler.analyse`,
:mod:`tape.compiler.emit`, :mod:`tape.compiler.compiled`)."""

from __future__ import annotations

GENERATOR_VERSION = 12

MAX_UNIT_KINDS = 400
"""Tapes that need more distinct kinds of unit than this are not compiled
(:func:`compile_tape` raises :class:`CompileError`; automatic promotion leaves them on the
interpreter): Numba's compile time grows with them. Repeated steps (a time loop recorded
unrolled) share their kinds, so the length of a tape does not count."""

AUTO_AFTER = 100
"""Automatic promotion: a tape recorded with ``compile="auto"`` (the default) is compiled at its
``AUTO_AFTER``-th replay, in the calling thread, unless :data:`AUTO_SECONDS` promoted it before,
or its compile is estimated to cost more than its replays so far (:data:`AUTO_COLD_UNIT`):
then promotion by time waits until the replays have taken that long."""

AUTO_SECONDS = 0.5
"""Automatic promotion by time: once a ``compile="auto"`` tape's replays on the interpreter
have taken this many seconds in all (from its :data:`AUTO_MIN`-th replay on), it compiles in a
background thread and its replays go on on the interpreter until the compiled code is ready.
Replays that long (5 ms or more on average before the 100th) run mostly in compiled code that
releases Python's lock, so the compile and the replays share the machine instead of the
replays waiting for the compile. A tape whose replay costs 68 ms then promotes at its 8th
replay instead of its 100th."""

AUTO_MIN = 3
"""Promotion by time waits for this many replays: a tape recorded and replayed once or twice
(a check, a single gradient) never pays for a compile, however long its replay."""

AUTO_COLD_UNIT = 0.3
"""Seconds a fused loop that Numba's cache does not hold is estimated to take to compile, for
automatic promotion (``t.compile_cost``, :func:`tape.compiler.compiled.compile_estimate`).
Where the estimate of a tape's compile exceeds the time its replays on the interpreter have
taken so far (timed as for :data:`AUTO_SECONDS`), neither rule promotes it then: promotion by
time waits until the replays have taken as long as the estimate, the break-even rule of
tiered JIT compilers (whatever the number of replays to come, the time spent is then at most
about twice that of the better choice made in hindsight). A compile whose code is all in
the cache loads in a fraction of a second, is estimated at 0 and promotes as before.
Measured with empty caches on a 2-core AMD EPYC (Zen 3), one process compiling: 0.25-0.36 s
per loop (GMM's 19 loops and the runtime's entry: 6.6-10.6 s in all)."""

AUTO_COLD_RUNTIME = 2.5
"""Seconds the shared runtime's one-call gradient for a tape's number and kinds of arguments
(``gradient_args_<n>``), or a tape's own module, is estimated to take to compile where Numba's
cache does not hold it (1.8-3.7 s measured as for :data:`AUTO_COLD_UNIT`)."""

# What a fused loop does with an op comes from its record (:class:`tape.registry.Op`):
# ``cheap`` ops' values are recomputed by the reverse loop rather than stored by the forward
# one (a load costs more than the arithmetic); a reverse loop runs in blocks (``_block_loop``)
# only if all its ops ``vectorise``; an open fused group moves past a structural op's entry
# unless it ``may_stop`` the sweep.

BLOCK = 1024
"""Elements per block of a fused reverse loop (``_block_loop``): its scratch arrays (one per
input adjoint) stay in the L1 cache."""

SHIFT_MAX = 64
"""Views of one buffer whose offsets differ by at most this many elements (``x[1:]`` and
``x[:-1]``) add their adjoints in one pass per block of a fused reverse loop (see
``Gen.shifted_adds``)."""

BLOCK_MIN = 64
"""Fused reverse loops shorter than this run element by element (``_element_loop``): no
scratch arrays to allocate, and too short for vector code to pay. So do loops with an op
that does not vectorise (``Op.vectorises``)."""

SHORT_SUM = 16
"""A folded sum over at most this many elements is added up in the unit itself: a call to
``_sum_reassoc`` costs more than the adds."""

INLINE_KINDS = 4
"""A tape with a module of its own (a custom op's loop) and at most this many kinds of unit
has its units and sweeps inlined
(``inline='always'``) into the functions that call them: for a small tape the calls, not the
loops, are what a replay costs. Larger tapes keep one function per unit kind (LLVM optimises
each loop on its own, and the compile stays short)."""

FEW_RANGES = 16
"""Adjoint ranges to zero that the generated code names one by one (more: a table)."""

TAGS = {"full": "", "row": "p", "tile": "t", "block": "q"}
"""The letter after ``d``/``g``/``x``/``e`` in a view's name: how a loop over rows reads it."""


def tag(kind):
    """The letter of an input's kind (see :meth:`Plan.fusable`) in its names."""
    return TAGS[kind if isinstance(kind, str) else kind[0]]


OPEN_GROUPS = 8
"""Fused groups that stay open at once while the tape is cut into units (see
:meth:`Plan._group`): the oldest is placed when another opens."""
