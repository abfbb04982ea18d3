"""The PyTorch-parity API: constructors, random numbers, default dtype, devices, ``Tensor.to``,
PyTorch's method spellings (``dim``/``keepdim``/``alpha``, ``max`` with indices, ``var``/``std``
with ``correction``), in-place updates of leaves, ``tape.autograd.Function`` (eager and
recorded), ``tape.autograd.backward`` and ``tape.autograd.grad``.

Everything is checked in float64 against independent references: PyTorch where it is
installed (``pytest.importorskip("torch")`` inside the tests that need it), NumPy formulas,
analytic derivatives or central finite differences otherwise.
"""

import pickle
import zlib

import numpy as np
import pytest

import tape

N_STAT = 100_000  # samples for the statistical checks (standard error of a mean: 0.0032)


@pytest.fixture(autouse=True)
def _restore_defaults():
    """Every test leaves the process-wide defaults as it found them."""
    dt, dev = tape.get_default_dtype(), tape.get_default_device()
    yield
    assert tape.get_default_dtype() == dt, "a test left the default dtype changed"
    assert tape.get_default_device() == dev, "a test left the default device changed"


@pytest.fixture
def default_float32():
    prev = tape.get_default_dtype()
    tape.set_default_dtype(tape.float32)
    try:
        yield
    finally:
        tape.set_default_dtype(prev)


def _np(x):
    """A tape or torch tensor (or anything array-like) as a NumPy array."""
    if isinstance(x, tape.Tensor):
        return np.asarray(x.numpy())
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _fd_grad(f, arrays, eps=1e-6):
    """Central finite differences of the scalar ``f(*arrays)`` with respect to each array."""
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            args_p = [b.copy() for b in arrays]
            args_m = [b.copy() for b in arrays]
            args_p[k][i] += eps
            args_m[k][i] -= eps
            g[i] = (f(*args_p) - f(*args_m)) / (2 * eps)
        grads.append(g)
    return grads


# ================================================================ 1. creation

SHAPE_FORMS = [
    (((),), ()),
    ((0,), (0,)),
    ((5,), (5,)),
    ((2, 3), (2, 3)),
    (((2, 3),), (2, 3)),
    (([2, 3],), (2, 3)),
    ((2, 1, 4), (2, 1, 4)),
]

RANDOM_CTORS = {
    "randn": lambda *s, **k: tape.randn(*s, **k),
    "rand": lambda *s, **k: tape.rand(*s, **k),
    "zeros": lambda *s, **k: tape.zeros(*s, **k),
    "ones": lambda *s, **k: tape.ones(*s, **k),
    "empty": lambda *s, **k: tape.empty(*s, **k),
}


@pytest.mark.parametrize("name", list(RANDOM_CTORS))
@pytest.mark.parametrize("args,shape", SHAPE_FORMS, ids=[str(a) for a, _ in SHAPE_FORMS])
def test_constructor_shapes_as_ints_or_tuples(name, args, shape):
    x = RANDOM_CTORS[name](*args)
    assert isinstance(x, tape.Tensor)
    assert x.shape == shape
    assert x.numpy().shape == shape
    assert x.dtype == np.float64
    assert x.is_leaf and not x.requires_grad


MORE_SHAPES = [
    ("normal(0.0, 1.0, ())", lambda: tape.normal(0.0, 1.0, ()), ()),
    ("normal(0.0, 1.0, (2, 3))", lambda: tape.normal(0.0, 1.0, (2, 3)), (2, 3)),
    ("normal(0.0, 1.0, size=(4,))", lambda: tape.normal(0.0, 1.0, size=(4,)), (4,)),
    ("randint(5, ())", lambda: tape.randint(5, ()), ()),
    ("randint(5, (3,))", lambda: tape.randint(5, (3,)), (3,)),
    ("randint(2, 5, (2, 3))", lambda: tape.randint(2, 5, (2, 3)), (2, 3)),
    ("randint(2, 5, size=(4,))", lambda: tape.randint(2, 5, size=(4,)), (4,)),
    ("randint(5, size=(2, 2))", lambda: tape.randint(5, size=(2, 2)), (2, 2)),
    ("randn_like(tape.zeros(()))", lambda: tape.randn_like(tape.zeros(())), ()),
    ("randn_like(tape.zeros(2, 3))", lambda: tape.randn_like(tape.zeros(2, 3)), (2, 3)),
    ("rand_like(tape.zeros(()))", lambda: tape.rand_like(tape.zeros(())), ()),
    ("rand_like(tape.zeros(4, 1))", lambda: tape.rand_like(tape.zeros(4, 1)), (4, 1)),
    ("normal(tape.tensor(0.0), 1.0)", lambda: tape.normal(tape.tensor(0.0), 1.0), ()),
    ("normal(tape.zeros(3), 1.0)", lambda: tape.normal(tape.zeros(3), 1.0), (3,)),
    ("normal(0.0, tape.ones(2, 3))", lambda: tape.normal(0.0, tape.ones(2, 3)), (2, 3)),
    (
        "normal(tape.zeros(3, 1), tape.ones(1, 4))",
        lambda: tape.normal(tape.zeros(3, 1), tape.ones(1, 4)),
        (3, 4),
    ),
    ("eye(3)", lambda: tape.eye(3), (3, 3)),
    ("eye(2, 4)", lambda: tape.eye(2, 4), (2, 4)),
    ("full((), 2.0)", lambda: tape.full((), 2.0), ()),
    ("full(3, 2.0)", lambda: tape.full(3, 2.0), (3,)),
]


@pytest.mark.parametrize(
    "make,shape", [c[1:] for c in MORE_SHAPES], ids=[c[0] for c in MORE_SHAPES]
)
def test_more_constructor_shapes(make, shape):
    x = make()
    assert x.shape == shape
    assert x.numpy().shape == shape


def test_random_zero_dim_matches_torch():
    torch = pytest.importorskip("torch")
    for t_make, make in [
        (lambda: torch.randn(()), lambda: tape.randn(())),
        (lambda: torch.rand(()), lambda: tape.rand(())),
        (lambda: torch.randint(5, ()), lambda: tape.randint(5, ())),
        (lambda: torch.normal(0.0, 1.0, ()), lambda: tape.normal(0.0, 1.0, ())),
        (lambda: torch.randn_like(torch.zeros(())), lambda: tape.randn_like(tape.zeros(()))),
    ]:
        assert tuple(t_make().shape) == make().shape == ()


def test_randint_both_call_forms_and_range():
    tape.manual_seed(0)
    a = tape.randint(10, (N_STAT,))
    b = tape.randint(3, 10, (N_STAT,))
    c = tape.randint(-4, 3, size=(200, 500))
    for x, lo, hi in [(a, 0, 10), (b, 3, 10), (c, -4, 3)]:
        v = x.numpy()
        assert x.dtype == np.int64
        assert v.min() >= lo and v.max() < hi
        assert set(np.unique(v).tolist()) == set(range(lo, hi))  # every value is drawn
        assert abs(v.mean() - (lo + hi - 1) / 2) < 0.05
    assert tape.randint(0, 4, (3,), dtype=tape.float64).dtype == np.float64


def test_randint_keyword_low_high():
    # torch.randint(low=2, high=5, size=(3,)) is valid PyTorch
    x = tape.randint(low=2, high=5, size=(1000,))
    v = x.numpy()
    assert v.shape == (1000,) and v.min() >= 2 and v.max() < 5
    y = tape.randint(high=3, size=(10,))
    assert y.numpy().max() < 3


def test_randint_bad_arguments():
    with pytest.raises(ValueError):
        tape.randint(5, 5, (3,))
    with pytest.raises(TypeError):
        tape.randint(5)  # no size
    with pytest.raises(RuntimeError):
        tape.randint(5, (3,), requires_grad=True)


def test_randn_statistics():
    tape.manual_seed(1)
    v = tape.randn(N_STAT).numpy()
    assert abs(v.mean()) < 0.02
    assert abs(v.std() - 1) < 0.02
    assert abs(np.mean(v > 0) - 0.5) < 0.01  # symmetric
    assert abs(np.mean(np.abs(v) < 1) - 0.6827) < 0.01  # normal, not uniform


def test_rand_statistics():
    tape.manual_seed(2)
    v = tape.rand(N_STAT).numpy()
    assert v.min() >= 0.0 and v.max() < 1.0
    assert abs(v.mean() - 0.5) < 0.01
    assert abs(v.var() - 1 / 12) < 0.005
    hist, _ = np.histogram(v, bins=10, range=(0, 1))
    assert np.all(np.abs(hist / N_STAT - 0.1) < 0.01)


def test_normal_with_numbers_and_size():
    tape.manual_seed(3)
    v = tape.normal(2.0, 3.0, (N_STAT,)).numpy()
    assert abs(v.mean() - 2.0) < 0.06
    assert abs(v.std() - 3.0) < 0.06
    with pytest.raises(TypeError):
        tape.normal(0.0, 1.0)  # numbers need a size


