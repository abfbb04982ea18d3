"""Scans and selections (``cumsum``, ``cumprod``, ``argsort``, ``sort``, ``topk``, ``argmax``,
``argmin``) beyond the registry-driven cases of ``tests/cases_scan.py``: ties and NaN order,
exact ``cumprod`` derivatives with zeros, replays recomputing positions on new data,
sparsity patterns, loaded tapes, errors, and the GPU kernels under the CUDA simulator.

The simulator must be on before numba is imported: :func:`test_scan_simulator_suite` runs
this file again in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``, where the simulator tests at
the bottom are collected instead of the CPU ones::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/test_scan_ops.py -v
"""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
from pathlib import Path

import _background
import numpy as np
import pytest

import tape as tp

ROOT = Path(__file__).resolve().parents[1]
IN_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None

TIES = np.array([[2.0, 1.0, 2.0, 1.0, 0.0, 2.0], [3.0, 3.0, -1.0, 3.0, -1.0, 0.5]])
NANS = np.array([1.0, np.nan, -2.0, np.nan, 0.5, 1.0])


def _cumprod_jacobian(x):
    """d y_j / d x_i = prod_{l <= j, l != i} x_l (i <= j), written out without division."""
    n = x.size
    J = np.zeros((n, n))
    for j in range(n):
        for i in range(j + 1):
            J[j, i] = np.prod(np.delete(x[: j + 1], i))
    return J


def _cumprod_sum_hessian(x, w):
    """Hessian of sum_j w_j y_j: sum over j >= max(i, k) of w_j prod_{l <= j, l != i, k}."""
    n = x.size
    H = np.zeros((n, n))
    for i in range(n):
        for k in range(n):
            if i != k:
                for j in range(max(i, k), n):
                    H[i, k] += w[j] * np.prod(np.delete(x[: j + 1], [i, k]))
    return H


