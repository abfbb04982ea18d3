"""The documentation: README's examples (doctest), every page's code blocks, README's shape,
and a docstring for every public name of the API reference.

The pages' ``python`` blocks run in order in one scope per page, as a reader would paste them;
a block after a ``<!-- no-test: reason -->`` line is shown but not run (it needs a GPU or a
cluster). Blocks with ``>>>`` prompts are doctests: their printed output must match.
"""

import doctest
import importlib
import inspect
import linecache
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [p for p in PAGES if "_build" not in p.parts and "_generated" not in p.parts]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

BLOCK = re.compile(r"(<!-- no-test:[^>]*-->\s*\n)?```python\n(.*?)```", re.S)


def code_blocks(text):
    """``[(code, run)]``: the ``python`` blocks of a Markdown text, and whether they run."""
    return [(m.group(2), m.group(1) is None) for m in BLOCK.finditer(text)]


def _run_doctest(code, name, scope):
    test = doctest.DocTestParser().get_doctest(code, scope, name, name, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    out = []
    runner.run(test, out=out.append, clear_globs=False)
    assert runner.failures == 0, "".join(out)
    return runner.tries


def run_page(path):
    """Run every block of ``path`` in one scope; returns how many ran."""
    scope = {"__name__": "__docs__"}
    ran = 0
    for k, (code, run) in enumerate(code_blocks(path.read_text())):
        if not run:
            continue
        name = f"<{path.relative_to(ROOT)}, block {k + 1}>"
        if ">>>" in code:
            assert _run_doctest(code, name, scope) > 0
        else:
            # the block's own lines for inspect.getsource (custom ops hash their functions'
            # source), not the page's lines at the block's line numbers
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            exec(compile(code, name, "exec"), scope)
        ran += 1
    return ran


def test_readme_is_short_and_has_the_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = "pip install -e '.[test,cuda,distributed]' && python -m pytest"
    assert test_cmd in text and test_cmd in ci
    assert "pip install -e . && python -m tape demo" in text
    assert "pip install -e '.[docs]' && sphinx-build docs docs/_build/html" in text
    # links into the docs point at pages that exist
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), link


@pytest.mark.late
def test_readme_examples():
    text = (ROOT / "README.md").read_text()
    blocks = code_blocks(text)
    assert blocks and all(">>>" in code for code, _ in blocks)
    scope = {"__name__": "__readme__"}
    assert sum(_run_doctest(code, "README.md", scope) for code, _ in blocks) >= 5


@pytest.mark.late
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT / "docs")) for p in PAGES])
def test_page_examples(page):
    run_page(page)


def test_no_test_markers_precede_a_block():
    # a marker that precedes no block (a typo, a blank line too many) would be dropped silently
    for page in PAGES:
        text = page.read_text()
        markers = len(re.findall(r"^<!-- no-test:", text, re.M))
        assert markers == sum(not run for _, run in code_blocks(text)), page


def _public():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import _generate
    finally:
        sys.path.pop(0)
    for module in _generate.MODULES:
        mod = importlib.import_module(module)
        for name in _generate.public_names(module):
            yield module, name, getattr(mod, name), _generate.DATA


def test_every_public_name_has_a_docstring():
    missing = []
    for module, name, obj, data in _public():
        full = f"{module}.{name}"
        if inspect.ismodule(obj) or full in data:
            doc = obj.__doc__ if inspect.ismodule(obj) else data[full]
        elif inspect.isroutine(obj) or inspect.isclass(obj) or callable(obj):
            doc = obj.__doc__
            if not inspect.isclass(obj) and doc == type(obj).__doc__:
                doc = None  # a callable object that only has its type's docstring
        else:
            doc = None
        if not (doc or "").strip():
            missing.append(full)
    assert not missing, f"public names without a docstring: {missing}"


def test_code_block_parser():
    text = "a\n```python\nx = 1\n```\n<!-- no-test: gpu -->\n```python\ny = 2\n```\n"
    assert code_blocks(text) == [("x = 1\n", True), ("y = 2\n", False)]
    scope = {}
    assert _run_doctest(">>> 1 + 1\n2\n", "t", scope) == 1
    with pytest.raises(AssertionError):
        _run_doctest(">>> 1 + 1\n3\n", "t", scope)
    np.testing.assert_equal(len(PAGES) > 10, True)
