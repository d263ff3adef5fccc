"""The Files and Batch APIs: the shared suite (tests/support/suites/batches.py) on the default
llama.cpp gateway; per-key isolation, lines run with their owner's key, and the one retry of a
server error on the operations gateway (keys, fault-injection models); quotas, a gateway
restart mid-batch and the batch store actor's restart (no line twice, none lost) on a gateway of
their own with a state directory."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray

from raygate.backends.cluster.stores.host import STORES_NAME
from tests.support.admin import SMOLLM, raygate
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.ops import ADMIN_KEY, SMOLLM_KEY, metric, scrape, wait_for
from tests.support.release import release_namespace
from tests.support.replicas import replica_actors
from tests.support.suites.batches import (  # noqa: F401
    chat_line,
    jsonl,
    line,
    results,
    submit,
    test_bad_files_are_refused_naming_the_line,
    test_cancel_keeps_what_finished_and_lists_page,
    test_chat_batch_completes_with_interactive_shaped_bodies,
    test_embeddings_batch,
    test_files_round_trip_and_batch_errors,
    upload,
    wait_final,
)

RESTART_NAMESPACE = "raygate-batch-restart"
QUOTA = 16_000
MAX_FILE = 12_000


def completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def test_files_and_batches_are_per_key_and_lines_run_with_the_owners_key(
    ops_gateway: GatewayProcess,
) -> None:
    with sdk(ops_gateway.url, ADMIN_KEY) as admin, sdk(ops_gateway.url, SMOLLM_KEY) as limited:
        lines = [
            chat_line("allowed", "hi", max_tokens=4, model="smollm2"),
            chat_line("denied", "hi", model="synth"),
        ]
        batch = submit(limited, lines, "/v1/chat/completions")
        file_id = batch.input_file_id
        # The other key sees neither the file nor the batch, as if they did not exist.
        for call in (
            lambda: admin.files.retrieve(file_id),
            lambda: admin.files.content(file_id),
            lambda: admin.files.delete(file_id),
            lambda: admin.batches.retrieve(batch.id),
            lambda: admin.batches.cancel(batch.id),
            lambda: admin.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        assert file_id not in {f.id for f in admin.files.list()}
        assert batch.id not in {b.id for b in admin.batches.list()}

        done = wait_final(limited, batch.id)
        assert done.status == "completed", done
        # Each line ran with the batch owner's key: its model list refused the second line.
        assert set(results(limited, done.output_file_id)) == {"allowed"}
        denied = results(limited, done.error_file_id)["denied"]["response"]
        assert denied["status_code"] == 403 and denied["body"]["error"]["code"] == "model_not_allowed"
        with pytest.raises(openai.NotFoundError):
            admin.files.content(done.output_file_id or "")
    # Without a key, nothing.
    assert httpx.get(f"{ops_gateway.url}/v1/files").status_code == 401


def test_a_server_error_is_retried_once_then_kept_in_the_error_file(ops_gateway: GatewayProcess) -> None:
    """`synth-fail`'s engine fails every request after 3 tokens (a 500, as when a replica dies
    under a line): the line runs twice, then its error is its result."""
    before = metric(scrape(ops_gateway.url), "raygate:batch_lines_total", outcome="retried") or 0
    with sdk(ops_gateway.url, ADMIN_KEY) as client:
        lines = [chat_line("fails", "hi", max_tokens=10, model="synth-fail")]
        done = wait_final(client, submit(client, lines, "/v1/chat/completions").id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (0, 1)
        error = results(client, done.error_file_id)["fails"]["response"]
        assert error["status_code"] == 500 and error["body"]["error"]["type"] == "server_error"
    after = metric(scrape(ops_gateway.url), "raygate:batch_lines_total", outcome="retried") or 0
    assert after >= before + 1
    # The gauge of batches by status follows the store within a few seconds.
    wait_for(
        lambda: (metric(scrape(ops_gateway.url), "raygate:batches", status="completed") or 0) >= 1,
        what="the batches gauge",
    )


def test_batch_lines_never_take_the_queue_from_interactive_requests(ops_gateway: GatewayProcess) -> None:
    """`synth-queue` runs 2 requests and queues 2 more, then answers 429. A batch on it has 8 lines
    out at a time (the runner's default): 2 running, 6 waiting in a class below interactive
    traffic, which neither fills the queue clients need nor starts before them. So interactive
    requests sent while the batch runs are served, not refused."""
    with sdk(ops_gateway.url, ADMIN_KEY) as client:
        lines = [chat_line(f"p-{i}", "hi", max_tokens=8, model="synth-queue") for i in range(40)]
        batch = submit(client, lines, "/v1/chat/completions")
        wait_for(lambda: completed(client, batch.id) >= 1, timeout=120, what="a first batch line")

        def ask(_: int) -> str | None:
            reply = client.chat.completions.create(
                model="synth-queue", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            return reply.choices[0].finish_reason

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(ask, range(2))) == ["length", "length"]
        client.batches.cancel(batch.id)
        done = wait_final(client, batch.id)
        assert done.status in ("cancelled", "completed")
        assert done.request_counts is not None and done.request_counts.failed == 0


LONG_LINE_TOKENS = 256


def test_interactive_requests_go_ahead_of_a_batch_that_fills_every_slot(gateway: GatewayProcess) -> None:
    """models/default.yaml's chat model as `make serve` runs it: one replica decoding 8 sequences
    at once, no `limits`. With no interactive traffic every slot is spare, and a batch of 8 long
    lines takes them all. Interactive requests sent then are not queued behind the lines: each
    takes a batch line's slot at once (the engine preempts the line: `raygate:preemptions_total`),
    and the preempted lines resume where they stopped, so every line still completes in full."""
    model = CHAT_MODEL
    with sdk(gateway.url, "unused") as client:
        # Long enough that no line can end (and free its slot) before the interactive requests
        # arrive, on any machine: a line of 32 tokens could, and then nothing was preempted.
        body = {"model": model, "max_tokens": LONG_LINE_TOKENS, "ignore_eos": True}
        lines = [
            line(
                f"long-{i}",
                "/v1/chat/completions",
                {**body, "messages": [{"role": "user", "content": f"Count from {i}."}]},
            )
            for i in range(8)
        ]
        before = metric(scrape(gateway.url), "raygate:preemptions_total", model_name=model) or 0
        batch = submit(client, lines, "/v1/chat/completions")
        wait_for(
            lambda: (metric(scrape(gateway.url), "raygate:num_requests_running", model_name=model) or 0) >= 8,
            timeout=120,
            what="the batch on every slot",
        )
        # "Running" counts lines handed to the replica; the last may still be on its way to a slot,
        # and an interactive request that arrives first takes that free slot without preempting.
        # Once the lines hold every slot (for the many seconds they run), the next one preempts.
        deadline, sent = time.monotonic() + 90, 0
        while True:
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Say hi {sent}."}], max_tokens=4
            )
            assert reply.choices[0].finish_reason in ("stop", "length")
            sent += 1
            # A scrape leaves out a replica that does not answer within 2 s: read a few times.
            preempted = any(
                (metric(scrape(gateway.url), "raygate:preemptions_total", model_name=model) or 0) > before
                for _ in range(3)
            )
            if preempted:
                break
            assert time.monotonic() < deadline, f"no batch line was preempted for {sent} interactive requests"
        done = wait_final(client, batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (8, 0)
        answers = results(client, done.output_file_id)
        assert len(answers) == 8
        assert all(
            a["response"]["body"]["usage"]["completion_tokens"] == LONG_LINE_TOKENS for a in answers.values()
        )


def test_a_line_whose_replica_is_killed_runs_once_more(ops_gateway: GatewayProcess) -> None:
    """`synth-batch-kill` (2 replicas, 20 tokens/s): the replica running a batch line is killed; the line
    fails with 503 (the replica died holding it), runs once more on the other replica, and
    completes."""
    before = metric(scrape(ops_gateway.url), "raygate:batch_lines_total", outcome="retried") or 0
    with sdk(ops_gateway.url, ADMIN_KEY) as client:
        batch = submit(
            client,
            [chat_line("long", "hi", max_tokens=120, model="synth-batch-kill")],
            "/v1/chat/completions",
        )

        def holder() -> Any:
            actors = replica_actors("synth-batch-kill")
            stats = ray.get([a.stats.remote() for a in actors])
            for actor, st in zip(actors, stats, strict=True):
                if any(i.startswith("batch_req_") for i in st.running_ids):
                    return actor
            return None

        wait_for(lambda: holder() is not None, timeout=60, what="the line on a replica")
        ray.kill(holder())
        done = wait_final(client, batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (1, 0)
        answer = results(client, done.output_file_id)["long"]["response"]
        assert answer["status_code"] == 200 and answer["body"]["usage"]["completion_tokens"] == 120
    after = metric(scrape(ops_gateway.url), "raygate:batch_lines_total", outcome="retried") or 0
    assert after >= before + 1
    wait_for(
        lambda: metric(scrape(ops_gateway.url), "raygate:replicas_ready", model_name="synth-batch-kill") == 2,
        timeout=60,
        what="the replacement replica",
    )


@pytest.fixture
def restart_args(ray_address: str, tmp_path: Path) -> Iterator[list[str]]:
    config = tmp_path / "batch.yaml"
    config.write_text(
        "models:\n  - name: smollm2-135m-instruct\n    num_cpus: 0.25\n"
        f"    source: {{package: {SMOLLM['package']}, file: {SMOLLM['file']}}}\n"
        "    engine: {n_ctx: 512, n_threads: 1, n_seq_max: 4}\n"
    )
    yield [
        "--config",
        str(config),
        "--ray-address",
        ray_address,
        "--ray-namespace",
        RESTART_NAMESPACE,
        "--state-dir",
        str(tmp_path / "state"),
        "--files-quota-bytes",
        str(QUOTA),
        "--files-max-bytes",
        str(MAX_FILE),
        "--batch-max-running",
        "2",
        "--batch-lease",
        "3",
    ]
    release_namespace(RESTART_NAMESPACE)


def test_limits_quota_and_a_gateway_restart_mid_batch(restart_args: list[str], tmp_path: Path) -> None:
    n = 16
    lines = [chat_line(f"r-{i}", f"Count to {i}.", max_tokens=24) for i in range(n)]
    gw = start_gateway(restart_args, tmp_path / "first.log")
    try:
        with sdk(gw.url, "unused") as client:
            # The quota counts every file the key keeps: a second copy of a big file does not fit.
            big = jsonl([chat_line(f"q-{i}", "x" * 200) for i in range(28)])
            assert 0.5 * QUOTA < len(big) < MAX_FILE
            kept = client.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
            with pytest.raises(openai.BadRequestError) as info:
                client.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
            assert info.value.code == "quota_exceeded"
            client.files.delete(kept.id)
            # One file over `--files-max-bytes` is a 413, whatever the quota.
            with pytest.raises(openai.APIStatusError) as too_big:
                client.files.create(file=("huge.jsonl", io.BytesIO(big + big[:MAX_FILE])), purpose="batch")
            assert too_big.value.status_code == 413

            batch = submit(client, lines, "/v1/chat/completions")
            wait_for(
                lambda: completed(client, batch.id) >= 2,
                timeout=240,
                interval=0.2,
                what="two finished lines",
            )
            assert completed(client, batch.id) < n, "the batch ended before the restart: make it longer"
    finally:
        # SIGKILL: no drain, no hand-back; the claims lapse with their lease.
        os.kill(gw.proc.pid, signal.SIGKILL)
        gw.stop()
    gw = start_gateway(restart_args, tmp_path / "second.log")
    try:
        with sdk(gw.url, "unused") as client:
            # The stores actor dies too (as on a cluster node's loss): Ray restarts it, it reopens
            # its file, and the runner's calls reach the new one.
            ray.kill(ray.get_actor(STORES_NAME, namespace=RESTART_NAMESPACE), no_restart=False)
            done = wait_final(client, batch.id)
            assert done.status == "completed", done
            assert done.request_counts is not None
            assert (done.request_counts.total, done.request_counts.completed) == (n, n)
            outputs = results(client, done.output_file_id)  # each custom_id once
            assert set(outputs) == {f"r-{i}" for i in range(n)}
            assert done.error_file_id is None
            # The input is still there after the restart (state dir), and the listing shows the batch.
            assert client.files.retrieve(batch.input_file_id).bytes == len(jsonl(lines))
            assert batch.id in {b.id for b in client.batches.list()}
    finally:
        assert gw.stop() == 0, gw.log()[-3000:]


def _none() -> object:
    class Zero:
        completed = 0

    return Zero()


def test_cli_submits_follows_lists_and_fetches_results(gateway: GatewayProcess, tmp_path: Path) -> None:
    lines = [line(f"e-{i}", "/v1/embeddings", {"model": EMBED_MODEL, "input": f"text {i}"}) for i in range(3)]
    lines.append(line("bad", "/v1/embeddings", {"model": EMBED_MODEL, "input": ""}))
    source = tmp_path / "embed.jsonl"
    source.write_bytes(jsonl(lines))
    submitted = raygate(
        "batch",
        "submit",
        str(source),
        "--endpoint",
        "/v1/embeddings",
        "--wait",
        "--metadata",
        "run=cli",
        url=gateway.url,
    )
    assert submitted.returncode == 0, submitted.stderr
    batch = json.loads(submitted.stdout)
    assert batch["status"] == "completed" and batch["metadata"] == {"run": "cli"}
    assert batch["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert "4/4 done (1 failed) completed" in submitted.stderr  # the progress bar's last line

    listed = raygate("batch", "list", url=gateway.url)
    assert listed.returncode == 0 and batch["id"] in listed.stdout, listed.stderr
    out = raygate("batch", "results", batch["id"], url=gateway.url)
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(r)["custom_id"] for r in out.stdout.splitlines()) == ["e-0", "e-1", "e-2"]
    errors = raygate("batch", "results", batch["id"], "--errors", url=gateway.url)
    (bad,) = [json.loads(r) for r in errors.stdout.splitlines()]
    assert bad["custom_id"] == "bad" and bad["response"]["status_code"] == 400
    cancelled = raygate("batch", "cancel", batch["id"], url=gateway.url)
    assert cancelled.returncode == 1 and "400" in cancelled.stderr  # it has ended
    missing = raygate("batch", "status", "batch_nope", url=gateway.url)
    assert missing.returncode == 1 and "404" in missing.stderr
