"""Tape files are untrusted input: ``tape.load`` and unpickling validate every index, offset,
shape and attribute block before compiled code sees them (``tape/ops/validate.py``)."""

import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_ops import KERNEL_CASES

import tape as tp
from tape.layout.columns import (
    B_ALIAS,
    B_OFF,
    B_SIZE,
    E_ATTR,
    E_IN0,
    E_OP,
    E_OUT,
)
from tape.ops import registry
from tape.ops.validate import check_tape
from tape.program.core import Tape

# ---------------------------------------------------------------- helpers


def _state(t):
    """The arrays and metadata ``t.save`` writes, as a dict of fresh arrays."""
    buf = io.BytesIO()
    t.save(buf)
    with np.load(io.BytesIO(buf.getvalue()), allow_pickle=False) as z:
        return {k: z[k].copy() for k in z.files}


def _load(st):
    buf = io.BytesIO()
    np.savez(buf, **st)
    return tp.load(buf.getvalue())


def _meta(st, **changes):
    meta = json.loads(str(st["meta"]))
    meta.update(changes)
    st["meta"] = np.array(json.dumps(meta))
    return st


def _entry(st, name, k=0):
    """Row of the ``k``-th entry of op ``name`` in a saved state."""
    codes = {int(c) for c, n in json.loads(str(st["meta"]))["op_names"].items() if n == name}
    rows = [i for i, c in enumerate(st["entries"][:, E_OP]) if int(c) in codes]
    return rows[k]


def _attr(st, i, j, value):
    """Set int ``j`` of entry ``i``'s attribute block (blocks are shared: copy it first)."""
    p = int(st["entries"][i, E_ATTR])
    n = len(st["ipool"])
    block = st["ipool"][p:].copy()
    block[j] = value
    st["ipool"] = np.concatenate([st["ipool"], block])
    st["entries"][i, E_ATTR] = n
    return st


def _rejects(st, match):
    with pytest.raises(ValueError, match=match):
        _load(st)


def _broadcast(x, y):
    return (x * y).sum()


def _gather(x, idx):
    return (x[idx] * 2.0).sum()


X31, Y14 = np.arange(3.0).reshape(3, 1), np.arange(4.0).reshape(1, 4) + 1.0


# ---------------------------------------------------------------- valid tapes round-trip

FAMILIES = {
    "unary": (
        lambda x: (tp.tanh(tp.exp(x)) + tp.sqrt(x) + tp.relu(-x) + abs(x)).sum(),
        (np.arange(1.0, 4.0),),
    ),
    "broadcast": (lambda x, y: (x * y - y / (1.0 + x) + x**2).sum(), (X31, Y14)),
    "compare_where_clip": (
        lambda x, y: (tp.where(x > y, x, y * 2.0) + tp.clip(y, 0.5, x + 1.0)).sum(),
        (X31, Y14),
    ),
    "reductions": (
        lambda x: (
            x.sum(axis=0).max()
            + x.max(axis=1, keepdims=True).sum()
            + x.min()
            + x.prod(axis=0).sum()
        ),
        (np.arange(12.0).reshape(3, 4) / 7.0 + 0.5,),
    ),
    "movement": (
        lambda x: (
            (x.T[::-1, 1:] ** 2).sum()
            + tp.concatenate([x[0], x[:, 1]]).sum()
            + tp.broadcast_to(x[0], (2, 4)).sum()
            + tp.stack([x[0], x[1]], axis=1)[::2].sum()
        ),
        (np.arange(12.0).reshape(3, 4),),
    ),
    "gather": (
        lambda x, idx: (x[idx] * x[idx[::-1]]).sum() + x[:, None][idx, 0].sum(),
        (np.arange(5.0), np.array([0, 4, -1, 2])),
    ),
    "mask": (lambda x: x[np.array([True, False, True])].sum(), (np.arange(3.0),)),
    "matmul": (
        lambda a, b, v, c: (a @ b).sum() + (a @ v).sum() + (v @ b).sum() + (c @ b).sum(),
        (np.ones((3, 4)), np.arange(8.0).reshape(4, 2), np.arange(4.0), np.ones((2, 3, 4))),
    ),
    "float32": (
        lambda x, y: (x * y + tp.sin(x)).sum(),
        (X31.astype(np.float32), Y14.astype(np.float32)),
    ),
}


