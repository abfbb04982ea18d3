"""ADBench LSTM (the diagonal "D-LSTM"): objective and gradient with respect to main_params and
extra_params, formulas in ``shared/adbench/README.md`` §1.3.

tape, PyTorch and autograd run the time loop in Python (tape records the unrolled loop once and
replays it). JAX runs the same step function under ``lax.scan`` (an unrolled loop of
thousands of steps would take minutes to compile), which is how JAX code is written.
"""

from __future__ import annotations

import numpy as np

from tape.bench import adbench
from tape.bench.common import autograd_grad, backend, tape_replay, torch_eager
from tape.bench.harness import Case, Impl, Problem, Skip

REFERENCE = {
    (2, 1024): 0.6666651795589,
    (2, 4096): 0.6948563342365,
    (4, 1024): 0.7106766385584,
    (4, 4096): 0.6872684039818,
}
# first entries of the l2 c1024 gradient (ADBench LstmTests.cpp)
GRAD_HEAD = np.array(
    [3.14387024996101187e-06, 0, 0, 0, 0, 0, 0, -3.67840807336070475e-05, -1.54848612683180522e-04]
)


def _layers(main, l, b):
    return [
        tuple(main[2 * i][k * b : (k + 1) * b] for k in range(4))
        + tuple(main[2 * i + 1][k * b : (k + 1) * b] for k in range(4))
        for i in range(l)
    ]


def step(B, layers, extra, h, c, xt, xnext):
    """One time step: new hidden and cell lists and the step's log-likelihood term."""
    x = xt * extra[0]
    h, c = list(h), list(c)
    for i, (wf, wi, wo, wc, bf, bi, bo, bc) in enumerate(layers):
        f = B.sigmoid(x * wf + bf)
        ig = B.sigmoid(h[i] * wi + bi)
        o = B.sigmoid(x * wo + bo)
        g = B.tanh(h[i] * wc + bc)
        c[i] = c[i] * f + ig * g
        h[i] = o * B.tanh(c[i])
        x = h[i]
    y = x * extra[1] + extra[2]
    ynorm = y - B.log(B.sum(B.exp(y)) + 2.0)
    return h, c, B.sum(xnext * ynorm)


def make_objective(l, c, b):
    def lstm(B, params, consts):
        main, extra = params
        state, seq = consts
        layers = _layers(main, l, b)
        h = [state[2 * i] for i in range(l)]
        cs = [state[2 * i + 1] for i in range(l)]
        total = 0.0
        for t in range(c - 1):
            h, cs, ll = step(B, layers, extra, h, cs, seq[t], seq[t + 1])
            total = total + ll
        return -total / ((c - 1) * b)

    return lstm


def jax_builder(data):
    def build():
        B = backend("jax")
        jax, jnp = B.jax, B.jnp
        l, b = data.l, data.b

        def f(main, extra, state, seq):
            layers = _layers(main, l, b)
            h0 = [state[2 * i] for i in range(l)]
            c0 = [state[2 * i + 1] for i in range(l)]

            def body(carry, xs):
                h, c, tot = carry
                h, c, ll = step(B, layers, extra, h, c, xs[0], xs[1])
                return (h, c, tot + ll), None

            (_, _, tot), _ = jax.lax.scan(body, (h0, c0, 0.0), (seq[:-1], seq[1:]))
            return -tot / ((data.c - 1) * b)

        args = [
            jnp.asarray(a) for a in (data.main_params, data.extra_params, data.state, data.sequence)
        ]
        g = jax.jit(jax.grad(f, argnums=(0, 1)))
        v = jax.jit(f)
        return Impl(
            grad=lambda: jax.block_until_ready(g(*args)),
            value=lambda: jax.block_until_ready(v(*args)),
            note="lax.scan",
        )

    return build


def builders(data):
    f = make_objective(data.l, data.c, data.b)
    params = [data.main_params, data.extra_params]
    consts = (data.state, data.sequence)
    return {
        "tape": lambda: tape_replay(f, params, consts),
        "tape compiled": lambda: tape_replay(f, params, consts, compile=True),
        "jax jit": jax_builder(data),
        "torch": lambda: torch_eager(f, params, consts),
        "autograd": lambda: autograd_grad(f, params, consts),
    }


def lstm_cases(opts):
    root = adbench.find_data_dir(opts.data_dir)
    if root is None:
        raise Skip(f"no ADBench data (set ${adbench.ENV_VAR} or --adbench)")
    out = []
    for label, path in adbench.lstm_files(root):
        data = adbench.read_lstm(path)
        if opts.quick and (data.l, data.c) != (2, 1024):
            continue
        out.append(
            Case(
                "lstm",
                label,
                data.l * data.c,
                builders(data),
                ratio=True,
                ref_value=REFERENCE.get((data.l, data.c)),
            )
        )
    return out


PROBLEMS = [
    Problem(
        "lstm",
        "ADBench LSTM objective gradient (Python time loop; JAX lax.scan)",
        "layers x characters",
        lstm_cases,
        ratio=True,
    ),
]
