"""tape.optim: SGD, Adam and AdamW against torch.optim (float64 trajectories to 1e-12), the
update formulas by hand, state_dict round trips, zero_grad, closures and validation."""

import copy
import doctest
import warnings

import numpy as np
import pytest

import tape
from tape.frontend import optim

X0 = [-0.5, 0.8, 1.3, 0.2]
Y0 = [0.3, -1.1]
Z0 = [0.7]  # a parameter the loss never uses: its grad stays None, so it is never stepped
STEPS = 20


def objective(x, y, sign=1.0):
    """A scaled Rosenbrock in x plus a coupled quartic in y; the same code runs in tape and
    in torch."""
    r = (1 - x[:-1]) ** 2 + 10 * (x[1:] - x[:-1] ** 2) ** 2
    f = r.sum() + ((y - 0.5 * x[:2]) ** 2).sum() + 0.1 * (y**4).sum()
    return f * sign


def run(lib, opt_cls, kwargs, steps=STEPS, groups=None, sign=1.0, dtype=None):
    """Optimise ``objective`` for ``steps`` steps; the trajectory of (x, y, z) as arrays."""
    kw = {} if dtype is None else {"dtype": dtype}
    x = lib.tensor(X0, requires_grad=True, **kw)
    y = lib.tensor(Y0, requires_grad=True, **kw)
    z = lib.tensor(Z0, requires_grad=True, **kw)
    params = [x, y, z] if groups is None else groups(x, y, z)
    opt = opt_cls(params, **kwargs)
    traj = []
    for _ in range(steps):
        loss = objective(x, y, sign)
        loss.backward()
        opt.step()
        opt.zero_grad()
        traj.append(np.concatenate([_np(x), _np(y), _np(z)]))
    return np.array(traj), opt


def _np(t):
    return np.array(t.detach().numpy(), dtype=np.float64)


def two_groups(x, y, z):
    return [{"params": [x, z], "lr": 3e-3}, {"params": [y], "lr": 1e-2}]


def two_groups_adam(x, y, z):
    return [{"params": [x], "lr": 0.05}, {"params": [y, z], "lr": 0.02, "betas": (0.8, 0.95)}]


CASES = [
    ("SGD", {"lr": 5e-3}, None, 1.0),
    ("SGD", {"lr": 2e-3, "momentum": 0.9}, None, 1.0),
    ("SGD", {"lr": 2e-3, "momentum": 0.9, "dampening": 0.3}, None, 1.0),
    ("SGD", {"lr": 2e-3, "momentum": 0.8, "nesterov": True}, None, 1.0),
    ("SGD", {"lr": 2e-3, "momentum": 0.5, "weight_decay": 0.1}, None, 1.0),
    ("SGD", {"lr": 5e-3, "weight_decay": 0.2}, None, 1.0),
    ("SGD", {"lr": 2e-3, "momentum": 0.9, "maximize": True}, None, -1.0),
    ("SGD", {"lr": 1e-3, "momentum": 0.7}, two_groups, 1.0),
    ("Adam", {"lr": 0.05}, None, 1.0),
    ("Adam", {"lr": 0.05, "amsgrad": True}, None, 1.0),
    ("Adam", {"lr": 0.05, "weight_decay": 0.1}, None, 1.0),
    ("Adam", {"lr": 0.05, "betas": (0.5, 0.9), "eps": 1e-4}, None, 1.0),
    ("Adam", {"lr": 0.05, "maximize": True, "amsgrad": True}, None, -1.0),
    ("Adam", {"lr": 0.03, "weight_decay": 0.1, "decoupled_weight_decay": True}, None, 1.0),
    ("Adam", {"amsgrad": True}, two_groups_adam, 1.0),
    ("AdamW", {"lr": 0.05}, None, 1.0),
    ("AdamW", {"lr": 0.05, "weight_decay": 0.5, "amsgrad": True}, None, 1.0),
    ("AdamW", {"lr": 0.05, "maximize": True}, None, -1.0),
    ("AdamW", {"weight_decay": 0.2}, two_groups_adam, 1.0),
]


