"""backends/cluster/stores/batch_db.py (with file_db.py and batch_lines.py): files per owner and
quota, batch validation, leases (a lapsed claim runs elsewhere, a finished line never runs again,
a result from a lost lease is dropped), one retry of a server error, completion with OpenAI's
output and error lines, expiry keeping what finished, cancel, and all of it surviving a reopen of
the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygate.backends.cluster.stores.batch_db import BatchDB
from raygate.backends.cluster.stores.batch_lines import LineResult
from raygate.backends.cluster.stores.file_db import QuotaExceededError
from raygate.protocol.batches import BatchOutputLine, CreateBatchRequest, parse_batch_lines
from raygate.protocol.errors import BadRequestError
from raygate.protocol.files import NoSuchFileError

CHAT = "/v1/chat/completions"
QUOTA = 1 << 20
T0 = 1_000_000.0


def jsonl(n: int, url: str = CHAT) -> bytes:
    lines = [
        {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": {"model": "m", "messages": []}}
        for i in range(n)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def ok(i: int) -> LineResult:
    return LineResult(200, f"r{i}", {"id": f"chatcmpl-{i}", "object": "chat.completion"})


def new_batch(db: BatchDB, n: int, owner: str = "alice", now: float = T0) -> str:
    f = db.put_file(owner, "in.jsonl", "batch", jsonl(n), QUOTA, now=now)
    request = CreateBatchRequest(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    batch = db.create_batch(owner, request, now=now)
    assert batch.status == "in_progress", batch.errors
    return batch.id


def output_lines(db: BatchDB, file_id: str | None, owner: str = "alice") -> list[BatchOutputLine]:
    assert file_id is not None
    content = db.file_content(file_id, owner)
    assert content is not None
    return [BatchOutputLine.model_validate_json(line) for line in content.decode().splitlines()]


@pytest.fixture
def db(tmp_path: Path) -> BatchDB:
    return BatchDB(tmp_path / "batches.sqlite3", window_s=3600)


def test_files_belong_to_their_owner_and_count_against_its_quota(db: BatchDB) -> None:
    f = db.put_file("alice", "a.jsonl", "batch", b"x" * 600, 1000)
    assert db.get_file(f.id, "alice") == f
    assert db.get_file(f.id, "bob") is None
    assert db.file_content(f.id, "bob") is None
    assert db.list_files("bob", None, None, 100, "desc") == ([], False)
    with pytest.raises(QuotaExceededError):
        db.put_file("alice", "b.jsonl", "batch", b"x" * 600, 1000)
    db.put_file("bob", "b.jsonl", "batch", b"x" * 600, 1000)  # bob's quota is his own
    assert not db.delete_file(f.id, "bob")
    assert db.delete_file(f.id, "alice")
    db.put_file("alice", "b.jsonl", "batch", b"x" * 600, 1000)  # the space is free again


def test_file_list_pages_newest_first(db: BatchDB) -> None:
    ids = [db.put_file("a", f"{i}.jsonl", "batch", b"{}", QUOTA, now=T0 + i).id for i in range(5)]
    page, more = db.list_files("a", None, None, 2, "desc")
    assert [f.id for f in page] == ids[:2:-1] and more
    page, more = db.list_files("a", None, page[-1].id, 10, "desc")
    assert [f.id for f in page] == ids[2::-1] and not more
    page, _ = db.list_files("a", "batch_output", None, 10, "asc")
    assert page == []


def test_parse_names_each_bad_line() -> None:
    content = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\nnot json\n\n'
    content += b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
    content += b'{"custom_id": "b", "method": "GET", "url": "/v1/embeddings", "body": {}}\n'
    content += b'{"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}, "extra": 1}\n'
    lines, errors = parse_batch_lines(content)
    assert [e.line for e in errors] == [2, 4, 5, 6]
    assert errors[0].message == "The line is not valid JSON."
    assert errors[1].code == "duplicate_custom_id"
    assert "method" in errors[2].message
    assert "extra" in errors[3].message
    assert [line.custom_id for line in lines] == ["a", "a"]


def test_a_batch_over_lines_for_another_endpoint_fails_validation(db: BatchDB) -> None:
    f = db.put_file("alice", "in.jsonl", "batch", jsonl(3, "/v1/embeddings"), QUOTA)
    request = CreateBatchRequest(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    batch = db.create_batch("alice", request)
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [("mismatched_url", n) for n in (1, 2, 3)]
    assert db.claim("r", 10, 30) == []
    with pytest.raises(NoSuchFileError):
        db.create_batch("bob", request)  # another owner's file is unknown
    out = db.put_file("alice", "o.jsonl", "batch_output", b"{}", QUOTA)
    with pytest.raises(BadRequestError):
        db.create_batch("alice", request.model_copy(update={"input_file_id": out.id}))


def test_lines_complete_once_each_with_outputs_and_errors_in_order(db: BatchDB) -> None:
    batch_id = new_batch(db, 4)
    claimed = db.claim("r1", 10, 30, now=T0)
    assert [line.custom_id for line in claimed] == ["req-0", "req-1", "req-2", "req-3"]
    assert db.claim("r2", 10, 30, now=T0 + 1) == []  # all leased
    bad = LineResult(400, "r-bad", {"error": {"message": "no", "type": "invalid_request_error"}})
    for line in claimed:
        result = bad if line.index == 2 else ok(line.index)
        assert db.finish("r1", batch_id, line.index, result, now=T0 + 2) == "recorded"
    # A result that arrives again (a lost lease, a second runner) is dropped.
    assert db.finish("r1", batch_id, 0, ok(0), now=T0 + 3) == "dropped"
    batch = db.get_batch(batch_id, "alice")
    assert batch is not None and batch.status == "completed" and batch.completed_at is not None
    assert batch.request_counts.model_dump() == {"total": 4, "completed": 3, "failed": 1}
    outputs = output_lines(db, batch.output_file_id)
    assert [(o.custom_id, o.response and o.response.status_code) for o in outputs] == [
        ("req-0", 200),
        ("req-1", 200),
        ("req-3", 200),
    ]
    errors = output_lines(db, batch.error_file_id)
    assert [(e.custom_id, e.response and e.response.status_code) for e in errors] == [("req-2", 400)]
    assert db.get_file(batch.output_file_id or "", "bob") is None


def test_a_lapsed_lease_is_claimed_again_and_the_old_runner_result_dropped(db: BatchDB) -> None:
    batch_id = new_batch(db, 2)
    first = db.claim("gone", 1, 30, now=T0)
    assert [line.index for line in first] == [0]
    assert [line.index for line in db.claim("alive", 10, 30, now=T0 + 10)] == [1]
    retaken = db.claim("alive", 10, 30, now=T0 + 31)  # the dead runner's lease lapsed
    assert [line.index for line in retaken] == [0]
    assert db.finish("gone", batch_id, 0, ok(0), now=T0 + 32) == "dropped"
    assert db.finish("alive", batch_id, 0, ok(0), now=T0 + 32) == "recorded"
    assert db.renew("alive", [(batch_id, 1), (batch_id, 0)], 30, now=T0 + 40) == 1  # 0 is done
    assert db.claim("other", 10, 30, now=T0 + 65) == []
    assert db.finish("alive", batch_id, 1, ok(1), now=T0 + 66) == "recorded"
    batch = db.get_batch(batch_id, "alice")
    assert batch is not None and batch.status == "completed"
    assert [o.custom_id for o in output_lines(db, batch.output_file_id)] == ["req-0", "req-1"]


def test_released_lines_are_claimable_at_once(db: BatchDB) -> None:
    new_batch(db, 3)
    assert len(db.claim("stopping", 10, 30, now=T0)) == 3
    assert db.release("stopping") == 3
    assert len(db.claim("next", 10, 30, now=T0 + 1)) == 3


def test_a_server_error_runs_once_more_then_goes_to_the_error_file(db: BatchDB) -> None:
    batch_id = new_batch(db, 1)
    died = LineResult(503, "r", {"error": {"message": "replica died", "type": "service_unavailable"}})
    (line,) = db.claim("r", 1, 30, now=T0)
    assert db.finish("r", batch_id, line.index, died, now=T0) == "retry"
    (line,) = db.claim("r", 1, 30, now=T0)
    assert db.finish("r", batch_id, line.index, died, now=T0) == "recorded"
    batch = db.get_batch(batch_id, "alice")
    assert batch is not None and batch.status == "completed"
    assert batch.request_counts.failed == 1 and batch.output_file_id is None
    (error,) = output_lines(db, batch.error_file_id)
    assert error.custom_id == "req-0" and error.response is not None and error.response.status_code == 503


def test_expiry_keeps_what_finished_and_reports_the_rest(db: BatchDB) -> None:
    batch_id = new_batch(db, 3)
    (line,) = db.claim("r", 1, 30, now=T0)
    db.finish("r", batch_id, line.index, ok(0), now=T0 + 1)
    db.tick(now=T0 + 3599)
    assert (found := db.get_batch(batch_id, "alice")) is not None and found.status == "in_progress"
    db.tick(now=T0 + 3600)
    batch = db.get_batch(batch_id, "alice")
    assert batch is not None and batch.status == "expired" and batch.expired_at is not None
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 1, "failed": 2}
    assert [o.custom_id for o in output_lines(db, batch.output_file_id)] == ["req-0"]
    errors = output_lines(db, batch.error_file_id)
    assert [(e.custom_id, e.error and e.error.code) for e in errors] == [
        ("req-1", "batch_expired"),
        ("req-2", "batch_expired"),
    ]
    assert db.claim("r", 10, 30, now=T0 + 3601) == []


def test_cancel_waits_for_running_lines_then_keeps_them(db: BatchDB) -> None:
    batch_id = new_batch(db, 3)
    (line,) = db.claim("r", 1, 30, now=T0)
    batch = db.cancel_batch(batch_id, "alice", now=T0 + 1)
    assert batch.status == "cancelling" and batch.cancelling_at is not None
    assert db.claim("r", 10, 30, now=T0 + 1) == []  # nothing new starts
    assert db.finish("r", batch_id, line.index, ok(0), now=T0 + 2) == "recorded"
    db.tick(now=T0 + 2)
    batch = db.cancel_batch(batch_id, "alice", now=T0 + 3)  # cancelling twice is harmless
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert [o.custom_id for o in output_lines(db, batch.output_file_id)] == ["req-0"]
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 1, "failed": 0}
    with pytest.raises(BadRequestError):
        db.cancel_batch(new_done_batch(db), "alice")


def new_done_batch(db: BatchDB) -> str:
    batch_id = new_batch(db, 1, now=T0 + 10)
    (line,) = db.claim("r", 1, 30, now=T0 + 10)
    db.finish("r", batch_id, line.index, ok(0), now=T0 + 10)
    return batch_id


def test_batches_are_per_owner_newest_first_and_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    db = BatchDB(path, window_s=3600)
    first = new_batch(db, 2, now=T0)
    second = new_batch(db, 2, now=T0 + 1)
    (line,) = db.claim("r", 1, 30, now=T0 + 2)
    db.finish("r", first, line.index, ok(0), now=T0 + 2)
    db.close()
    db = BatchDB(path, window_s=3600)
    page, more = db.list_batches("alice", None, 1)
    assert [b.id for b in page] == [second] and more
    page, more = db.list_batches("alice", second, 10)
    assert [b.id for b in page] == [first] and not more
    assert page[0].request_counts.completed == 1
    assert db.list_batches("bob", None, 10) == ([], False)
    assert db.get_batch(first, "bob") is None
    # The finished line is not handed out again; the other three are.
    assert sorted((c.batch_id, c.index) for c in db.claim("r2", 10, 30, now=T0 + 3)) == sorted(
        [(first, 1), (second, 0), (second, 1)]
    )
    assert db.status_counts()["in_progress"] == 2


def test_an_answer_holding_a_unicode_line_break_stays_on_its_line(db: BatchDB) -> None:
    """`splitlines()` (how the chaos harness, and many users, read an output file) also ends a
    line at U+2028 / U+2029 / U+0085, which JSON leaves raw inside strings."""
    batch_id = new_batch(db, 2)
    text = "one\u2028two\x85three\u2029four"
    for line in db.claim("r1", 10, 30, now=T0):
        body = {"id": f"c{line.index}", "choices": [{"message": {"content": text}}]}
        db.finish("r1", batch_id, line.index, LineResult(200, f"r{line.index}", body), now=T0 + 1)
    batch = db.get_batch(batch_id, "alice")
    assert batch is not None and batch.status == "completed"
    outputs = output_lines(db, batch.output_file_id)  # one object per splitlines() line
    assert [o.response and o.response.body["choices"][0]["message"]["content"] for o in outputs] == [text] * 2
