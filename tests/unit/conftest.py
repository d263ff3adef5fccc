"""The fast layer (`make unit`): no Ray cluster, no model, no gateway process.

Everything under tests/unit is marked `unit`. Nothing here may request the session fixtures of
tests/conftest.py (`ray_address`, `gateway`, ...): they are lazy, so simply not asking keeps Ray
unstarted. Importing `ray.exceptions` is fine; `ray.init()` is not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.unit)
