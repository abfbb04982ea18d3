"""Markdown report from a ``--json`` results file:
``python -m tape.bench.report results.json [PLOT_LINK [PLOT_FILE_TO_REDRAW]]``
(also written by ``python -m tape.bench --markdown FILE``). Prints the run's tables and checks
issue 8's targets against the peers measured in the same run."""

from __future__ import annotations

import json
import os
import sys

from tape.bench.harness import Problem, fmt_time, format_table


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


def _first(r, tool):
    try:
        info = r["tools"][tool]
        return info["setup_s"] + info["first_s"]
    except (KeyError, TypeError):
        return None


def _us(x):
    return f"{x * 1e6:.1f} us" if x < 1e-3 else f"{x * 1e3:.2f} ms"


def targets(results) -> list:
    """``[(target, measured, met)]`` for issue 8's targets that ``python -m tape.bench``
    measures (the cold start and the eager op are ``benchmarks/cold_start.py``'s). Tape's
    figures are the compiled tier's (``tape compiled``)."""
    out = []
    T = "tape compiled"

    def ratio(label, r, ref, limit, extra=""):
        t, h = _med(r, T), _med(r, ref)
        if t and h:
            out.append(
                (label, f"tape {_us(t)}, {ref} {_us(h)} ({t / h:.2f}x){extra}", t <= limit * h)
            )

    for r in results.get("rosenbrock", []):
        n = int(r["size"])
        if n in (10, 1000):
            ratio(f"Rosenbrock n={n}: compiled replay <= 2x hand @njit", r, "njit (hand)", 2)
        elif n == 100_000:
            ratio(f"Rosenbrock n={n}: <= 1x JAX jit", r, "jax jit", 1)
    for prob in ("mlp", "mlp-large"):
        for r in results.get(prob, []):
            ratio(f"{prob}: <= 1x JAX jit", r, "jax jit", 1)
    for case in ("1k d10 K25", "10k d10 K25"):
        r = _find(results, "gmm", case)
        if not r:
            continue
        peers = [(tool, _med(r, tool)) for tool in ("jax jit", "torch") if _med(r, tool)]
        t, to = _med(r, T), _med(r, T, "objective")
        if t and peers:
            tool, best = min(peers, key=lambda x: x[1])
            out.append((
                f"GMM {case}: <= 1x the faster of JAX jit and torch",
                f"tape {_us(t)}, {tool} {_us(best)} ({t / best:.2f}x)", t <= best,
            ))  # fmt: skip
        if t and to:
            out.append((f"GMM {case}: gradient / objective <= 3", f"{t / to:.1f}", t / to <= 3))
    r = _find(results, "lstm", "l2 c1024")
    if r:
        first = _first(r, T)
        extra = f"; compile + first gradient {first:.1f} s" if first is not None else ""
        ratio("LSTM l2 c1024: <= 1x JAX lax.scan", r, "jax jit", 1, extra)
    return out


def targets_second_order(results) -> list:
    """``[(target, measured, met)]`` for the second-order and Jacobian targets (issue 35:
    compiled tapes; the ``hvp`` problem also times the interpreter's drivers, reported)."""
    out = []
    for r in results.get("hvp", []):
        h, g = _med(r, "tape"), _med(r, "tape", "objective")
        if h and g:
            out.append((f"HVP {r['case']} (compiled): <= 2.5x the gradient", f"HVP {_us(h)}, "
                        f"gradient {_us(g)} ({h / g:.1f}x)", h <= 2.5 * g))  # fmt: skip
        hi, gi = _med(r, "tape interpreter"), _med(r, "tape interpreter", "objective")
        if hi and gi:
            out.append((f"HVP {r['case']} on the interpreter (reported)", f"HVP {_us(hi)}, "
                        f"gradient {_us(gi)} ({hi / gi:.1f}x)", None))  # fmt: skip
    for r in results.get("hessian", []):
        if r["case"] == "rosenbrock n=100" or r["case"].startswith("mlp"):
            t, j = _med(r, "tape"), _med(r, "jax jit")
            if t and j:
                out.append((f"Hessian {r['case']}: <= 1x jax.hessian",
                            f"tape {_us(t)}, JAX {_us(j)} ({t / j:.2f}x)", t <= j))  # fmt: skip
    for r in results.get("jacobian", []):
        ts = {k: _med(r, k) for k in ("tape fwd", "tape rev", "jax jacfwd", "jax jacrev")}
        if all(ts.values()):
            best_t, best_j = (
                min(ts["tape fwd"], ts["tape rev"]),
                min(ts["jax jacfwd"], ts["jax jacrev"]),
            )
            out.append((f"Jacobian {r['case']}: <= 1x the faster JAX transform",
                        ", ".join(f"{k} {_us(v)}" for k, v in ts.items())
                        + f" (best tape / best JAX {best_t / best_j:.2f}x)", best_t <= best_j))  # fmt: skip
    for r in results.get("ba-jacobian", []):
        s, d, j = _med(r, "tape sparse"), _med(r, "tape rev (dense)"), _med(r, "jax jacfwd (dense)")
        note = r["tools"].get("tape sparse", {}).get("note", "")
        if s and d and j:
            out.append((f"BA Jacobian {r['case']}: colouring vs dense reverse and JAX (reported)",
                        f"{note}; sparse {_us(s)}, dense reverse {_us(d)} ({d / s:.0f}x), JAX "
                        f"jacfwd {_us(j)} ({j / s:.0f}x)", None))  # fmt: skip
        elif s:
            out.append(
                (f"BA Jacobian {r['case']} by colouring (reported)", f"{note}; {_us(s)}", None)
            )
    return out


