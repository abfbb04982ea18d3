"""Markdown report from a ``--json`` results file:
``python -m tape.bench.report results.json [PLOT_LINK [PLOT_FILE_TO_REDRAW]]``
(also written by ``python -m tape.bench --markdown FILE``). Prints the run's tables and checks
issue 3's targets against the peers measured in the same run."""

from __future__ import annotations

import json
import sys

from tape.bench.harness import Problem, format_table


def _find(results, problem, case):
    for r in results.get(problem, []):
        if r["case"] == case or r["case"].startswith(case):
            return r
    return None


def _med(r, tool, kind="grad"):
    try:
        return r["tools"][tool][kind]["median_s"]
    except (KeyError, TypeError):
        return None


def targets(results) -> list:
    """``[(target, measured, met)]`` for issue 3's targets (None: not measured in this run)."""
    out = []
    r = _find(results, "gmm", "1k d10 K25")
    if r:
        t, j, to = _med(r, "tape"), _med(r, "jax jit"), _med(r, "tape", "objective")
        if t and to:
            out.append(
                ("GMM 1k d10 K25: tape gradient / objective <= 4", f"{t / to:.1f}", t / to <= 4)
            )
        if t and j:
            out.append(
                (
                    "GMM 1k d10 K25: tape gradient below JAX jit's",
                    f"tape {t * 1e3:.2f} ms, JAX {j * 1e3:.2f} ms ({t / j:.2f}x)",
                    t < j,
                )
            )
    for r in results.get("ba", []):
        t, to = _med(r, "tape"), _med(r, "tape", "objective")
        if t and to:
            out.append(
                (f"BA {r['case']}: tape Jacobian / objective <= 10", f"{t / to:.1f}", t / to <= 10)
            )
    r = _find(results, "lstm", "l2 c1024")
    if r:
        t, j = _med(r, "tape"), _med(r, "jax jit")
        if t and j:
            out.append(
                (
                    "LSTM l2 c1024: tape gradient <= JAX jit's",
                    f"tape {t * 1e3:.2f} ms, JAX {j * 1e3:.2f} ms ({t / j:.2f}x)",
                    t <= j,
                )
            )
    for prob in ("mlp", "mlp-large"):
        for r in results.get(prob, []):
            t, j = _med(r, "tape"), _med(r, "jax jit")
            if t and j:
                out.append(
                    (
                        f"{prob}: tape faster than JAX jit",
                        f"tape {t * 1e6:.0f} us, JAX {j * 1e6:.0f} us ({t / j:.2f}x)",
                        t < j,
                    )
                )
    for r in results.get("rosenbrock", []):
        n = int(r["size"])
        t, j = _med(r, "tape"), _med(r, "jax jit")
        if not (t and j):
            continue
        if n <= 1000:
            out.append(
                (
                    f"Rosenbrock n={n}: tape faster than JAX jit",
                    f"tape {t * 1e6:.1f} us, JAX {j * 1e6:.1f} us ({t / j:.2f}x)",
                    t < j,
                )
            )
        elif n == 100_000:
            out.append(
                (
                    f"Rosenbrock n={n}: tape within 3x of JAX jit",
                    f"tape {t * 1e6:.0f} us, JAX {j * 1e6:.0f} us ({t / j:.2f}x)",
                    t <= 3 * j,
                )
            )
    return out


def markdown(doc, plot=None, command=None) -> str:
    from tape.bench.cli import problems

    meta, results = doc["meta"], doc["results"]
    probs = {p.name: p for p in problems()}
    lines = ["# Benchmark results", ""]
    cmd = command or " ".join(meta.get("argv", ["python", "-m", "tape.bench"]))
    lines += [f"Regenerate: `{cmd}`", ""]
    peers = ", ".join(f"{k} {v}" if v else f"{k} (not installed)" for k, v in meta["peers"].items())
    lines += [
        f"- date: {meta['date']}",
        f"- machine: {meta['cpu']}, {meta['cpus']} cpus, {meta['platform']}",
        f"- threads: {meta.get('threads')} (torch: {meta.get('torch_threads', '-')})",
        f"- python {meta['python']}, tape {meta.get('tape', '?')}, numpy {meta['numpy']}, numba {meta['numba']}, scipy {meta['scipy']}",
        f"- peers: {peers}",
        f"- wall time of the run: {meta.get('elapsed_s', 0):.0f} s",
        "",
        "Method: every tool's value and gradient are first checked against the reference tool "
        "(the hand-written one where there is one) to 1e-8 relative, elementwise, in float64; then "
        "each tool is warmed up and timed in interleaved rounds (median; spread = half the "
        "interquartile range). `vs tape` = tool time / tape replay time (above 1: slower than tape). "
        "`grad/obj` = the tool's gradient time / its own objective time (ADBench's metric). "
        "`first` = build (trace, record, jit) + the first gradient call in this process (compile "
        "time for JAX and the hand-written njit; for tape, recording plus the first replay, after "
        "its sweeps were compiled or loaded once at the start of the run).",
        "",
    ]
    tg = targets(results)
    if tg:
        lines += [
            "## Issue 3 targets (this run)",
            "",
            "| target | measured | met |",
            "|---|---|---|",
        ]
        lines += [f"| {a} | {b} | {'yes' if c else '**no**'} |" for a, b, c in tg]
        lines.append("")
    if plot:
        lines += [f"![time against size per tool]({plot})", ""]
    lines += ["## Tables", ""]
    for name, res in results.items():
        if not res:
            continue
        p = probs.get(name) or Problem(name, name, "size", None)
        lines += ["```", format_table(p, res), "```", ""]
    for s in doc.get("skipped", []):
        lines.append(f"- skipped: {s}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        doc = json.load(f)
    if len(argv) > 2:  # redraw the plot from the JSON too
        from tape.bench.cli import problems
        from tape.bench.harness import plot

        plot(problems(), doc["results"], argv[2])
    sys.stdout.write(markdown(doc, plot=argv[1] if len(argv) > 1 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
