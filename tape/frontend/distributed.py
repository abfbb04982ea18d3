"""A sum-over-data objective and its gradient across a ``dask.distributed`` cluster.

::

    import dask.array as da
    import numpy as np
    import tape as tp
    from tape.frontend import distributed

    def nll(w, b, X, y):                       # the objective of one chunk of rows
        return tp.sum(tp.logaddexp(0.0, -y * (X @ w + b)))

    client = distributed.get_client()          # a LocalCluster of processes, one per core
    X = da.random.default_rng(0).standard_normal((1_000_000, 10), chunks=(100_000, 10))
    y = da.sign(X[:, 0])
    X, y = client.persist([X, y])              # made and kept on the workers between calls
    w, b = np.zeros(10), np.array(0.0)
    value, (gw, gb) = distributed.value_and_grad(nll, (w, b), X, y, client=client)

:func:`value_and_grad` ``(fn, params, *data, client=None)`` returns the sum over the chunks of
``fn(*params, *chunk_rows)`` and its gradient with respect to each parameter, equal (up to the
order of the floating-point additions) to a single-machine replay over the concatenated data.
:func:`hvp` sums Hessian-vector products the same way, and :func:`gauss_newton` the
least-squares pieces ``(cost, J^T r[, J^T J v])`` of a function that returns residuals.
Install Dask with ``pip install 'tape[distributed]'``.

How it runs
-----------
- **Data** are Dask arrays whose first axis indexes the data points. All of them must have the
  same number of rows; they are chunked along that axis only (other axes are rechunked into one
  chunk) and the chunk boundaries of the first array are imposed on the others (``rechunk``),
  so chunk ``i`` of every array holds the same rows. Chunks are never gathered to the client:
  each task reads its chunk on a worker. Persist data on the cluster
  (``X = client.persist(X)``); otherwise every call computes them again (and arrays made with
  ``dask.array.from_array`` travel from the client at every call). Chunks with zero rows are
  skipped (their objective is taken to be 0: the objective is a sum over rows).
- **The function** is pickled (cloudpickle) once per function object and reaches the
  workers as the result of a task of the graph (``client.submit`` of its bytes, keyed by
  their hash, once per client), not as scattered data: a worker that holds it may die and
  the scheduler computes it again elsewhere, as it does every other task. Each worker
  unpickles it once (kept by that hash, :data:`MAX_FUNCTIONS` of them) and fetches it from a
  peer when it joins later. Its identity is that hash: values a function closes over are
  constants of its tapes (as with :func:`tape.record`), so after changing such a value pass a
  new function, or call :func:`clear`.
- **Faults**: a worker that dies during a call loses its tasks and the chunks it held; Dask
  computes them again on the other workers (persisted data from the graph that made them),
  and the call returns the value and gradient it returns without the fault. What cannot be
  recovered raises: data scattered by a client that is gone, a function that cannot be
  pickled (``TypeError``), a worker that cannot import ``tape`` or runs another version of it
  (``RuntimeError`` naming the workers, checked once per client).
- **Tapes** are recorded on the workers, never shipped: each worker keeps a cache (an attribute
  of its ``distributed.Worker``) of tapes keyed by (function, shapes and dtypes of the params
  and of the chunk, ``compile``), least recently used dropped beyond :data:`MAX_TAPES`. A tape
  is recorded the first time a worker meets a chunk shape: usually one shape, and one more for
  a smaller last chunk. Per call only the parameters travel (one graph key, copied once to each
  worker) and each task returns ``(value, grads)`` of its chunk. :func:`worker_stats` reports
  each worker's recordings, replays and cached tapes.
- **Gradients** are with respect to the params only (``tape.record(..., wrt=params)``): the
  data are inputs of the tape that are not differentiated, and may be integer arrays (labels,
  indices).
- **Reduction**: partial values and gradients are summed in a tree (``split_every`` partials
  per task) in float64, then cast to the dtype the function returns and to each parameter's
  dtype. float32 params with float32 data record float32 tapes (arithmetic in float32 on the
  workers); only the sums across chunks are float64.
- **Guards**: tapes are recorded with ``on_change="retrace"``, so a chunk whose data take
  another Python branch than the recording is traced again on the worker (the variant is kept
  beside the tape, see :func:`tape.record`). Should a replay still raise
  :class:`tape.GuardError`, that chunk is recorded afresh and evaluated once (counted in
  ``fallbacks``).
- **Clients**: ``client=None`` uses the current default ``distributed`` client if there is one
  (and ``n_workers`` is not given), otherwise a ``LocalCluster`` of processes on this machine
  (``n_workers`` of them, one thread each; default: one per CPU core) created on first use,
  kept for later calls and closed at interpreter exit (:func:`get_client`, :func:`shutdown`).
  Creating one spawns processes: in a script, call it under ``if __name__ == "__main__":``.
  A client passed in is used as is; its workers must be able to import ``tape``.
- **Errors**: params must be floating arrays, data Dask arrays with known chunk sizes and
  equal row counts, and ``fn`` must return one scalar: each case raises ``TypeError`` or
  ``ValueError`` naming the argument.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
import time
import weakref
from collections import OrderedDict

import numpy as np

__all__ = [
    "value_and_grad", "hvp", "gauss_newton", "worker_stats", "clear", "get_client", "shutdown",
    "MAX_TAPES", "MAX_FUNCTIONS",
]  # fmt: skip

MAX_TAPES = 32
"""Tapes kept per worker (least recently used dropped beyond it)."""

MAX_FUNCTIONS = 16
"""Unpickled functions kept per worker (least recently used dropped beyond it)."""

_INSTALL_HINT = "tape.distributed needs Dask: pip install 'tape[distributed]'"


def _dask():
    try:
        import dask
        import dask.array as da
        import distributed
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from None
    return dask, da, distributed


# ------------------------------------------------------------------ worker side


class _WorkerState:
    """One worker's tapes and counters."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tapes = OrderedDict()  # key -> Tape, most recently used last
        self.records = 0
        self.replays = 0
        self.fallbacks = 0
        self.fn_ids = set()
        self.fns = OrderedDict()  # token -> the function unpickled from its bytes
        self.replay_s = 0.0  # seconds spent evaluating chunks (recordings included)

    def stats(self):
        return {
            "records": self.records,
            "replays": self.replays,
            "fallbacks": self.fallbacks,
            "retraces": sum(t.retraces for t in self.tapes.values()),
            "tapes": len(self.tapes),
            "shapes": [tuple(s for s, _ in key[-1]) for key in self.tapes],
            "functions": len(self.fn_ids),
            "replay_seconds": self.replay_s,
        }


