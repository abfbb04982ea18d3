"""Trust: the cases where tape used to return a silently wrong number, each checked against an
independent reference (NumPy formulas, finite differences, a fresh recording)."""

import io
import pickle
import threading
import warnings

import numpy as np
import pytest
from numba import njit

import tape as tp

# ---------------------------------------------------------------- 1. stale leaves


def test_inplace_update_of_a_leaf_is_seen_by_the_next_expression():
    w = tp.tensor([1.0, 2.0], requires_grad=True)
    loss_a = (w * w).sum()  # kept alive, never backpropagated
    with tp.no_grad():
        w -= 0.5 * tp.tensor([2.0, 4.0])
    loss_b = (w * w).sum()
    loss_b.backward()
    assert loss_b.item() == 0.0
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 0.0])
    assert loss_a.item() == 5.0  # the old graph keeps the value it computed


@pytest.mark.parametrize(
    "write", ["zero_", "data_inplace", "data_assign", "copy_", "fill_", "view"]
)
def test_every_inplace_write_bumps_the_version(write):
    w = tp.tensor([1.0, 2.0, 3.0], requires_grad=True)
    keep = (w * 3).sum()  # noqa: F841  (an open graph holding a copy of w)
    with tp.no_grad():
        if write == "zero_":
            w.zero_()
        elif write == "data_inplace":
            w.data -= tp.tensor([1.0, 2.0, 3.0])
        elif write == "data_assign":
            w.data = tp.tensor([0.0, 0.0, 0.0])
        elif write == "copy_":
            w.copy_(np.zeros(3))
        elif write == "fill_":
            w.fill_(0.0)
        else:
            w.reshape(3, 1).zero_()  # a view shares the version counter
    y = (w * w * w).sum()
    y.backward()
    assert y.item() == 0.0
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 0.0, 0.0])


def test_old_graph_backward_gives_the_gradient_of_what_it_computed():
    w = tp.tensor([1.0, 2.0], requires_grad=True)
    loss_a = (w * w).sum()
    with tp.no_grad():
        w += 1.0
    loss_b = (w * w).sum()
    loss_a.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])  # at the old value
    w.grad = None
    loss_b.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 6.0])


# ---------------------------------------------------------------- 2. threads


def _rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def _rosen_grad(x):
    g = np.zeros_like(x)
    d = x[1:] - x[:-1] ** 2
    g[:-1] += -400 * x[:-1] * d - 2 * (1 - x[:-1])
    g[1:] += 200 * d
    return g


def _hammer(n_threads, n_calls, work):
    errors = []

    def run(k):
        try:
            for j in range(n_calls):
                work(k, j)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def test_threaded_replays_are_bit_identical_to_serial():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((16, 50))
    t = tp.record(_rosen, X[0], compile=False)  # one tier throughout: bit-identical results
    serial = [t.value_and_grad(x) for x in X]
    for (_v, g), x in zip(serial, X):
        np.testing.assert_allclose(g, _rosen_grad(x), rtol=1e-12)
    bad = []

    def work(k, j):
        i = (k * 7 + j) % len(X)
        v, g = t.value_and_grad(X[i])
        t.forward(X[(i + 1) % len(X)])
        t.zero_grad()
        t.backward()
        g2 = t.grads[0]
        if v != serial[i][0] or not np.array_equal(g, serial[i][1]):
            bad.append(i)
        if not np.array_equal(g2, serial[(i + 1) % len(X)][1]):
            bad.append(i + 1000)

    _hammer(4, 1000, work)
    assert not bad, f"{len(bad)} of 4000 threaded replays differ from serial ones"


def test_threaded_batched_replays_are_bit_identical_to_serial():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((8, 20))
    t = tp.record(_rosen, X[0])
    v0, g0 = t.gradient_batch(X)
    bad = []

    def work(k, j):
        v, g = t.gradient_batch(X, n_threads=1)
        if not (np.array_equal(v, v0) and np.array_equal(g, g0)):
            bad.append(j)

    _hammer(4, 1000, work)
    assert not bad


