"""``t.njit_gradient``: a tape's gradient as a plain ``@njit`` function of its arguments and a
workspace of the caller's (``t.njit_workspace()``), from Python, from ``@njit`` code and from
two threads at once, against the interpreter and finite differences; workspaces that are
not the tape's refused; and
``t.gradient(x, out=g)`` on the compiled tier's one-call path. No timings here
(``benchmarks/njit_overhead.py`` measures them)."""

import threading
from pathlib import Path

import numpy as np
import pytest
from numba import njit

import tape as tp
from tape.layout.views import borrow

N, M = 10, 3


def f(x, W):
    """Two arguments (one 2-D), a matrix product (an entry the fused loops do not take), fused
    elementwise loops, and a guard (a Python ``if`` on a value)."""
    s = tp.sum(tp.tanh(W @ x) ** 2) + tp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    if x[0] > 0:
        s = s + tp.sum(x * x)
    return s


def f_np(x, W):
    s = np.sum(np.tanh(W @ x) ** 2) + np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    return s + np.sum(x * x) if x[0] > 0 else s


def point(seed):
    r = np.random.default_rng(seed)
    x = r.uniform(0.1, 1.5, N)  # x[0] > 0: the recorded branch
    W = r.standard_normal((M, N))
    return x, W


@pytest.fixture(scope="module")
def tape_fn():
    """One tape (on the interpreter, the reference) and its njit_gradient, compiled once."""
    t = tp.record(f, *point(0), compile=False)
    return t, t.njit_gradient


def fd_grad(x, W, h=1e-6):
    out = []
    for a in (x, W):
        g = np.empty(a.shape)
        for i in np.ndindex(a.shape):
            a0 = a[i]
            a[i] = a0 + h
            fp = f_np(x, W)
            a[i] = a0 - h
            fm = f_np(x, W)
            a[i] = a0
            g[i] = (fp - fm) / (2 * h)
        out.append(g)
    return out


