"""Memory and time of ``tape.checkpoint`` on the ADBench LSTM: ``python benchmarks/checkpoint_lstm.py``.

The LSTM objective of ``tape.bench.lstm`` recorded over the same data as the benchmark writes
it (the time loop unrolled onto one tape), replayed on the interpreter and on the compiled tier
(``record`` time then includes the compile, or its load from the disk cache), and with every
time step wrapped in ``tape.checkpoint`` (the step's weights read from the closure; the
sub-tape gets the compiled tier after 100 replays, the tape around it stays on the
interpreter). For each: the tape's length,
the memory a replay holds (the tape's arrays, its recorded arena and one workspace, plus the
same for the shared sub-tape of a checkpointed step), the peak of NumPy allocations during
recording and during one gradient (``tracemalloc``, which also slows the recording and the
compile it includes), the gradient time, and the largest difference between the gradients.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402


def held_bytes(t):
    """The tape's arrays and recorded arena, and one replay workspace (value and adjoint
    arenas); with the same for every sub-tape of its checkpoints."""
    total = t.nbytes + 2 * t.n_data * t.dtype.itemsize
    for sub in getattr(t, "_checkpoints", {}).values():
        total += held_bytes(sub)
    return total


def timed(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def build(data, checkpointed, compile=False):
    """A recording of the objective; the step under ``tape.checkpoint`` if ``checkpointed``."""
    import tape as tp
    from tape.bench import lstm
    from tape.bench.common import backend

    B = backend("tape")
    l, b = data.l, data.b
    seq = tp.tensor(data.sequence)
    state = tp.tensor(data.state)

    def objective(main, extra):
        layers = lstm._layers(main, l, b)
        h = [state[2 * i] for i in range(l)]
        c = [state[2 * i + 1] for i in range(l)]

        def step(*a):  # hidden states, cell states, this character, the next one
            hs, cs, ll = lstm.step(B, layers, extra, a[:l], a[l : 2 * l], a[2 * l], a[2 * l + 1])
            return (*hs, *cs, ll)

        total = 0.0
        for s in range(data.c - 1):
            if checkpointed:
                out = tp.checkpoint(step, *h, *c, seq[s], seq[s + 1])
            else:
                out = step(*h, *c, seq[s], seq[s + 1])
            h, c, ll = list(out[:l]), list(out[l : 2 * l]), out[2 * l]
            total = total + ll
        return -total / ((data.c - 1) * b)

    return tp.record(objective, data.main_params, data.extra_params, compile=compile)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="l2 c1024", help="ADBench LSTM file label, e.g. 'l2 c4096'")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    from tape.bench import adbench
    from tape.bench.cli import _cpu_name

    root = adbench.find_data_dir()
    files = dict(adbench.lstm_files(root)) if root is not None else {}
    if a.size not in files:
        sys.exit(f"no ADBench LSTM data {a.size!r} (found: {sorted(files)})")
    data = adbench.read_lstm(files[a.size])
    args = (data.main_params, data.extra_params)
    print(f"CPU: {_cpu_name()} ({os.cpu_count()} cpus); ADBench LSTM {a.size}, b={data.b}")
    head = f"{'tape':<14} {'entries':>8} {'held MiB':>9} {'record peak MiB':>16} {'grad peak MiB':>14} {'record s':>9} {'grad ms':>8}"
    print(head)
    grads = {}
    runs = (("plain", False, False), ("plain compiled", False, True), ("checkpointed", True, False))
    for name, ck, comp in runs:
        gc.collect()
        tracemalloc.start()
        t0 = time.perf_counter()
        t = build(data, ck, comp)
        rec_s = time.perf_counter() - t0
        rec_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        t.gradient(*args)  # first replay: workspaces made, kernels loaded
        gc.collect()
        tracemalloc.start()
        g = t.gradient(*args)
        grad_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        ms = 1e3 * timed(lambda: t.gradient(*args), a.repeat)
        grads[name] = np.concatenate([np.ravel(x) for x in g])
        mib = 1 / 2**20
        print(
            f"{name:<14} {len(t):>8} {held_bytes(t) * mib:>9.2f} {rec_peak * mib:>16.2f} "
            f"{grad_peak * mib:>14.2f} {rec_s:>9.2f} {ms:>8.2f}"
        )
    d = max(np.abs(grads["plain"] - grads[k]).max() for k in grads)
    print(f"largest gradient difference: {d:.3g} (scale {np.abs(grads['plain']).max():.3g})")


if __name__ == "__main__":
    main()