def _guarded(x):
    if x.sum() > 0:  # truth-value guard
        x = x * 2.0
    return x.sum() * float(x[0])  # value guard


FAMILIES["guard"] = (_guarded, (np.arange(1.0, 4.0),))


def _factor(x, b):
    import tape.frontend.linalg as la

    k = x @ x.T + 3.0 * tp.eye(3)
    low = la.cholesky(k)
    return (la.solve_triangular(low, b, lower=True).sum() + la.solve(k, b).sum()
            + la.slogdet(k)[1])  # fmt: skip


FAMILIES["factor"] = (_factor, (np.arange(9.0).reshape(3, 3) / 9.0, np.arange(1.0, 4.0)))


def _spectral(x):
    import tape.frontend.linalg as la

    w, v = la.eigh(x)
    q, r = la.qr(x)
    return (v * w).sum() + (q[:, :2] * r[0, :2]).sum() + r[2, 2]


SPECTRAL_X = np.array([[2.0, 1.0, 0.5], [0.3, -1.0, 0.4], [0.1, 0.2, 3.0]])
FAMILIES["spectral"] = (_spectral, (SPECTRAL_X,))
FAMILIES["scan"] = (
    lambda x: tp.cumsum(x, 0).sum() + (tp.cumprod(x, axis=1) * 0.5).sum()
    + tp.topk(x, 2).values.sum() + (tp.max(x, dim=0).values * tp.argmin(x, axis=1).sum()).sum(),
    (np.arange(1.0, 13.0).reshape(3, 4),),
)  # fmt: skip
FAMILIES["scatter"] = (
    lambda x, v, i: (x.at[i].add(v) * x).sum() + x.at[np.array([0, 0])].add(v[:2]).sum(),
    (np.arange(4.0), np.arange(1.0, 4.0), np.array([3, 0, 3])),
)


# the structural ops the programs above use; every other one (a new op, whose cases live in
# tests/cases_*.py) is covered by a program of its own made from its first test case
HAND_COVERED = {
    "matmul", "copy", "take", "sum", "max", "min", "prod", "guard", "cumsum", "cumprod",
    "argsort", "argmax", "argmin", "solve", "cholesky", "slogdet", "eigh", "qr", "scatter_add",
}  # fmt: skip


def _summed(f):
    return lambda *a: f(*a).sum()


for _name, _cases in KERNEL_CASES.items():
    if _name not in HAND_COVERED:
        FAMILIES[f"op:{_name}"] = (_summed(_cases[0][0]), tuple(_cases[0][2]))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_valid_tapes_load_and_replay_the_same(name):
    fn, args = FAMILIES[name]
    t = tp.record(fn, *args)
    assert check_tape(t) is None
    g = t.gradient(*args)
    for t2 in (_load(_state(t)), pickle.loads(pickle.dumps(t))):
        g2 = t2.gradient(*args)
        for a, b in zip(
            g if isinstance(g, tuple) else (g,), g2 if isinstance(g2, tuple) else (g2,)
        ):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(t2.forward(*args), t.forward(*args))


def test_every_op_family_is_covered_by_the_round_trip():
    seen = set()
    for fn, args in FAMILIES.values():
        t = tp.record(fn, *args)
        seen |= {registry.OPS[c].kind if registry.OPS[c].kind != "structural" else registry.OPS[c].name
                 for c in t.entries[: t.n_entries, E_OP]}  # fmt: skip
    kernels = {op.name for op in registry.OPS if op.kind == "structural"}
    assert {"unary", "binary", "ternary"} | kernels <= seen


def test_unknown_meta_keys_are_ignored():
    t = tp.record(_broadcast, X31, Y14)
    t2 = _load(_meta(_state(t), from_the_future={"x": [1, 2]}))
    np.testing.assert_array_equal(t2.gradient(X31, Y14)[0], t.gradient(X31, Y14)[0])


# ---------------------------------------------------------------- the registry


def test_every_op_has_a_check():
    for op in registry.OPS:
        assert callable(op.check), f"op {op.name!r} has no check (see tape.registry.Op.check)"
    missing = [op.name for op in registry.OPS if op.kind == "structural" and op.check is None]
    assert not missing, f"structural ops without a validation check: {missing}"