@pytest.mark.parametrize(
    "name,kwargs,groups,sign",
    CASES,
    ids=[f"{c[0]}-{'-'.join(c[1])}{'-groups' if c[2] else ''}" for c in CASES],
)
def test_trajectory_matches_torch(name, kwargs, groups, sign):
    torch = pytest.importorskip("torch")
    ours, opt = run(tape, getattr(optim, name), kwargs, groups=groups, sign=sign)
    ref, ref_opt = run(
        torch, getattr(torch.optim, name), kwargs, groups=groups, sign=sign, dtype=torch.float64
    )
    assert np.all(np.isfinite(ours))
    assert np.abs(ours[-1] - ours[0]).max() > 1e-3  # it moved
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=0)
    # z never had a gradient: untouched, and no state, as in torch
    assert ours[-1, -1] == Z0[0]
    assert len(opt.state) == len(ref_opt.state) in (0, 2)
    # the state matches torch's too
    sd, ref_sd = opt.state_dict(), ref_opt.state_dict()
    assert sorted(sd["state"]) == sorted(ref_sd["state"])
    for i, st in sd["state"].items():
        ref_st = ref_sd["state"][i]
        assert sorted(st) == sorted(ref_st)
        for key, val in st.items():
            if key == "step":
                assert val == float(ref_st[key]) == STEPS
            else:
                np.testing.assert_allclose(val.numpy(), ref_st[key].numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    "make",
    [
        lambda lib, ps: lib.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
        lambda lib, ps: lib.optim.Adam([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.5}]),
        lambda lib, ps: lib.optim.AdamW(ps, betas=(0.8, 0.9), amsgrad=True),
    ],
)
def test_repr_and_param_groups_match_torch(make):
    torch = pytest.importorskip("torch")
    ps = [tape.zeros(2, requires_grad=True), tape.zeros(3, requires_grad=True)]
    ref_ps = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]

    class lib:
        optim = optim

    ours, ref = make(lib, ps), make(torch, ref_ps)
    assert repr(ours) == repr(ref)
    assert ours.state_dict()["param_groups"] == ref.state_dict()["param_groups"]


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
        ("Adam", {"lr": 0.1, "amsgrad": True, "weight_decay": 0.1}),
        ("AdamW", {"lr": 0.1, "betas": (0.7, 0.9)}),
    ],
)
def test_scalar_and_matrix_params_match_torch(name, kwargs):
    torch = pytest.importorskip("torch")

    def traj(lib, opt_cls, **kw):
        s = lib.tensor(2.0, requires_grad=True, **kw)
        m = lib.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], requires_grad=True, **kw)
        w = lib.tensor([[1.0, 2.0, 3.0], [0.5, 1.5, 2.5]], **kw)
        opt = opt_cls([s, m], **kwargs)
        out = []
        for _ in range(8):
            loss = (s - 1) ** 2 * 2 + ((m - s) ** 2 * w).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(np.concatenate([[_np(s)], _np(m).ravel()]))
        assert s.shape == () and tuple(m.shape) == (2, 3)
        return np.array(out)

    ours = traj(tape, getattr(optim, name))
    ref = traj(torch, getattr(torch.optim, name), dtype=torch.float64)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=0)


def test_load_torch_state_dict():
    """A torch.optim state dict (torch tensors, a tensor ``step``) loads into tape.optim."""
    torch = pytest.importorskip("torch")
    ref = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (X0, Y0)]
    ref_opt = torch.optim.Adam(ref, lr=0.02, amsgrad=True)
    _steps(ref_opt, ref, 5)
    ours = _fresh_params([_np(t).tolist() for t in ref])
    opt = optim.Adam(ours)
    opt.load_state_dict(ref_opt.state_dict())
    assert opt.state[ours[0]]["step"] == 5 and opt.param_groups[0]["lr"] == 0.02
    assert isinstance(opt.state[ours[0]]["max_exp_avg_sq"], tape.Tensor)
    _steps(ref_opt, ref, 5)
    _steps(opt, ours, 5)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a.numpy(), _np(b), rtol=1e-12, atol=0)


# ---------------------------------------------------------------- without torch


def quadratic_grads(*ps):
    loss = sum(((p - 1.5) ** 2 * (i + 1.0)).sum() for i, p in enumerate(ps))
    loss.backward()
    return [p.grad.numpy().copy() for p in ps]


