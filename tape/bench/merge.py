"""Merge benchmark JSON files: ``python -m tape.bench.merge OUT.json MAIN.json OTHER.json
[NOTE]``. ``OUT`` has ``MAIN``'s machine data and results, and every case (a problem at one
size) that ``MAIN`` did not run taken from ``OTHER``; the report lists which cases came from
which run (date, command, wall time, and ``NOTE``). For re-running some cases after a change
(``--adbench`` pointed at a folder with some of the instances) without re-running the whole
suite: each case's ratios still come from one run."""

from __future__ import annotations

import json
import sys


def merge(main: dict, other: dict, note: str = "") -> dict:
    """``main`` with the cases only ``other`` has (see the module docstring). A case that
    ``other`` had itself taken from an earlier run (``other`` was a merge) is credited to that
    run, not to ``other``'s."""
    if main["meta"].get("cpu") != other["meta"].get("cpu"):
        raise ValueError(
            f"tape.bench.merge: the runs were on different machines ({main['meta'].get('cpu')!r} "
            f"and {other['meta'].get('cpu')!r}); their rows would not compare"
        )
    out = {"meta": dict(main["meta"]), "skipped": list(main.get("skipped", [])), "results": {}}
    out["results"] = {k: list(v) for k, v in main["results"].items()}
    om = other["meta"]
    own = {"date": om["date"], "elapsed_s": om.get("elapsed_s", 0.0), "argv": om.get("argv", []),
           "note": note}  # fmt: skip
    sources = list(om.get("merged", [])) + [own]  # the earlier runs first: they are more specific
    taken: list[dict] = [{} for _ in sources]  # per source run: problem -> [case]
    for k, cases in other["results"].items():
        have = {r["case"] for r in out["results"].get(k, [])}
        new = [r for r in cases if r["case"] not in have]
        if not new:
            continue
        out["results"].setdefault(k, [])
        out["results"][k] += new
        for r in new:
            i = next(i for i, run in enumerate(sources) if run is own or _lists(run, k, r["case"]))
            taken[i].setdefault(k, []).append(r["case"])
    merged = list(main["meta"].get("merged", []))
    for run, cases in zip(sources, taken):
        if cases:
            problems = [k if len(v) == len(other["results"][k]) and k not in main["results"]
                        else f"{k} ({', '.join(v)})" for k, v in cases.items()]  # fmt: skip
            keep = {f: run[f] for f in ("date", "elapsed_s", "argv", "note") if f in run}
            merged.append({**keep, "problems": problems, "cases": cases})
    if merged:
        out["meta"]["merged"] = merged
    return out


def _lists(run, problem, case):
    """Case ``case`` of ``problem`` is among those a merged run entry credits to its run (by
    its ``cases``, or, in files written before they were kept, its ``problems`` lines:
    ``"gmm"`` for the whole problem, ``"gmm (1k d2 K5, 1k d2 K10)"`` for some cases)."""
    if "cases" in run:
        return case in run["cases"].get(problem, ())
    for line in run.get("problems", []):
        if line == problem:
            return True
        if line.startswith(problem + " (") and line.endswith(")"):
            if f", {case}, " in f", {line[len(problem) + 2 : -1]}, ":
                return True
    return False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        a = json.load(f)
    with open(argv[2]) as f:
        b = json.load(f)
    doc = merge(a, b, argv[3] if len(argv) > 3 else "")
    with open(argv[0], "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
