"""``repr``/``str`` of tape tensors follow PyTorch's layout.

Each value in :data:`CASES` is printed by tape and, where PyTorch is installed, by
PyTorch with the same dtype and the same default dtype (float64, tape's default); the
strings must agree exactly once ``torch.`` is read as ``tape.`` in dtype names.
:data:`LITERAL` holds hand-checked strings so the layout is still tested without torch.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import tape as tp

nan, inf = float("nan"), float("inf")

# (id, value, numpy dtype or None for NumPy's inference)
CASES = [
    ("0d-frac", 1.5, None),
    ("0d-int-float", 30.0, None),
    ("0d-zero", 0.0, None),
    ("0d-neg-zero", -0.0, None),
    ("0d-small", 1e-5, None),
    ("0d-big", 1e9, None),
    ("0d-nan", nan, None),
    ("0d-int", 7, None),
    ("0d-bool", True, None),
    ("0d-f32", 0.1, np.float32),
    ("1d-integral", [1.0, 2.0, 3.0], None),
    ("1d-frac", [0.1, -2.25, 3.0], None),
    ("1d-neg-zero", [-0.0, 1.0], None),
    ("1d-zeros", [0.0, 0.0], None),
    ("1d-sci-ratio", [1e-5, 1.0], None),
    ("1d-sci-ratio-int", [1.0, 1e5], None),
    ("1d-sci-big", [1e9, 2e9], None),
    ("1d-sci-small", [1e-5, 2e-5], None),
    ("1d-no-sci-ratio", [1.0, 999.0], None),
    ("1d-nonfinite", [1.0, nan, inf, -inf], None),
    ("1d-nonfinite-frac", [0.5, nan, -inf], None),
    ("1d-nonfinite-only", [nan, inf], None),
    ("1d-sci-nonfinite", [1e-7, nan, 3.0], None),
    ("1d-ints", [1, 2, 3], None),
    ("1d-neg-ints", [-100, 2, 30000], None),
    ("1d-bools", [True, False], None),
    ("1d-f32", [0.1, 0.2, 1 / 3], np.float32),
    ("1d-f32-integral", [1.0, 2.0], np.float32),
    ("1d-wrap", np.arange(40.0) * 1.5, None),
    ("1d-wrap-ints", np.arange(100), None),
    ("1d-wrap-sci", np.logspace(-6, 6, 30), None),
    ("1d-summary", np.arange(2000.0), None),
    ("1d-summary-ints", np.arange(1001), None),
    ("1d-threshold", np.arange(1000.0) / 7, None),
    ("2d", [[1.0, 2.0], [3.0, 4.0]], None),
    ("2d-frac", [[0.5, -12.125], [3.0, 4.0]], None),
    ("2d-ints", [[1, -20], [300, 4]], None),
    ("2d-bools", [[True, False], [False, True]], None),
    ("2d-wide", np.arange(60.0).reshape(2, 30) / 3, None),
    ("2d-summary", np.arange(2500.0).reshape(50, 50), None),
    ("2d-summary-rows", np.arange(3000.0).reshape(1000, 3) / 7, None),
    ("2d-summary-cols", np.arange(2002.0).reshape(2, 1001) * 1e-3, None),
    ("2d-summary-f32", np.arange(4000.0).reshape(40, 100) * 0.37, np.float32),
    ("3d", np.arange(24.0).reshape(2, 3, 4), None),
    ("3d-frac", np.linspace(-1, 1, 12).reshape(3, 2, 2), None),
    ("3d-summary", np.arange(8000.0).reshape(20, 20, 20), None),
    ("4d", np.arange(16).reshape(2, 2, 2, 2), None),
    ("empty", [], None),
    ("empty-f32", np.zeros(0), np.float32),
    ("empty-int", np.zeros(0), np.int64),
    ("empty-2d", np.zeros((0, 3)), None),
    ("empty-3d-bool", np.zeros((2, 0, 1)), np.bool_),
]

LITERAL = [
    (tp.tensor(1.5), "tensor(1.5000)"),
    (tp.tensor(30.0), "tensor(30.)"),
    (tp.tensor([1.0, 2.0, 3.0]), "tensor([1., 2., 3.])"),
    (tp.tensor([0.1, -2.25]), "tensor([ 0.1000, -2.2500])"),
    (tp.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
    (tp.tensor([1.0, nan, inf, -inf]), "tensor([1., nan, inf, -inf])"),
    (tp.tensor([-0.0, 1.0]), "tensor([-0., 1.])"),
    (tp.tensor([1, 2, 3]), "tensor([1, 2, 3])"),
    (tp.tensor([True, False]), "tensor([ True, False])"),
    (tp.tensor([]), "tensor([])"),
    (tp.tensor(np.zeros((0, 3))), "tensor([], size=(0, 3))"),
    (tp.tensor(np.zeros(0, np.int64)), "tensor([], dtype=tape.int64)"),
    (tp.tensor([0.1, 0.2], dtype=tp.float32), "tensor([0.1000, 0.2000], dtype=tape.float32)"),
    (tp.tensor([[1.0, 2.0], [3.0, 4.0]]), "tensor([[1., 2.],\n        [3., 4.]])"),
    (
        tp.tensor(np.arange(24.0).reshape(2, 3, 4)),
        "tensor([[[ 0.,  1.,  2.,  3.],\n"
        "         [ 4.,  5.,  6.,  7.],\n"
        "         [ 8.,  9., 10., 11.]],\n"
        "\n"
        "        [[12., 13., 14., 15.],\n"
        "         [16., 17., 18., 19.],\n"
        "         [20., 21., 22., 23.]]])",
    ),
    (
        tp.tensor(np.arange(40.0) * 1.5),
        "tensor([ 0.0000,  1.5000,  3.0000,  4.5000,  6.0000,  7.5000,  9.0000, 10.5000,\n"
        "        12.0000, 13.5000, 15.0000, 16.5000, 18.0000, 19.5000, 21.0000, 22.5000,\n"
        "        24.0000, 25.5000, 27.0000, 28.5000, 30.0000, 31.5000, 33.0000, 34.5000,\n"
        "        36.0000, 37.5000, 39.0000, 40.5000, 42.0000, 43.5000, 45.0000, 46.5000,\n"
        "        48.0000, 49.5000, 51.0000, 52.5000, 54.0000, 55.5000, 57.0000, 58.5000])",
    ),
    (
        tp.tensor(np.arange(2000.0)),
        "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
        "        1.9990e+03])",
    ),
    (tp.tensor(np.arange(1001)), "tensor([   0,    1,    2,  ...,  998,  999, 1000])"),
]


def _value(value, dtype):
    """The case's value as a NumPy array of the dtype tape and torch both receive."""
    return np.array(value) if dtype is None else np.array(value, dtype=dtype)


