"""Test files that run on the machine's second core when the whole suite runs.

README's test command runs on two cores, and the main pytest process uses one. The CUDA
simulator suites already run in a subprocess on the other (``tests/_background.py``); the
files in :data:`FILES` do too, when this file is collected with them: ``conftest.py`` then
deselects their tests in the main process, and :func:`test_file_passes_in_background` waits
for the subprocess that ran them and fails with its report if any failed. Run on its own
(``pytest tests/test_derivatives.py``), a file's tests run in the main process as usual.

A file here must pass on its own: its subprocess is a fresh pytest run of that file alone.
"""

from __future__ import annotations

import _background
import pytest

FILES = ("test_derivatives.py",)
"""Compile-heavy files that share little compiled code with the rest of the suite."""

for _name in FILES:
    _background.register_test_file(_name, "test_file_passes_in_background")


@pytest.mark.parametrize("name", FILES)
def test_file_passes_in_background(name):
    r = _background.result(_background.test_file_key(name))
    tail = (r.stdout[-8000:] + "\n" + r.stderr[-3000:]).strip()
    print(tail)
    assert r.returncode == 0, f"tests/{name} failed in its background run:\n{tail}"
