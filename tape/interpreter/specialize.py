"""Specialises the loop templates of :mod:`tape.ops.loops` to one op's rules, as source text.

The elementwise loops take an op's scalar rules as arguments (``binary_rev(r0, r1, ...)``).
Numba can compile such a loop only by inlining it at its IR level (a rule passed as a run-time
value would make the caller uncacheable), and that inlining deep-copies the IR at every call
site: the reverse of one binary op took 5 s to compile, most of it in ``copy.deepcopy``. The
code generator instead writes, into each op's generated module, a copy of every loop the op
uses with the rule parameters replaced by the op's rule functions (module globals), and the
calls between templates replaced by calls to their specialised copies. The copies are
ordinary compiled functions: Numba types each once, LLVM inlines the rules.

:func:`written_out` writes a structural op's kernel function out whole in the same way, under
the kernel's name, so that the generated module holds it as one compiled function.

A template is a function of :mod:`tape.ops.loops` compiled with ``inline="always"``; an argument
is a rule when it names a rule of the caller (a rule parameter already bound, a global rule
function of the op's module, or a function of :mod:`tape.ops.loops` such as ``no_rule4``).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import types

from tape.ops import loops as _loops

JIT = "@compiled_only"
"""The decorator of a specialised copy: not cached by itself (the op's entry functions that
call it are, with it compiled in), and compiled without entries for calls from Python
(:func:`tape.layout.calls.compiled_only`). Copies without loops (one element's rule, masked)
too: LLVM inlines them into the loops that call them. Inlined in Numba's IR instead, each
call site was a copy of the function's IR, typed and lowered again: a binary op's reverse
kernel, whose broadcasting rows call one ten times, compiled in about a tenth more time."""
KERNEL = "@op_kernel"
"""The decorator of an op's kernels (its entry functions, ``_fwd_<op>`` and the others): cached,
and without entries for calls from Python (:func:`tape.layout.calls.op_kernel`): the
sweeps call them at their addresses, and Python through
:class:`tape.interpreter.dispatch.Kernel`."""


def _dispatcher(name):
    return getattr(_loops, name, None)


def _is_template(obj) -> bool:
    return hasattr(obj, "py_func") and obj.targetoptions.get("inline") == "always"


def _is_rule_value(obj) -> bool:
    return hasattr(obj, "py_func") and not _is_template(obj)


class Specializer:
    """Specialised copies of the templates for one op module. :meth:`call` turns a call text
    such as ``loops.binary_rev(mul_rev0, mul_rev1, True, True, i, ...)`` into a call of the
    specialised copy; :attr:`sources` holds every copy's text, callees first."""

    def __init__(self, rules):
        self.rules = set(rules)  # global rule names of the op's module
        self.sources: list[str] = []
        self.imports: set[str] = set()  # the tape.ops.loops names the copies use
        self._memo: dict = {}

    def call(self, text: str) -> str:
        """``text``: one call expression, at module level of the op's module."""
        node = ast.parse(text, mode="eval").body
        out = _Rewrite(self, {r: r for r in self.rules}, set(), top=True).visit(node)
        return ast.unparse(ast.fix_missing_locations(out))

    def entry(self, name, text, params, returns=None) -> str:
        """An entry function ``name(*params)``: the template that the call ``text`` (at module
        level, as for :meth:`call`) names, specialised to every argument of the call that is
        a rule or a constant, with the call's other arguments (names) as its variables, and
        ``return <returns>`` appended. Returns its source (decorated with :data:`KERNEL`)."""
        node = ast.parse(text, mode="eval").body
        top = _Rewrite(self, {r: r for r in self.rules}, set(), top=True)
        tname = top._callee(node.func)
        if tname is None:
            raise ValueError(f"{text!r} calls no template of tape.ops.loops")
        binding = {}
        for p, a in zip(inspect.signature(_dispatcher(tname).py_func).parameters, node.args):
            rule = top._rule_text(a)
            if rule is not None:
                binding[p] = rule
            elif isinstance(a, ast.Constant):
                binding[p] = repr(a.value)
            elif not (isinstance(a, ast.Name) and a.id == p and p in params):
                raise ValueError(
                    f"{text!r}: argument {ast.unparse(a)!r} is no rule, constant or parameter "
                    f"{p!r} of the entry"
                )
        return self._specialise(tname, binding, name, params, KERNEL, returns)

    def copy(self, name, binding) -> str:
        """The name of template ``name`` specialised with ``binding`` (param -> rule text)."""
        key = (name, tuple(sorted(binding.items())))
        got = self._memo.get(key)
        if got is not None:
            return got
        new = f"_{name.lstrip('_')}_{len(self._memo)}"
        self._memo[key] = new
        self.sources.append(self._specialise(name, binding, new))
        return new

    def _specialise(self, name, binding, new, params=None, decorator=None, returns=None) -> str:
        fn = _dispatcher(name).py_func
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        fdef = tree.body[0]
        fdef.decorator_list = []
        fdef.name = new
        names = [a.arg for a in fdef.args.args]
        if params is None:
            fdef.args.args = [a for a in fdef.args.args if a.arg not in binding]
            params = names
        else:
            fdef.args.args = [ast.arg(p) for p in params]
        stored = {
            n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        local = (set(names) - set(binding)) | set(params) | stored
        if returns is not None:
            if any(isinstance(n, ast.Return) for n in ast.walk(fdef)):
                raise ValueError(f"template {name} returns: it cannot end with a status")
            fdef.body.append(ast.parse(f"return {returns}").body[0])
        body = _Rewrite(self, binding, local, top=False).visit(fdef)
        text = ast.unparse(ast.fix_missing_locations(body))
        if decorator is None:
            decorator = JIT
        return f"{decorator}\n{text}\n"


class _Rewrite(ast.NodeTransformer):
    """Binds rule names, collects the :mod:`tape.ops.loops` globals a template's body reads (the
    op module imports them by name: Numba rejects ``loops.view``, taking it for ``ndarray.view``)
    and turns calls of templates into calls of specialised copies."""

    def __init__(self, spec, binding, local, top):
        self.spec = spec
        self.binding = binding
        self.local = local
        self.top = top

    def _callee(self, func):
        """The template a call's ``func`` names, or None."""
        if self.top:
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if func.value.id == "loops" and _is_template(_dispatcher(func.attr)):
                    return func.attr
            return None
        if isinstance(func, ast.Name) and func.id not in self.local:
            if func.id not in self.binding and _is_template(_dispatcher(func.id)):
                return func.id
        return None

    def _rule_text(self, arg):
        """The rule an argument passes, as text in the op module, or None."""
        if isinstance(arg, ast.Name) and arg.id in self.binding:
            return self.binding[arg.id]
        if isinstance(arg, ast.Name) and not self.top and arg.id not in self.local:
            if _is_rule_value(_dispatcher(arg.id)):
                return f"loops.{arg.id}"
        if self.top and isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
            if arg.value.id == "loops" and _is_rule_value(_dispatcher(arg.attr)):
                return f"loops.{arg.attr}"
        return None

    def visit_Call(self, node):
        name = self._callee(node.func)
        if name is None:
            return self.generic_visit(node)
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ValueError(f"template {name} is called with keywords or *args")
        params = inspect.signature(_dispatcher(name).py_func).parameters
        binding, rest = {}, []
        for p, a in zip(params, node.args):
            rule = self._rule_text(a)
            if rule is not None:
                binding[p] = rule
            else:
                rest.append(self.visit(a))
        if not binding:  # a template without rules (put_entry): call it where it is
            self.spec.imports.add(name)
            return ast.Call(func=ast.Name(name, ast.Load()), args=rest, keywords=[])
        new = self.spec.copy(name, binding)
        return ast.Call(func=ast.Name(new, ast.Load()), args=rest, keywords=[])

    # Constant flags (``sc0``, ``d1``: a parameter bound to ``True`` or ``False``) are folded
    # before the branches they decide are rewritten: a dead branch is dropped, so it neither
    # reaches Numba nor makes a specialised copy of the templates it calls.

    def visit_If(self, node):
        test = self.visit(node.test)
        if not isinstance(test, ast.Constant):
            node.test = test
            node.body = self._block(node.body)
            node.orelse = self._block(node.orelse) if node.orelse else []
            return node
        live = self._block(node.body if test.value else node.orelse)
        return live or [ast.Pass()]

    def _block(self, stmts):
        out = []
        for st in stmts:
            got = self.visit(st)
            out.extend(got if isinstance(got, list) else [got])
        return out or [ast.Pass()]

    def visit_IfExp(self, node):
        test = self.visit(node.test)
        if isinstance(test, ast.Constant):
            return self.visit(node.body if test.value else node.orelse)
        node.test, node.body, node.orelse = test, self.visit(node.body), self.visit(node.orelse)
        return node

    def visit_BoolOp(self, node):
        values = [self.visit(v) for v in node.values]
        # a leading constant decides or drops out (``True and x`` is ``x``)
        while len(values) > 1 and isinstance(values[0], ast.Constant):
            if bool(values[0].value) == isinstance(node.op, ast.Or):
                return values[0]
            values = values[1:]
        if len(values) == 1:
            return values[0]
        node.values = values
        return node

    def visit_UnaryOp(self, node):
        operand = self.visit(node.operand)
        if isinstance(node.op, ast.Not) and isinstance(operand, ast.Constant):
            return ast.Constant(not operand.value)
        node.operand = operand
        return node

    def visit_Name(self, node):
        if not isinstance(node.ctx, ast.Load) or self.top:
            return node
        if node.id in self.binding:
            return ast.parse(self.binding[node.id], mode="eval").body
        if node.id in self.local or node.id == "np" or hasattr(builtins, node.id):
            return node  # the op module imports numpy as np too
        if hasattr(_loops, node.id):
            self.spec.imports.add(node.id)
            return node
        raise NameError(f"tape.ops.loops template uses {node.id!r}, which it does not define")


_PLAIN_OPTIONS = {
    "boundscheck",
    "error_model",
    "no_cfunc_wrapper",
    "no_cpython_wrapper",
    "nogil",
    "nopython",
}
"""The options of a function that a written-out kernel compiles like (the kernels' own, which
differ in the cache only): one with others (``fastmath``) is called instead."""

_HEADER_NAMES = {"np": "numpy", "loops": "tape.ops.loops"}
"""Names an op module's header binds (module names), which a written-out kernel may share."""


def written_out(fn, name, params, status, names):
    """The source of op kernel ``name``: the compiled function ``fn`` of a structural op's
    module written out under that name (returns wrapped in ``np.int64`` where ``status``), so
    that the kernel is one compiled function, not a cached entry that calls a second one:
    Numba generated machine code for both, which cost the kernels of GMM's structural ops
    about a fifth of their compile (benchmarks/MEASURED.md). The globals it reads are added to
    ``names`` (imported from its module). ``None`` where it cannot be written out: a closure,
    other parameters or Numba options, or a global named as the generated module's own names."""
    py = getattr(fn, "py_func", None)
    if py is None or py.__code__.co_freevars or set(fn.targetoptions) - _PLAIN_OPTIONS:
        return None
    if fn.targetoptions.get("error_model") != "numpy" or fn.targetoptions.get("boundscheck"):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(py)))
    except (OSError, TypeError, SyntaxError):
        return None
    fdef = tree.body[0] if len(tree.body) == 1 else None
    a = fdef.args if isinstance(fdef, ast.FunctionDef) else None
    if a is None or [x.arg for x in a.args] != list(params) or a.vararg or a.kwarg or \
            a.kwonlyargs or a.defaults or a.posonlyargs:  # fmt: skip
        return None
    read, codes = set(), [py.__code__]
    while codes:  # the names its code (and any code nested in it) reads
        c = codes.pop()
        read |= set(c.co_names)
        codes += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    glb = py.__globals__
    need = sorted(n for n in read if n in glb)
    for n in need:  # names the generated module binds itself
        if n.startswith(("_fwd_", "_rev_", "_tan_", "_hrev_")) or n in (
            "compiled_only",
            "op_kernel",
        ):
            return None
        if n in _HEADER_NAMES and getattr(glb[n], "__name__", None) != _HEADER_NAMES[n]:
            return None
    fdef.decorator_list, fdef.name = [], name

    class _Status(ast.NodeTransformer):
        def visit_Return(self, node):  # every status as int64: the kernels' signature
            if node.value is not None:
                node.value = ast.Call(ast.Attribute(ast.Name("np", ast.Load()), "int64",
                                                    ast.Load()), [node.value], [])  # fmt: skip
            return node

        def visit_FunctionDef(self, node):  # (a nested function keeps its returns)
            return node if node is not fdef else self.generic_visit(node)

    if status:
        _Status().visit(fdef)
    names += [n for n in need if n not in _HEADER_NAMES]
    return f"{KERNEL}\n{ast.unparse(ast.fix_missing_locations(fdef))}\n"
