"""
An optimisation loop inside ``@njit``
=====================================

``t.njit_gradient`` is a recorded tape's gradient as a plain Numba function, which Numba
compiles into your own ``@njit`` code: here a gradient descent with momentum on the
two-dimensional Rosenbrock function runs 5,000 steps without returning to Python, keeping its
path to draw.
"""

import matplotlib.pyplot as plt
import numpy as np
from numba import njit

import tape as tp


def rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


t = tp.record(rosen, np.zeros(2))
grad = t.njit_gradient  # fn(x, gx, work): writes the gradient at x into gx


@njit
def descend(x, lr, beta, steps, work):
    gx = np.empty_like(x)
    v = np.zeros_like(x)
    path = np.empty((steps + 1, x.size))
    path[0] = x
    for i in range(steps):
        grad(x, gx, work)
        v = beta * v - lr * gx
        x = x + v
        path[i + 1] = x
    return path


path = descend(np.array([-1.5, 2.0]), 2e-4, 0.9, 5000, t.njit_workspace())
print("end point:", path[-1], "gradient there:", t.gradient(path[-1]))
assert np.all(np.isfinite(path)) and np.linalg.norm(path[-1] - 1) < np.linalg.norm(path[0] - 1)

# %%
# The path over the function's contours.
a, b = np.meshgrid(np.linspace(-2, 2, 200), np.linspace(-1, 3, 200))
z = 100 * (b - a**2) ** 2 + (1 - a) ** 2
fig, ax = plt.subplots(figsize=(6, 5))
ax.contour(a, b, np.log1p(z), levels=20, cmap="viridis")
ax.plot(path[:, 0], path[:, 1], "C3-", lw=1)
ax.plot(*path[0], "ko")
ax.plot(1, 1, "k*", ms=12)
ax.set_title("gradient descent with momentum, in @njit")
fig.tight_layout()
plt.show()