if not IN_SIM:
    # ------------------------------------------------------------ ties and NaN

    @pytest.mark.parametrize("axis", [0, 1, -1, None])
    def test_argsort_is_stable_on_ties(axis):
        got = tp.argsort(TIES, axis=axis).numpy()
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.argsort(TIES, axis=axis, kind="stable"))
        np.testing.assert_array_equal(tp.sort(TIES, axis=axis).numpy(), np.sort(TIES, axis=axis))

    def test_descending_ties_keep_their_order_as_torch_stable():
        torch = pytest.importorskip("torch")
        for x in (TIES, NANS[None, :]):
            got = tp.argsort(x, axis=1, descending=True).numpy()
            want = torch.sort(torch.tensor(x), dim=1, descending=True, stable=True).indices
            np.testing.assert_array_equal(got, want.numpy())
            v, i = tp.tensor(x).sort(1, descending=True)
            np.testing.assert_array_equal(i.numpy(), want.numpy())
            np.testing.assert_array_equal(v.numpy(), np.take_along_axis(x, want.numpy(), 1))

    def test_nan_sorts_last_ascending_first_descending():
        np.testing.assert_array_equal(tp.argsort(NANS).numpy(), np.argsort(NANS, kind="stable"))
        np.testing.assert_array_equal(tp.sort(NANS).numpy(), np.sort(NANS))
        assert list(tp.argsort(NANS, descending=True).numpy()) == [1, 3, 0, 5, 4, 2]
        v, i = tp.topk(NANS, 3)
        assert list(i.numpy()) == [1, 3, 0] and np.isnan(v.numpy()[:2]).all()
        assert tp.argmax(NANS).item() == np.argmax(NANS) == 1
        assert tp.argmin(NANS).item() == np.argmin(NANS) == 1

    def test_topk_ties_lower_position_first_and_smallest():
        x = np.array([1.0, 3.0, 2.0, 3.0, 1.0])
        v, i = tp.topk(x, 3)
        assert list(i.numpy()) == [1, 3, 2] and list(v.numpy()) == [3.0, 3.0, 2.0]
        v, i = tp.topk(x, 2, largest=False)
        assert list(i.numpy()) == [0, 4] and list(v.numpy()) == [1.0, 1.0]
        assert tp.topk(x, 0).values.shape == (0,) and tp.topk(x, 5).indices.shape == (5,)
        r = tp.topk(tp.tensor(2.5), 1)
        assert r.values.shape == () and r.indices.item() == 0

    def test_sort_gradient_goes_to_the_selected_elements_even_on_ties():
        x = tp.tensor(TIES, requires_grad=True)
        w = np.arange(12.0).reshape(2, 6)
        (tp.sort(x, axis=1) * w).sum().backward()
        want = np.zeros_like(TIES)
        np.put_along_axis(want, np.argsort(TIES, axis=1, kind="stable"), w, axis=1)
        np.testing.assert_array_equal(x.grad.numpy(), want)
        y = tp.tensor(TIES, requires_grad=True)
        tp.topk(y, 2, dim=1).values.sum().backward()
        np.testing.assert_array_equal(y.grad.numpy(), [[1, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])

    def test_max_with_dim_follows_the_returned_position_inside_record():
        # on ties the gradient goes to the returned (first) position, eager and replayed
        f = lambda x: tp.max(x, dim=1).values.sum()  # noqa: E731
        t = tp.record(f, TIES)
        want = np.zeros_like(TIES)
        want[0, 0] = want[1, 0] = 1.0
        np.testing.assert_array_equal(t.gradient(TIES), want)
        x = tp.tensor(TIES, requires_grad=True)
        f(x).backward()
        np.testing.assert_array_equal(x.grad.numpy(), want)

    # ------------------------------------------------------------ cumprod with zeros

    @pytest.mark.parametrize(
        "x",
        [
            np.array([1.5, -0.5, 2.0, 0.7]),
            np.array([1.5, 0.0, 2.0, -0.7]),
            np.array([0.0, 2.0, 0.0, 1.5]),
            np.array([2.0, -1.0, 3.0, 0.0]),
        ],
    )
    def test_cumprod_derivatives_are_exact_with_zeros(x, rng):
        J = _cumprod_jacobian(x)
        t = tp.record(lambda a: tp.cumprod(a), x)
        np.testing.assert_array_equal(t.forward(x), np.cumprod(x))
        np.testing.assert_allclose(t.jacobian(x, mode="rev"), J, rtol=1e-14, atol=0)
        np.testing.assert_allclose(t.jacobian(x, mode="fwd"), J, rtol=1e-14, atol=0)
        xt = tp.tensor(x, requires_grad=True)
        w = rng.uniform(0.5, 1.5, x.size)
        (tp.cumprod(xt) * w).sum().backward()
        np.testing.assert_allclose(xt.grad.numpy(), w @ J, rtol=1e-14, atol=0)
        ts = tp.record(lambda a: (tp.cumprod(a) * w).sum(), x)
        np.testing.assert_allclose(ts.hessian(x), _cumprod_sum_hessian(x, w), rtol=1e-13,
                                   atol=1e-15)  # fmt: skip
        v = rng.standard_normal(x.size)
        np.testing.assert_allclose(ts.hvp(x, v=v), _cumprod_sum_hessian(x, w) @ v, rtol=1e-13,
                                   atol=1e-14)  # fmt: skip

    def test_cumprod_long_rows_take_the_linear_time_tangent(rng):
        # rows longer than EXACT_ROW: the tangent by the product rule, step by step
        from tape.ops.scan import EXACT_ROW

        x = rng.uniform(0.8, 1.25, EXACT_ROW + 16)
        x[[3, 40, 41]] = 0.0
        J = _cumprod_jacobian(x)
        t = tp.record(lambda a: tp.cumprod(a), x)
        np.testing.assert_allclose(t.jacobian(x, mode="fwd"), J, rtol=1e-13, atol=0)
        np.testing.assert_allclose(t.jacobian(x, mode="rev"), J, rtol=1e-13, atol=0)

    def test_cumprod_zeros_along_an_inner_axis():
        x = np.array([[1.0, 2.0], [0.0, 3.0], [4.0, 0.0], [5.0, 6.0]])
        xt = tp.tensor(x, requires_grad=True)
        tp.cumprod(xt, axis=0).sum().backward()
        want = np.stack([_cumprod_jacobian(x[:, k]).sum(0) for k in range(2)], axis=1)
        np.testing.assert_array_equal(xt.grad.numpy(), want)

    # ------------------------------------------------------------ replay on new data

    REPLAYED = {
        "argsort": (lambda x: tp.argsort(x, axis=0), lambda x: np.argsort(x, 0, kind="stable")),
        "argsort_desc": (
            lambda x: tp.argsort(x, descending=True),
            lambda x: np.argsort(-x, -1, kind="stable"),
        ),
        "sort": (lambda x: tp.sort(x, axis=1), lambda x: np.sort(x, 1)),
        "sort_flat": (lambda x: tp.sort(x, axis=None) * 2.0, lambda x: np.sort(x, None) * 2.0),
        "topk_values": (lambda x: tp.topk(x, 2, dim=0).values, lambda x: -np.sort(-x, 0)[:2]),
        "topk_indices": (
            lambda x: tp.topk(x, 2, largest=False).indices,
            lambda x: np.argsort(x, 1, kind="stable")[:, :2],
        ),  # fmt: skip
        "argmax": (lambda x: tp.argmax(x, dim=1), lambda x: np.argmax(x, 1)),
        "argmax_flat": (lambda x: tp.argmax(x), lambda x: np.argmax(x)),
        "argmin_keep": (
            lambda x: tp.argmin(x, axis=0, keepdim=True),
            lambda x: np.argmin(x, 0, keepdims=True),
        ),
        "max_dim": (lambda x: tp.max(x, dim=0).values, lambda x: np.max(x, 0)),
        "max_dim_indices": (lambda x: tp.max(x, 1).indices, lambda x: np.argmax(x, 1)),
        "min_dim_keep": (
            lambda x: tp.min(x, 1, keepdim=True)[0],
            lambda x: np.min(x, 1, keepdims=True),
        ),
        "cumsum": (lambda x: tp.cumsum(x, 1), lambda x: np.cumsum(x, 1)),
        "cumprod": (lambda x: tp.cumprod(x), lambda x: np.cumprod(x)),
    }

    @pytest.mark.parametrize("name", sorted(REPLAYED))
    def test_replay_recomputes_positions_on_new_data(name, rng):
        f, ref = REPLAYED[name]
        x = rng.standard_normal((4, 5))
        t = tp.record(f, x)
        for _ in range(3):
            x2 = rng.standard_normal((4, 5))
            got = t.forward(x2)
            np.testing.assert_allclose(got, ref(x2), rtol=1e-14, atol=0)

    def test_replayed_sort_gradient_follows_the_new_order(rng):
        x = rng.standard_normal(6)
        w = np.linspace(1.0, 2.0, 6)
        t = tp.record(lambda a: (tp.sort(a) * w).sum(), x)
        x2 = rng.standard_normal(6)
        g = t.gradient(x2)
        want = np.zeros(6)
        want[np.argsort(x2, kind="stable")] = w
        np.testing.assert_array_equal(g, want)
        tc = tp.record(lambda a: (tp.sort(a) * w).sum(), x, compile=True)
        np.testing.assert_array_equal(tc.gradient(x2), want)

    def test_eager_argmax_is_unchanged(rng):
        x = tp.tensor(rng.standard_normal((3, 4)), requires_grad=True)
        i = tp.argmax(x * 2.0, dim=1)
        assert i._tape is None and i.dtype == np.int64 and not i.requires_grad
        np.testing.assert_array_equal(i.numpy(), np.argmax(x.numpy(), 1))
        assert x.argmin().item() == np.argmin(x.numpy())

    def test_index_results_are_int64_and_not_differentiable(rng):
        x = tp.tensor(rng.standard_normal((3, 4)), requires_grad=True)
        for r in (tp.argsort(x), x.argsort(0), tp.topk(x, 2).indices, x.sort()[1]):
            assert r.dtype == np.int64 and not r.requires_grad
        assert tp.sort(x).requires_grad and tp.topk(x, 1).values.requires_grad

    def test_dtypes_follow_numpy():
        assert tp.cumsum(np.arange(4)).dtype == np.int64
        np.testing.assert_array_equal(tp.cumsum(np.arange(4)).numpy(), [0, 1, 3, 6])
        assert tp.cumprod(np.array([True, True, False])).dtype == np.int64
        x32 = tp.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
        y = tp.cumsum(x32)
        assert y.dtype == np.float32
        y.sum().backward()
        np.testing.assert_array_equal(x32.grad.numpy(), [3.0, 2.0, 1.0])
        assert tp.sort(x32).dtype == np.float32

    def test_tensor_methods_follow_pytorch(rng):
        x = rng.standard_normal((3, 4))
        xt = tp.tensor(x)
        v, i = xt.sort()
        np.testing.assert_array_equal(v.numpy(), np.sort(x, -1))
        np.testing.assert_array_equal(i.numpy(), np.argsort(x, -1, kind="stable"))
        v, i = xt.sort(0, True)
        np.testing.assert_array_equal(i.numpy(), np.argsort(-x, 0, kind="stable"))
        np.testing.assert_array_equal(xt.argsort(dim=0, descending=True).numpy(), i.numpy())
        np.testing.assert_allclose(xt.cumsum(0).numpy(), np.cumsum(x, 0), rtol=1e-15)
        np.testing.assert_allclose(xt.cumprod(dim=1).numpy(), np.cumprod(x, 1), rtol=1e-15)
        np.testing.assert_array_equal(xt.topk(2).values.numpy(), -np.sort(-x, -1)[:, :2])
        assert isinstance(tp.sort(xt), tp.Tensor)  # NumPy's function: the values only

    def test_against_torch(rng):
        torch = pytest.importorskip("torch")
        x = rng.standard_normal((3, 5))
        tx = torch.tensor(x, requires_grad=True)
        w = rng.standard_normal((3, 2))
        tv, ti = torch.topk(tx, 2, dim=1)
        (tv * torch.tensor(w)).sum().backward()
        xt = tp.tensor(x, requires_grad=True)
        v, i = tp.topk(xt, 2, dim=1)
        (v * w).sum().backward()
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
        np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-15)
        tx.grad = None
        (torch.cumprod(tx, 1) * torch.tensor(x)).sum().backward()
        xt.grad = None
        (tp.cumprod(xt, dim=1) * x).sum().backward()
        np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12)

    # ------------------------------------------------------------ sparsity

    def test_cumsum_jacobian_pattern_is_lower_triangular_per_row(rng):
        x = rng.standard_normal((2, 5, 3))
        t = tp.record(lambda a: tp.cumsum(a, axis=1), x)
        J = t.sparsity(x).jacobian.toarray()
        idx = np.arange(x.size).reshape(x.shape)
        want = np.zeros((x.size, x.size), bool)
        for o in range(2):
            for q in range(3):
                for j in range(5):
                    want[idx[o, j, q], idx[o, : j + 1, q]] = True
        np.testing.assert_array_equal(J, want)
        np.testing.assert_array_equal(J, t.jacobian(x).reshape(x.size, x.size) != 0)

    def test_cumprod_hessian_pattern_covers_each_row(rng):
        x = rng.uniform(0.5, 1.5, (3, 4))
        t = tp.record(lambda a: tp.cumprod(a, axis=1).sum(), x)
        s = t.sparsity(x)
        H = t.hessian(x).reshape(12, 12)
        assert np.all(s.hessian.toarray()[H != 0])
        rows = np.arange(12) // 4
        np.testing.assert_array_equal(s.hessian.toarray(), rows[:, None] == rows[None, :])
        np.testing.assert_allclose(t.hessian(x, sparse=True).toarray(), H, rtol=1e-13)

    def test_sort_sparsity_is_the_permutation(rng):
        x = rng.standard_normal(5)
        t = tp.record(lambda a: tp.sort(a), x)
        J = t.sparsity(x).jacobian.toarray()
        want = np.zeros((5, 5), bool)
        want[np.arange(5), np.argsort(x, kind="stable")] = True
        np.testing.assert_array_equal(J, want)

    # ------------------------------------------------------------ loaded tapes

    def _all_ops(x):
        return (
            tp.cumsum(x, 0).sum()
            + (tp.cumprod(x, axis=1) * 0.5).sum()
            + tp.topk(x, 2).values.sum()
            + (tp.max(x, dim=0).values * tp.argmin(x, axis=1).sum()).sum()
        )

    def test_tape_with_scan_ops_saves_loads_and_validates(rng):
        from tape.ops.validate import check_tape

        x = rng.standard_normal((3, 4))
        t = tp.record(_all_ops, x)
        ops = {tp.registry.OPS[c].name for c in t.entries[: t.n_entries, 0]}
        assert {"cumsum", "cumprod", "argsort", "argmax", "argmin"} <= ops
        assert check_tape(t) is None
        buf = io.BytesIO()
        t.save(buf)
        x2 = rng.standard_normal((3, 4))
        for t2 in (tp.load(buf.getvalue()), pickle.loads(pickle.dumps(t))):
            np.testing.assert_array_equal(t2.gradient(x2), t.gradient(x2))
            np.testing.assert_array_equal(t2.forward(x2), t.forward(x2))

    @pytest.mark.parametrize(
        "op,k,value,says",
        [
            ("cumsum", 1, 4, "input 0"),
            ("cumprod", 0, -1, "negative extent"),
            ("argsort", 3, 2, "flag 2"),
            ("argmax", 2, 9, "input 0"),
            ("argmin", 1, 0, "empty rows|input 0"),
        ],
    )
    def test_corrupted_scan_blocks_are_rejected(op, k, value, says, rng):
        from tape.layout.columns import E_ATTR
        from tape.ops.validate import check_tape

        # one scan entry per tape: attribute blocks are interned, so another entry with the
        # same block would see the corruption first
        fn = {
            "cumsum": lambda x: tp.cumsum(x, 1),
            "cumprod": lambda x: tp.cumprod(x, 0),
            "argsort": lambda x: tp.argsort(x) * 1.0,
            "argmax": lambda x: tp.argmax(x, 1) * 1.0,
            "argmin": lambda x: tp.argmin(x, 0) * 1.0,
        }[op]
        t = tp.record(fn, rng.standard_normal((3, 5)))
        code = tp.registry.BY_NAME[op].code
        (i,) = np.flatnonzero(t.entries[: t.n_entries, 0] == code)
        t.ipool[int(t.entries[i, E_ATTR]) + k] = value
        with pytest.raises(ValueError, match=rf"entry {i} \({op}\): .*({says})"):
            check_tape(t)

    # ------------------------------------------------------------ errors

    @pytest.mark.parametrize(
        "call,exc,says",
        [
            (
                lambda x: tp.cumsum(x, axis=2),
                ValueError,
                r"cumsum: axis 2 is out of range .*\(3, 4\)",
            ),
            (lambda x: tp.cumprod(x, dim=-3), ValueError, r"cumprod: axis -3 is out of range"),
            (lambda x: tp.cumsum(x, axis=1.0), TypeError, "cumsum: axis must be an int"),
            (lambda x: tp.argsort(x, axis=5), ValueError, r"argsort: axis 5 .*\(3, 4\)"),
            (lambda x: tp.argsort(x, kind="bogo"), ValueError, "argsort: kind='bogo'"),
            (lambda x: tp.sort(x, 2), ValueError, r"sort: axis 2 .*\(3, 4\)"),
            (lambda x: tp.sort(x, axis=0, dim=1), TypeError, "sort: pass axis= or dim="),
            (
                lambda x: tp.topk(x, 5),
                ValueError,
                r"topk: k=5 is out of range for axis 1 \(size 4\) .*\(3, 4\)",
            ),
            (
                lambda x: tp.topk(x, -1, dim=0),
                ValueError,
                r"topk: k=-1 is out of range for axis 0 \(size 3\)",
            ),
            (lambda x: tp.topk(x, 1.5), TypeError, "topk: k must be an int"),
            (lambda x: tp.topk(x, True), TypeError, "topk: k must be an int"),
            (lambda x: tp.topk(x, 1, dim=2), ValueError, r"topk: axis 2 is out of range"),
            (lambda x: x.sort(3), ValueError, r"sort: axis 3 is out of range"),
        ],
    )
    def test_bad_arguments_raise_clearly(call, exc, says, rng):
        x = tp.tensor(rng.standard_normal((3, 4)))
        with pytest.raises(exc, match=says):
            call(x)
        with pytest.raises(exc, match=says):
            tp.record(call, x.numpy())

    def test_empty_axes(rng):
        with pytest.raises(ValueError, match=r"argmax: .*empty axis .*\(2, 0\)"):
            tp.record(lambda x: tp.argmax(x, dim=1) * 1.0, np.zeros((2, 0)))
        assert tp.cumsum(np.zeros((2, 0)), axis=1).shape == (2, 0)
        assert tp.sort(np.zeros((0, 3)), axis=0).shape == (0, 3)
        x = tp.tensor(np.zeros((2, 0)), requires_grad=True)
        tp.cumprod(x, axis=1).sum().backward()
        assert x.grad.shape == (2, 0)

    # ------------------------------------------------------------ the simulator, from here

    # Runs on the second core while the main process works (tests/_background.py).
    _background.register_simulator_suite("scan_sim", __file__, "test_scan_simulator_suite")

    @pytest.mark.skipif(not HAS_NUMBA_CUDA, reason="numba-cuda is not installed")
    def test_scan_simulator_suite():
        """The simulator tests below, in a subprocess with the simulator on."""
        r = _background.result("scan_sim")
        tail = (r.stdout[-6000:] + "\n" + r.stderr[-3000:]).strip()
        assert r.returncode == 0, f"simulator tests failed:\n{tail}"

