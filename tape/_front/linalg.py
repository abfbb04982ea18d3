"""Front ends of the matrix product (:mod:`tape.ops.linalg`): NumPy's ``matmul`` rules, with
1-D and 2-D operands reshaped (free aliases) to the kernel's batched form."""

from tape import _tensor as T
from tape.ops.linalg import MATMUL


def matmul(a, b):
    """Matrix product with NumPy's ``matmul`` rules for 1-D, 2-D and batched 3-D operands
    (a 2-D operand is shared by every matrix of the other's batch)."""
    a, b = T.as_tensor(a), T.as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul: operands must be at least 1-D, got shapes {a.shape} and {b.shape}"
        )
    if a.ndim > 3 or b.ndim > 3:
        raise ValueError(
            f"matmul: operands of more than 3 dimensions are not supported, got {a.shape} and {b.shape}"
        )
    a2 = T.view(a, (1,) + a.shape, 0) if a.ndim == 1 else a
    b2 = T.view(b, b.shape + (1,), 0) if b.ndim == 1 else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ValueError(
            f"matmul: shapes {a.shape} and {b.shape} are not aligned: "
            f"{k} (last dim of the first) != {k2} ({'first' if b.ndim == 1 else 'second-to-last'} dim of the second)"
        )
    ba = a2.shape[0] if a2.ndim == 3 else None
    bb = b2.shape[0] if b2.ndim == 3 else None
    if ba is not None and bb is not None and ba != bb:
        if 1 not in (ba, bb):
            raise ValueError(
                f"matmul: batch dimensions {ba} and {bb} of shapes {a.shape} and {b.shape} do not broadcast"
            )
    nb = max(ba or 1, bb or 1)
    sa = 0 if (ba is None or ba == 1) else m * k
    sb = 0 if (bb is None or bb == 1) else k * n
    batched = ba is not None or bb is not None
    out = T.apply(MATMUL, [a2, b2], ((nb,) if batched else ()) + (m, n), [nb, m, k, n, sa, sb])
    shape = out.shape
    if a.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if b.ndim == 1:
        shape = shape[:-1]
    return out if shape == out.shape else T.view(out, shape, 0)


def dot(a, b):
    """Inner product of two 1-D tensors (and ``matmul`` otherwise, as ``numpy.dot`` for <= 2-D)."""
    return matmul(a, b)


def outer(a, b):
    """Outer product of two vectors (flattened first, as ``numpy.outer``)."""
    a, b = T.as_tensor(a), T.as_tensor(b)
    return matmul(T.view(a, (a.numel(), 1), 0), T.view(b, (1, b.numel()), 0))
