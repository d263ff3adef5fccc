"""A raw client on a stream: curl's `-N` reads the SSE as it comes and sees OpenAI's framing, the
role first and `[DONE]` last. A suite every backend passes (tests/e2e/test_streaming_lifecycle.py
runs it on the default gateway, tests/e2e/vllm/test_vllm_openai_suite.py on vLLM)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.support.models import CHAT_MODEL


def test_curl_streaming(base_url: str) -> None:
    if shutil.which("curl") is None:  # fails, never skips: a missing tool must not pass unseen
        pytest.fail("curl is not installed; this test streams through it (Debian: apt-get install curl)")
    body = json.dumps(
        {
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "stream": True,
        }
    )
    out = subprocess.run(
        ["curl", "-sN", f"{base_url}/chat/completions", "-H", "Content-Type: application/json", "-d", body],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    data = [line for line in out.splitlines() if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert json.loads(data[0][6:])["choices"][0]["delta"]["role"] == "assistant"