def test_an_op_without_a_check_cannot_be_loaded(monkeypatch):
    t = tp.record(lambda x: x.sum(), np.ones(3))
    monkeypatch.setattr(registry.BY_NAME["sum"], "check", None)
    with pytest.raises(ValueError, match=r"entry 0 \(sum\): this op has no validation rule"):
        check_tape(t)


# ---------------------------------------------------------------- corrupted arrays


def test_input_index_out_of_range():
    st = _state(tp.record(_broadcast, X31, Y14))
    i = _entry(st, "mul")
    st["entries"][i, E_IN0 + 1] = 10**9
    _rejects(st, rf"entry {i} \(mul\): input 1 is buffer 1000000000, but the tape has \d+ buffers")


def test_unused_input_slot_and_output():
    st = _state(tp.record(_broadcast, X31, Y14))
    i = _entry(st, "sum")
    st["entries"][i, E_IN0 + 1] = 0
    _rejects(st, rf"entry {i} \(sum\): uses 1 input\(s\), but input slot 1 holds 0 instead of -1")
    st = _state(tp.record(_broadcast, X31, Y14))
    st["entries"][i, E_OUT] = -5
    _rejects(st, rf"entry {i} \(sum\): output is buffer -5")


def test_buffer_offset_outside_the_arena():
    st = _state(tp.record(_broadcast, X31, Y14))
    st["bufs"][1, B_OFF] = 10**12
    _rejects(st, r"buffer 1: offset 1000000000000 and size 4 do not lie inside the value arena")


def test_buffer_size_changed():
    st = _state(tp.record(_broadcast, X31, Y14))
    st["bufs"][0, B_SIZE] = 2
    _rejects(st, r"buffer 0: shape \(3, 1\) holds 3 elements, but its size is 2")


def test_shapes_in_meta_must_match_the_buffer_table():
    st = _state(tp.record(_broadcast, X31, Y14))
    shapes = json.loads(str(st["meta"]))["shapes"]
    shapes[0] = [1, 3]
    _rejects(
        _meta(st, shapes=shapes),
        r"buffer 0: the shapes list says \(1, 3\), but the buffer table says \(3, 1\)",
    )


def test_alias_must_be_an_owner_containing_the_view():
    def f(x):
        return x.reshape(2, 2).sum(axis=0).sum() + x[1:3].sum()

    st = _state(tp.record(f, np.ones(4)))
    views = np.flatnonzero(st["bufs"][:, B_ALIAS] >= 0)
    b = int(views[0])
    bad = st["bufs"].copy()
    bad[b, B_ALIAS] = b
    _rejects(dict(st, bufs=bad), rf"buffer {b}: alias {b}, expected -1 or another buffer's index")
    bad = st["bufs"].copy()
    bad[b, B_ALIAS] = len(bad) - 1  # an intermediate that does not hold the view's memory
    _rejects(
        dict(st, bufs=bad), rf"buffer {b} .* views buffer {len(bad) - 1}, but does not lie inside"
    )


@pytest.mark.parametrize(
    "key, cut, match",
    [
        ("data", 3, r"buffer \d+: offset \d+ and size \d+ do not lie inside the value arena of 3"),
        ("ipool", 2, r"outside ipool|ipool holds 2 ints"),
        ("bufs", 2, r"the shapes list has \d+ entries, but the tape has 2 buffers"),
        ("entries", "flat", r"entries has shape \(\d+,\), expected \(n, 6\)"),
    ],
)
def test_truncated_arrays(key, cut, match):
    st = _state(tp.record(_broadcast, X31, Y14))
    st[key] = st[key].ravel()[:-1] if cut == "flat" else st[key][:cut]
    _rejects(st, match)


def test_bad_op_codes():
    st = _state(tp.record(_broadcast, X31, Y14))
    st["entries"][0, E_OP] = 999
    _rejects(st, r"entries use op code 999, which the file's op_names .* does not list")
    st = _state(tp.record(_broadcast, X31, Y14))
    names = json.loads(str(st["meta"]))["op_names"]
    names[str(int(st["entries"][0, E_OP]))] = "no_such_op"
    _rejects(_meta(st, op_names=names), r"the saved tape uses op 'no_such_op'")
    t = tp.record(_broadcast, X31, Y14)
    t.entries[0, E_OP] = len(registry.OPS)
    with pytest.raises(
        ValueError, match=rf"entry 0: op code {len(registry.OPS)}, expected 0\.\.\d+"
    ):
        check_tape(t)


