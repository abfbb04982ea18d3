"""Sphinx configuration for tape's documentation.

Build with ``sphinx-build -W -b html docs docs/_build/html`` (warnings are errors) and run the
pages' and docstrings' examples with ``sphinx-build -W -b doctest docs docs/_build/doctest``.
The API reference pages (``docs/api/``) and the benchmark tables are written here, at build
time, from the package's ``__all__`` lists and ``benchmarks/results.json``.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

os.environ.setdefault("MPLBACKEND", "Agg")
# no compile helper processes during the build (the gallery and doctests compile in-process)
os.environ.setdefault("TAPE_COMPILE_WORKERS", "0")

import _generate  # noqa: E402

import tape  # noqa: E402

project = "tape"
author = "the tape developers"
copyright = "the tape developers"
release = version = tape.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "_generated",
    "examples",
    "examples/*.md",
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
    "auto_examples/*.json",
    "**.codeobj.json",
]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]

# docstrings: numpydoc style, rendered by napoleon
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"
autodoc_inherit_docstrings = False

intersphinx_mapping = {}

# the doctest builder: examples in the pages ({testcode}, {doctest}) and in docstrings (>>>)
doctest_global_setup = """
import numpy as np
import tape as tp
"""
doctest_default_flags = (
    __import__("doctest").ELLIPSIS
    | __import__("doctest").NORMALIZE_WHITESPACE
    | __import__("doctest").DONT_ACCEPT_TRUE_FOR_1
)

sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
    "within_subsection_order": "FileNameSortKey",
    "show_memory": False,
    "write_computation_times": False,
}

html_theme = "pydata_sphinx_theme"
html_title = f"tape {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path = []

_generate.api_pages(DOCS / "api")
_generate.benchmark_tables(ROOT / "benchmarks", DOCS / "_generated")