def test_from_python_matches_interpreter_and_fd(tape_fn):
    t, g = tape_fn
    assert t.tier == "interpreter"  # njit_gradient compiles a module of its own regardless
    for seed in (1, 2, 3):
        x, W = point(seed)
        gx, gW = np.full(N, np.nan), np.full((M, N), np.nan)
        assert g(x, W, gx, gW, t.njit_workspace()) is None
        rx, rW = t.gradient(x, W)
        np.testing.assert_allclose(gx, rx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gW, rW, rtol=1e-12, atol=1e-12)
        fx, fW = fd_grad(x.copy(), W.copy())
        np.testing.assert_allclose(gx, fx, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(gW, fW, rtol=1e-6, atol=1e-6)


def test_the_function_is_cached_by_numba_for_the_next_process(tape_fn):
    """Generated into a module of its own (named by a hash of its text), not made with
    ``exec``: Numba writes it to its cache when it compiles it, so the next process loads it
    (Numba's cache index exists once it has compiled or loaded it from Python)."""
    t, g = tape_fn
    x, W = point(4)
    g(x, W, np.empty(N), np.empty((M, N)), t.njit_workspace())
    from tape.interpreter.generated import sweeps

    if not hasattr(sweeps.forward_sweep._cache, "_cache_file"):
        pytest.skip("Numba's caching is off here")
    assert hasattr(g._cache, "_cache_file")  # (a function made with exec has no cache)
    assert Path(g._cache._cache_file._index_path).is_file()
    assert Path(g.py_func.__code__.co_filename).name.startswith("tape_njit_")


def test_inside_njit_loop(tape_fn):
    t, g = tape_fn

    xs = np.stack([point(s)[0] for s in range(4, 9)])
    W = point(4)[1]
    gxs = np.full_like(xs, np.nan)
    gW = np.full((M, N), np.nan)
    many(g)(xs, W, gxs, gW, t.njit_workspace())
    for k in range(xs.shape[0]):
        rx, rW = t.gradient(xs[k], W)
        np.testing.assert_allclose(gxs[k], rx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gW, rW, rtol=1e-12, atol=1e-12)  # the last call's


_MANY = {}


def many(g):
    """An ``@njit`` loop (no GIL) of ``g`` over the rows of ``xs``, in one workspace; made once."""
    if g not in _MANY:

        @njit(nogil=True)
        def loop(xs, W, gxs, gW, work):
            for k in range(xs.shape[0]):
                g(xs[k], W, gxs[k], gW, work)
            return gW[0, 0]

        _MANY[g] = loop
    return _MANY[g]


def test_two_workspaces_alternately(tape_fn):
    """Two workspaces used in turn from one loop give what one each gives: a call leaves
    nothing in ``work`` that the next call reads."""
    t, g = tape_fn

    @njit
    def alternate(xs, W, gxs, gWs, w0, w1):
        for k in range(xs.shape[0]):
            g(xs[k], W, gxs[k], gWs[k], w0 if k % 2 == 0 else w1)

    xs = np.stack([point(s)[0] for s in range(20, 26)])
    W = point(20)[1]
    gxs, gWs = np.full_like(xs, np.nan), np.full((xs.shape[0], M, N), np.nan)
    alternate(xs, W, gxs, gWs, t.njit_workspace(), t.njit_workspace())
    for k in range(xs.shape[0]):
        gx, gW = np.empty(N), np.empty((M, N))
        g(xs[k], W, gx, gW, t.njit_workspace())  # a fresh one each
        np.testing.assert_array_equal(gxs[k], gx)
        np.testing.assert_array_equal(gWs[k], gW)


def test_threads_with_their_own_workspaces(tape_fn):
    """Two threads at once (the loop holds no GIL), each with its own ``work``, each get the
    interpreter's gradients for their own points."""
    t, g = tape_fn
    loop = many(g)
    W = point(30)[1]
    reps = 4000  # long enough to overlap: with one shared work this fails
    pts = [np.stack([point(s)[0] for s in range(31 + 5 * j, 36 + 5 * j)] * reps) for j in (0, 1)]
    outs = [np.full_like(p, np.nan) for p in pts]
    gWs = [np.full((M, N), np.nan) for _ in pts]
    loop(pts[0][:1], W, outs[0][:1], gWs[0], t.njit_workspace())  # compiled before the threads
    start = threading.Barrier(2)

    def run(j):
        work = t.njit_workspace()
        start.wait()
        loop(pts[j], W, outs[j], gWs[j], work)

    threads = [threading.Thread(target=run, args=(j,)) for j in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for j in (0, 1):
        ref = np.stack([t.gradient(x, W)[0] for x in pts[j][:5]] * reps)
        np.testing.assert_allclose(outs[j], ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gWs[j], t.gradient(pts[j][-1], W)[1], rtol=1e-12, atol=1e-12)


def test_workspace_not_the_tapes_raises(tape_fn):
    """``ValueError`` before anything is written, from Python and from ``@njit`` code: the wrong
    size, another tape's, a changed marker, the wrong dtype or layout, read-only."""
    t, g = tape_fn
    x, W = point(40)
    work = t.njit_workspace()
    other = tp.record(lambda x: tp.sum(x * x), np.ones(3), compile=False).njit_workspace()
    marked = work.copy()
    marked[-1] = 0.0
    readonly = work.copy()
    readonly.setflags(write=False)
    cases = [(np.empty(5), "not this tape's"), (other, "not this tape's"),
             (marked, "not this tape's"), (work[: work.shape[0] - 1], "not this tape's"),
             (work.astype(np.float32), "must be a writable 1-D"),
             (np.stack([work, work]), "must be a writable 1-D"),
             (np.repeat(work, 2)[::2], "must be a writable 1-D"), (readonly, "must be a writable")]
    for bad, msg in cases:
        gx = np.full(N, 7.0)
        with pytest.raises(ValueError, match=msg):
            g(x, W, gx, np.empty((M, N)), bad)
        assert (gx == 7.0).all()
    with pytest.raises(ValueError, match="not this tape's"):
        many(g)(x[None], W, np.empty((1, N)), np.empty((M, N)), other)
    # this tape's entries call loops through the unit table: work holds the tables, with this
    # process's loop ids, and the process's token after them (cell -3 in float64); a work
    # made in another process (here: its token changed) is refused
    assert work.shape[0] > 2 * t.n_data + 2
    elsewhere = work.copy()
    elsewhere[-3:-2].view(np.int64)[0] ^= 2
    with pytest.raises(ValueError, match="another process"):
        g(x, W, np.empty(N), np.empty((M, N)), elsewhere)
    with pytest.raises(ValueError, match="another process"):
        many(g)(x[None], W, np.empty((1, N)), np.empty((M, N)), elsewhere)
    assert t.njit_workspace() is not t.njit_workspace()  # fresh each time


def test_any_layout(tape_fn):
    t, g = tape_fn
    x, W = point(10)
    xs = np.zeros(2 * N)
    xs[::2] = x
    Wf = np.asfortranarray(W)
    gx, gW = np.zeros(2 * N), np.asfortranarray(np.zeros((M, N)))
    g(xs[::2], Wf, gx[::2], gW, t.njit_workspace())
    rx, rW = t.gradient(x, W)
    np.testing.assert_allclose(gx[::2], rx, rtol=1e-12, atol=1e-12)
    assert not gx[1::2].any()  # nothing written between the strided elements
    np.testing.assert_allclose(gW, rW, rtol=1e-12, atol=1e-12)


def test_wrong_shapes_raise_before_running(tape_fn):
    t, g = tape_fn
    x, W = point(11)
    gx, gW, w = np.empty(N), np.empty((M, N)), t.njit_workspace()
    with pytest.raises(ValueError, match="argument 0 must have shape"):
        g(x[:5], W, gx, gW, w)
    with pytest.raises(ValueError, match="argument 1 must have shape"):
        g(x, W[:, :4], gx, gW, w)
    with pytest.raises(ValueError, match="gradient 1 must have shape"):
        g(x, W, gx, np.empty((N, M)), w)
    small = np.full(N - 1, 7.0)
    with pytest.raises(ValueError, match="gradient 0 must have shape"):
        g(x, W, small, gW, w)
    assert (small == 7.0).all()
    with pytest.raises(ValueError, match="argument 0 must have shape"):
        many(g)(np.empty((1, N + 1)), W, np.empty((1, N + 1)), gW, w)


def test_failed_guard_raises(tape_fn):
    t, g = tape_fn
    x, W = point(12)
    x[0] = -1.0  # the other branch
    gx = np.full(N, 5.0)
    with pytest.raises(RuntimeError, match="stopped"):
        g(x, W, gx, np.empty((M, N)), t.njit_workspace())


def test_refuses_what_it_cannot_run():
    t = tp.record(lambda x: x * 2.0, np.ones(3))
    with pytest.raises(Exception, match="scalar"):
        _ = t.njit_gradient


def test_gradient_out_on_the_one_call_path():
    def rosen(x):
        return tp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    x = np.random.default_rng(13).uniform(-1.0, 2.0, N)
    t = tp.record(rosen, x, compile=True)
    ref = tp.record(rosen, x, compile=False).gradient(x)
    out = np.full(N, np.nan)
    assert t.gradient(x, out=out) is out
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        t.gradient(x, out=np.empty((2, N)))  # would broadcast
    with pytest.raises(ValueError, match="shape"):
        t.gradient(x, out=np.empty(N - 1))


CALLER = """
import os
import numpy as np
from numba import njit
import tape as tp

C = float(os.environ["TAPE_TEST_C"])
A = np.eye(4)
tapes = {"inlined": tp.record(lambda x: tp.sum(tp.sin(x) * C), np.ones(4), compile=False),
         "tables": tp.record(lambda x: tp.sum(tp.sin(A @ x) * C), np.ones(4), compile=False)}
g0, g1 = tapes["inlined"].njit_gradient, tapes["tables"].njit_gradient


@njit(cache=True)
def caller0(x, gx, work):
    g0(x, gx, work)
    return gx[0]


@njit(cache=True)
def caller1(x, gx, work):
    g1(x, gx, work)
    return gx[0]


for (name, t), caller in zip(tapes.items(), (caller0, caller1)):
    work = t.njit_workspace()
    gx = np.empty(4)
    tables = work.shape[0] > 2 * t.n_data + 2  # the tables in work: this process's loop ids
    try:
        caller(np.full(4, 0.5), gx, work)
        out = "ok" if abs(gx - C * np.cos(0.5)).max() < 1e-12 else "WRONG"
    except ValueError as e:
        out = "stale" if "stale" in str(e) else str(e)
    print(name, tables, out, sum(caller.stats.cache_hits.values()))
"""


def test_a_caching_caller_is_cached_and_a_stale_one_refused(tmp_path):
    """No process-specific address in the function: Numba caches an ``@njit(cache=True)``
    caller, which the next process loads (and runs right, with a workspace of its own). Numba keys it on the caller's file only, so after
    the tape changes (a constant, here) it loads the caller compiled for the old tape: the
    workspace's marker refuses it (``ValueError``) rather than let it compute with the old
    constant."""
    import os
    import subprocess
    import sys

    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    # the suite's Numba cache (the interpreter's kernels are there): the caller's file is new,
    # so nothing of it is
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(tp.__file__).parent.parent),
                                                       os.environ.get("PYTHONPATH", "")]))

    def run(c):
        out = subprocess.run([sys.executable, str(script)], env=dict(env, TAPE_TEST_C=c),
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    # a tape whose units are inlined (tables constant) and one whose entries call the
    # interpreter's kernels and loops through the address tables (tables in work)
    assert run("2").splitlines() == ["inlined False ok 0", "tables True ok 0"]  # compiled
    assert run("2").splitlines() == ["inlined False ok 1", "tables True ok 1"]  # from the cache
    assert run("3").splitlines() == ["inlined False stale 1", "tables True stale 1"]  # refused


@njit
def _through_borrowed(a, k):
    b = borrow(a)
    b[...] = b * 2.0 + 1.0  # writes reach a's memory
    return b.sum(), borrow(k)


def test_borrow_is_the_array_itself_in_any_layout():
    """``tape.layout.views.borrow`` (the reference-free view the drivers and
    ``t.njit_gradient`` pass on) sees and writes the array's own memory in every layout and
    dimension, and hands back a value that is not an array as it is."""
    base = np.arange(24.0).reshape(2, 3, 4)
    for a in (base.copy(), np.asfortranarray(base), base.copy()[:, ::2, 1:], np.arange(5.0)):
        want = a * 2.0 + 1.0
        s, k = _through_borrowed(a, (3, 4.5))
        assert np.array_equal(a, want) and s == want.sum() and k == (3, 4.5)
