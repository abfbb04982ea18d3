"""Build cost: time to a first gradient in a new process, the demo, the test suite.

``python benchmarks/cold_start.py [--compiled-tier] [--demo] [--suite] [--json FILE]``

Each figure comes from fresh Python processes with their own Numba and tape caches (a new
``NUMBA_CACHE_DIR`` and ``TAPE_CACHE_DIR``):

- ``default``: ``tp.record(rosen, x).gradient(x)`` with default settings (``compile="auto"``:
  the interpreter first), Rosenbrock at n = 1,000, float64, then float32 in the same process;
  from empty caches (``cold``: Numba compiles the ops the recording uses and the sweeps) and
  again on the caches that run left (``warm``, best of ``--warm-runs``; import included);
- ``compiled``: the same with ``compile=True`` (README's example), cold and warm;
- ``--compiled-tier``: the compiled tier's compile of ADBench GMM d10 K25 (1k points) and
  LSTM l2 c1024 (``t.compile()`` and its first gradient, the interpreter's kernels already in
  Numba's cache, the tape cache empty), and the memory that each of 20 small distinct
  compiled tapes adds to a process (current resident memory, after the first);
- ``--demo``: README's first command's program (``python -m tape demo``) from empty caches:
  seconds to its first line of output and in all;
- ``--suite``: README's test command (``python -m pytest``) from empty caches: wall time and
  the peak resident memory of the largest process.

It also times one eager scalar op (``y = y * 1.0001 + 0.5`` chains) in a warm process.
Timings are figures of this machine; compare them with others measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import tape as tp
t1 = time.perf_counter()

def rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

out = dict(import_s=t1 - t0)
for dt in ("float64", "float32"):
    s = time.perf_counter()
    x = np.random.default_rng(0).random(1000).astype(dt)
    t = tp.record(rosen, x, compile=COMPILE)
    g = t.gradient(x)
    assert g.dtype == np.dtype(dt) and np.isfinite(g).all()
    out[dt + "_s"] = time.perf_counter() - s
out["first_gradient_s"] = out["import_s"] + out["float64_s"]
w = tp.tensor(2.0, requires_grad=True)
def chain():
    y = w
    for _ in range(50):
        y = y * 1.0001 + 0.5
    return y
chain()
n = 100
t3 = time.perf_counter()
for _ in range(n):
    chain()
out["eager_op_us"] = (time.perf_counter() - t3) / (n * 100) * 1e6
print(json.dumps(out))
"""


TIER = r"""
import json, resource, sys, time
import numpy as np
import tape as tp
from tape.bench import adbench, gmm, lstm
from tape.bench.common import backend

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
        )
        f = lstm.make_objective(data.l, data.c, data.b)
        ps, cs = [data.main_params, data.extra_params], (data.state, data.sequence)
    cs = [tp.tensor(c) if np.asarray(c).dtype.kind == "f" else np.asarray(c) for c in cs]
    return (lambda *p: f(B, p, cs)), ps


def rss_mib():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def small(k):  # 20 small tapes, no two alike
    ops = [tp.sin, tp.exp, tp.tanh, tp.sigmoid, tp.cos]
    def f(x, w):
        y = x
        for j in range(3 + k % 4):
            y = ops[(j + k) % 5](y) * w
        return (y * y).sum() + (x[1:] * x[:-1]).sum() * (k + 1)
    return f


out = {}
for name in sys.argv[1:]:
    if name == "memory":
        x, w = np.linspace(0.1, 1.0, 12), np.linspace(1.0, 2.0, 12)
        tp.record(small(0), x, w, compile=True)  # what every compiled tape needs, loaded
        before = rss_mib()
        for k in range(1, 21):
            tp.record(small(k), x, w, compile=True).gradient(x, w)
        out["memory_per_compiled_tape_mib"] = (rss_mib() - before) / 20
        continue
    fn, ps = problem(name)
    t = tp.record(fn, *ps, wrt=list(range(len(ps))), compile=False)
    t.gradient(*ps)  # the interpreter's kernels: not part of the compiled tier's compile
    s = time.perf_counter()
    t.compile()
    t.gradient(*ps)
    out[name + "_compile_s"] = time.perf_counter() - s
print(json.dumps(out))
"""


