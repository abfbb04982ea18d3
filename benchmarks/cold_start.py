"""Time to a first gradient in a new process: ``python benchmarks/cold_start.py``.

Runs README's example (record Rosenbrock at n = 1,000 with ``compile=True``, one replayed
gradient) in fresh Python processes, each timing ``import tape`` and the first gradient:

- ``cold``: empty caches (a new ``NUMBA_CACHE_DIR`` and ``TAPE_CACHE_DIR``), as after
  ``pip install``: Numba compiles the ops the recording uses and the tape's compiled code;
- ``warm``: the same caches again, as every later run;
- ``cold, interpreter``: the same example with ``compile=False`` from empty caches: the first
  gradient compiles the interpreter's sweeps (every op), once per installation.

It also times one eager scalar op (``y = y * 1.0001 + 0.5`` chains) in the warm process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import tape as tp
t1 = time.perf_counter()

def rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

t = tp.record(rosen, np.zeros(1000), compile=COMPILE)
g = t.gradient(np.random.default_rng(0).random(1000))
t2 = time.perf_counter()
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
per_op = (time.perf_counter() - t3) / (n * 100)
print(json.dumps(dict(import_s=t1 - t0, first_gradient_s=t2 - t0, eager_op_us=per_op * 1e6)))
"""


def run(cache, compile=True):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, TAPE_CACHE_DIR=os.path.join(cache, "tape"))
    env.pop("NUMBA_DISABLE_JIT", None)
    code = CHILD.replace("COMPILE", repr(compile))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--interpreter", action="store_true", help="also time the cold interpreter")
    ap.add_argument("--json", help="write the figures to this file (RESULTS.md quotes them)")
    a = ap.parse_args(argv)
    from tape.bench.cli import _cpu_name

    print(f"CPU: {_cpu_name()} ({os.cpu_count()} cpus)")
    with tempfile.TemporaryDirectory() as cache:
        cold = run(cache)
        warm = [run(cache) for _ in range(a.warm_runs)]
    best = min(warm, key=lambda r: r["first_gradient_s"])
    print(
        f"cold: import {cold['import_s']:.2f} s, first gradient after {cold['first_gradient_s']:.1f} s"
    )
    print(
        f"warm: import {best['import_s']:.2f} s, first gradient after {best['first_gradient_s']:.2f} s"
    )
    print(f"eager scalar op: {min(r['eager_op_us'] for r in warm):.2f} us")
    doc = dict(
        cpu=_cpu_name(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        cold_first_gradient_s=cold["first_gradient_s"],
        warm_first_gradient_s=best["first_gradient_s"],
        warm_import_s=best["import_s"],
        eager_op_us=min(r["eager_op_us"] for r in warm),
    )
    if a.interpreter:
        with tempfile.TemporaryDirectory() as cache:
            interp = run(cache, compile=False)
        print(f"cold, interpreter: first gradient after {interp['first_gradient_s']:.1f} s")
        doc["cold_interpreter_first_gradient_s"] = interp["first_gradient_s"]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