_STATE_LOCK = threading.Lock()
_LOCAL_STATE = _WorkerState()  # outside a worker (a task run by some other scheduler)


def _state(worker=None):
    if worker is None:
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):
            return _LOCAL_STATE
    st = getattr(worker, "_tape_distributed", None)
    if st is None:
        with _STATE_LOCK:
            st = getattr(worker, "_tape_distributed", None)
            if st is None:
                st = worker._tape_distributed = _WorkerState()
    return st


def _check_scalar(t):
    sig = t.signature
    if not sig.out_single or int(np.prod(sig.out_shapes[0], dtype=np.int64)) != 1:
        got = (
            f"shape {sig.out_shapes[0]}"
            if sig.out_single
            else f"a tuple of {len(sig.out_shapes)} outputs"
        )
        raise ValueError(
            "tape.distributed.value_and_grad: fn must return one scalar (the objective of one "
            f"chunk), it returned {got}"
        )


def _record(fn, args, n_params, compile, scalar=True):
    from tape.frontend.record import record

    t = record(fn, *args, wrt=list(range(n_params)), on_change="retrace", compile=compile)
    if scalar:
        _check_scalar(t)
    return t


def _function(st, token, payload):
    """The function of ``token`` on this worker, unpickled from ``payload`` the first time."""
    fn = st.fns.get(token)
    if fn is None:
        import cloudpickle

        fn = st.fns[token] = cloudpickle.loads(payload)
        while len(st.fns) > MAX_FUNCTIONS:
            st.fns.popitem(last=False)
    else:
        st.fns.move_to_end(token)
    return fn


def _payload(payload):
    """The task whose result is a function's pickled bytes (see :func:`_ship`)."""
    return payload


