"""The fast layer (`make unit`): no Ray cluster, no model, no gateway process.

Everything under tests/unit is marked `unit`. The session fixtures that start Ray and gateways
(`ray_address`, `gateway`, ...) live in tests/e2e/conftest.py, out of reach from here; a real
engine in-process belongs in tests/engine. Importing `ray.exceptions` is fine; `ray.init()` is not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.unit)
