"""KERNEL_CASES of the scan and selection ops (merged into tests/test_ops.py).

Each case is ``(function of tensors, NumPy reference, inputs)`` and must be differentiable
with a float result: the index ops (``argsort``, ``argmax``, ``argmin``) are exercised through
the values they select (``sort``, ``topk``, ``max(x, dim)``) or as a factor of a product."""

import numpy as np

import tape as tp


def _r(*shape, seed=0, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed + 7 * sum(shape) + 1).uniform(lo, hi, shape)


def _desc(x, axis):
    return -np.sort(-x, axis=axis)


ZEROS = np.array([1.5, 0.0, -2.0, 0.5, 0.0, 3.0])
ONE_ZERO = np.array([[0.7, -1.2, 0.0, 1.1], [1.3, 0.0, 0.9, -0.8], [0.0, 1.4, -1.1, 0.6]])

# fmt: off
CASES = {
    "cumsum": [
        (lambda x: tp.cumsum(x), lambda x: np.cumsum(x), [_r(3, 4)]),
        (lambda x: tp.cumsum(x, axis=0), lambda x: np.cumsum(x, axis=0), [_r(3, 4)]),
        (lambda x: tp.cumsum(x, dim=1), lambda x: np.cumsum(x, axis=1), [_r(2, 3, 4)]),
        (lambda x: x.cumsum(-1), lambda x: np.cumsum(x, axis=-1), [_r(2, 3, 4)]),
        (lambda x: tp.cumsum(x, 0), lambda x: np.cumsum(x, 0), [_r(7)]),
        (lambda x: tp.cumsum(x), lambda x: np.cumsum(x), [np.array(1.5)]),
    ],
    "cumprod": [
        (lambda x: tp.cumprod(x), lambda x: np.cumprod(x), [_r(6, lo=0.5)]),
        (lambda x: tp.cumprod(x, axis=1), lambda x: np.cumprod(x, axis=1), [_r(3, 4)]),
        (lambda x: x.cumprod(0), lambda x: np.cumprod(x, axis=0), [_r(3, 2, 2)]),
        (lambda x: tp.cumprod(x), lambda x: np.cumprod(x), [ZEROS]),  # two zeros
        (lambda x: tp.cumprod(x, dim=1), lambda x: np.cumprod(x, axis=1), [ONE_ZERO]),
        (lambda x: tp.cumprod(x, dim=0), lambda x: np.cumprod(x, axis=0), [ONE_ZERO]),
    ],
    "logcumsumexp": [
        (lambda x: tp.logcumsumexp(x), lambda x: np.logaddexp.accumulate(x.ravel()), [_r(3, 4)]),
        (lambda x: tp.logcumsumexp(x, axis=0), lambda x: np.logaddexp.accumulate(x, axis=0), [_r(3, 4)]),
        (lambda x: x.logcumsumexp(1), lambda x: np.logaddexp.accumulate(x, axis=1), [_r(2, 3, 4)]),
        (lambda x: tp.logcumsumexp(x, dim=-1), lambda x: np.logaddexp.accumulate(x, axis=-1), [_r(2, 5)]),
        # exp(x) overflows: the scan never forms it
        (lambda x: tp.logcumsumexp(x), lambda x: np.logaddexp.accumulate(x), [_r(6, lo=700.0, hi=760.0)]),
        (lambda x: tp.logcumsumexp(x), lambda x: np.logaddexp.accumulate(x.ravel()), [np.array(1.5)]),
    ],
    "argsort": [
        (lambda x: tp.sort(x), lambda x: np.sort(x), [_r(3, 4)]),
        (lambda x: tp.sort(x, axis=0), lambda x: np.sort(x, axis=0), [_r(3, 4)]),
        (lambda x: tp.sort(x, axis=None), lambda x: np.sort(x, axis=None), [_r(3, 4)]),
        (lambda x: tp.sort(x, dim=1, descending=True), lambda x: _desc(x, 1), [_r(2, 3, 4)]),
        (lambda x: x.sort(dim=0).values, lambda x: np.sort(x, axis=0), [_r(2, 3, 4)]),
        (lambda x: x * tp.argsort(x, axis=0), lambda x: x * np.argsort(x, axis=0, kind="stable"), [_r(4, 3)]),
        (lambda x: tp.topk(x, 2).values, lambda x: _desc(x, -1)[..., :2], [_r(3, 5)]),
        (lambda x: tp.topk(x, 2, dim=0, largest=False)[0], lambda x: np.sort(x, axis=0)[:2], [_r(4, 3)]),
        (lambda x: x.topk(3, 1).values * x[:, :3], lambda x: _desc(x, 1)[:, :3] * x[:, :3], [_r(2, 4, 2)]),
        (lambda x: tp.sort(x), lambda x: np.sort(x), [_r(9)]),
    ],
    "argmax": [
        (lambda x: tp.max(x, dim=1).values, lambda x: np.max(x, axis=1), [_r(3, 4)]),
        (lambda x: x * tp.argmax(x, dim=0, keepdim=True), lambda x: x * np.argmax(x, 0, keepdims=True), [_r(3, 4)]),
        (lambda x: x * tp.argmax(x), lambda x: x * np.argmax(x), [_r(2, 3, 2)]),
    ],
    "argmin": [
        (lambda x: tp.min(x, dim=0).values, lambda x: np.min(x, axis=0), [_r(3, 4)]),
        (lambda x: x * tp.argmin(x, dim=-1, keepdim=True), lambda x: x * np.argmin(x, -1, keepdims=True), [_r(3, 4)]),
        (lambda x: x.min(-1)[0] * tp.argmin(x, axis=-1), lambda x: np.min(x, -1) * np.argmin(x, -1), [_r(2, 3, 4)]),
    ],
}
# fmt: on