def test_sgd_plain_is_p_minus_lr_g():
    p = tape.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    q = tape.tensor(4.0, requires_grad=True)
    opt = optim.SGD([p, q], lr=0.1)
    for _ in range(3):
        before = [p.numpy().copy(), q.numpy().copy()]
        g = quadratic_grads(p, q)
        opt.step()
        np.testing.assert_array_equal(p.numpy(), before[0] - 0.1 * g[0])
        np.testing.assert_array_equal(q.numpy(), before[1] - 0.1 * g[1])
        opt.zero_grad()
    assert p.is_leaf and p.grad_fn is None and p.requires_grad
    assert len(opt.state) == 0  # no momentum: no state


def test_sgd_momentum_by_hand():
    p = tape.tensor([1.0, -2.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.25, weight_decay=0.01)
    val, buf = p.numpy().copy(), None
    for _ in range(4):
        (g,) = quadratic_grads(p)
        opt.step()
        opt.zero_grad()
        g = g + 0.01 * val
        buf = g.copy() if buf is None else 0.9 * buf + 0.75 * g
        val = val - 0.1 * buf
        np.testing.assert_allclose(p.numpy(), val, rtol=1e-15)
        np.testing.assert_allclose(opt.state[p]["momentum_buffer"].numpy(), buf, rtol=1e-15)


def test_adam_first_step_is_lr_times_sign():
    p = tape.tensor([3.0, -2.0, 0.25, 1.0, 1.5], requires_grad=True)
    start = p.numpy().copy()
    (g,) = quadratic_grads(p)
    assert g[-1] == 0  # 1.5 is the minimum: zero gradient, zero step
    opt = optim.Adam([p], lr=0.01)
    opt.step()
    np.testing.assert_allclose(p.numpy(), start - 0.01 * np.sign(g), rtol=1e-9, atol=1e-12)
    st = opt.state[p]
    assert st["step"] == 1
    np.testing.assert_allclose(st["exp_avg"].numpy(), 0.1 * g, rtol=1e-14)
    np.testing.assert_allclose(st["exp_avg_sq"].numpy(), 0.001 * g * g, rtol=1e-14)
    assert "max_exp_avg_sq" not in st


def test_adamw_first_step_decays_then_steps():
    p = tape.tensor([3.0, -2.0], requires_grad=True)
    start = p.numpy().copy()
    (g,) = quadratic_grads(p)
    opt = optim.AdamW([p], lr=0.01, weight_decay=0.5)
    opt.step()
    np.testing.assert_allclose(p.numpy(), start * (1 - 0.005) - 0.01 * np.sign(g), rtol=1e-9)
    # the decay is decoupled: the moments saw the plain gradient
    np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), 0.1 * g, rtol=1e-14)


def test_maximize_is_minimize_of_negation():
    def traj(maximize):
        p = tape.tensor([2.0, -1.0], requires_grad=True)
        opt = optim.Adam([p], lr=0.1, amsgrad=True, maximize=maximize)
        out = []
        for _ in range(5):
            loss = ((p - 1.5) ** 2).sum()
            (-loss if maximize else loss).backward()
            opt.step()
            opt.zero_grad()
            out.append(p.numpy().copy())
        return np.array(out)

    np.testing.assert_array_equal(traj(True), traj(False))


def _fresh_params(values=None):
    vals = values or ([1.0, -0.5, 2.0, 0.3], [0.4, -0.2])
    return [tape.tensor(v, requires_grad=True) for v in vals]


def _steps(opt, ps, n):
    for _ in range(n):
        objective(*ps).backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: optim.SGD(ps, lr=2e-3, momentum=0.9, nesterov=True),
        lambda ps: optim.Adam([{"params": ps[:1], "lr": 0.02}, {"params": ps[1:]}], amsgrad=True),
        lambda ps: optim.AdamW(ps, lr=0.03, weight_decay=0.3),
    ],
    ids=["SGD", "Adam", "AdamW"],
)
def test_state_dict_round_trip(make):
    straight = _fresh_params()
    opt = make(straight)
    _steps(opt, straight, 10)

    first = _fresh_params()
    opt1 = make(first)
    _steps(opt1, first, 5)
    saved = opt1.state_dict()
    assert sorted(saved["state"]) == [0, 1]
    assert [g["params"] for g in saved["param_groups"]] in ([[0, 1]], [[0], [1]])

    second = _fresh_params([p.numpy().tolist() for p in first])
    opt2 = make(second)
    opt2.load_state_dict(saved)
    _steps(opt1, first, 3)  # the loaded optimiser copied the state: this must not leak
    _steps(opt2, second, 5)
    for a, b in zip(second, straight):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    flat = [p for g in opt2.param_groups for p in g["params"]]
    assert len(flat) == len(second) and all(a is b for a, b in zip(flat, second))


