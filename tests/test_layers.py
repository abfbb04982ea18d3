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
A module of ``tape/`` that no layer names fails the test: place a new module in a layer. The
package's public module names (``tape.nn``, ``tape.core``: :mod:`tape._aliases`) are for
users; a module of the package that imports through one fails too, so that every dependency
shows where it goes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tape import _aliases

ROOT = Path(__file__).resolve().parents[1] / "tape"

LAYERS = [
    ("layout", r"tape\.layout(\..+)?"),
    ("ops", r"tape\.ops(\..+)?"),
    ("interpreter", r"tape\.interpreter(\..+)?"),
    ("program", r"tape\.program(\..+)?"),
    ("compiler", r"tape\.compiler(\..+)?"),
    ("transforms", r"tape\.transforms(\..+)?"),
    ("gpu", r"tape\.gpu(\..+)?"),
    ("frontend", r"tape\.frontend(\..+)?"),
    ("app", r"tape|tape\._aliases|tape\.__main__|tape\.bench(\..+)?"),
]
"""Each layer is a folder of ``tape/`` (the app layer: the package's namespace, its public
module names, the demo and the benchmark problems)."""


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


_GENERATED_IMPORT = re.compile(r"(?m)^\s*(?:from|import)\s+(tape(?:\.\w+)*)")


def imports(name, source, known):
    """The package modules that ``source`` (module ``name``) imports, anywhere in it: also
    the imports written into code it generates (``"from tape.x import y"`` in a string)."""
    package = name if known.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            targets = _GENERATED_IMPORT.findall(node.value)
            if not targets:
                continue
        elif isinstance(node, ast.Import):
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
            target = _aliases.home(target) or target
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


