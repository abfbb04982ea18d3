"""The command line: problem selection, the run, tables, ``--json`` and ``--plot``."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

from tape.bench import harness
from tape.bench.backends import peer_of, peer_status
from tape.bench.harness import Opts, Progress, Skip


def problems():
    """Every problem, in report order."""
    from tape.bench import ba, gmm, gp, lstm, njit_loop, second, simple

    return (
        simple.PROBLEMS + njit_loop.PROBLEMS + gmm.PROBLEMS + ba.PROBLEMS + lstm.PROBLEMS
        + gp.PROBLEMS + second.PROBLEMS
    )  # fmt: skip


def machine_info() -> dict:
    import numba
    import numpy as np
    import scipy

    info = dict(
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        python=platform.python_version(),
        platform=platform.platform(),
        cpu=_cpu_name(),
        cpus=os.cpu_count(),
        cpus_used=_affinity(),
        blas=_blas_kernel(),
        numpy=np.__version__,
        numba=numba.__version__,
        scipy=scipy.__version__,
        peers=peer_status(),
        threads=os.environ.get("TAPE_BENCH_THREADS", "library defaults"),
    )
    try:
        import tape

        info["tape"] = tape.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        if os.environ.get("TAPE_BENCH_THREADS"):
            torch.set_num_threads(int(os.environ["TAPE_BENCH_THREADS"]))
        info["torch_threads"] = torch.get_num_threads()
    except Exception:  # noqa: BLE001
        pass
    return info


def _blas_kernel():
    """The kernel set SciPy's OpenBLAS uses (tape's matrix products call it), as OpenBLAS
    names it ("Haswell": AVX2, "SkylakeX": AVX-512), with ``OPENBLAS_CORETYPE`` where the
    environment sets it (it overrides OpenBLAS's own choice); ``None`` where it cannot be
    asked. On an AMD EPYC with AVX-512 whose environment set ``OPENBLAS_CORETYPE=Haswell``,
    GMM's gradient (d = 10, K = 25, 1,000 points) took 0.86-0.88 ms, and 0.48-0.62 ms with
    the variable unset (OpenBLAS then chose SkylakeX); the large MLP's 1.36 ms and 0.86 ms."""
    import ctypes

    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS)

    try:
        with open("/proc/self/maps") as f:
            paths = sorted(
                {line.split()[-1] for line in f if "scipy.libs" in line and "openblas" in line}
            )
    except OSError:
        return None
    for path in paths:
        try:
            fn = ctypes.CDLL(path).scipy_openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        env = os.environ.get("OPENBLAS_CORETYPE")
        return fn().decode() + (f" (OPENBLAS_CORETYPE={env} in the environment)" if env else "")
    return None


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m tape.bench",
        description="Benchmark tape's gradients against a hand-written Numba gradient and the "
        "installed peers (JAX jit, PyTorch eager, HIPS autograd, Dr.Jit, CasADi), after checking "
        "they all agree to 1e-8 in float64.",
    )
    ap.add_argument("problems", nargs="*", help="problems to run (default: all); see --list")
    ap.add_argument("--list", action="store_true", help="list the problems and exit")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small subset, short timings (about 3 minutes from empty caches on 2 cores)",
    )
    ap.add_argument("--tools", help="comma-separated tools to run, by full name ('jax jit') or "
                    "peer ('jax': all of its tools); default: all available")  # fmt: skip
    ap.add_argument("--json", metavar="FILE", help="save all results as JSON")
    ap.add_argument(
        "--plot", metavar="FILE.png", help="plot time against size per tool (needs matplotlib)"
    )
    ap.add_argument(
        "--markdown", metavar="FILE.md", help="write a Markdown report (tables, targets, machine)"
    )
    ap.add_argument(
        "--adbench",
        metavar="DIR",
        help="ADBench data folder (default: $TAPE_ADBENCH_DIR or shared/adbench)",
    )
    ap.add_argument("--min-time", type=float, help="seconds per timing sample")
    ap.add_argument("--budget", type=float, help="seconds of timing per case")
    ap.add_argument("--repeats", type=int, help="minimum number of timing rounds")
    ap.add_argument(
        "--threads", type=int,
        help="threads for every tool (BLAS, OpenMP, Numba, XLA, PyTorch); the process restarts "
        "itself with the environment set, pinned to that many CPUs. Default: each library's own "
        "default",
    )  # fmt: skip
    ap.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return ap.parse_args(argv)


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def _restart_with_threads(n, argv):
    """Thread pools are sized when the libraries load, so set the environment and re-exec,
    pinned to ``n`` CPUs (:func:`_pin`)."""
    env = dict(os.environ, TAPE_BENCH_THREADS=str(n))
    for v in THREAD_VARS:
        env[v] = str(n)
    xla = env.get("XLA_FLAGS", "")
    if n == 1 and "multi_thread_eigen" not in xla:  # XLA has no thread-count flag; 1 = no pool
        env["XLA_FLAGS"] = (xla + " --xla_cpu_multi_thread_eigen=false").strip()
    _pin(n)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "tape.bench", *argv], env)


