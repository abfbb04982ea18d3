"""How tensors print: PyTorch's layout (``tensor([...], requires_grad=True)``).

A port of the rules in ``torch/_tensor_str.py`` (default print options) onto NumPy
arrays, so that tutorial output reads the same under ``import tape as torch``:

* precision 4; floats that are all integral print as ``1.``; otherwise fixed ``0.1000``;
  scientific ``1.0000e-05`` when the nonzero finite magnitudes span more than a factor
  of 1000, exceed ``1e8`` or fall below ``1e-4``; ``nan``, ``inf``, ``-inf`` as words;
* every element is right-aligned to a common width; rows continue under the column
  after ``tensor([`` and 1-d rows wrap at 80 columns;
* tensors with more than 1000 elements are summarised with ``...`` (3 edge items);
* suffixes, in PyTorch's order: ``size=`` (empty tensors that are not 1-d), ``dtype=``
  (when not the default float dtype, ``int64`` or ``bool``), then ``grad_fn=<...>`` or
  ``requires_grad=True``; a suffix that would pass column 80 starts a new line.
"""

from __future__ import annotations

import math

import numpy as np

PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80


def _default_dtype() -> np.dtype:
    """tape's default float dtype (``tape.get_default_dtype()`` where it exists)."""
    import tape

    return np.dtype(getattr(tape, "get_default_dtype", lambda: np.dtype("float64"))())


def _dtype_name(dt: np.dtype) -> str:
    """``tape.float32`` style name of a NumPy dtype (``tape.bool`` for booleans)."""
    return "tape." + ("bool" if dt.kind == "b" else dt.name)


class _Formatter:
    """Chooses one notation and width for all elements of an array (torch's ``_Formatter``)."""

    def __init__(self, v: np.ndarray):
        self.floating = v.dtype.kind == "f"
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = v.reshape(-1)
        if not self.floating:
            for x in flat.tolist():
                self.max_width = max(self.max_width, len(str(x)))
            return
        vals = flat[np.isfinite(flat) & (flat != 0)]
        if vals.size == 0:
            return
        mags = np.abs(vals).astype(np.float64)
        lo, hi = float(mags.min()), float(mags.max())
        self.int_mode = bool(np.all(np.ceil(vals) == vals))
        self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4
        values = vals.tolist()  # Python floats holding the exact stored values
        if self.sci_mode:
            widths = (len(f"{x:.{PRECISION}e}") for x in values)
        elif self.int_mode:
            widths = (len(f"{x:.0f}") + 1 for x in values)
        else:
            widths = (len(f"{x:.{PRECISION}f}") for x in values)
        self.max_width = max(self.max_width, max(widths))

    def format(self, x) -> str:
        """One element (a Python scalar), right-aligned to the common width."""
        if self.floating:
            if self.sci_mode:
                s = f"{x:{self.max_width}.{PRECISION}e}"
            elif self.int_mode:
                s = f"{x:.0f}"
                if not (math.isinf(x) or math.isnan(x)):
                    s += "."
            else:
                s = f"{x:.{PRECISION}f}"
        else:
            s = str(x)
        return s.rjust(self.max_width)


def _summarized(v: np.ndarray) -> np.ndarray:
    """The elements a summarised print shows (edge items of every dimension)."""
    if v.ndim == 0:
        return v
    if v.ndim == 1:
        if v.shape[0] > 2 * EDGEITEMS:
            return np.concatenate((v[:EDGEITEMS], v[-EDGEITEMS:]))
        return v
    rows = range(v.shape[0])
    if v.shape[0] > 2 * EDGEITEMS:
        rows = [*range(EDGEITEMS), *range(v.shape[0] - EDGEITEMS, v.shape[0])]
    return np.stack([_summarized(v[i]) for i in rows])


def _vector_str(v: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    """A 1-d array as ``[a, b, ...]``, wrapped at :data:`LINEWIDTH` columns."""
    per_line = max(1, (LINEWIDTH - indent) // (fmt.max_width + 2))
    if summarize and v.shape[0] > 2 * EDGEITEMS:
        data = (
            [fmt.format(x) for x in v[:EDGEITEMS].tolist()]
            + [" ..."]
            + [fmt.format(x) for x in v[-EDGEITEMS:].tolist()]
        )
    else:
        data = [fmt.format(x) for x in v.tolist()]
    lines = [", ".join(data[i : i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _array_str(v: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    """Nested brackets for any rank; ``indent`` is the column of the opening bracket."""
    if v.ndim == 0:
        return fmt.format(v.item())
    if v.ndim == 1:
        return _vector_str(v, indent, summarize, fmt)
    n = v.shape[0]
    if summarize and n > 2 * EDGEITEMS:
        slices = (
            [_array_str(v[i], indent + 1, summarize, fmt) for i in range(EDGEITEMS)]
            + ["..."]
            + [_array_str(v[i], indent + 1, summarize, fmt) for i in range(n - EDGEITEMS, n)]
        )
    else:
        slices = [_array_str(v[i], indent + 1, summarize, fmt) for i in range(n)]
    return "[" + ("," + "\n" * (v.ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def _add_suffixes(body: str, suffixes: list[str], indent: int) -> str:
    """Append ``, suffix`` items, starting a new line where one would pass column 80."""
    out = [body]
    last_line_len = len(body) - body.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > LINEWIDTH:
            out.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            out.append(", " + suffix)
            last_line_len += len(suffix) + 2
    out.append(")")
    return "".join(out)


def array_str(v: np.ndarray, indent: int = len("tensor(")) -> str:
    """The bracketed contents of ``v`` as PyTorch lays them out after ``tensor(``."""
    if v.size == 0:
        return "[]"
    summarize = v.size > THRESHOLD
    fmt = _Formatter(_summarized(v) if summarize else v)
    return _array_str(v, indent, summarize, fmt)


def grad_fn_name(op: str) -> str:
    """PyTorch's name for the backward node of op ``op``: ``mul`` -> ``MulBackward0``."""
    return "".join(p.capitalize() for p in op.split("_")) + "Backward0"


def tensor_repr(t) -> str:
    """``repr(t)`` (and ``str(t)``) for a :class:`tape.Tensor`, in PyTorch's layout."""
    prefix = "tensor("
    v = np.asarray(t._peek())
    dt = np.dtype(t.dtype)
    default = _default_dtype()
    suffixes = []
    if v.size == 0:
        if v.ndim != 1:
            suffixes.append(f"size={tuple(int(n) for n in v.shape)}")
        if dt != default:
            suffixes.append(f"dtype={_dtype_name(dt)}")
        body = "[]"
    else:
        if dt not in (default, np.dtype(np.int64), np.dtype(np.bool_)):
            suffixes.append(f"dtype={_dtype_name(dt)}")
        body = array_str(v, len(prefix))
    if t._op is not None:
        suffixes.append(f"grad_fn=<{grad_fn_name(t._op)}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, len(prefix))