def _tape_tensor(a, requires_grad=False):
    """A tape tensor holding exactly the array ``a`` (dtype included)."""
    return tp.tensor(a, dtype=a.dtype, requires_grad=requires_grad)


@contextlib.contextmanager
def _torch_default(torch, dtype):
    """Temporarily set torch's default dtype (to agree with tape's)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _torch_repr(torch, a, requires_grad=False, op=None):
    """PyTorch's repr of array ``a`` under tape's default dtype, dtype names as ``tape.``."""
    default = {"float64": torch.float64, "float32": torch.float32}[
        np.dtype(getattr(tp, "get_default_dtype", lambda: np.float64)()).name
    ]
    with _torch_default(torch, default):
        t = torch.tensor(a, requires_grad=requires_grad)
        if op is not None:
            t = op(t)
        return repr(t).replace("dtype=torch.", "dtype=tape.")


@pytest.mark.parametrize("value,dtype", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_torch(value, dtype):
    """Every case prints as PyTorch prints it."""
    torch = pytest.importorskip("torch")
    a = _value(value, dtype)
    t = _tape_tensor(a)
    assert repr(t) == _torch_repr(torch, a)
    assert str(t) == repr(t)


@pytest.mark.parametrize("i", range(len(LITERAL)))
def test_literal(i):
    """Hand-checked strings (copied from PyTorch) hold without torch installed."""
    t, expected = LITERAL[i]
    assert repr(t) == expected
    assert str(t) == expected


def test_requires_grad_leaf():
    """A leaf that requires grad ends with ``requires_grad=True``."""
    t = tp.tensor([1.0, 2.0], requires_grad=True)
    assert repr(t) == "tensor([1., 2.], requires_grad=True)"
    t32 = tp.tensor([0.5], dtype=tp.float32, requires_grad=True)
    assert repr(t32) == "tensor([0.5000], dtype=tape.float32, requires_grad=True)"


def test_non_leaf_grad_fn():
    """A computed tensor shows PyTorch's ``grad_fn=<MulBackward0>`` and no requires_grad."""
    t = tp.tensor([1.0, 2.0], requires_grad=True) * 2
    assert repr(t) == "tensor([2., 4.], grad_fn=<MulBackward0>)"
    s = (tp.tensor([1.0, 2.0], requires_grad=True) * 2).sum()
    assert repr(s) == "tensor(6., grad_fn=<SumBackward0>)"


