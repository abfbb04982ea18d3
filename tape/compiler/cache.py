"""Where generated modules live: the source cache directory and module loading (each module
named by a hash of its text, compiled with Numba's ``cache=True``)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import types
from pathlib import Path

from tape.compiler.params import GENERATOR_VERSION
from tape.program.replay import CompileError

LOCK = threading.Lock()
MODULES: dict[str, types.ModuleType] = {}


# ---------------------------------------------------------------- cache and loading


def cache_dir() -> Path:
    """Where generated modules (and Numba's cache of them) live."""
    env = os.environ.get("TAPE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tape"


def module_name(source, prefix):
    """The name of the generated module ``source``: ``prefix`` and a hash of the text (and of
    the generator's version)."""
    key = hashlib.sha256(f"{GENERATOR_VERSION}\n{source}".encode()).hexdigest()[:24]
    return f"{prefix}_{key}"


def unit_module(source: str) -> types.ModuleType:
    """The unit module ``source`` (one fused loop, made by :meth:`Gen.unit_source`), loaded
    once per process and cached by Numba beside its file: every tape with this loop calls
    the same compiled function, in this process and the next."""
    return load_module(source, "tape_unit")


def load_module(source: str, prefix: str, extra=None) -> types.ModuleType:
    """The generated module ``source``, written to the cache directory under a name made of
    ``prefix`` and a hash of the text, and imported (once per process): Numba's cache of its
    functions lives beside it. ``extra``: globals to add (read when Numba compiles)."""
    name = module_name(source, prefix)
    with LOCK:
        mod = MODULES.get(name)
        if mod is not None:
            return mod
        path = write_source(name, source)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mod.__dict__.update(extra or {})  # custom ops' functions, read when Numba compiles
        mod.SOURCE = source
        MODULES[name] = mod
        return mod


def write_source(name, source) -> Path:
    """Write the module (atomically), unless the same module is there already."""
    for d in (cache_dir() / "compiled", Path(tempfile.gettempdir()) / f"tape-{os.getuid()}"):
        try:
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"{name}.py"
            if path.exists() and path.read_text() == source:
                return path  # unchanged: Numba's cache of it stays valid
            tmp = d / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(source)
            os.replace(tmp, path)
            return path
        except OSError:
            continue
    raise CompileError(f"no writable cache directory for compiled tapes (tried {cache_dir()})")