def _chunk_task(payload, token, compile, what, params, v, *chunks):
    """What the call asks of one chunk on this worker, ``fn`` unpickled from ``payload``:
    ``(value, arrays, out_dtype)`` in float64, summed by :func:`_sum_parts`. ``what``:
    ``"grad"`` (the value and the gradient), ``"hvp"`` (the Hessian times ``v``; value 0) or
    ``"gn"`` (``fn`` returns residuals ``r``: half their squared norm, ``J^T r`` and, with
    ``v``, ``J^T J v``)."""
    from tape.program.replay import GuardError

    st = _state()
    t0 = time.perf_counter()
    args = [*params, *[np.asarray(c) for c in chunks]]
    key = (token, compile, what == "gn", tuple((a.shape, a.dtype.str) for a in args))
    with st.lock:
        fn = _function(st, token, payload)
        st.fn_ids.add(id(fn))
        t = st.tapes.get(key)
        if t is None:
            t = _record(fn, args, len(params), compile, scalar=what != "gn")
            st.records += 1
            st.tapes[key] = t
            while len(st.tapes) > MAX_TAPES:
                st.tapes.popitem(last=False)
        else:
            st.tapes.move_to_end(key)
        st.replays += 1
    try:
        value, arrays = _evaluate(t, what, args, v, len(params))
    except GuardError:
        # the function's path depends on more than its arguments: evaluate this chunk afresh
        with st.lock:
            st.fallbacks += 1
        t = _record(fn, args, len(params), False, scalar=what != "gn")
        value, arrays = _evaluate(t, what, args, v, len(params))
    with st.lock:
        st.replay_s += time.perf_counter() - t0
    return (
        np.float64(np.asarray(value).reshape(())),
        [np.asarray(a, np.float64) for a in arrays],
        np.asarray(value).dtype.str,
    )


def _evaluate(t, what, args, v, n_params):
    """``(value, arrays)`` of one chunk's tape ``t`` (see :func:`_chunk_task`)."""

    def listed(x):
        return [x] if n_params == 1 else list(x)

    if what == "grad":
        value, grads = t.value_and_grad(*args)
        return value, listed(grads)
    if what == "hvp":
        return np.zeros((), t.dtype), listed(t.hvp(*args, v=v[0] if n_params == 1 else v))
    r = np.asarray(t.forward(*args), np.float64)
    _, jtr = t.vjp(*args, cotangent=r)
    out = listed(jtr)
    if v is not None:
        _, jv = t.jvp(*args, tangents=v[0] if n_params == 1 else v)
        _, jtjv = t.vjp(*args, cotangent=np.asarray(jv))
        out += listed(jtjv)
    return 0.5 * np.dot(r.ravel(), r.ravel()), out


def _sum_parts(parts):
    value, grads, out_dtype = parts[0]
    grads = [g.copy() for g in grads]
    for v, gs, _ in parts[1:]:
        value = value + v
        for acc, g in zip(grads, gs):
            acc += g
    return value, grads, out_dtype


def _worker_stats(dask_worker=None):
    return _state(dask_worker).stats()


def _worker_clear(dask_worker=None):
    st = _state(dask_worker)
    with st.lock:
        st.tapes.clear()
        st.fn_ids.clear()
        st.fns.clear()


# ------------------------------------------------------------------ client side

_DEFAULT = {"cluster": None, "client": None, "n_workers": None, "atexit": False}
_SHIPPED = weakref.WeakKeyDictionary()  # fn -> {"token": str, client id: Future}
_SHIPPED_LOCK = threading.Lock()


def get_client(n_workers=None):
    """The client this module uses when none is passed: the current default ``distributed``
    client if one exists and ``n_workers`` is None, otherwise this module's own
    ``LocalCluster`` of ``n_workers`` processes (one thread each; default one per CPU core),
    created on first use and replaced when another ``n_workers`` is asked for."""
    _, _, distributed = _dask()
    if n_workers is None:
        try:
            return distributed.default_client()
        except ValueError:
            pass
    n = int(n_workers) if n_workers is not None else (os.cpu_count() or 1)
    if n < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers!r}")
    c = _DEFAULT["client"]
    if (
        c is not None
        and (_DEFAULT["n_workers"] == n or n_workers is None)
        and c.status == "running"
    ):
        return c
    shutdown()
    cluster = distributed.LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
    )
    # not the default client: other Dask code in this process keeps its own scheduler
    client = distributed.Client(cluster, set_as_default=False)
    _DEFAULT.update(cluster=cluster, client=client, n_workers=n)
    if not _DEFAULT.get("atexit"):
        # registered after distributed's own exit handlers so that it runs before them: the
        # client lets go of its data before the cluster's workers go away
        atexit.register(shutdown)
        _DEFAULT["atexit"] = True
    return client


