"""Replay and eager speed of two commits, measured alternately on this machine.

``python benchmarks/ab_commits.py OLD NEW [--rounds 2] [--json FILE]``

For a refactor that must not change speed: each commit is checked out into a worktree of its
own (with its own Numba and tape caches), warmed once, then measured ``--rounds`` times,
alternating, so that drift of the machine hits both. Each measurement is a fresh process
that prints one JSON line (``--child``): the ``compile=True`` and interpreter gradient of
Rosenbrock at n = 10 and 1,000, the compiled gradient of ADBench GMM d10 K25 (1k points) and
LSTM l2 c1024 (``TAPE_ADBENCH_DIR`` or ``../shared/adbench``), best of 7 rounds each, and one
eager scalar op (``y = y * 1.0001 + 0.5`` chains). One thread, no compile helpers. Figures are
this machine's; compare them only with others from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def child():
    sys.path.insert(0, os.getcwd())
    import numpy as np

    import tape as tp
    from tape.bench import adbench, gmm, lstm
    from tape.bench.common import backend

    assert os.path.dirname(tp.__file__).startswith(os.getcwd()), tp.__file__
    B = backend("tape")
    root = adbench.find_data_dir(None)

    def problem(name):
        if name == "gmm":
            files = dict(adbench.gmm_files(root, "1k"))
            data = adbench.read_gmm(files[next(k for k in files if " d10 K25" in k)])
            f = gmm.make_objective(data.d, data.K, data.n, data.gamma, data.m)
            ps, cs = [data.alphas, data.means, data.icf], gmm.consts_for(data)
        else:
            data = next(
                d for d in (adbench.read_lstm(p) for _, p in adbench.lstm_files(root))
                if (d.l, d.c) == (2, 1024)
            )  # fmt: skip
            f = lstm.make_objective(data.l, data.c, data.b)
            ps, cs = [data.main_params, data.extra_params], (data.state, data.sequence)
        cs = [tp.tensor(c) if np.asarray(c).dtype.kind == "f" else np.asarray(c) for c in cs]
        return (lambda *p: f(B, p, cs)), ps

    def best(fn, reps, rounds=7):
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            out.append((time.perf_counter() - t0) / reps)
        return min(out)

    def rosen(x):
        return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

    res = {}
    for n in (10, 1000):
        x = np.random.default_rng(0).random(n)
        t = tp.record(rosen, x, compile=True)
        t.gradient(x)
        res[f"rosen{n}_compiled_us"] = best(lambda: t.gradient(x), 20000 if n == 10 else 5000) * 1e6
        ti = tp.record(rosen, x, compile=False)
        ti.gradient(x)
        res[f"rosen{n}_interp_us"] = best(lambda: ti.gradient(x), 5000 if n == 10 else 2000) * 1e6
    for name, reps in (("gmm", 100), ("lstm", 30)):
        f, ps = problem(name)
        t = tp.record(f, *ps, compile=True)
        t.gradient(*ps)
        res[f"{name}_compiled_ms"] = best(lambda: t.gradient(*ps), reps) * 1e3
    w = tp.tensor(2.0, requires_grad=True)

    def chain():
        y = w
        for _ in range(50):
            y = y * 1.0001 + 0.5
        return y

    chain()
    res["eager_op_us"] = best(chain, 100) / 100 * 1e6
    print(json.dumps(res))


def run(commit_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(commit_dir, ".nc"),
               TAPE_CACHE_DIR=os.path.join(commit_dir, ".tc"), OPENBLAS_NUM_THREADS="1",
               TAPE_COMPILE_WORKERS="0")  # fmt: skip
    env.setdefault("TAPE_ADBENCH_DIR", os.path.join(os.path.dirname(ROOT), "shared", "adbench"))
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child"], cwd=commit_dir, env=env,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    if "--child" in (argv or sys.argv[1:]):
        return child()
    a = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="tape-ab-")
    dirs = {}
    for tag, commit in (("old", a.old), ("new", a.new)):
        dirs[tag] = os.path.join(base, tag)
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", dirs[tag], commit], cwd=ROOT, check=True
        )
    try:
        for tag in dirs:
            run(dirs[tag])  # warm the caches
        rows = {"old": [], "new": []}
        for _ in range(a.rounds):
            for tag in dirs:
                rows[tag].append(run(dirs[tag]))
    finally:
        for d in dirs.values():
            subprocess.run(["git", "worktree", "remove", "--force", d], cwd=ROOT)
    report = dict(old=a.old, new=a.new, date=time.strftime("%Y-%m-%d"), runs=rows)
    for key in rows["old"][0]:
        o = " / ".join(f"{r[key]:.3f}" for r in rows["old"])
        n = " / ".join(f"{r[key]:.3f}" for r in rows["new"])
        print(f"{key:24s} old {o:24s} new {n}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
