"""The qr block: ``[batch, m, n]``, ``batch`` matrices of ``m x n`` (``m >= n``) one after the
other. Read by :mod:`tape.ops.spectral` and the GPU kernels.
"""

from tape.ops.blocks._fixed import fixed

BATCH, M, N = range(3)
SIZE = 3
Qr, encode, decode = fixed("Qr", ("batch", "m", "n"))