def test_state_dict_layout_and_load_restores_hyperparameters():
    ps = _fresh_params()
    opt = optim.Adam([{"params": [ps[0]], "lr": 0.02}, {"params": [ps[1]], "eps": 1e-6}])
    _steps(opt, ps, 2)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["lr"] == 0.02 and sd["param_groups"][1]["eps"] == 1e-6
    st = sd["state"][1]
    assert st["step"] == 2 and isinstance(st["exp_avg"], tape.Tensor)
    assert st["exp_avg"].shape == (2,) and st["exp_avg"].dtype == np.float64
    # state_dict shares the live buffers (as torch); deepcopy makes a snapshot
    snap = copy.deepcopy(sd)
    _steps(opt, ps, 1)
    assert sd["state"][1]["step"] == 3  # the per-parameter dicts are live too, as in torch
    assert snap["state"][1]["step"] == 2
    assert not np.array_equal(
        sd["state"][1]["exp_avg"].numpy(), snap["state"][1]["exp_avg"].numpy()
    )

    qs = _fresh_params()
    opt2 = optim.Adam([{"params": [qs[0]]}, {"params": [qs[1]]}], lr=0.5)
    opt2.load_state_dict(snap)
    assert opt2.param_groups[0]["lr"] == 0.02 and opt2.param_groups[1]["eps"] == 1e-6
    assert opt2.param_groups[0]["params"][0] is qs[0]
    assert opt2.state[qs[1]]["step"] == 2
    # NumPy arrays in a loaded state are accepted and become tensors of the param's dtype
    snap["state"][0]["exp_avg"] = np.ones(4, np.float32)
    opt2.load_state_dict(snap)
    ea = opt2.state[qs[0]]["exp_avg"]
    assert isinstance(ea, tape.Tensor) and ea.dtype == np.float64

    with pytest.raises(ValueError, match="different number of parameter groups"):
        optim.Adam(qs).load_state_dict(snap)
    with pytest.raises(ValueError, match="doesn't match the size"):
        optim.Adam(
            [{"params": qs}, {"params": [tape.zeros(1, requires_grad=True)]}]
        ).load_state_dict(snap)


def test_zero_grad():
    p = tape.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    (p * p).sum().backward()
    g = p.grad
    ver = g._ver[0]
    opt.zero_grad(set_to_none=False)
    assert p.grad is g and isinstance(g, tape.Tensor)
    np.testing.assert_array_equal(g.numpy(), [0.0, 0.0])
    assert g._ver[0] > ver
    (3 * p).sum().backward()  # accumulates into the zeroed tensor
    np.testing.assert_array_equal(p.grad.numpy(), [3.0, 3.0])
    opt.zero_grad()
    assert p.grad is None
    opt.step()  # nothing has a gradient: no-op
    np.testing.assert_array_equal(p.numpy(), [1.0, 2.0])


def test_zero_grad_keeps_stepping_with_zero_gradient():
    # as in torch: a zero gradient (not None) still steps momentum and weight decay
    p = tape.tensor([1.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.1, weight_decay=0.5)
    (p * 0).sum().backward()
    opt.step()
    np.testing.assert_allclose(p.numpy(), [1.0 - 0.1 * 0.5])


def test_step_bumps_version_and_later_graphs_see_new_value():
    p = tape.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.5)
    loss = (p * p).sum()
    loss.backward()
    ver = p._ver[0]
    opt.step()
    assert p._ver[0] > ver and p.is_leaf and p.grad_fn is None
    np.testing.assert_array_equal(p.numpy(), [0.0, 0.0])
    assert (p * p).sum().item() == 0.0


