"""
A fit and its loss curve
========================

A cubic fitted to noisy data with PyTorch's training-loop idioms, eagerly: tensors that
require grad, ``loss.backward()``, ``tape.optim.Adam``. Then the same loss recorded once with
:func:`tape.record` and replayed, which gives the same gradients without building a graph per
step.
"""

import matplotlib.pyplot as plt
import numpy as np

import tape as torch  # the PyTorch idioms, unchanged

rng = np.random.default_rng(0)
x = np.linspace(-1.0, 1.0, 200)
y = 0.5 - x + 2.0 * x**3 + 0.1 * rng.standard_normal(x.size)
X, Y = torch.tensor(x), torch.tensor(y)

coef = torch.zeros(4, requires_grad=True)
opt = torch.optim.Adam([coef], lr=0.05)
losses = []
for _ in range(300):
    opt.zero_grad()
    pred = coef[0] + coef[1] * X + coef[2] * X**2 + coef[3] * X**3
    loss = ((pred - Y) ** 2).mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("eager fit:", np.round(coef.detach().numpy(), 3))

# %%
# The same loss as a recorded tape: one trace, then one compiled call per gradient.


def mse(c):
    pred = c[0] + c[1] * x + c[2] * x**2 + c[3] * x**3
    return ((pred - y) ** 2).mean()


t = torch.record(mse, np.zeros(4))
c = np.zeros(4)
m, v = np.zeros(4), np.zeros(4)
replayed = []
for step in range(1, 301):  # Adam by hand, on NumPy arrays
    value, g = t.value_and_grad(c)
    replayed.append(float(value))
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    c -= 0.05 * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
print("replayed fit:", np.round(c, 3))
assert np.allclose(c, coef.detach().numpy(), atol=1e-8)

fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.5))
ax0.semilogy(losses, label="eager (tape.optim.Adam)")
ax0.semilogy(replayed, "--", label="recorded tape, replayed")
ax0.set_xlabel("step")
ax0.set_ylabel("mean squared error")
ax0.set_title("loss curve")
ax0.legend()
ax1.plot(x, y, ".", ms=3, alpha=0.5, label="data")
ax1.plot(x, np.polyval(c[::-1], x), "C3", label="fit")
ax1.set_title("the fitted cubic")
ax1.legend()
fig.tight_layout()
plt.show()