def shutdown():
    """Close the ``LocalCluster`` made by :func:`get_client`, if any."""
    client, cluster = _DEFAULT["client"], _DEFAULT["cluster"]
    _DEFAULT.update(cluster=None, client=None, n_workers=None)
    if client is not None:
        client.close()
    if cluster is not None:
        cluster.close()


def _pickled(fn):
    import cloudpickle

    try:
        return cloudpickle.dumps(fn)
    except Exception as e:  # noqa: BLE001  (any pickling failure)
        raise TypeError(
            f"tape.distributed.value_and_grad: fn cannot be pickled for the workers ({e})"
        ) from None


def _ship(client, fn):
    """``(token, future)``: the future of a task whose result is ``fn``'s pickled bytes, once
    per function and client. A task, not scattered data: the scheduler keeps its definition,
    so when the worker holding the result dies it computes it again (scattered data would be
    lost with that worker, and every call after it would fail)."""
    with _SHIPPED_LOCK:
        try:
            entry = _SHIPPED.get(fn)
        except TypeError:  # not weak-referenceable: pickled and shipped every call
            entry = None
        if entry is None:
            payload = _pickled(fn)
            entry = {"token": hashlib.sha256(payload).hexdigest()[:32], "payload": payload}
            try:
                _SHIPPED[fn] = entry
            except TypeError:
                pass
        futures = entry.setdefault("futures", {})
        for cid in [k for k, f in futures.items() if f.status in ("error", "cancelled")]:
            del futures[cid]  # closed clients
        fut = futures.get(client.id)
        if fut is None:
            _check_workers(client)
            fut = client.submit(
                _payload, entry["payload"], key=f"tape-function-{entry['token']}", pure=False
            )
            futures[client.id] = fut
        return entry["token"], fut


def _worker_version():
    import tape

    return getattr(tape, "__version__", None)


def _check_workers(client):
    """Every worker imports ``tape`` of this version; otherwise a ``RuntimeError`` naming the
    workers that do not (a task there would fail, or compute with other code)."""
    mine = _worker_version()
    try:
        got = client.run(_worker_version, on_error="return")
    except Exception as e:  # noqa: BLE001  (a cluster that cannot run the check)
        raise RuntimeError(f"tape.distributed: cannot reach the workers ({e!r})") from None
    bad = {w: v for w, v in got.items() if isinstance(v, BaseException) or v != mine}
    if bad:
        what = "; ".join(
            f"{w}: {'cannot import tape (' + repr(v) + ')' if isinstance(v, BaseException) else 'tape ' + str(v)}"
            for w, v in sorted(bad.items())
        )
        raise RuntimeError(
            f"tape.distributed: workers without tape {mine} (install the same version on "
            f"every worker): {what}"
        )


def _params(params):
    from tape.frontend.tensor import Tensor

    single = not isinstance(params, (tuple, list))
    seq = [params] if single else list(params)
    if not seq:
        raise ValueError(
            "tape.distributed.value_and_grad: params is empty (nothing to differentiate)"
        )
    out = []
    for k, p in enumerate(seq):
        if hasattr(p, "dask") and hasattr(p, "chunks"):
            raise TypeError(
                f"params[{k}] is a Dask array: params are small arrays held by the client; "
                "pass data after params"
            )
        a = p.numpy() if isinstance(p, Tensor) else np.asarray(p)
        if a.dtype.kind != "f":
            raise TypeError(
                f"params[{k}] has dtype {a.dtype}: parameters must be floating-point arrays "
                "(float32 or float64)"
            )
        out.append(a)
    return single, tuple(out)


