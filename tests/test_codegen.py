"""The generated sweeps must match the registry (Numba's cache would otherwise serve old code);
every op record holds the facts the rest of the package reads from it; tape/ops imports nothing
above it."""

import ast
import dataclasses
import subprocess
import sys

import pytest

from tape import _codegen, _fingerprint, registry
from tape._generated import sweeps

OPS_DIR = _fingerprint.PKG / "ops"


def test_generated_sweeps_are_fresh():
    assert sweeps.FINGERPRINT == _fingerprint.fingerprint(), "run `python -m tape._codegen`"
    assert _codegen.TARGET.read_text() == _codegen.generate(), "run `python -m tape._codegen`"


def test_check_command_exit_status():
    r = subprocess.run(
        [sys.executable, "-m", "tape._codegen", "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_every_op_is_dispatched_by_both_sweeps():
    text = _codegen.TARGET.read_text()
    fwd, rev = text.split("def reverse_sweep", 1)
    for op in registry.OPS:
        assert f"op == {op.code}:  # {op.name}" in fwd
        if any(op.differentiable):
            assert f"op == {op.code}:  # {op.name}" in rev.split("def reach", 1)[0]


def test_registry_records_are_consistent():
    dunders = {}
    for k, op in enumerate(registry.OPS):
        assert op.code == k and registry.BY_NAME[op.name] is op
        assert not registry.missing_facts(op), f"op {op.name!r}: {registry.missing_facts(op)}"
        for d in op.operators + op.reflected:
            assert d not in dunders, f"{d} is claimed by ops {dunders[d]!r} and {op.name!r}"
            dunders[d] = op.name


def _record(**change):
    fwd = registry.BY_NAME["exp"]
    kernel = registry.BY_NAME["take"]
    op = dataclasses.replace(kernel if change.pop("kernel", False) else fwd, code=-1)
    return dataclasses.replace(op, **change)


@pytest.mark.parametrize(
    "change, says",
    [
        (dict(ref=None), "NumPy reference"),
        (dict(check=None), "no check"),
        (dict(rev=()), "reverse rules"),
        (dict(differentiable=(True, True)), "differentiable"),
        (dict(dtype="widest"), "dtype rule"),
        (dict(dtype=("like", (1,))), "dtype rule"),
        (dict(operators=("add",)), "dunder"),
        (dict(reflected=("__rexp__",)), "reflected operators need two inputs"),
        (dict(domain=(1.0, -1.0)), "domain"),
        (dict(domains=((0.0, 1.0), (0.0, 1.0))), "domains"),
        (dict(masks=(1,)), "masks"),
        (dict(kinks=((1, -1),)), "kink"),
        (dict(tol=(1e-12,)), "tol"),
        (dict(guard=True), "describe_failure"),
        (dict(kernel=True, gpu=None), "GPU kernel"),
        (dict(kernel=True, rev=(None,)), "no reverse kernel"),
    ],
)
def test_a_record_missing_a_fact_fails(change, says):
    problems = registry.missing_facts(_record(**change))
    assert any(says in p for p in problems), problems


# The layers read registry -> ops -> generated sweeps -> core -> front end; tape/ops may import
# only what lies below it.
OPS_MAY_IMPORT = {
    "tape.registry", "tape._layout", "tape._config", "tape._loops", "tape._validate", "tape._vmath",
    "tape._blas",
}
NEVER = {"tape", "tape._tensor", "tape.functional", "tape.core"}


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.module == "tape":  # from tape import registry: the submodule
                yield from (f"tape.{a.name}" for a in node.names)
            else:
                yield node.module


@pytest.mark.parametrize("path", sorted(OPS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_ops_import_nothing_above_them(path):
    for name in _imports(path):
        top = name.split(".")[0]
        assert name not in NEVER, f"{path.name} imports {name}"
        if top == "tape":
            assert name in OPS_MAY_IMPORT or name.split(".")[:2] == ["tape", "ops"], (
                f"{path.name} imports {name}: tape/ops may import only {sorted(OPS_MAY_IMPORT)}"
            )
        else:
            assert top in {"numba", "numpy"} or top in sys.stdlib_module_names, (
                f"{path.name} imports {name}"
            )