def test_workspace_for_njit_embedding_is_private():
    t = tp.record(_rosen, np.zeros(5))
    ka = t.workspace()
    off, n = t.input_slice(0)
    x = np.linspace(-1, 1, 5)

    @njit
    def grad_at(ka, off, x):
        ka.data[off : off + x.shape[0]] = x
        status = tp.sweeps.forward_backward(ka.entries, ka.bufs, ka.ipool, ka.data, ka.grad,
                                            ka.n_entries, ka.n_bufs, ka.roots, ka.seeds, True)  # fmt: skip
        return status, ka.grad[off : off + x.shape[0]].copy()

    status, g = grad_at(ka, off, x)
    assert status == -1
    np.testing.assert_allclose(g, _rosen_grad(x), rtol=1e-12)
    assert t.workspace().data is not ka.data
    assert not t.kernel_args().grad.any()  # the default workspace was not touched


# ---------------------------------------------------------------- 3. guards


def _branchy(x):
    if x.sum() > 0:
        return (x * x).sum()
    return (x * x * x).sum()


def _while(y):
    while y.sum() < 10:
        y = y * 2
    return (y * y).sum()


def _escape_float(x):
    c = float(x[0])  # a Python float: frozen, with no gradient through it
    return (x * c).sum()


def _escape_item(x):
    return (x * (x[0].item() > 0)).sum()


def _escape_array(x):
    a = np.asarray(x)  # a NumPy array: a constant of the tape
    return (x * a).sum()


def _fresh(fn, x):
    """Value and gradient from a recording made at ``x`` itself."""
    return tp.record(fn, x).value_and_grad(x)


@pytest.mark.parametrize("fn", [_branchy, _while, _escape_float, _escape_item, _escape_array])
def test_guards_retrace_to_the_right_path(fn):
    x0 = np.array([1.0, 2.0, 3.0])
    t = tp.record(fn, x0)
    for x in [
        np.array([-1.0, -2.0, 0.5]),
        np.array([0.1, 0.2, 0.3]),
        x0,
        np.array([-3.0, 1.0, 1.0]),
    ]:
        v, g = t.value_and_grad(x)
        fv, fg = _fresh(fn, x)
        assert v == fv
        np.testing.assert_array_equal(g, fg)
    assert t.retraces >= 1


def test_guard_outcome_cache_does_not_retrace_alternating_paths():
    t = tp.record(_branchy, np.ones(3))
    for _ in range(10):
        np.testing.assert_allclose(t.gradient(np.ones(3)), 2 * np.ones(3))
        np.testing.assert_allclose(t.gradient(-np.ones(3)), 3 * np.ones(3))
    assert t.retraces == 1


def test_guard_raise_names_guard_op_outcomes_and_line():
    t = tp.record(_branchy, np.ones(3), on_change="raise")
    with pytest.raises(tp.GuardError) as e:
        t.gradient(-np.ones(3))
    msg = str(e.value)
    assert "guard at entry" in msg and "greater" in msg and "recorded 1, now 0" in msg
    assert "test_trust.py:" in msg and e.value.source.startswith("test_trust.py:")
    t.gradient(np.ones(3))  # the recorded path still replays


def test_guard_warn_warns_once_and_stays_on_the_recorded_path():
    t = tp.record(_branchy, np.ones(3), on_change="warn")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g1 = t.gradient(-np.ones(3))
        g2 = t.gradient(-2 * np.ones(3))
    assert sum(issubclass(x.category, tp.GuardWarning) for x in w) == 1
    np.testing.assert_allclose(g1, -2 * np.ones(3))  # d/dx sum(x*x), the recorded path
    np.testing.assert_allclose(g2, -4 * np.ones(3))


def test_loaded_tape_cannot_retrace_and_raises():
    t = tp.record(_branchy, np.ones(3))
    buf = io.BytesIO()
    t.save(buf)
    buf.seek(0)
    for u in [tp.load(buf), pickle.loads(pickle.dumps(t))]:
        np.testing.assert_allclose(u.gradient(np.ones(3)), 2 * np.ones(3))
        with pytest.raises(tp.GuardError, match="cannot retrace"):
            u.gradient(-np.ones(3))