else:
    # ------------------------------------------------------------ under the simulator
    from tape.gpu import CudaTape, gradient_batch

    THREADS = 8

    def check(t, args, rtol=1e-12, atol=1e-12, **kw):
        ct = CudaTape(t, threads=THREADS, **kw)
        got = ct.forward(*args)
        want = t.forward(*args)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        if t.wrt:
            g = ct.gradient(*args)
            w = t.gradient(*args)
            for a, b in zip(
                g if isinstance(g, tuple) else (g,), w if isinstance(w, tuple) else (w,)
            ):
                np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
        return ct

    def _scan_program(x, w):
        return (
            (tp.cumsum(x, 0) * w).sum()
            + (tp.cumprod(x, axis=1) * w).sum()
            + (tp.cumsum(x) ** 2).sum()
            + (tp.sort(x, axis=1) * w).sum()
            + (tp.topk(x, 2, dim=0, largest=False).values ** 2).sum()
            + (tp.max(x, dim=1).values * tp.argmin(x, axis=0).sum()).sum()
        )

    @pytest.mark.parametrize("plan", [{}, {"cooperative": False, "blocks": 2}])
    def test_scan_ops_match_cpu_on_device(plan, rng):
        x = rng.standard_normal((3, 4))
        x[1, 2] = 0.0  # a zero in cumprod's rows and columns
        x[2, 1] = x[2, 3]  # a tie for argsort
        w = rng.uniform(0.5, 1.5, (3, 4))
        t = tp.record(lambda a: _scan_program(a, w), x)
        ct = check(t, [x], **plan)
        x2 = rng.standard_normal((3, 4))
        np.testing.assert_allclose(ct.gradient(x2), t.gradient(x2), rtol=1e-12, atol=1e-12)

    def test_index_outputs_match_cpu_on_device(rng):
        x = np.array([[2.0, 1.0, 2.0, np.nan, 0.0], [3.0, 3.0, -1.0, 3.0, -1.0]])
        f = lambda a: (  # noqa: E731
            tp.argsort(a, axis=1) * 1.0,
            tp.argsort(a, axis=0, descending=True) * 1.0,
            tp.argsort(a, axis=1, descending=True) * 1.0,
            tp.argmax(a, dim=1) * 1.0,
            tp.argmin(a, dim=0) * 1.0,
            tp.argmax(a) * 1.0,
        )
        t = tp.record(f, x)
        ct = CudaTape(t, threads=THREADS)
        for got, want in zip(ct.forward(x), t.forward(x)):
            np.testing.assert_array_equal(got, want)
        x2 = rng.standard_normal((2, 5))
        for got, want in zip(ct.forward(x2), t.forward(x2)):
            np.testing.assert_array_equal(got, want)

    def test_scan_ops_in_gradient_batch(rng):
        w = rng.uniform(0.5, 1.5, (2, 3))
        t = tp.record(lambda a: _scan_program(a, w), rng.standard_normal((2, 3)))
        X = rng.standard_normal((5, 2, 3))
        X[1, 0, 1] = 0.0
        v, g = gradient_batch(t, X, threads=THREADS)
        for b in range(5):
            np.testing.assert_allclose(g[b], t.gradient(X[b]), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(v[b], t.forward(X[b]), rtol=1e-12)

    def test_float32_scan_on_device(rng):
        x = rng.standard_normal((3, 4)).astype(np.float32)
        t = tp.record(lambda a: (tp.cumsum(a, 1) * tp.sort(a, 0)).sum() + tp.cumprod(a).sum(), x)
        check(t, [x], rtol=1e-5, atol=1e-5)

    def _lanes_cases():
        """Every case of every op whose GPU kernel is built from its element loops (the
        record's ``lanes``): such an op has no GPU test of its own."""
        import cases_factor
        import cases_scan
        import cases_scatter
        import cases_spectral

        from tape.ops.registry import OPS

        merged = {}
        for cases in (cases_scan.CASES, cases_factor.CASES, cases_scatter.CASES,
                      cases_spectral.CASES):  # fmt: skip
            for name, lst in cases.items():
                merged.setdefault(name, []).extend(lst)
        out = [(op.name, k, c) for op in OPS if op.lanes for k, c in enumerate(merged[op.name])]
        assert out, "no op with element loops (lanes)"
        return out

    LANES_CASES = _lanes_cases()

    @pytest.mark.parametrize(
        "name,k,case", LANES_CASES, ids=[f"{n}-{k}" for n, k, _ in LANES_CASES]
    )
    def test_lanes_ops_match_cpu_on_device(name, k, case, rng):
        fn, _, xs = case
        w = rng.uniform(0.5, 1.5, fn(*[tp.tensor(x) for x in xs]).shape)
        t = tp.record(lambda *a: (fn(*a) * w).sum(), *xs)
        check(t, xs)
        # other data, the same tape: the values and adjoints of the device follow the CPU's
        x2 = [x + rng.uniform(-0.25, 0.25, np.shape(x)) for x in xs]
        check(t, x2)