def test_renamed_op_with_another_arity_is_rejected():
    st = _state(tp.record(_broadcast, X31, Y14))
    meta = json.loads(str(st["meta"]))
    code = next(c for c, n in meta["op_names"].items() if n == "mul")
    meta["op_names"][code] = "sum"  # a reduction: one input, where mul has two
    st["meta"] = np.array(json.dumps(meta))
    _rejects(st, r"\(sum\): uses 1 input\(s\), but input slot 1 holds \d+ instead of -1")


# ---------------------------------------------------------------- attribute blocks


def test_binary_broadcast_block():
    st = _state(tp.record(_broadcast, X31, Y14))
    i = _entry(st, "mul")  # block [GENERAL, 2, 3, 4, strides_0 (1, 0), strides_1 (0, 1)]
    _rejects(
        _attr(st, i, 2 + 2, 5),
        rf"entry {i} \(mul\): reaches offsets 0\.\.10 of input 0 \(buffer 0\), which has 3 "
        "elements",
    )
    st = _state(tp.record(_broadcast, X31, Y14))
    _rejects(
        _attr(st, i, 2 + 5, -1), r"input 1 has broadcast strides \(0, -1\); strides must be >= 0"
    )
    st = _state(tp.record(_broadcast, X31, Y14))
    _rejects(_attr(st, i, 0, 0), r"broadcast mode 0, expected GENERAL \(3\)")
    st = _state(tp.record(_broadcast, X31, Y14))
    _rejects(_attr(st, i, 2, 5), r"broadcast shape \(5, 4\) has 20 elements, but the output has 12")
    st = _state(tp.record(_broadcast, X31, Y14))
    _rejects(_attr(st, i, 1, 10**6), r"the number of broadcast axes is 1000000, expected 1\.\.64")
    st = _state(tp.record(_broadcast, X31, Y14))
    _rejects(
        _attr(st, i, 1, 60),
        r"needs 60 extents and 2 x 60 strides at ipool\[\d+:\d+\], but ipool holds",
    )


def test_a_rows_or_columns_block_must_walk_it_as_such():
    # (3, 4) * (4,): the kernels of the ROW class read input 1 run after run; a block that
    # walks it otherwise (here down the columns) stays inside the buffer but is refused
    st = _state(tp.record(_broadcast, np.ones((3, 4)), np.arange(4.0)))
    i = _entry(st, "mul")  # [GENERAL, 2, 3, 4, strides_0 (4, 1), strides_1 (0, 1)]
    _rejects(
        _attr(_attr(st, i, 2 + 4, 1), i, 2 + 5, 0),
        r"input 1 is a row of the output \(\(4,\) of \(3, 4\)\) but has broadcast strides "
        r"\(1, 0\)",
    )
    _load(_state(tp.record(_broadcast, np.ones((3, 4)), np.arange(4.0))))  # as recorded: fine
    # (3, 4) * (3, 1): a column, one value per run; a block that reads its first value for
    # every run
    st = _state(tp.record(_broadcast, np.ones((3, 4)), np.arange(3.0).reshape(3, 1)))
    i = _entry(st, "mul")  # [GENERAL, 2, 3, 4, strides_0 (4, 1), strides_1 (1, 0)]
    _rejects(
        _attr(st, i, 2 + 4, 0),
        r"input 1 is a column of the output \(\(3, 1\) of \(3, 4\)\) but has broadcast "
        r"strides \(0, 0\)",
    )
    _load(_state(tp.record(_broadcast, np.ones((3, 4)), np.arange(3.0).reshape(3, 1))))


def test_empty_broadcast_cannot_loop_without_bound():
    x, y = np.zeros((3, 0)), np.ones((3, 1))
    st = _state(tp.record(_broadcast, x, y))
    i = _entry(st, "mul")  # block [GENERAL, 2, 3, 0, ...]: rows of length 0
    _rejects(
        _attr(st, i, 2, 2**40),
        r"the broadcast shape \(1099511627776, 0\) spans 1099511627776 positions",
    )


