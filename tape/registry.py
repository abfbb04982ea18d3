"""The op registry: the instruction set of the tape.

Every op is one :class:`Op` record. Op codes are assigned in registration order (the order of the
modules imported by :mod:`tape.ops`), and the code generator (:mod:`tape._codegen`) turns the
registry into the compiled forward and reverse sweeps. Tests iterate the registry, so a new op
is picked up by them without further changes.

Kinds of op:

``unary``, ``binary``, ``ternary``
    Elementwise, with NumPy broadcasting for two and three inputs. ``fwd`` is a scalar rule
    ``fwd(x0[, x1[, x2]]) -> y``; ``rev[k]`` is a scalar rule ``rev_k(x0[, x1[, x2]], y, gy)``
    returning the contribution to the adjoint of input ``k`` (``None``: input ``k`` is not
    differentiable). The sweep accumulates; rules never do.
``kernel``
    Structural ops (reductions, movement, linear algebra, gather). ``fwd`` is a compiled
    ``fwd(i, entries, bufs, ipool, data) -> status`` and ``rev[0]`` a compiled
    ``rev(i, entries, bufs, ipool, data, grad)``; both read the entry's attribute block in the
    integer pool. ``status`` is ``-1`` on success, or ``i`` when the entry found bad data (an
    out-of-range gather index) and the sweep must stop.

Every op also has a ``check(t, i, entry)``: a plain Python function that raises ``ValueError``
unless entry ``i`` of tape ``t`` (its attribute block, its buffers' sizes) keeps the op's
kernels inside their buffers. :func:`tape._validate.check_tape` runs it on tapes that come from
files or pickles, after checking every buffer index, so the check may index ``t.bufs`` with the
entry's buffers. Elementwise kinds share the checks in :mod:`tape._validate` (which see only
the block and the sizes); a kernel op must bring its own, written from its kernels' code.

This module imports no Numba.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

ELEMENTWISE_ARITY = {"unary": 1, "binary": 2, "ternary": 3}


@dataclass
class Op:
    """One instruction of the tape.

    Attributes
    ----------
    name : str
        NumPy-style name (``exp``, ``maximum``, ``sum``).
    kind : str
        ``unary``, ``binary``, ``ternary`` or ``kernel``.
    fwd : callable
        Forward rule (scalar for elementwise kinds, entry kernel for ``kernel``).
    rev : tuple
        Reverse rules, one per input for elementwise kinds (``None`` where not differentiable);
        one entry kernel for ``kernel``.
    ref : callable or None
        NumPy reference of the forward rule, used by the tests.
    domain : tuple of float
        Interval the tests sample inputs from (away from kinks and poles).
    differentiable : tuple of bool
        Which inputs carry gradients.
    module : str
        Module that defined the op (for the code generator's imports).
    code : int
        Op code, assigned at registration.
    check : callable or None
        ``check(t, i, entry)``: raises ``ValueError`` unless entry ``i`` of tape ``t`` keeps
        this op's kernels inside their buffers (see the module docstring).
    """

    name: str
    kind: str
    fwd: Callable
    rev: tuple
    ref: Callable | None = None
    domain: tuple = (-2.0, 2.0)
    differentiable: tuple = ()
    module: str = ""
    fwd_name: str = ""
    rev_names: tuple = ()
    doc: str = ""
    code: int = -1
    extra: dict = field(default_factory=dict)
    check: Callable | None = None

    @property
    def arity(self) -> int:
        return ELEMENTWISE_ARITY.get(self.kind, 0)


OPS: list[Op] = []
BY_NAME: dict[str, Op] = {}


def _register(op: Op) -> Op:
    if op.name in BY_NAME:
        raise ValueError(f"op {op.name!r} is registered twice")
    op.code = len(OPS)
    OPS.append(op)
    BY_NAME[op.name] = op
    return op


def elementwise(
    kind, name, fwd, *rev, ref=None, domain=(-2.0, 2.0), doc="", module="", names=None, check=None
):
    """Register an elementwise op from its scalar rules.

    ``names`` gives the attribute names under which ``module`` holds the rules (the code
    generator imports them from there); by default ``<name>_fwd`` and ``<name>_rev<k>``.
    ``check`` (validation of the op's entries in loaded tapes) defaults to the shared check of
    ``kind`` in :data:`tape._validate.ELEMENTWISE_CHECKS`.
    """
    n = ELEMENTWISE_ARITY[kind]
    if check is None:
        from tape._validate import ELEMENTWISE_CHECKS  # no cycle: it imports this module lazily

        check = ELEMENTWISE_CHECKS[kind]
    if len(rev) != n:
        raise ValueError(f"{name}: {kind} op needs {n} reverse rules (None where not differentiable)")
    fwd_name = f"{name}_fwd"
    rev_names = tuple(None if r is None else f"{name}_rev{k}" for k, r in enumerate(rev))
    return _register(
        Op(
            name=name,
            kind=kind,
            fwd=fwd,
            rev=tuple(rev),
            ref=ref,
            domain=domain,
            differentiable=tuple(r is not None for r in rev),
            module=module,
            fwd_name=fwd_name,
            rev_names=rev_names,
            doc=doc,
            check=check,
        )
    )


def kernel(name, fwd, rev, *, module, n_inputs, differentiable, check=None, doc=""):
    """Register a structural op from its compiled entry kernels (``rev`` may be ``None``) and
    ``check``, the validation of its entries (see the module docstring; a tape using a kernel
    op without one cannot be loaded, and the tests fail)."""
    return _register(
        Op(
            name=name,
            kind="kernel",
            fwd=fwd,
            rev=(rev,),
            differentiable=tuple(differentiable),
            module=module,
            fwd_name=fwd.__name__ if hasattr(fwd, "__name__") else fwd.py_func.__name__,
            rev_names=(None if rev is None else rev.py_func.__name__,),
            doc=doc,
            extra={"n_inputs": n_inputs},
            check=check,
        )
    )