def test_normal_with_tensor_mean_and_std():
    tape.manual_seed(4)
    mean = tape.tensor([[-5.0], [0.0], [5.0]])
    std = tape.full((1, N_STAT // 4), 2.0)
    v = tape.normal(mean, std).numpy()
    assert v.shape == (3, N_STAT // 4)
    np.testing.assert_allclose(v.mean(axis=1), [-5.0, 0.0, 5.0], atol=0.06)
    np.testing.assert_allclose(v.std(axis=1), [2.0, 2.0, 2.0], atol=0.06)
    # tensor mean, number std; number mean, tensor std
    m = tape.normal(tape.full((N_STAT,), 1.5), 0.5).numpy()
    assert abs(m.mean() - 1.5) < 0.02 and abs(m.std() - 0.5) < 0.02
    s = tape.normal(-1.0, tape.tensor([0.0, 1.0])).numpy()
    assert s[0] == -1.0  # std 0: exactly the mean


def test_normal_is_a_new_leaf():
    mean = tape.zeros(3, requires_grad=True)
    x = tape.normal(mean, 1.0)
    assert x.is_leaf and not x.requires_grad


def test_manual_seed_reproducibility():
    def draw():
        return [
            tape.randn(4).numpy().copy(),
            tape.rand(2, 2).numpy().copy(),
            tape.randint(0, 1000, (5,)).numpy().copy(),
            tape.normal(1.0, 2.0, (3,)).numpy().copy(),
            tape.randn_like(tape.zeros(3)).numpy().copy(),
            tape.rand_like(tape.zeros(3)).numpy().copy(),
        ]

    g0 = tape.manual_seed(1234)
    assert isinstance(g0, tape.Generator)
    a = draw()
    tape.manual_seed(1234)
    b = draw()
    tape.manual_seed(4321)
    c = draw()
    for x, y, z in zip(a, b, c):
        np.testing.assert_array_equal(x, y)
        assert not np.array_equal(x, z)
    assert tape.initial_seed() == 4321
    # successive draws after one seed differ from each other
    tape.manual_seed(5)
    assert not np.array_equal(tape.randn(4).numpy(), tape.randn(4).numpy())


def test_generator_argument():
    g1 = tape.Generator().manual_seed(77)
    g2 = tape.Generator()
    assert g2.manual_seed(77) is g2
    assert g1.initial_seed() == 77
    a = tape.randn(5, generator=g1).numpy().copy()
    tape.randn(100)  # draws from the default generator do not disturb g2
    b = tape.randn(5, generator=g2).numpy().copy()
    np.testing.assert_array_equal(a, b)
    # every random constructor takes generator=
    for make in [
        lambda g: tape.rand(3, generator=g),
        lambda g: tape.randint(0, 50, (3,), generator=g),
        lambda g: tape.normal(0.0, 1.0, (3,), generator=g),
        lambda g: tape.randn_like(tape.zeros(3), generator=g),
        lambda g: tape.rand_like(tape.zeros(3), generator=g),
    ]:
        g1.manual_seed(9)
        g2.manual_seed(9)
        np.testing.assert_array_equal(make(g1).numpy(), make(g2).numpy())
    with pytest.raises(TypeError):
        tape.randn(3, generator=np.random.default_rng(0))


@pytest.mark.parametrize(
    "make",
    [
        lambda: tape.randn(2, 3, requires_grad=True),
        lambda: tape.rand(2, 3, requires_grad=True),
        lambda: tape.normal(0.0, 1.0, (2, 3), requires_grad=True),
        lambda: tape.randn_like(tape.zeros(2, 3), requires_grad=True),
        lambda: tape.rand_like(tape.zeros(2, 3), requires_grad=True),
        lambda: tape.zeros(2, 3, requires_grad=True),
        lambda: tape.ones((2, 3), requires_grad=True),
        lambda: tape.empty(2, 3, requires_grad=True),
        lambda: tape.full((2, 3), 0.5, requires_grad=True),
        lambda: tape.eye(2, 3, requires_grad=True),
        lambda: tape.arange(0.0, 6.0, 1.0, requires_grad=True),
        lambda: tape.linspace(0, 1, 6, requires_grad=True),
        lambda: tape.randint(0, 5, (2, 3), dtype=tape.float64, requires_grad=True),
        lambda: tape.zeros_like(tape.zeros(2, 3), requires_grad=True),
        lambda: tape.tensor(np.ones((2, 3)), requires_grad=True),
    ],
)
def test_constructors_requires_grad(make):
    x = make()
    assert x.requires_grad and x.is_leaf and x.grad is None
    x_val = x.numpy().copy()
    w = np.arange(1.0, 7.0).reshape(x.shape)
    (x * tape.tensor(w) + x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), w + 2 * x_val, rtol=1e-14)


def test_eye_and_plain_constructors_values():
    np.testing.assert_array_equal(tape.eye(3).numpy(), np.eye(3))
    np.testing.assert_array_equal(tape.eye(2, 4).numpy(), np.eye(2, 4))
    np.testing.assert_array_equal(tape.eye(4, 2).numpy(), np.eye(4, 2))
    np.testing.assert_array_equal(tape.empty(2, 3).numpy().shape, (2, 3))
    np.testing.assert_array_equal(tape.full((2, 2), -1.5).numpy(), np.full((2, 2), -1.5))
    np.testing.assert_array_equal(tape.arange(1.0, 2.0, 0.25).numpy(), [1.0, 1.25, 1.5, 1.75])
    np.testing.assert_allclose(tape.linspace(-1, 1, 5).numpy(), [-1, -0.5, 0, 0.5, 1])


DTYPED = [
    ("zeros", lambda **k: tape.zeros(2, 3, **k), np.zeros((2, 3))),
    ("ones", lambda **k: tape.ones(2, 3, **k), np.ones((2, 3))),
    ("empty", lambda **k: tape.empty(2, 3, **k), None),
    ("full", lambda **k: tape.full((2, 3), 2.0, **k), np.full((2, 3), 2.0)),
    ("arange", lambda **k: tape.arange(0, 6, 2, **k), np.array([0, 2, 4])),
    ("linspace", lambda **k: tape.linspace(0, 1, 5, **k), np.linspace(0, 1, 5)),
    ("eye", lambda **k: tape.eye(2, 3, **k), np.eye(2, 3)),
    ("tensor", lambda **k: tape.tensor([1.0, 2.0], **k), np.array([1.0, 2.0])),
    ("randn", lambda **k: tape.randn(2, 3, **k), None),
    ("rand", lambda **k: tape.rand(2, 3, **k), None),
    ("normal", lambda **k: tape.normal(0.0, 1.0, (2, 3), **k), None),
]


@pytest.mark.parametrize("name,make,ref", DTYPED, ids=[d[0] for d in DTYPED])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("device", [None, "cpu", "device"])
def test_constructors_dtype_and_device(name, make, ref, dtype, device):
    dt = getattr(tape, dtype)
    kw = {"dtype": dt}
    if device == "device":
        kw["device"] = tape.device("cpu")
    elif device is not None:
        kw["device"] = device
    x = make(**kw)
    assert x.dtype == np.dtype(dtype)
    assert x.device == "cpu"
    if ref is not None:
        np.testing.assert_allclose(x.numpy(), ref.astype(dtype), rtol=1e-6)


def test_like_and_normal_follow_float32_inputs():
    f = tape.zeros(2, 3, dtype=tape.float32)
    for y in [
        tape.randn_like(f),
        tape.rand_like(f),
        tape.zeros_like(f),
        tape.ones_like(f),
        tape.empty_like(f),
        tape.full_like(f, 2.0),
        tape.normal(f, 1.0),
        tape.normal(0.0, f + 1.0),
    ]:
        assert y.dtype == np.float32 and y.shape == (2, 3)
    assert tape.randn_like(f, dtype=tape.float64).dtype == np.float64
    assert tape.rand_like(tape.zeros(2, dtype=tape.long)).dtype == tape.get_default_dtype()


def test_integer_dtypes_in_constructors():
    assert tape.zeros(3, dtype=tape.long).dtype == np.int64
    assert tape.arange(5).dtype == np.int64
    assert tape.full((2,), 3).dtype == np.int64  # an int fill gives an integer tensor
    assert tape.tensor([True, False], dtype=tape.bool).dtype == np.bool_
    assert tape.ones(2, dtype=tape.bool).numpy().tolist() == [True, True]


def test_default_dtype_is_float64():
    assert tape.get_default_dtype() == np.float64
    assert tape.tensor(1.5).dtype == np.float64
    assert tape.randn(2).dtype == np.float64
    assert tape.zeros(2).dtype == np.float64


def test_set_default_dtype_float32(default_float32):
    assert tape.get_default_dtype() == np.float32
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    cases = {
        "tensor(float)": (tape.tensor(1.5), f32),
        "tensor(list of floats)": (tape.tensor([1.0, 2.0]), f32),
        "tensor(nested floats)": (tape.tensor([[1.0], [2.5]]), f32),
        "tensor(ints)": (tape.tensor([1, 2]), i64),
        "tensor(float64 ndarray)": (tape.tensor(np.array([1.0])), np.dtype(np.float64)),
        "tensor(dtype=float64)": (tape.tensor([1.0], dtype=tape.float64), np.dtype(np.float64)),
        "zeros": (tape.zeros(2), f32),
        "ones": (tape.ones(2, 2), f32),
        "empty": (tape.empty(3), f32),
        "eye": (tape.eye(2), f32),
        "full(float)": (tape.full((2,), 1.5), f32),
        "full(int)": (tape.full((2,), 1), i64),
        "linspace": (tape.linspace(0, 1, 5), f32),
        "arange(floats)": (tape.arange(0.0, 1.0, 0.25), f32),
        "arange(float step)": (tape.arange(0, 1, 0.25), f32),
        "arange(ints)": (tape.arange(4), i64),
        "randn": (tape.randn(3), f32),
        "rand": (tape.rand(3), f32),
        "normal": (tape.normal(0.0, 1.0, (3,)), f32),
        "randn(dtype=float64)": (tape.randn(3, dtype=tape.float64), np.dtype(np.float64)),
    }
    wrong = {k: (x.dtype, want) for k, (x, want) in cases.items() if x.dtype != want}
    assert not wrong
    np.testing.assert_allclose(tape.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5), rtol=1e-7)
    # Python floats in arithmetic do not widen float32 tensors
    assert (tape.ones(2) * 2.5).dtype == f32


def test_set_default_dtype_restores_and_rejects():
    prev = tape.get_default_dtype()
    try:
        tape.set_default_dtype(tape.float32)
        tape.set_default_dtype(tape.float64)
        assert tape.get_default_dtype() == np.float64
        assert tape.tensor(0.5).dtype == np.float64
        with pytest.raises(TypeError):
            tape.set_default_dtype(tape.int64)
        assert tape.get_default_dtype() == np.float64
    finally:
        tape.set_default_dtype(prev)


def test_dtype_aliases():
    assert tape.float == np.float32
    assert tape.double == np.float64
    assert tape.long == np.int64
    assert tape.int == np.int32
    assert tape.bool == np.bool_
    assert tape.tensor([1.0], dtype=tape.float).dtype == np.float32
    assert tape.tensor([1.0], dtype=tape.double).dtype == np.float64
    assert tape.tensor([1.7], dtype=tape.long).dtype == np.int64
    x = tape.tensor([1.0, 2.0])
    assert x.float().dtype == np.float32 and x.double().dtype == np.float64


@pytest.mark.parametrize("name", ["half", "float16", "bfloat16"])
def test_half_precision_raises_type_error(name):
    with pytest.raises(TypeError, match="float32"):
        getattr(tape, name)


def test_device_objects():
    d = tape.device("cpu")
    assert d == "cpu" and d == tape.device("cpu") and d == tape.device(d)
    assert d != "cuda" and d != tape.device("cuda")
    assert d.type == "cpu" and d.index is None
    assert str(d) == "cpu" and repr(d) == "device(type='cpu')"
    assert hash(d) == hash(tape.device("cpu"))
    c = tape.device("cuda:1")  # naming a device is fine; putting tensors there is not
    assert c.type == "cuda" and c.index == 1 and str(c) == "cuda:1"
    assert tape.device("cuda", 0) == "cuda:0"
    with pytest.raises(RuntimeError):
        tape.device("tpu")
    x = tape.randn(3)
    assert x.device == "cpu" and x.device == tape.device("cpu") and x.device.type == "cpu"
    assert not x.is_cuda
    assert tape.get_default_device() == "cpu"
    tape.set_default_device("cpu")
    tape.set_default_device(tape.device("cpu"))
    assert tape.get_default_device() == "cpu"


def test_tensor_to():
    x = tape.tensor([1.0, 2.5, -3.0])
    assert x.to("cpu") is x
    assert x.to(tape.device("cpu")) is x
    assert x.cpu() is x
    assert x.to(tape.float64) is x
    for y in [
        x.to(tape.float32),
        x.to("cpu", tape.float32),
        x.to(tape.device("cpu"), tape.float32),
        x.to(tape.zeros(1, dtype=tape.float32)),
        x.to(dtype=tape.float32),
        x.to(device="cpu", dtype=tape.float32),
        x.type_as(tape.zeros(1, dtype=tape.float32)),
    ]:
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y.numpy(), np.float32([1.0, 2.5, -3.0]))
    i = x.to(tape.long)
    assert i.dtype == np.int64 and i.numpy().tolist() == [1, 2, -3]
    z = x.to(tape.float64, copy=True)
    assert z is not x
    z.fill_(0.0)
    assert x.numpy().tolist() == [1.0, 2.5, -3.0]


def test_to_float32_is_differentiable():
    torch = pytest.importorskip("torch")
    a = np.array([0.3, -1.2, 2.0])
    x = tape.tensor(a, requires_grad=True)
    tx = torch.tensor(a, requires_grad=True)
    y, ty = x.to(tape.float32), tx.to(torch.float32)
    assert y.requires_grad and not y.is_leaf
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)


CUDA_CALLS = {
    "zeros": lambda x: tape.zeros(2, device="cuda"),
    "ones": lambda x: tape.ones(2, device="cuda:0"),
    "empty": lambda x: tape.empty(2, device=tape.device("cuda")),
    "full": lambda x: tape.full((2,), 1.0, device="cuda"),
    "tensor": lambda x: tape.tensor([1.0], device="cuda"),
    "arange": lambda x: tape.arange(3, device="cuda"),
    "linspace": lambda x: tape.linspace(0, 1, 3, device="cuda"),
    "eye": lambda x: tape.eye(2, device="cuda"),
    "zeros_like": lambda x: tape.zeros_like(x, device="cuda"),
    "randn": lambda x: tape.randn(2, device="cuda"),
    "rand": lambda x: tape.rand(2, device="cuda"),
    "randint": lambda x: tape.randint(0, 3, (2,), device="cuda"),
    "normal": lambda x: tape.normal(0.0, 1.0, (2,), device="cuda"),
    "randn_like": lambda x: tape.randn_like(x, device="cuda"),
    "rand_like": lambda x: tape.rand_like(x, device="cuda"),
    "Generator": lambda x: tape.Generator(device="cuda"),
    "to(str)": lambda x: x.to("cuda"),
    "to(device=)": lambda x: x.to(device="cuda"),
    "to(device obj, dtype)": lambda x: x.to(tape.device("cuda:0"), tape.float32),
    "cuda()": lambda x: x.cuda(),
    "set_default_device": lambda x: tape.set_default_device("cuda"),
}


@pytest.mark.parametrize("name", list(CUDA_CALLS))
def test_cuda_raises_pointing_to_recorded_tapes(name):
    x = tape.randn(2)
    with pytest.raises(RuntimeError, match=r"Tape\.to|t\.to\('cuda'\)") as e:
        CUDA_CALLS[name](x)
    assert "record" in str(e.value)
    assert tape.get_default_device() == "cpu"


def test_accelerator():
    assert tape.accelerator.is_available() is False
    assert tape.accelerator.current_accelerator() is None
    assert tape.accelerator.device_count() == 0
    # the usual PyTorch idiom picks the CPU
    acc = tape.accelerator.current_accelerator()
    dev = acc if tape.accelerator.is_available() else tape.device("cpu")
    assert tape.zeros(2, device=dev).device == "cpu"


# ================================================================ 2. methods vs torch