def test_grad_suffixes_match_torch():
    """Suffix order and wrapping of long suffixes agree with PyTorch."""
    torch = pytest.importorskip("torch")
    for value in ([1.0, 2.0], 0.25, np.arange(40.0) * 1.5, np.arange(14.0).reshape(2, 7) / 3):
        for dtype in (np.float64, np.float32):
            a = np.array(value, dtype=dtype)
            assert repr(_tape_tensor(a, True)) == _torch_repr(torch, a, True)
            got = repr(_tape_tensor(a, True) * 2)
            assert got == _torch_repr(torch, a, True, lambda x: x * 2)


def test_random_matches_torch():
    """Seeded random arrays across magnitudes, signs, shapes and dtypes agree with PyTorch."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    shapes = [(), (1,), (5,), (13,), (3, 4), (2, 3, 2), (7, 1), (1, 25)]
    for k in range(200):
        shape = shapes[k % len(shapes)]
        scale = 10.0 ** rng.integers(-7, 10)
        a = rng.standard_normal(shape) * scale
        if k % 3 == 0:
            a = np.round(a)
        if k % 5 == 0 and a.size:
            a.flat[rng.integers(a.size)] = rng.choice([nan, inf, -inf, 0.0, -0.0])
        if k % 7 == 0:
            a = (a * 1000).astype(np.int64) if abs(a).max(initial=0) < 1e12 else a
        if k % 2 and a.dtype.kind == "f":
            a = a.astype(np.float32)
        assert repr(_tape_tensor(a)) == _torch_repr(torch, a), (k, a)


def test_float32_default(monkeypatch):
    """Under a float32 default, float32 drops its suffix and float64 gains one."""
    monkeypatch.setattr(tp, "get_default_dtype", lambda: tp.float32, raising=False)
    a32 = tp.tensor([0.5, 1.0], dtype=tp.float32, requires_grad=True)
    a64 = tp.tensor([0.5, 1.0], dtype=tp.float64)
    assert repr(a32) == "tensor([0.5000, 1.0000], requires_grad=True)"
    assert repr(a64) == "tensor([0.5000, 1.0000], dtype=tape.float64)"
    assert repr(tp.tensor(np.zeros(0), dtype=tp.float64)) == "tensor([], dtype=tape.float64)"
    torch = pytest.importorskip("torch")
    for a in (np.array([0.5, 1.0]), np.array([0.5, 1.0], np.float32), np.zeros((0, 2))):
        assert repr(_tape_tensor(a)) == _torch_repr(torch, a)
