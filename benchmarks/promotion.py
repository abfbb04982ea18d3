"""Automatic promotion: time to the N-th gradient of a plainly written objective, compile included.

``python benchmarks/promotion.py [--cold] [--runs R] [--json benchmarks/promotion.json]``

The objective is ADBench's GMM (1k points, d = 10, K = 25) written as a NumPy user would write
it: a Python loop over the components, each a gather, a small matmul and a sum, then a
``logsumexp`` over the components. The same function runs with ``xp = tape`` and with
``xp = jax.numpy``. Each configuration runs in a fresh Python process that records (or traces)
the function and calls its gradient 200 times, and reports the seconds from the start of the
recording to the 1st, 10th, 50th and 200th gradient:

- ``tape auto``: ``tp.record(f, ...)`` with default settings (``compile="auto"``: the
  interpreter, promoted by time in a background thread, or at the 100th replay);
- ``tape count only``: the same with promotion by time switched off
  (``t.compile_after_seconds = None``: the rule before it existed, the 100th replay);
- ``tape interpreter``: ``compile=False``;
- ``tape compile=True``: compiled before the first gradient;
- ``jax jit``: ``jax.jit(jax.grad(f))`` (x64), compile included in the first call.

By default the caches are warm (a second run of the same script: Numba's and tape's caches
hold what the first run compiled); ``--cold`` gives every configuration empty caches. Every
gradient is checked against the hand-written Numba objective's value and JAX's gradient.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tape.bench.cli import _cpu_name

ROOT = Path(__file__).resolve().parents[1]
MARKS = (1, 10, 50, 200)

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from tape.bench import adbench, gmm

root = adbench.find_data_dir(None)
files = dict(adbench.gmm_files(root, "1k"))
data = adbench.read_gmm(files[next(k for k in files if " d10 K25" in k)])
d, K, n = data.d, data.K, data.n
lidx, mask = gmm.lower_index(d)
const = gmm.constant_term(d, K, n, data.gamma, data.m)
x = np.ascontiguousarray(data.x)


def objective(xp, lse):
    def f(alphas, means, icf):
        cols = []
        for k in range(K):
            q = icf[k, :d]
            L = icf[k][lidx].reshape((d, d)) * mask
            xc = x - means[k]
            z = xc @ (xp.diag(xp.exp(q)) + L).T
            cols.append(alphas[k] + q.sum() - 0.5 * (z * z).sum(axis=1))
        main = xp.stack(cols, axis=1)
        qd = xp.exp(icf[:, :d])
        prior = 0.5 * data.gamma**2 * ((qd * qd).sum() + (icf[:, d:] ** 2).sum())
        prior = prior - data.m * icf[:, :d].sum()
        return const + lse(main, 1).sum() - n * lse(alphas, 0) + prior
    return f


params = [data.alphas, data.means, data.icf]
which = sys.argv[1]
if which == "jax jit":
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp
    grad_fn = jax.jit(jax.grad(objective(jnp, lambda a, ax: logsumexp(a, axis=ax)), argnums=(0, 1, 2)))
    call = lambda: [np.asarray(v) for v in grad_fn(*params)]
else:
    import tape as tp
    f = objective(tp, lambda a, ax: tp.logsumexp(a, axis=ax))
    mode = {"tape auto": "auto", "tape count only": "auto", "tape interpreter": False,
            "tape compile=True": True}[which]
    t = tp.record(f, *params, wrt=[0, 1, 2], compile=mode)
    if which == "tape count only":
        t.compile_after_seconds = None
    call = lambda: list(t.gradient(*params))
marks, out, first = set(MARKS), {}, None
for i in range(1, max(MARKS) + 1):
    g = call()
    if first is None:
        first = g
    if i in marks:
        out[str(i)] = time.perf_counter() - t0
last = g
if which != "jax jit":
    out["tier_at_end"] = t.tier
    ref = float(gmm.gmm_objective_njit(data.alphas, data.means, data.icf, x, data.gamma, data.m, const))
    val = float(t.value_and_grad(*params)[0])
    assert abs(val - ref) <= 1e-9 * abs(ref), (val, ref)
print(json.dumps({"times": out, "grad": [np.asarray(v).ravel().tolist() for v in last]}))
""".replace("MARKS", repr(MARKS))

CONFIGS = ("tape auto", "tape count only", "tape interpreter", "tape compile=True", "jax jit")


def run(which, cache, env_base):
    env = dict(env_base, NUMBA_CACHE_DIR=os.path.join(cache, "numba"),
               TAPE_CACHE_DIR=os.path.join(cache, "tape"))  # fmt: skip
    p = subprocess.run([sys.executable, "-c", CHILD, which], env=env, capture_output=True,
                       text=True, cwd=ROOT)  # fmt: skip
    if p.returncode:
        raise RuntimeError(f"{which}: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="empty caches for every run")
    ap.add_argument("--runs", type=int, default=1, help="runs per configuration (alternated)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    env.pop("NUMBA_DISABLE_JIT", None)
    res = {c: [] for c in CONFIGS}
    grads = {}
    with tempfile.TemporaryDirectory() as tmp:
        shared = os.path.join(tmp, "warm")
        if not a.cold:  # a first run of each fills the caches
            for c in CONFIGS:
                run(c, shared, env)
        for r in range(a.runs):
            for c in CONFIGS:
                cache = os.path.join(tmp, f"cold-{r}-{c.replace(' ', '_')}") if a.cold else shared
                got = run(c, cache, env)
                res[c].append(got["times"])
                grads[c] = got["grad"]
    import numpy as np

    ref = grads["jax jit"]
    for c, g in grads.items():
        for u, v in zip(g, ref):
            err = np.max(np.abs(np.subtract(u, v))) / max(1.0, np.max(np.abs(v)))
            if err > 1e-8:
                raise AssertionError(f"{c}: gradient differs from JAX's by {err:.2e}")
    print(f"time to the N-th gradient (s), {'empty' if a.cold else 'warm'} caches, "
          f"{_cpu_name()}, {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'':20s}" + "".join(f"{n:>16d}" for n in MARKS))
    for c in CONFIGS:
        cells = []
        for n in MARKS:
            v = sorted(t[str(n)] for t in res[c])
            cells.append(f"{v[0]:.2f}" if len(v) == 1 else f"{v[0]:.2f}-{v[-1]:.2f}")
        print(f"{c:20s}" + "".join(f"{x:>16s}" for x in cells))
    if a.json:  # one key per kind of run ("warm", "cold"), the other kept
        path = Path(a.json)
        old = json.loads(path.read_text()) if path.is_file() else {}
        old["cold" if a.cold else "warm"] = {
            "date": datetime.date.today().isoformat(), "cold": a.cold, "cpus": os.cpu_count(),
            "machine": _cpu_name(), "times": res,
        }  # fmt: skip
        path.write_text(json.dumps(old, indent=1) + "\n")


if __name__ == "__main__":
    main()
