"""
A trust-region solve and the Hessian's sparsity
===============================================

:func:`tape.optimize.minimize` runs SciPy's ``trust-ncg`` with the gradient and
Hessian-vector products of a recorded tape. The objective here is a discrete membrane on a
grid (a 5-point stencil plus a quartic term), so its Hessian is sparse: ``t.sparsity()``
finds the pattern by propagating dependencies over the tape and colours the columns so that
columns sharing no row share a colour. A sparse Hessian then costs one Hessian-vector product
per colour instead of one per column.
"""

import matplotlib.pyplot as plt
import numpy as np

import tape as tp

n = 8  # an n x n grid
load = np.outer(np.sin(np.linspace(0, np.pi, n)), np.sin(np.linspace(0, np.pi, n)))


def energy(u):
    g = u.reshape((n, n))
    dx = g[1:, :] - g[:-1, :]
    dy = g[:, 1:] - g[:, :-1]
    return (
        0.5 * (dx**2).sum() + 0.5 * (dy**2).sum() + 0.25 * (u**4).sum() - (load.ravel() * u).sum()
    )


values = []
res = tp.optimize.minimize(
    energy, np.zeros(n * n), method="trust-ncg", callback=lambda xk: values.append(energy(xk))
)
print(res.message, "iterations:", res.nit)

t = tp.record(energy, res.x)
sp = t.sparsity()
print("Hessian:", sp.hessian.shape, "nonzeros:", sp.hessian.nnz, "colours:", sp.n_hessian_colors)
H = t.hessian(res.x, sparse=True)
assert np.allclose(H.toarray(), t.hessian(res.x, sparse=False))

# %%
# The pattern, each nonzero drawn in its column's colour.
rows, cols = sp.hessian_nz
fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(12, 4))
ax0.scatter(cols, rows, c=sp.hessian_colors[cols], cmap="tab10", s=6, marker="s")
ax0.set_xlim(-0.5, n * n - 0.5)
ax0.set_ylim(n * n - 0.5, -0.5)
ax0.set_aspect("equal")
ax0.set_title(f"Hessian pattern, {sp.n_hessian_colors} colours")
ax1.imshow(sp.hessian_colors.reshape(n, n), cmap="tab10")
ax1.set_title("colour of each grid point's column")
ax2.semilogy(np.array(values) - min(values) + 1e-16, "o-")
ax2.set_xlabel("trust-ncg iteration")
ax2.set_title("energy - final energy")
fig.tight_layout()
plt.show()