def _data(data, da):
    if not data:
        raise ValueError("tape.distributed.value_and_grad: no data; pass Dask arrays after params")
    out = []
    for k, a in enumerate(data):
        if not isinstance(a, da.Array):
            raise TypeError(
                f"data[{k}] is a {type(a).__name__}, not a Dask array: wrap it, for example "
                "dask.array.from_array(x, chunks=(rows_per_chunk, ...))"
            )
        if a.ndim == 0:
            raise ValueError(f"data[{k}] is 0-d: data need a first axis of data points")
        if any(np.isnan(c) for cs in a.chunks for c in cs):
            raise ValueError(
                f"data[{k}] has unknown chunk sizes: call .compute_chunk_sizes() on it first"
            )
        if a.ndim > 1 and any(n > 1 for n in a.numblocks[1:]):
            a = a.rechunk({ax: -1 for ax in range(1, a.ndim)})
        out.append(a)
    rows = out[0].shape[0]
    for k, a in enumerate(out[1:], 1):
        if a.shape[0] != rows:
            raise ValueError(
                f"data[{k}] has {a.shape[0]} rows, data[0] has {rows}: every data array "
                "holds one row per data point"
            )
        if a.chunks[0] != out[0].chunks[0]:
            out[k] = a.rechunk({0: out[0].chunks[0]})
    if rows == 0:
        raise ValueError("tape.distributed.value_and_grad: the data have no rows")
    return out


def value_and_grad(fn, params, *data, client=None, n_workers=None, compile="auto", split_every=8):
    """Sum over data chunks of ``fn(*params, *chunks)`` and its gradient, on a Dask cluster.

    Parameters
    ----------
    fn : callable
        ``fn(*params, *chunks)`` returns the (scalar) objective of one chunk of rows, written
        with tape operations; recorded on each worker once per chunk shape.
    params : array_like or tuple of array_like
        Floating-point parameters (NumPy arrays, tape tensors), differentiated.
    *data : dask.array.Array
        Data with one row per data point, chunked along the first axis (see the module notes
        for rechunking). Not differentiated.
    client : distributed.Client, optional
        Runs the computation. Default: :func:`get_client` (the default client, or a
        ``LocalCluster`` of processes on this machine).
    n_workers : int, optional
        Workers of the ``LocalCluster`` used when ``client`` is None.
    compile : {"auto", True, False}
        Passed to :func:`tape.record` on the workers (the compiled tier).
    split_every : int
        Partial results summed per reduction task.

    Returns
    -------
    value : numpy scalar
        In the dtype ``fn`` returns.
    grads : tuple of numpy.ndarray
        One summed gradient per parameter, in its dtype (a single array if ``params`` was a
        single array).
    """
    single = not isinstance(params, (tuple, list))
    value, grads = _run(fn, params, data, client, n_workers, compile, split_every, "grad", None)
    return value, (grads[0] if single else grads)


def hvp(fn, params, v, *data, client=None, n_workers=None, split_every=8):
    """Sum over data chunks of the Hessian of ``fn(*params, *chunk)`` times ``v``, on a Dask
    cluster: the Hessian-vector product of :func:`value_and_grad`'s objective, for
    Newton-CG on data that do not fit one machine.

    ``v`` is structured like ``params`` (one array per parameter, or a single array); the
    result too, in each parameter's dtype. The workers run forward-over-reverse on the tapes
    :func:`value_and_grad` recorded (the interpreter's derivative sweeps). Other arguments as
    in :func:`value_and_grad`."""
    single, ps = _params(params)
    vs = _like_params(v, ps, single, "v")
    _, out = _run(fn, params, data, client, n_workers, "auto", split_every, "hvp", vs)
    return out[0] if single else out


