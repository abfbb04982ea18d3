"""Fingerprint of every source compiled into the generated sweeps (see :mod:`tape._codegen`)."""

import hashlib
from pathlib import Path

PKG = Path(__file__).resolve().parent
SOURCES = ["registry.py", "_layout.py", "_config.py", "_loops.py", "_codegen.py", "_fingerprint.py"]


def fingerprint() -> str:
    h = hashlib.sha256()
    files = [PKG / s for s in SOURCES] + sorted((PKG / "ops").glob("*.py"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()
