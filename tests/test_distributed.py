"""tape.distributed: a sum-over-data objective and its gradient on a Dask LocalCluster."""

import os
import signal
import threading
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import tape as tp  # noqa: E402
from tape.frontend import distributed as D  # noqa: E402


def nll(w, b, X, y):
    """Logistic regression: the negative log-likelihood of one chunk of rows."""
    return tp.sum(tp.logaddexp(0.0, -y * (X @ w + b)))


def quad(w, X):
    return tp.sum((X @ w) ** 2)


def branchy(w, X):
    # a Python branch on the data: a guard, so chunks of either sign take their own path
    if float(tp.sum(X)) > 0:
        return tp.sum(tp.exp(X @ w))
    return tp.sum((X @ w) ** 2)


def vector_out(w, X):
    return X @ w


class Slow(tp.autograd.Function):
    """The identity, 20 ms per replay (a Python callback): a call over many chunks lasts long
    enough for a worker to die during it."""

    @staticmethod
    def forward(ctx, x):
        time.sleep(0.02)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g


def residuals(w, b, X, y):
    return X @ w + b - y


def slow_quad(w, X):
    return tp.sum(Slow.apply(X @ w) ** 2)


def close(a, b, rtol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    assert np.max(np.abs(a - b)) <= rtol * max(np.max(np.abs(b)), 1e-300), (a, b)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((1000, 5))
    y = np.sign(rng.standard_normal(1000))
    w = rng.standard_normal(5)
    b = np.array(0.3)
    return X, y, w, b


@pytest.fixture(scope="module")
def client(data):
    # load the sweeps in this process first, so the workers find them in Numba's disk cache
    X, y, w, b = data
    tp.record(nll, w, b, X, y, wrt=[0, 1]).value_and_grad(w, b, X, y)
    a32 = tuple(a.astype(np.float32) for a in (w, b, X[:10], y[:10]))
    tp.record(nll, *a32, wrt=[0, 1]).value_and_grad(*a32)
    tp.record(branchy, w, X[:10], wrt=0).value_and_grad(w, X[:10])
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as c:  # fmt: skip
        yield c


def totals(client):
    stats = D.worker_stats(client)
    return {k: sum(s[k] for s in stats.values()) for k in ("records", "replays", "fallbacks")}


def test_matches_single_machine_float64(client, data):
    X, y, w, b = data
    Xd, yd = da.from_array(X, chunks=(250, 5)), da.from_array(y, chunks=250)
    value, (gw, gb) = D.value_and_grad(nll, (w, b), Xd, yd, client=client)
    ref_v, (ref_w, ref_b) = tp.record(nll, w, b, X, y, wrt=[0, 1]).value_and_grad(w, b, X, y)
    close(value, ref_v, 1e-12)
    close(gw, ref_w, 1e-12)
    close(gb, ref_b, 1e-12)
    assert value.dtype == np.float64 and gw.dtype == np.float64 and gb.shape == ()


def test_second_call_does_not_record_again(client, data):
    X, y, w, b = data
    Xd = da.from_array(X, chunks=(250, 5)).persist()
    yd = da.from_array(y, chunks=250).persist()

    def fn(w, b, X, y):  # a function of its own: its tapes are recorded by this test
        return 2.0 * nll(w, b, X, y)

    before = totals(client)
    D.value_and_grad(fn, (w, b), Xd, yd, client=client)
    first = totals(client)
    assert 1 <= first["records"] - before["records"] <= 2  # one shape, at most once per worker
    assert first["replays"] - before["replays"] == 4
    for k in range(3):  # later calls replay; a worker records only a shape it has not met
        w2 = w + 0.1 * (k + 1)
        v2, (g2, _) = D.value_and_grad(fn, (w2, b), Xd, yd, client=client)
    second = totals(client)
    assert second["records"] - before["records"] <= 2  # the scheduler may move chunks
    assert second["replays"] - first["replays"] == 12
    # the function was deserialised once per worker, not per call or task
    assert all(s["functions"] <= 2 for s in D.worker_stats(client).values())
    ref_v, (ref_w, _) = tp.record(fn, w2, b, X, y, wrt=[0, 1]).value_and_grad(w2, b, X, y)
    close(v2, ref_v, 1e-12)
    close(g2, ref_w, 1e-12)


def test_uneven_chunks_record_a_second_shape(client, data):
    X, _, w, _ = data
    Xd = da.from_array(X, chunks=(300, 5))  # 300, 300, 300, 100
    value, g = D.value_and_grad(quad, w, Xd, client=client)
    shapes = {s for st in D.worker_stats(client).values() for s in st["shapes"]}
    assert ((5,), (300, 5)) in shapes and ((5,), (100, 5)) in shapes
    ref_v, ref_g = tp.record(quad, w, X, wrt=0).value_and_grad(w, X)
    close(value, ref_v, 1e-12)
    assert isinstance(g, np.ndarray)  # a single array param: a single gradient
    close(g, ref_g, 1e-12)


def test_tree_reduction(client, data):
    X, y, w, b = data
    Xd, yd = da.from_array(X, chunks=(45, 5)), da.from_array(y, chunks=45)  # 23 chunks
    value, (gw, gb) = D.value_and_grad(nll, [w, b], Xd, yd, client=client, split_every=3)
    ref_v, (ref_w, ref_b) = tp.record(nll, w, b, X, y, wrt=[0, 1]).value_and_grad(w, b, X, y)
    close(value, ref_v, 1e-12)
    close(gw, ref_w, 1e-12)
    close(gb, ref_b, 1e-12)


def test_float32(client, data):
    X, y, w, b = data
    X32, y32, w32, b32 = (a.astype(np.float32) for a in (X, y, w, b))
    Xd, yd = da.from_array(X32, chunks=(250, 5)), da.from_array(y32, chunks=250)
    value, (gw, gb) = D.value_and_grad(nll, (w32, b32), Xd, yd, client=client)
    assert value.dtype == np.float32 and gw.dtype == np.float32 and gb.dtype == np.float32
    ref_v, (ref_w, ref_b) = tp.record(nll, w, b, X, y, wrt=[0, 1]).value_and_grad(w, b, X, y)
    close(value, ref_v, 1e-5)
    close(gw, ref_w, 1e-5)
    close(gb, ref_b, 1e-5)


def test_guards_retrace_per_chunk(client, data):
    X, _, w, _ = data
    Xs = X.copy()
    Xs[:250] = np.abs(Xs[:250])  # chunk 0 sums positive, the others (checked) negative
    Xs[250:] = -np.abs(Xs[250:])
    Xd = da.from_array(Xs, chunks=(250, 5))
    before = sum(s["retraces"] + s["records"] for s in D.worker_stats(client).values())
    value, g = D.value_and_grad(branchy, w * 0.1, Xd, client=client)
    after = sum(s["retraces"] + s["records"] for s in D.worker_stats(client).values())
    assert after - before >= 2  # both paths were traced
    ref_v, ref_g = 0.0, np.zeros(5)
    for i in range(4):
        c = Xs[250 * i : 250 * (i + 1)]
        v, gg = tp.record(branchy, w * 0.1, c, wrt=0).value_and_grad(w * 0.1, c)
        ref_v, ref_g = ref_v + v, ref_g + gg
    close(value, ref_v, 1e-12)
    close(g, ref_g, 1e-12)


def test_mismatched_chunks_are_rechunked(client, data):
    X, y, w, b = data
    Xd = da.from_array(X, chunks=((400, 600), (2, 3)))  # two chunks along columns too
    yd = da.from_array(y, chunks=250)
    value, (gw, gb) = D.value_and_grad(nll, (w, b), Xd, yd, client=client)
    ref_v, (ref_w, ref_b) = tp.record(nll, w, b, X, y, wrt=[0, 1]).value_and_grad(w, b, X, y)
    close(value, ref_v, 1e-12)
    close(gw, ref_w, 1e-12)


def test_default_client_is_used(client, data):
    # the fixture's Client is the default one: client=None runs there
    X, _, w, _ = data
    before = totals(client)["replays"]
    D.value_and_grad(quad, w, da.from_array(X, chunks=500))
    assert totals(client)["replays"] - before == 2


def test_errors(client, data):
    X, y, w, b = data
    Xd, yd = da.from_array(X, chunks=(250, 5)), da.from_array(y, chunks=250)
    with pytest.raises(ValueError, match="one scalar"):
        D.value_and_grad(vector_out, w, Xd, client=client)
    with pytest.raises(TypeError, match="not a Dask array"):
        D.value_and_grad(quad, w, X, client=client)
    with pytest.raises(ValueError, match="rows"):
        D.value_and_grad(nll, (w, b), Xd, yd[:999], client=client)
    with pytest.raises(TypeError, match="floating"):
        D.value_and_grad(quad, np.arange(5), Xd, client=client)
    with pytest.raises(TypeError, match="Dask array"):
        D.value_and_grad(quad, Xd, Xd, client=client)
    with pytest.raises(ValueError, match="no data"):
        D.value_and_grad(quad, w, client=client)
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        D.value_and_grad(quad, w, Xd[Xd[:, 0] > 0], client=client)
    with pytest.raises(ValueError, match="0-d"):
        D.value_and_grad(quad, w, da.from_array(np.array(1.0)), client=client)


def test_own_local_cluster(data):
    X, _, w, _ = data
    try:
        c = D.get_client(n_workers=1)
        assert len(c.scheduler_info()["workers"]) == 1
        value, g = D.value_and_grad(quad, w, da.from_array(X, chunks=500), n_workers=1)
        assert D.get_client(n_workers=1) is c
        ref_v, ref_g = tp.record(quad, w, X, wrt=0).value_and_grad(w, X)
        close(value, ref_v, 1e-12)
        close(g, ref_g, 1e-12)
    finally:
        D.shutdown()


def test_missing_dask_message(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name == "dask" or name.startswith("dask."):
            raise ImportError("No module named 'dask'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(ImportError, match=r"pip install 'tape\[distributed\]'"):
        D.value_and_grad(quad, np.ones(2))


def test_a_worker_killed_during_a_call_changes_nothing(data):
    """The worker processes that hold the function killed (SIGKILL) while a call runs: the
    call returns the single-machine value and gradient, and so does the next call (the
    function reaches the workers as a task, which the scheduler computes again; scattered
    data would be lost with them)."""
    X, _, w, _ = data
    ref_v, ref_g = tp.record(slow_quad, w, X, wrt=0).value_and_grad(w, X)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as c:  # fmt: skip
        Xd = c.persist(da.from_array(X, chunks=(25, 5)))  # 40 chunks, 20 ms each
        D.value_and_grad(slow_quad, w, Xd, client=c)  # both workers record their tapes
        pids = c.run(os.getpid)
        out = {}

        def call():
            try:
                out["result"] = D.value_and_grad(slow_quad, w, Xd, client=c)
            except BaseException as e:  # noqa: BLE001
                out["error"] = e

        th = threading.Thread(target=call)
        th.start()
        time.sleep(0.15)
        assert th.is_alive()  # 40 chunks of 20 ms on two workers take 0.4 s at least
        holders = c.who_has()
        fn_key = next(k for k in holders if str(k).startswith("tape-function-"))
        assert holders[fn_key]
        for addr in holders[fn_key]:  # every worker that holds the function: none is left
            os.kill(pids[addr], signal.SIGKILL)
        th.join(120)
        assert not th.is_alive() and "error" not in out, out.get("error")
        value, g = out["result"]
        close(value, ref_v, 1e-12)
        close(g, ref_g, 1e-12)
        value, g = D.value_and_grad(slow_quad, w, Xd, client=c)
        close(value, ref_v, 1e-12)
        close(g, ref_g, 1e-12)


def test_a_worker_with_another_tape_is_named(client, monkeypatch):
    here, mine = os.getpid(), tp.__version__
    # the workers run this function (pickled by value): they answer another version
    monkeypatch.setattr(D, "_worker_version", lambda: mine if os.getpid() == here else "0.0.1x")
    with pytest.raises(RuntimeError, match=rf"workers without tape {mine}.*: tape 0\.0\.1x"):
        D._check_workers(client)


def test_hvp_and_gauss_newton_match_single_machine(client, data):
    X, y, w, b = data
    Xd, yd = da.from_array(X, chunks=(250, 5)), da.from_array(y, chunks=250)
    rng = np.random.default_rng(3)
    v = (rng.standard_normal(5), np.array(0.7))
    assert tp.distributed is D  # reached as an attribute of the package, as the docs write it
    hw, hb = D.hvp(nll, (w, b), v, Xd, yd, client=client)
    rw, rb = tp.record(nll, w, b, X, y, wrt=[0, 1]).hvp(w, b, X, y, v=v)
    close(hw, rw, 1e-10)
    close(hb, rb, 1e-10)
    # and against central differences of the single-machine gradient
    t = tp.record(nll, w, b, X, y, wrt=[0, 1])
    eps = 1e-6
    up = t.gradient(w + eps * v[0], b + eps * v[1], X, y)
    dn = t.gradient(w - eps * v[0], b - eps * v[1], X, y)
    close(hw, (up[0] - dn[0]) / (2 * eps), 1e-6)
    close(hb, (up[1] - dn[1]) / (2 * eps), 1e-6)
    assert D.hvp(quad, w, v[0], Xd, client=client).shape == (5,)

    # Gauss-Newton pieces of 0.5 * ||X w + b - y||^2, against the dense Jacobian
    J = np.c_[X, np.ones(len(X))]
    r = J @ np.r_[w, b] - y
    cost, (gw, gb), (jw, jb) = D.gauss_newton(residuals, (w, b), Xd, yd, v=v, client=client)
    close(cost, 0.5 * r @ r, 1e-12)
    close(np.r_[gw, gb], J.T @ r, 1e-10)
    close(np.r_[jw, jb], J.T @ (J @ np.r_[v[0], v[1]]), 1e-10)
    cost2, (gw2, gb2) = D.gauss_newton(residuals, (w, b), Xd, yd, client=client)
    close(cost2, cost, 1e-14)
    close(gw2, gw, 1e-14)
    with pytest.raises(ValueError, match=r"v\[0\] has shape \(4,\), params\[0\] has \(5,\)"):
        D.hvp(nll, (w, b), (np.ones(4), np.array(1.0)), Xd, yd, client=client)
    with pytest.raises(TypeError, match="structured like params"):
        D.gauss_newton(residuals, (w, b), Xd, yd, v=np.ones(5), client=client)


def _rss(dask_worker=None):
    import psutil

    return psutil.Process().memory_info().rss


def _held(dask_worker=None):
    return len(dask_worker.data), len(dask_worker.state.tasks)


def _no_more_held(held0, held1):
    """Whether the workers hold (data, tasks) no more than before, give or take two per
    worker, counted over all workers: the scheduler may move a persisted chunk from one worker
    to another (one run: (13, 15) and (0, 0) before, (6, 8) and (7, 7) after), while a loop
    that kept keys per call would hold hundreds more."""
    slack = 2 * len(held0)
    return all(
        sum(h[k] for h in held1.values()) <= sum(h[k] for h in held0.values()) + slack
        for k in (0, 1)
    )


def test_a_long_optimisation_loop_holds_nothing_per_call(client, data):
    """Hundreds of calls (a gradient-descent loop, as an optimiser drives it): the workers'
    tapes, held keys and memory and the scheduler's tasks stay where the first calls left
    them."""
    from scipy.optimize import minimize

    X, y, w, b = data
    Xd, yd = client.persist([da.from_array(X, chunks=(250, 5)), da.from_array(y, chunks=250)])

    def f(p):
        v, (gw, gb) = D.value_and_grad(nll, (p[:5], p[5]), Xd, yd, client=client)
        return float(v), np.r_[gw, gb]

    p = np.r_[w, b]
    for _ in range(60):  # warm: tapes recorded and promoted (100 replays), buffers sized
        p = p - 1e-4 * f(p)[1]
    time.sleep(0.5)  # let the scheduler release the last call's keys
    rss0, held0 = client.run(_rss), client.run(_held)
    tasks0 = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    tapes0 = {a: s["tapes"] for a, s in D.worker_stats(client).items()}
    for _ in range(300):
        p = p - 1e-4 * f(p)[1]
    res = minimize(f, p, jac=True, method="L-BFGS-B", options={"maxiter": 50})
    assert np.isfinite(res.fun)
    # the scheduler releases the last calls' keys in its own time: a few seconds at most
    # (a loop that kept keys per call would hold hundreds)
    for _ in range(40):
        time.sleep(0.25)
        rss1, held1 = client.run(_rss), client.run(_held)
        tasks1 = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        if tasks1 <= tasks0 + 2 and _no_more_held(held0, held1):
            break
    assert {a: s["tapes"] for a, s in D.worker_stats(client).items()} == tapes0
    assert tasks1 <= tasks0 + 2, (tasks0, tasks1)
    assert _no_more_held(held0, held1), (held0, held1)
    for a in rss0:
        grown = (rss1[a] - rss0[a]) / 2**20
        # 2.0 and 2.2 MiB in one run: a call that kept 24 KiB would add 8 MiB
        assert grown < 8, f"worker {a} grew {grown:.1f} MiB over 350 calls"


def nll_flat(p, X, y):
    """``nll`` with the weights and the bias in one vector (as an optimiser sees them)."""
    return tp.sum(tp.logaddexp(0.0, -y * (X @ p[:5] + p[5])))


def test_tape_optimize_minimizes_over_dask_chunks(client, data):
    from tape import optimize

    X, y, w, b = data
    Xd, yd = da.from_array(X, chunks=(250, 5)), da.from_array(y, chunks=250)
    p0 = np.zeros(6)
    for method in ("Newton-CG", "L-BFGS-B"):
        got = optimize.minimize(nll_flat, p0, args=(Xd, yd), method=method, client=client)
        want = optimize.minimize(nll_flat, p0, args=(X, y), method=method)
        assert got.success and want.success, (got.message, want.message)
        close(got.x, want.x, 1e-5)
        close(got.fun, want.fun, 1e-9)
    with pytest.raises(ValueError, match="dense Hessian"):
        optimize.minimize(nll_flat, p0, args=(Xd, yd), method="trust-exact", client=client)
    with pytest.raises(TypeError, match="every arg must be one"):
        optimize.minimize(nll_flat, p0, args=(Xd, y), client=client)


def test_a_gauss_newton_step_over_chunks_equals_the_single_machine_step(client, data):
    """One Gauss-Newton step by conjugate gradients on J^T J v products summed over chunks:
    the step of the dense normal equations."""
    from scipy.sparse.linalg import LinearOperator, cg

    X, y, w, b = data
    Xd, yd = da.from_array(X, chunks=(250, 5)), da.from_array(y, chunks=250)
    _, (gw, gb) = D.gauss_newton(residuals, (w, b), Xd, yd, client=client)

    def jtj(v):
        _, _, (hw, hb) = D.gauss_newton(residuals, (w, b), Xd, yd, v=(v[:5], v[5]), client=client)
        return np.r_[hw, hb]

    step, info = cg(LinearOperator((6, 6), matvec=jtj), -np.r_[gw, gb], rtol=1e-12, maxiter=50)
    assert info == 0
    J = np.c_[X, np.ones(len(X))]
    want = np.linalg.solve(J.T @ J, -J.T @ (J @ np.r_[w, b] - y))
    close(step, want, 1e-8)
