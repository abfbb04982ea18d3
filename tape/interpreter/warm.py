"""Compiled code built in parallel, in helper processes.

Numba compiles one function at a time per process (it holds the GIL and a lock of its own), so
when a process needs functions that Numba's cache lacks (op kernels of the interpreter, fused
loops of the compiled tier), helper processes (Python running :func:`serve`, through
``tape.interpreter.dispatch.serve_helper``) compile some of them into the cache meanwhile, and the
process loads them from there:

- :func:`compile_all` (used by :func:`tape.interpreter.dispatch.prepare` for op kernels and by
  :func:`tape.compiled.compile_tape` for fused loops) hands the rest of a list to the helpers
  as soon as one item of it turns out to be missing from the cache, and works through the
  list itself from the other end;
- when the first use of an op in eager mode (or in a recording) compiled its forward kernel,
  the op's reverse kernel goes to a helper at once, before any ``backward()`` asks for it, so
  that it is ready, or under way, when the reverse sweep needs it (:data:`SPECULATE`).

A job is one line of text: ``op DTYPE KIND:CODE[:CLASS]`` (an op kernel, :func:`op_job`), or a kind
that another layer registers (:func:`register`): the compiled tier's ``unit DTYPE REV PATH``
(the fused loop of a unit module file, :func:`unit_job`) and ``runtime DTYPE ARGS``. A file
lock per job (``fcntl.flock`` on one file per op kernel, all dtypes, or per unit module, in a
directory of the system's temporary directory) keeps two processes from compiling the same
function at once (per Numba cache: the locks of processes with another ``NUMBA_CACHE_DIR``
are apart): Numba's cache keeps one index per function, and two processes that write
two signatures of one function (its float64 and float32 kernels) at the same moment could
pair an index entry with the other's data. A process that finds a job locked goes on with the
rest of its list and comes back to it, by then a load from the cache; a helper skips it.

Helpers read their jobs from their standard input, one per line, and exit at its end (their
parent exited) or after :data:`IDLE_S` seconds without work. ``TAPE_COMPILE_WORKERS`` sets
how many a process may start (``0``: none; default one fewer than the CPUs, at most 4). Where
``fcntl`` is missing (Windows) no helper starts.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no helpers, nothing to lock against
    fcntl = None

IDLE_S = 60.0
"""A helper exits after this many seconds without work (it holds a few hundred MB once it
has compiled)."""

SPECULATE = {0: (1,)}
"""Sweep kinds whose kernel a helper compiles as soon as the op's kernel of another kind was
compiled cold: the reverse kernel (1) after the forward one (0)."""


def compile_helpers() -> int:
    """How many helper processes a process may start: ``$TAPE_COMPILE_WORKERS`` if set
    (``0``: none), else one fewer than the CPUs, at most 4; none without ``fcntl``."""
    if fcntl is None:  # pragma: no cover
        return 0
    v = os.environ.get("TAPE_COMPILE_WORKERS")
    if v is not None:
        try:
            return max(0, int(v))
        except ValueError:
            return 0
    return max(0, min(4, (os.cpu_count() or 1) - 1))


# ---------------------------------------------------------------- jobs and their locks


def op_job(kind, code, dtype, cls=None) -> str:
    """The job of op ``code``'s kernel of sweep ``kind`` for arenas of ``dtype``: its
    general kernel, or the one generated for entry class ``cls``."""
    tail = "" if cls is None else f":{int(cls)}"
    return f"op {np.dtype(dtype).name} {int(kind)}:{int(code)}{tail}"


def unit_job(path, rev, dtype) -> str:
    """The job of the fused loop ``unit`` of the unit module at ``path``, forward or reverse
    (``rev``), for arenas of ``dtype``."""
    return f"unit {np.dtype(dtype).name} {int(bool(rev))} {path}"


def _lock_name(job) -> str:
    what, dtype, rest = job.split(" ", 2)
    if what == "op":  # every dtype of one kernel: one function, one cache index
        return "op-" + rest.replace(":", "-")
    if what == "unit":
        return "unit-" + Path(rest.split(" ", 1)[1]).stem
    return what  # one function per kind of job (the runtime's gradient): every signature


HANDLERS: dict = {}
"""Builders of other kinds of job, ``what -> build(dtype, rest)``, registered by the modules
that make them (:func:`register`); a helper process finds them once ``tape`` is imported."""


def register(what, build):
    """Let helpers build jobs ``what DTYPE REST`` with ``build(dtype, rest)``."""
    HANDLERS[what] = build


def locked(job, fn, wait=True):
    """``fn()`` under ``job``'s lock, waiting for another process that holds it (``wait``) or
    returning ``None`` at once, without calling ``fn``."""
    return _locked(job, lambda _: fn(), None, wait=wait)


def _lock_dir() -> Path:
    """The locks of the processes that share this process's Numba cache (one directory per
    ``NUMBA_CACHE_DIR``): processes with caches of their own never wait for each other."""
    cache = hashlib.sha256(os.environ.get("NUMBA_CACHE_DIR", "").encode()).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    d = Path(tempfile.gettempdir()) / f"tape-{uid}-locks" / cache
    d.mkdir(parents=True, exist_ok=True)
    return d


class JobLock:
    """The lock of ``job``, shared by every process of this user on this machine.
    ``try_acquire()`` does not wait; ``acquire()`` does; ``release()`` frees it (the end of
    the process frees it too). Where locks cannot be taken (no ``fcntl``, no writable
    temporary directory, a file system without locks) every call succeeds at once."""

    def __init__(self, job):
        self.name = _lock_name(job) + ".lock"
        self._fd = None

    def _open(self):
        if fcntl is None:  # pragma: no cover
            return None
        try:
            return os.open(_lock_dir() / self.name, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None

    def try_acquire(self) -> bool:
        fd = self._open()
        if fd is None:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process holds it
            os.close(fd)
            return False
        except OSError:  # a file system without locks: go on unlocked
            os.close(fd)
            return True
        self._fd = fd
        return True

    def acquire(self):
        fd = self._open()
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: go on unlocked
            os.close(fd)
            return
        self._fd = fd

    def release(self):
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops its lock
            self._fd = None


def _locked(job, fn, item, wait):
    """``fn(item)`` under ``job``'s lock; ``None`` (and no call) if another process holds it
    and ``wait`` is false."""
    lock = JobLock(job)
    if wait:
        lock.acquire()
    elif not lock.try_acquire():
        return None
    try:
        return fn(item)
    finally:
        lock.release()


def compile_all(items, job_of, build, after=None, meanwhile=None):
    """``build(item)`` (compile or load from Numba's cache; returns whether Numba compiled)
    for each of ``items``, each under its job's lock (``job_of(item)``). Once one item
    compiled and two or more remain (or one, if a helper runs or there is ``meanwhile``
    work), the rest go to the helpers and this process takes the list from its end. Items a helper was given before come last (they may
    be in the cache by then), and items another process holds are waited for at the end;
    ``meanwhile()`` runs as soon as items go to helpers, or before that wait. ``after(item)``
    runs after each item that compiled."""
    mine = deque(x for x in items if job_of(x) not in _sent)
    theirs = [x for x in items if job_of(x) in _sent]
    busy, handed = [], False
    while mine:
        x = mine.pop() if handed else mine.popleft()
        compiled = _locked(job_of(x), build, x, wait=False)
        if compiled is None:  # another process compiles it: come back to it
            busy.append(x)
            continue
        if not compiled:
            continue
        if not handed and mine and (len(mine) >= 2 or meanwhile is not None or active()):
            handed = submit([job_of(y) for y in mine])
            if handed and meanwhile is not None:  # other work first, while helpers start
                meanwhile()
                meanwhile = None
        if after is not None:
            after(x)
    if meanwhile is not None and (theirs or busy):
        meanwhile()
    for x in reversed(theirs):  # built here unless a helper is at it (it works from the front)
        if _locked(job_of(x), build, x, wait=False) is None:
            busy.append(x)
    for x in busy:  # by now in Numba's cache, or being written there
        _locked(job_of(x), build, x, wait=True)


# ---------------------------------------------------------------- the helpers of this process

_helpers: list = []  # the Popen objects of this process's helpers
_sent: set = set()  # the jobs handed to a helper
_next = [0]  # round robin over the helpers
_guard = threading.Lock()


def _alive():
    global _helpers
    _helpers = [p for p in _helpers if p.poll() is None]
    return _helpers


def _start():
    env = dict(os.environ, TAPE_COMPILE_WORKERS="0")
    try:
        p = subprocess.Popen(
            [sys.executable, "-c", "from tape.interpreter.dispatch import serve_helper; serve_helper()"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    except OSError:  # no process to spare: this one compiles everything
        return None
    _helpers.append(p)
    return p


def active() -> bool:
    """Whether a helper of this process is running."""
    with _guard:
        return bool(_alive())


def handed(job) -> bool:
    """Whether ``job`` was handed to a helper of this process."""
    return job in _sent


def submit(jobs) -> bool:
    """Hand ``jobs`` to the helpers, starting them as needed. Returns whether any helper
    took work (``False`` when helpers are off)."""
    n = compile_helpers()
    if n <= 0:
        return False
    todo = [j for j in dict.fromkeys(jobs) if j not in _sent]
    if not todo:
        return True
    with _guard:
        live = _alive()
        while len(live) < min(n, len(todo)):
            if _start() is None:
                break
            live = _helpers
        if not live:
            return False
        for job in todo:
            for _ in range(len(live)):
                p = live[_next[0] % len(live)]
                _next[0] += 1
                try:
                    p.stdin.write(f"{job}\n".encode())
                    p.stdin.flush()
                except (OSError, ValueError):  # it exited (idle): the next one
                    continue
                _sent.add(job)
                break
    return True


def drain(timeout=600.0):
    """Close the helpers' input and wait until they have done their jobs and exited."""
    with _guard:
        for p in _helpers:
            try:
                p.stdin.close()
            except OSError:  # pragma: no cover
                pass
        for p in _helpers:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:  # pragma: no cover
                p.kill()
        _helpers.clear()
        _sent.clear()


def _close_at_exit():
    # end of input: each helper finishes the job it is at and exits
    for p in _helpers:
        try:
            p.stdin.close()
        except OSError:  # pragma: no cover
            pass


atexit.register(_close_at_exit)


# ---------------------------------------------------------------- the helper process


def _lines(fd, idle):
    """Lines of ``fd`` until its end, or until ``idle`` seconds pass without one."""
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()
        ready, _, _ = select.select([fd], [], [], idle)
        if not ready:
            return
        chunk = os.read(fd, 4096)
        if not chunk:
            return
        buf += chunk


def _die_with_parent(every=0.2):
    """End this helper when its parent process ends, even in the middle of a compile (a
    thread watches the parent's id). A helper that went on compiling for a process that has
    exited would take a core from whatever runs next; Numba writes a cache entry's index
    last, so a compile cut short leaves no entry behind."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(0)

    threading.Thread(target=watch, name="tape-helper-watch", daemon=True).start()


def serve(build, fd=0, idle=IDLE_S):
    """The helper's loop: ``build[what](dtype, rest)`` for each job ``what dtype rest`` read
    from ``fd`` (compiling into Numba's cache), unless another process holds the job's lock
    (that process builds it)."""
    _die_with_parent()
    for job in _lines(fd, idle):
        try:
            what, dtype, rest = job.split(" ", 2)
            fn = build[what]
        except (ValueError, KeyError):
            continue
        try:
            _locked(job, lambda _: fn(dtype, rest), None, wait=False)
        except Exception:  # noqa: BLE001  (the process that needs it compiles it, and reports)
            pass