SHAPE = (3, 4)
# (id, fn(m, *tensors) with m the module: tape or torch, input shapes, finite-difference check)
METHODS = [
    ("pow3", lambda m, x: x.pow(3), [SHAPE], True),
    ("pow2", lambda m, x: x.pow(2), [SHAPE], True),
    ("pow_half", lambda m, x: (x.abs() + 0.5).pow(0.5), [SHAPE], True),
    ("pow_tensor", lambda m, x, y: (x.abs() + 0.5).pow(y), [SHAPE, SHAPE], True),
    ("t_2d", lambda m, x: x.t(), [SHAPE], True),
    ("t_1d", lambda m, x: x.t(), [(4,)], True),
    ("mm", lambda m, a, b: a.mm(b), [(3, 4), (4, 2)], True),
    ("mv", lambda m, a, v: a.mv(v), [(3, 4), (4,)], True),
    ("bmm", lambda m, a, b: a.bmm(b), [(2, 3, 4), (2, 4, 5)], True),
    ("matmul_2d", lambda m, a, b: a.matmul(b), [(3, 4), (4, 2)], True),
    ("matmul_bcast", lambda m, a, b: a.matmul(b), [(2, 3, 4), (4, 5)], True),
    ("matmul_vec", lambda m, a, b: a.matmul(b), [(4,), (4,)], True),
    ("matmul_vec_mat", lambda m, a, b: a.matmul(b), [(3,), (3, 4)], True),
    ("clamp_both", lambda m, x: x.clamp(min=-0.5, max=0.5), [SHAPE], True),
    ("clamp_min", lambda m, x: x.clamp(min=0.1), [SHAPE], True),
    ("clamp_max", lambda m, x: x.clamp(max=-0.2), [SHAPE], True),
    ("clamp_pos", lambda m, x: x.clamp(-0.3, 0.4), [SHAPE], True),
    ("clip", lambda m, x: x.clip(min=-0.3, max=0.4), [SHAPE], True),
    ("clamp_tensor_bounds", lambda m, x, lo: x.clamp(min=lo, max=lo + 1.0), [SHAPE, SHAPE], False),
    ("add_alpha", lambda m, x, y: x.add(y, alpha=2.5), [SHAPE, SHAPE], True),
    ("add_scalar_alpha", lambda m, x: x.add(1.5, alpha=-2), [SHAPE], True),
    ("add_bcast_alpha", lambda m, x, y: x.add(y, alpha=0.5), [SHAPE, (4,)], True),
    ("add_plain", lambda m, x, y: x.add(y), [SHAPE, SHAPE], True),
    ("sub_alpha", lambda m, x, y: x.sub(y, alpha=3), [SHAPE, SHAPE], True),
    ("sub_bcast", lambda m, x, y: x.sub(y), [SHAPE, (3, 1)], True),
    ("mul", lambda m, x, y: x.mul(y), [SHAPE, SHAPE], True),
    ("mul_scalar", lambda m, x: x.mul(2.5), [SHAPE], True),
    ("div", lambda m, x, y: x.div(y.abs() + 0.5), [SHAPE, SHAPE], True),
    ("div_scalar", lambda m, x: x.div(4.0), [SHAPE], True),
    ("neg", lambda m, x: x.neg(), [SHAPE], True),
    ("exp", lambda m, x: x.exp(), [SHAPE], True),
    ("log", lambda m, x: (x.abs() + 0.1).log(), [SHAPE], True),
    ("sqrt", lambda m, x: (x.abs() + 0.1).sqrt(), [SHAPE], True),
    ("abs", lambda m, x: x.abs(), [SHAPE], True),
    ("sum_all", lambda m, x: x.sum(), [SHAPE], True),
    ("sum_dim", lambda m, x: x.sum(1), [SHAPE], True),
    ("sum_dim_keepdim_kw", lambda m, x: x.sum(dim=1, keepdim=True), [SHAPE], True),
    ("sum_dim_keepdim_pos", lambda m, x: x.sum(0, True), [SHAPE], True),
    ("sum_neg_dim", lambda m, x: x.sum(-1), [(2, 3, 4)], True),
    ("sum_dim_tuple", lambda m, x: x.sum(dim=(0, 2)), [(2, 3, 4)], True),
    ("mean_all", lambda m, x: x.mean(), [SHAPE], True),
    ("mean_dim", lambda m, x: x.mean(0), [SHAPE], True),
    ("mean_dim_keepdim", lambda m, x: x.mean(dim=-1, keepdim=True), [SHAPE], True),
    ("mean_dim_tuple", lambda m, x: x.mean(dim=(1, 2), keepdim=True), [(2, 3, 4)], True),
    ("var_default", lambda m, x: x.var(), [SHAPE], True),
    ("var_dim", lambda m, x: x.var(1), [SHAPE], True),
    ("var_dim_keepdim", lambda m, x: x.var(dim=0, keepdim=True), [SHAPE], True),
    ("var_unbiased_false", lambda m, x: x.var(unbiased=False), [SHAPE], True),
    ("var_unbiased_true", lambda m, x: x.var(unbiased=True), [SHAPE], True),
    ("var_correction0", lambda m, x: x.var(correction=0), [SHAPE], True),
    ("var_correction2_dim", lambda m, x: x.var(dim=1, correction=2), [SHAPE], True),
    ("var_positional", lambda m, x: x.var(1, False, True), [SHAPE], True),
    ("var_dim_tuple", lambda m, x: x.var(dim=(0, 2)), [(2, 3, 4)], True),
    ("std_default", lambda m, x: x.std(), [SHAPE], True),
    ("std_dim", lambda m, x: x.std(0), [SHAPE], True),
    ("std_dim_keepdim", lambda m, x: x.std(dim=1, keepdim=True), [SHAPE], True),
    ("std_unbiased_false", lambda m, x: x.std(unbiased=False), [SHAPE], True),
    ("std_correction0_dim", lambda m, x: x.std(dim=-1, correction=0), [SHAPE], True),
    ("max_all", lambda m, x: x.max(), [SHAPE], True),
    ("min_all", lambda m, x: x.min(), [SHAPE], True),
    ("max_dim", lambda m, x: x.max(1), [SHAPE], False),
    ("max_dim_keepdim", lambda m, x: x.max(dim=0, keepdim=True), [SHAPE], False),
    ("min_dim", lambda m, x: x.min(-1), [SHAPE], False),
    ("min_dim_keepdim_pos", lambda m, x: x.min(1, True), [(2, 3, 4)], False),
    ("max_other", lambda m, x, y: x.max(y), [SHAPE, SHAPE], True),
    ("min_other", lambda m, x, y: x.min(y), [SHAPE, SHAPE], True),
    ("max_other_bcast", lambda m, x, y: x.max(y), [SHAPE, (4,)], True),
    ("argmax_all", lambda m, x: x.argmax(), [SHAPE], False),
    ("argmax_dim", lambda m, x: x.argmax(1), [SHAPE], False),
    ("argmax_keepdim", lambda m, x: x.argmax(dim=0, keepdim=True), [SHAPE], False),
    ("argmax_all_keepdim", lambda m, x: x.argmax(keepdim=True), [SHAPE], False),
    ("argmin_all", lambda m, x: x.argmin(), [SHAPE], False),
    ("argmin_dim", lambda m, x: x.argmin(dim=-1), [(2, 3, 4)], False),
    ("argmin_keepdim", lambda m, x: x.argmin(1, True), [SHAPE], False),
    ("view_flat", lambda m, x: x.view(-1), [SHAPE], True),
    ("view_minus1", lambda m, x: x.view(2, -1), [SHAPE], True),
    ("view_tuple", lambda m, x: x.view((4, 3)), [SHAPE], True),
    ("view_lead_minus1", lambda m, x: x.view(-1, 2, 2), [SHAPE], True),
    ("view_as", lambda m, x, y: x.view_as(y), [SHAPE, (2, 6)], True),
    ("expand_minus1", lambda m, x: x.expand(-1, 5), [(3, 1)], True),
    ("expand_new_lead", lambda m, x: x.expand(2, 3, 4), [SHAPE], True),
    ("expand_new_lead_minus1", lambda m, x: x.expand(2, -1, -1), [SHAPE], True),
    ("expand_tuple", lambda m, x: x.expand((2, 3, 4)), [(1, 4)], True),
    ("expand_as", lambda m, x, y: x.expand_as(y), [(1, 4), SHAPE], True),
    ("expand_0d", lambda m, x: x.expand(3, 2), [()], True),
    ("max_dim_1d", lambda m, x: x.max(0), [(5,)], False),
    ("min_dim_0d", lambda m, x: x.min(0), [()], False),
    ("argmax_0d", lambda m, x: x.argmax(), [()], False),
    ("permute", lambda m, x: x.permute(2, 0, 1), [(2, 3, 4)], True),
    ("permute_tuple", lambda m, x: x.permute((1, 0, 2)), [(2, 3, 4)], True),
    ("contiguous", lambda m, x: x.permute(1, 0).contiguous(), [SHAPE], True),
    ("clone", lambda m, x: x.clone() * 2.0, [SHAPE], True),
    ("clone_of_view", lambda m, x: x[1:].clone().exp(), [SHAPE], True),
    ("type_as", lambda m, x: x.type_as(m.zeros(1, dtype=m.float32)), [SHAPE], False),
    ("type_as_f64", lambda m, x, y: x.type_as(y), [SHAPE, (2,)], True),
    # function forms
    ("fn_add_alpha", lambda m, x, y: m.add(x, y, alpha=2), [SHAPE, SHAPE], True),
    ("fn_sub_alpha", lambda m, x, y: m.sub(x, y, alpha=-1.5), [SHAPE, SHAPE], True),
    ("fn_mul", lambda m, x, y: m.mul(x, y), [SHAPE, (4,)], True),
    ("fn_mm", lambda m, a, b: m.mm(a, b), [(3, 4), (4, 2)], True),
    ("fn_mv", lambda m, a, b: m.mv(a, b), [(3, 4), (4,)], True),
    ("fn_bmm", lambda m, a, b: m.bmm(a, b), [(2, 3, 4), (2, 4, 5)], True),
    ("fn_matmul", lambda m, a, b: m.matmul(a, b), [(2, 3, 4), (2, 4, 5)], True),
    ("fn_t", lambda m, x: m.t(x), [SHAPE], True),
    ("fn_permute", lambda m, x: m.permute(x, (2, 0, 1)), [(2, 3, 4)], True),
    ("fn_clamp", lambda m, x: m.clamp(x, min=-0.5, max=0.5), [SHAPE], True),
    ("fn_max_all", lambda m, x: m.max(x), [SHAPE], True),
    ("fn_max_dim", lambda m, x: m.max(x, 1), [SHAPE], False),
    ("fn_max_dim_kw", lambda m, x: m.max(x, dim=1, keepdim=True), [SHAPE], False),
    ("fn_min_dim", lambda m, x: m.min(x, 0), [SHAPE], False),
    (
        "fn_max_axis_values_only",
        lambda m, x: m.max(x, axis=1) if m is tape else m.amax(x, 1),
        [SHAPE],
        True,
    ),
    (
        "fn_min_axis_keepdims",
        lambda m, x: m.min(x, axis=0, keepdims=True) if m is tape else m.amin(x, 0, True),
        [SHAPE],
        True,
    ),
    ("fn_max_other", lambda m, x, y: m.max(x, y), [SHAPE, SHAPE], True),
    ("fn_min_other", lambda m, x, y: m.min(x, y), [SHAPE, SHAPE], True),
    ("fn_argmax_dim", lambda m, x: m.argmax(x, dim=1), [SHAPE], False),
    ("fn_argmin_all", lambda m, x: m.argmin(x), [SHAPE], False),
    ("fn_sum_dim", lambda m, x: m.sum(x, dim=1, keepdim=True), [SHAPE], True),
    ("fn_mean_dim", lambda m, x: m.mean(x, dim=0), [SHAPE], True),
    ("fn_amax", lambda m, x: m.amax(x, dim=(0, 1)), [(2, 3, 4)], True),
]
METHOD_IDS = [c[0] for c in METHODS]


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _run_case(m, fn, arrays, seed):
    """Values of ``fn`` on ``arrays`` under library ``m`` and the gradients of a random
    projection of its floating outputs."""
    ts = [m.tensor(a, requires_grad=True) for a in arrays]
    out = fn(m, *ts)
    outs = list(out) if isinstance(out, tuple) else [out]
    vals = [_np(o) for o in outs]
    rng = np.random.default_rng(seed + 1)
    loss = None
    for o, v in zip(outs, vals):
        if v.dtype.kind == "f" and o.requires_grad:
            w = m.tensor(rng.standard_normal(v.shape), dtype=m.float64)
            term = (o * w).sum()
            loss = term if loss is None else loss + term
    if loss is not None:
        loss.backward()
    return out, vals, [None if t.grad is None else _np(t.grad) for t in ts]


@pytest.mark.parametrize("case", METHODS, ids=METHOD_IDS)
def test_method_matches_torch(case):
    torch = pytest.importorskip("torch")
    name, fn, shapes, _ = case
    arrays = _inputs(shapes, zlib.crc32(name.encode()))
    out, vals, grads = _run_case(tape, fn, arrays, 0)
    t_out, t_vals, t_grads = _run_case(torch, fn, arrays, 0)
    assert isinstance(out, tuple) == isinstance(t_out, tuple)
    assert len(vals) == len(t_vals)
    for v, tv in zip(vals, t_vals):
        assert v.shape == tv.shape
        assert v.dtype == tv.dtype, (v.dtype, tv.dtype)
        if v.dtype.kind == "f":
            np.testing.assert_allclose(v, tv, rtol=1e-6 if v.dtype == np.float32 else 1e-12,
                                       atol=1e-13)  # fmt: skip
        else:
            np.testing.assert_array_equal(v, tv)
    single = any(v.dtype == np.float32 for v in vals)  # gradients rounded through float32
    for k, (g, tg) in enumerate(zip(grads, t_grads)):
        assert (g is None) == (tg is None), f"input {k}: grad {g} vs torch {tg}"
        if g is not None:
            assert g.shape == tg.shape
            np.testing.assert_allclose(g, tg, rtol=1e-6 if single else 1e-10, atol=1e-12)


FD_CASES = [c for c in METHODS if c[3]]


@pytest.mark.parametrize("case", FD_CASES, ids=[c[0] for c in FD_CASES])
def test_method_gradient_matches_finite_differences(case):
    name, fn, shapes, _ = case
    arrays = _inputs(shapes, zlib.crc32(name.encode()))
    assert tape.gradcheck(lambda *ts: fn(tape, *ts), *arrays, n_points=1)


# NumPy references for the reductions whose PyTorch defaults differ from NumPy's (no torch)
X34 = np.random.default_rng(11).standard_normal((3, 4))
REDUCTIONS = [
    (lambda x: x.var(), lambda a: np.var(a, ddof=1)),
    (lambda x: x.var(1), lambda a: np.var(a, 1, ddof=1)),
    (lambda x: x.var(0, keepdim=True), lambda a: np.var(a, 0, ddof=1, keepdims=True)),
    (lambda x: x.var(unbiased=False), lambda a: np.var(a)),
    (lambda x: x.var(dim=1, correction=0), lambda a: np.var(a, 1)),
    (lambda x: x.var(dim=1, correction=3), lambda a: np.var(a, 1, ddof=3)),
    (lambda x: x.std(), lambda a: np.std(a, ddof=1)),
    (lambda x: x.std(dim=0, unbiased=False), lambda a: np.std(a, 0)),
    (lambda x: x.std(1, True, True), lambda a: np.std(a, 1, ddof=1, keepdims=True)),
    (lambda x: x.sum(dim=1, keepdim=True), lambda a: a.sum(1, keepdims=True)),
    (lambda x: x.mean(dim=0), lambda a: a.mean(0)),
    (lambda x: x.max(), lambda a: a.max()),
    (lambda x: x.min(), lambda a: a.min()),
    (lambda x: x.max(1).values, lambda a: a.max(1)),
    (lambda x: x.max(1).indices, lambda a: a.argmax(1)),
    (lambda x: x.max(dim=1, keepdim=True)[0], lambda a: a.max(1, keepdims=True)),
    (lambda x: x.max(dim=1, keepdim=True)[1], lambda a: a.argmax(1, keepdims=True)),
    (lambda x: x.min(0).values, lambda a: a.min(0)),
    (lambda x: x.min(0).indices, lambda a: a.argmin(0)),
    (lambda x: x.argmax(), lambda a: a.argmax()),
    (lambda x: x.argmax(dim=1, keepdim=True), lambda a: a.argmax(1, keepdims=True)),
    (lambda x: x.argmin(0), lambda a: a.argmin(0)),
    (lambda x: x.argmin(keepdim=True), lambda a: np.reshape(a.argmin(), (1, 1))),
    (lambda x: tape.max(x, axis=1), lambda a: a.max(1)),
    (lambda x: tape.max(x, 0).values, lambda a: a.max(0)),
    (lambda x: tape.max(x, -x), lambda a: np.maximum(a, -a)),
    (lambda x: x.min(x[::-1]), lambda a: np.minimum(a, a[::-1])),
]


