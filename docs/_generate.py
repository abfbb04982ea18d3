"""Pages written at build time: the API reference from the public ``__all__`` lists, and the
benchmark tables from ``benchmarks/results.json``.

Every name in :data:`MODULES`' ``__all__`` lists gets an entry, so the reference cannot miss a
public name; ``tests/test_docstrings.py`` checks that each has a docstring.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

MODULES = {
    "tape": "The top-level namespace: tensors, recording and replay, transforms, the operations",
    "tape.nn.functional": "PyTorch's ``torch.nn.functional``: losses and activations",
    "tape.optim": "PyTorch's optimisers",
    "tape.linalg": "Linear algebra, following ``numpy.linalg``, differentiable to every order",
    "tape.autograd": "PyTorch's ``torch.autograd``: eager gradients and custom Functions",
    "tape.cuda": "Replay of recorded tapes on an NVIDIA GPU (the ``cuda`` extra)",
    "tape.distributed": "Gradients summed over the chunks of Dask arrays (the ``distributed`` extra)",
    "tape.optimize": "SciPy's optimisers fed with tape's derivatives",
}

# objects that are neither functions nor classes: their description here
DATA = {
    "tape.float64": "The float64 dtype (NumPy's ``float64``), tape's default.",
    "tape.float32": "The float32 dtype (NumPy's ``float32``); ``tape.float`` is the same object.",
    "tape.int64": "The int64 dtype, for indices and integer data; ``tape.long`` is the same object.",
    "tape.int32": "PyTorch's ``int`` name (``tape.int``): integer tensors store int64.",
    "tape.bool_": "The bool dtype, for masks and comparisons; ``tape.bool`` is the same object.",
    "tape.double": "Another name of :data:`tape.float64` (PyTorch's spelling).",
    "tape.long": "Another name of :data:`tape.int64` (PyTorch's spelling).",
    "tape.default_generator": (
        "The :class:`tape.Generator` that ``randn``, ``rand``, ``randint`` and ``normal`` draw "
        "from when given no ``generator=`` (seeded by :func:`tape.manual_seed`)."
    ),
    "tape.accelerator": (
        "PyTorch's ``torch.accelerator``: ``is_available()`` is False and "
        "``current_accelerator()`` None, since eager tensors live on the CPU (recorded tapes "
        "replay on a GPU with :meth:`tape.Tape.to`)."
    ),
    "tape.optim.required": (
        "The marker of a required optimiser argument (PyTorch's ``torch.optim.optimizer.required``)."
    ),
    "tape.distributed.MAX_TAPES": (
        "How many tapes (one per function and chunk shape) a worker keeps, least recently used "
        "dropped first."
    ),
    "tape.distributed.MAX_FUNCTIONS": "How many shipped objective functions a worker keeps.",
}

# the top-level names, grouped; names not listed fall under "Operations"
GROUPS = {
    "Tensors and creation": [
        "Tensor",
        "Size",
        "GradFn",
        "tensor",
        "as_tensor",
        "from_numpy",
        "zeros",
        "ones",
        "full",
        "empty",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_like",
        "arange",
        "linspace",
        "eye",
    ],
    "Autograd switches": [
        "no_grad",
        "enable_grad",
        "is_grad_enabled",
        "set_grad_enabled",
        "inference_mode",
    ],
    "Dtypes and devices": [
        "float64",
        "float32",
        "int64",
        "int32",
        "bool_",
        "double",
        "long",
        "device",
        "accelerator",
        "set_default_device",
        "get_default_device",
        "set_default_dtype",
        "get_default_dtype",
    ],
    "Random numbers": [
        "randn",
        "rand",
        "randint",
        "randn_like",
        "rand_like",
        "normal",
        "manual_seed",
        "seed",
        "initial_seed",
        "Generator",
        "default_generator",
    ],
    "Recording and replay": [
        "record",
        "Tape",
        "load",
        "KernelArgs",
        "warmup",
        "checkpoint",
        "custom_op",
        "CustomOp",
    ],
    "Transforms (JAX's signatures)": [
        "grad",
        "value_and_grad",
        "jacobian",
        "jacfwd",
        "jacrev",
        "hessian",
        "jvp",
        "vjp",
        "hvp",
    ],
    "Checking and errors": [
        "gradcheck",
        "GradcheckError",
        "detect_anomaly",
        "AnomalyError",
        "ReplayError",
        "GuardError",
        "GuardWarning",
        "CompileError",
    ],
    "Modules": ["linalg", "kernels", "sweeps", "compiled"],
}

CLASS_MEMBERS = {
    "tape.Tensor",
    "tape.Tape",
    "tape.KernelArgs",
    "tape.Generator",
    "tape.optim.Optimizer",
    "tape.optim.SGD",
    "tape.optim.Adam",
    "tape.optim.AdamW",
    "tape.cuda.CudaTape",
    "tape.cuda.CudaBatch",
    "tape.autograd.Function",
    "tape.autograd.FunctionCtx",
    "tape.CustomOp",
}


def public_names(module: str) -> list[str]:
    """The public names of ``module``: its ``__all__``."""
    return list(importlib.import_module(module).__all__)


def _entry(module: str, name: str) -> str:
    obj = getattr(importlib.import_module(module), name)
    full = f"{module}.{name}"
    if inspect.ismodule(obj):
        first = (inspect.getdoc(obj) or "").strip().split("\n\n")[0].replace("\n", " ")
        if obj.__name__ in ("tape.frontend.linalg",):
            first += " See :doc:`tape.linalg`."
        first = first.rstrip(":")  # a paragraph that introduces a literal block
        return (
            f".. py:data:: {name}\n   :module: {module}\n   :no-index:\n\n"
            f"   Module ``{full}``. {first}\n"
        )
    if full in DATA:
        return f".. py:data:: {name}\n   :module: {module}\n\n   {DATA[full]}\n"
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return f".. autoexception:: {full}\n"
        members = "   :members:\n" if full in CLASS_MEMBERS else ""
        return f".. autoclass:: {full}\n{members}"
    return f".. autofunction:: {full}\n"


def api_pages(out: Path) -> None:
    """Write ``out/<module>.rst`` for every module in :data:`MODULES` (rewritten only when
    their text changes, so incremental builds stay incremental)."""
    out.mkdir(parents=True, exist_ok=True)
    for module, title in MODULES.items():
        names = public_names(module)
        head = f"``{module}``"
        lines = [head, "=" * len(head), "", title + ".", "", f".. automodule:: {module}", ""]
        if module == "tape":
            seen = set()
            for group, members in GROUPS.items():
                lines += [group, "-" * len(group), ""]
                for n in members:
                    assert n in names, f"{n} is not in tape.__all__"
                    seen.add(n)
                    lines += [_entry(module, n), ""]
            rest = [n for n in names if n not in seen]
            lines += [
                "Operations",
                "-" * 10,
                "",
                "Functions on tensors (also methods of :class:`tape.Tensor`), NumPy's "
                "names and PyTorch's; each records one tape op or a few.",
                "",
            ]
            for n in rest:
                lines += [_entry(module, n), ""]
        else:
            for n in names:
                lines += [_entry(module, n), ""]
        _write(out / f"{module}.rst", "\n".join(lines))


def _write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _fmt_s(s):
    if s is None:
        return ""
    for unit, k in (("s", 1), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
        if s * k >= 1:
            return f"{s * k:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def benchmark_tables(bench: Path, out: Path) -> None:
    """Write ``out/benchmarks.md``: the run's machine and versions, then one table per problem
    with each tool's median gradient time and its ratio to tape's, from ``results.json``."""
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads((bench / "results.json").read_text())
    meta = data["meta"]
    peers = ", ".join(f"{k} {v}" for k, v in meta.get("peers", {}).items() if v)
    lines = [
        f"- date: {meta.get('date')}",
        f"- machine: {meta.get('cpu')}, {meta.get('cpus')} CPUs ({meta.get('cpus_used')} used, "
        f"threads per tool: {meta.get('threads')}), BLAS kernels: {meta.get('blas')}, "
        f"{meta.get('platform')}",
        f"- versions: tape {meta.get('tape')}, Python {meta.get('python')}, NumPy "
        f"{meta.get('numpy')}, Numba {meta.get('numba')}, SciPy {meta.get('scipy')}; peers: "
        f"{peers}",
        f"- command: `{' '.join(meta.get('argv', []))}` ({meta.get('elapsed_s', 0):.0f} s)",
        "",
        "Median gradient time of each tool, and its ratio to tape's interpreter in the same run "
        "(`vs tape`: below 1 is faster than tape). `first` is the first call, compile included.",
        "",
    ]
    for problem, cases in data["results"].items():
        lines += [f"### {problem}", ""]
        tools = []
        for case in cases:
            for tool in case["tools"]:
                if tool not in tools:
                    tools.append(tool)
        lines += ["| case | " + " | ".join(tools) + " |", "|---|" + "---|" * len(tools)]
        for case in cases:
            cells = []
            for tool in tools:
                r = case["tools"].get(tool)
                if not r or r.get("status") != "ok" or not r.get("grad"):
                    cells.append((r or {}).get("status", ""))
                    continue
                g = r["grad"]
                cells.append(f"{_fmt_s(g['median_s'])} ({g.get('vs_tape', 0):.2f}x)")
            lines.append(f"| {case['case']} | " + " | ".join(cells) + " |")
        lines.append("")
    _write(out / "benchmarks.md", "\n".join(lines))
