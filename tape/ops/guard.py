"""Guards: where a traced value left the tape during :func:`tape.record`.

A Python ``if`` on a tensor, ``float(x)``, ``x.item()`` or ``np.asarray(x)`` inside a recorded
function hands a value to Python, and whatever Python did with it (a branch taken, a loop
count, a shape) is frozen into the tape. Each such place records a ``guard`` entry: input 0
is the traced value, input 1 a constant holding what it was at record time. At replay the
guard compares the two and, when they differ, stops the forward sweep by returning its entry
index as the sweep's status (as a gather with a bad index does); the replay then retraces,
raises or warns (``tape.record(..., on_change=...)``). A guard has no adjoint.

Attribute block: ``[mode]``:

``EQUAL``
    every element of input 0 equals input 1's (NaN matches NaN): an escaped value.
``TRUTH``
    input 0 (one element) is nonzero exactly when input 1 is: a Python ``bool``.
``INT``
    ``int()`` of every element of input 0 equals input 1's: ``int(x)`` and ``__index__``.
"""

import numpy as np

from tape.layout.calls import compiled_only
from tape.layout.columns import E_ATTR, E_IN0, E_IN1
from tape.ops import registry, validate
from tape.ops.loops import view

EQUAL, TRUTH, INT = 0, 1, 2
MODES = {EQUAL: "value", TRUTH: "truth value", INT: "integer value"}


@compiled_only
def guard_fwd(i, entries, bufs, ipool, data):
    x = view(bufs, data, entries[i, E_IN0])
    ref = view(bufs, data, entries[i, E_IN1])
    mode = ipool[entries[i, E_ATTR]]
    if mode == TRUTH:
        if (x[0] != 0.0) != (ref[0] != 0.0):
            return i
        return -1
    for j in range(x.shape[0]):
        v = x[j]
        r = ref[j]
        if mode == INT:
            if not (v == v and abs(v) < 9.2e18) or int(v) != r:
                return i
        elif v != r and not (v != v and r != r):
            return i
    return -1


def check(t, i, e):
    """Validation of a guard entry: ``TRUTH`` reads one element of each input, the other
    modes compare input 0 with input 1 element by element."""
    x, ref = e[E_IN0], e[E_IN1]
    (mode,) = validate.block(t, i, 0, 1, "the guard mode")
    if mode not in MODES:
        validate.fail(t, i, f"guard mode {mode}, expected one of {sorted(MODES)}")
    if mode == TRUTH:
        for k, b in enumerate((x, ref)):
            if validate.size(t, b) < 1:
                validate.fail(
                    t, i, f"a truth-value guard reads input {k} (buffer {b}), which is empty"
                )
    else:
        n = validate.size(t, x)
        validate.equal_sizes(
            t, i, "input 1 (the recorded value)", ref, n, "it is compared with input 0"
        )


def describe_failure(t, i, read, at):
    """The ``GuardError`` text of a failed guard: which value left the tape, what made it,
    and the recorded and the new value."""
    mode = int(t.ipool[t.entries[i, E_ATTR]])
    b = int(t.entries[i, E_IN0])
    now = np.asarray(read(b))
    was = np.asarray(read(int(t.entries[i, E_IN1])))
    return (
        f"guard at entry {i} ({MODES[mode]} of %{b}, made by {validate.producer(t, b, i)}) "
        f"recorded{at}: recorded {_short(was)}, now {_short(now)}. The recorded tape follows "
        "another path here; retrace (on_change='retrace'), or make the choice with tape.where"
    )


def _short(a):
    if a.size == 1:
        return f"{a.reshape(()).item():.17g}"
    return np.array2string(a.ravel(), threshold=6, precision=6)


GUARD = registry.structural(
    "guard", guard_fwd, None, module=__name__, n_inputs=2, differentiable=(False, False),
    check=check, gpu="guard", guard=True, describe_failure=describe_failure,
)  # fmt: skip
