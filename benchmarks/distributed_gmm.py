"""GMM objective and gradient on a Dask cluster: scaling with the number of workers
(``python benchmarks/distributed_gmm.py``; ``--points 100000`` for a quick check).

The ADBench GMM objective (``tape/bench/gmm.py``, d = 10, K = 25 by default) over a million
points is split into a sum over chunks of rows. Per chunk, the objective is ``make_objective``
of ``tape.bench.gmm`` evaluated on that chunk minus the parameter-only terms (the Wishart prior
and the constant ``K C``); the client adds those back once, from a small tape of its own. The
sum over chunks is the objective over all points: the script checks that on the first
``--check`` points against ``make_objective`` recorded on all of them at once.

Rows are generated on the workers (``dask.array.random``, one seed) and persisted, so no point
travels through the client; the single-process baseline computes the same rows locally.
Measured, each after one warm-up call (which records the tapes on the workers):

- ``tape.distributed.value_and_grad`` on a ``LocalCluster`` of ``--workers`` processes with one
  thread each (1, 2 and 4 by default; on a 2-core machine 4 workers share the cores), median
  of ``--repeat`` calls: calls per second, the worker-seconds each call spends evaluating
  chunks (``worker_stats()["replay_seconds"]``), the rest of the call (Dask: scheduling,
  transfers, waiting) and the bytes the workers send (to each other and the client) per call;
- the single-process baseline: one tape recorded on a chunk, replayed over every chunk in a
  loop in this process (the way to run this objective on one machine: a tape over all million
  points would need an arena of tens of GB).

All replays run on the interpreter (``compile=False``; ``--compile`` for the compiled tier) with
single-threaded BLAS (set here before NumPy loads; Dask's nanny sets the same for its workers).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import tape as tp  # noqa: E402
from tape.bench.backends import TapeB  # noqa: E402
from tape.bench.cli import _cpu_name  # noqa: E402
from tape.bench.gmm import constant_term, lower_index, make_objective  # noqa: E402

GAMMA, M = 1.0, 0


def prior(B, d, alphas, means, icf):
    """The parameter-only part of the GMM objective (the Wishart prior, ``make_objective``'s
    ``prior``), which a sum over chunks would otherwise count once per chunk."""
    q = icf[:, :d]
    qdiag = B.exp(q)
    wishart = B.sum(qdiag * qdiag) + B.sum(icf[:, d:] ** 2)
    return 0.5 * GAMMA * GAMMA * wishart - M * B.sum(B.sum(q, 1))


def chunk_objective(d, K):
    """``fn(alphas, means, icf, x)`` for one chunk of rows ``x`` (n_c, d): the GMM objective of
    those points without the prior and ``K C`` (added once by the client)."""
    B = TapeB()
    lidx, mask = lower_index(d)
    k_const = constant_term(d, K, 0, GAMMA, M)  # -K C: the part of the constant not per point

    def fn(alphas, means, icf, x):
        full = make_objective(d, K, x.shape[0], GAMMA, M)
        value = full(B, (alphas, means, icf), (x.T, lidx, mask))
        return value - prior(B, d, alphas, means, icf) - k_const

    return fn


def params_for(d, K, seed=0):
    rng = np.random.default_rng(seed)
    alphas = rng.standard_normal(K)
    means = rng.standard_normal((K, d))
    icf = 0.1 * rng.standard_normal((K, d * (d + 1) // 2))
    return alphas, means, icf


class ParamTerm:
    """Client side: the prior and ``K C`` with their gradient, from a small tape."""

    def __init__(self, d, K, params):
        B = TapeB()
        k_const = constant_term(d, K, 0, GAMMA, M)
        self.t = tp.record(
            lambda a, mu, icf: prior(B, d, a, mu, icf) + 0.0 * tp.sum(mu) + k_const,
            *params,
            wrt=[0, 1, 2],
            compile=False,
        )

    def add(self, value, grads, params):
        v, g = self.t.value_and_grad(*params)
        return value + v, tuple(a + b for a, b in zip(grads, g))


def single_process(fn, params, x, chunk, compile):
    """A tape per chunk shape, replayed over the chunks in a loop: ``(call, n_tapes)``."""
    tapes = {}
    starts = range(0, x.shape[0], chunk)
    for s in starts:
        c = x[s : s + chunk]
        if c.shape not in tapes:
            tapes[c.shape] = tp.record(fn, *params, c, wrt=[0, 1, 2], compile=compile)

    def call(*ps):
        value, grads = 0.0, None
        for s in starts:
            c = x[s : s + chunk]
            v, g = tapes[c.shape].value_and_grad(*ps, c)
            value += float(v)
            grads = g if grads is None else tuple(a + b for a, b in zip(grads, g))
        return value, grads

    return call, len(tapes)


def rel_diff(a, b):
    va, ga = a
    vb, gb = b
    out = abs(float(va) - float(vb)) / abs(float(vb))
    for x, y in zip(ga, gb):
        out = max(out, float(np.max(np.abs(x - y)) / np.max(np.abs(y))))
    return out


def timed(f, repeat):
    times, res = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), res


def check_decomposition(fn, params, x, d, K, chunk, n_check):
    """Chunked sum + parameter terms == ``make_objective`` recorded on all points at once."""
    xs = np.ascontiguousarray(x[:n_check])
    # at least three chunks, the last one smaller, whatever --chunk is
    call, _ = single_process(fn, params, xs, min(chunk, n_check // 3 + 1), False)
    got = ParamTerm(d, K, params).add(*call(*params), params)
    lidx, mask = lower_index(d)
    full = make_objective(d, K, n_check, GAMMA, M)
    B = TapeB()
    ref_t = tp.record(
        lambda a, mu, icf: full(B, (a, mu, icf), (np.ascontiguousarray(xs.T), lidx, mask)),
        *params,
        wrt=[0, 1, 2],
        compile=False,
    )
    return rel_diff(got, ref_t.value_and_grad(*params))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=50_000, help="rows per chunk (default 50,000)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--K", type=int, default=25)
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    ap.add_argument("--check", type=int, default=20_000, help="points of the exactness check")
    ap.add_argument("--compile", action="store_true", help="the compiled tier, not the interpreter")
    ap.add_argument("--no-single", action="store_true", help="skip the single-process baseline")
    args = ap.parse_args(argv)

    import dask.array as da
    import distributed

    from tape.frontend import distributed as D

    d, K, n, chunk = args.d, args.K, args.points, min(args.chunk, args.points)
    dt = np.dtype(args.dtype)
    params = tuple(p.astype(dt) for p in params_for(d, K))
    fn = chunk_objective(d, K)
    x = da.random.default_rng(1).standard_normal((n, d), chunks=(chunk, d)).astype(dt)
    n_chunks = len(x.chunks[0])

    print(f"GMM d={d} K={K}, {n:,} points in {n_chunks} chunks of {chunk:,}, {dt}")
    print(f"CPU: {_cpu_name()}, {os.cpu_count()} cores; tier: "
          f"{'compiled' if args.compile else 'interpreter'}")  # fmt: skip
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    tp.warmup((args.dtype,))
    xl = x.compute(scheduler="threads")
    if args.check:
        err = check_decomposition(fn, params, xl, d, K, chunk, min(args.check, n))
        print(f"chunked sum vs make_objective on the first {min(args.check, n):,} points: "
              f"max rel diff {err:.1e}")  # fmt: skip
    terms = ParamTerm(d, K, params)
    rows, split = [], []
    ref = None
    if not args.no_single:
        t0 = time.perf_counter()
        call, n_tapes = single_process(fn, params, xl, chunk, args.compile)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        call(*params)
        first += time.perf_counter() - t0
        per, res = timed(lambda: terms.add(*call(*params), params), args.repeat)
        ref = res
        rows.append(("single process", "-", first, per, 0.0))
    del xl

    for w in args.workers:
        with distributed.LocalCluster(
            n_workers=w, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster, distributed.Client(cluster) as client:  # fmt: skip
            xd = x.persist()
            distributed.wait(xd)

            def step():
                v, g = D.value_and_grad(fn, params, xd, client=client, compile=args.compile)
                return terms.add(v, g, params)

            t0 = time.perf_counter()
            res = step()  # records on the workers
            first = time.perf_counter() - t0
            before = counters(client, D)
            per, res = timed(step, args.repeat)
            after = counters(client, D)
            replay = (after[0] - before[0]) / args.repeat  # worker-seconds per call
            sent = (after[1] - before[1]) / args.repeat
            if ref is None:
                ref = res
            rows.append(("tape.distributed", w, first, per, rel_diff(res, ref)))
            split.append((w, per, replay, sent))
            recs = sum(s["records"] for s in D.worker_stats(client).values())
            assert recs <= w * 2, recs  # one tape per chunk shape per worker

    print("load average at end: {:.2f} {:.2f} {:.2f} (other processes share the cores)".format(
        *os.getloadavg()))  # fmt: skip
    base_1 = next((r[3] for r in rows if r[1] == 1), None)
    base_s = next((r[3] for r in rows if r[1] == "-"), None)
    print()
    print(f"| engine | workers | first call (s) | per call (s, median of {args.repeat}) | "
          "speedup vs 1 worker | time / single process | max rel diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, w, first, per, diff in rows:
        sp = f"{base_1 / per:.2f}x" if base_1 and w != "-" else ""
        rs = f"{per / base_s:.2f}" if base_s else ""
        print(f"| {name} | {w} | {first:.2f} | {per:.3f} | {sp} | {rs} | {diff:.1e} |")
    print()
    print("| workers | calls per second | replays per call (worker-s) | replays / (workers x "
          "call) | not replaying (Dask, waiting) per call (s) | bytes the workers send per "
          "call |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for w, per, replay, sent in split:
        busy = replay / (w * per)
        print(f"| {w} | {1 / per:.2f} | {replay:.3f} | {busy:.0%} | {per - replay / w:.3f} | "
              f"{sent:,.0f} |")  # fmt: skip
    print(
        f"\n({os.cpu_count()} cores: more workers than cores share them, so their replays "
        "slow each other down)"
    )


def _transfer_bytes(dask_worker=None):
    return int(getattr(dask_worker, "transfer_outgoing_bytes_total", 0))


def counters(client, D):
    """``(replay worker-seconds, bytes the workers sent)`` so far."""
    stats = D.worker_stats(client)
    sent = sum(client.run(_transfer_bytes).values())
    return sum(s["replay_seconds"] for s in stats.values()), sent


if __name__ == "__main__":
    main()
