"""KERNEL_CASES of ``scatter_add`` (merged into tests/test_ops.py): functional updates against
NumPy's in-place assignment on a copy."""

import numpy as np

import tape as tp


def _r(*shape, seed=0):
    return np.random.default_rng(seed + 11 * sum(shape)).uniform(-1.0, 1.0, shape)


def _np_set(x, key, v):
    y = x.copy()
    y[key] = v
    return y


def _np_add(x, key, v):
    y = x.copy()
    np.add.at(y, key, v)
    return y


def _np_index_add(x, dim, index, source):
    y = np.moveaxis(x.copy(), dim, 0)
    np.add.at(y, index, np.moveaxis(source, dim, 0))
    return np.moveaxis(y, 0, dim)


_I = np.array([2, 0, 2])

# fmt: off
CASES = {
    "scatter_add": [
        (lambda x, v: x.at[1].set(v), lambda x, v: _np_set(x, 1, v), [_r(3, 4), _r(4)]),
        (lambda x, v: x.at[:, 1:3].set(v), lambda x, v: _np_set(x, (slice(None), slice(1, 3)), v), [_r(3, 4), _r(3, 2)]),
        (lambda x, v: x.at[_I].add(v), lambda x, v: _np_add(x, _I, v), [_r(4, 2), _r(3, 2)]),
        (lambda x, v: x.at[_I].set(v), lambda x, v: _np_set(x, _I, v), [_r(4, 2), _r(3, 2)]),  # last write wins
        (lambda x, v: x.at[np.array([0, 2]), np.array([1, 1])].add(v), lambda x, v: _np_add(x, (np.array([0, 2]), np.array([1, 1])), v), [_r(3, 4), _r(2)]),
        (lambda x: x.at[x_mask].set(0.5), lambda x: _np_set(x, x_mask, 0.5), [_r(2, 3)]),
        (lambda x, s: tp.index_add(x, 1, _I, s), lambda x, s: _np_index_add(x, 1, _I, s), [_r(2, 4), _r(2, 3)]),
        (lambda x, s: x.index_add(0, np.array([1, 1]), s, alpha=2.0), lambda x, s: _np_index_add(x, 0, [1, 1], 2 * s), [_r(3, 2), _r(2, 2)]),
    ],
}
# fmt: on
x_mask = np.array([[True, False, True], [False, True, True]])
