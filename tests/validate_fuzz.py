"""Fuzzing of tape files: mutate saved tapes at random, load them, replay what loads.

Run as a script (``tests/test_validate.py`` runs it in a subprocess, so that a crash of the
compiled sweeps fails the test instead of killing pytest)::

    python tests/validate_fuzz.py --n 1000 --seed 0

Each mutation sets a random field of ``entries`` / ``bufs`` / ``ipool`` to a random or extreme
value or to a value borrowed from elsewhere in the same tape, truncates an array, edits the
JSON metadata or a value of the arena (1 to 3 of these at once). ``tape.load`` must then raise
``ValueError`` or return a tape whose replays (``backward`` on the loaded values,
``gradient`` / ``forward``, now and then ``gradient_batch``) either work or raise a Python
exception; anything else, such as a segfault, is a failure. Before each mutation a line
describing it goes to stderr (flushed), so the last line names the culprit of a crash. The
last line on stdout is a JSON summary.

An out-of-bounds access need not crash. For a stricter run, compile the sweeps with Numba's
bounds checking (in a cache of their own: it takes minutes) and count its ``IndexError`` as a
failure::

    NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=/tmp/tape-boundscheck \
        python tests/validate_fuzz.py --n 5000 --boundscheck
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import warnings

import numpy as np

import tape as tp


def _families():
    """(name, function, example args) covering the op families."""

    def elementwise(x, y):
        xc = x[:, None]
        z = xc * y - tp.exp(y) / (1.0 + xc**2) + tp.where(y > 0, y, -y) + tp.clip(y, -1.0, xc)
        return (z + tp.sin(x).sum()).sum()

    def reductions(x):
        return x.sum(axis=0).max() + x.max(axis=1).sum() + x.min() * x.prod(axis=0).sum()

    def movement(x):
        a = (x.T[::-1, 1:] ** 2).sum()
        b = tp.concatenate([x[0], x[:, 1]]).sum()
        return a + b + tp.broadcast_to(x[0], (2, 4)).sum()

    def gather(x, idx):
        return (x[idx] * x[idx[::-1]]).sum() + (x[:, None] * 1.0)[idx, 0].sum()

    def linalg(a, b, v, c):
        return (a @ b).sum() + (a @ v).sum() + (c @ b).sum()

    def guarded(x):
        if x.sum() > 0:  # a truth-value guard
            x = x * 2.0
        return x.sum() * float(x[0])  # a value guard

    rng = np.random.default_rng(1)
    x3, y34 = rng.standard_normal(3), rng.standard_normal((3, 4))
    return [
        ("elementwise", elementwise, (x3, y34)),
        ("elementwise32", elementwise, (x3.astype(np.float32), y34.astype(np.float32))),
        ("reductions", reductions, (y34,)),
        ("movement", movement, (y34,)),
        ("gather", gather, (rng.standard_normal(5), np.array([0, 4, -1, 2]))),
        (
            "linalg",
            linalg,
            (
                y34,
                rng.standard_normal((4, 2)),
                rng.standard_normal(4),
                rng.standard_normal((2, 3, 4)),
            ),
        ),
        ("guarded", guarded, (np.abs(x3) + 0.5,)),
    ]


def _state(t):
    buf = io.BytesIO()
    t.save(buf)
    with np.load(io.BytesIO(buf.getvalue()), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _save(st):
    buf = io.BytesIO()
    np.savez(buf, **st)
    return buf.getvalue()


JUNK = [None, "x", -1, 0, 10**30, [], {}, [10**9], True, 1.5, {"a": 1}, [[-1]], "<f8"]


def _extreme(rng, orig, n):
    """A value for a field whose current value is ``orig`` in a table of ``n`` rows."""
    choices = [-1, 0, 1, 2, 3, 2**31, 2**62, -(2**62), orig + 1, orig - 1, n - 1, n, n + 1]
    choices += [int(rng.integers(-5, 50)), int(rng.integers(-(2**40), 2**40))]
    return choices[int(rng.integers(len(choices)))]


def _mutate_field(rng, st):
    key = ["entries", "bufs", "ipool"][int(rng.choice(3, p=[0.4, 0.35, 0.25]))]
    a = st[key].copy()
    if a.size == 0:
        return "field: empty " + key
    flat = a.reshape(-1)
    k = int(rng.integers(flat.size))
    lens = {"entries": len(st["bufs"]), "bufs": len(st["data"]), "ipool": len(st["ipool"])}
    v = _extreme(rng, int(flat[k]), lens[key])
    flat[k] = v
    st[key] = a
    where = f"[{k // 6}, {k % 6}]" if a.ndim == 2 else f"[{k}]"
    return f"field: {key}{where} = {v}"


def _mutate_borrow(rng, st):
    """A value that is valid somewhere else in the same tape: another entry's buffer or
    attribute position, another buffer's offset or (consistent) size and shape. These pass
    the range checks and must be caught by the size and block checks."""
    e, b = st["entries"].copy(), st["bufs"].copy()
    if e.ndim != 2 or b.ndim != 2 or len(e) < 2 or len(b) < 2:
        return "borrow: nothing to borrow"
    if rng.random() < 0.6:
        i, j = (int(v) for v in rng.integers(len(e), size=2))
        c = int(rng.integers(1, 6))
        e[i, c] = e[j, c] if rng.random() < 0.5 or c == 5 else int(rng.integers(len(b)))
        st["entries"] = e
        return f"borrow: entries[{i}, {c}] = {e[i, c]} (from entry {j})"
    i, j = (int(v) for v in rng.integers(len(b), size=2))
    cols = [[0], [1, 2, 3], [0, 1, 2, 3]][int(rng.integers(3))]
    b[i, cols] = b[j, cols]
    st["bufs"] = b
    return f"borrow: bufs[{i}, {cols}] from buffer {j}"


def _mutate_truncate(rng, st):
    key = ["entries", "bufs", "ipool", "data"][int(rng.integers(4))]
    a = st[key]
    if a.ndim == 2 and rng.random() < 0.5:
        n = int(rng.integers(a.shape[0] + 1))
        st[key] = a[:n]
        return f"truncate: {key} to {n} rows"
    flat = a.reshape(-1)
    n = int(rng.integers(flat.size + 1)) if flat.size else 0
    st[key] = flat[:n].copy()
    return f"truncate: {key} (flattened) to {n}"


def _mutate_data(rng, st):
    d = st["data"].copy()
    if d.size == 0:
        return "data: empty"
    k = int(rng.integers(d.size))
    v = [np.nan, np.inf, -7.0, 3.5, 1e300, 2.0**40, -1.0, 4.0][int(rng.integers(8))]
    d[k] = v
    st["data"] = d
    return f"data[{k}] = {v}"


def _mutate_meta(rng, st):
    text = str(st["meta"])
    if rng.random() < 0.05:
        n = int(rng.integers(len(text)))
        st["meta"] = np.array(text[:n])
        return f"meta: JSON cut at {n}"
    try:
        meta = json.loads(text)
    except ValueError:
        return "meta: (already cut)"
    keys = sorted(meta) + ["unknown_key"]
    key = keys[int(rng.integers(len(keys)))]
    r = rng.random()
    if r < 0.15:
        meta.pop(key, None)
        desc = f"meta: delete {key}"
    elif r < 0.4:
        v = JUNK[int(rng.integers(len(JUNK)))]
        meta[key] = v
        desc = f"meta: {key} = {v!r}"
    else:
        desc = _edit_meta_value(rng, meta, key, len(st["bufs"]))
    st["meta"] = np.array(json.dumps(meta))
    return desc


def _edit_meta_value(rng, meta, key, nb):
    v = meta.get(key)
    names = sorted(tp.registry.BY_NAME)
    if key == "op_names" and isinstance(v, dict) and v:
        c = sorted(v)[int(rng.integers(len(v)))]
        new = names[int(rng.integers(len(names)))] if rng.random() < 0.9 else "no_such_op"
        v[c] = new
        return f"meta: op_names[{c}] = {new}"
    if key == "dtype":
        meta[key] = ["<f4", "<f8", "<i8", "garbage", "|V99999999999"][int(rng.integers(5))]
        return f"meta: dtype = {meta[key]}"
    if key == "input_dtypes" and isinstance(v, list) and v:
        k = int(rng.integers(len(v)))
        v[k] = ["<i8", "<f4", "<c16", "|b1", "|O", "<M8[s]"][int(rng.integers(6))]
        return f"meta: input_dtypes[{k}] = {v[k]}"
    if key == "shapes" and isinstance(v, list) and v:
        k = int(rng.integers(len(v)))
        if isinstance(v[k], list) and v[k] and rng.random() < 0.7:
            j = int(rng.integers(len(v[k])))
            v[k][j] = int(_extreme(rng, int(v[k][j]), 10))
        else:
            v[k] = (v[k] if isinstance(v[k], list) else []) + [1]
        return f"meta: shapes[{k}] = {v[k]}"
    if key == "out_single":
        meta[key] = not v
        return f"meta: out_single = {meta[key]}"
    if key in ("inputs", "outputs", "wrt") and isinstance(v, list) and v:
        k = int(rng.integers(len(v)))
        v[k] = int(rng.integers(-2, nb + 3))
        return f"meta: {key}[{k}] = {v[k]}"
    if key == "sources" and isinstance(v, dict):
        v[str(int(rng.integers(-3, 100)))] = "x.py:1"
        return "meta: sources entry added"
    meta[key] = JUNK[int(rng.integers(len(JUNK)))]
    return f"meta: {key} = {meta[key]!r}"


MUTATIONS = [
    (_mutate_field, 0.4),
    (_mutate_borrow, 0.2),
    (_mutate_truncate, 0.08),
    (_mutate_meta, 0.22),
    (_mutate_data, 0.1),
]


BOUNDSCHECK_MESSAGE = "index is out of bounds"  # Numba's, under NUMBA_BOUNDSCHECK=1


def _replay(t, args, rng, stats, line, errors, boundscheck):
    """Replays of a loaded tape; Python exceptions are fine, a crash is not (nor, with
    ``boundscheck``, an access that Numba's bounds checking caught)."""
    calls = []
    scalar = False
    try:
        scalar = t.signature.n_seed == 1
    except Exception:  # noqa: BLE001
        pass
    if scalar:
        calls.append(("backward before forward", lambda: t.backward()))
        calls.append(("gradient", lambda: t.gradient(*args)))
    calls.append(("forward", lambda: t.forward(*args)))
    if scalar:
        calls.append(("backward", lambda: t.backward()))
    calls.append(("str", lambda: str(t)))
    if rng.random() < 0.1:
        calls.append(
            ("gradient_batch", lambda: t.gradient_batch(*[np.stack([a, a]) for a in args]))
        )
    for what, call in calls:
        try:
            call()
            stats["replay_ok"] += 1
        except Exception as e:  # noqa: BLE001  (any Python exception is an acceptable outcome)
            if boundscheck and isinstance(e, IndexError) and str(e) == BOUNDSCHECK_MESSAGE:
                errors.append(f"{line}: {what} indexed out of bounds")
            name = f"{what}: {type(e).__name__}"
            stats["replay_raised"][name] = stats["replay_raised"].get(name, 0) + 1
            if what == "forward":
                # A backward over a forward that stopped part way would run the reverse
                # kernels on data the forward never checked (a gather's indices): a hazard
                # of the replay API for any tape, not of the file, so it is not fuzzed here.
                break


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="number of mutated tapes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--boundscheck",
        action="store_true",
        help="count Numba's bounds-check IndexError as a failure (run with NUMBA_BOUNDSCHECK=1)",
    )
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # guard warnings, stale-sweep warnings while developing
    rng = np.random.default_rng(opts.seed)
    bases = []
    for name, fn, args in _families():
        t = tp.record(fn, *args, on_change="raise")
        t.gradient(*args)
        bases.append((name, _state(t), args))
        # the unmutated file loads and replays
        t2 = tp.load(_save(bases[-1][1]))
        t2.gradient(*args)
    stats = {"mutations": opts.n, "rejected": 0, "loaded": 0, "replay_ok": 0, "replay_raised": {}}
    errors = []
    kinds, weights = zip(*MUTATIONS)
    for m in range(opts.n):
        name, st0, args = bases[int(rng.integers(len(bases)))]
        st = dict(st0)
        descs = []
        for _ in range(int(rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1]))):
            descs.append(kinds[int(rng.choice(len(kinds), p=weights))](rng, st))
        line = f"{m} {name}: " + "; ".join(descs)
        print(line, file=sys.stderr, flush=True)
        try:
            blob = _save(st)
        except Exception as e:  # noqa: BLE001  (a mutation NumPy cannot save: not a file)
            print(f"  not saved: {e}", file=sys.stderr)
            continue
        try:
            t = tp.load(blob)
        except ValueError:
            stats["rejected"] += 1
            continue
        except Exception as e:  # noqa: BLE001
            errors.append(f"{line}: tape.load raised {type(e).__name__}: {e}")
            continue
        stats["loaded"] += 1
        _replay(t, args, rng, stats, line, errors, opts.boundscheck)
    stats["errors"] = errors
    print(json.dumps(stats))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
