"""The operations test gateway: keys, CORS, a small body limit, fast SSE pings, JSON logs, and the
fault-injection models of tests/configs/ops.yaml. One per session, attached to the session's Ray;
its fixtures are imported by tests/e2e/conftest.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from bench.prometheus import metric as metric  # the tests read /metrics through it
from tests.support.gateway import REPO, GatewayProcess, start_gateway

OPS_CONFIG = REPO / "tests" / "configs" / "ops.yaml"
KEYS_FILE = REPO / "tests" / "configs" / "ops-keys.yaml"
ADMIN_KEY = "sk-test-admin-0123456789"
SMOLLM_KEY = "sk-test-smollm-0123456789"  # may only use the `smollm2` model
LIMITED_KEY = "sk-test-ratelimited-0123456789"  # 2 requests per minute
MESSAGES_LIMITED_KEY = "sk-test-ratelimited-messages-0123456789"  # the same limit, its own bucket
ALL_KEYS = (ADMIN_KEY, SMOLLM_KEY, LIMITED_KEY, MESSAGES_LIMITED_KEY)
REAL_MODEL = "ops-smollm2"
ALLOWED_ORIGIN = "http://allowed.example"
MAX_BODY = 65536
PING_S = 0.3
OPS_NAMESPACE = "raygate-ops"


@pytest.fixture(scope="session")
def ops_gateway(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log_path = tmp_path_factory.mktemp("ops-gateway") / "gateway.log"
    gw = start_gateway(
        [
            "--config",
            str(OPS_CONFIG),
            "--ray-address",
            ray_address,
            "--ray-namespace",
            OPS_NAMESPACE,  # its own controller, so its own models
            "--api-keys-file",
            str(KEYS_FILE),
            "--cors-origin",
            ALLOWED_ORIGIN,
            "--max-body-bytes",
            str(MAX_BODY),
            "--sse-ping-seconds",
            str(PING_S),
            "--log-format",
            "json",
        ],
        log_path,
    )
    yield gw
    code = gw.stop()
    assert code == 0, f"ops gateway exited with {code}:\n{gw.log()[-4000:]}"


@pytest.fixture
def admin(ops_gateway: GatewayProcess) -> Iterator[httpx.Client]:
    """httpx on the ops gateway with the unrestricted key."""
    with httpx.Client(
        base_url=ops_gateway.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
    ) as c:
        yield c


def scrape(url: str) -> str:
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def wait_for(
    condition: Callable[[], object], timeout: float = 30, interval: float = 0.1, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class StreamReader(threading.Thread):
    """Reads one SSE stream to its end in the background, keeping every data payload."""

    def __init__(self, url: str, body: dict[str, Any], request_id: str) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.request_id = url, body, request_id
        self.headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        self.status = 0
        self.data: list[str] = []
        self.first = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        headers = {**self.headers, "X-Request-Id": self.request_id}
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/completions", json=self.body, headers=headers, timeout=60
            ) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.data.append(line[6:])
                        self.first.set()
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            self.first.set()
