"""GPU entry kernels of the factorisation ops (:mod:`tape.ops.factor`)."""

KERNELS = {}