@pytest.mark.parametrize("k", range(len(REDUCTIONS)))
def test_reduction_matches_numpy(k):
    fn, ref = REDUCTIONS[k]
    got = fn(tape.tensor(X34))
    want = np.asarray(ref(X34))
    assert got.shape == want.shape
    if want.dtype.kind in "iu":
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got.numpy(), want)
    else:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_max_with_dim_returns_values_and_indices():
    x = tape.tensor(X34, requires_grad=True)
    r = x.max(1)
    values, indices = r  # unpacks like a tuple
    assert r.values is values and r.indices is indices and r[0] is values and r[1] is indices
    assert values.requires_grad and not indices.requires_grad
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(indices.numpy(), X34.argmax(1))
    r2 = tape.min(x, dim=0, keepdim=True)
    assert r2.values.shape == (1, 4) and r2.indices.shape == (1, 4)
    # the gradient of the values goes to the positions in indices
    values.sum().backward()
    want = np.zeros_like(X34)
    want[np.arange(3), X34.argmax(1)] = 1.0
    np.testing.assert_array_equal(x.grad.numpy(), want)
    # max(x, axis=...) is NumPy's: values only
    v = tape.max(x, axis=1)
    assert isinstance(v, tape.Tensor) and v.shape == (3,)
    # dim and axis together are ambiguous
    with pytest.raises(TypeError):
        tape.max(x, 1, axis=1)


def test_max_dim_gradient_with_ties_goes_to_index_like_torch():
    x = tape.tensor([[1.0, 1.0, 0.5]], requires_grad=True)
    x.max(1).values.sum().backward()
    # torch: tensor([[1., 0., 0.]])  (the element at indices[0] == 0)
    np.testing.assert_array_equal(x.grad.numpy(), [[1.0, 0.0, 0.0]])


def test_size_numel_dim():
    x = tape.zeros(2, 3, 4)
    assert x.numel() == 24 and x.size() == (2, 3, 4)
    assert x.size(0) == 2 and x.size(1) == 3 and x.size(-1) == 4 and x.size(dim=2) == 4
    assert x.dim() == 3 and x.ndim == 3
    assert tape.zeros(()).numel() == 1 and tape.zeros(()).size() == ()
    assert tape.zeros(0, 3).numel() == 0


def test_size_matches_torch():
    torch = pytest.importorskip("torch")
    x, tx = tape.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    assert tuple(tx.size()) == x.size()
    for d in (0, 1, 2, -1, -3):
        assert tx.size(d) == x.size(d)
    assert tx.numel() == x.numel()


def test_expand_errors():
    x = tape.zeros(3, 4)
    with pytest.raises(RuntimeError):
        x.expand(4)  # fewer sizes than dimensions
    with pytest.raises(RuntimeError):
        x.expand(-1, 3, 4)  # -1 in a new leading dimension
    with pytest.raises((RuntimeError, ValueError)):
        x.expand(3, 5)  # a non-singleton dimension cannot grow


def test_matrix_shape_errors():
    a = tape.zeros(2, 3)
    with pytest.raises(RuntimeError):
        a.mm(tape.zeros(3))
    with pytest.raises(RuntimeError):
        a.mv(tape.zeros(3, 1))
    with pytest.raises(RuntimeError):
        tape.bmm(tape.zeros(2, 2, 3), tape.zeros(3, 3, 2))
    with pytest.raises(RuntimeError):
        tape.zeros(2, 2, 2).t()


def test_clone_owns_memory_and_passes_gradient():
    x = tape.tensor([1.0, 2.0, 3.0], requires_grad=True)
    c = x.clone()
    assert c.requires_grad and not c.is_leaf
    (c * c * c).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.array([1.0, 2.0, 3.0]) ** 2)
    p = tape.tensor([1.0, 2.0])
    q = p.clone()
    q.fill_(7.0)
    assert p.numpy().tolist() == [1.0, 2.0]
    with tape.no_grad():
        d = x.clone()
    assert not d.requires_grad
    d.zero_()
    assert x.numpy().tolist() == [1.0, 2.0, 3.0]


def test_div_rounding_mode_raises():
    with pytest.raises(NotImplementedError):
        tape.tensor([1.0]).div(2.0, rounding_mode="floor")


# ================================================================ 3. in-place on leaves

Y3 = np.array([0.5, -2.0, 4.0])
INPLACE = [
    ("add_", lambda x: x.add_(tape.tensor(Y3)), lambda v: v + Y3),
    ("add_alpha", lambda x: x.add_(tape.tensor(Y3), alpha=2), lambda v: v + 2 * Y3),
    ("add_scalar", lambda x: x.add_(1.5), lambda v: v + 1.5),
    ("sub_", lambda x: x.sub_(tape.tensor(Y3)), lambda v: v - Y3),
    ("sub_alpha", lambda x: x.sub_(tape.tensor(Y3), alpha=0.5), lambda v: v - 0.5 * Y3),
    ("mul_", lambda x: x.mul_(tape.tensor(Y3)), lambda v: v * Y3),
    ("mul_scalar", lambda x: x.mul_(3.0), lambda v: v * 3.0),
    ("div_", lambda x: x.div_(tape.tensor(Y3)), lambda v: v / Y3),
    ("div_scalar", lambda x: x.div_(4.0), lambda v: v / 4.0),
    ("copy_", lambda x: x.copy_(tape.tensor(Y3)), lambda v: Y3.copy()),
    ("copy_bcast", lambda x: x.copy_(tape.tensor(2.5)), lambda v: np.full(3, 2.5)),
    ("copy_numpy", lambda x: x.copy_(Y3), lambda v: Y3.copy()),
    ("fill_", lambda x: x.fill_(-1.25), lambda v: np.full(3, -1.25)),
    ("fill_tensor", lambda x: x.fill_(tape.tensor(0.75)), lambda v: np.full(3, 0.75)),
    ("zero_", lambda x: x.zero_(), lambda v: np.zeros(3)),
    ("clamp_", lambda x: x.clamp_(min=-0.5, max=0.5), lambda v: np.clip(v, -0.5, 0.5)),
    ("clamp_min", lambda x: x.clamp_(min=0.0), lambda v: np.maximum(v, 0.0)),
    ("clamp_max", lambda x: x.clamp_(max=-0.1), lambda v: np.minimum(v, -0.1)),
    ("clip_", lambda x: x.clip_(-1.0, 1.0), lambda v: np.clip(v, -1.0, 1.0)),
    ("iadd", lambda x: x.__iadd__(tape.tensor(Y3)), lambda v: v + Y3),
    ("imul", lambda x: x.__imul__(2.0), lambda v: v * 2.0),
]
X3 = np.array([1.0, -0.25, 3.0])


@pytest.mark.parametrize("name,op,ref", INPLACE, ids=[c[0] for c in INPLACE])
def test_inplace_on_leaf_under_no_grad(name, op, ref):
    x = tape.tensor(X3, requires_grad=True)
    with tape.no_grad():
        r = op(x)
    assert r is x
    assert x.requires_grad and x.is_leaf and x.dtype == np.float64
    np.testing.assert_allclose(x.numpy(), ref(X3.copy()), rtol=1e-15)
    # the new value is what the next graph sees
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * ref(X3.copy()), rtol=1e-15)


SPELLED_IN_TORCH = [c for c in INPLACE if c[0] not in ("iadd", "imul", "copy_numpy")]


@pytest.mark.parametrize("name,op,ref", SPELLED_IN_TORCH, ids=[c[0] for c in SPELLED_IN_TORCH])
def test_inplace_matches_torch(name, op, ref):
    torch = pytest.importorskip("torch")
    tx = torch.tensor(X3, requires_grad=True)
    tt = torch.tensor
    ops = {
        "add_": lambda t: t.add_(tt(Y3)),
        "add_alpha": lambda t: t.add_(tt(Y3), alpha=2),
        "add_scalar": lambda t: t.add_(1.5),
        "sub_": lambda t: t.sub_(tt(Y3)),
        "sub_alpha": lambda t: t.sub_(tt(Y3), alpha=0.5),
        "mul_": lambda t: t.mul_(tt(Y3)),
        "mul_scalar": lambda t: t.mul_(3.0),
        "div_": lambda t: t.div_(tt(Y3)),
        "div_scalar": lambda t: t.div_(4.0),
        "copy_": lambda t: t.copy_(tt(Y3)),
        "copy_bcast": lambda t: t.copy_(tt(2.5)),
        "fill_": lambda t: t.fill_(-1.25),
        "fill_tensor": lambda t: t.fill_(tt(0.75)),
        "zero_": lambda t: t.zero_(),
        "clamp_": lambda t: t.clamp_(min=-0.5, max=0.5),
        "clamp_min": lambda t: t.clamp_(min=0.0),
        "clamp_max": lambda t: t.clamp_(max=-0.1),
        "clip_": lambda t: t.clip_(-1.0, 1.0),
    }
    with torch.no_grad():
        ops[name](tx)
    x = tape.tensor(X3, requires_grad=True)
    with tape.no_grad():
        op(x)
    np.testing.assert_allclose(x.numpy(), tx.detach().numpy(), rtol=1e-15)


RANDOM_INPLACE = [
    ("normal_", lambda x: x.normal_()),
    ("normal_args", lambda x: x.normal_(3.0, 2.0)),
    ("uniform_", lambda x: x.uniform_()),
    ("uniform_args", lambda x: x.uniform_(-2.0, 5.0)),
    ("uniform_torch_kw", lambda x: x.uniform_(from_=-2.0, to=5.0)),
]


@pytest.mark.parametrize("name,op", RANDOM_INPLACE, ids=[c[0] for c in RANDOM_INPLACE])
def test_random_inplace(name, op):
    x = tape.zeros(N_STAT, requires_grad=True)
    tape.manual_seed(21)
    with tape.no_grad():
        assert op(x) is x
    v = x.numpy().copy()
    assert x.requires_grad and x.is_leaf
    if name == "normal_":
        assert abs(v.mean()) < 0.02 and abs(v.std() - 1) < 0.02
    elif name == "normal_args":
        assert abs(v.mean() - 3) < 0.04 and abs(v.std() - 2) < 0.04
    elif name == "uniform_":
        assert v.min() >= 0 and v.max() < 1 and abs(v.mean() - 0.5) < 0.01
    else:
        assert v.min() >= -2 and v.max() < 5 and abs(v.mean() - 1.5) < 0.05
        assert abs(v.var() - 49 / 12) < 0.1
    # reproducible after manual_seed, and with a generator
    tape.manual_seed(21)
    with tape.no_grad():
        op(x)
    np.testing.assert_array_equal(x.numpy(), v)


def test_random_inplace_generator():
    g = tape.Generator().manual_seed(5)
    a = tape.zeros(10)
    a.normal_(generator=g)
    g.manual_seed(5)
    b = tape.zeros(10).normal_(generator=g)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    g.manual_seed(6)
    c = tape.zeros(10).uniform_(generator=g)
    g.manual_seed(6)
    np.testing.assert_array_equal(c.numpy(), tape.zeros(10).uniform_(generator=g).numpy())


ALL_INPLACE = INPLACE + [(n, op, None) for n, op in RANDOM_INPLACE]


@pytest.mark.parametrize("name,op,ref", ALL_INPLACE, ids=[c[0] for c in ALL_INPLACE])
def test_inplace_raises_on_leaf_requiring_grad_in_grad_mode(name, op, ref):
    x = tape.tensor(X3, requires_grad=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        op(x)
    np.testing.assert_array_equal(x.numpy(), X3)  # untouched


IN_PLACE_ONLY = [c for c in ALL_INPLACE if c[0] not in ("iadd", "imul")]


@pytest.mark.parametrize("name", ["iadd", "imul"])
def test_augmented_assignment_on_a_non_leaf_rebinds(name):
    # x += y on a non-leaf makes a new tensor (out of place): the old one is untouched and the
    # gradient flows through both steps
    x = tape.tensor(X3, requires_grad=True)
    y = x * 2.0
    z = y
    if name == "iadd":
        z += tape.tensor(Y3)
        want, dz_dx = 2.0 * X3 + Y3, 2.0
    else:
        z *= 2.0
        want, dz_dx = 4.0 * X3, 4.0
    assert z is not y
    np.testing.assert_allclose(y.numpy(), 2.0 * X3, rtol=1e-15)
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-15)
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, dz_dx), rtol=1e-15)


@pytest.mark.parametrize("name,op,ref", IN_PLACE_ONLY, ids=[c[0] for c in IN_PLACE_ONLY])
@pytest.mark.parametrize("grad_mode", [True, False])
def test_inplace_raises_on_non_leaf(name, op, ref, grad_mode):
    x = tape.tensor(X3, requires_grad=True)
    y = x * 2.0
    assert not y.is_leaf
    with pytest.raises(RuntimeError):
        if grad_mode:
            op(y)
        else:
            with tape.no_grad():
                op(y)


@pytest.mark.parametrize("name,op,ref", INPLACE, ids=[c[0] for c in INPLACE])
def test_inplace_on_plain_tensor_in_grad_mode(name, op, ref):
    x = tape.tensor(X3)  # does not require grad: in-place is fine, as in PyTorch
    assert op(x) is x
    np.testing.assert_allclose(x.numpy(), ref(X3.copy()), rtol=1e-15)


def test_integer_inplace_with_float_raises():
    # torch: RuntimeError: result type Float can't be cast to the desired output type Long
    i = tape.tensor([1, 2])
    with pytest.raises((RuntimeError, TypeError)):
        i.add_(1.5)
    assert i.numpy().tolist() == [1, 2]
    with pytest.raises((RuntimeError, TypeError)):
        i.mul_(0.5)


