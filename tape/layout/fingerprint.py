"""Fingerprints of the sources compiled into the interpreter's generated modules (see
:mod:`tape.interpreter.codegen`), and the write-or-check step both code generators (CPU and GPU) share.

Numba's cache is keyed on the cached function's own file, so a generated module must change
whenever anything it compiles in changes. An op's module covers the shared compiled helpers
(:data:`INFRA`) and the op's own rules followed through what they call: the rule functions'
source, the functions and compiled kernels they name (recursively), the values of the
constants they read, and whole files for the modules they reach through an attribute. Editing
one rule changes that op's fingerprint alone.
"""

import hashlib
import inspect
import sys
import types
from pathlib import Path

PKG = Path(__file__).resolve().parents[1]  # tape/

INFRA = [
    "layout/columns.py", "layout/config.py", "ops/masked.py", "ops/blocks/broadcast.py",
    "ops/loops.py", "ops/vmath.py", "ops/blas.py",
]  # fmt: skip
"""Modules every op module compiles in (the loops and their helpers). The generators are not
among them: what they change shows in the generated text itself."""

SWEEP_SOURCES = ["layout/columns.py", "layout/config.py", "interpreter/dispatch.py"]
"""Modules the op-agnostic sweeps and drivers compile in (their text is the generated file's):
no op's."""


def _hash_files(h, names):
    for name in names:
        f = PKG / name
        h.update(name.encode())
        h.update(f.read_bytes())


def sweeps_fingerprint() -> str:
    """The fingerprint of ``tape/interpreter/generated/sweeps.py``."""
    h = hashlib.sha256()
    _hash_files(h, SWEEP_SOURCES)
    return h.hexdigest()


def op_fingerprint(op) -> str:
    """The fingerprint of op ``op``'s generated module: :data:`INFRA` and the closure of its
    rules (see the module docstring)."""
    h = hashlib.sha256()
    _hash_files(h, INFRA)
    seen = set()
    rules = [op.fwd, *op.rev, *op.hess]
    if op.kind == "structural":
        rules += [op.jvp, op.hvp]
    for r in rules:
        _closure(r, h, seen)
    return h.hexdigest()


def _code_names(code):
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _code_names(c)


def _closure(obj, h, seen):
    f = getattr(obj, "py_func", obj)
    if not isinstance(f, types.FunctionType):
        if obj is not None and not isinstance(obj, str):
            _other(obj, h, seen)
        return
    if f in seen:
        return
    seen.add(f)
    try:
        h.update(inspect.getsource(f).encode())
    except (OSError, TypeError):  # no source file: the compiled bytecode stands in
        h.update(f.__code__.co_code)
    h.update(repr(f.__defaults__).encode())
    for cell in f.__closure__ or ():
        try:
            _value(cell.cell_contents, h, seen)
        except ValueError:  # an empty cell
            pass
    g = f.__globals__
    for name in sorted(set(_code_names(f.__code__))):
        if name in g:
            h.update(name.encode())
            _value(g[name], h, seen)


def _value(v, h, seen):
    if isinstance(v, (bool, int, float, complex, str, bytes, type(None))):
        h.update(repr(v).encode())
    elif isinstance(v, tuple) and all(isinstance(x, (bool, int, float, str)) for x in v):
        h.update(repr(v).encode())
    elif hasattr(v, "tobytes") and hasattr(v, "dtype"):  # a NumPy array or scalar
        h.update(str(getattr(v, "dtype", "")).encode())
        h.update(v.tobytes())
    elif isinstance(v, types.ModuleType):
        _module_file(v, h, seen)
    else:
        _closure(v, h, seen)


def _other(obj, h, seen):
    # something compiled in that is neither a function nor a dispatcher (an intrinsic, an
    # overload): its module's whole file
    mod = sys.modules.get(getattr(obj, "__module__", "") or "")
    if mod is not None:
        _module_file(mod, h, seen)


def _module_file(mod, h, seen):
    if not mod.__name__.startswith("tape") or mod in seen:
        return  # NumPy, math, numba: the installed versions are Numba's own cache key
    seen.add(mod)
    path = getattr(mod, "__file__", None)
    if path:
        h.update(mod.__name__.encode())
        h.update(Path(path).read_bytes())


def write_or_check(target: Path, text: str, argv, command: str, what: str, quiet=False) -> int:
    """``--check`` in ``argv``: exit status 1 if ``target`` differs from ``text``; otherwise
    write ``target`` (creating its package folder)."""
    if "--check" in argv:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is stale: run `{command}`", file=sys.stderr)
            return 1
        if not quiet:
            print(f"{what} are up to date")
        return 0
    target.parent.mkdir(exist_ok=True)
    init = target.parent / "__init__.py"
    if not init.exists():
        init.write_text("")
    if target.exists() and target.read_text() == text:
        return 0  # unchanged: keep its stamp (Numba's cache of it stays valid)
    target.write_text(text)
    print(f"wrote {target}")
    return 0
