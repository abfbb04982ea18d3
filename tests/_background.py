"""Slow subprocess suites (the CUDA simulator runs) on the machine's second core.

A test module registers a job with :func:`register` when it is imported: the command, the
environment it adds, a timeout, and which collected tests need its result. When collection
ends, ``conftest.py`` moves those tests to the end of the run and starts one background
thread that runs the wanted jobs one after another, so the main pytest process works through
every other test meanwhile. A test that needs a job calls :func:`result`, which waits for it;
while it would wait, it runs the next job nobody has started yet itself, so once the main
process is through its own tests both cores drain the queue.

Each job runs with a core to itself (the main process takes a job only when it has nothing
else to do), which keeps each job's timeout meaningful on a two-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Job:
    key: str
    args: list
    env_extra: dict
    timeout: float
    wanted: object  # item -> bool
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None  # subprocess.CompletedProcess, or the exception it raised
    proc: object = None
    claimed: bool = False  # a thread has taken it (under _LOCK)
    seconds: float = 0.0  # how long it ran


_JOBS: dict[str, Job] = {}
_ORDER: list[Job] = []
_LOCK = threading.Lock()
_STOP = threading.Event()


def register(key, args, env_extra, timeout, wanted):
    """Declare job ``key``: ``python *args`` in the project root with ``env_extra`` added
    to the environment, killed after ``timeout`` seconds; ``wanted(item)`` says whether a
    collected test item needs it. Registering a key twice keeps the first."""
    _JOBS.setdefault(key, Job(key, list(args), dict(env_extra), float(timeout), wanted))


def register_simulator_suite(key, path, test_name, timeout=2400):
    """Job ``key``: pytest on the test file ``path`` with Numba's CUDA simulator on, wanted by
    the test named ``test_name`` (which checks its result)."""
    register(
        key,
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(path)],
        {"NUMBA_ENABLE_CUDASIM": "1"},
        timeout,
        wanted=lambda item: item.name == test_name,
    )


def test_file_key(name):
    """The job key of test file ``name`` run in the background."""
    return f"file:{name}"


def register_test_file(name, test_name, timeout=2400):
    """Job: pytest on ``tests/<name>`` alone, wanted by the parametrized test ``test_name``
    whose parameter is ``name`` (``tests/test_background_files.py``)."""
    register(
        test_file_key(name),
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"tests/{name}"],
        {BACKGROUND_RUN: name},
        timeout,
        wanted=lambda item: item.originalname == test_name and f"[{name}]" in item.name,
    )


BACKGROUND_RUN = "TAPE_TESTS_BACKGROUND_RUN"
"""Set in a background run of a test file (to the file's name)."""


def background_files(items):
    """The files whose tests the main process leaves to a background run: those registered
    with :func:`register_test_file` whose waiting test is collected too (not in a background
    run itself)."""
    if os.environ.get(BACKGROUND_RUN):
        return set()
    keys = {j.key for it in items for j in _wanted(it)}
    return {k.split(":", 1)[1] for k in keys if k.startswith("file:")}


def _wanted(item):
    return [j for j in _JOBS.values() if j.wanted(item)]


def _skipped(item):
    """Whether a ``skipif`` with a plain boolean condition skips the item."""
    for m in item.iter_markers("skipif"):
        if m.args and m.args[0] is True:
            return True
    return next(item.iter_markers("skip"), None) is not None


def order(items):
    """Move the tests that wait for a job to the end, keeping their order."""
    late = [it for it in items if _wanted(it)]
    if late:
        ids = {id(it) for it in late}
        items[:] = [it for it in items if id(it) not in ids] + late


def start(items):
    """Start the jobs that some collected, not statically skipped item wants."""
    todo = []
    for it in items:
        if _skipped(it):
            continue
        for j in _wanted(it):
            if j not in todo:
                todo.append(j)
    if not todo:
        return
    _ORDER[:] = todo
    threading.Thread(target=_run_all, args=(todo,), name="tests-background", daemon=True).start()


def _run_one(job):
    t0 = time.perf_counter()
    try:
        _run_job(job)
    finally:
        job.seconds = time.perf_counter() - t0
        job.done.set()


def _run_job(job):
    env = dict(os.environ, **job.env_extra)
    env.pop("PYTEST_ADDOPTS", None)
    try:
        with _LOCK:
            if _STOP.is_set():
                raise RuntimeError("the test session ended before this job started")
            job.proc = subprocess.Popen(
                [sys.executable, *job.args], cwd=ROOT, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        try:
            out, err = job.proc.communicate(timeout=job.timeout)
        except subprocess.TimeoutExpired:
            job.proc.kill()
            out, err = job.proc.communicate()
            raise subprocess.TimeoutExpired(job.args, job.timeout, out, err) from None
        job.result = subprocess.CompletedProcess(job.args, job.proc.returncode, out, err)
    except BaseException as e:  # noqa: BLE001  (handed to the test that waits for it)
        job.result = e


def _claim(job):
    """Take ``job`` for this thread; False if another thread has it."""
    with _LOCK:
        if job.claimed:
            return False
        job.claimed = True
        return True


def _run_all(jobs):
    for job in jobs:
        if _claim(job):
            _run_one(job)


def result(key):
    """The finished job ``key`` as a ``subprocess.CompletedProcess`` (waits for it). Runs it
    here and now if it was not started in the background (a test selected by hand)."""
    job = _JOBS[key]
    if job not in _ORDER:
        _ORDER.append(job)
    while not job.done.is_set():
        # this job if nobody runs it yet, else the next one nobody runs: the main process has
        # nothing else to do, so its core takes work off the background thread's queue
        todo = [job] + [j for j in _ORDER if j is not job]
        mine = next((j for j in todo if _claim(j)), None)
        if mine is None:
            job.done.wait()
            break
        _run_one(mine)
    if isinstance(job.result, BaseException):
        raise job.result
    return job.result


def report(write):
    """One line: how long each background job that ran took."""
    ran = [j for j in _ORDER if j.done.is_set()]
    if ran:
        write("Background jobs: " + ", ".join(f"{j.key} {j.seconds:.0f} s" for j in ran))


def stop():
    """Kill what still runs (the session is over)."""
    with _LOCK:
        _STOP.set()
        for job in _ORDER:
            if job.proc is not None and job.proc.poll() is None:
                job.proc.kill()