VIEW_WRITES = [
    ("row", lambda x: x[1].fill_(1.0), lambda a: a.__setitem__(1, 1.0)),
    ("row_slice", lambda x: x[0:2].add_(5.0), lambda a: a.__setitem__(slice(0, 2), a[0:2] + 5)),
    (
        "inner_slice",
        lambda x: x[2, 1:3].mul_(3.0),
        lambda a: a.__setitem__((2, slice(1, 3)), a[2, 1:3] * 3),
    ),
    ("column", lambda x: x[:, 0].fill_(2.0), lambda a: a.__setitem__((slice(None), 0), 2.0)),
    (
        "strided",
        lambda x: x.view(-1)[::2].zero_(),
        lambda a: a.reshape(-1).__setitem__(slice(None, None, 2), 0.0),
    ),
    (
        "transpose",
        lambda x: x.t().add_(tape.arange(3.0)),
        lambda a: a.__iadd__(np.arange(3.0)[:, None]),
    ),
]


@pytest.mark.parametrize("name,write,ref", VIEW_WRITES, ids=[c[0] for c in VIEW_WRITES])
def test_inplace_through_a_view_writes_to_the_base(name, write, ref):
    # PyTorch: basic indexing, t() and view() give views, so in-place writes through them
    # change the base (the usual `w[:, 0].zero_()` in initialisation code). A copy that
    # silently drops the write is not acceptable; raising would be.
    a = np.arange(12.0).reshape(3, 4)
    x = tape.tensor(a, requires_grad=True)
    with tape.no_grad():
        try:
            write(x)
        except RuntimeError as e:  # tape's strided slices are copies: it refuses the write
            assert "copies, not views" in str(e)
            np.testing.assert_array_equal(x.numpy(), a)
            return
    want = a.copy()
    ref(want)
    np.testing.assert_array_equal(x.numpy(), want)


@pytest.mark.parametrize(
    "key,value",
    [
        ((slice(None), 0), 2.0),
        (1, np.array([9.0, 8.0, 7.0, 6.0])),
        ((slice(None, None, 2),), 0.0),
        ((np.array([0, 2]), 1), -1.0),
        (np.array([True, False, True]), 5.0),
    ],
)
def test_setitem_writes_into_a_leaf_under_no_grad(key, value):
    a = np.arange(12.0).reshape(3, 4)
    x = tape.tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        x[key] = value  # grad mode on: refused, as in PyTorch
    with tape.no_grad():
        x[key] = value
    want = a.copy()
    want[key] = value
    np.testing.assert_array_equal(x.numpy(), want)
    y = (x * x).sum()  # a later expression sees the new value
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * want)
    z = x * 2  # a tensor computed in the graph: a recorded update (tests/test_setitem.py)
    z[0, 0] = 1.0
    assert z.numpy()[0, 0] == 1.0 and z.grad_fn is not None


@pytest.mark.parametrize(
    "update,new",
    [
        (lambda w: w.mul_(10.0), lambda v: v * 10),
        (lambda w: w.add_(tape.ones(2), alpha=-3), lambda v: v - 3),
        (lambda w: w.sub_(0.5), lambda v: v - 0.5),
        (lambda w: w.copy_(tape.tensor([7.0, -1.0])), lambda v: np.array([7.0, -1.0])),
        (lambda w: w.fill_(4.0), lambda v: np.full(2, 4.0)),
        (lambda w: w.zero_(), lambda v: np.zeros(2)),
        (lambda w: w.clamp_(max=1.5), lambda v: np.minimum(v, 1.5)),
        (lambda w: w.normal_(), None),
        (lambda w: w.uniform_(2.0, 3.0), None),
        (lambda w: w.data.mul_(3.0), lambda v: v * 3),
    ],
)
def test_graph_keeps_old_value_after_inplace_update(update, new):
    w0 = np.array([1.0, 2.0])
    w = tape.tensor(w0, requires_grad=True)
    loss = (w * w * w).sum()  # recorded at the old value
    with tape.no_grad():
        update(w)
    w1 = w.numpy().copy()
    if new is not None:
        np.testing.assert_allclose(w1, new(w0))
    assert not np.array_equal(w1, w0)
    # the same open graph reads the new value for what comes after the update
    loss2 = loss + (w * w).sum()
    loss2.backward()
    np.testing.assert_allclose(loss2.item(), np.sum(w0**3) + np.sum(w1**2), rtol=1e-14)
    np.testing.assert_allclose(w.grad.numpy(), 3 * w0**2 + 2 * w1, rtol=1e-14)


# ================================================================ 4. autograd.Function


def _legendre_p3(lib):
    """The PyTorch tutorial's LegendrePolynomial3, written once for both libraries."""

    class LegendrePolynomial3(lib.autograd.Function):
        calls = {"forward": 0, "backward": 0}

        @staticmethod
        def forward(ctx, input):  # noqa: A002
            LegendrePolynomial3.calls["forward"] += 1
            ctx.save_for_backward(input)
            return 0.5 * (5 * input**3 - 3 * input)

        @staticmethod
        def backward(ctx, grad_output):
            LegendrePolynomial3.calls["backward"] += 1
            (input,) = ctx.saved_tensors
            return grad_output * 1.5 * (5 * input**2 - 1)

    return LegendrePolynomial3


def _p3(x):
    return 0.5 * (5 * x**3 - 3 * x)


def _dp3(x):
    return 1.5 * (5 * x**2 - 1)


XP = np.array([0.3, -0.7, 1.2, -1.9])


def test_function_legendre_eager():
    P3 = _legendre_p3(tape)
    x = tape.tensor(XP, requires_grad=True)
    y = P3.apply(x)
    assert y.requires_grad and not y.is_leaf and y.grad_fn is not None
    np.testing.assert_allclose(y.numpy(), _p3(XP), rtol=1e-14)
    w = np.array([1.0, -2.0, 0.5, 3.0])
    (y * tape.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), w * _dp3(XP), rtol=1e-14)
    assert P3.calls == {"forward": 1, "backward": 1}
    # finite differences through the Function's forward
    (fd,) = _fd_grad(lambda a: float((P3.apply(tape.tensor(a)) * tape.tensor(w)).sum()), [XP])
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-7, atol=1e-8)


def test_function_legendre_vs_torch():
    torch = pytest.importorskip("torch")
    res = []
    for lib in (tape, torch):
        P3 = _legendre_p3(lib)
        x = lib.tensor(XP, requires_grad=True)
        a, b = lib.tensor(0.7, dtype=lib.float64), lib.tensor(-0.3, dtype=lib.float64)
        y = P3.apply(a + b * x)
        loss = (y * y).sum()
        loss.backward()
        res.append((loss.item(), _np(x.grad)))
    np.testing.assert_allclose(res[0][0], res[1][0], rtol=1e-13)
    np.testing.assert_allclose(res[0][1], res[1][1], rtol=1e-12)


def test_function_without_grad_returns_forward_result():
    P3 = _legendre_p3(tape)
    y = P3.apply(tape.tensor(XP))
    assert not y.requires_grad
    np.testing.assert_allclose(y.numpy(), _p3(XP))
    x = tape.tensor(XP, requires_grad=True)
    with tape.no_grad():
        z = P3.apply(x)
    assert not z.requires_grad
    assert P3.calls["backward"] == 0


def _scale_shift(lib):
    """A Function with non-tensor arguments (a float, an int and a string) between tensors."""

    class ScaleShift(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale, y, power, mode):
            assert isinstance(scale, float) and isinstance(power, int) and mode == "sum"
            ctx.save_for_backward(x, y)
            ctx.scale, ctx.power = scale, power
            return scale * x**power + y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * ctx.scale * ctx.power * x ** (ctx.power - 1), None, g, None, None

    return ScaleShift


def test_function_with_non_tensor_arguments():
    F = _scale_shift(tape)
    x = tape.tensor(XP, requires_grad=True)
    y = tape.tensor(-XP[::-1].copy(), requires_grad=True)
    out = F.apply(x, 2.5, y, 3, "sum")
    np.testing.assert_allclose(out.numpy(), 2.5 * XP**3 - XP[::-1], rtol=1e-14)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 7.5 * XP**2, rtol=1e-14)
    np.testing.assert_allclose(y.grad.numpy(), np.ones(4))
    with pytest.raises(TypeError):
        F.apply(x, scale=2.5)  # positional only


def test_function_with_non_tensor_arguments_vs_torch():
    torch = pytest.importorskip("torch")
    res = []
    for lib in (tape, torch):
        F = _scale_shift(lib)
        x = lib.tensor(XP, requires_grad=True)
        y = lib.tensor(XP[::-1].copy(), requires_grad=True)
        (F.apply(x, -0.5, y.exp(), 2, "sum") ** 2).sum().backward()
        res.append((_np(x.grad), _np(y.grad)))
    for a, b in zip(*res):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def _many(lib):
    """Six tensor inputs (more than one chunk of three), a non-tensor argument among them
    and three outputs."""

    class Many(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, k, c, d, e, f):
            ctx.save_for_backward(a, b, c, d, e, f)
            ctx.k = k
            return a * b + c, k * d * e.exp(), (f * a).sin()

        @staticmethod
        def backward(ctx, g1, g2, g3):
            a, b, c, d, e, f = ctx.saved_tensors
            k = ctx.k
            c3 = g3 * (f * a).cos()
            return (g1 * b + c3 * f, g1 * a, None, g1, g2 * k * e.exp(), g2 * k * d * e.exp(),
                    c3 * a)  # fmt: skip

    return Many


MANY_SHAPES = [(2, 3)] * 6
MANY_K = 1.75


def _many_loss(lib, Many, ts, use=(0, 1, 2)):
    outs = Many.apply(ts[0], ts[1], MANY_K, *ts[2:])
    assert isinstance(outs, tuple) and len(outs) == 3
    w = [1.0, -0.5, 2.0]
    loss = None
    for j in use:
        term = (outs[j] * outs[j]).sum() * w[j]
        loss = term if loss is None else loss + term
    return loss


def _many_ref(arrays, use=(0, 1, 2)):
    a, b, c, d, e, f = arrays
    outs = [a * b + c, MANY_K * d * np.exp(e), np.sin(f * a)]
    w = [1.0, -0.5, 2.0]
    return sum(w[j] * np.sum(outs[j] ** 2) for j in use)


@pytest.mark.parametrize("use", [(0, 1, 2), (1,), (0, 2), (2,)])
def test_function_many_inputs_and_outputs_eager(use):
    Many = _many(tape)
    arrays = _inputs(MANY_SHAPES, 3)
    ts = [tape.tensor(a, requires_grad=True) for a in arrays]
    loss = _many_loss(tape, Many, ts, use)
    np.testing.assert_allclose(loss.item(), _many_ref(arrays, use), rtol=1e-13)
    loss.backward()
    fd = _fd_grad(lambda *a: _many_ref(a, use), arrays)
    for t, g in zip(ts, fd):
        assert t.grad is not None
        np.testing.assert_allclose(t.grad.numpy(), g, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("use", [(0, 1, 2), (1,), (0, 2)])
def test_function_many_inputs_and_outputs_vs_torch(use):
    torch = pytest.importorskip("torch")
    arrays = _inputs(MANY_SHAPES, 4)
    grads = []
    for lib in (tape, torch):
        ts = [lib.tensor(a, requires_grad=True) for a in arrays]
        _many_loss(lib, _many(lib), ts, use).backward()
        grads.append([None if t.grad is None else _np(t.grad) for t in ts])
    for g, tg in zip(*grads):
        assert (g is None) == (tg is None)
        if g is not None:
            np.testing.assert_allclose(g, tg, rtol=1e-12, atol=1e-14)


def test_function_outputs_feeding_other_ops_and_each_other():
    Many = _many(tape)
    arrays = _inputs(MANY_SHAPES, 5)
    ts = [tape.tensor(a, requires_grad=True) for a in arrays]
    o1, o2, o3 = Many.apply(ts[0] * 2.0, ts[1], MANY_K, *ts[2:])
    loss = (o1 * o3 + o2.sin()).sum()
    loss.backward()

    def ref(a, b, c, d, e, f):
        a = a * 2.0
        return np.sum((a * b + c) * np.sin(f * a) + np.sin(MANY_K * d * np.exp(e)))

    for t, g in zip(ts, _fd_grad(ref, arrays)):
        np.testing.assert_allclose(t.grad.numpy(), g, rtol=1e-6, atol=1e-7)


def _needs(lib, log):
    class Needs(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, k, c):
            log.append(("forward", tuple(ctx.needs_input_grad)))
            return a * b * k + c

        @staticmethod
        def backward(ctx, g):
            log.append(("backward", tuple(ctx.needs_input_grad)))
            return g, g, None, g

    return Needs


def test_function_needs_input_grad():
    log = []
    N = _needs(tape, log)
    a = tape.tensor([1.0, 2.0], requires_grad=True)
    b = tape.tensor([3.0, 4.0])
    c = tape.tensor([0.0, 1.0], requires_grad=True)
    N.apply(a, b, 2.0, c).sum().backward()
    assert log == [
        ("forward", (True, False, False, True)),
        ("backward", (True, False, False, True)),
    ]
    assert b.grad is None
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 1.0])


def test_function_needs_input_grad_vs_torch():
    torch = pytest.importorskip("torch")
    logs = []
    for lib in (tape, torch):
        log = []
        N = _needs(lib, log)
        a = lib.tensor([1.0, 2.0], requires_grad=True)
        b = lib.tensor([3.0, 4.0], requires_grad=False)
        c = lib.tensor([0.0, 1.0], requires_grad=True)
        N.apply(a * 1.0, b, 2.0, c).sum().backward()
        logs.append(log)
    assert logs[0] == logs[1]