def _pin(n):
    """Restrict this process (and the one it execs) to ``n`` of its CPUs, where the OS allows.

    XLA splits a large fused loop over a thread pool of its own, which
    ``--xla_cpu_multi_thread_eigen=false`` does not turn off: with it, on a 2-CPU machine, JAX's
    Rosenbrock n=1e5 gradient still used 1.68 CPU-seconds per second of wall time (90 us per
    call pinned to one CPU, 63 us unpinned). Pinning is what makes ``--threads 1`` hold for
    every tool; :func:`machine_info` reports the CPUs the run had."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if n < len(cpus):
            os.sched_setaffinity(0, cpus[:n])
    except (AttributeError, OSError):  # not Linux, or not allowed: threads as the flags say
        pass


def _affinity():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return None


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.threads and os.environ.get("TAPE_BENCH_THREADS") != str(a.threads):
        _restart_with_threads(a.threads, sys.argv[1:] if argv is None else argv)
    probs = problems()
    if a.list:
        for p in probs:
            print(f"{p.name:12s} {p.title}")
        return 0
    if a.problems:
        unknown = set(a.problems) - {p.name for p in probs}
        if unknown:
            print(f"unknown problem(s): {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
            return 2
        probs = [p for p in probs if p.name in a.problems]
    opts = Opts(quick=a.quick, data_dir=a.adbench, progress=not a.no_progress)
    if a.quick:
        opts.min_time, opts.budget, opts.min_repeats, opts.max_repeats = 0.002, 0.25, 3, 11
    if a.min_time:
        opts.min_time = a.min_time
    if a.budget:
        opts.budget = a.budget
    if a.repeats:
        opts.min_repeats = a.repeats
        opts.max_repeats = max(opts.max_repeats, a.repeats)
    if a.tools:
        opts.tools = tuple(t.strip() for t in a.tools.split(","))

    t0 = time.perf_counter()
    info = machine_info()
    print(
        f"tape.bench {'--quick ' if a.quick else ''}on {info['cpu']} ({info['cpus']} cpus), {info['date']}"
    )
    print(f"threads: {info['threads']} (CPUs this process may run on: {info['cpus_used']}); "
          f"SciPy's OpenBLAS kernels: {info['blas'] or 'unknown'}")  # fmt: skip
    print(
        f"python {info['python']}, numpy {info['numpy']}, numba {info['numba']}, scipy {info['scipy']}"
    )
    peers = info["peers"]
    print(
        "peers: "
        + ", ".join(f"{k} {v}" if v else f"{k} (not installed: skipped)" for k, v in peers.items())
    )
    print("times: median of interleaved rounds; spread: half the interquartile range; "
          "'vs tape' = tool time / tape replay time (>1: slower than tape); 'first' = build "
          "(trace, record, jit) + first gradient call, in this process; 'compile' = 'first' "
          "less one steady-state call (the one-time cost)", flush=True)  # fmt: skip

    # the compiled tier's 'first' is its compile time: a fresh tape cache, unless one is set
    cache = os.environ.setdefault("TAPE_CACHE_DIR", tempfile.mkdtemp(prefix="tape-bench-"))
    print(f"compiled tapes go to {cache}")
    import tape

    t0 = time.perf_counter()
    tape.warmup()  # compile or load the sweeps before anything is timed
    print(f"tape's sweeps compiled or loaded from Numba's cache in {time.perf_counter() - t0:.1f} s "
          "(before any 'first' below)\n", flush=True)  # fmt: skip

    cases = {}
    skipped = []
    for p in probs:
        try:
            cases[p.name] = p.cases(opts)
        except Skip as e:
            skipped.append(f"{p.name}: {e}")
            cases[p.name] = []
    if opts.tools:  # a misspelt name would silently run nothing of that tool
        have = {tool for cs in cases.values() for c in cs for tool in c.builders}
        unknown = [n for n in opts.tools if not any(harness.tool_selected(t, (n,)) for t in have)]
        if unknown:
            print(f"--tools: no tool named {', '.join(map(repr, unknown))} in these problems; "
                  f"their tools: {', '.join(sorted(have))} (a peer's name, such as "
                  "'jax', selects all of its tools)", file=sys.stderr)  # fmt: skip
            return 2
    progress = Progress(sum(len(c) for c in cases.values()), enabled=opts.progress)
    results = {}
    for p in probs:
        results[p.name] = []
        for case in cases[p.name]:
            for tool in list(case.builders):
                if peer_of(tool) and not peers.get(peer_of(tool)):
                    del case.builders[tool]
            res = harness.run_case(case, opts, progress)
            progress.step()
            results[p.name].append(res)
        progress.close()
        if results[p.name]:
            print(harness.format_table(p, results[p.name]) + "\n", flush=True)
    for s in skipped:
        print(f"skipped {s}")
    missing = [k for k, v in peers.items() if not v]
    if missing:
        print(
            f"not installed, skipped: {', '.join(missing)} (pip install -e '.[peers]'; PyTorch: see README)"
        )
    elapsed = time.perf_counter() - t0
    print(f"total {elapsed:.0f} s")
    info["argv"] = ["python", "-m", "tape.bench", *(sys.argv[1:] if argv is None else argv)]
    info["elapsed_s"] = elapsed
    doc = dict(meta=info, skipped=skipped, results=results)
    if a.json:
        info["argv"] = ["python", "-m", "tape.bench", *(sys.argv[1:] if argv is None else argv)]
        info["elapsed_s"] = elapsed
        with open(a.json, "w") as f:
            json.dump(dict(meta=info, skipped=skipped, results=results), f, indent=1)
        print(f"wrote {a.json}")
    if a.plot:
        try:
            harness.plot(probs, results, a.plot)
            print(f"wrote {a.plot}")
        except ImportError:
            print("--plot needs matplotlib (pip install matplotlib): no plot written")
    if a.markdown:
        from tape.bench.report import markdown

        rel = (
            os.path.relpath(a.plot, os.path.dirname(os.path.abspath(a.markdown)))
            if a.plot
            else None
        )
        with open(a.markdown, "w") as f:
            f.write(markdown(doc, plot=rel, folder=os.path.dirname(os.path.abspath(a.markdown))))
        print(f"wrote {a.markdown}")
    return 0
