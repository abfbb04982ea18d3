"""The block of ops over a batch of square matrices (``cholesky``, ``slogdet``, ``eigh``):
``[batch, n]``, ``batch`` matrices of ``n x n`` one after the other. Read by
:mod:`tape.ops.factor`, :mod:`tape.ops.spectral` and the GPU kernels.
"""

from tape.ops.blocks._fixed import fixed

BATCH, N = range(2)
SIZE = 2
Matrices, encode, decode = fixed("Matrices", ("batch", "n"))
