"""The solve block: ``[batch, n, k, stride_a, stride_b, mode]``.

Output matrix ``b`` (``n x k``) is ``op(A[b])^-1 B[b]``, ``A[b]`` starting at ``b * stride_a``
and ``B[b]`` at ``b * stride_b`` (0: one matrix shared by the batch). ``mode`` 0 reads all of
``A``; 1 (lower) and 2 (upper) only that triangle. Read by :mod:`tape.ops.factor` and the GPU
kernels.
"""

from tape.ops.blocks._fixed import fixed

BATCH, N, K, STRIDE_A, STRIDE_B, MODE = range(6)
SIZE = 6
Solve, encode, decode = fixed("Solve", ("batch", "n", "k", "stride_a", "stride_b", "mode"))
