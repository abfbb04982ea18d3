"""The op registry: the instruction set of the tape.

Every op is one :class:`Op` record, and the record is the only place an op is described: its
rules, its result dtype, the ``Tensor`` operators and method it provides, how a failed status
reads, its GPU kernel, and how the tests sample its inputs. Op codes are assigned in
registration order (the order of the modules imported by :mod:`tape.ops`), and the code
generator (:mod:`tape.interpreter.codegen`) turns the registry into the compiled forward and reverse
sweeps. Tests iterate the registry, so a new op is picked up by them without further changes;
:func:`missing_facts` says what a record lacks (a test runs it on every op).

Kinds of op:

``unary``, ``binary``, ``ternary``
    Elementwise, with NumPy broadcasting for two and three inputs. ``fwd`` is a scalar rule
    ``fwd(x0[, x1[, x2]]) -> y``; ``rev[k]`` is a scalar rule ``rev_k(x0[, x1[, x2]], y, gy)``
    returning the contribution to the adjoint of input ``k`` (``None``: input ``k`` is not
    differentiable). The sweep accumulates; rules never do.
    ``hess`` holds the second partials ``h(x0[, x1], y)`` (upper triangle, row by row: ``(h00,)``
    or ``(h00, h01, h11)``; ``None`` where identically zero), which the forward-over-reverse
    sweep needs. The tangent (forward-mode) rule is not written separately: a scalar partial
    is its own transpose, so ``tangent = sum_k rev_k(x, y, t_k)`` (:mod:`tape.ops.loops`).
    Ternary ops are piecewise linear (``where``, ``clip``): they take no ``hess``.
``structural``
    Structural ops (reductions, movement, linear algebra, gather). ``fwd`` is a compiled
    ``fwd(i, entries, bufs, ipool, data) -> status`` and ``rev[0]`` a compiled
    ``rev(i, entries, bufs, ipool, data, grad)``; both read the entry's attribute block in the
    integer pool. ``status`` is ``-1`` on success, or ``i`` when the entry found bad data (an
    out-of-range gather index) and the sweep must stop. A differentiable structural op also has
    ``jvp(i, entries, bufs, ipool, data, T)`` (writes the output's tangents into the tangent
    arenas ``T``, one row per direction), ``hvp(i, entries, bufs, ipool, data, grad, T, GT)``
    (adds the tangent of its reverse rule into the tangent adjoints ``GT``), either of which
    may be :data:`LINEAR`, and
    ``sparsity(t, i, data)`` (which input elements each output element depends on, and which pairs
    of input elements interact nonlinearly: see :class:`Op`).

Every op also has a ``check(t, i, entry)``: a plain Python function that raises ``ValueError``
unless entry ``i`` of tape ``t`` (its attribute block, its buffers' sizes) keeps the op's
kernels inside their buffers. :func:`tape.ops.validate.check_tape` runs it on tapes that come from
files or pickles, after checking every buffer index, so the check may index ``t.bufs`` with the
entry's buffers. Elementwise kinds share the checks in :mod:`tape.ops.validate` (which see only
the block and the sizes); a structural op must bring its own, written from its kernels' code.

This module imports no Numba.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

ELEMENTWISE_ARITY = {"unary": 1, "binary": 2, "ternary": 3}

LINEAR = "linear"
"""A structural op's ``jvp`` / ``hvp`` that is its own kernel run on tangents: ``jvp`` = the
forward kernel run on the tangent arena (the op is linear and reads no values but its
differentiable inputs); ``hvp`` = the reverse kernel run with the tangent adjoints as its
adjoints (the reverse rule is linear in the output adjoint and has no second partials)."""

HESS_LEN = {"unary": 1, "binary": 3, "ternary": 0}

DTYPE_RULES = ("promote", "bool", "float")
"""Result dtype rules (:attr:`Op.dtype`); ``("like", positions)`` is the fourth."""


@dataclass(eq=False)
class Op:
    """One instruction of the tape.

    Attributes
    ----------
    name : str
        NumPy-style name (``exp``, ``maximum``, ``sum``).
    kind : str
        ``unary``, ``binary``, ``ternary`` or ``structural``.
    fwd : callable
        Forward rule (scalar for elementwise kinds, entry kernel for ``structural``).
    rev : tuple
        Reverse rules, one per input for elementwise kinds (``None`` where not differentiable);
        one entry kernel for ``structural``.
    n_inputs : int
        Inputs one entry reads (the arity for elementwise kinds).
    differentiable : tuple of bool
        Which inputs carry gradients.
    ref : callable or None
        NumPy reference of the forward rule, used by the tests.
    dtype : str or tuple
        The result dtype, from the dtype of the inputs (:func:`tape.frontend.tensor.result_dtype`):
        ``"promote"`` (the widest float tensor; integers give int64), ``"float"`` (the same,
        but integers give float64: true division), ``"bool"`` (comparisons), or
        ``("like", positions)``: promote over the inputs at ``positions`` only (``where``
        takes its dtype from the two branches, ``clip`` from ``x``).
    operators, reflected : tuple of str
        ``Tensor`` operators that record this op: ``operators`` with the tensor as the first
        argument (``__add__``, ``__lt__``, ``__neg__``), ``reflected`` with the tensor as the
        second (``__radd__``).
    method : bool
        The front-end function ``tape.<name>`` is also a ``Tensor`` method.
    guard : bool
        The op is a guard: a failed status there means the replay takes another path
        (:func:`tape.program.replay.is_guard`), raised as ``GuardError``.
    describe_failure : callable or None
        ``describe_failure(t, i, read, at) -> str or None``: what the data that made entry
        ``i`` of ``t`` stop a sweep was (``read(b)`` gives buffer ``b``'s values in the arena
        the sweep ran on; ``at`` is `` at file:line`` of the recording, or empty). None, or
        no description: "entry i (name) rejected its input data".
    error : type
        The exception class raised (eagerly, or by a replay) when an entry of this op rejects
        its data: ``IndexError`` (a gather index) unless the record says otherwise
        (``numpy.linalg.LinAlgError`` for a singular matrix).
    gpu : str or None
        Structural ops: the key of the op's GPU kernel in
        :data:`tape.gpu._kernels.GPU_KERNELS`, resolved only by the CUDA code (this module
        never imports it). An op with ``lanes`` needs none: its key is its name.
    lanes : tuple or None
        Structural ops over the ``(outer, n, inner)`` view of the scan block
        (:mod:`tape.ops.blocks.scan`) whose rows are independent: ``(fwd, rev)``, the op's
        element loops (``rev`` None without a reverse rule), written once for both targets
        (see :mod:`tape.ops.scan`). The CPU kernels call them on ``inner`` adjacent rows at a
        time; the GPU compiles them as device functions and runs one row per thread
        (:func:`tape.gpu._scan_kernels.lanes_kernel`), so the op has no GPU code of its own.
    check : callable or None
        ``check(t, i, entry)``: raises ``ValueError`` unless entry ``i`` of tape ``t`` keeps
        this op's kernels inside their buffers (see the module docstring).
    domain : tuple
        Test sampling: the interval ``(lo, hi)`` inputs are drawn from (away from poles).
    domains : tuple or None
        Test sampling: one interval per input, where they differ (``clip``'s bounds).
    masks : tuple of int
        Test sampling: inputs drawn as 0.0 / 1.0 (conditions).
    kinks : tuple of tuple
        Test sampling: coefficients ``c`` of the places ``sum(c[k] * x[k]) == 0`` where the
        derivative jumps (``abs``: ``(1,)``; ``maximum``: ``(1, -1)``); finite differences
        stay away from them.
    tol : tuple
        ``(rtol, atol)`` of forward values against ``ref`` and across backends.
    fd_tol : tuple
        ``(rtol, atol)`` of gradients against central finite differences.
    exact_ref : bool
        Elementwise ops whose NumPy reference gives the kernel's bits (IEEE basic operations,
        correctly rounded in both): eager mode computes values that need no gradient with it,
        without a compiled call.
    hess : tuple
        Elementwise ops: second partials ``h(x0[, x1], y)``, upper triangle row by row
        (``(h00,)`` unary, ``(h00, h01, h11)`` binary), ``None`` where identically zero.
    jvp, hvp : callable, LINEAR or None
        Structural ops: the tangent kernel and the tangent of the reverse kernel (see the module
        docstring); ``None`` only for ops without differentiable inputs.
    sparsity : callable or None
        Structural ops: ``sparsity(t, i, data) -> (deps, pairs)`` for entry ``i`` of tape ``t`` with values
        ``data`` (a value arena).
        ``deps``: ``[(k, out_elems, in_elems)]``, output element ``out_elems[j]`` depends on
        element ``in_elems[j]`` of input ``k``; or ``(k, (F1, F2, ...))``, the dependency
        matrix of input ``k`` as a product of 0/1 factors ``F = (rows, cols, shape)`` (for
        ops whose element pairs would be many more than their elements, as matmul's). ``pairs``: ``[(k, groups_k, elems_k, l,
        groups_l, elems_l)]``, elements of inputs ``k`` and ``l`` in the same group interact
        nonlinearly (a nonzero second partial). Used by :mod:`tape.sparse`.
    cheap : bool
        Elementwise ops whose value a fused reverse loop of the compiled tier recomputes from
        the inputs rather than storing it in the forward loop (the arithmetic costs less than
        a load). Implies ``vectorises``.
    vectorises : bool
        Elementwise ops whose rules are arithmetic that LLVM vectorises: a fused reverse loop
        of such ops runs in blocks (:mod:`tape.compiled`).
    classes : tuple
        Structural ops: ``((cls, fwd, rev), ...)``, entry kernels for entries of one class
        (:func:`tape.interpreter.dispatch.entry_class`) only, which compile in less time than
        the general ones (``sum`` of a whole input: the class whose output has one element).
        Elementwise binary ops get theirs from :data:`tape.ops.loops.BINARY_CLASSES`.
    may_stop : bool
        Structural ops: an entry's forward kernel may reject its data and stop the sweep (a guard,
        a gather index, a singular matrix). ``False`` lets the compiled tier move a fused loop
        past the entry. Elementwise ops never stop.
    module : str
        Module that defined the op (for the code generator's imports).
    code : int
        Op code, assigned at registration.
    """

    name: str
    kind: str
    fwd: Callable
    rev: tuple
    n_inputs: int = 0
    differentiable: tuple = ()
    ref: Callable | None = None
    dtype: str | tuple = "promote"
    operators: tuple = ()
    reflected: tuple = ()
    method: bool = False
    guard: bool = False
    describe_failure: Callable | None = None
    error: type = IndexError
    gpu: str | None = None
    lanes: tuple | None = None
    check: Callable | None = None
    domain: tuple = (-2.0, 2.0)
    domains: tuple | None = None
    masks: tuple = ()
    kinks: tuple = ()
    tol: tuple = (1e-12, 1e-12)
    fd_tol: tuple = (1e-3, 1e-5)
    exact_ref: bool = False
    hess: tuple = ()
    jvp: Callable | str | None = None
    hvp: Callable | str | None = None
    sparsity: Callable | None = None
    cheap: bool = False
    vectorises: bool = False
    classes: tuple = ()
    may_stop: bool = True
    module: str = ""
    fwd_name: str = ""
    rev_names: tuple = ()
    doc: str = ""
    code: int = -1

    @property
    def arity(self) -> int:
        return ELEMENTWISE_ARITY.get(self.kind, 0)

    def domain_of(self, k):
        """The sampling interval of input ``k``."""
        return self.domain if self.domains is None else self.domains[k]


OPS: list[Op] = []
BY_NAME: dict[str, Op] = {}


def _register(op: Op) -> Op:
    if op.name in BY_NAME:
        raise ValueError(f"op {op.name!r} is registered twice")
    op.code = len(OPS)
    OPS.append(op)
    BY_NAME[op.name] = op
    return op


def elementwise(kind, name, fwd, *rev, module="", names=None, check=None, hess=None, **facts):
    """Register an elementwise op from its scalar rules.

    ``facts`` are the record's other fields (``ref``, ``dtype``, ``operators``, ``method``,
    ``domain``, ...: see :class:`Op`). The code generator imports the rules from ``module``
    as ``<name>_fwd`` and ``<name>_rev<k>``. ``check`` (validation of the op's entries in
    loaded tapes) defaults to the shared check of ``kind`` in
    :data:`tape.ops.validate.ELEMENTWISE_CHECKS`.
    """
    n = ELEMENTWISE_ARITY[kind]
    if check is None:
        from tape.ops.validate import ELEMENTWISE_CHECKS  # no cycle: it imports this module lazily

        check = ELEMENTWISE_CHECKS[kind]
    if len(rev) != n:
        raise ValueError(
            f"{name}: {kind} op needs {n} reverse rules (None where not differentiable)"
        )
    hess = (None,) * HESS_LEN[kind] if hess is None else tuple(hess)
    if len(hess) != HESS_LEN[kind]:
        raise ValueError(
            f"{name}: a {kind} op has {HESS_LEN[kind]} second partials (hess=), got {len(hess)}"
        )
    fwd_name = f"{name}_fwd"
    rev_names = tuple(None if r is None else f"{name}_rev{k}" for k, r in enumerate(rev))
    return _register(
        Op(
            name=name,
            kind=kind,
            fwd=fwd,
            rev=tuple(rev),
            n_inputs=n,
            differentiable=tuple(r is not None for r in rev),
            module=module,
            fwd_name=fwd_name,
            rev_names=rev_names,
            check=check,
            hess=hess,
            may_stop=False,
            **dict(facts, vectorises=facts.get("vectorises", False) or facts.get("cheap", False)),
        )
    )


def structural(name, fwd, rev, *, module, n_inputs, differentiable, check=None, gpu=None, jvp=None,
           hvp=None, sparsity=None, **facts):  # fmt: skip
    """Register a structural op from its compiled entry kernels (``rev`` may be ``None``),
    ``check``, the validation of its entries (see the module docstring; a tape using a kernel
    op without one cannot be loaded, and the tests fail), and ``gpu``, the key of its GPU
    kernel (the CUDA code generator fails without one), ``jvp``, ``hvp`` and ``sparsity``
    (derivatives beyond the first and sparsity patterns; required when an input is
    differentiable). ``facts``: the record's other
    fields (see :class:`Op`); with ``lanes`` (the op's element loops, see :class:`Op`) the GPU
    kernel is built from them and ``gpu`` defaults to the op's name."""
    if facts.get("lanes") is not None and gpu is None:
        gpu = name
    return _register(
        Op(
            name=name,
            kind="structural",
            fwd=fwd,
            rev=(rev,),
            n_inputs=n_inputs,
            differentiable=tuple(differentiable),
            module=module,
            fwd_name=fwd.__name__ if hasattr(fwd, "__name__") else fwd.py_func.__name__,
            rev_names=(None if rev is None else rev.py_func.__name__,),
            check=check,
            gpu=gpu,
            jvp=jvp,
            hvp=hvp,
            sparsity=sparsity,
            **facts,
        )
    )


def _interval(d):
    return (
        isinstance(d, tuple)
        and len(d) == 2
        and all(isinstance(v, (int, float)) for v in d)
        and d[0] < d[1]
    )


def missing_facts(op: Op) -> list[str]:
    """What ``op``'s record lacks or gets wrong, as sentences (empty: nothing). The tests run
    it on every registered op."""
    out = []
    n = op.n_inputs
    if op.kind not in ELEMENTWISE_ARITY and op.kind != "structural":
        out.append(f"kind {op.kind!r} is not unary, binary, ternary or structural")
    if not callable(op.fwd):
        out.append("no forward rule")
    if len(op.differentiable) != n:
        out.append(f"differentiable has {len(op.differentiable)} flags for {n} inputs")
    if not callable(op.check):
        out.append("no check (validation of its entries in loaded tapes)")
    rule = op.dtype
    like = isinstance(rule, tuple) and len(rule) == 2 and rule[0] == "like"
    if like:
        if not rule[1] or not all(isinstance(k, int) and 0 <= k < n for k in rule[1]):
            out.append(f"dtype rule {rule!r} names inputs outside 0..{n - 1}")
    elif rule not in DTYPE_RULES:
        out.append(f"dtype rule {rule!r} is none of {DTYPE_RULES} or ('like', positions)")
    for d in op.operators + op.reflected:
        if not (isinstance(d, str) and d.startswith("__") and d.endswith("__")):
            out.append(f"operator {d!r} is not a dunder name")
    if op.reflected and n != 2:
        out.append("reflected operators need two inputs")
    if op.guard and not callable(op.describe_failure):
        out.append("a guard needs describe_failure (the GuardError's text)")
    if op.describe_failure is not None and not callable(op.describe_failure):
        out.append("describe_failure is not callable")
    if not (isinstance(op.error, type) and issubclass(op.error, Exception)):
        out.append(f"error {op.error!r} is not an exception class")
    if op.kind == "structural":
        if len(op.rev) != 1:
            out.append("a structural op has one reverse kernel (or None)")
        if any(op.differentiable) and op.rev[0] is None:
            out.append("differentiable inputs but no reverse kernel")
        if not (isinstance(op.gpu, str) and op.gpu):
            out.append("no GPU kernel (gpu=: its key in tape.gpu._kernels.GPU_KERNELS)")
        if any(op.differentiable):
            for what in ("jvp", "hvp"):
                rule = getattr(op, what)
                if not (callable(rule) or rule == LINEAR):
                    out.append(f"no {what} kernel (a compiled kernel or registry.LINEAR)")
            if not callable(op.sparsity):
                out.append("no sparsity rule (sparsity=)")
        return out
    if len(op.hess) != HESS_LEN[op.kind]:
        out.append(f"{len(op.hess)} second partials (hess) for a {op.kind} op")
    if any(h is not None and not callable(h) for h in op.hess):
        out.append("a second partial (hess) is not callable")
    if len(op.rev) != n:
        out.append(f"{len(op.rev)} reverse rules for {n} inputs")
    if op.ref is None:
        out.append("no NumPy reference (ref=) for the tests")
    if not _interval(op.domain):
        out.append(f"domain {op.domain!r} is not an interval (lo, hi) with lo < hi")
    if op.domains is not None and (
        len(op.domains) != n or not all(_interval(d) for d in op.domains)
    ):
        out.append(f"domains {op.domains!r} are not {n} intervals (lo, hi), one per input")
    if not all(isinstance(k, int) and 0 <= k < n for k in op.masks):
        out.append(f"masks {op.masks!r} name inputs outside 0..{n - 1}")
    for c in op.kinks:
        if len(c) != n or not any(c):
            out.append(f"kink {c!r} needs {n} coefficients, not all zero")
    for what, tol in (("tol", op.tol), ("fd_tol", op.fd_tol)):
        if len(tol) != 2 or not all(isinstance(v, float) and v >= 0 for v in tol):
            out.append(f"{what} {tol!r} is not (rtol, atol)")
    return out
