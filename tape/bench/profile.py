"""Where a recorded tape spends its time: each entry's forward and reverse rule timed alone.

``python -m tape.bench.profile PROBLEM [CASE]`` (for example ``gmm "1k d10 K25"``) prints the
ops that take the most time, summed by (op, output shape). Each entry is run by itself through
the compiled sweeps (``forward_sweep``/``reverse_sweep`` over ``[i, i + 1)``) many times, so the
per-call overhead of entering Numba from Python (~0.3 us) is subtracted using an empty range.
The sum over entries is compared with the whole ``gradient()`` call: the difference is the
fixed cost of a call (argument checks and copies, ``reach``, zeroing adjoints).
"""

from __future__ import annotations

import sys
import time


def profile_tape(t, args, repeat=5, min_time=2e-4):
    """Per-entry forward and reverse times of a recorded tape ``t`` at ``args``.
    Returns ``(rows, total_gradient_s)``; rows are ``(entry, op, out shape, fwd_s, rev_s)``."""
    from tape.interpreter.generated import sweeps
    from tape.layout.columns import E_OUT
    from tape.program.callbacks import entry_name

    t.gradient(*args)  # fills this thread's workspace, compiles
    t, ws = t.last_replay()  # the tape that ran (a retraced variant, if one did) and its workspace
    r = t._replay
    emask, need = sweeps.reach(t.entries, t.bufs, t.n_entries, r["roots"])
    data, grad = ws.data, ws.grad
    saved = grad.copy()

    def clock(fn):
        n = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
            n *= 2
        best = dt / n
        for _ in range(repeat - 1):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n)
        return best

    base_f = clock(lambda: sweeps.forward_sweep(t.entries, t.bufs, t.ipool, data, 0, 0))
    base_r = clock(
        lambda: sweeps.reverse_sweep(t.entries, t.bufs, t.ipool, data, grad, emask, 0, 0)
    )
    rows = []
    for i in range(t.n_entries):
        tf = (
            clock(lambda: sweeps.forward_sweep(t.entries, t.bufs, t.ipool, data, i, i + 1)) - base_f
        )
        tr = 0.0
        if emask[i]:
            tr = (
                clock(
                    lambda: sweeps.reverse_sweep(
                        t.entries, t.bufs, t.ipool, data, grad, emask, i, i + 1
                    )
                )
                - base_r
            )
        op = entry_name(t, i)  # a registry op's name, or a Python callback's
        rows.append((i, op, t.shapes[t.entries[i, E_OUT]], max(tf, 0.0), max(tr, 0.0)))
    grad[:] = saved
    total = clock(lambda: t.gradient(*args))
    return rows, total


def summarize(rows, total, top=15, file=sys.stdout):
    groups = {}
    for _i, op, shape, tf, tr in rows:
        g = groups.setdefault((op, shape), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += tf
        g[2] += tr
    sf = sum(r[3] for r in rows)
    sr = sum(r[4] for r in rows)
    print(f"{len(rows)} entries; gradient() call {total * 1e6:.1f} us; sum of entries: forward "
          f"{sf * 1e6:.1f} us, reverse {sr * 1e6:.1f} us; rest (call overhead, reach, zeroing) "
          f"{(total - sf - sr) * 1e6:.1f} us", file=file)  # fmt: skip
    print(
        f"{'op':10s} {'out shape':>16s} {'count':>6s} {'fwd us':>9s} {'rev us':>9s} {'share':>6s}",
        file=file,
    )
    for (op, shape), (n, tf, tr) in sorted(groups.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[
        :top
    ]:
        print(
            f"{op:10s} {str(shape):>16s} {n:6d} {tf * 1e6:9.1f} {tr * 1e6:9.1f} {100 * (tf + tr) / total:5.1f}%",
            file=file,
        )


def _tape_for(problem, label, quick=False):
    from tape.bench.cli import problems
    from tape.bench.harness import Opts

    (p,) = [p for p in problems() if p.name == problem]
    cases = p.cases(Opts(quick=quick))
    case = cases[0] if label is None else next(c for c in cases if c.label.startswith(label))
    impl = case.builders["tape"]()
    return impl, case


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    impl, case = _tape_for(argv[0], argv[1] if len(argv) > 1 else None)
    t, args = impl.tape, impl.args
    print(f"{case.problem} {case.label}")
    rows, total = profile_tape(t, args)
    summarize(rows, total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
