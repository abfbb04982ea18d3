"""The package's public module names, kept over its layer folders.

The code lives in folders that are its layers (``tape/program``, ``tape/frontend``, ...; see
``ARCHITECTURE.md``), while users import the names the API has always had: ``tape.nn``,
``tape.optim``, ``tape.cuda``, ``tape.core``. Each public name here is the same module object
as its home in a layer (``tape.nn is tape.frontend.nn``), for its submodules too
(``tape.nn.functional``), so there is one module, one set of classes and one place to
monkeypatch. :func:`install` puts a finder on :data:`sys.meta_path` for names not yet imported
and registers the ones the package has already imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

PUBLIC = {
    "tape.core": "tape.program.core",
    "tape.kernels": "tape.program.kernels",
    "tape.registry": "tape.ops.registry",
    "tape.compiled": "tape.compiler.compiled",
    "tape.derivatives": "tape.transforms.derivatives",
    "tape.sparse": "tape.transforms.sparse",
    "tape.batch": "tape.transforms.batch",
    "tape.cuda": "tape.gpu",
    "tape.functional": "tape.frontend.functional",
    "tape.autograd": "tape.frontend.autograd",
    "tape.custom": "tape.frontend.custom",
    "tape.checkpoint": "tape.frontend.checkpoint",
    "tape.distributed": "tape.frontend.distributed",
    "tape.nn": "tape.frontend.nn",
    "tape.optim": "tape.frontend.optim",
    "tape.record": "tape.frontend.record",
    "tape.linalg": "tape.frontend.linalg",
    "tape.testing": "tape.frontend.testing",
    "tape.optimize": "tape.frontend.optimize",
}
"""Public module name -> the module it is, in its layer."""


def home(name: str) -> str | None:
    """The real module behind public name ``name`` (or a submodule of one), or None."""
    for public, real in PUBLIC.items():
        if name == public or name.startswith(public + "."):
            return real + name[len(public) :]
    return None


class _Same(importlib.abc.Loader):
    """Loads a public name as the already-importable module behind it."""

    def __init__(self, real):
        self.real = real
        self.spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.real)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # the import system set __spec__ to the public name's spec: the module keeps its own
        module.__spec__ = self.spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        real = home(name)
        if real is None:
            return None
        return importlib.util.spec_from_loader(name, _Same(real))


TRANSFORMS = (
    "grad",
    "value_and_grad",
    "jacobian",
    "jacfwd",
    "jacrev",
    "hessian",
    "jvp",
    "vjp",
    "hvp",
)
"""The JAX-style transforms that ``tape.transforms`` (a module before it became the layer
folder of derivatives, sparsity and batching) exported: :func:`keep_transforms` puts them
back on that package, so ``from tape.transforms import grad`` keeps working."""


def keep_transforms():
    """Attach :data:`TRANSFORMS` from ``tape.frontend.function_transforms`` to the
    ``tape.transforms`` package (from here, the app layer: the package itself imports
    nothing from the front end)."""
    import tape.frontend.function_transforms as fn
    import tape.transforms as layer

    for name in TRANSFORMS:
        if not hasattr(layer, name):
            setattr(layer, name, getattr(fn, name))


def install():
    """Register the public names of modules already imported, and find the others on import."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in list(sys.modules):
        for public, real in PUBLIC.items():
            if name == real or name.startswith(real + "."):
                alias = public + name[len(real) :]
                sys.modules.setdefault(alias, sys.modules[name])
                parent, _, leaf = alias.rpartition(".")
                if not hasattr(sys.modules[parent], leaf):  # as an import of the name would
                    setattr(sys.modules[parent], leaf, sys.modules[name])