def test_closure():
    p = tape.tensor([2.0, -1.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.25)
    calls = []

    def closure():
        calls.append(tape.is_grad_enabled())
        opt.zero_grad()
        loss = ((p - 1.0) ** 2).sum()
        loss.backward()
        return loss

    with tape.no_grad():
        loss = opt.step(closure)
    assert calls == [True]
    assert loss.item() == 5.0
    np.testing.assert_allclose(p.numpy(), [2.0 - 0.25 * 2.0, -1.0 + 0.25 * 4.0])
    for _ in range(3):
        opt.step(closure)
    assert len(calls) == 4


def test_float32_params_keep_their_dtype():
    p = tape.tensor([1.0, -2.0], requires_grad=True, dtype=tape.float32)
    for opt in (optim.SGD([p], lr=0.1, momentum=0.9), optim.AdamW([p], amsgrad=True)):
        for _ in range(2):
            (p * p).sum().backward()
            opt.step()
            opt.zero_grad()
        assert p.dtype == np.float32 and p.numpy().dtype == np.float32
        for v in opt.state[p].values():
            if isinstance(v, tape.Tensor):
                assert v.dtype == np.float32


def test_add_param_group():
    a = tape.tensor([1.0], requires_grad=True)
    b = tape.tensor([1.0], requires_grad=True)
    opt = optim.SGD([a], lr=0.1, momentum=0.5)
    opt.add_param_group({"params": b, "lr": 0.2})
    assert len(opt.param_groups[1]["params"]) == 1 and opt.param_groups[1]["params"][0] is b
    assert opt.param_groups[1]["momentum"] == 0.5 and opt.param_groups[1]["lr"] == 0.2
    (a + b).sum().backward()
    opt.step()
    np.testing.assert_allclose([a.item(), b.item()], [0.9, 0.8])
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [b]})


def test_named_params():
    a = tape.tensor([1.0], requires_grad=True)
    opt = optim.SGD([("w", a)], lr=0.1)
    assert opt.param_groups[0]["params"][0] is a
    assert opt.state_dict()["param_groups"][0]["param_names"] == ["w"]


def test_base_optimizer_custom_subclass():
    class Plain(optim.Optimizer):
        """SGD written against the base class, as in PyTorch tutorials."""

        def __init__(self, params, lr=optim.required):
            super().__init__(params, {"lr": lr})

        def _update_group(self, group):
            for p in group["params"]:
                if p.grad is not None:
                    p._value -= group["lr"] * p.grad.numpy()
                    p._bump()

    p = tape.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        Plain([p])
    opt = Plain([p], lr=0.5)
    (p * p).sum().backward()
    opt.step()
    assert p.item() == 0.0
    with pytest.raises(NotImplementedError):
        optim.Optimizer([p], {}).step()


def test_validation_errors():
    p = tape.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="Invalid learning rate: -0.1"):
        optim.SGD([p], lr=-0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        optim.Adam([p], lr=-1.0)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        optim.SGD([{"params": [p], "lr": -1.0}], lr=0.1)  # a group's own value is checked too
    with pytest.raises(ValueError, match="Invalid momentum value"):
        optim.SGD([p], momentum=-0.5)
    with pytest.raises(ValueError, match="Invalid weight_decay value"):
        optim.AdamW([p], weight_decay=-0.5)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0: 1.0"):
        optim.Adam([p], betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: -0.1"):
        optim.AdamW([p], betas=(0.9, -0.1))
    with pytest.raises(ValueError, match="Invalid betas"):
        optim.Adam([p], betas=0.9)
    with pytest.raises(ValueError, match="Invalid epsilon value"):
        optim.Adam([p], eps=-1e-8)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="zero dampening"):
        optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([p * 2], lr=0.1)
    frozen = tape.tensor([1.0])  # accepted, as in PyTorch: it never has a gradient to apply
    optim.Adam([frozen]).step()
    assert frozen.numpy().tolist() == [1.0]
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        optim.SGD([np.ones(2)], lr=0.1)
    with pytest.raises(TypeError, match="iterable of Tensors or dicts"):
        optim.SGD(p, lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD([{"params": {p}}], lr=0.1)
    q = tape.tensor([2.0], requires_grad=True)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.Adam([{"params": [p, q]}, {"params": [q]}])
    with pytest.raises(NotImplementedError, match="differentiable"):
        optim.Adam([p], differentiable=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        optim.SGD([p, p], lr=0.1)
    assert any("duplicate parameters" in str(x.message) for x in w)


def test_module_docstring_example_runs():
    result = doctest.testmod(optim, verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_public_api_documented():
    for name in optim.__all__:
        obj = getattr(optim, name)
        if isinstance(obj, type):
            assert obj.__doc__, name
            for meth in ("step", "zero_grad", "add_param_group", "state_dict", "load_state_dict"):
                assert getattr(obj, meth).__doc__, (name, meth)