def compiled_tier(cache):
    """The compiled tier's compile (GMM d10 K25 and LSTM l2 c1024: ``t.compile()`` and the
    first gradient, after the interpreter's kernels are in Numba's cache; its own cache
    empty), and the memory each of 20 small distinct compiled tapes adds to the process."""
    out = {}
    for names in (["gmm"], ["lstm"], ["memory"]):
        env = _env(cache)
        warm = subprocess.run(
            [sys.executable, "-c", TIER] + [n for n in names if n != "memory"],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )  # fmt: skip  (fills Numba's cache with the interpreter's kernels)
        env["TAPE_CACHE_DIR"] = os.path.join(cache, "tape-" + names[0])  # its own, empty
        got = subprocess.run(
            [sys.executable, "-c", TIER] + names, env=env, capture_output=True, text=True,
            cwd=ROOT,
        )  # fmt: skip
        for r in (warm, got):
            if r.returncode:
                raise RuntimeError(r.stderr)
        out.update(json.loads(got.stdout.strip().splitlines()[-1]))
    return out


def _env(cache):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, TAPE_CACHE_DIR=os.path.join(cache, "tape"))
    env.pop("NUMBA_DISABLE_JIT", None)
    return env


def run(cache, compile="auto"):
    code = CHILD.replace("COMPILE", repr(compile))
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(cache), capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def demo(cache):
    """``python -m tape demo`` from empty caches: (seconds to the first line, seconds in all)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "tape", "demo"], env=_env(cache), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    first = None
    for _ in p.stdout:
        if first is None:
            first = time.perf_counter() - t0
    if p.wait():
        raise RuntimeError("the demo failed")
    return first, time.perf_counter() - t0


def suite(cache):
    """README's test command from empty caches: (wall seconds, peak RSS of a process in MiB,
    exit status)."""
    t0 = time.perf_counter()
    rc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q"], env=_env(cache), cwd=ROOT
    ).returncode
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, peak_kib / 1024, rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--demo", action="store_true", help="also time the demo from empty caches")
    ap.add_argument(
        "--compiled-tier", action="store_true",
        help="also time the compiled tier's compile (GMM, LSTM) and its memory per tape",
    )  # fmt: skip
    ap.add_argument("--suite", action="store_true", help="also time the test suite (minutes)")
    ap.add_argument("--json", help="write the figures to this file (RESULTS.md quotes them)")
    a = ap.parse_args(argv)
    from tape.bench.cli import _cpu_name

    print(f"CPU: {_cpu_name()} ({os.cpu_count()} cpus)")
    doc = dict(
        cpu=_cpu_name(),
        cpus=os.cpu_count(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    for label, compile in (("default", "auto"), ("compiled", True)):
        with tempfile.TemporaryDirectory() as cache:
            cold = run(cache, compile)
            warm = [run(cache, compile) for _ in range(a.warm_runs)]
        best = min(warm, key=lambda r: r["first_gradient_s"])
        print(
            f"{label}: cold first gradient after {cold['first_gradient_s']:.1f} s (import "
            f"{cold['import_s']:.2f} s), float32 after float64 {cold['float32_s']:.1f} s; warm "
            f"{best['first_gradient_s']:.2f} s (import {best['import_s']:.2f} s)"
        )
        doc[label] = dict(
            cold_first_gradient_s=cold["first_gradient_s"],
            cold_float32_after_float64_s=cold["float32_s"],
            warm_first_gradient_s=best["first_gradient_s"],
            warm_import_s=best["import_s"],
        )
        doc["eager_op_us"] = min(r["eager_op_us"] for r in warm)
    print(f"eager scalar op: {doc['eager_op_us']:.2f} us")
    if a.compiled_tier:
        with tempfile.TemporaryDirectory() as cache:
            tier = compiled_tier(cache)
        print(
            f"compiled tier: GMM d10 K25 compiles in {tier['gmm_compile_s']:.1f} s, LSTM l2 "
            f"c1024 in {tier['lstm_compile_s']:.1f} s; a small compiled tape adds "
            f"{tier['memory_per_compiled_tape_mib']:.1f} MiB"
        )
        doc["compiled_tier"] = tier
    if a.demo:
        with tempfile.TemporaryDirectory() as cache:
            first, total = demo(cache)
        print(f"demo from empty caches: first line after {first:.1f} s, {total:.1f} s in all")
        doc["demo"] = dict(first_line_s=first, total_s=total)
    if a.suite:
        with tempfile.TemporaryDirectory() as cache:
            wall, rss, rc = suite(cache)
        print(
            f"test suite from empty caches: {wall / 60:.1f} min, peak RSS {rss:.0f} MiB, exit {rc}"
        )
        doc["suite"] = dict(wall_s=wall, peak_rss_mib=rss, exit_status=rc)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
