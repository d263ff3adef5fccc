"""The operator's CLI against the shared gateway: deploy -> list -> chat -> scale 1->2->1 ->
undeploy, with openai SDK clients streaming the whole time."""

from __future__ import annotations

from tests.support.admin import SMOLLM, Streamer, raygate
from tests.support.gateway import GatewayProcess
from tests.support.replicas import replica_actors


def test_cli_lifecycle_with_streams_throughout(gateway: GatewayProcess) -> None:
    url, name = gateway.url, "lc-cli"
    r = raygate(
        "deploy",
        name,
        "--package",
        SMOLLM["package"],
        "--file",
        SMOLLM["file"],
        "--alias",
        "lc-c",
        "--num-cpus",
        "0.25",
        "--engine",
        "n_ctx=1024",
        "--engine",
        "n_threads=1",
        url=url,
    )
    assert r.returncode == 0, r.stderr
    assert "loading" in r.stderr and "ready" in r.stderr  # progress while the model loads
    assert f"deployed {name}: 1/1 ready" in r.stdout

    listing = raygate("list", url=url)
    assert listing.returncode == 0, listing.stderr
    row = next(line.split() for line in listing.stdout.splitlines() if line.startswith(f"{name} "))
    assert row[1:5] == ["ready", "1/1", "llama_cpp", "lc-c"], listing.stdout
    assert f"{name}#1" in listing.stdout

    answer = raygate("chat", "lc-c", "Say hello to the operator.", "--max-tokens", "12", url=url)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip()

    with Streamer(f"{url}/v1", name) as streams:
        streams.wait_for(2)
        up = raygate("scale", name, "2", url=url)
        assert up.returncode == 0 and f"scaled {name}: 2/2 ready" in up.stdout, up.stderr
        streams.wait_for(4)
        down = raygate("scale", name, "1", url=url)
        assert down.returncode == 0 and f"scaled {name}: 1/1 ready" in down.stdout, down.stderr
        assert "draining" in down.stderr
        streams.wait_for(2)
    assert not streams.failures, streams.failures
    assert len(replica_actors(name)) == 1

    gone = raygate("undeploy", name, "--timeout", "30", url=url)
    assert gone.returncode == 0 and f"undeployed {name}: drained" in gone.stdout, gone.stderr
    assert not replica_actors(name)
    again = raygate("chat", name, "hi", "--wait", "0", url=url)
    assert again.returncode == 1 and "404" in again.stderr


def test_cli_reports_bad_input_and_unreachable_gateway(gateway: GatewayProcess) -> None:
    r = raygate("deploy", "lc-cli-bad", "--path", "/nonexistent/model.gguf", url=gateway.url)
    assert r.returncode == 1 and "400: Model file not found: /nonexistent/model.gguf" in r.stderr
    r = raygate("scale", "no-such-model", "2", url=gateway.url)
    assert r.returncode == 1 and "404" in r.stderr
    r = raygate("deploy", "lc-cli-bad", "--engine", "n_ctx", "--path", "/x", url=gateway.url)
    assert r.returncode == 1 and "KEY=VALUE" in r.stderr
    r = raygate("list", url="http://127.0.0.1:9")
    assert r.returncode == 1 and "cannot reach" in r.stderr