def test_empty_rows_still_touch_their_start():
    # (3, 0) * (3, 1): rows of length 0, but the binary kernels read the stride-0 operand's
    # row start (and the reverse writes its adjoint there) before looping over the row
    st = _state(tp.record(_broadcast, np.zeros((3, 0)), np.ones((3, 1))))
    i = _entry(st, "mul")  # [GENERAL, 2, 3, 0, strides_0 (0, 1), strides_1 (1, 0)]
    _rejects(_attr(st, i, 6, 5), rf"entry {i} \(mul\): reaches offsets 0\.\.10 of input 1")
    # the same for sum's rows: (3, 0) summed over axis 1 adds an empty row into each output
    st = _state(tp.record(lambda x: x.sum(axis=1).sum(), np.zeros((3, 0))))
    i = _entry(st, "sum")  # [2, 3, 0, out_strides (1, 0)]
    _rejects(_attr(st, i, 3, 5), rf"entry {i} \(sum\): reaches offsets 0\.\.10 of the output")


def test_ternary_broadcast_block():
    st = _state(tp.record(lambda x, y: tp.where(x > 1.0, x, y).sum(), X31, Y14))
    i = _entry(st, "where")  # [GENERAL, 2, 3, 4, s0, s1, s2]
    _rejects(
        _attr(st, i, 2 + 2 * 2, 7), rf"entry {i} \(where\): reaches offsets 0\.\.14 of input 1"
    )
    st = _state(tp.record(lambda x: tp.where(x > 1.0, x, x).sum(), np.ones(4)))
    i = _entry(st, "where")  # SAME
    st["bufs"] = st["bufs"].copy()
    _rejects(_attr(st, i, 0, 2), r"broadcast mode 2, expected SAME \(0\) or GENERAL \(3\)")


def test_unary_sizes():
    st = _state(tp.record(lambda x: tp.exp(x).sum(), np.ones(4)))
    i = _entry(st, "exp")
    st["entries"][i, E_IN0] = st["entries"][_entry(st, "sum"), E_OUT]  # a 0-d buffer
    _rejects(st, rf"entry {i} \(exp\): input 0 \(buffer \d+\) has 1 elements, expected 4")


@pytest.mark.parametrize(
    "name, j, value, match",
    [
        ("sum", 0, 65, r"the number of axes is 65, expected 0\.\.64"),
        ("sum", 1, 4, r"the input \(buffer \d+\) has 12 elements, expected 16"),
        ("sum", 1, -4, r"the input shape \(-4, 4\) has a negative extent at axis 0"),
        ("sum", 3, 2, r"reaches offsets 0\.\.4 of the output \(buffer \d+\), which has 3 elements"),
        ("max", 4, 9, r"reaches offsets 0\.\.27 of the output"),
        ("prod", 3, -1, r"reaches offsets -2\.\.0 of the output"),
    ],
)
def test_reduction_block(name, j, value, match):
    fn = {"sum": lambda x: x.sum(axis=1).sum(), "max": lambda x: x.max(axis=0).sum(),
          "prod": lambda x: x.prod(axis=1).sum()}[name]  # fmt: skip
    st = _state(tp.record(fn, np.ones((3, 4))))
    _rejects(_attr(st, _entry(st, name), j, value), rf"\({name}\): {match}")


@pytest.mark.parametrize(
    "j, value, match",
    [
        (3, -1, r"reaches offsets -1\.\.10 of the input"),  # in_off
        (4, 4, r"reaches offsets 0\.\.20 of the input"),  # in_strides[0]
        (6, 5, r"reaches offsets 5\.\.16 of the output"),  # out_off
        (7, 5, r"reaches offsets 0\.\.17 of the output"),  # out_strides[0]
        (1, 5, r"copies 15 elements into an output \(buffer \d+\) of 12"),
        (0, 99, r"the number of axes is 99"),
    ],
)
def test_copy_block(j, value, match):
    # transpose of (3, 4): block [2, 4, 3, 0, 1, 4, 0, 3, 1]
    st = _state(tp.record(lambda x: x.T.sum(axis=0).sum(), np.ones((3, 4))))
    _rejects(_attr(st, _entry(st, "copy"), j, value), rf"\(copy\): {match}")


def test_take_block():
    args = (np.arange(5.0), np.array([0, 4, -1]))
    st = _state(tp.record(_gather, *args))
    i = _entry(st, "take")  # [n_rows 5, inner 1]
    _rejects(
        _attr(st, i, 0, 6),
        rf"entry {i} \(take\): input 0 \(buffer \d+\) has 5 elements, expected 6",
    )
    st = _state(tp.record(_gather, *args))
    _rejects(_attr(st, i, 1, 2), r"\(take\): input 0 \(buffer \d+\) has 5 elements, expected 10")
    st = _state(tp.record(_gather, *args))
    _rejects(_attr(st, i, 0, -1), r"\(take\): n_rows is -1")


