"""Acceptance test: PyTorch-style scripts (``tests/torch_scripts/*.py``) run under tape.

Each script starts with ``import tape as torch`` and is written as a PyTorch user would write
it. Its stdout must match ``<name>.expected``, which was produced by running the same script
under real PyTorch (``import torch``). When PyTorch is installed the script also runs under it
against the same file, so the expected output stays PyTorch's.

Lines are compared as text with every number taken out, and the numbers one by one: within
``rtol=1e-6`` for the float64 scripts, exactly (as printed) for the float32 ones (``EXACT``).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "torch_scripts"
NAMES = sorted(p.stem for p in SCRIPTS.glob("*.py"))
EXACT = {"float32"}  # single-precision scripts: the printed text must match exactly
IMPORT_TAPE = "import tape as torch"  # the first line (a comment may follow)

RTOL = 1e-6
ATOL = 1e-12
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan\b|inf\b)")

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=SCRIPTS,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.splitlines()[-n:])


def _numbers_match(a: str, b: str) -> bool:
    x, y = float(a), float(b)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y
    return abs(x - y) <= ATOL + RTOL * abs(y)


def _line_matches(got: str, want: str, exact: bool) -> bool:
    if got == want:
        return True
    if exact:
        return False
    if NUMBER.sub("#", got) != NUMBER.sub("#", want):
        return False
    got_nums, want_nums = NUMBER.findall(got), NUMBER.findall(want)
    return all(_numbers_match(g, w) for g, w in zip(got_nums, want_nums))


def _first_difference(name: str, got: list[str], expected: list[str]) -> str | None:
    exact = name in EXACT
    for k, (g, w) in enumerate(zip(got, expected)):
        if not _line_matches(g, w, exact):
            context = "\n".join(got[max(0, k - 3) : k])
            return (
                f"line {k + 1} differs from {name}.expected\n"
                f"--- preceding output\n{context}\n--- got\n{g}\n--- expected\n{w}"
            )
    return None


def _check(name: str, script: Path, who: str) -> None:
    proc = _run(script)
    expected = (SCRIPTS / f"{name}.expected").read_text().splitlines()
    got = proc.stdout.splitlines()
    difference = _first_difference(name, got, expected)
    if proc.returncode != 0:
        pytest.fail(
            f"{name}.py under {who} exited with {proc.returncode} after {len(got)} of "
            f"{len(expected)} expected lines"
            + (f"; before that, {difference}" if difference else " (all of them matching)")
            + f"\n--- stderr (last lines)\n{_tail(proc.stderr)}",
            pytrace=False,
        )
    if difference:
        pytest.fail(f"{name}.py under {who}: {difference}", pytrace=False)
    if len(got) != len(expected):
        pytest.fail(
            f"{name}.py under {who}: {len(got)} lines of output, {name}.expected has "
            f"{len(expected)}\n--- output tail\n{_tail(proc.stdout)}",
            pytrace=False,
        )


def test_every_script_has_expected_output():
    assert len(NAMES) >= 5
    for name in NAMES:
        source = (SCRIPTS / f"{name}.py").read_text()
        first = source.split("\n", 1)[0]
        assert first.split("#")[0].strip() == IMPORT_TAPE, (
            f"{name}.py must start with {IMPORT_TAPE!r}"
        )
        assert (SCRIPTS / f"{name}.expected").is_file(), f"{name}.expected is missing"


@pytest.mark.parametrize("name", NAMES)
def test_script_under_tape(name):
    _check(name, SCRIPTS / f"{name}.py", "tape")


@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_script_under_pytorch(name, tmp_path):
    source = (SCRIPTS / f"{name}.py").read_text()
    script = tmp_path / f"{name}.py"
    script.write_text("import torch\n" + source.split("\n", 1)[1])
    _check(name, script, "PyTorch")


def test_comparison_rule():
    assert _line_matches("loss 0.1234567", "loss 0.1234568", exact=False)
    assert _line_matches("tensor([1., 2.])", "tensor([1.0000, 2.0000])", exact=False)
    assert _line_matches("tensor([nan, -inf])", "tensor([nan, -inf])", exact=False)
    assert _line_matches("tensor([1e-13, 2.0])", "tensor([0.0, 2.0])", exact=False)
    assert not _line_matches("loss 0.1234", "loss 0.1235", exact=False)
    assert not _line_matches(
        "tensor([1., 2.])", "tensor([1., 2.], requires_grad=True)", exact=False
    )
    assert not _line_matches("tensor([nan])", "tensor([inf])", exact=False)
    assert not _line_matches("step 3 loss 0.5", "step 4 loss 0.5", exact=False)
    assert not _line_matches("0.3000000119", "0.3000000120", exact=True)
