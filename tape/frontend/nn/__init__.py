"""Neural-network helpers, following ``torch.nn``: :mod:`tape.nn.functional` (losses,
activations, ``linear``, ``normalize``), composed from tape's differentiable ops."""

from tape.frontend.nn import functional

__all__ = ["functional"]
