"""One small adapter per tool, so that each benchmark objective is written once.

An objective is written against a backend ``B`` (``B.exp``, ``B.sum(x, axis)``, ...) and
plain operators (``+ - * / **``, ``@``, slicing, ``.reshape``); every tool then runs the
same formula in its own natural style (Dr.Jit and CasADi only the formulas their array types
express: vectors, elementwise functions, slices, and for CasADi constant matrices times a
vector). Peers are imported lazily: a missing one is reported
by :func:`peer_status` and skipped, never an error.
"""

from __future__ import annotations

import importlib
import os

import numpy as np

PEERS = ("jax", "torch", "autograd", "drjit", "casadi")


def peer_status() -> dict:
    """``{peer: version string or None}`` (None: not installed or fails to import)."""
    out = {}
    for name in PEERS:
        try:
            if name == "jax":
                _jax()
            elif name == "drjit":
                _drjit()
            mod = importlib.import_module(name)
            out[name] = _version(name, mod)
        except Exception:  # noqa: BLE001  (a broken install is reported as missing)
            out[name] = None
    return out


def peer_of(tool: str) -> str | None:
    """The peer a benchmark tool needs (``"jax jit"``, ``"jax jacfwd"`` -> ``"jax"``), from
    the tool's first word; ``None`` for tape's own tools and the hand-written ones."""
    first = tool.split()[0]
    return first if first in PEERS else None


def _jax():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def _drjit():
    """Dr.Jit with its LLVM backend (``ImportError`` where LLVM is not found), its thread pool
    sized as ``--threads`` asks."""
    import drjit as dr

    if not dr.has_backend(dr.JitBackend.LLVM):
        raise ImportError("Dr.Jit's LLVM backend is not available (no LLVM library found)")
    if os.environ.get("TAPE_BENCH_THREADS"):
        dr.set_thread_count(int(os.environ["TAPE_BENCH_THREADS"]))
    return dr


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


class DrJitB(NumpyB):
    """Dr.Jit's LLVM backend, float64 arrays with AD (``drjit.llvm.ad.Float64``): 1-D
    arguments (slicing is a gather), no matrix products."""

    name = "drjit"

    def __init__(self):
        dr = _drjit()
        from drjit.llvm.ad import Float64

        self.dr, self.Float64 = dr, Float64
        self.exp, self.log, self.tanh, self.sqrt = dr.exp, dr.log, dr.tanh, dr.sqrt
        self.sin, self.cos = dr.sin, dr.cos

    def sum(self, x, axis=None):
        if axis not in (None, 0):
            raise NotImplementedError("Dr.Jit backend: 1-D arrays only")
        return self.dr.sum(x)

    def sigmoid(self, x):
        return 1.0 / (1.0 + self.dr.exp(-x))

    def const(self, a):
        return self.Float64(np.ravel(a))


class CasadiB(NumpyB):
    """CasADi's symbolic expressions (``MX`` or ``SX``): an argument of ``n`` elements is an
    ``n x 1`` column (1-D NumPy arrays and CasADi columns index alike), constants are ``DM``."""

    name = "casadi"

    def __init__(self):
        import casadi as ca

        self.ca = ca
        self.exp, self.log, self.tanh, self.sqrt = ca.exp, ca.log, ca.tanh, ca.sqrt
        self.sin, self.cos = ca.sin, ca.cos

    def sum(self, x, axis=None):
        ca = self.ca
        if axis is None:
            return ca.sum1(ca.sum2(x))
        return ca.sum1(x) if axis == 0 else ca.sum2(x)

    def sigmoid(self, x):
        return 1.0 / (1.0 + self.ca.exp(-x))

    def concat(self, xs, axis=0):
        return self.ca.vertcat(*xs) if axis == 0 else self.ca.horzcat(*xs)

    def const(self, a):
        return self.ca.DM(np.asarray(a, np.float64))


def _version(name, mod):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return getattr(mod, "__version__", "?")
