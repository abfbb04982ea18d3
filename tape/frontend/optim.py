"""``tape.optim``: PyTorch's ``torch.optim`` (:class:`SGD`, :class:`Adam`, :class:`AdamW`) for
tape tensors.

The optimisers follow PyTorch's signatures, defaults and update formulas (those of its
single-tensor CPU path): momentum buffers that start as the first gradient, Adam's bias
correction, AdamW's decoupled weight decay, ``amsgrad`` and ``maximize``. Parameters are leaf
tensors that require grad, given as an iterable of tensors or as a list of parameter-group
dicts (``[{'params': [w], 'lr': 0.1}, {'params': [b]}]``; keys a group leaves out take the
optimiser's defaults). ``step`` updates each parameter's NumPy value in place (vectorised
NumPy, outside any graph), skipping parameters whose ``.grad`` is None, and bumps its version
counter so that graphs recorded afterwards read the new value.

A training loop::

    >>> import tape
    >>> from tape.frontend import optim
    >>> w = tape.tensor([0.0, 0.0], requires_grad=True)
    >>> target = tape.tensor([1.0, -2.0])
    >>> opt = optim.Adam([w], lr=0.1)
    >>> for _ in range(200):
    ...     opt.zero_grad()
    ...     loss = ((w - target) ** 2).sum()
    ...     loss.backward()
    ...     opt.step()
    >>> [round(v, 2) for v in w.tolist()]
    [1.0, -2.0]

``state_dict()`` / ``load_state_dict()`` use PyTorch's layout: ``{'state': {index: {...}},
'param_groups': [{..., 'params': [indices]}]}``, with buffers as tape tensors and ``step`` as
a number.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from copy import deepcopy
from itertools import chain

import numpy as np

from tape.frontend.tensor import Tensor, enable_grad, no_grad

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "required"]


class _RequiredParameter:
    """Singleton marking a hyperparameter that every parameter group must give."""

    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


def _scalar(x):
    """A Python number from a number or a one-element tensor (lr, betas may be tensors)."""
    if isinstance(x, Tensor):
        if x.numel() != 1:
            raise ValueError(f"expected a number or a 1-element tensor, got shape {tuple(x.shape)}")
        return x._peek().reshape(()).item()
    return x


def _leaf_state(arr) -> Tensor:
    """A state buffer: a plain (no-grad) leaf tensor owning ``arr``."""
    return Tensor(arr if arr.flags.c_contiguous else arr.copy())


class Optimizer:
    """Base class of all optimisers, as ``torch.optim.Optimizer``.

    Parameters
    ----------
    params
        An iterable of leaf tensors that require grad, or of dicts each holding a
        ``'params'`` entry (tensors, or ``(name, tensor)`` pairs) and hyperparameters
        overriding ``defaults`` for that group.
    defaults
        The default hyperparameters (``required`` marks one with no default).

    Attributes
    ----------
    param_groups
        List of dicts, one per group, with every default filled in.
    state
        Dict from parameter tensor to that parameter's state dict.
    defaults
        The default hyperparameters.

    A subclass implements :meth:`_update_group` (update one group's parameters in place)
    or overrides :meth:`step` outright; it may implement :meth:`_check_group` to validate
    hyperparameters (called for the defaults and for every group added).
    """

    def __init__(self, params, defaults):
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {type(params).__module__}.{type(params).__qualname__}"
            )
        if isinstance(params, dict):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                "dicts; wrap a single parameter group in a list: [group]"
            )
        self.state = defaultdict(dict)
        self.param_groups = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for param_group in param_groups:
            self.add_param_group(param_group)

    # ------------------------------------------------------------ hooks for subclasses

    def _check_group(self, group):
        """Validate one group's hyperparameters (raise ``ValueError``); no-op here."""

    def _update_group(self, group):
        """Update the parameters of one group in place (implemented by subclasses)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement step() (or _update_group(group))"
        )

    # ------------------------------------------------------------ public API

    def step(self, closure=None):
        """Perform a single optimisation step (update every parameter that has a ``.grad``).

        Parameters
        ----------
        closure : callable, optional
            A function that re-evaluates the model and returns
            the loss (typically: ``zero_grad()``, compute the loss, ``backward()``,
            return the loss). It is called with gradient tracking enabled, before the
            update.

        Returns
        -------
        object or None
            The closure's loss, or None without a closure.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._update_group(group)
        return loss

    def zero_grad(self, set_to_none=True):
        """Reset the gradients of all optimised tensors.

        Parameters
        ----------
        set_to_none : bool
            Set ``.grad`` to None (default) rather than filling the
            gradient tensors with zeros in place. As in PyTorch, the optimisers skip a
            parameter whose ``.grad`` is None but step one whose gradient is zero (which
            still moves it under momentum or weight decay).
        """
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if set_to_none:
                    p.grad = None
                elif g._tape is not None or g._value is None:
                    # a gradient computed in a graph: replace it with an owned zero tensor
                    p.grad = Tensor(np.zeros(p.shape, p.dtype))
                else:
                    if g.is_leaf:
                        g.requires_grad_(False)
                    g._value[...] = 0
                    g._bump()

    def add_param_group(self, param_group):
        """Add a parameter group to :attr:`param_groups` (e.g. layers unfrozen while
        fine-tuning).

        Parameters
        ----------
        param_group : dict
            ``'params'`` (a tensor, or a list of tensors or of
            ``(name, tensor)`` pairs) and hyperparameters for this group; missing ones
            take the optimiser's defaults.

        Raises
        ------
        TypeError
            ``param_group`` is not a dict, its params are a set, or a param is not
            a tensor.
        ValueError
            A param is not a leaf, does not require grad, or is already in
            another group; a required hyperparameter is missing or one is invalid.
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("param_group must have a 'params' entry")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        else:
            params = list(params)

        tensors, names = [], []
        for param in params:
            if isinstance(param, tuple):
                names.append(param[0])
                tensors.append(param[1])
            else:
                tensors.append(param)
        param_group["params"] = tensors
        if names:
            if len(names) != len(tensors):
                raise ValueError(
                    "all optimizer params should be with/without names. Some param names are missing"
                )
            param_group["param_names"] = names

        for param in tensors:
            if not isinstance(param, Tensor):
                raise TypeError(
                    "optimizer can only optimize Tensors, but one of the params is "
                    f"{type(param).__module__}.{type(param).__qualname__}"
                )
            if not param.is_leaf:
                raise ValueError(
                    "can't optimize a non-leaf Tensor (one computed from other tensors); "
                    "optimize the leaf it came from, or a new leaf: x.detach().requires_grad_()"
                )

        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(
                    f"parameter group didn't specify a value of required optimization "
                    f"parameter {name}"
                )
            param_group.setdefault(name, default)
        self._check_group(param_group)

        ids = [id(p) for p in tensors]
        if len(ids) != len(set(ids)):
            warnings.warn(
                "optimizer contains a parameter group with duplicate parameters; "
                "in future, this will cause an error; "
                "see github.com/pytorch/pytorch/issues/40967 for more information",
                stacklevel=3,
            )

        seen = set()
        for group in self.param_groups:
            seen.update(id(p) for p in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                which = "with names" if "param_names" in param_group else "without names"
                raise ValueError(
                    "all optimizer param groups should be with/without names. "
                    f"cannot add param group {which} to the optimizer"
                )
        if not seen.isdisjoint(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def state_dict(self):
        """The optimiser's state as a dict, in PyTorch's layout.

        ``'state'`` maps each parameter's index (its position across all groups, in order)
        to its state dict (buffers as tape tensors, ``'step'`` as a number);
        ``'param_groups'`` lists each group's hyperparameters with ``'params'`` replaced by
        those indices. As in PyTorch the buffers are the optimiser's own tensors, not copies:
        later steps update them (``copy.deepcopy`` the result to keep a snapshot).
        """
        param_mappings = {}
        start_index = 0

        def pack_group(group):
            nonlocal start_index
            packed = {k: v for k, v in group.items() if k != "params"}
            param_mappings.update(
                {
                    id(p): i
                    for i, p in enumerate(group["params"], start_index)
                    if id(p) not in param_mappings
                }
            )
            packed["params"] = [param_mappings[id(p)] for p in group["params"]]
            start_index += len(packed["params"])
            return packed

        param_groups = [pack_group(g) for g in self.param_groups]
        packed_state = {
            (param_mappings[id(k)] if isinstance(k, Tensor) else k): v
            for k, v in self.state.items()
        }
        return {"state": packed_state, "param_groups": param_groups}

    def load_state_dict(self, state_dict):
        """Load optimiser state saved by :meth:`state_dict`.

        Parameters are matched by position: the i-th parameter of this optimiser (across its
        groups, in order) takes the saved state of index i. The groups' hyperparameters are
        replaced by the saved ones (their ``'params'`` are kept). Buffers are copied (cast to
        the parameter's dtype), so this optimiser shares no memory with the saved dict; NumPy
        arrays and other array-likes are accepted in place of tape tensors.

        Raises
        ------
        ValueError
            The number of groups, or of parameters in a group, differs.
        """
        state_dict = dict(state_dict)
        groups = self.param_groups
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of "
                "optimizer's group"
            )
        id_map = dict(
            zip(
                chain.from_iterable(g["params"] for g in saved_groups),
                chain.from_iterable(g["params"] for g in groups),
            )
        )

        def cast(param, value, key=None):
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            if key == "step":
                return _scalar(value) if isinstance(value, Tensor) else _number(value)
            if isinstance(value, Tensor) or (
                hasattr(value, "__array__") and not isinstance(value, (str, bytes))
            ):
                v = value._peek() if isinstance(value, Tensor) else np.asarray(value)
                dtype = param.dtype if v.dtype.kind == "f" else v.dtype
                return _leaf_state(np.array(v, dtype=dtype, copy=True))
            if isinstance(value, (list, tuple)):
                return type(value)(cast(param, v) for v in value)
            return value

        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = cast(param, v)
            else:
                state[k] = v

        for group, new_group in zip(groups, saved_groups):
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
        self.__setstate__({"state": state, "param_groups": saved_groups})

    def __getstate__(self):
        """What pickling keeps: ``defaults``, ``state`` and ``param_groups``."""
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        """Restore from :meth:`__getstate__`; groups missing a default get it."""
        self.__dict__.update(state)
        for group in self.param_groups:
            for name, default in self.defaults.items():
                if default is not required:
                    group.setdefault(name, default)

    def __repr__(self):
        """PyTorch's layout: the class name, then each group's hyperparameters, sorted."""
        format_string = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            format_string += "\n"
            format_string += f"Parameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    format_string += f"    {key}: {group[key]}\n"
        format_string += ")"
        return format_string


def _number(value):
    """A Python number from a number, NumPy scalar or array-like with one element."""
    if isinstance(value, (int, float)):
        return value
    return np.asarray(value).reshape(()).item()


def _grad_value(p):
    """The gradient of ``p`` as a NumPy array of p's shape and dtype (read-only use)."""
    g = p.grad._peek()
    if g.shape != p.shape:
        raise RuntimeError(
            f"the gradient of a parameter has shape {tuple(g.shape)}, the parameter has shape {tuple(p.shape)}"
        )
    if g.dtype != p.dtype:
        g = g.astype(p.dtype)
    return g


def _check_common(group):
    lr = _scalar(group["lr"])
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    wd = _scalar(group["weight_decay"])
    if not 0.0 <= wd:
        raise ValueError(f"Invalid weight_decay value: {wd}")
    if group.get("differentiable"):
        raise NotImplementedError(
            "differentiable=True is not supported: tape.optim updates the parameters' values "
            "in place, outside any graph"
        )


class SGD(Optimizer):
    r"""Stochastic gradient descent, optionally with momentum, as ``torch.optim.SGD``.

    With gradient :math:`g_t` (negated if ``maximize``), each step does::

        g = g + weight_decay * p                      (if weight_decay != 0)
        b = g  (first step)  or  momentum * b + (1 - dampening) * g   (if momentum != 0)
        g = g + momentum * b  (nesterov)  or  b
        p = p - lr * g

    The momentum buffer starts as the first gradient, so dampening applies from the second
    step on (PyTorch's convention).

    Parameters
    ----------
    params
        Iterable of parameters or of parameter-group dicts.
    lr : float
        Learning rate (default: 1e-3).
    momentum : float
        Momentum factor (default: 0).
    dampening : float
        Dampening for momentum (default: 0).
    weight_decay : float
        Weight decay, an L2 penalty added to the gradient (default: 0).
    nesterov : bool
        Nesterov momentum; needs ``momentum > 0`` and ``dampening == 0``
        (default: False).
    maximize : bool
        Maximise the objective instead of minimising it (default: False).
    foreach, fused
        Accepted for compatibility with PyTorch; the NumPy update is the same.
    differentiable
        Must be False.

    Example::

        opt = tape.optim.SGD([w, b], lr=0.1, momentum=0.9)
        opt.zero_grad()
        loss_fn(w, b).backward()
        opt.step()
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        momentum=0,
        dampening=0,
        weight_decay=0,
        nesterov=False,
        *,
        maximize=False,
        foreach=None,
        differentiable=False,
        fused=None,
    ):
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
            "differentiable": differentiable,
            "fused": fused,
        }
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group):
        """Validate lr, momentum, weight_decay and the Nesterov conditions."""
        _check_common(group)
        momentum = group["momentum"]
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if group["nesterov"] and (momentum <= 0 or group["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _update_group(self, group):
        lr = _scalar(group["lr"])
        momentum = group["momentum"]
        dampening = group["dampening"]
        weight_decay = _scalar(group["weight_decay"])
        nesterov = group["nesterov"]
        maximize = group["maximize"]
        for p in group["params"]:
            if p.grad is None:
                continue
            value = p._value
            g = _grad_value(p)
            if maximize:
                g = -g
            if weight_decay != 0:
                g = g + weight_decay * value
            if momentum != 0:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = _leaf_state(np.array(g, dtype=p.dtype, copy=True).reshape(p.shape))
                    state["momentum_buffer"] = buf
                else:
                    b = buf._value
                    b *= momentum
                    b += (1 - dampening) * g
                    buf._bump()
                g = g + momentum * buf._value if nesterov else buf._value
            value += -lr * g
            p._bump()


class Adam(Optimizer):
    r"""Adam, as ``torch.optim.Adam``.

    With gradient :math:`g` (negated if ``maximize``) and step count :math:`t`::

        g   = g + weight_decay * p                    (L2 penalty, if weight_decay != 0)
        m   = beta1 * m + (1 - beta1) * g
        v   = beta2 * v + (1 - beta2) * g**2
        v*  = max(v*, v)                              (amsgrad)
        p   = p - lr / (1 - beta1**t) * m / (sqrt(v or v*) / sqrt(1 - beta2**t) + eps)

    With ``decoupled_weight_decay=True`` (what :class:`AdamW` does) the weight decay is
    instead ``p = p * (1 - lr * weight_decay)`` before the moments, and does not enter them.
    The state of each parameter is ``step`` (a number), ``exp_avg``, ``exp_avg_sq`` and, with
    amsgrad, ``max_exp_avg_sq``.

    Parameters
    ----------
    params
        Iterable of parameters or of parameter-group dicts.
    lr : float
        Learning rate (default: 1e-3).
    betas : tuple[float, float]
        Decay rates of the running averages of the gradient and
        of its square (default: (0.9, 0.999)).
    eps : float
        Term added to the denominator for numerical stability (default: 1e-8).
    weight_decay : float
        Weight decay (default: 0).
    amsgrad : bool
        Use the AMSGrad variant (default: False).
    maximize : bool
        Maximise the objective instead of minimising it (default: False).
    decoupled_weight_decay : bool
        Decoupled (AdamW) weight decay (default: False).
    foreach, capturable, fused
        Accepted for compatibility with PyTorch (no effect).
    differentiable
        Must be False.
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0,
        amsgrad=False,
        *,
        foreach=None,
        maximize=False,
        capturable=False,
        differentiable=False,
        fused=None,
        decoupled_weight_decay=False,
    ):
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        defaults = {
            "lr": lr,
            "betas": _betas(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
            "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group):
        """Validate lr, eps, betas and weight_decay."""
        _check_common(group)
        eps = group["eps"]
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        beta1, beta2 = group["betas"] = _betas(group["betas"])
        if not 0.0 <= beta1 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {beta1}")
        if not 0.0 <= beta2 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {beta2}")

    def _update_group(self, group):
        lr = _scalar(group["lr"])
        beta1, beta2 = group["betas"]
        eps = group["eps"]
        weight_decay = _scalar(group["weight_decay"])
        amsgrad = group["amsgrad"]
        maximize = group["maximize"]
        decoupled = group["decoupled_weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            value = p._value
            g = _grad_value(p)
            state = self.state[p]
            if len(state) == 0:
                state["step"] = 0.0
                state["exp_avg"] = _leaf_state(np.zeros(p.shape, p.dtype))
                state["exp_avg_sq"] = _leaf_state(np.zeros(p.shape, p.dtype))
                if amsgrad:
                    state["max_exp_avg_sq"] = _leaf_state(np.zeros(p.shape, p.dtype))
            if maximize:
                g = -g
            state["step"] += 1
            step = state["step"]

            if weight_decay != 0:
                if decoupled:
                    value *= 1 - lr * weight_decay
                else:
                    g = g + weight_decay * value

            # exp_avg.lerp_(g, 1 - beta1), with PyTorch's two-sided lerp formula
            exp_avg = state["exp_avg"]
            m = exp_avg._value
            w = 1 - beta1
            if abs(w) < 0.5:
                m += w * (g - m)
            else:
                m[...] = g - (g - m) * (1 - w)
            exp_avg._bump()

            exp_avg_sq = state["exp_avg_sq"]
            v = exp_avg_sq._value
            v *= beta2
            v += (1 - beta2) * g * g
            exp_avg_sq._bump()

            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = lr / bias_correction1
            bias_correction2_sqrt = bias_correction2**0.5

            if amsgrad:
                if "max_exp_avg_sq" not in state:  # amsgrad switched on after the first step
                    state["max_exp_avg_sq"] = _leaf_state(np.zeros(p.shape, p.dtype))
                max_sq = state["max_exp_avg_sq"]
                np.maximum(max_sq._value, v, out=max_sq._value)
                max_sq._bump()
                denom = np.sqrt(max_sq._value) / bias_correction2_sqrt + eps
            else:
                denom = np.sqrt(v) / bias_correction2_sqrt + eps

            value += -step_size * m / denom
            p._bump()


def _betas(betas):
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"Invalid betas: expected a pair (beta1, beta2), got {betas!r}") from None
    b1, b2 = _scalar(b1), _scalar(b2)
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in (b1, b2)):
        raise ValueError(f"Invalid betas: expected two numbers, got {betas!r}")
    return (b1, b2)


class AdamW(Adam):
    r"""Adam with decoupled weight decay, as ``torch.optim.AdamW``.

    Each step first shrinks the parameter, ``p = p * (1 - lr * weight_decay)``, then takes
    the :class:`Adam` step with the plain gradient (the decay does not enter the moments).
    Note the default ``weight_decay=1e-2`` (Adam's is 0).

    Parameters
    ----------
    params
        Iterable of parameters or of parameter-group dicts.
    lr : float
        Learning rate (default: 1e-3).
    betas : tuple[float, float]
        Decay rates of the running averages of the gradient and
        of its square (default: (0.9, 0.999)).
    eps : float
        Term added to the denominator for numerical stability (default: 1e-8).
    weight_decay : float
        Decoupled weight decay coefficient (default: 1e-2).
    amsgrad : bool
        Use the AMSGrad variant (default: False).
    maximize : bool
        Maximise the objective instead of minimising it (default: False).
    foreach, capturable, fused
        Accepted for compatibility with PyTorch (no effect).
    differentiable
        Must be False.
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=1e-2,
        amsgrad=False,
        *,
        maximize=False,
        foreach=None,
        capturable=False,
        differentiable=False,
        fused=None,
    ):
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )

    def __setstate__(self, state):
        """Restore from a pickle or state dict; AdamW's weight decay stays decoupled."""
        super().__setstate__(state)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