def targets_njit_and_peers(results) -> list:
    """``[(target, measured, met)]`` for issue 35's targets that ``python -m tape.bench``
    measures: the gradient inside a user's ``@njit`` loop (``njit-loop``:
    ``t.njit_gradient`` against the hand-written gradient in the same loop), and Rosenbrock's
    gradient against Dr.Jit and CasADi (reported, no target), with each tool's one-time cost
    (``compile``: build and first call less one steady call)."""
    out = []
    limits = {10: 2.0, 1000: 1.05}
    for r in results.get("njit-loop", []):
        n = int(r["size"])
        h = _med(r, "njit (hand)")
        ts = {k: _med(r, k) for k in ("tape njit_gradient", "tape compiled", "tape")}
        if not h or not ts["tape njit_gradient"]:
            continue
        t = ts["tape njit_gradient"]
        others = ", ".join(f"{k} {_ns(v)} ({v / h:.1f}x)" for k, v in ts.items()
                           if v and k != "tape njit_gradient")  # fmt: skip
        limit = limits.get(n)
        label = f"inside @njit, Rosenbrock n={n}: t.njit_gradient " + (
            f"<= {limit:g}x hand @njit" if limit else "vs hand @njit (reported)"
        )
        measured = f"{_ns(t)}, hand {_ns(h)} ({t / h:.2f}x); {others}"
        out.append((label, measured, t <= limit * h if limit else None))
    for r in results.get("rosenbrock", []):
        t = _med(r, "tape compiled")
        peers = {k: _med(r, k) for k in ("drjit", "casadi", "jax jit")}
        if not t or not (peers["drjit"] or peers["casadi"]):
            continue
        comp = r["tools"].get("tape compiled", {}).get("compile_s")
        parts = [f"tape compiled {_us(t)}" + (f" (compile {fmt_time(comp)})" if comp else "")]
        for k, v in peers.items():
            if v:
                c = r["tools"][k].get("compile_s")
                c = f", compile {fmt_time(c)}" if c is not None else ""
                parts.append(f"{k} {_us(v)} ({v / t:.1f}x tape{c})")
        out.append((f"Rosenbrock {r['case']}: tape compiled vs Dr.Jit, CasADi, JAX (reported)",
                    "; ".join(parts), None))  # fmt: skip
    return out


def _ns(x):
    return f"{x * 1e9:.0f} ns" if x < 1e-6 else _us(x)


