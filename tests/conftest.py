import _background
import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def pytest_collection_modifyitems(config, items):
    _background.order(items)


def pytest_collection_finish(session):
    if not session.config.option.collectonly:
        _background.start(session.items)


def pytest_sessionfinish(session, exitstatus):
    _background.stop()