def test_take_indices_in_the_arena_are_checked():
    # a reverse sweep may run on the arena as loaded (backward before any forward)
    args = (np.arange(5.0), np.array([0, 4, -1]))
    st = _state(tp.record(_gather, *args))
    i = _entry(st, "take")
    idx = int(st["entries"][i, E_IN0 + 1])
    st["data"][int(st["bufs"][idx, B_OFF]) + 1] = 7.0
    _rejects(
        st, rf"entry {i} \(take\): index 7 \(element 1 of buffer {idx}\) is out of range for 5 rows"
    )
    st["data"][int(st["bufs"][idx, B_OFF]) + 1] = np.nan
    _rejects(st, r"\(take\): index nan")


def test_take_indices_must_not_be_rewritten_after_the_gather():
    # the reverse kernel reads the indices again without checking them
    def f(x, idx):
        return x[idx].sum() + (idx * 2.0).sum()

    st = _state(tp.record(f, np.arange(5.0), np.array([0, 4, 1])))
    i = _entry(st, "take")
    j = _entry(st, "mul")
    assert j > i
    st["entries"][j, E_OUT] = st["entries"][i, E_IN0 + 1]
    _rejects(st, rf"entry {i} \(take\): entry {j} writes the memory of its index buffer")


@pytest.mark.parametrize(
    "j, value, match",
    [
        (0, 2, r"the output \(buffer \d+\) has 6 elements, expected 12 \(2 matrices of 3 x 2\)"),
        (2, 5, r"reaches offsets 0\.\.14 of input 0"),
        (1, 4, r"the output \(buffer \d+\) has 6 elements, expected 8"),
        (5, -3, r"stride_b is -3"),
    ],
)
def test_matmul_block(j, value, match):
    st = _state(tp.record(lambda a, b: (a @ b).sum(), np.ones((3, 4)), np.ones((4, 2))))
    _rejects(_attr(st, _entry(st, "matmul"), j, value), rf"\(matmul\): {match}")


def test_batched_matmul_stride():
    st = _state(tp.record(lambda a, b: (a @ b).sum(), np.ones((2, 3, 4)), np.ones((4, 2))))
    i = _entry(st, "matmul")  # [2, 3, 4, 2, 12, 0]
    _rejects(
        _attr(st, i, 4, 13),
        r"\(matmul\): reaches offsets 0\.\.24 of input 0 \(buffer \d+\), which has 24",
    )


def test_guard_block():
    st = _state(tp.record(_guarded, np.arange(1.0, 4.0)))
    i = _entry(st, "guard")
    _rejects(_attr(st, i, 0, 7), rf"entry {i} \(guard\): guard mode 7, expected one of \[0, 1, 2\]")
    st = _state(tp.record(_guarded, np.arange(1.0, 4.0)))
    i = _entry(st, "guard", 1)  # value guard of x[0]: compares one element
    st["entries"][i, E_IN0] = 0  # the (3,) argument against a one-element record
    _rejects(
        st, r"\(guard\): input 1 \(the recorded value\) \(buffer \d+\) has 1 elements, expected 3"
    )


def test_attribute_position_out_of_range():
    st = _state(tp.record(_broadcast, X31, Y14))
    i = _entry(st, "sum")
    st["entries"][i, E_ATTR] = 2**62
    _rejects(
        st, rf"entry {i} \(sum\): attribute position 4611686018427387904, expected -1 or 0\.\.\d+"
    )
    st = _state(tp.record(_broadcast, X31, Y14))
    st["entries"][i, E_ATTR] = -1
    _rejects(st, r"\(sum\): has no attribute block \(attr = -1\)")