def side_targets(folder) -> list:
    """``[(target, measured, met)]`` from the figures ``benchmarks/cold_start.py``,
    ``benchmarks/eager_loops.py`` and ``benchmarks/promotion.py`` wrote as JSON in ``folder``
    (``cold_start.json``, ``eager_loops.json``, ``promotion.json``; their own runs, dated in
    the measured column), for the targets
    ``python -m tape.bench`` does not measure."""
    out = []
    try:
        with open(os.path.join(folder, "cold_start.json")) as f:
            c = json.load(f)
        when = f"({c['date'][:10]}, {c['cpu']})"

        def since(part):  # a part carried over from an earlier run says its own date
            return f"({c[part + '_from'][:10]}, {c['cpu']})" if part + "_from" in c else when

        d, k = c["default"], c["compiled"]
        out += [
            (
                "first gradient of record(rosen) with default settings from empty caches <= 5 s",
                f"{d['cold_first_gradient_s']:.1f} s {when}",
                d["cold_first_gradient_s"] <= 5,
            ),
            (
                "first gradient with compile=True from empty caches <= 5 s",
                f"{k['cold_first_gradient_s']:.1f} s {when}",
                k["cold_first_gradient_s"] <= 5,
            ),
            (
                "float32 after float64 from empty caches, default settings <= 5 s",
                f"{d['cold_float32_after_float64_s']:.1f} s {when}",
                d["cold_float32_after_float64_s"] <= 5,
            ),
            (
                "import + first gradient with a warm cache <= 1 s",
                f"{d['warm_first_gradient_s']:.2f} s (compile=True: "
                f"{k['warm_first_gradient_s']:.2f} s) {when}",
                d["warm_first_gradient_s"] <= 1,
            ),
            (
                "eager scalar op chain <= 5 us per op (forward: y = y * 1.0001 + 0.5)",
                f"{c['eager_op_us']:.2f} us {when}",
                c["eager_op_us"] <= 5,
            ),
        ]
        if "demo" in c:
            out.append(
                (
                    "README's demo from empty caches <= 30 s in all",
                    f"first line after {c['demo']['first_line_s']:.1f} s, "
                    f"{c['demo']['total_s']:.1f} s in all {since('demo')}",
                    c["demo"]["total_s"] <= 30,
                )
            )
        if "compiled_tier" in c:
            ct = c["compiled_tier"]
            out += [
                (
                    "compiled tier: GMM 1k d10 K25 compile <= 5 s, LSTM l2 c1024 <= 10 s",
                    f"GMM {ct['gmm_compile_s']:.1f} s, LSTM {ct['lstm_compile_s']:.1f} s "
                    f"{since('compiled_tier')}",
                    ct["gmm_compile_s"] <= 5 and ct["lstm_compile_s"] <= 10,
                ),
                (
                    "process memory per compiled tape (20 small distinct tapes) <= 3 MB",
                    f"{ct['memory_per_compiled_tape_mib']:.1f} MiB {since('compiled_tier')}",
                    ct["memory_per_compiled_tape_mib"] <= 3,
                ),
            ]
        if "suite" in c:
            out.append(
                (
                    "README's test command from empty caches <= 12 min, peak RSS <= 3 GB",
                    f"{c['suite']['wall_s'] / 60:.1f} min, peak RSS "
                    f"{c['suite']['peak_rss_mib'] / 1024:.1f} GB {since('suite')}",
                    c["suite"]["wall_s"] <= 720 and c["suite"]["peak_rss_mib"] <= 3072,
                )
            )
    except (OSError, KeyError, ValueError):
        pass
    try:
        with open(os.path.join(folder, "eager_loops.json")) as f:
            e = json.load(f)
        when = f"({e.get('date', '?')[:10]}, {e['cpu']})"
        loops = e["loops"]
        ch = loops.get("scalar_chain", {})
        if "us_per_op" in ch.get("tape", {}):
            peer = ch.get("torch", {}).get("us_per_op")
            vs = f", torch {peer:.2f} us" if peer else ""
            us = ch["tape"]["us_per_op"]
            out.append(
                (
                    "eager scalar op chain, backward included (reported)",
                    f"tape {us:.2f} us per op{vs} {when}",
                    None,
                )
            )
        for name, label in (("polynomial", "issue 11: eager polynomial loop <= 1x PyTorch"),
                            ("mlp_adam", "eager MLP with Adam vs PyTorch (reported)")):  # fmt: skip
            r = loops.get(name, {})
            if "tape" in r and "torch" in r:
                t, p = r["tape"]["seconds"], r["torch"]["seconds"]
                met = t <= p if name == "polynomial" else None
                out.append((label, f"tape {t:.3f} s, torch {p:.3f} s ({t / p:.2f}x) {when}", met))
    except (OSError, KeyError, ValueError):
        pass
    try:  # benchmarks/promotion.py: time to the 50th gradient, compile included
        with open(os.path.join(folder, "promotion.json")) as f:
            pr = json.load(f)
        for kind in ("warm", "cold"):
            r = pr.get(kind)
            if not r:
                continue
            best = {c: min(run["50"] for run in runs) for c, runs in r["times"].items()}
            t, j = best["tape auto"], best["jax jit"]
            caches = "warm caches" if kind == "warm" else "empty caches"
            out.append((
                f"plainly written GMM d10 K25, default settings, time to the 50th gradient "
                f"(compile included) <= JAX jit's, {caches}",
                f"tape {t:.2f} s, jax jit {j:.2f} s ({t / j:.2f}x; tape's 200th: "
                f"{min(run['200'] for run in r['times']['tape auto']):.2f} s, with promotion by "
                f"count only {min(run['200'] for run in r['times']['tape count only']):.2f} s) "
                f"({r['date']}, {r['machine']})",
                t <= j,
            ))  # fmt: skip
    except (OSError, KeyError, ValueError):
        pass
    return out


