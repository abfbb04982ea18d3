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
    """``main`` with the problems only ``other`` has (see the module docstring)."""
    if main["meta"].get("cpu") != other["meta"].get("cpu"):
        raise ValueError(
            f"tape.bench.merge: the runs were on different machines ({main['meta'].get('cpu')!r} "
            f"and {other['meta'].get('cpu')!r}); their rows would not compare"
        )
    out = {"meta": dict(main["meta"]), "skipped": list(main.get("skipped", [])), "results": {}}
    out["results"] = {k: list(v) for k, v in main["results"].items()}
    taken = []
    for k, cases in other["results"].items():
        have = {r["case"] for r in out["results"].get(k, [])}
        new = [r for r in cases if r["case"] not in have]
        if not new:
            continue
        out["results"].setdefault(k, [])
        out["results"][k] += new
        whole = not have
        taken.append(k if whole else f"{k} ({', '.join(r['case'] for r in new)})")
    if taken:
        om = other["meta"]
        run = {"date": om["date"], "elapsed_s": om.get("elapsed_s", 0.0),
               "argv": om.get("argv", []), "problems": taken, "note": note}  # fmt: skip
        out["meta"]["merged"] = list(main["meta"].get("merged", [])) + [run]
    return out


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
