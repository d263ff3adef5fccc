"""LoRA adapters through the gateway (issue 49), served from examples/lora.yaml as a user would:
`model: <adapter>` on chat, completions, responses and messages moves the greedy answer, the two
adapters differ, concurrent requests for different adapters each get their own adapter's answer,
and adapters load and unload at run time with vLLM's endpoints (the openai SDK's raw requests and
curl), persisted in the registry, with bad inputs refused by name while the base keeps serving.
The adapters are random ones built once per machine (tests/support/lora.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.admin import raygate
from tests.support.gateway import REPO, GatewayProcess, start_gateway
from tests.support.lora import PROMPT, assert_each_got_its_own, build_adapters
from tests.support.release import stop_and_release

NAMESPACE = "raygate-lora-test"
ADMIN_KEY = "lora-admin-s3cret"
BASE, A, B = "smollm2-135m-instruct", "smollm2-lora-a", "smollm2-lora-b"
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 16}


@pytest.fixture(scope="module")
def adapters() -> dict[str, Path]:
    return build_adapters()


@pytest.fixture(scope="module")
def lora_gateway(
    ray_address: str, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Path]]:
    tmp = tmp_path_factory.mktemp("lora")
    state_dir = tmp / "state"
    args = ["--config", str(REPO / "examples" / "lora.yaml"), "--ray-address", ray_address]
    args += ["--ray-namespace", NAMESPACE, "--state-dir", str(state_dir), "--admin-key", ADMIN_KEY]
    gw = start_gateway(args, tmp / "gateway.log")
    try:
        yield gw, state_dir
    finally:
        code = stop_and_release(gw, NAMESPACE, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert code == 0, gw.log()[-3000:]


@pytest.fixture(scope="module")
def lclient(lora_gateway: tuple[GatewayProcess, Path]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{lora_gateway[0].url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def admin_client(lora_gateway: tuple[GatewayProcess, Path]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{lora_gateway[0].url}/v1", api_key=ADMIN_KEY, max_retries=0) as c:
        yield c


def chat(client: openai.OpenAI, model: str, prompt: str = PROMPT) -> str:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], **GREEDY)
    assert r.model == model
    return r.choices[0].message.content or ""


def raw_post(client: openai.OpenAI, path: str, body: dict[str, Any]) -> httpx.Response:
    """The openai SDK's raw request (what vLLM's docs use for these endpoints), never raising."""
    try:
        return client.post(path, body=body, cast_to=httpx.Response)
    except openai.APIStatusError as exc:
        return exc.response


def test_models_list_adapters_with_their_parent(lclient: openai.OpenAI) -> None:
    cards = {m.id: m.model_dump() for m in lclient.models.list().data}
    assert cards[A]["parent"] == BASE and cards[B]["parent"] == BASE
    assert "parent" not in cards[BASE]
    assert lclient.models.retrieve(A).model_dump()["parent"] == BASE


def test_an_adapter_changes_the_answer_on_every_endpoint(
    lclient: openai.OpenAI, lora_gateway: tuple[GatewayProcess, Path]
) -> None:
    base, a, b = (chat(lclient, m) for m in (BASE, A, B))
    assert a != base and b != base and a != b
    assert chat(lclient, A) == a  # the prompt, now cached under another set, is evaluated under A

    def completion(model: str) -> str:
        r = lclient.completions.create(model=model, prompt="Once upon a time, a cat", **GREEDY)
        assert r.model == model
        return r.choices[0].text

    assert completion(A) != completion(BASE)

    def response(model: str) -> str:
        r = lclient.responses.create(model=model, input=PROMPT, temperature=0, max_output_tokens=16)
        assert r.model == model
        return r.output_text

    assert response(A) != response(BASE)

    with anthropic.Anthropic(base_url=lora_gateway[0].url, api_key="unused", max_retries=0) as claude:

        def message(model: str) -> str:
            r = claude.messages.create(
                model=model,
                max_tokens=16,
                messages=[{"role": "user", "content": PROMPT}],
                extra_body={"temperature": 0},  # anthropic 2.x lists no sampling fields
            )
            assert r.model == model
            return "".join(block.text for block in r.content if block.type == "text")

        assert message(A) != message(BASE)


async def test_mixed_adapters_at_once_each_get_their_own(lora_gateway: tuple[GatewayProcess, Path]) -> None:
    jobs = [(m, p) for p in (PROMPT, "Write a haiku about the sea.") for m in (BASE, A, B)]
    async with openai.AsyncOpenAI(base_url=f"{lora_gateway[0].url}/v1", api_key="x", max_retries=0) as client:

        async def one(model: str, prompt: str) -> str:
            messages: Any = [{"role": "user", "content": prompt}]
            r = await client.chat.completions.create(model=model, messages=messages, **GREEDY)
            return r.choices[0].message.content or ""

        alone = [await one(m, p) for m, p in jobs]
        together = await asyncio.gather(*(one(m, p) for m, p in jobs))
    assert_each_got_its_own(list(jobs), list(together), alone)


def test_load_and_unload_at_run_time(
    lclient: openai.OpenAI,
    admin_client: openai.OpenAI,
    adapters: dict[str, Path],
    lora_gateway: tuple[GatewayProcess, Path],
) -> None:
    gateway, state_dir = lora_gateway
    base, a = chat(lclient, BASE), chat(lclient, A)
    # vLLM's body, through the openai SDK: adapter A's file under a new name answers as A does.
    r = raw_post(admin_client, "/load_lora_adapter", {"lora_name": "tuned-c", "lora_path": str(adapters[A])})
    assert r.status_code == 200, r.text
    assert "tuned-c" in r.text
    assert chat(lclient, "tuned-c") == a
    assert {m.id: m.parent for m in lclient.models.list().data if m.id == "tuned-c"} == {"tuned-c": BASE}  # type: ignore[attr-defined]
    registry = json.loads((state_dir / "registry.json").read_text())
    assert "tuned-c" in json.dumps(registry)  # persisted with the rest of the registry
    # Unloaded with curl: the name is gone, the base answers as before.
    done = subprocess.run(
        [
            *("curl", "-sS", "-w", "\n%{http_code}", "-X", "POST", f"{gateway.url}/v1/unload_lora_adapter"),
            *("-H", f"Authorization: Bearer {ADMIN_KEY}", "-H", "Content-Type: application/json"),
            *("-d", json.dumps({"lora_name": "tuned-c"})),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.rsplit("\n", 1)[1] == "200", done.stdout
    with pytest.raises(openai.NotFoundError, match="tuned-c"):
        chat(lclient, "tuned-c")
    assert "tuned-c" not in {m.id for m in lclient.models.list().data}
    assert "tuned-c" not in (state_dir / "registry.json").read_text()
    assert chat(lclient, BASE) == base
    # The same through /admin, on a configured adapter: B's name is refused once it is unloaded,
    # and loading it back (on the base named by its alias) brings B's answer back.
    b = chat(lclient, B)
    gone = httpx.delete(
        f"{gateway.url}/admin/adapters/{B}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120
    )
    assert gone.status_code == 200, gone.text
    with pytest.raises(openai.NotFoundError, match=B):
        chat(lclient, B)
    back = httpx.post(
        f"{gateway.url}/admin/adapters",
        json={"lora_name": B, "lora_path": str(adapters[B]), "base_model_name": "smollm2"},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=120,
    )
    assert back.status_code == 200, back.text
    assert B in [a["name"] for a in back.json()["spec"]["adapters"]]
    assert chat(lclient, B) == b


def test_bad_adapter_requests_are_refused_by_name(
    lclient: openai.OpenAI, admin_client: openai.OpenAI, adapters: dict[str, Path], tmp_path: Path
) -> None:
    base = chat(lclient, BASE)
    not_gguf = tmp_path / "not-an-adapter.gguf"
    not_gguf.write_bytes(b"GGUF but not really")
    cases = [
        ({"lora_name": "bad-file", "lora_path": str(not_gguf)}, 400, "bad-file"),
        ({"lora_name": "no-file", "lora_path": str(tmp_path / "missing.gguf")}, 400, "missing.gguf"),
        ({"lora_name": "relative", "lora_path": "adapters/x.gguf"}, 400, "absolute"),
        ({"lora_name": A, "lora_path": str(adapters[A])}, 400, A),  # the name is taken
        ({"lora_name": BASE, "lora_path": str(adapters[A])}, 400, BASE),
        ({"lora_name": "x", "lora_path": str(adapters[A]), "base_model_name": "nope"}, 404, "nope"),
        ({"lora_name": "bad name!", "lora_path": str(adapters[A])}, 400, "bad name"),
    ]
    for body, status, named in cases:
        r = raw_post(admin_client, "/load_lora_adapter", body)
        assert r.status_code == status, (body, r.text)
        assert named in r.json()["error"]["message"], r.text
    r = raw_post(admin_client, "/unload_lora_adapter", {"lora_name": "never-loaded"})
    assert r.status_code == 404 and "never-loaded" in r.text
    # No admin key: refused before anything happens.
    r = raw_post(lclient, "/load_lora_adapter", {"lora_name": "y", "lora_path": str(adapters[A])})
    assert r.status_code in (401, 403), r.text
    with pytest.raises(openai.NotFoundError, match="smollm2-lora-z"):
        chat(lclient, "smollm2-lora-z")
    assert {m.id for m in lclient.models.list().data} >= {BASE, A, B}
    assert not {"bad-file", "no-file", "x", "y"} & {m.id for m in lclient.models.list().data}
    assert chat(lclient, BASE) == base  # the base kept serving, unchanged


def test_the_cli_loads_and_unloads(
    lclient: openai.OpenAI, adapters: dict[str, Path], lora_gateway: tuple[GatewayProcess, Path]
) -> None:
    url, env = lora_gateway[0].url, {**os.environ, "RAYGATE_ADMIN_KEY": ADMIN_KEY}
    a = chat(lclient, A)
    done = raygate("load-adapter", "cli-d", str(adapters[A]), "--model", BASE, url=url, env=env)
    assert done.returncode == 0, done.stderr
    assert chat(lclient, "cli-d") == a
    bad = raygate("load-adapter", "cli-e", "/nowhere/e.gguf", url=url, env=env)
    assert bad.returncode != 0 and "/nowhere/e.gguf" in bad.stderr
    done = raygate("unload-adapter", "cli-d", url=url, env=env)
    assert done.returncode == 0, done.stderr
    with pytest.raises(openai.NotFoundError, match="cli-d"):
        chat(lclient, "cli-d")


def test_metrics_per_adapter(lclient: openai.OpenAI, lora_gateway: tuple[GatewayProcess, Path]) -> None:
    chat(lclient, A)
    text = httpx.get(f"{lora_gateway[0].url}/metrics", timeout=30).text
    rows = [line for line in text.splitlines() if line.startswith("raygate:lora_sequences_total{")]
    mine = [line for line in rows if f'lora_name="{A}"' in line and f'model_name="{BASE}"' in line]
    assert mine and float(mine[0].rsplit(" ", 1)[1]) >= 1, rows
    assert any(line.startswith("raygate:lora_generation_tokens_total{") for line in text.splitlines())
