"""The package's layers: each module imports only from its own layer and the layers below.

The layers, bottom up (``ARCHITECTURE.md`` describes them):

| layer | what it holds |
|---|---|
| layout | entry and buffer columns, buffer kinds, options, fingerprints |
| ops | the instruction set: op records (``registry``), the op families' kernels and loops, validation of entries |
| interpreter | the generated dispatch, sweeps and drivers, and their code generator |
| program | the Wengert list without tensors: ``Tape``, replay, signatures and errors, callbacks, persistence, printing |
| compiler | the compiled tier |
| transforms | derivatives beyond the gradient, sparsity, batched replay |
| gpu | device replay |
| frontend | ``Tensor``, recording, the NumPy/PyTorch-style functions, ``autograd``, custom ops, checkpoints, ``nn``, ``optim``, distributed |
| app | the package's namespace, the demo, the benchmark problems |

Every import counts, also one inside a function (a deferred import is still a dependency).
A module of ``tape/`` that no layer names fails the test: place a new module in a layer.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tape"

LAYERS = [
    ("layout", r"tape\._layout|tape\._config|tape\._source|tape\._fingerprint"),
    (
        "ops",
        r"tape\.registry|tape\.ops(\..+)?|tape\._loops|tape\._vmath|tape\._blas|tape\._masked"
        r"|tape\._validate",
    ),
    (
        "interpreter",
        r"tape\._dispatch|tape\._warm|tape\._codegen|tape\._specialize|tape\._drivers"
        r"|tape\._generated(\..+)?",
    ),
    (
        "program",
        r"tape\.core|tape\._replay|tape\._callbacks|tape\._format|tape\._anomaly|tape\._dot"
        r"|tape\.kernels",
    ),
    ("compiler", r"tape\.compiled"),
    ("transforms", r"tape\.derivatives|tape\.sparse|tape\.batch"),
    ("gpu", r"tape\.cuda(\..+)?"),
    (
        "frontend",
        r"tape\._tensor|tape\._front(\..+)?|tape\.functional|tape\.autograd|tape\.custom"
        r"|tape\.checkpoint|tape\.distributed|tape\.nn(\..+)?|tape\.optim|tape\.record"
        r"|tape\.linalg|tape\.transforms|tape\.testing|tape\.optimize",
    ),
    ("app", r"tape|tape\.__main__|tape\.bench(\..+)?"),
]


def layer_of(module):
    """The index of ``module``'s layer in :data:`LAYERS`, or ``None``."""
    for k, (_, pattern) in enumerate(LAYERS):
        if re.fullmatch(pattern, module):
            return k
    return None


def modules():
    """``{module name: path}`` of the package's source files."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name, source, known):
    """The package modules that ``source`` (module ``name``) imports, anywhere in it."""
    package = name if known.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # ``from tape import registry`` imports the submodule
            targets = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            targets.append(mod)
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target not in (name, "tape"):
                found.add(target)
    return found


def upward(name, source, known):
    """``(imported module, its layer)`` for each import of ``source`` (module ``name``) that
    goes up a layer."""
    here = layer_of(name)
    return sorted(
        (m, LAYERS[layer_of(m)][0])
        for m in imports(name, source, known)
        if layer_of(m) is not None and layer_of(m) > here
    )


KNOWN = modules()


def test_every_module_is_in_a_layer():
    missing = [m for m in KNOWN if layer_of(m) is None]
    assert not missing, f"place these modules in a layer of tests/test_layers.py: {missing}"


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_no_module_imports_from_a_layer_above_its_own(name):
    bad = upward(name, KNOWN[name].read_text(), KNOWN)
    here = LAYERS[layer_of(name)][0]
    assert not bad, f"{name} ({here} layer) imports from above it: {bad}"


def test_an_upward_import_fails_the_check():
    # the check itself: the tape's core importing the tensor front end, at module level or
    # inside a function, is caught; an import from below is not
    for source in (
        "from tape._tensor import Tensor\n",
        "def f():\n    from tape import _tensor\n    return _tensor\n",
        "import tape.autograd\n",
    ):
        assert upward("tape.core", source, KNOWN), source
    assert not upward("tape.core", "from tape import registry, _layout\n", KNOWN)