def public_names(source):
    """The public alias names (``tape.nn``, ``tape.core``, ...) that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names if n not in KNOWN and _aliases.home(n) in KNOWN]
    return found


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_the_package_imports_modules_by_their_homes(name):
    bad = public_names(KNOWN[name].read_text())
    assert not bad, f"{name} imports through public names; import the layer modules: {bad}"


def test_no_cycle_between_folders():
    # the layer order forbids upward imports; within a layer, folders may not import each
    # other both ways either (tape.bench and the package namespace share the app layer)
    graph = {}
    for name, path in KNOWN.items():
        here = ".".join(name.split(".")[:2])
        for m in imports(name, path.read_text(), KNOWN):
            there = ".".join(m.split(".")[:2])
            if there != here and here != "tape" and there != "tape":
                graph.setdefault(here, set()).add(there)
    seen, stack = set(), []

    def visit(node):
        assert node not in stack, (
            f"import cycle between folders: {stack[stack.index(node) :] + [node]}"
        )
        if node in seen:
            return
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()
        seen.add(node)

    for node in sorted(graph):
        visit(node)


def test_an_upward_import_fails_the_check():
    # the check itself: the tape's core importing the tensor front end, at module level or
    # inside a function, is caught; an import from below is not
    for source in (
        "from tape.frontend.tensor import Tensor\n",
        "def f():\n    from tape.frontend import tensor as _tensor\n    return _tensor\n",
        "import tape.autograd\n",
        'SOURCE = """\nfrom tape.frontend.custom import store\n"""\n',  # into generated code
    ):
        assert upward("tape.program.core", source, KNOWN), source
    assert not upward("tape.program.core", "from tape.ops import registry\n", KNOWN)
    assert public_names("import tape.nn\nfrom tape.core import Tape\n") == ["tape.nn", "tape.core"]


# Attribute blocks are read through their codecs (tape/ops/blocks/): anywhere else, an index
# into the integer pool at a fixed offset from a position (``ipool[p + 2]``, on the GPU
# ``ip(prog, p + 2)``) is a block read by hand. The exceptions: the codecs themselves; the
# callback block ``[id, part]``, which belongs to the program layer and whose codec is
# tape.program.callbacks; and tape.ops.loops, whose ``ipool[p : p + 1]`` is a one-row
# placeholder (no block is read).
BLOCK_READERS = ("tape.ops.blocks", "tape.program.callbacks", "tape.ops.loops")


def raw_block_reads(source):
    """``(line, text)`` of each ``ipool[<position> + <int>]`` read in ``source`` (also as a
    slice bound)."""

    def fixed_offset(node):
        return (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Add, ast.Sub))
            and any(
                isinstance(v, ast.Constant) and isinstance(v.value, int)
                for v in (node.left, node.right)
            )
        )

    found = []
    for node in ast.walk(ast.parse(source)):
        if (  # the GPU kernels read the pool inside their program array: ip(prog, q)
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "ip"
            and len(node.args) == 2
            and fixed_offset(node.args[1])
        ):
            found.append((node.lineno, ast.unparse(node)))
        if not isinstance(node, ast.Subscript):
            continue
        v = node.value
        if not (
            (isinstance(v, ast.Name) and v.id == "ipool")
            or (isinstance(v, ast.Attribute) and v.attr == "ipool")
        ):
            continue
        s = node.slice
        bounds = [s.lower, s.upper] if isinstance(s, ast.Slice) else [s]
        if any(b is not None and fixed_offset(b) for b in bounds):
            found.append((node.lineno, ast.unparse(node)))
    return found


@pytest.mark.parametrize("name", sorted(m for m in KNOWN if not m.startswith(BLOCK_READERS)))
def test_attribute_blocks_are_read_through_their_codecs(name):
    bad = raw_block_reads(KNOWN[name].read_text())
    assert not bad, f"{name} reads attribute blocks by hand (use tape/ops/blocks/): {bad}"


def test_a_raw_block_read_fails_the_check():
    assert raw_block_reads("nd = t.ipool[p + 1]\n")
    assert raw_block_reads("d = ipool[p + 2 : p + 2 + nd]\n")
    assert raw_block_reads("nd = ip(prog, p + 1)\n")
    assert not raw_block_reads("nd = ipool[broadcast.ndim_at(p)]\n")


# The layers that extend replay (transforms, the GPU, the compiled tier) and the front end's
# checkpoints go through the tape's public interface (replay_state, run_replay,
# thread_workspace, outputs_of, last_replay, prepared_sweeps, count_replay, run_with,
# callback_sweeps, extensions): a private attribute of a tape there is a test failure. A tape
# is recognised by the names the code gives it.
_TAPE_NAMES = {"t", "tp", "tape", "sub"}
_TAPE_ATTRS = {"t", "tp"}
EXTENDING = ("tape.transforms", "tape.gpu", "tape.compiler", "tape.frontend.checkpoint")


def private_tape_uses(source):
    """``(line, text)`` of each ``t._x`` / ``self.t._x`` / ``plan.tp._x`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        if node.attr.startswith("__"):
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id in _TAPE_NAMES) or (
            isinstance(v, ast.Attribute) and v.attr in _TAPE_ATTRS
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


@pytest.mark.parametrize("name", sorted(m for m in KNOWN if m.startswith(EXTENDING)))
def test_extensions_use_the_tapes_public_interface(name):
    bad = private_tape_uses(KNOWN[name].read_text())
    assert not bad, f"{name} reaches into a tape's private members: {bad}"


def test_a_private_tape_use_fails_the_check():
    assert private_tape_uses("ws = t._workspace()\n")
    assert private_tape_uses("x = plan.tp._replay\n")
    assert not private_tape_uses("ws = t.thread_workspace()\n")


def test_public_names_are_the_layer_modules():
    import tape.core
    import tape.nn.functional
    import tape.optim

    import tape
    from tape.transforms import grad, jvp

    assert tape.core is tape.program.core and tape.optim is tape.frontend.optim
    assert tape.nn.functional is tape.frontend.nn.functional
    assert _aliases.home("tape.cuda._replay") == "tape.gpu._replay"  # (not imported: numba.cuda)
    # tape.transforms became the layer folder; its JAX-style names still import from it
    assert grad is tape.grad and jvp is tape.jvp
    assert callable(tape.record)  # the function, not the module behind tape.record