def gauss_newton(fn, params, *data, v=None, client=None, n_workers=None, split_every=8):
    """The Gauss-Newton pieces of a least-squares objective over data chunks, on a Dask
    cluster: ``fn(*params, *chunk)`` returns the residuals ``r`` of one chunk (any shape), the
    objective is ``0.5 * sum(r**2)`` over all chunks, and ``J`` is the Jacobian of all
    residuals with respect to the params.

    Returns ``(cost, JTr)``, or ``(cost, JTr, JTJv)`` when ``v`` (structured like ``params``)
    is given: ``JTr = J^T r`` (the gradient of the cost) and ``JTJv = J^T J v``, each
    structured like ``params``. With ``JTJv`` as the product of a linear operator, conjugate
    gradients give the Gauss-Newton step without forming ``J^T J``. Each chunk costs one
    forward, one reverse and, with ``v``, one tangent and one more reverse sweep."""
    single, ps = _params(params)
    vs = None if v is None else _like_params(v, ps, single, "v")
    value, out = _run(fn, params, data, client, n_workers, "auto", split_every, "gn", vs)
    if single:
        return (value, out[0]) if v is None else (value, out[0], out[1])
    k = len(ps)
    return (value, out[:k]) if v is None else (value, out[:k], out[k:])


def _like_params(v, ps, single, name):
    """``v`` as one float64 array per parameter, each of that parameter's shape."""
    seq = [v] if single else list(v) if isinstance(v, (tuple, list)) else None
    if seq is None or len(seq) != len(ps):
        raise TypeError(
            f"{name} must be structured like params: {len(ps)} array(s), got {type(v).__name__}"
        )
    out = []
    for k, (a, p) in enumerate(zip(seq, ps)):
        a = np.asarray(a.numpy() if hasattr(a, "numpy") else a, np.float64)
        if a.shape != p.shape:
            raise ValueError(f"{name}[{k}] has shape {a.shape}, params[{k}] has {p.shape}")
        out.append(a.astype(p.dtype, copy=False))
    return tuple(out)


def _run(fn, params, data, client, n_workers, compile, split_every, what, v):
    """The graph of one call (a task per chunk, a tree of sums), computed: ``(value, out)``
    with ``out`` structured like ``params`` (``"gn"`` with ``v``: two such, concatenated)."""
    dask, da, _ = _dask()
    if not callable(fn):
        raise TypeError(f"tape.distributed: fn must be callable, got {fn!r}")
    if compile not in ("auto", True, False):
        raise ValueError(f"compile must be 'auto', True or False, got {compile!r}")
    split_every = int(split_every)
    if split_every < 2:
        raise ValueError(f"split_every must be at least 2, got {split_every}")
    single, ps = _params(params)
    arrays = _data(data, da)
    if client is None:
        client = get_client(n_workers)
    token, fn_future = _ship(client, fn)

    blocks = [a.to_delayed().ravel().tolist() for a in arrays]
    sizes = arrays[0].chunks[0]
    # fresh keys at every call (pure=False): with content-derived keys, a call repeating the
    # previous one could be answered from results the scheduler had not yet released, and a
    # timing loop would measure nothing
    p = dask.delayed(ps, pure=False)  # one key: sent once to each worker that needs it
    task = dask.delayed(_chunk_task, pure=False)
    vd = dask.delayed(v, pure=False) if v is not None else None
    parts = [
        task(fn_future, token, compile, what, p, vd, *[b[i] for b in blocks])
        for i in range(len(sizes))
        if sizes[i] > 0
    ]
    reduce = dask.delayed(_sum_parts, pure=False)
    while len(parts) > 1:
        parts = [reduce(parts[i : i + split_every]) for i in range(0, len(parts), split_every)]
    value, grads, out_dtype = client.compute(parts[0]).result()
    value = np.asarray(value).astype(np.dtype(out_dtype))[()]
    # one array per parameter (two per parameter for "gn" with v: J^T r, then J^T J v)
    return value, tuple(g.astype(p_.dtype, copy=False) for g, p_ in zip(grads, ps * 2))


def worker_stats(client=None):
    """``{worker address: counters}`` of each worker's tape cache: ``records`` (tapes
    recorded), ``replays`` (chunks evaluated), ``fallbacks`` (chunks recorded afresh after a
    ``GuardError``), ``retraces`` (guard retraces of the cached tapes), ``tapes`` (cached),
    ``shapes`` (argument shapes of each cached tape), ``functions`` (distinct function objects
    seen: one per shipped function), ``replay_seconds`` (time spent evaluating chunks,
    recordings included: the rest of a call's time is Dask's)."""
    _dask()
    return (client or get_client()).run(_worker_stats)


def clear(client=None):
    """Drop every worker's cached tapes (the counters stay)."""
    _dask()
    (client or get_client()).run(_worker_clear)
