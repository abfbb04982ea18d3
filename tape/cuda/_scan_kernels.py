"""GPU entry kernels of the scan and selection ops (:mod:`tape.ops.scan`)."""

KERNELS = {}
