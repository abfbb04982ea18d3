"""What a user-defined op costs: ``python benchmarks/custom_op.py``.

The same function, ``sum(c * tanh(x / c))``, recorded twice: once from registry ops, once as
one ``tape.custom_op`` with ``@njit`` forward and vjp. Gradient replay time of both, on the
interpreter and on the compiled tier, at a small and a large size; the difference at the
small size is the per-application cost of the custom op (one dispatcher call each way on the
interpreter; a direct call from the compiled tier's generated code).
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402


@njit
def softclip_fwd(x, c):
    return c * np.tanh(x / c)


@njit
def softclip_vjp(gy, y, x, c):
    r = y / c
    d = 1.0 - r * r
    return gy * d, np.full_like(c, np.sum(gy * (r - (x / c) * d)))


def best(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10, 100_000])
    a = ap.parse_args(argv)
    import tape as tp
    from tape.bench.cli import _cpu_name

    softclip = tp.custom_op("softclip", softclip_fwd, softclip_vjp)
    print(f"CPU: {_cpu_name()} ({os.cpu_count()} cpus)")
    print(f"{'n':>8} {'tier':<12} {'registry ops':>14} {'custom op':>12} {'difference':>12}")
    for n in a.sizes:
        x = np.linspace(-2.0, 2.0, n)
        c = np.array(1.5)
        number = max(1, 20_000 // max(1, n // 100))
        for tier in ("interpreter", "compiled"):
            tapes = [
                tp.record(lambda x, c: (c * tp.tanh(x / c)).sum(), x, c, compile=False),
                tp.record(lambda x, c: softclip(x, c).sum(), x, c, compile=False),
            ]
            if tier == "compiled":
                for t in tapes:
                    t.compile()
            times = []
            for t in tapes:
                t.gradient(x, c)
                times.append(best(lambda t=t: t.gradient(x, c), number))
            np.testing.assert_allclose(tapes[0].gradient(x, c)[0], tapes[1].gradient(x, c)[0])
            print(f"{n:>8} {tier:<12} {times[0] * 1e6:>11.2f} us {times[1] * 1e6:>9.2f} us "
                  f"{(times[1] - times[0]) * 1e6:>9.2f} us")  # fmt: skip


if __name__ == "__main__":
    main()
