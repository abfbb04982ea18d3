import os

import _background
import _compile_time
import numpy as np
import pytest

# no compile helper processes (tape.interpreter.dispatch.prepare): the second core runs the background
# simulator suites; tests that check the helpers set this themselves
os.environ.setdefault("TAPE_COMPILE_WORKERS", "0")
_compile_time.install()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def pytest_collection_modifyitems(config, items):
    # files that run in a subprocess on the second core (tests/test_background_files.py)
    files = _background.background_files(items)
    if files:
        moved = [it for it in items if it.path.name in files]
        if moved:
            config.hook.pytest_deselected(items=moved)
            items[:] = [it for it in items if it.path.name not in files]
    # tests whose kernels other tests compile anyway: after them, so they load them
    late = [it for it in items if it.get_closest_marker("late") is not None]
    if late:
        ids = {id(it) for it in late}
        items[:] = [it for it in items if id(it) not in ids] + late
    _background.order(items)


def pytest_collection_finish(session):
    if not session.config.option.collectonly:
        _background.start(session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _compile_time.begin(item.nodeid)
    try:
        return (yield)
    finally:
        _compile_time.end()


def pytest_terminal_summary(terminalreporter):
    _compile_time.report(terminalreporter.write_line)
    _background.report(terminalreporter.write_line)


def pytest_sessionfinish(session, exitstatus):
    _background.stop()
