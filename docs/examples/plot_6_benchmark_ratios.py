"""
Benchmark ratios
================

The gradient times of the last full benchmark run (``python -m tape.bench``, saved in
``benchmarks/results.json``), as ratios to tape's interpreter measured in the same run: below
1 is faster than tape. The machine, versions and date are those of that run (see
:doc:`/benchmarks`).
"""

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

here = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
results = json.loads((here.parents[1] / "benchmarks" / "results.json").read_text())
meta = results["meta"]
print(f"{meta['date']}: {meta['cpu']}, {meta['cpus']} CPUs; numba {meta['numba']}, "
      f"numpy {meta['numpy']}, jax {meta['peers'].get('jax')}, torch {meta['peers'].get('torch')}")  # fmt: skip

cases = [("rosenbrock", "n=10"), ("rosenbrock", "n=1000"), ("rosenbrock", "n=100000"),
         ("mlp", None), ("mlp-large", None), ("gmm", "1k d10 K25"), ("gmm", "10k d10 K25"),
         ("lstm", "l2 c1024"), ("gp", "n=100")]  # fmt: skip
tools = ["tape compiled", "njit (hand)", "jax jit", "torch"]
labels, ratios = [], {tool: [] for tool in tools}
for problem, case in cases:
    entries = results["results"].get(problem, [])
    entry = next((e for e in entries if case is None or e["case"] == case), None)
    if entry is None:
        continue
    labels.append(f"{problem}\n{entry['case'] if case else ''}".strip())
    for tool in tools:
        r = entry["tools"].get(tool, {})
        ratios[tool].append(r["grad"]["vs_tape"] if r.get("status") == "ok" else np.nan)

fig, ax = plt.subplots(figsize=(11, 4.5))
width = 0.8 / len(tools)
pos = np.arange(len(labels))
for i, tool in enumerate(tools):
    ax.bar(pos + (i - (len(tools) - 1) / 2) * width, ratios[tool], width, label=tool)
ax.axhline(1.0, color="k", lw=0.8)
ax.set_yscale("log")
ax.set_xticks(pos, labels, fontsize=8)
ax.set_ylabel("gradient time / tape interpreter's")
ax.set_title(f"gradient time relative to tape's interpreter ({meta['cpu']}, {meta['date'][:10]})")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
