"""KERNEL_CASES of the spectral factorisations (merged into tests/test_ops.py): ``tape.linalg``
``eigh`` / ``eigvalsh`` / ``qr`` against ``numpy.linalg`` with the signs normalised as tape
documents them (each eigenvector's largest-magnitude component positive, ``diag(R) > 0``).
The inputs are free matrices (``eigh`` reads one triangle, so finite differences perturb the
symmetric matrix it factorises through that triangle) with well-separated eigenvalues and
eigenvector components, so that no sign flips within a finite-difference step."""

import numpy as np

import tape.frontend.linalg as la


def _r(*shape, seed=0):
    return np.random.default_rng(seed + 11 * sum(shape)).uniform(-1.0, 1.0, shape)


def _signed(v):
    """Columns of ``v`` with their largest-magnitude component positive (tape's convention)."""
    k = np.argmax(np.abs(v), axis=-2)[..., None, :]
    return v * np.sign(np.take_along_axis(v, k, axis=-2))


def np_eigh(a, uplo="L"):
    w, v = np.linalg.eigh(a, UPLO=uplo)
    return w, _signed(v)


def np_qr(a):
    q, r = np.linalg.qr(a)
    s = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
    return q * s[..., None, :], r * s[..., :, None]


# fmt: off
CASES = {
    "eigh": [
        (lambda a: la.eigh(a).eigenvalues, lambda a: np_eigh(a)[0], [_r(4, 4)]),
        (lambda a: la.eigh(a)[1], lambda a: np_eigh(a)[1], [_r(2, 3, 3)]),
        # the upper triangle, eigenvectors scaled by their eigenvalues, and eigvalsh
        (lambda a: la.eigh(a, UPLO="U")[1] * la.eigvalsh(a.mT)[..., None, :],
         lambda a: np_eigh(a, "U")[1] * np.linalg.eigvalsh(a.T)[None, :], [_r(3, 3, seed=1)]),
    ],
    "qr": [
        (lambda a: la.qr(a).Q, lambda a: np_qr(a)[0], [_r(4, 3)]),
        (lambda a: la.qr(a).R, lambda a: np_qr(a)[1], [_r(2, 3, 3)]),
        # least squares through QR
        (lambda a, y: la.solve_triangular(la.qr(a).R, la.qr(a).Q.mT @ y),
         lambda a, y: np.linalg.lstsq(a, y, rcond=None)[0], [_r(5, 3), _r(5)]),
    ],
}
# fmt: on
