"""KERNEL_CASES of the factorisation ops (merged into tests/test_ops.py): ``tape.linalg``
against ``numpy.linalg`` (and a triangular solve against ``numpy.linalg.solve`` of the
triangle), on well-conditioned inputs. Symmetric positive definite matrices are built from a
free matrix inside the function, so finite differences perturb them symmetrically."""

import numpy as np

import tape as tp
import tape.frontend.linalg as la


def _r(*shape, seed=0):
    return np.random.default_rng(seed + 7 * sum(shape)).uniform(-1.0, 1.0, shape)


def _spd(x, lib):
    n = x.shape[-1]
    if lib is np:
        return x @ np.swapaxes(x, -1, -2) + n * np.eye(n)
    return x @ x.mT + n * tp.eye(n)


def _well(n, seed=0):  # a general matrix, safely nonsingular
    return _r(n, n, seed=seed) + 3.0 * np.eye(n)


def _tri(lower):
    def np_solve(a, b):
        t = np.tril(a) if lower else np.triu(a)
        return np.linalg.solve(t, b)

    return np_solve


# fmt: off
CASES = {
    "solve": [
        (lambda a, b: la.solve(a, b), np.linalg.solve, [_well(4), _r(4, 2)]),
        (lambda a, b: la.solve(a, b), np.linalg.solve, [_well(3), _r(3)]),
        (lambda a, b: la.solve(a, b), np.linalg.solve, [_well(3) + _r(2, 3, 3, seed=1) * 0.3, _r(2, 3, 2)]),
        (lambda a, b: la.solve(a, b), np.linalg.solve, [_well(3), _r(2, 3, 2)]),  # one a, batched b
        (lambda a, b: la.solve(a, b), np.linalg.solve, [_well(3) + _r(2, 3, 3, seed=2) * 0.3, _r(3, 1)]),
        (lambda a: la.inv(a), np.linalg.inv, [_well(3)]),
        (lambda a, b: la.solve_triangular(a, b, lower=True), _tri(True), [_well(4), _r(4, 3)]),
        (lambda a, b: la.solve_triangular(a, b), _tri(False), [_well(4), _r(4)]),
        (lambda a, b: la.solve(a, a @ b), lambda a, b: np.linalg.solve(a, a @ b), [_well(3), _r(3, 2)]),
    ],
    "cholesky": [
        (lambda x: la.cholesky(_spd(x, tp)), lambda x: np.linalg.cholesky(_spd(x, np)), [_r(4, 4)]),
        (lambda x: la.cholesky(_spd(x, tp)), lambda x: np.linalg.cholesky(_spd(x, np)), [_r(2, 3, 3)]),
        (lambda x: la.logdet_cholesky(la.cholesky(_spd(x, tp))),
         lambda x: np.linalg.slogdet(_spd(x, np))[1], [_r(3, 3)]),
        # Gaussian-process style: solve with the factor, then a quadratic form
        (lambda x, y: (la.solve_triangular(la.cholesky(_spd(x, tp)), y, lower=True) ** 2).sum(),
         lambda x, y: y @ np.linalg.solve(_spd(x, np), y), [_r(3, 3), _r(3)]),
    ],
    "slogdet": [
        (lambda a: la.slogdet(a).logabsdet, lambda a: np.linalg.slogdet(a)[1], [_well(4)]),
        (lambda a: la.slogdet(a)[1], lambda a: np.linalg.slogdet(a)[1], [_r(2, 3, 3, seed=3) + 2 * np.eye(3)]),
        (lambda a: la.slogdet(a).sign * 2, lambda a: np.linalg.slogdet(a)[0] * 2, [-_well(3)]),
        (lambda a: la.det(a), np.linalg.det, [_well(3)]),
        (lambda a: la.det(a), np.linalg.det, [-_well(3, seed=4)]),
    ],
}
# fmt: on
