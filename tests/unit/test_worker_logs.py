"""The replicas' output followed by the gateway itself (`worker_logs.py`), on real files written
as Ray writes a worker's output."""

from __future__ import annotations

import io
from pathlib import Path

from raygate.backends.cluster.runtime.worker_logs import WorkerLogs

WORKER = "worker-0a1b2c-01000000-4242"


def _follow(tmp_path: Path) -> tuple[WorkerLogs, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return WorkerLogs(tmp_path, stdout=out, stderr=err), out, err


def test_a_workers_lines_are_printed_with_its_actor_name_and_pid_and_the_markers_are_not(tmp_path: Path):
    (tmp_path / f"{WORKER}.err").write_text("written before the gateway started\n")
    logs, out, err = _follow(tmp_path)
    logs.start()
    try:
        with (tmp_path / f"{WORKER}.err").open("a") as f:
            f.write(":job_id:01000000\n:actor_name:ModelWorker\nloading the model\nhalf a li")
        with (tmp_path / f"{WORKER}.out").open("w") as f:
            f.write(":actor_name:ModelWorker\nprinted\n")
        logs.poll()
        assert err.getvalue() == "(ModelWorker pid=4242) loading the model\n"
        assert out.getvalue() == "(ModelWorker pid=4242) printed\n"
        with (tmp_path / f"{WORKER}.err").open("a") as f:
            f.write("ne\n")
        logs.poll()
        assert err.getvalue().splitlines()[-1] == "(ModelWorker pid=4242) half a line"
    finally:
        logs.stop()


def test_the_raylets_errors_and_undecodable_bytes_come_through_and_other_files_do_not(tmp_path: Path):
    logs, out, err = _follow(tmp_path)
    logs.start()
    try:
        (tmp_path / "raylet.err").write_bytes(b"a crash \xff here\n")
        (tmp_path / "python-core-worker-0a1b2c_4242.log").write_text("core worker chatter\n")
        (tmp_path / "dashboard_agent.log").write_text("agent chatter\n")
        logs.poll()
        assert err.getvalue() == "(raylet) a crash \ufffd here\n"
        assert out.getvalue() == ""
    finally:
        logs.stop()


def test_stop_prints_what_was_written_last(tmp_path: Path):
    logs, out, _ = _follow(tmp_path)
    logs.start()
    (tmp_path / f"{WORKER}.out").write_text("last words\n")
    logs.stop()
    assert out.getvalue() == "(pid=4242) last words\n"
