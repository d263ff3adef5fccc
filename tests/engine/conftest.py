"""The engine tier (`make engine`): a real engine in this process (llama.cpp through the batched
and one-sequence engines, or its vocabulary and grammar sampler), with no Ray cluster and no
gateway; a few minutes on 2 cores. The fixtures of tests/e2e/conftest.py are out of reach here.
Everything under tests/engine is marked `engine`."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.engine)
