"""
Fitting a Gaussian mixture
==========================

The negative log-likelihood of a two-dimensional Gaussian mixture, written with NumPy-style
tape functions (``tp.logsumexp`` over the components), minimised by SciPy's L-BFGS with the
gradient from a recorded tape (:func:`tape.optimize.minimize`). The parameters are one flat
vector: mixture logits, means and log standard deviations (diagonal covariances).
"""

import matplotlib.pyplot as plt
import numpy as np

import tape as tp

rng = np.random.default_rng(1)
true_means = np.array([[-2.0, 0.0], [1.5, 1.5], [1.0, -2.0]])
data = np.concatenate([m + s * rng.standard_normal((n, 2))
                       for m, s, n in zip(true_means, (0.5, 0.7, 0.4), (150, 200, 100))])  # fmt: skip
K, d = 3, 2


def unpack(p):
    return p[:K], p[K : K + K * d].reshape((K, d)), p[K + K * d :].reshape((K, d))


def nll(p):
    logits, means, log_s = unpack(p)
    z = (data[:, None, :] - means[None, :, :]) * tp.exp(-log_s)[None, :, :]
    log_comp = -0.5 * (z**2).sum(axis=2) - log_s.sum(axis=1) - d * 0.5 * np.log(2 * np.pi)
    log_w = logits - tp.logsumexp(logits)
    return -tp.logsumexp(log_comp + log_w, axis=1).sum() / data.shape[0]


p0 = np.concatenate([np.zeros(K), data[rng.choice(len(data), K, replace=False)].ravel(),
                     np.zeros(K * d)])  # fmt: skip
t = tp.record(nll, p0)  # to draw the objective at each iterate
trace = [float(t.forward(p0))]
res = tp.optimize.minimize(
    nll, p0, method="L-BFGS-B", callback=lambda xk: trace.append(float(t.forward(xk)))
)
logits, means, log_s = unpack(res.x)
weights = np.exp(logits - np.logaddexp.reduce(logits))
print("weights:", np.round(weights, 3))
print("means:", np.round(means, 2).tolist())
assert res.success and np.linalg.norm(t.gradient(res.x)) < 1e-4

# %%
# The data, the fitted components (one and two standard deviations) and the objective.
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 4))
ax0.plot(data[:, 0], data[:, 1], ".", ms=3, color="0.5")
angle = np.linspace(0, 2 * np.pi, 100)
for k in range(K):
    s = np.exp(log_s[k])
    for r in (1, 2):
        ax0.plot(means[k, 0] + r * s[0] * np.cos(angle), means[k, 1] + r * s[1] * np.sin(angle),
                 color=f"C{k}", lw=2 / r)  # fmt: skip
ax0.set_aspect("equal")
ax0.set_title("fitted mixture")
ax1.plot(trace, "o-")
ax1.set_xlabel("L-BFGS iteration")
ax1.set_ylabel("negative log-likelihood per point")
fig.tight_layout()
plt.show()
