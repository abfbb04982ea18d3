"""The matmul block: ``[batch, m, k, n, stride_a, stride_b]``.

Output matrix ``b`` is ``A[b] @ B[b]`` (``m x k`` times ``k x n``), with ``A[b]`` starting at
``b * stride_a`` and ``B[b]`` at ``b * stride_b`` (0: one matrix shared by the whole batch,
whose adjoint then sums over the batch). Read by :mod:`tape.ops.linalg` and the GPU kernels;
written by :mod:`tape.frontend.ops.linalg`.
"""

from tape.ops.blocks._fixed import fixed

BATCH, M, K, N, STRIDE_A, STRIDE_B = range(6)
SIZE = 6
Matmul, encode, decode = fixed("Matmul", ("batch", "m", "k", "n", "stride_a", "stride_b"))
