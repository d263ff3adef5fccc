"""LoRA adapters through the gateway (issue 49), on any engine that serves them: `model: <adapter>`
on chat, completions, responses and messages moves the greedy answer, the two adapters differ,
concurrent requests for different adapters each get their own adapter's answer, and adapters load
and unload at run time with vLLM's endpoints (the openai SDK's raw requests, curl, the CLI), with
bad inputs refused by name while the base keeps serving.

tests/e2e/test_lora.py runs it on examples/lora.yaml (llama.cpp, GGUF adapters, its own gateway
with an admin key and a state directory); tests/e2e/vllm/test_vllm_lora.py on the session's vLLM
gateway, whose chat model is examples/lora-vllm.yaml's (PEFT folders, no admin key). Each module
provides the fixtures below' names: `lora_gateway` (a `LoraGateway`), `lclient`, `admin_client`,
`adapters` (adapter name -> what the engine loads) and `backend`.

The adapters are random ones built once per machine (tests/support/lora.py): the assertions are
about which answers equal or differ, never about their words.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.admin import raygate
from tests.support.lora import BASE, OTHER, PROMPT, A, B, LoraGateway, assert_each_got_its_own

GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 16}


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


def not_an_adapter(backend: str, folder: Path) -> Path:
    """Something in the place of an adapter that the engine must refuse: a file that says GGUF
    and is not one (llama.cpp), a PEFT folder whose config is not one (vLLM)."""
    if backend == "vllm":
        bad = folder / "not-an-adapter"
        bad.mkdir()
        (bad / "adapter_config.json").write_text('{"peft_type": "LORA", "r": "eight"}')
        return bad
    bad = folder / "not-an-adapter.gguf"
    bad.write_bytes(b"GGUF but not really")
    return bad


def test_models_list_adapters_with_their_parent(lclient: openai.OpenAI) -> None:
    cards = {m.id: m.model_dump() for m in lclient.models.list().data}
    assert cards[A]["parent"] == BASE and cards[B]["parent"] == BASE
    assert "parent" not in cards[BASE]
    assert lclient.models.retrieve(A).model_dump()["parent"] == BASE


def test_an_adapter_changes_the_answer_on_every_endpoint(
    lclient: openai.OpenAI, lora_gateway: LoraGateway
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
    # The same prompt and greedy settings through Responses: the same answer as chat's (the model's
    # `defaults:`, a repetition penalty here, apply on every endpoint alike).
    assert response(A) == a and response(BASE) == base

    with anthropic.Anthropic(base_url=lora_gateway.url, api_key="unused", max_retries=0) as claude:

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


async def test_mixed_adapters_at_once_each_get_their_own(lora_gateway: LoraGateway) -> None:
    jobs = [(m, p) for p in (PROMPT, "Write a haiku about the sea.") for m in (BASE, A, B)]
    async with openai.AsyncOpenAI(base_url=f"{lora_gateway.url}/v1", api_key="x", max_retries=0) as client:

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
    lora_gateway: LoraGateway,
) -> None:
    base, a = chat(lclient, BASE), chat(lclient, A)
    # vLLM's body, through the openai SDK: adapter A's weights under a new name answer as A does.
    r = raw_post(admin_client, "/load_lora_adapter", {"lora_name": "tuned-c", "lora_path": str(adapters[A])})
    assert r.status_code == 200, r.text
    assert "tuned-c" in r.text
    assert chat(lclient, "tuned-c") == a
    assert {m.id: m.parent for m in lclient.models.list().data if m.id == "tuned-c"} == {"tuned-c": BASE}  # type: ignore[attr-defined]
    registry = lora_gateway.state_dir / "registry.json" if lora_gateway.state_dir else None
    if registry is not None:
        assert "tuned-c" in registry.read_text()  # persisted with the rest of the registry
    # Unloaded with curl: the name is gone, the base answers as before.
    done = subprocess.run(
        [
            *(
                "curl",
                "-sS",
                "-w",
                "\n%{http_code}",
                "-X",
                "POST",
                f"{lora_gateway.url}/v1/unload_lora_adapter",
            ),
            *("-H", "Content-Type: application/json", *lora_gateway.curl_auth()),
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
    if registry is not None:
        assert "tuned-c" not in registry.read_text()
    assert chat(lclient, BASE) == base
    # The same through /admin, on a configured adapter: B's name is refused once it is unloaded,
    # and loading it back (on the base named by its alias) brings B's answer back.
    b = chat(lclient, B)
    gone = httpx.delete(f"{lora_gateway.url}/admin/adapters/{B}", headers=lora_gateway.auth(), timeout=120)
    assert gone.status_code == 200, gone.text
    with pytest.raises(openai.NotFoundError, match=B):
        chat(lclient, B)
    back = httpx.post(
        f"{lora_gateway.url}/admin/adapters",
        json={"lora_name": B, "lora_path": str(adapters[B]), "base_model_name": "smollm2"},
        headers=lora_gateway.auth(),
        timeout=120,
    )
    assert back.status_code == 200, back.text
    assert B in [a["name"] for a in back.json()["spec"]["adapters"]]
    assert chat(lclient, B) == b


def test_bad_adapter_requests_are_refused_by_name(
    lclient: openai.OpenAI,
    admin_client: openai.OpenAI,
    adapters: dict[str, Path],
    lora_gateway: LoraGateway,
    backend: str,
    tmp_path: Path,
) -> None:
    base = chat(lclient, BASE)
    cases = [
        ({"lora_name": "bad-file", "lora_path": str(not_an_adapter(backend, tmp_path))}, 400, "bad-file"),
        ({"lora_name": "no-file", "lora_path": str(tmp_path / "missing")}, 400, "missing"),
        # A real adapter, made for another base model (a tiny Llama with other layer sizes).
        ({"lora_name": OTHER, "lora_path": str(adapters[OTHER]), "base_model_name": BASE}, 400, OTHER),
        ({"lora_name": "relative", "lora_path": "adapters/x"}, 400, "absolute"),
        ({"lora_name": A, "lora_path": str(adapters[A])}, 400, A),  # the name is taken
        ({"lora_name": BASE, "lora_path": str(adapters[A])}, 400, BASE),
        ({"lora_name": "x", "lora_path": str(adapters[A]), "base_model_name": "nope"}, 404, "nope"),
        ({"lora_name": "bad name!", "lora_path": str(adapters[A])}, 400, "bad name"),
    ]
    if backend == "vllm":  # vLLM applies an adapter at full strength only
        cases.append(
            (
                {"lora_name": "half", "lora_path": str(adapters[A]), "base_model_name": BASE, "scale": 0.5},
                400,
                "half",
            )
        )
    for body, status, named in cases:
        r = raw_post(admin_client, "/load_lora_adapter", body)
        assert r.status_code == status, (body, r.text)
        assert named in r.json()["error"]["message"], r.text
    r = raw_post(admin_client, "/unload_lora_adapter", {"lora_name": "never-loaded"})
    assert r.status_code == 404 and "never-loaded" in r.text
    if lora_gateway.admin_key is not None:  # without the admin key: refused before anything happens
        r = raw_post(lclient, "/load_lora_adapter", {"lora_name": "y", "lora_path": str(adapters[A])})
        assert r.status_code in (401, 403), r.text
    with pytest.raises(openai.NotFoundError, match="smollm2-lora-z"):
        chat(lclient, "smollm2-lora-z")
    assert {m.id for m in lclient.models.list().data} >= {BASE, A, B}
    assert not {"bad-file", "no-file", OTHER, "x", "y", "half"} & {m.id for m in lclient.models.list().data}
    assert chat(lclient, BASE) == base  # the base kept serving, unchanged


def test_the_cli_loads_and_unloads(
    lclient: openai.OpenAI, adapters: dict[str, Path], lora_gateway: LoraGateway
) -> None:
    url = lora_gateway.url
    env = {**os.environ, **({"RAYGATE_ADMIN_KEY": lora_gateway.admin_key} if lora_gateway.admin_key else {})}
    a = chat(lclient, A)
    done = raygate("load-adapter", "cli-d", str(adapters[A]), "--model", BASE, url=url, env=env)
    assert done.returncode == 0, done.stderr
    assert chat(lclient, "cli-d") == a
    bad = raygate("load-adapter", "cli-e", "/nowhere/e", "--model", BASE, url=url, env=env)
    assert bad.returncode != 0 and "/nowhere/e" in bad.stderr
    done = raygate("unload-adapter", "cli-d", url=url, env=env)
    assert done.returncode == 0, done.stderr
    with pytest.raises(openai.NotFoundError, match="cli-d"):
        chat(lclient, "cli-d")


def test_metrics_per_adapter(lclient: openai.OpenAI, lora_gateway: LoraGateway) -> None:
    chat(lclient, A)
    text = httpx.get(f"{lora_gateway.url}/metrics", timeout=30).text
    rows = [line for line in text.splitlines() if line.startswith("raygate:lora_sequences_total{")]
    mine = [line for line in rows if f'lora_name="{A}"' in line and f'model_name="{BASE}"' in line]
    assert mine and float(mine[0].rsplit(" ", 1)[1]) >= 1, rows
    assert any(line.startswith("raygate:lora_generation_tokens_total{") for line in text.splitlines())


def test_per_request_lora_scales_as_llama_server_takes_them(
    lclient: openai.OpenAI, lora_gateway: LoraGateway, backend: str
) -> None:
    """llama-server's `lora: [{"id": N, "scale": s}]` (ids from `GET /lora-adapters`, or by name)
    replaces the adapter `model` names: scale 0 is the base model's answer, scale 1 the
    adapter's; vLLM takes no other scale (400 naming the field)."""
    listed = httpx.get(f"{lora_gateway.url}/lora-adapters", params={"model": BASE}, timeout=30)
    assert listed.status_code == 200, listed.text
    ids = {entry["name"]: entry["id"] for entry in listed.json()}
    assert {A, B} <= set(ids) and all(entry["model"] == BASE for entry in listed.json())
    base, a = chat(lclient, BASE), chat(lclient, A)

    def with_lora(model: str, lora: list[dict[str, Any]]) -> str:
        r = lclient.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], extra_body={"lora": lora}, **GREEDY
        )
        return r.choices[0].message.content or ""

    assert with_lora(A, [{"id": ids[A], "scale": 0}]) == base
    assert with_lora(A, []) == base
    assert with_lora(BASE, [{"id": ids[A], "scale": 1}]) == a
    assert with_lora(BASE, [{"name": A, "scale": 1.0}]) == a

    def completion(model: str, **extra: Any) -> str:
        r = lclient.completions.create(model=model, prompt="Once upon a time, a cat", **extra, **GREEDY)
        return r.choices[0].text

    assert completion(BASE, extra_body={"lora": [{"id": ids[A], "scale": 1}]}) == completion(A)
    for bad, param in (([{"id": 99}], "lora[0].id"), ([{"name": "nope"}], "lora[0].name")):
        with pytest.raises(openai.BadRequestError) as caught:
            with_lora(BASE, bad)
        assert caught.value.body["param"] == param  # type: ignore[index]
    if backend == "vllm":
        with pytest.raises(openai.BadRequestError) as caught:
            with_lora(BASE, [{"id": ids[A], "scale": 0.5}])
        assert caught.value.body["param"] == "lora[0].scale"  # type: ignore[index]
    else:
        half = with_lora(BASE, [{"id": ids[A], "scale": 0.5}])
        assert with_lora(BASE, [{"id": ids[A], "scale": 0.5}]) == half  # cached by (adapter, scale)
        assert with_lora(BASE, [{"id": ids[A], "scale": 1}]) == a


def test_adapters_take_turns_beyond_max_loras(lclient: openai.OpenAI) -> None:
    """Requests alternating between the two adapters each get their own adapter's answer: on
    llama.cpp the gateway holds one adapter at a time (`lora: {max_loras: 1}`), so each request
    reads its adapter back from its file, evicting the other (vLLM swaps adapters itself)."""
    own = {m: chat(lclient, m) for m in (A, B)}
    for model in (A, B, A, B):
        assert chat(lclient, model) == own[model]