def test_batched_replay_follows_each_instance_path():
    X = np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [0.5, 0.5, -2.0], [2.0, -1.0, 0.0]])
    t = tp.record(_branchy, X[0])
    vals, grads = t.gradient_batch(X)
    for b, x in enumerate(X):
        fv, fg = _fresh(_branchy, x)
        assert vals[b] == fv
        np.testing.assert_array_equal(grads[b], fg)
    strict = tp.record(_branchy, X[0], on_change="raise")
    with pytest.raises(tp.GuardError, match="instance 1"):
        strict.gradient_batch(X)


def test_print_lists_guards_with_their_source_lines():
    text = str(tp.record(_branchy, np.ones(3)))
    assert "guards (1" in text and "truth value" in text and "test_trust.py:" in text


def test_guards_cost_no_entry_when_nothing_escapes():
    t = tp.record(_rosen, np.ones(4))
    assert "guard" not in str(t)


# ---------------------------------------------------------------- 5. float32


def test_float32_input_with_float64_constant_gets_float32_gradient():
    c = np.array([1.0, 2.0, 3.0])  # float64 constant
    x = np.array([0.5, -1.0, 2.0], np.float32)
    t = tp.record(lambda x: (x * c).sum(), x)
    g = t.gradient(x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, c, rtol=1e-7)
    v, g = t.value_and_grad(x)
    assert g.dtype == np.float32
    xt = tp.tensor(x, requires_grad=True)
    (xt * c).sum().backward()
    assert xt.grad.dtype == np.float32
    _, gb = t.gradient_batch(np.stack([x, x]))
    assert gb.dtype == np.float32


# ---------------------------------------------------------------- 7. second backward


def test_second_backward_through_a_shared_intermediate_raises():
    w = tp.tensor([1.0, 2.0], requires_grad=True)
    h = w * w
    a = h.sum()
    b = (h * 2).sum()
    a.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        b.backward()


def test_separate_graphs_from_one_leaf_each_backward_once():
    w = tp.tensor([1.0, 2.0], requires_grad=True)
    a = (w * w).sum()
    b = (w * 3).sum()
    a.backward()
    b.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0 + 3.0, 4.0 + 3.0])


# ---------------------------------------------------------------- anomaly mode


def _nan_forward(x):
    y = tp.log(x)  # log of a negative number
    return y.sum()


def _nan_backward(x):
    return tp.sqrt(x * 0.0).sum()  # sqrt at 0: an infinite derivative


def test_anomaly_mode_names_the_forward_entry_and_line():
    t = tp.record(_nan_forward, np.ones(3))
    np.testing.assert_allclose(t.gradient(np.ones(3)), np.ones(3))
    assert np.isnan(t.forward(-np.ones(3)))  # off: no check, no cost
    with tp.detect_anomaly():
        with pytest.raises(tp.AnomalyError, match=r"forward: entry 0 \(log\) produced nan") as e:
            t.gradient(-np.ones(3))
    assert e.value.source.startswith("test_trust.py:")


def test_anomaly_mode_names_the_reverse_entry():
    t = tp.record(_nan_backward, np.ones(3))
    with tp.detect_anomaly():
        with pytest.raises(tp.AnomalyError, match=r"backward: entry \d+ \(sqrt\) produced inf"):
            t.gradient(np.ones(3))


def test_anomaly_mode_in_eager():
    with tp.detect_anomaly():
        x = tp.tensor([-1.0, 1.0], requires_grad=True)
        with pytest.raises(tp.AnomalyError, match="log.*test_trust.py"):
            tp.log(x)
        y = tp.sqrt(x * 0.0).sum()
        with pytest.raises(tp.AnomalyError, match="backward"):
            y.backward()


def test_anomaly_sources_survive_save_and_load():
    t = tp.record(_nan_forward, np.ones(3))
    buf = io.BytesIO()
    t.save(buf)
    buf.seek(0)
    u = tp.load(buf)
    assert "test_trust.py:" in str(u)
    with tp.detect_anomaly(), pytest.raises(tp.AnomalyError, match="test_trust.py"):
        u.forward(-np.ones(3))


