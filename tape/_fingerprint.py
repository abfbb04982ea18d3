"""Fingerprint of every source compiled into the generated sweeps (see :mod:`tape._codegen`),
and the write-or-check step both code generators (CPU and GPU) share."""

import hashlib
from pathlib import Path

PKG = Path(__file__).resolve().parent
SOURCES = [
    "registry.py", "_layout.py", "_config.py", "_masked.py", "_loops.py", "_codegen.py", "_drivers.py",
    "_fingerprint.py", "_vmath.py", "_blas.py",
]


def fingerprint() -> str:
    h = hashlib.sha256()
    files = [PKG / s for s in SOURCES] + sorted((PKG / "ops").glob("*.py"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def write_or_check(target: Path, text: str, argv, command: str, what: str) -> int:
    """``--check`` in ``argv``: exit status 1 if ``target`` differs from ``text``; otherwise
    write ``target`` (creating its package folder)."""
    import sys

    if "--check" in argv:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is stale: run `{command}`", file=sys.stderr)
            return 1
        print(f"{what} are up to date")
        return 0
    target.parent.mkdir(exist_ok=True)
    init = target.parent / "__init__.py"
    if not init.exists():
        init.write_text("")
    target.write_text(text)
    print(f"wrote {target}")
    return 0
