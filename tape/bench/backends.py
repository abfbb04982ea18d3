"""One small adapter per tool, so that each benchmark objective is written once.

An objective is written against a backend ``B`` (``B.exp``, ``B.sum(x, axis)``, ...) and
plain operators (``+ - * / **``, ``@``, slicing, ``.reshape``); every tool then runs the
same formula in its own natural style. Peers are imported lazily: a missing one is reported
by :func:`peer_status` and skipped, never an error.
"""

from __future__ import annotations

import importlib
import os

import numpy as np

PEERS = ("jax", "torch", "autograd")


def peer_status() -> dict:
    """``{peer: version string or None}`` (None: not installed or fails to import)."""
    out = {}
    for name in PEERS:
        try:
            if name == "jax":
                _jax()
            mod = importlib.import_module(name)
            out[name] = _version(name, mod)
        except Exception:  # noqa: BLE001  (a broken install is reported as missing)
            out[name] = None
    return out


def _jax():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


class NumpyB:
    """Plain NumPy (reference values, no derivatives)."""

    name = "numpy"

    def __init__(self):
        import scipy.special

        self.np = np
        self._lse = scipy.special.logsumexp

    exp, log, tanh, sqrt, sin, cos = np.exp, np.log, np.tanh, np.sqrt, np.sin, np.cos

    def sum(self, x, axis=None):
        return np.sum(x, axis=axis)

    def lse(self, x, axis=None):
        return self._lse(x, axis=axis)

    def sigmoid(self, x):
        return 1.0 / (1.0 + np.exp(-x))

    def concat(self, xs, axis=0):
        return np.concatenate(xs, axis=axis)

    def stack(self, xs, axis=0):
        return np.stack(xs, axis=axis)

    def take_cols(self, x, idx):
        return x[:, idx]

    def const(self, a):
        return np.asarray(a)


class TapeB(NumpyB):
    name = "tape"

    def __init__(self):
        import tape as tp

        self.tp = tp
        self.exp, self.log, self.tanh, self.sqrt = tp.exp, tp.log, tp.tanh, tp.sqrt
        self.sin, self.cos = tp.sin, tp.cos

    def sum(self, x, axis=None):
        return self.tp.sum(x, axis)

    def lse(self, x, axis=None):
        return self.tp.logsumexp(x, axis)

    def sigmoid(self, x):
        return self.tp.sigmoid(x)

    def concat(self, xs, axis=0):
        return self.tp.concatenate(xs, axis)

    def stack(self, xs, axis=0):
        return self.tp.stack(xs, axis)

    def take_cols(self, x, idx):
        return self.tp.take(x, idx, axis=1)


class TorchB(NumpyB):
    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch
        self.exp, self.log, self.tanh, self.sqrt = torch.exp, torch.log, torch.tanh, torch.sqrt
        self.sin, self.cos, self.sigmoid = torch.sin, torch.cos, torch.sigmoid

    def sum(self, x, axis=None):
        return x.sum() if axis is None else x.sum(dim=axis)

    def lse(self, x, axis=None):
        if axis is None:
            return self.torch.logsumexp(x.reshape(-1), 0)
        return self.torch.logsumexp(x, axis)

    def concat(self, xs, axis=0):
        return self.torch.cat(xs, axis)

    def stack(self, xs, axis=0):
        return self.torch.stack(xs, axis)

    def take_cols(self, x, idx):
        return x[:, idx]

    def const(self, a):
        a = np.asarray(a)
        return self.torch.from_numpy(np.ascontiguousarray(a))


class JaxB(NumpyB):
    name = "jax"

    def __init__(self):
        jax = _jax()
        import jax.numpy as jnp
        import jax.scipy.special as jss

        self.jax, self.jnp = jax, jnp
        self._lse = jss.logsumexp
        self.exp, self.log, self.tanh, self.sqrt = jnp.exp, jnp.log, jnp.tanh, jnp.sqrt
        self.sin, self.cos, self.sigmoid = jnp.sin, jnp.cos, jax.nn.sigmoid

    def sum(self, x, axis=None):
        return self.jnp.sum(x, axis=axis)

    def concat(self, xs, axis=0):
        return self.jnp.concatenate(xs, axis=axis)

    def stack(self, xs, axis=0):
        return self.jnp.stack(xs, axis=axis)

    def const(self, a):
        return self.jnp.asarray(a)


class AutogradB(NumpyB):
    name = "autograd"

    def __init__(self):
        import autograd
        import autograd.numpy as anp
        import autograd.scipy.special as ass

        self.autograd, self.anp = autograd, anp
        self._lse = ass.logsumexp
        self.exp, self.log, self.tanh, self.sqrt = anp.exp, anp.log, anp.tanh, anp.sqrt
        self.sin, self.cos = anp.sin, anp.cos

    def sum(self, x, axis=None):
        return self.anp.sum(x, axis=axis)

    def sigmoid(self, x):
        return 1.0 / (1.0 + self.anp.exp(-x))

    def concat(self, xs, axis=0):
        return self.anp.concatenate(xs, axis=axis)

    def stack(self, xs, axis=0):
        return self.anp.stack(xs, axis=axis)


def _version(name, mod):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return getattr(mod, "__version__", "?")