def markdown(doc, plot=None, command=None, folder=None) -> str:
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
        f"- threads: {meta.get('threads')} (torch: {meta.get('torch_threads', '-')}; CPUs the "
        f"process was pinned to: {meta.get('cpus_used', 'not recorded')}; SciPy's OpenBLAS "
        f"kernels: {meta.get('blas') or 'not recorded'})",
        f"- python {meta['python']}, tape {meta.get('tape', '?')}, numpy {meta['numpy']}, numba {meta['numba']}, scipy {meta['scipy']}",
        f"- peers: {peers}",
        f"- wall time of the run: {meta.get('elapsed_s', 0):.0f} s",
    ]
    for run in meta.get("merged", []):  # problems taken from another run (tape.bench.merge)
        lines.append(
            f"- from another run ({run['date']}, {run['elapsed_s']:.0f} s, "
            f"`{' '.join(run['argv'])}`): {', '.join(run['problems'])}"
            + (f" ({run['note']})" if run.get("note") else "")
        )
    lines += [
        "",
        "Method: every tool's value and gradient are first checked against the reference tool "
        "(the hand-written one where there is one) to 1e-8 relative, elementwise, in float64; then "
        "each tool is warmed up and timed in interleaved rounds (median; spread = half the "
        "interquartile range). `vs tape` = tool time / tape replay time on the interpreter (above "
        "1: slower than tape). `tape` is the interpreter, `tape compiled` the compiled tier "
        "(`tp.record(..., compile=True)`). "
        "`grad/obj` = the tool's gradient time / its own objective time (ADBench's metric). "
        "`first` = build (trace, record, jit) + the first gradient call in this process (compile "
        "time for JAX and the hand-written njit; for `tape compiled`, the generation and Numba "
        "compile of the tape's code from an empty tape cache; for `tape`, recording plus the "
        "first replay, after the interpreter's sweeps were compiled or loaded once at the start "
        "of the run). `compile` = `first` less one steady-state call (the median): the tool's "
        "one-time cost. `njit-loop` times a batch of gradients in one `@njit` loop and reports "
        "the time per gradient.",
        "",
    ]
    tg = targets(results)
    if tg:
        lines += [
            "## Issue 8 targets (this run; tape = the compiled tier)",
            "",
            "| target | measured | met |",
            "|---|---|---|",
        ]
        lines += [f"| {a} | {b} | {'yes' if c else '**no**'} |" for a, b, c in tg]
        lines.append("")
    side = side_targets(folder) if folder else []
    if side:
        met = {True: "yes", False: "**no**", None: "-"}
        lines += [
            "## Eager mode and cold start (`benchmarks/eager_loops.py --json "
            "benchmarks/eager_loops.json`, `benchmarks/cold_start.py --json "
            "benchmarks/cold_start.json`: their own runs)",
            "",
            "| target | measured | met |",
            "|---|---|---|",
        ]
        lines += [f"| {a} | {b} | {met[c]} |" for a, b, c in side]
        lines.append("")
    tg2 = targets_second_order(results)
    if tg2:
        lines += [
            "## Second-order and Jacobian targets (this run; issue 35: compiled tapes)",
            "",
            "| target | measured | met |",
            "|---|---|---|",
        ]
        met = {True: "yes", False: "**no**", None: "-"}
        lines += [f"| {a} | {b} | {met[c]} |" for a, b, c in tg2]
        lines.append("")
    tg3 = targets_njit_and_peers(results)
    if tg3:
        lines += [
            "## Issue 35 targets (this run): inside @njit, and the JIT-compiled peers",
            "",
            "| target | measured | met |",
            "|---|---|---|",
        ]
        met = {True: "yes", False: "**no**", None: "-"}
        lines += [f"| {a} | {b} | {met[c]} |" for a, b, c in tg3]
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
    folder = os.path.dirname(os.path.abspath(argv[0]))  # eager_loops.json, cold_start.json
    sys.stdout.write(markdown(doc, plot=argv[1] if len(argv) > 1 else None, folder=folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