# ---------------------------------------------------------------- metadata and files


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(inputs="x"), r"meta\['inputs'\] must be a list of ints"),
        (dict(inputs=[0, 10**6]), r"inputs must be a list of buffer indices"),
        (dict(wrt=[5]), r"wrt must be a list of argument positions"),
        (dict(outputs=[-1]), r"outputs must be a list of buffer indices"),
        (dict(outputs=[True]), r"meta\['outputs'\] must be a list of ints"),
        (dict(input_names=["x"]), r"input_names must be a list of 2 strings"),
        (
            dict(input_dtypes=["<f8", "|O"]),
            r"meta\['input_dtypes'\] must be a list of numeric dtypes",
        ),
        (dict(dtype="<i8"), r"meta\['dtype'\] must be '<f8' or '<f4'"),
        (dict(dtype="garbage"), r"meta\['dtype'\]"),
        (dict(out_single=1), r"meta\['out_single'\] must be a bool"),
        (dict(shapes=[[3, 1]]), r"the shapes list has 1 entries, but the tape has \d+ buffers"),
        (dict(shapes=[[3.0, 1]]), r"meta\['shapes'\] must be a list of lists of ints"),
        (dict(op_names=[1]), r"meta\['op_names'\] must be an object"),
        (dict(version=99), r"unsupported tape format version 99"),
    ],
)
def test_bad_metadata(changes, match):
    _rejects(_meta(_state(tp.record(_broadcast, X31, Y14)), **changes), match)


def test_missing_keys_and_bad_json():
    st = _state(tp.record(_broadcast, X31, Y14))
    meta = json.loads(str(st["meta"]))
    del meta["outputs"]
    _rejects(dict(st, meta=np.array(json.dumps(meta))), r"the metadata lacks outputs")
    _rejects(dict(st, meta=np.array(str(st["meta"])[:-3])), r"the metadata is not JSON")
    _rejects(dict(st, meta=np.array("[1, 2]")), r"the metadata is a list, not an object")
    _rejects(dict(st, meta=np.array("[" * 100000 + "]" * 100000)), r"invalid tape file")
    del st["bufs"]
    _rejects(st, r"invalid tape file: missing bufs")


def test_wrong_array_dtypes():
    st = _state(tp.record(_broadcast, X31, Y14))
    _rejects(
        dict(st, entries=st["entries"].astype(np.float64)),
        r"entries has dtype float64, expected integers",
    )
    _rejects(dict(st, data=st["data"].astype(np.int64)), r"data has dtype int64, expected floats")


def test_not_a_tape_file(tmp_path):
    for blob in (b"", b"garbage" * 10, b"PK\x03\x04" + b"\x00" * 40):
        with pytest.raises(ValueError):
            tp.load(blob)
    path = tmp_path / "a.npy"
    np.save(path, np.ones(3))
    with pytest.raises(ValueError):
        tp.load(path)
    good = io.BytesIO()
    tp.record(_broadcast, X31, Y14).save(good)
    with pytest.raises(ValueError):
        tp.load(good.getvalue()[: len(good.getvalue()) // 2])
    with pytest.raises(FileNotFoundError):  # an I/O error stays one
        tp.load(tmp_path / "missing.npz")


def test_unpickling_a_corrupted_state():
    st = _state(tp.record(_broadcast, X31, Y14))
    st["entries"][0, E_IN0] = 10**9
    with pytest.raises(ValueError, match=r"input 0 is buffer 1000000000"):
        Tape.__new__(Tape).__setstate__(st)
    with pytest.raises(ValueError, match=r"expected a mapping"):
        Tape.__new__(Tape).__setstate__([1, 2])


# ---------------------------------------------------------------- fuzzing

FUZZ = Path(__file__).with_name("validate_fuzz.py")


def test_fuzzed_tape_files_are_rejected_or_replay_without_crashing():
    # A subprocess, so that a crash of the compiled sweeps fails this test, not pytest.
    n = 1000
    r = subprocess.run(
        [sys.executable, str(FUZZ), "--n", str(n), "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = "\n".join(r.stderr.splitlines()[-15:])
    assert r.returncode == 0, (
        f"fuzzing crashed or failed (exit status {r.returncode}); last lines:\n{tail}"
    )
    stats = json.loads(r.stdout.splitlines()[-1])
    print(
        f"\n{n} mutated tape files: {stats['rejected']} rejected, {stats['loaded']} loaded; "
        f"replays: {stats['replay_ok']} ran, raised: {stats['replay_raised']}"
    )
    assert not stats["errors"]
    assert stats["rejected"] + stats["loaded"] >= 0.95 * n
    assert stats["rejected"] > n // 4 and stats["loaded"] > n // 20
