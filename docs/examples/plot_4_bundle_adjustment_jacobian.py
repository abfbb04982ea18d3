"""
Bundle adjustment's Jacobian pattern
====================================

Bundle adjustment fits cameras and 3-D points to the image positions where each camera saw
each point. Each residual (the reprojection error of one observation) depends on one camera
and one point only, so the Jacobian is sparse with a block structure. ``t.sparsity()`` finds
the pattern from the tape, and a colouring of its columns lets ``t.jacobian(...,
sparse=True)`` evaluate the whole Jacobian with a handful of forward-mode directions, whatever
the number of cameras and points.

The camera model is a small one: a rotation vector (Rodrigues' formula), a translation and a
focal length.
"""

import matplotlib.pyplot as plt
import numpy as np

import tape as tp

rng = np.random.default_rng(2)
n_cams, n_pts, n_obs = 6, 40, 160
cams = np.concatenate(
    [
        0.1 * rng.standard_normal((n_cams, 3)),  # rotation vector
        rng.standard_normal((n_cams, 2)) * 0.5,
        np.full((n_cams, 1), -6.0),  # translation
        np.full((n_cams, 1), 1.0),
    ],
    axis=1,
)  # focal length
points = rng.standard_normal((n_pts, 3))
obs_cam = np.sort(rng.integers(0, n_cams, n_obs))
obs_pt = rng.integers(0, n_pts, n_obs)
seen = rng.standard_normal((n_obs, 2)) * 0.05  # fmt: skip


def residuals(cams, points):
    c, X = cams[obs_cam], points[obs_pt]
    r, tr, f = c[:, 0:3], c[:, 3:6], c[:, 6]
    theta = tp.sqrt((r * r).sum(axis=1) + 1e-12)[:, None]
    k = r / theta
    cos, sin = tp.cos(theta), tp.sin(theta)
    kx = (k * X).sum(axis=1)[:, None]
    cross = tp.stack([k[:, 1] * X[:, 2] - k[:, 2] * X[:, 1],
                      k[:, 2] * X[:, 0] - k[:, 0] * X[:, 2],
                      k[:, 0] * X[:, 1] - k[:, 1] * X[:, 0]], axis=1)  # fmt: skip
    P = X * cos + cross * sin + k * kx * (1 - cos) - tr
    proj = f[:, None] * P[:, 0:2] / P[:, 2:3]
    return (proj - seen).reshape(-1)


t = tp.record(residuals, cams, points)
sp = t.sparsity()
J = t.jacobian(cams, points, sparse=True)
dense = t.jacobian(cams, points, mode="rev")
assert np.allclose(J.toarray(), np.concatenate([j.reshape(2 * n_obs, -1) for j in dense], axis=1))
print(f"Jacobian {J.shape}, {J.nnz} nonzeros ({J.nnz / np.prod(J.shape):.1%}), "
      f"{sp.n_jacobian_colors} colours instead of {J.shape[1]} columns")  # fmt: skip

# %%
# Camera columns come first (7 per camera), then the points' (3 per point).
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 1]})
rows, cols = sp.jacobian_nz
ax0.scatter(cols, rows, c=sp.jacobian_colors[cols], cmap="tab10", s=4, marker="s")
ax0.axvline(7 * n_cams - 0.5, color="k", lw=0.5)
ax0.set_xlim(-0.5, J.shape[1] - 0.5)
ax0.set_ylim(J.shape[0] - 0.5, -0.5)
ax0.set_xlabel("parameter (cameras | points)")
ax0.set_ylabel("residual")
ax0.set_title(f"Jacobian pattern, coloured by column colour ({sp.n_jacobian_colors} colours)")
ax1.bar(["dense\n(one per column)", "coloured"], [J.shape[1], sp.n_jacobian_colors])
ax1.set_ylabel("forward-mode directions")
fig.tight_layout()
plt.show()
