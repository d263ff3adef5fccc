"""How far apart a replica sends one stream's items (`raygate.backends.cluster.routing.replica.spacing`): the
model's `stream_interval_ms` per stream, stretched with the streams the replica serves, so its Ray
items per second in all stay near one per interval, within `MAX_SPACING_S`."""

from __future__ import annotations

import pytest

from raygate.backends.cluster.routing.replica import MAX_SPACING_S, spacing


def test_off_stays_off_however_many_streams() -> None:
    assert spacing(0.0, 1) == spacing(0.0, 16) == 0.0


@pytest.mark.parametrize(("streams", "expected"), [(0, 0.05), (1, 0.05), (2, 0.1), (4, 0.2)])
def test_the_interval_grows_with_the_streams(streams: int, expected: float) -> None:
    assert spacing(0.05, streams) == pytest.approx(expected)


def test_never_past_the_cap_nor_below_a_longer_interval() -> None:
    assert spacing(0.05, 8) == spacing(0.05, 64) == MAX_SPACING_S
    assert spacing(0.5, 1) == spacing(0.5, 8) == 0.5