def _argsort_fn(lib):
    class SortWithRank(lib.autograd.Function):
        """Returns 2 * x and the (float) rank of each element, marked non-differentiable."""

        seen = []

        @staticmethod
        def forward(ctx, x):
            rank = lib.tensor(np.argsort(np.argsort(_np(x))).astype(np.float64))
            ctx.mark_non_differentiable(rank)
            return 2 * x, rank

        @staticmethod
        def backward(ctx, g, g_rank):
            SortWithRank.seen.append(_np(g_rank).copy())
            return 2 * g

    return SortWithRank


def test_function_mark_non_differentiable():
    F = _argsort_fn(tape)
    xv = np.array([3.0, 1.0, 2.0])
    x = tape.tensor(xv, requires_grad=True)
    y, rank = F.apply(x)
    assert y.requires_grad and not rank.requires_grad
    np.testing.assert_array_equal(rank.numpy(), [2.0, 0.0, 1.0])
    (y.sum() + (rank * y).sum()).backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 + 2 * np.array([2.0, 0.0, 1.0]))
    np.testing.assert_array_equal(F.seen[-1], [0.0, 0.0, 0.0])


def test_function_mark_non_differentiable_vs_torch():
    torch = pytest.importorskip("torch")
    xv = np.array([3.0, -1.0, 2.0, 0.5])
    grads = []
    for lib in (tape, torch):
        F = _argsort_fn(lib)
        x = lib.tensor(xv, requires_grad=True)
        y, rank = F.apply(x)
        assert not rank.requires_grad
        (y * y * rank).sum().backward()
        grads.append(_np(x.grad))
        assert np.all(F.seen[-1] == 0)
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-14)


def _bcast_fn(lib):
    class Scale(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w, g * x  # the second has x's (broadcast) shape: summed to w's

    return Scale


@pytest.mark.parametrize("wshape", [(3,), (2, 1), (1, 3), (), (1,), (4, 2, 3)])
def test_function_gradient_summed_to_broadcast_input(wshape):
    Scale = _bcast_fn(tape)
    xv = np.arange(1.0, 7.0).reshape(2, 3)
    wv = np.random.default_rng(0).standard_normal(wshape)
    x = tape.tensor(xv, requires_grad=True)
    w = tape.tensor(wv, requires_grad=True)
    out = Scale.apply(x, w)
    up = np.random.default_rng(1).standard_normal(out.shape)
    (out * tape.tensor(up)).sum().backward()
    assert w.grad.shape == wshape and x.grad.shape == (2, 3)
    gx, gw = _fd_grad(lambda a, b: np.sum(a * b * up), [xv, np.asarray(wv, float)])
    np.testing.assert_allclose(w.grad.numpy(), gw, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-7, atol=1e-8)


def test_function_gradient_summed_to_broadcast_input_vs_torch():
    torch = pytest.importorskip("torch")
    grads = []
    for lib in (tape, torch):
        Scale = _bcast_fn(lib)
        x = lib.tensor(np.arange(1.0, 7.0).reshape(2, 3), requires_grad=True)
        w = lib.tensor([[0.5], [-2.0]], requires_grad=True)
        (Scale.apply(x, w) ** 2).sum().backward()
        grads.append((_np(x.grad), _np(w.grad)))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-14)


