"""The generated sweeps must match the registry (Numba's cache would otherwise serve old code)."""

import subprocess
import sys

from tape import _codegen, _fingerprint, registry
from tape._generated import sweeps


def test_generated_sweeps_are_fresh():
    assert sweeps.FINGERPRINT == _fingerprint.fingerprint(), "run `python -m tape._codegen`"
    assert _codegen.TARGET.read_text() == _codegen.generate(), "run `python -m tape._codegen`"


def test_check_command_exit_status():
    r = subprocess.run([sys.executable, "-m", "tape._codegen", "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_op_is_dispatched_by_both_sweeps():
    text = _codegen.TARGET.read_text()
    fwd, rev = text.split("def reverse_sweep", 1)
    for op in registry.OPS:
        assert f"op == {op.code}:  # {op.name}" in fwd
        if any(op.differentiable):
            assert f"op == {op.code}:  # {op.name}" in rev.split("def reach", 1)[0]


def test_registry_records_are_consistent():
    for k, op in enumerate(registry.OPS):
        assert op.code == k and registry.BY_NAME[op.name] is op
        if op.kind != "kernel":
            assert len(op.rev) == op.arity == len(op.differentiable)
            assert op.ref is not None, f"{op.name} needs a NumPy reference for the tests"
