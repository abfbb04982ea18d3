"""Replay throughput of one tape from 1 and 2 Python threads (``python benchmarks/thread_scaling.py``).

Each thread calls ``t.gradient(x)`` on the same tape; every replay runs on the calling thread's
workspace and the compiled sweeps release the GIL, so threads can overlap. Reports replays
per second with 1 and 2 threads and their ratio (the 2-thread speedup), for problems whose
replay is short (Python overhead dominates) and long (the sweeps dominate), after checking
that the threaded gradients are bit-identical to serial ones.

Tapes with matmul call BLAS, which runs its own threads: with as many replay threads as cores,
run with one BLAS thread (``OPENBLAS_NUM_THREADS=1``, or ``threadpoolctl``), or the two kinds
of threads compete for the cores. Replays of a few microseconds do not speed up from Python
threads: the Python part of each call (argument checks, copies) holds the GIL, and handing the
GIL between threads costs more than the sweep saves; batch them (``t.gradient_batch``) instead.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

import tape as tp
from tape.bench.cli import _cpu_name


def _rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def _mlp(W1, W2, X):
    return (tp.tanh(X @ W1) @ W2).square().mean()


def problems(rng):
    yield "rosenbrock n=1,000", tp.record(_rosen, np.zeros(1000)), (rng.standard_normal(1000),)
    yield (
        "rosenbrock n=100,000",
        tp.record(_rosen, np.zeros(100_000)),
        (rng.standard_normal(100_000),),
    )
    args = (
        rng.standard_normal((64, 256)),
        rng.standard_normal((256, 1)),
        rng.standard_normal((512, 64)),
    )
    yield "mlp 512x64-256-1", tp.record(_mlp, *args, wrt=(0, 1)), args


def throughput(t, args, n_threads, seconds):
    """Replays per second summed over ``n_threads`` threads running for ``seconds``."""
    counts = [0] * n_threads
    stop = time.perf_counter() + seconds
    start = threading.Barrier(n_threads)

    def run(k):
        start.wait()
        n = 0
        while time.perf_counter() < stop:
            t.gradient(*args)
            n += 1
        counts[k] = n

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(counts) / (time.perf_counter() - t0)


def check_identical(t, args):
    ref = t.gradient(*args)
    out = []

    def run():
        out.append(t.gradient(*args))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for g in out:
        for a, b in zip(
            g if isinstance(g, tuple) else (g,), ref if isinstance(ref, tuple) else (ref,)
        ):
            assert np.array_equal(a, b), "threaded replay differs from serial"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"CPU: {_cpu_name()} ({os.cpu_count()} cpus)")
    print(f"{'problem':<24} {'1 thread /s':>12} {'2 threads /s':>13} {'speedup':>8}")
    for name, t, args in problems(rng):
        check_identical(t, args)
        throughput(t, args, 1, 0.2)  # warm-up
        one = throughput(t, args, 1, a.seconds)
        two = throughput(t, args, 2, a.seconds)
        print(f"{name:<24} {one:>12.0f} {two:>13.0f} {two / one:>7.2f}x")


if __name__ == "__main__":
    main()