def _bad(lib, kind):
    class Bad(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            if kind == "too_few":
                return g
            if kind == "too_many":
                return g, g, g
            return lib.ones(5, dtype=lib.float64), g  # wrong shape

    return Bad


@pytest.mark.parametrize("kind", ["too_few", "too_many", "shape"])
def test_function_bad_gradients_raise(kind):
    x = tape.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = tape.tensor([1.0, 1.0, 1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="Bad"):
        _bad(tape, kind).apply(x, y).sum().backward()


@pytest.mark.parametrize("kind", ["too_few", "too_many", "shape"])
def test_function_bad_gradients_raise_in_torch_too(kind):
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = torch.tensor([1.0, 1.0, 1.0], requires_grad=True)
    with pytest.raises(RuntimeError):
        _bad(torch, kind).apply(x, y).sum().backward()


def test_function_cannot_be_instantiated():
    P3 = _legendre_p3(tape)
    with pytest.raises(RuntimeError, match="apply"):
        P3()


def test_function_mark_dirty_is_refused():
    class Dirty(tape.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(NotImplementedError):
        Dirty.apply(tape.tensor([1.0], requires_grad=True))


def test_function_save_for_backward_rejects_non_tensors():
    class Saver(tape.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, 3.0)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(TypeError):
        Saver.apply(tape.tensor([1.0], requires_grad=True))


def test_two_function_calls_from_separate_eager_graphs():
    P3 = _legendre_p3(tape)
    av, bv = np.array([0.2, -0.4]), np.array([1.1, 0.6, -0.9])
    # leaves directly, and separate graphs merged by the sum
    a = tape.tensor(av, requires_grad=True)
    b = tape.tensor(bv, requires_grad=True)
    (P3.apply(a).sum() * 3.0 + P3.apply(b).sum()).backward()
    np.testing.assert_allclose(a.grad.numpy(), 3 * _dp3(av), rtol=1e-14)
    np.testing.assert_allclose(b.grad.numpy(), _dp3(bv), rtol=1e-14)
    a2 = tape.tensor(av, requires_grad=True)
    b2 = tape.tensor(bv, requires_grad=True)
    ya = P3.apply(a2 * 2.0)  # one graph
    yb = P3.apply(b2.exp())  # another graph
    (ya.sum() * yb.sum()).backward()
    sa, sb = _p3(2 * av).sum(), _p3(np.exp(bv)).sum()
    np.testing.assert_allclose(a2.grad.numpy(), sb * 2 * _dp3(2 * av), rtol=1e-13)
    np.testing.assert_allclose(b2.grad.numpy(), sa * np.exp(bv) * _dp3(np.exp(bv)), rtol=1e-13)


def _mul_fns(lib):
    class Mul(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * b, g * a

    class TwoList(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2.0, a * 3.0

        @staticmethod
        def backward(ctx, g1, g2):
            return [2.0 * g1 + 3.0 * g2][0]  # one tensor, not a tuple: one input

    class Ident(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a  # an input returned as is

        @staticmethod
        def backward(ctx, g):
            return g * 5.0

    return Mul, TwoList, Ident


FN_EDGE = {
    "views_of_one_leaf": lambda F, x: F[0].apply(x[1:], x[:-1]).sum(),
    "same_tensor_twice": lambda F, x: F[0].apply(x, x).sum(),
    "tuple_outputs_summed": lambda F, x: sum(o.sum() for o in F[1].apply(x)),
    "identity_forward": lambda F, x: (F[2].apply(x) ** 2).sum(),
    "chain": lambda F, x: F[0].apply(F[2].apply(x), x.exp()).sum(),
}


@pytest.mark.parametrize("name", list(FN_EDGE))
def test_function_edge_cases_vs_torch(name):
    torch = pytest.importorskip("torch")
    xv = np.array([1.0, -2.0, 0.5, 3.0])
    grads = []
    for lib in (tape, torch):
        x = lib.tensor(xv, requires_grad=True)
        loss = FN_EDGE[name](_mul_fns(lib), x)
        loss.backward()
        grads.append((loss.item(), _np(x.grad)))
    np.testing.assert_allclose(grads[0][0], grads[1][0], rtol=1e-14)
    np.testing.assert_allclose(grads[0][1], grads[1][1], rtol=1e-14)


@pytest.mark.parametrize("name", ["views_of_one_leaf", "same_tensor_twice", "chain"])
def test_function_edge_cases_recorded(name):
    fn = FN_EDGE[name]
    t = tape.record(lambda x: fn(_mul_fns(tape), x), np.array([0.1, 0.2, 0.3, 0.4]))
    for x1 in NEW_POINTS:
        xe = tape.tensor(x1, requires_grad=True)
        fn(_mul_fns(tape), xe).backward()
        np.testing.assert_allclose(t.gradient(x1), xe.grad.numpy(), rtol=1e-14)


def test_function_float32():
    Mul = _mul_fns(tape)[0]
    x = tape.tensor([1.0, 2.0], dtype=tape.float32, requires_grad=True)
    y = Mul.apply(x, x)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_function_nested_in_function_output():
    P3 = _legendre_p3(tape)
    x = tape.tensor(XP / 2, requires_grad=True)
    P3.apply(P3.apply(x)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), _dp3(_p3(XP / 2)) * _dp3(XP / 2), rtol=1e-13)


def test_function_backward_twice_with_retain_graph():
    P3 = _legendre_p3(tape)
    x = tape.tensor(XP, requires_grad=True)
    y = P3.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * _dp3(XP), rtol=1e-14)
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


# ---------------------------------------------------------------- Function inside tape.record

NEW_POINTS = [np.array([1.0, 2.0, -0.5, 0.1]), np.array([-1.3, 0.0, 0.4, 2.2]), XP * 0.5]


def _p3_model(P3):
    def f(x):
        y = P3.apply(x * 0.5 + 0.1)
        return (y * x).sum() + x.exp().sum()

    return f


def _p3_model_ref(x):
    u = x * 0.5 + 0.1
    return np.sum(_p3(u) * x) + np.sum(np.exp(x)), _p3(u) + x * 0.5 * _dp3(u) + np.exp(x)


def test_function_in_record_replays_at_new_points():
    P3 = _legendre_p3(tape)
    f = _p3_model(P3)
    t = tape.record(f, XP)
    for x1 in NEW_POINTS:
        val, grad = _p3_model_ref(x1)
        n_fwd = P3.calls["forward"]
        np.testing.assert_allclose(t.gradient(x1), grad, rtol=1e-13)
        assert P3.calls["forward"] == n_fwd + 1  # forward re-ran at replay
        v, g = t.value_and_grad(x1)
        np.testing.assert_allclose(v, val, rtol=1e-13)
        np.testing.assert_allclose(g, grad, rtol=1e-13)
        np.testing.assert_allclose(t.forward(x1), val, rtol=1e-13)
        # the same as eager at x1
        xe = tape.tensor(x1, requires_grad=True)
        le = f(xe)
        le.backward()
        np.testing.assert_allclose(le.item(), val, rtol=1e-13)
        np.testing.assert_allclose(xe.grad.numpy(), grad, rtol=1e-13)
    # many replays stay on the interpreter (no automatic compilation failure)
    for _ in range(120):
        t.gradient(NEW_POINTS[0])
    np.testing.assert_allclose(t.gradient(NEW_POINTS[1]), _p3_model_ref(NEW_POINTS[1])[1])


def test_function_in_record_many_inputs_outputs():
    Many = _many(tape)

    def f(a, b, c, d, e, g):
        return _many_loss(tape, Many, [a, b, c, d, e, g], (0, 1, 2))

    t = tape.record(f, *_inputs(MANY_SHAPES, 6))
    for seed in (7, 8):
        arrays = _inputs(MANY_SHAPES, seed)
        grads = t.gradient(*arrays)
        fd = _fd_grad(lambda *a: _many_ref(a), arrays)
        for g, want in zip(grads, fd):
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(t.forward(*arrays), _many_ref(arrays), rtol=1e-13)


def test_function_in_record_some_outputs_unused():
    Many = _many(tape)

    def f(a, b, c, d, e, g):
        return _many_loss(tape, Many, [a, b, c, d, e, g], (1,))

    t = tape.record(f, *_inputs(MANY_SHAPES, 9))
    arrays = _inputs(MANY_SHAPES, 10)
    fd = _fd_grad(lambda *a: _many_ref(a, (1,)), arrays)
    for g, want in zip(t.gradient(*arrays), fd):
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7)


def test_function_in_record_with_wrt_and_constant_argument():
    F = _scale_shift(tape)

    def f(x, y):
        return (F.apply(x, 1.5, y, 2, "sum") ** 2).sum()

    t = tape.record(f, XP, XP[::-1].copy(), wrt=0)
    x1, y1 = NEW_POINTS[0], NEW_POINTS[1]
    np.testing.assert_allclose(t.gradient(x1, y1), 2 * (1.5 * x1**2 + y1) * 3.0 * x1, rtol=1e-13)


def test_function_in_record_with_captured_constant_and_threads():
    import concurrent.futures as cf

    Mul = _mul_fns(tape)[0]
    wv = np.array([2.0, 3.0, 4.0])
    W = tape.tensor(wv)

    def f(x):
        return (Mul.apply(x, W) * Mul.apply(x[::-1], x)).sum()

    def grad_ref(x):
        # sum_i w_i x_i * x_{n-1-i} x_i = sum_i w_i x_i^2 x_{n-1-i}
        n = len(x)
        g = 2 * wv * x * x[::-1]
        for i in range(n):
            g[n - 1 - i] += wv[i] * x[i] ** 2
        return g

    t = tape.record(f, np.array([1.0, 2.0, 3.0]))
    pts = [np.random.default_rng(i).standard_normal(3) for i in range(24)]
    with cf.ThreadPoolExecutor(4) as ex:
        res = list(ex.map(t.gradient, pts))
    for p, g in zip(pts, res):
        np.testing.assert_allclose(g, grad_ref(p), rtol=1e-13)
    t32 = tape.record(f, np.array([1.0, 2.0, 3.0], np.float32))
    np.testing.assert_allclose(t32.gradient(pts[0].astype(np.float32)), grad_ref(pts[0]),
                               rtol=1e-5)  # fmt: skip


def test_two_function_calls_merged_inside_record():
    P3 = _legendre_p3(tape)

    def f(a, b):
        return (P3.apply(a) * 3.0).sum() + P3.apply(b.exp()).sum()

    t = tape.record(f, np.array([0.1, 0.2]), np.array([0.3, 0.4, 0.5]))
    a1, b1 = np.array([0.7, -1.1]), np.array([-0.2, 0.9, 0.0])
    ga, gb = t.gradient(a1, b1)
    np.testing.assert_allclose(ga, 3 * _dp3(a1), rtol=1e-13)
    np.testing.assert_allclose(gb, np.exp(b1) * _dp3(np.exp(b1)), rtol=1e-13)


def test_function_in_record_with_guard_retraces():
    P3 = _legendre_p3(tape)

    def f(x):
        y = P3.apply(x)
        if y.sum() > 10:  # a Python branch on a tensor: a guard
            return (y * 2.0).sum()
        return (y * x).sum()

    small, big = np.array([0.5, 0.2]), np.array([2.0, 3.0])
    assert _p3(small).sum() <= 10 < _p3(big).sum()
    t = tape.record(f, small, on_change="retrace")
    np.testing.assert_allclose(t.gradient(small), _p3(small) + small * _dp3(small), rtol=1e-13)
    np.testing.assert_allclose(t.gradient(big), 2 * _dp3(big), rtol=1e-13)
    np.testing.assert_allclose(t.forward(big), 2 * _p3(big).sum(), rtol=1e-13)
    assert t.retraces >= 1
    np.testing.assert_allclose(t.gradient(small * 0.5), _p3(small / 2) + small / 2 * _dp3(small / 2),
                               rtol=1e-13)  # fmt: skip
    t2 = tape.record(f, small, on_change="raise")
    with pytest.raises(tape.GuardError):
        t2.gradient(big)


@pytest.fixture
def p3_tape():
    P3 = _legendre_p3(tape)
    return tape.record(_p3_model(P3), XP), "LegendrePolynomial3"


def test_function_tape_refuses_compile(p3_tape):
    t, name = p3_tape
    with pytest.raises(tape.CompileError, match=name):
        t.compile()
    # it still replays afterwards
    np.testing.assert_allclose(t.gradient(XP), _p3_model_ref(XP)[1], rtol=1e-13)


def test_record_compile_true_with_function_raises():
    P3 = _legendre_p3(tape)
    with pytest.raises(tape.CompileError, match="LegendrePolynomial3"):
        tape.record(_p3_model(P3), XP, compile=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.hessian(XP),
        lambda t: t.hvp(XP, v=XP),
        lambda t: t.jvp(XP, tangents=XP),
        lambda t: t.jacobian(XP, mode="fwd"),
        lambda t: t.save(__import__("io").BytesIO()),
        lambda t: pickle.dumps(t),
        lambda t: t.to("cuda"),
    ],
    ids=["hessian", "hvp", "jvp", "jacobian_fwd", "save", "pickle", "to_cuda"],
)
def test_function_tape_refuses_compiled_only_drivers(p3_tape, call):
    t, name = p3_tape
    with pytest.raises(NotImplementedError, match=name):
        call(t)


def test_function_tape_gradient_batch_runs_instance_by_instance(p3_tape):
    t, _ = p3_tape
    X = np.stack([XP, XP * 2])
    vals, grads = t.gradient_batch(X)
    for b in range(2):
        v, g = t.value_and_grad(X[b])
        np.testing.assert_allclose(vals[b], v, rtol=1e-13)
        np.testing.assert_allclose(grads[b], g, rtol=1e-13)


def test_function_inside_record_returning_non_tensor_raises():
    class NoTensor(tape.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 3.0

        @staticmethod
        def backward(ctx, g):
            return None

    with pytest.raises(NotImplementedError, match="NoTensor"):
        tape.record(lambda x: NoTensor.apply(x) * x.sum(), XP)


# ================================================================ 5. autograd.backward / grad


def _graph(lib, av, bv):
    a = lib.tensor(av, requires_grad=True)
    b = lib.tensor(bv, requires_grad=True)
    h = a * b
    return a, b, h, (h * h).sum(), h.exp()


AV, BV = np.array([1.0, 2.0, -0.5]), np.array([0.5, -1.0, 0.25])
G2 = np.array([1.0, 2.0, -3.0])


def _ref_grads(g1=1.0, g2=G2):
    """Gradients of g1 * sum((a b)^2) + <g2, exp(a b)> with respect to a and b."""
    h = AV * BV
    dh = g1 * 2 * h + g2 * np.exp(h)
    return dh * BV, dh * AV


def test_autograd_backward_list_accumulates_like_two_calls():
    a, b, _, l1, l2 = _graph(tape, AV, BV)
    tape.autograd.backward([l1, l2], [tape.tensor(2.0), tape.tensor(G2)])
    ga, gb = _ref_grads(2.0)
    np.testing.assert_allclose(a.grad.numpy(), ga, rtol=1e-14)
    np.testing.assert_allclose(b.grad.numpy(), gb, rtol=1e-14)
    a2, b2, _, m1, m2 = _graph(tape, AV, BV)
    m1.backward(tape.tensor(2.0), retain_graph=True)
    m2.backward(tape.tensor(G2))
    np.testing.assert_allclose(a.grad.numpy(), a2.grad.numpy(), rtol=1e-14)
    np.testing.assert_allclose(b.grad.numpy(), b2.grad.numpy(), rtol=1e-14)
    # accumulates on top of existing .grad
    a3, b3, _, n1, n2 = _graph(tape, AV, BV)
    a3.grad = tape.ones(3)
    tape.autograd.backward([n1, n2], [None, G2])
    np.testing.assert_allclose(a3.grad.numpy(), 1 + _ref_grads(1.0)[0], rtol=1e-14)


def test_autograd_backward_single_tensor_and_errors():
    a, b, _, l1, l2 = _graph(tape, AV, BV)
    tape.autograd.backward(l1)
    np.testing.assert_allclose(a.grad.numpy(), _ref_grads(1.0, 0.0)[0], rtol=1e-14)
    with pytest.raises(RuntimeError):
        tape.autograd.backward(l2)  # not scalar, no gradient given
    with pytest.raises(ValueError):
        tape.autograd.backward([l2], [G2, G2])


def test_autograd_backward_inputs_restricts_accumulation():
    a, b, _, l1, l2 = _graph(tape, AV, BV)
    tape.autograd.backward([l1, l2], [None, tape.tensor(G2)], inputs=[b])
    assert a.grad is None
    np.testing.assert_allclose(b.grad.numpy(), _ref_grads()[1], rtol=1e-14)
    a, b, _, l1, _ = _graph(tape, AV, BV)
    tape.autograd.backward(l1, inputs=a)
    assert b.grad is None
    np.testing.assert_allclose(a.grad.numpy(), _ref_grads(1.0, 0.0)[0], rtol=1e-14)


def test_autograd_backward_vs_torch():
    torch = pytest.importorskip("torch")
    res = []
    for lib in (tape, torch):
        a, b, h, l1, l2 = _graph(lib, AV, BV)
        lib.autograd.backward([l1, l2], [lib.tensor(0.5, dtype=lib.float64),
                                         lib.tensor(G2)])  # fmt: skip
        a2, b2, h2, m1, m2 = _graph(lib, AV, BV)
        lib.autograd.backward([m1, m2], [None, lib.tensor(G2)], inputs=[a2])
        res.append([_np(a.grad), _np(b.grad), _np(a2.grad), b2.grad])
    for x, y in zip(res[0][:3], res[1][:3]):
        np.testing.assert_allclose(x, y, rtol=1e-14)
    assert res[0][3] is None and res[1][3] is None


def test_autograd_grad_basic():
    a, b, h, l1, l2 = _graph(tape, AV, BV)
    ga, gb = tape.autograd.grad(l1, (a, b))
    want_a, want_b = _ref_grads(1.0, 0.0)
    np.testing.assert_allclose(ga.numpy(), want_a, rtol=1e-14)
    np.testing.assert_allclose(gb.numpy(), want_b, rtol=1e-14)
    assert a.grad is None and b.grad is None  # .grad untouched
    a, b, h, l1, l2 = _graph(tape, AV, BV)
    g = tape.autograd.grad(l2.sum(), a)
    assert isinstance(g, tuple) and len(g) == 1
    np.testing.assert_allclose(g[0].numpy(), np.exp(AV * BV) * BV, rtol=1e-14)


def test_autograd_grad_outputs_intermediate_and_retain_graph():
    a, b, h, l1, l2 = _graph(tape, AV, BV)
    ga, gh = tape.autograd.grad([l1, l2], [a, h], grad_outputs=[None, tape.tensor(G2)],
                                retain_graph=True)  # fmt: skip
    dh = 2 * AV * BV + G2 * np.exp(AV * BV)
    np.testing.assert_allclose(gh.numpy(), dh, rtol=1e-14)
    np.testing.assert_allclose(ga.numpy(), dh * BV, rtol=1e-14)
    # retained: a second call works, and then (without retain_graph) frees the graph
    (ga2,) = tape.autograd.grad(l1, a)
    np.testing.assert_allclose(ga2.numpy(), 2 * AV * BV * BV, rtol=1e-14)
    with pytest.raises(RuntimeError, match="second time"):
        tape.autograd.grad(l1, a)


def test_autograd_grad_allow_unused():
    a, b, h, l1, l2 = _graph(tape, AV, BV)
    c = tape.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="allow_unused"):
        tape.autograd.grad(l1, [a, c], retain_graph=True)
    ga, gc = tape.autograd.grad(l1, [a, c], allow_unused=True, retain_graph=True)
    assert gc is None
    np.testing.assert_allclose(ga.numpy(), _ref_grads(1.0, 0.0)[0], rtol=1e-14)
    _, gz = tape.autograd.grad(l1, [a, c], allow_unused=True, materialize_grads=True)
    np.testing.assert_array_equal(gz.numpy(), [0.0, 0.0])


def test_autograd_grad_errors():
    a, b, h, l1, l2 = _graph(tape, AV, BV)
    with pytest.raises(RuntimeError):
        tape.autograd.grad(l2, a)  # non-scalar output without grad_outputs
    with pytest.raises(RuntimeError):
        tape.autograd.grad(l1, tape.tensor([1.0]))  # input does not require grad
    with pytest.raises(NotImplementedError, match="not a leaf"):
        tape.autograd.grad(l1, h, create_graph=True)  # differentiable gradients: of leaves


def test_autograd_grad_vs_torch():
    torch = pytest.importorskip("torch")
    res = []
    for lib in (tape, torch):
        a, b, h, l1, l2 = _graph(lib, AV, BV)
        c = lib.tensor([1.0, 2.0], requires_grad=True)
        g = lib.autograd.grad([l1, l2], [a, h, b, c], grad_outputs=[None, lib.tensor(G2)],
                              retain_graph=None, allow_unused=True)  # fmt: skip
        res.append(g)
    for x, y in zip(*res):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(_np(x), _np(y), rtol=1e-14)


def test_autograd_grad_through_function():
    torch = pytest.importorskip("torch")
    res = []
    for lib in (tape, torch):
        P3 = _legendre_p3(lib)
        x = lib.tensor(XP, requires_grad=True)
        y = P3.apply(x)
        (g,) = lib.autograd.grad(y, x, grad_outputs=lib.tensor(np.arange(4.0)))
        res.append(_np(g))
        assert x.grad is None
    np.testing.assert_allclose(res[0], res[1], rtol=1e-14)
    np.testing.assert_allclose(res[0], np.arange(4.0) * _dp3(XP), rtol=1e-14)


# ---------------------------------------------------------------- interop for PyTorch scripts


def test_from_numpy_shares_memory_or_refuses():
    a = np.arange(6.0).reshape(2, 3)
    t = tape.from_numpy(a)
    a[0, 0] = 5.0
    assert t[0, 0].item() == 5.0 and np.shares_memory(t.numpy(), a)
    assert tape.as_tensor(a).numpy() is a and tape.as_tensor(t) is t
    assert not np.shares_memory(tape.as_tensor(a, dtype=tape.float32).numpy(), a)
    with pytest.raises(TypeError, match="int32"):
        tape.from_numpy(np.arange(3, dtype=np.int32))
    with pytest.raises(ValueError, match="C-contiguous"):
        tape.from_numpy(a.T)
    with pytest.raises(TypeError, match="expected np.ndarray"):
        tape.from_numpy([1.0])


def test_retain_grad_accumulates_and_refuses_inside_a_recording():
    x = tape.tensor([1.0, -2.0], requires_grad=True)
    y = x.exp()
    y.retain_grad()
    (y * y).sum().backward(retain_graph=True)
    np.testing.assert_allclose(y.grad.numpy(), 2 * np.exp([1.0, -2.0]), rtol=1e-14)
    (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), 4 * np.exp([1.0, -2.0]), rtol=1e-14)
    with pytest.raises(RuntimeError, match="requires_grad=False"):
        tape.tensor([1.0]).retain_grad()

    def f(a):
        b = a * 2.0
        b.retain_grad()
        return b.sum()

    with pytest.raises(RuntimeError, match="inside tape.record"):
        tape.record(f, np.ones(2))


def test_cuda_queries_answer_as_a_cpu_only_pytorch():
    assert tape.cuda.is_available() is False and tape.cuda.device_count() == 0
    tape.cuda.manual_seed(1)
    tape.cuda.manual_seed_all(1)
    with pytest.raises(AssertionError, match="tensors live on the CPU"):
        tape.cuda.current_device()


def test_autograd_gradcheck_signatures():
    a = tape.tensor([0.2, 0.9], requires_grad=True)
    assert tape.autograd.gradcheck(lambda x: x.sin() * x, (a,))
    assert tape.autograd.gradcheck(lambda x: x.exp(), a)  # a single tensor
    assert tape.autograd.gradgradcheck(lambda x, c: (x * c).tanh(), (a, tape.tensor([1.0, 3.0])))
    with pytest.raises(ValueError, match="requires_grad=True"):
        tape.autograd.gradcheck(lambda x: x * 2, (tape.tensor([1.0]),))

    class WrongGrad(tape.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g * 3.0  # wrong: d(x*x)/dx = 2x

    assert tape.autograd.gradcheck(WrongGrad.apply, (a,), raise_exception=False) is False
    with pytest.raises(RuntimeError):  # GradcheckError is a RuntimeError, as PyTorch's
        tape.autograd.gradcheck(WrongGrad.apply, (a,))


def test_grad_assignment_is_checked():
    x = tape.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(TypeError, match="Tensor or None"):
        x.grad = np.zeros(2)
    with pytest.raises(RuntimeError, match="different size"):
        x.grad = tape.zeros(3)
    with pytest.raises(RuntimeError, match="different type"):
        x.grad = tape.zeros(2, dtype=tape.float32)
    x.grad = tape.ones(2)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 5.0])


