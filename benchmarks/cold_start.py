"""Build cost: time to a first gradient in a new process, the demo, the test suite.

``python benchmarks/cold_start.py [--demo] [--suite] [--json FILE]``

Each figure comes from fresh Python processes with their own Numba and tape caches (a new
``NUMBA_CACHE_DIR`` and ``TAPE_CACHE_DIR``):

- ``default``: ``tp.record(rosen, x).gradient(x)`` with default settings (``compile="auto"``:
  the interpreter first), Rosenbrock at n = 1,000, float64, then float32 in the same process;
  from empty caches (``cold``: Numba compiles the ops the recording uses and the sweeps) and
  again on the caches that run left (``warm``, best of ``--warm-runs``; import included);
- ``compiled``: the same with ``compile=True`` (README's example), cold and warm;
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
