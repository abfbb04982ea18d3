"""Where in the user's code an entry was recorded: ``file:line`` of the innermost frame outside
the ``tape`` package, for guard and anomaly messages and ``print(t)``."""

from __future__ import annotations

import os
import sys

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # tape/
# files of the package that are user code of the library (the demo, the benchmark problems)
_USER_CODE = (_PKG + "bench" + os.sep, _PKG + "__main__.py")


def user_line() -> str:
    """``file:line`` of the innermost caller outside the tape package ("" if none)."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG) or fn.startswith(_USER_CODE):
            return f"{os.path.basename(fn)}:{f.f_lineno}"
        f = f.f_back
    return ""