def test_new_constructors_take_the_tensors_dtype():
    w = tape.tensor([1.0], dtype=tape.float32)
    assert w.new_zeros(2, 3).shape == (2, 3) and w.new_zeros(2, 3).dtype == np.float32
    assert w.new_ones((2,), dtype=tape.float64).dtype == np.float64
    assert w.new_full((2,), 3.0).tolist() == [3.0, 3.0]
    v = w.new_tensor([1, 2], requires_grad=True)
    assert v.dtype == np.float32 and v.requires_grad and v.is_leaf
    assert w.new_empty(3).shape == (3,)


# ---------------------------------------------------------------- create_graph=True

XV = np.array([0.3, -0.7, 1.1])
WV = np.array([[0.5, -0.2, 0.1], [0.3, 0.8, -0.4]])


def _penalty(lib, x, w):
    y = (lib.tanh(w @ x) ** 2).sum() + (x.sin() * x).sum()
    (g,) = lib.autograd.grad(y, x, create_graph=True)
    return y, g, (g**2).sum()


def _y_of(xv, wv):
    return np.sum(np.tanh(wv @ xv) ** 2) + np.sum(np.sin(xv) * xv)


def test_gradient_penalty_matches_finite_differences():
    def pen_of(xv, wv):
        x = tape.tensor(xv, requires_grad=True)
        return _penalty(tape, x, tape.tensor(wv))[2].item()

    x = tape.tensor(XV, requires_grad=True)
    w = tape.tensor(WV, requires_grad=True)
    y, g, pen = _penalty(tape, x, w)
    assert g.requires_grad and not g.is_leaf
    (y + pen).backward()
    eps = 1e-6
    for k in range(3):
        e = np.zeros(3)
        e[k] = eps
        fd_pen = (pen_of(XV + e, WV) - pen_of(XV - e, WV)) / (2 * eps)
        fd_y = (_y_of(XV + e, WV) - _y_of(XV - e, WV)) / (2 * eps)
        np.testing.assert_allclose(x.grad.numpy()[k], fd_pen + fd_y, rtol=1e-6, atol=1e-8)
    for i in range(2):
        for j in range(3):
            e = np.zeros_like(WV)
            e[i, j] = eps
            fd = (pen_of(XV, WV + e) - pen_of(XV, WV - e)) / (2 * eps)
            fd_y = (_y_of(XV, WV + e) - _y_of(XV, WV - e)) / (2 * eps)
            np.testing.assert_allclose(w.grad.numpy()[i, j], fd + fd_y, rtol=1e-6, atol=1e-8)


def test_gradient_penalty_matches_pytorch():
    torch = pytest.importorskip("torch")
    got, want = [], []
    for lib, out in ((tape, got), (torch, want)):
        x = lib.tensor(XV, requires_grad=True)
        w = lib.tensor(WV, requires_grad=True)
        _, g, pen = _penalty(lib, x, w)
        pen.backward()
        out += [g.detach().numpy().copy(), x.grad.numpy().copy(), w.grad.numpy().copy()]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_double_backward_and_third_order():
    x = tape.tensor(XV, requires_grad=True)
    (x**3).sum().backward(create_graph=True)
    g = x.grad
    np.testing.assert_allclose(g.numpy(), 3 * XV**2, rtol=1e-14)
    (h,) = tape.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), 6 * XV, rtol=1e-14)
    (g1,) = tape.autograd.grad((x**4).sum(), x, create_graph=True)
    (g2,) = tape.autograd.grad(g1.sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="third order"):
        tape.autograd.grad(g2.sum(), x)


def test_pytorch_keyword_names_and_out():
    a = tape.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = tape.tensor([[0.5], [1.0]])
    np.testing.assert_array_equal(tape.matmul(input=a, other=b).numpy(), a.numpy() @ b.numpy())
    np.testing.assert_array_equal(tape.matmul(a, other=b).numpy(), a.numpy() @ b.numpy())
    np.testing.assert_array_equal(tape.sum(input=a, dim=0).numpy(), [4.0, 6.0])
    np.testing.assert_array_equal(
        tape.where(condition=a > 2, input=a, other=b).numpy(),
        np.where(a.numpy() > 2, a.numpy(), b.numpy()),
    )
    np.testing.assert_array_equal(tape.add(a, a, alpha=2).numpy(), 3 * a.numpy())
    out = tape.empty(2, 2)
    assert tape.sin(a, out=out) is out
    np.testing.assert_allclose(out.numpy(), np.sin(a.numpy()), rtol=1e-15)
    with pytest.raises(TypeError, match="multiple values"):
        tape.matmul(a, b, input=a)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        tape.mul(tape.tensor([1.0], requires_grad=True), 2.0, out=tape.zeros(1))
    with pytest.raises(RuntimeError, match="does not resize out"):
        tape.exp(a, out=tape.zeros(3))
    with pytest.raises(TypeError, match="must be Tensor"):
        tape.exp(a, out=np.zeros((2, 2)))


def test_shapes_are_sizes_printed_as_pytorch_prints_them():
    x = tape.zeros(2, 3)
    for s in (x.shape, x.size(), (x * 2).shape, tape.tensor([1.0], requires_grad=True).shape):
        assert type(s) is tape.Size
    assert x.shape == (2, 3) and x.size() == tape.Size([2, 3]) and hash(x.shape) == hash((2, 3))
    assert repr(x.shape) == str(x.shape) == f"{x.shape}" == "torch.Size([2, 3])"
    assert repr(tape.zeros(()).shape) == "torch.Size([])"
    assert x.shape.numel() == 6 and x.size(1) == 3 and x.shape[-1] == 3
    rows, cols = x.shape
    assert (rows, cols) == (2, 3) and np.zeros(x.shape).shape == (2, 3)
    assert tape.ones(x.shape).shape == (2, 3) and x.reshape(x.shape[::-1]).shape == (3, 2)
    back = pickle.loads(pickle.dumps(x.shape))
    assert type(back) is tape.Size and back == (2, 3)
    # tape's own messages keep the tuple form
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        x.reshape(4)


def test_movement_functions_take_pytorchs_arguments_and_keyword_names():
    a = np.arange(24.0).reshape(2, 3, 4)
    x = tape.tensor(a)
    cases = [
        (tape.transpose(x, 0, 1), np.swapaxes(a, 0, 1)),
        (tape.transpose(input=x, dim0=2, dim1=0), np.swapaxes(a, 2, 0)),
        (tape.transpose(x, (2, 0, 1)), np.transpose(a, (2, 0, 1))),  # NumPy's meaning
        (tape.transpose(x), np.transpose(a)),
        (tape.flatten(x), a.ravel()),
        (tape.flatten(x, 1), a.reshape(2, 12)),
        (tape.flatten(x, end_dim=1), a.reshape(6, 4)),
        (tape.flatten(input=x, start_dim=-2, end_dim=-1), a.reshape(2, 12)),
        (x.flatten(1), a.reshape(2, 12)),
        (tape.flatten(tape.tensor(3.0)), np.array([3.0])),
        (tape.unsqueeze(input=x, dim=1), a[:, None]),
        (tape.squeeze(tape.unsqueeze(x, 0), dim=0), a),
        (tape.permute(x, dims=(2, 0, 1)), np.transpose(a, (2, 0, 1))),
        (tape.reshape(input=x, shape=(4, 6)), a.reshape(4, 6)),
        (tape.swapaxes(x, axis0=0, axis1=2), np.swapaxes(a, 0, 2)),
        (tape.tile(x, dims=(1, 2, 1)), np.tile(a, (1, 2, 1))),
        (tape.cat(tensors=[x, x], dim=1), np.concatenate([a, a], 1)),
        (tape.moveaxis(input=x, source=0, destination=2), np.moveaxis(a, 0, 2)),
        (tape.t(input=x[0]), a[0].T),
        (tape.sin(input=x), np.sin(a)),
    ]
    for k, (got, want) in enumerate(cases):
        assert got.shape == want.shape and np.array_equal(got.numpy(), want), k
    with pytest.raises(TypeError, match="two axes to swap"):
        tape.transpose(x, 0)
    with pytest.raises(TypeError, match="multiple values"):
        tape.transpose(x, 0, 1, dim0=0)
    with pytest.raises(ValueError, match="start_dim 2 comes after end_dim 1"):
        tape.flatten(x, 2, 1)
    with pytest.raises(IndexError, match="out of range"):
        tape.flatten(x, 3)
    # the gradient flows through the PyTorch spellings as through NumPy's
    w = tape.tensor(a, requires_grad=True)
    (
        tape.flatten(tape.transpose(w, 0, 2), 1) * tape.tensor(np.arange(24.0).reshape(4, 6))
    ).sum().backward()
    assert np.array_equal(w.grad.numpy(), np.transpose(np.arange(24.0).reshape(4, 3, 2), (2, 1, 0)))


def test_pytorch_keywords_of_creation_reductions_and_norm():
    a = np.arange(6.0).reshape(2, 3)
    x32 = tape.tensor(a, dtype=tape.float32)
    s = tape.sum(input=x32, dim=0, keepdim=True, dtype=tape.float64)
    assert s.dtype == np.float64 and np.array_equal(s.numpy(), a.sum(0, keepdims=True))
    m = tape.mean(tape.tensor(a), dim=1, dtype=tape.float32)
    assert m.dtype == np.float32 and np.allclose(m.numpy(), a.mean(1))
    sm = tape.softmax(input=tape.tensor(a), dim=1, dtype=tape.float32)
    e = np.exp(a - a.max(1, keepdims=True))
    assert sm.dtype == np.float32 and np.allclose(sm.numpy(), e / e.sum(1, keepdims=True))
    assert np.array_equal(tape.pow(input=tape.tensor(a), exponent=2).numpy(), a**2)
    assert tape.zeros(size=(2, 3)).shape == (2, 3) and tape.ones(size=[4]).shape == (4,)
    assert tape.empty(size=(1,)).shape == (1,)
    assert np.array_equal(tape.full(size=(2,), fill_value=3.0).numpy(), [3.0, 3.0])
    o = tape.ones_like(input=tape.tensor(a), dtype=tape.float32)
    assert o.dtype == np.float32 and o.shape == (2, 3)
    assert np.allclose(tape.norm(input=tape.tensor(a), p=1, dim=1).numpy(), np.abs(a).sum(1))
    assert np.isclose(tape.norm(tape.tensor(a), p="fro").item(), np.linalg.norm(a))
    assert np.array_equal(tape.diag(input=tape.tensor(a[0]), diagonal=1).numpy(), np.diag(a[0], 1))
    with pytest.raises(TypeError, match="shape twice"):
        tape.zeros(2, size=(3,))
    with pytest.raises(TypeError, match="tensor twice"):
        tape.zeros_like(tape.tensor(a), input=tape.tensor(a))
    # dtype= casts before the reduction, so the gradient arrives in the input's dtype
    w = tape.tensor(a, dtype=tape.float32, requires_grad=True)
    tape.sum(w * w, dtype=tape.float64).backward()
    assert w.grad.dtype == np.float32 and np.allclose(w.grad.numpy(), 2 * a)


def test_pytorch_indexing_functions_against_numpy_and_their_gradients():
    a = np.arange(12.0).reshape(3, 4)
    x = tape.tensor(a)
    idx = np.array([[0, 1, 2, 0], [2, 2, 1, 0]])
    assert np.array_equal(tape.gather(x, 0, idx).numpy(), np.take_along_axis(a, idx, 0))
    assert np.array_equal(
        x.gather(1, np.array([[0], [3], [1]])).numpy(), a[[0, 1, 2], [0, 3, 1]][:, None]
    )
    assert np.array_equal(tape.index_select(x, 1, np.array([3, 0])).numpy(), a[:, [3, 0]])
    assert np.array_equal(x.masked_fill(x > 5, -1.0).numpy(), np.where(a > 5, -1.0, a))
    assert np.array_equal(tape.narrow(x, 1, 1, 2).numpy(), a[:, 1:3])
    assert np.array_equal(x.narrow(0, -2, 2).numpy(), a[1:])
    assert np.array_equal(tape.tril(x).numpy(), np.tril(a))
    assert np.array_equal(x.triu(1).numpy(), np.triu(a, 1))
    parts = tape.chunk(x, 3, 1)  # ceil(4 / 3) = 2 per piece: two pieces, as PyTorch
    assert [p.shape for p in parts] == [(3, 2), (3, 2)]
    assert np.array_equal(np.concatenate([p.numpy() for p in parts], 1), a)
    assert [p.shape for p in x.chunk(2, 0)] == [(2, 4), (1, 4)]
    # gradients: each is a gather, a slice or a select of tape's ops
    w = tape.tensor(a, requires_grad=True)
    loss = (
        tape.gather(w, 0, idx).sum() + w.index_select(1, np.array([3, 3])).sum()
        + (w.masked_fill(w > 5, 0.0) * 2).sum() + w.narrow(1, 0, 1).sum() + w.tril().sum()
    )  # fmt: skip
    loss.backward()
    want = np.zeros_like(a)
    np.add.at(want, (idx, np.arange(4)[None, :].repeat(2, 0)), 1.0)
    want[:, 3] += 2.0
    want += np.where(a > 5, 0.0, 2.0)
    want[:, 0] += 1.0
    want += np.tril(np.ones_like(a))
    assert np.array_equal(w.grad.numpy(), want)
    with pytest.raises(ValueError, match="same"):
        tape.gather(x, 0, np.array([0, 1]))
    with pytest.raises(TypeError, match="bool"):
        tape.masked_fill(x, np.ones((3, 4)), 0.0)
    with pytest.raises(IndexError, match="do not fit"):
        tape.narrow(x, 1, 3, 2)
    with pytest.raises(ValueError, match="at least 2 axes"):
        tape.tril(tape.tensor([1.0, 2.0]))
