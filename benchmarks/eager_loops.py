"""Eager training loops, tape against PyTorch in the same run: ``python benchmarks/eager_loops.py``.

The loops (:mod:`tape.bench.eager`) are one piece of code run with ``T = tape`` and with
``T = torch``: a polynomial fit by hand-written gradient descent (2,000 steps on 2,000-element
tensors) and a small MLP trained with ``optim.Adam``. The polynomial fit also runs recorded
once with ``tape.record`` and replayed (tape's way for a hot loop). Both run in float64 on one thread; the
final losses are printed so agreement can be seen. Runs alternate between the libraries and
the best of ``--repeats`` is reported, with the ratio tape / torch. A third loop chains scalar
ops (eager mode's cost per op, backward included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args(argv)
    from tape.bench.cli import _cpu_name
    from tape.bench.eager import LOOPS, PER_OP, RECORDED, peers, time_loop

    libs = peers()
    print(f"CPU: {_cpu_name()} ({os.cpu_count()} cpus); one thread per library")
    print(f"{'loop':<12} " + " ".join(f"{n:>22}" for n in libs) + "   tape/torch")
    rows = {}
    for name, loop in LOOPS.items():
        res = {lib: time_loop(loop, T, a.repeats) for lib, T in libs.items()}
        rows[name] = {lib: {"seconds": s, "loss": loss} for lib, (s, loss) in res.items()}
        cells = " ".join(f"{s:8.3f} s (loss {loss:.5g})" for s, loss in res.values())
        ratio = f"{res['tape'][0] / res['torch'][0]:10.2f}x" if "torch" in res else ""
        print(f"{name:<12} {cells}   {ratio}")
        if name in PER_OP:
            per = {lib: s / PER_OP[name] * 1e6 for lib, (s, _) in res.items()}
            for lib, us in per.items():
                rows[name][lib]["us_per_op"] = us
            print(f"{'  per op':<12} " + " ".join(f"{us:8.2f} us{'':>12}" for us in per.values()))
        if name in RECORDED:
            s, loss = time_loop(RECORDED[name], libs["tape"], a.repeats)
            rows[name]["tape recorded"] = {"seconds": s, "loss": loss}
            ratio = f"{s / res['torch'][0]:10.2f}x" if "torch" in res else ""
            print(
                f"{'  recorded':<12} {s:8.3f} s (loss {loss:.5g}) (tape.record, compiled)   {ratio}"
            )
    if a.json:
        with open(a.json, "w") as f:
            date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            json.dump(dict(cpu=_cpu_name(), date=date, loops=rows), f, indent=1)


if __name__ == "__main__":
    main()
