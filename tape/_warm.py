"""``python -m tape._warm DTYPE KIND:CODE ...``: compile op kernels into Numba's cache.

A helper process of :func:`tape._dispatch.prepare`: when a process needs several kernels that
Numba's cache lacks, it compiles a share of them itself and starts helpers on the rest (Numba
compiles one function at a time per process, holding the GIL); each helper writes its kernels
to the cache, from which the first process then loads them.
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from tape import _dispatch

    dtype, items = argv[0], argv[1:]
    for item in items:
        kind, code = (int(v) for v in item.split(":"))
        _dispatch.prepare((code,), dtype, (kind,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
