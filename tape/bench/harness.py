"""Check, time and report: the part of ``python -m tape.bench`` that knows nothing about the
problems.

A :class:`Case` is one problem instance (``rosenbrock n=1000``) with one builder per tool.
A builder does the tool's setup (recording, jit compilation happens at warm-up) and returns an
:class:`Impl`: the gradient call that is timed, the objective call, and converters to flat
float64 NumPy arrays for the agreement check.

Method (one case at a time):
1. Build every tool; call each once to warm it up (compile, caches).
2. Check: every tool's objective value and gradient against the reference tool (the
   hand-written one where there is one, else tape), elementwise
   ``|a - b| / max(1, |a| + |b|) <= 1e-8`` (ADBench's criterion), and against published
   reference values where the case has them. A tool that disagrees is reported and not timed.
3. Calibrate: per tool, the number of calls per sample so that one sample lasts ``min_time``.
4. Time: ``repeats`` rounds; in each round every (tool, kind) takes one sample, in an order
   rotated every round, so drift of the machine hits all tools alike. Before each sample, one
   untimed call (unless a call takes over 0.5 s): the tool timed just before has evicted the
   caches, and a sample of one cold call would measure that, not the tool. Garbage
   collection is off during a sample (as in ``timeit``). Report the median, the interquartile spread and
   the ratio to tape.
5. One-time cost: ``first`` is the build plus the first gradient call (what a user waits for
   before the first number); ``compile`` is ``first`` less one steady-state call (the median),
   the part of it that the tool spends once: tracing, recording, code generation, JIT
   compilation (or loading compiled code from a cache), first-call allocations.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tape.bench.backends import peer_of

RTOL = 1e-8
REF_ORDER = ("njit (hand)", "tape", "tape compiled", "jax jit", "torch", "autograd")


def flat(a) -> np.ndarray:
    """A gradient (array, tensor, or tuple/list of them) as one flat float64 array."""
    if isinstance(a, (tuple, list)):
        parts = [flat(x) for x in a]
        return np.concatenate(parts) if parts else np.zeros(0)
    if hasattr(a, "detach") and hasattr(a, "numpy") and not isinstance(a, np.ndarray):
        try:
            a = a.detach()
        except Exception:  # noqa: BLE001  (tape tensors: detach then numpy works the same)
            pass
        a = a.numpy()
    return np.asarray(a, dtype=np.float64).ravel()


@dataclass
class Impl:
    """One tool on one case. ``grad()`` is the timed gradient (or Jacobian) call; ``value()``
    the timed objective call. ``grad_np``/``value_np`` convert their results for the check."""

    grad: Callable[[], Any]
    value: Callable[[], Any] | None = None
    grad_np: Callable[[Any], np.ndarray] = flat
    value_np: Callable[[Any], np.ndarray] = flat
    note: str = ""
    batch: int = 1  # gradients one ``grad()`` computes (a loop in @njit code); times are per one


@dataclass
class Case:
    problem: str
    label: str
    size: float  # x coordinate of the plot
    builders: dict  # tool -> callable() -> Impl
    ratio: bool = False  # also time the objective and report gradient / objective
    ref_value: Any = None  # published objective value(s), checked to RTOL
    ref_grad: Any = None  # published gradient values (flat), checked to RTOL
    notes: list = field(default_factory=list)
    max_repeats: int | None = None  # fewer timing rounds for cases that take seconds a call


@dataclass
class Problem:
    name: str
    title: str
    x_label: str
    cases: Callable  # (opts) -> list[Case]; may raise Skip
    ratio: bool = False


class Skip(Exception):
    """A problem or tool that cannot run here (missing data, missing peer)."""


def rel_err(a, b) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        e = np.abs(a - b) / np.maximum(1.0, np.abs(a) + np.abs(b))
    if np.isnan(e).any():
        return math.inf
    return float(e.max())


def fmt_time(s) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale or unit == "ns":
            v = s / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{s:g} s"


class Progress:
    """A one-line progress bar on stderr (a plain line per step when stderr is not a tty)."""

    def __init__(self, total, enabled=True):
        self.total, self.done, self.t0 = max(total, 1), 0, time.perf_counter()
        self.enabled = enabled
        self.tty = sys.stderr.isatty()

    def show(self, text, major=False):
        if not self.enabled or not (self.tty or major):
            return
        frac = self.done / self.total
        bar = "#" * int(20 * frac) + "-" * (20 - int(20 * frac))
        el = time.perf_counter() - self.t0
        line = f"[{bar}] {self.done}/{self.total} {el:6.1f}s  {text}"
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def step(self):
        self.done += 1

    def close(self):
        if self.enabled and self.tty:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


def _sample(fn, number):
    gcold = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number
    finally:
        if gcold:
            gc.enable()


def _calibrate(fn, min_time, max_number=100_000):
    n = 1
    while True:
        t = _sample(fn, n)
        if t * n >= min_time or n >= max_number:
            return n, t
        n = min(max_number, max(2 * n, int(1.2 * min_time / max(t, 1e-9))))


@dataclass
class Opts:
    quick: bool = False
    min_time: float = 0.01  # seconds per sample
    budget: float = 2.0  # seconds of timing per case (all tools)
    min_repeats: int = 5
    max_repeats: int = 31
    tools: tuple | None = None  # restrict to these tools
    data_dir: Any = None
    progress: bool = True


def tool_selected(tool, names):
    """Whether ``--tools`` ``names`` select ``tool``: by its full name (``"jax jit"``), or by
    the peer library it runs (``"jax"`` selects ``"jax jit"`` and ``"jax jacfwd"``)."""
    return tool in names or (peer_of(tool) or tool) in names


def run_case(case: Case, opts: Opts, progress: Progress | None = None) -> dict:
    """Build, check and time one case; returns a result dict (see :func:`tape.bench.main`)."""
    res = dict(
        problem=case.problem, case=case.label, size=case.size, tools={}, notes=list(case.notes)
    )
    impls = {}
    if progress:
        progress.show(f"{case.problem} {case.label}", major=True)
    for tool, build in case.builders.items():
        if opts.tools and not tool_selected(tool, opts.tools):
            continue
        if progress:
            progress.show(f"{case.problem} {case.label}: setting up {tool}")
        try:
            t0 = time.perf_counter()
            impl = build()
            t1 = time.perf_counter()
            impl.grad()  # warm-up (jit compile, first-call caches)
            t2 = time.perf_counter()
            if impl.value is not None:
                impl.value()
        except Skip as e:
            res["notes"].append(f"{tool}: skipped ({e})")
            continue
        except Exception as e:  # noqa: BLE001  (one tool failing must not stop the suite)
            res["tools"][tool] = dict(status="error", error=f"{type(e).__name__}: {e}")
            continue
        impls[tool] = impl
        # build (trace, record) and first gradient (compile, or load from a cache): what a
        # user waits for before the first number, in this process
        res["tools"][tool] = dict(status="ok", note=impl.note, setup_s=t1 - t0, first_s=t2 - t1)

    # ---- check
    if progress:
        progress.show(f"{case.problem} {case.label}: checking")
    outs = {}
    for tool, impl in impls.items():
        try:
            g = impl.grad_np(impl.grad())
            v = impl.value_np(impl.value()) if impl.value is not None else None
            outs[tool] = (v, g)
        except Exception as e:  # noqa: BLE001
            res["tools"][tool] = dict(status="error", error=f"{type(e).__name__}: {e}")
    ref = next((t for t in REF_ORDER if t in outs), next(iter(outs), None))
    res["reference"] = ref
    for tool, (v, g) in outs.items():
        info = res["tools"][tool]
        rv, rg = outs[ref]
        ev = rel_err(v, rv) if v is not None and rv is not None else 0.0
        eg = rel_err(g, rg)
        if case.ref_value is not None and v is not None:
            ev = max(ev, rel_err(v, case.ref_value))
        if case.ref_grad is not None:
            eg = max(eg, rel_err(g, case.ref_grad))
        info["value_err"], info["grad_err"] = ev, eg
        if not (ev <= RTOL and eg <= RTOL):
            info["status"] = "mismatch"
    timed = {t: i for t, i in impls.items() if res["tools"][t]["status"] == "ok"}

    # ---- calibrate and time, interleaved
    jobs = []  # (tool, kind, fn, number)
    for tool, impl in timed.items():
        kinds = [("grad", impl.grad)]
        if case.ratio and impl.value is not None:
            kinds.append(("objective", impl.value))
        for kind, fn in kinds:
            if progress:
                progress.show(f"{case.problem} {case.label}: calibrating {tool} {kind}")
            try:
                number, t = _calibrate(fn, opts.min_time)
            except Exception as e:  # noqa: BLE001
                res["tools"][tool] = dict(status="error", error=f"{type(e).__name__}: {e}")
                break
            jobs.append([tool, kind, fn, number, t, []])
    jobs = [j for j in jobs if res["tools"][j[0]]["status"] == "ok"]
    round_time = sum(j[3] * j[4] for j in jobs) or 1e-9
    reps = int(min(opts.max_repeats, max(opts.min_repeats, opts.budget / round_time)))
    if case.max_repeats is not None:
        reps = min(reps, case.max_repeats)
    for r in range(reps):
        if progress:
            progress.show(f"{case.problem} {case.label}: timing round {r + 1}/{reps}")
        k = r % max(len(jobs), 1)
        for j in jobs[k:] + jobs[:k]:
            if j[4] < 0.5:  # one untimed call first: the previous tool evicted our caches
                j[2]()
            j[5].append(_sample(j[2], j[3]))
    for tool, kind, _fn, number, _t, samples in jobs:
        s = np.array(samples) / timed[tool].batch
        q25, med, q75 = np.percentile(s, [25, 50, 75])
        res["tools"][tool][kind] = dict(
            median_s=float(med), q25_s=float(q25), q75_s=float(q75), min_s=float(s.min()),
            repeats=len(s), number=number,
        )  # fmt: skip
    tape_med = res["tools"].get("tape", {}).get("grad", {}).get("median_s")
    for tool, info in res["tools"].items():
        if "grad" in info:
            steady = info["grad"]["median_s"] * timed[tool].batch  # one grad() call
            info["compile_s"] = max(0.0, info["setup_s"] + info["first_s"] - steady)
            if tape_med:
                info["grad"]["vs_tape"] = info["grad"]["median_s"] / tape_med
            if "objective" in info:
                info["grad_over_objective"] = (
                    info["grad"]["median_s"] / info["objective"]["median_s"]
                )
    return res


# ------------------------------------------------------------------ report


def _spread(d):
    return f"±{50 * (d['q75_s'] - d['q25_s']) / d['median_s']:.0f}%" if d["median_s"] > 0 else ""


def format_table(problem: Problem, results: list) -> str:
    ratio = problem.ratio
    head = ["case", "tool", "gradient", "spread", "vs tape", "first", "compile"]
    if ratio:
        head += ["objective", "grad/obj"]
    rows = []
    for res in results:
        first = True
        for tool, info in res["tools"].items():
            label = res["case"] if first else ""
            first = False
            if info["status"] != "ok" or "grad" not in info:
                what = info.get("error") or (
                    f"MISMATCH value err {info.get('value_err', 0):.1e}, grad err {info.get('grad_err', 0):.1e}"
                )
                rows.append([label, tool, what[:90]])
                continue
            g = info["grad"]
            row = [
                label,
                tool,
                fmt_time(g["median_s"]),
                _spread(g),
                f"{g['vs_tape']:.2f}" if "vs_tape" in g else "-",
                fmt_time(info["setup_s"] + info["first_s"]) if "first_s" in info else "-",
                fmt_time(info["compile_s"]) if "compile_s" in info else "-",
            ]
            if ratio:
                o = info.get("objective")
                row += [
                    fmt_time(o["median_s"]) if o else "-",
                    f"{info['grad_over_objective']:.1f}" if o else "-",
                ]
            rows.append(row)
        for n in res["notes"]:
            rows.append(["", "note", n])
    full = [r for r in rows if len(r) == len(head)] + [head]
    widths = [max(len(str(r[i])) for r in full) for i in range(len(head))]
    lines = [
        f"== {problem.name}: {problem.title}",
        "  ".join(h.ljust(w) for h, w in zip(head, widths)),
    ]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        if len(r) == len(head):
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        else:  # a message row: case, tool, text
            lines.append(f"{str(r[0]).ljust(widths[0])}  {str(r[1]).ljust(widths[1])}  {r[2]}")
    return "\n".join(lines)


def plot(problems: list, results: dict, path):
    """Gradient time against problem size, one panel per problem (GMM: one per point count),
    one line per tool, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {}  # title -> (x label, {tool: [(size, seconds)]})
    for p in problems:
        for res in results.get(p.name, []):
            title = p.name + (f" {res['case'].split()[0]}" if p.name == "gmm" else "")
            series = panels.setdefault(title, (p.x_label, {}))[1]
            for tool, info in res["tools"].items():
                if "grad" in info:
                    series.setdefault(tool, []).append((res["size"], info["grad"]["median_s"]))
    tools = list(REF_ORDER) + [
        "tape eager",
        "tape per-obs",
        "drjit",
        "casadi",
        "tape njit_gradient",
    ]
    style = {t: (f"C{k % 10}", m) for k, (t, m) in enumerate(zip(tools, "osD^vx*Ph<>d"))}
    ncol = 3
    nrow = max(1, math.ceil(len(panels) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 4 * nrow), squeeze=False)
    for ax, (title, (xlabel, series)) in zip(axes.flat, panels.items()):
        for tool in sorted(series, key=lambda t: tools.index(t) if t in tools else 99):
            xs, ys = zip(*sorted(series[tool]))
            color, marker = style.get(tool, ("k", "."))
            ax.plot(xs, ys, marker=marker, color=color, label=tool)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("gradient time [s]")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
