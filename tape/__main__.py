"""``python -m tape demo``: the seed lessons, a gradient check and a small timing comparison.
``python -m tape.bench`` runs the full benchmark suite."""

from __future__ import annotations

import sys
import time
import timeit


def _best(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def demo():
    import numpy as np

    print(
        "tape demo: each op compiles the first time it runs (a second or so each on the first "
        "run; Numba caches them)\n"
    )
    import tape as torch  # the lessons' own spelling

    print("== Lesson 1: one gradient ==")
    w = torch.tensor(2.0, requires_grad=True)
    loss = (3 * w - 1).square()
    print("loss       ", loss)
    print("loss.shape ", loss.shape)
    print("w.grad     ", w.grad)
    loss.backward()
    print("w.grad     ", w.grad, "  (by hand: 2 * (3w - 1) * 3 = 30)")

    print("\n== Lesson 2: a batch objective ==")
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    target = torch.tensor([0.0, 2.0])
    w = torch.tensor([1.0, -1.0], requires_grad=True)
    b = torch.tensor(0.0, requires_grad=True)
    prediction = x @ w + b
    loss = (prediction - target).square().mean()
    loss.backward()
    print("prediction ", prediction)
    print("loss       ", loss)
    print("w.grad     ", w.grad)
    print("b.grad     ", b.grad)

    print("\n== Lesson 3: gradients accumulate until cleared ==")
    w = torch.tensor(2.0, requires_grad=True)
    for _ in range(2):
        (3 * w - 1).square().backward()
        print("w.grad.item()", w.grad.item())
    w.grad = None
    (3 * w - 1).square().backward()
    print("after w.grad = None:", w.grad.item())

    import tape as tp

    print("\n== Gradient check against central finite differences (float64) ==")
    rng = np.random.default_rng(0)
    W1, W2, X = (
        rng.standard_normal((8, 16)),
        rng.standard_normal((16, 1)),
        rng.standard_normal((32, 8)),
    )

    def mlp_loss(W1, W2):
        return (tp.tanh(tp.tensor(X) @ W1) @ W2).square().mean()

    # (the gradient only: forward mode's kernels would add seconds of compile to a first run)
    print(
        "tp.gradcheck(mlp_loss, W1, W2, check_forward_ad=False) ->",
        tp.gradcheck(mlp_loss, W1, W2, check_forward_ad=False),
    )

    print("\n== Record once, replay many: Rosenbrock gradient ==")

    def rosen(x):
        return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

    from numba import njit

    @njit(cache=False)
    def rosen_grad(x):
        g = np.zeros_like(x)
        for i in range(x.shape[0] - 1):
            d = x[i + 1] - x[i] * x[i]
            g[i] += -400.0 * x[i] * d - 2.0 * (1.0 - x[i])
            g[i + 1] += 200.0 * d
        return g

    print(
        f"{'n':>8} {'interpreter':>12} {'compiled':>12} {'tape eager':>12} {'hand @njit':>12}"
        f" {'compiled/njit':>14} {'compile':>8}"
    )
    for n in (10, 1000, 100_000):
        x = rng.standard_normal(n)
        t = tp.record(rosen, x, compile=False)
        t0 = time.perf_counter()
        tc = tp.record(rosen, x, compile=True)  # code for this tape (cached on disk)
        t_compile = time.perf_counter() - t0
        assert np.allclose(t.gradient(x), rosen_grad(x), rtol=1e-10)
        assert np.allclose(tc.gradient(x), rosen_grad(x), rtol=1e-10)
        k = 2000 if n <= 1000 else 20

        def eager():
            xt = tp.tensor(x, requires_grad=True)
            rosen(xt).backward()
            return xt.grad

        ti = _best(lambda: t.gradient(x), k)
        tr = _best(lambda: tc.gradient(x), k)
        te = _best(eager, max(k // 10, 5))
        th = _best(lambda: rosen_grad(x), k)
        print(
            f"{n:>8} {ti * 1e6:>10.1f}us {tr * 1e6:>10.1f}us {te * 1e6:>10.1f}us "
            f"{th * 1e6:>10.1f}us {tr / th:>13.1f}x {t_compile:>7.1f}s"
        )
    print("\n== Beyond the gradient: Hessians and a trust-region solver (Rosenbrock n=100) ==")
    x = rng.uniform(-1.0, 2.0, 100)
    t = tp.record(rosen, x)
    pat = t.sparsity()
    print(f"Hessian pattern: {pat.hessian.nnz} nonzeros, {pat.n_hessian_colors} colours "
          "(Hessian-vector products per Hessian)")  # fmt: skip
    v = rng.standard_normal(100)
    eps = 1e-6
    fd = (t.gradient(x + eps * v) - t.gradient(x - eps * v)) / (2 * eps)
    print(f"|H v - finite differences of the gradient| = {np.abs(t.hvp(x, v=v) - fd).max():.1e}")
    print(
        f"one Hessian (sparse): {_best(lambda: t.hessian(x, sparse=True), 200) * 1e6:.0f} us, "
        f"one H v: {_best(lambda: t.hvp(x, v=v), 2000) * 1e6:.1f} us, "
        f"one gradient: {_best(lambda: t.gradient(x), 2000) * 1e6:.1f} us"
    )
    t0 = time.perf_counter()
    res = tp.optimize.minimize(rosen, np.zeros(100), method="trust-ncg", options={"gtol": 1e-10})
    print(
        f"tp.optimize.minimize(rosen, zeros(100), method='trust-ncg'): {res.nit} iterations, "
        f"{res.nhev} H v products, max |x - 1| = {np.abs(res.x - 1).max():.1e}, "
        f"{time.perf_counter() - t0:.2f} s"
    )

    print("\n(print(t) shows the Wengert list:)")
    print(tp.record(rosen, np.ones(4)))
    print("\nFull comparison with PyTorch, JAX and autograd: python -m tape.bench --quick")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] == "demo":
        demo()
        return 0
    print("usage: python -m tape demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
