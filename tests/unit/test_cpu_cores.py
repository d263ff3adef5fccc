"""`n_threads: auto`'s core count (`backends/engines/cpu_cores.py`) against cgroup files written
here, as a container with a CPU limit shows them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raygate.backends.engines.cpu_cores import cpu_quota, thread_count, usable_cores


def test_cgroup_v2_quota_in_cores(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota(tmp_path) == 1.5


def test_cgroup_v2_unlimited(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(tmp_path) is None


def test_cgroup_v1_quota_and_unlimited(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    assert cpu_quota(tmp_path) == 2.0
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(tmp_path) is None


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cpu_quota(tmp_path) is None
    assert usable_cores(tmp_path) == len(os.sched_getaffinity(0))


def test_a_quota_caps_the_affinity_and_rounds_up(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core: still one thread
    assert usable_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("100000000 100000\n")  # 1000 cores: the affinity decides
    assert usable_cores(tmp_path) == len(os.sched_getaffinity(0))


def test_thread_settings_as_numbers(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert thread_count("auto", tmp_path) == cores
    assert thread_count("auto-1", tmp_path) == max(1, cores - 1)
    assert thread_count("auto-99", tmp_path) == 1  # never below one thread
    (tmp_path / "cpu.max").write_text("300000 100000\n")  # a quota of 3 cores caps `auto` first
    assert thread_count("auto-1", tmp_path) == max(1, min(cores, 3) - 1)
    assert thread_count(4, tmp_path) == 4
    assert thread_count("4", tmp_path) == 4  # a command line's `--engine n_threads=4`


@pytest.mark.parametrize("bad", ["all", "auto+1", "auto-", "-1"])
def test_a_thread_setting_that_is_none_of_them_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="auto-N"):
        thread_count(bad)