# ---------------------------------------------------------------- gradcheck


def test_gradcheck_at_several_points_passes_for_branchy_code():
    assert tp.gradcheck(_branchy, np.array([0.3, -0.2, 0.4]), n_points=5, scale=1.0)


def test_gradcheck_checks_forward_mode_unless_told_not_to(monkeypatch):
    from tape.frontend import testing

    calls = []
    real = testing._check_jvp
    monkeypatch.setattr(testing, "_check_jvp", lambda *a: calls.append(1) or real(*a))
    x = np.array([0.3, -0.2, 0.4])
    assert tp.gradcheck(_branchy, x) and len(calls) == 1
    assert tp.gradcheck(_branchy, x, check_forward_ad=False) and len(calls) == 1
    assert tp.autograd.gradcheck(_branchy, (tp.tensor(x, requires_grad=True),)) and len(calls) == 2
    w = tp.tensor(x, requires_grad=True)
    assert tp.autograd.gradcheck(_branchy, (w,), check_forward_ad=False) and len(calls) == 2


def test_gradcheck_catches_a_frozen_path_without_a_guard():
    state = {}

    def frozen(x):
        # a value that escapes through a side channel, not through the tensor API
        if "c" not in state:
            state["c"] = 2.0
        return (x * state["c"]).sum() if x._peek().sum() > 0 else (x * 3.0).sum()

    with pytest.raises(tp.GradcheckError, match="disagrees with a fresh recording"):
        tp.gradcheck(frozen, np.array([0.1, 0.1]), n_points=6, scale=2.0)


def test_gradcheck_names_the_first_entry_whose_local_derivative_disagrees():
    # relu has a kink at 0: its rule says 0 there, central differences say 1/2
    with pytest.raises(tp.GradcheckError, match=r"entry 1 \(relu\) recorded at test_trust.py:\d+"):
        tp.gradcheck(lambda x: tp.relu(x * 1.0).sum(), np.array([0.0, 1.0]))


def test_gradcheck_reports_agreeing_entries_when_only_the_combination_is_wrong():
    from tape.frontend.testing import _first_bad_entry

    x = np.array([0.3, 0.7])
    t = tp.record(lambda x: tp.sin(x * 2.0).sum(), x)
    assert "every entry" in _first_bad_entry(t, [x], 1e-6, 1e-5, 1e-3, np.random.default_rng(0))


def test_threads_retracing_alternating_paths_agree_with_fresh_recordings():
    t = tp.record(_branchy, np.ones(3))
    xs = [np.ones(3), -np.ones(3), np.array([0.5, -2.0, 0.1])]
    want = [_fresh(_branchy, x) for x in xs]
    bad = []

    def work(k, j):
        i = (k + j) % len(xs)
        v, g = t.value_and_grad(xs[i])
        if v != want[i][0] or not np.array_equal(g, want[i][1]):
            bad.append(i)

    _hammer(4, 200, work)
    assert not bad
    assert 1 <= t.retraces <= 8


def test_backward_after_a_failed_forward_raises_instead_of_reading_bad_indices():
    t = tp.record(lambda x, idx: x[idx].sum(), np.ones(5), np.array([0, 1]))
    with pytest.raises(IndexError, match="out of bounds"):
        t.forward(np.ones(5), np.array([0, 10**9]))
    with pytest.raises(RuntimeError, match="no complete forward"):
        t.backward()
    for bad in [5, -6, 2**62, -(2**62)]:
        with pytest.raises(IndexError):
            t.forward(np.ones(5), np.array([0, bad]))
    t.forward(np.ones(5), np.array([4, 4]))
    t.zero_grad()
    t.backward()
    np.testing.assert_array_equal(t.grads[0], [0, 0, 0, 0, 2])


def test_backward_after_a_failed_guard_raises():
    t = tp.record(_branchy, np.ones(3), on_change="raise")
    t.forward(np.ones(3))
    with pytest.raises(tp.GuardError):
        t.forward(-np.ones(3))
    with pytest.raises(RuntimeError, match="no complete forward"):
        t.backward()
