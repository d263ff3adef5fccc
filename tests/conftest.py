"""Hooks for every tier (tests/unit, tests/engine, tests/e2e); each tier's conftest holds its own
fixtures, so a faster tier cannot ask for a slower one's (tests/e2e/conftest.py's Ray cluster and
gateways are out of reach from tests/unit and tests/engine).

Shared helpers live in tests/support, and the tests run against more than one backend in
tests/support/suites: their `assert`s are rewritten like a test module's, so a failure there
reports its values too."""

from __future__ import annotations

import gc
import os
from collections.abc import Generator

import pytest

pytest.register_assert_rewrite("tests.support")

from tests.support import postmortem  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """`RAYGATE_TEST_GC=1`: collect garbage after every test, so that a client or socket left
    unclosed fails the test that left it (`filterwarnings = error` turns its ResourceWarning
    into an error), not whichever test runs when the collector does. Off by default: a full
    collection costs ~0.4 s a test here."""
    yield
    if os.environ.get("RAYGATE_TEST_GC") == "1":
        gc.collect()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """For `make test`'s post-mortem, should this process die in the test."""
    postmortem.record(test=nodeid)
