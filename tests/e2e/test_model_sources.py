"""Models deployed by Hub id (`source: {hf: ...}`) against a real Hub-compatible server on loopback.

olah (tests/support/hub.py) serves git repositories built here from the GGUFs the project ships;
the gateway (its own embedded Ray, so the replicas inherit `HF_ENDPOINT` and `HF_HOME`) downloads
through the real `huggingface_hub`, into a cache under the test's tmp folder."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from playwright.sync_api import expect, sync_playwright

from raygate.protocol.generation import ImageInput
from tests.support.admin import wait_deployment
from tests.support.browser import launch_chromium
from tests.support.gateway import RAYGATE, REPO, GatewayProcess, start_gateway
from tests.support.hub import (
    OlahServer,
    commit_files,
    hf_env,
    lfs_object,
    lfs_pointer,
    projector_gguf,
    smollm2_gguf,
    split_gguf,
)
from tests.support.lora import PROMPT, build_adapters
from tests.support.vision import image, tiny_vlm

MINILM = REPO / "models" / "all-minilm-l6-v2.Q8_0.gguf"
GGUF_REPO = "raygate-tests/smollm2-GGUF"  # two GGUFs: a glob picks one
SPLIT_REPO = "raygate-tests/minilm-split-GGUF"
PIN_REPO = "raygate-tests/minilm-pinned-GGUF"
TWICE_REPO = "raygate-tests/minilm-twice-GGUF"
CUT_REPO = "raygate-tests/smollm2-cut-GGUF"
STOP_REPO = "raygate-tests/smollm2-stop-GGUF"
BAD_REPO = "raygate-tests/minilm-corrupt-GGUF"
HUGE_REPO = "raygate-tests/huge-GGUF"  # its listing says 10 PB
VISION_REPO = "raygate-tests/vision-GGUF"  # a model and its projector (`mmproj`)
TWO_PROJECTORS_REPO = "raygate-tests/two-projectors-GGUF"
LORA_REPO = "raygate-tests/smollm2-lora-a"  # adapter A as a GGUF LoRA and as PEFT files (docs/lora.md)
PROJECTOR = "mmproj-tiny-vlm-f16.gguf"
VLM_FILE = "tiny-vlm-Q8_0.gguf"
EMBED = {"task": "embed", "num_cpus": 0.25, "engine": {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512}}
CHAT = {"num_cpus": 0.25, "engine": {"n_ctx": 512, "n_threads": 1}}
LOAD_TIMEOUT = 300


@dataclass
class Hub:
    server: OlahServer
    home: Path
    commits: dict[str, str] = field(default_factory=dict)

    def blobs(self, repo: str) -> Path:
        return self.home / "hub" / f"models--{repo.replace('/', '--')}" / "blobs"

    def partials(self, repo: str) -> list[Path]:
        """What downloads of `repo` left mid-file, for the next one to resume."""
        return list(
            (self.home / "hub" / f"models--{repo.replace('/', '--')}" / "raygate" / "partial").iterdir()
        )

    def gets(self, repo: str, name: str) -> int:
        """Downloads of `name` olah has served (its access log)."""
        log = (self.server.root / "olah.log").read_text(errors="replace")
        return sum(
            1 for line in log.splitlines() if f'"GET /{repo}/resolve/' in line and f"/{name} HTTP" in line
        )


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("hub")
    server = OlahServer(root)
    hub = Hub(server, root / "hf-home")
    smollm2 = smollm2_gguf()
    hub.commits[GGUF_REPO] = commit_files(
        server.repo(GGUF_REPO),
        {"README.md": b"# test repo\n", smollm2.name: smollm2, MINILM.name: MINILM},
    )
    shards = split_gguf(MINILM, root / "split")
    hub.commits[SPLIT_REPO] = commit_files(server.repo(SPLIT_REPO), {p.name: p for p in shards})
    hub.commits[PIN_REPO] = commit_files(server.repo(PIN_REPO), {MINILM.name: MINILM}, "v1")
    hub.commits[TWICE_REPO] = commit_files(server.repo(TWICE_REPO), {MINILM.name: MINILM})
    hub.commits[CUT_REPO] = commit_files(server.repo(CUT_REPO), {smollm2.name: smollm2})
    hub.commits[STOP_REPO] = commit_files(server.repo(STOP_REPO), {smollm2.name: smollm2})
    hub.commits[BAD_REPO] = commit_files(server.repo(BAD_REPO), {MINILM.name: MINILM})
    # The object no longer matches the sha256 its pointer (the Hub's listing) names: same size.
    corrupt = lfs_object(server.repo(BAD_REPO), _oid(server.repo(BAD_REPO) / MINILM.name))
    data = bytearray(corrupt.read_bytes())
    data[-1000:] = bytes(1000)
    corrupt.write_bytes(bytes(data))
    huge = server.repo(HUGE_REPO)
    commit_files(huge, {MINILM.name: MINILM})
    (huge / MINILM.name).write_text(lfs_pointer(_oid(huge / MINILM.name), 10**16))
    hub.commits[HUGE_REPO] = commit_files(huge, {"README.md": b"the Hub says 10 PB\n"}, "huge")
    projector = projector_gguf(root / PROJECTOR)
    vlm = tiny_vlm()  # a real model and its projector: the replica loads both
    hub.commits[VISION_REPO] = commit_files(
        server.repo(VISION_REPO), {VLM_FILE: Path(vlm["gguf"]), PROJECTOR: Path(vlm["mmproj"])}
    )
    hub.commits[TWO_PROJECTORS_REPO] = commit_files(
        server.repo(TWO_PROJECTORS_REPO),
        {"tiny-vlm-Q4_1.gguf": smollm2, PROJECTOR: projector, "mmproj-tiny-vlm-f32.gguf": projector},
    )
    lora_gguf = build_adapters()["smollm2-lora-a"]
    hub.commits[LORA_REPO] = commit_files(
        server.repo(LORA_REPO),
        {p.name: p for p in lora_gguf.parent.iterdir() if p.suffix in (".gguf", ".json", ".safetensors")},
    )
    server.start()
    yield hub
    server.stop()


def _oid(pointer: Path) -> str:
    return pointer.read_text().split("oid sha256:")[1].split()[0]


@pytest.fixture(scope="module")
def gateway(hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway with its own embedded Ray, whose processes (controller, replicas) inherit the Hub
    settings: `HF_ENDPOINT` at olah, `HF_HOME` in the test's tmp folder."""
    log = tmp_path_factory.mktemp("hub-gateway") / "gateway.log"
    gw = start_gateway(
        ["--config", str(REPO / "tests" / "configs" / "embed-only.yaml")],
        log,
        env={**hf_env(hub.server.endpoint, hub.home), "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    yield gw
    code = gw.stop()
    assert code == 0, gw.log()[-3000:]


def deploy(url: str, spec: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/admin/deployments", json=spec, timeout=120)


def undeploy(url: str, name: str) -> None:
    httpx.delete(f"{url}/admin/deployments/{name}", params={"timeout": 0}, timeout=120)


def settled(status: dict[str, Any]) -> bool:
    return status["state"] in ("ready", "failed")


def test_a_gguf_picked_by_glob_is_downloaded_pinned_and_served(hub: Hub, gateway: GatewayProcess) -> None:
    r = deploy(gateway.url, {"name": "hub-chat", "source": {"hf": GGUF_REPO, "file": "*q4_1.gguf"}, **CHAT})
    assert r.status_code == 202, r.text
    # The deploy answered at once with the revision pinned to the commit `main` named.
    assert r.json()["spec"]["source"]["revision"] == hub.commits[GGUF_REPO]
    try:
        status = wait_deployment(gateway.url, "hub-chat", settled, LOAD_TIMEOUT)
        assert status["state"] == "ready", status
        download = status["replicas"][0]["download"]
        size = smollm2_gguf().stat().st_size
        assert download["done"] and download["files"] == [smollm2_gguf().name]
        assert download["bytes_done"] == download["bytes_total"] == size
        assert download["revision"] == hub.commits[GGUF_REPO]
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=120) as client:
            out = client.chat.completions.create(
                model="hub-chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        assert out.usage is not None and out.usage.completion_tokens > 0
    finally:
        undeploy(gateway.url, "hub-chat")


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ({"hf": GGUF_REPO, "file": "*.gguf"}, ["SmolLM2-135M-Instruct.Q4_1.gguf", MINILM.name]),
        ({"hf": GGUF_REPO}, ["SmolLM2-135M-Instruct.Q4_1.gguf", MINILM.name]),
        ({"hf": GGUF_REPO, "file": "*Q5_K_M.gguf"}, ["no file matches", MINILM.name]),
        ({"hf": "raygate-tests/no-such-repo", "file": "*.gguf"}, ["raygate-tests/no-such-repo", "not found"]),
        ({"hf": GGUF_REPO, "revision": "no-such-branch"}, [GGUF_REPO]),
    ],
    ids=["several-matches", "no-file-several-ggufs", "no-match", "unknown-repo", "unknown-revision"],
)
def test_a_source_that_picks_no_single_gguf_is_a_400(
    gateway: GatewayProcess, source: dict[str, Any], says: list[str]
) -> None:
    before = httpx.get(f"{gateway.url}/admin/deployments", timeout=30).json()["data"]
    r = deploy(gateway.url, {"name": "hub-bad", "source": source, **CHAT})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    for part in says:
        assert part in message, message
    after = httpx.get(f"{gateway.url}/admin/deployments", timeout=30).json()["data"]
    assert [d["name"] for d in after] == [d["name"] for d in before]  # the registry kept its models


def image_prompt_tokens(url: str, model: str, picture: ImageInput | None) -> int:
    """The prompt tokens of a one-token chat, with `picture` in it or not."""
    content: list[dict[str, Any]] = [{"type": "text", "text": "Describe the picture."}]
    if picture is not None:
        encoded = base64.b64encode(picture.data).decode()
        content.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}})
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def test_a_vision_model_takes_its_repositorys_projector_pinned_and_verified(
    hub: Hub, gateway: GatewayProcess
) -> None:
    """`vision:` without a projector, from a Hub GGUF repository: the deploy picks the repository's
    `mmproj` GGUF, pinned like the model, and the replica downloads and verifies both, then loads
    them: an image counts in the prompt."""
    spec = {"name": "hub-vision", "source": {"hf": VISION_REPO, "file": "*Q8_0.gguf"}, "vision": {}, **CHAT}
    r = deploy(gateway.url, spec)
    assert r.status_code == 202, r.text
    commit = hub.commits[VISION_REPO]
    projector = {k: v for k, v in r.json()["spec"]["vision"]["projector"].items() if v is not None}
    assert projector == {"hf": VISION_REPO, "file": PROJECTOR, "revision": commit}
    try:
        status = wait_deployment(gateway.url, "hub-vision", settled, LOAD_TIMEOUT)
        assert status["state"] == "ready", status
        download = status["replicas"][0]["download"]
        assert download["files"] == [VLM_FILE, PROJECTOR] and download["done"]
        vlm = tiny_vlm()
        sizes = Path(vlm["gguf"]).stat().st_size + Path(vlm["mmproj"]).stat().st_size
        assert download["bytes_done"] == download["bytes_total"] == sizes
        fetched = (
            hub.home / "hub" / f"models--{VISION_REPO.replace('/', '--')}" / "snapshots" / commit / PROJECTOR
        )
        assert fetched.read_bytes() == Path(tiny_vlm()["mmproj"]).read_bytes()
        with_image = image_prompt_tokens(gateway.url, "hub-vision", image("red"))
        assert with_image > image_prompt_tokens(gateway.url, "hub-vision", None)
    finally:
        undeploy(gateway.url, "hub-vision")


@pytest.mark.parametrize(
    ("repo", "says"),
    [
        (TWO_PROJECTORS_REPO, [PROJECTOR, "mmproj-tiny-vlm-f32.gguf", "vision.projector"]),
        (GGUF_REPO, ["no file matches `*mmproj*.gguf`", "vision.projector"]),
    ],
    ids=["two-projectors", "no-projector"],
)
def test_a_vision_model_without_one_projector_in_its_repository_is_a_400(
    gateway: GatewayProcess, repo: str, says: list[str]
) -> None:
    spec = {"name": "hub-vision-bad", "source": {"hf": repo, "file": "*Q4_1.gguf"}, "vision": {}, **CHAT}
    r = deploy(gateway.url, spec)
    assert r.status_code == 400, r.text
    for part in says:
        assert part in r.json()["error"]["message"], r.text
    assert httpx.get(f"{gateway.url}/admin/deployments/hub-vision-bad", timeout=30).status_code == 404


def test_a_split_gguf_is_fetched_whole_and_loads(hub: Hub, gateway: GatewayProcess) -> None:
    spec = {"name": "hub-split", "source": {"hf": SPLIT_REPO, "file": "*-00001-of-00002.gguf"}, **EMBED}
    r = deploy(gateway.url, spec)
    assert r.status_code == 202, r.text
    try:
        status = wait_deployment(gateway.url, "hub-split", settled, LOAD_TIMEOUT)
        assert status["state"] == "ready", status
        files = status["replicas"][0]["download"]["files"]
        assert files == [f"all-minilm-l6-v2.Q8_0-0000{i}-of-00002.gguf" for i in (1, 2)]
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=120) as client:
            assert len(client.embeddings.create(model="hub-split", input="hi").data[0].embedding) == 384
    finally:
        undeploy(gateway.url, "hub-split")


def test_the_revision_is_pinned_at_deploy_and_kept(hub: Hub, gateway: GatewayProcess) -> None:
    v1 = hub.commits[PIN_REPO]
    first = deploy(gateway.url, {"name": "hub-pin-a", "source": {"hf": PIN_REPO}, **EMBED})
    assert first.status_code == 202, first.text
    v2 = commit_files(hub.server.repo(PIN_REPO), {"README.md": b"v2\n"}, "v2")
    try:
        second = deploy(
            gateway.url, {"name": "hub-pin-b", "source": {"hf": PIN_REPO, "revision": "main"}, **EMBED}
        )
        old = deploy(gateway.url, {"name": "hub-pin-c", "source": {"hf": PIN_REPO, "revision": v1}, **EMBED})
        assert second.status_code == old.status_code == 202, (second.text, old.text)
        assert second.json()["spec"]["source"]["revision"] == v2 != v1
        assert old.json()["spec"]["source"]["revision"] == v1
        # What the registry holds for the first deployment did not move with the branch.
        status = wait_deployment(gateway.url, "hub-pin-a", settled, LOAD_TIMEOUT)
        assert status["spec"]["source"]["revision"] == v1
        assert status["state"] == "ready", status
        assert status["replicas"][0]["download"]["revision"] == v1
    finally:
        for name in ("hub-pin-a", "hub-pin-b", "hub-pin-c"):
            undeploy(gateway.url, name)


def test_a_lora_adapter_from_the_hub_is_pinned_fetched_and_applied(hub: Hub, gateway: GatewayProcess) -> None:
    """An adapter's `source: {hf: ...}` is pinned at deploy and fetched by the replica; at run time
    `lora_path: hf:ORG/REPO` does the same. The adapter changes the greedy answer; a repository
    that holds no LoRA for this model is refused naming the adapter, and the base keeps serving."""
    adapters = [{"name": "hub-lora-a", "source": {"hf": LORA_REPO}}]
    spec = {"name": "hub-lora-base", "source": {"hf": GGUF_REPO, "file": "*q4_1.gguf"}, "adapters": adapters}
    r = deploy(gateway.url, {**spec, **CHAT})
    assert r.status_code == 202, r.text
    assert r.json()["spec"]["adapters"][0]["source"]["revision"] == hub.commits[LORA_REPO]
    try:
        status = wait_deployment(gateway.url, "hub-lora-base", settled, LOAD_TIMEOUT)
        assert status["state"] == "ready", status
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=120) as client:

            def chat(model: str) -> str:
                out = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": PROMPT}],
                    max_tokens=16,
                    temperature=0,
                )
                return out.choices[0].message.content or ""

            base, a = chat("hub-lora-base"), chat("hub-lora-a")
            assert a != base
            body = {
                "lora_name": "hub-lora-c",
                "lora_path": f"hf:{LORA_REPO}",
                "base_model_name": "hub-lora-base",
            }
            loaded = httpx.post(f"{gateway.url}/v1/load_lora_adapter", json=body, timeout=120)
            assert loaded.status_code == 200, loaded.text
            assert chat("hub-lora-c") == a
            for bad in (f"hf:{PIN_REPO}", "hf:raygate-tests/no-such-adapter"):  # an embedding GGUF; nothing
                body = {"lora_name": "hub-lora-bad", "lora_path": bad, "base_model_name": "hub-lora-base"}
                refused = httpx.post(f"{gateway.url}/v1/load_lora_adapter", json=body, timeout=120)
                assert refused.status_code == 400, refused.text
                assert "hub-lora-bad" in refused.json()["error"]["message"], refused.text
            assert chat("hub-lora-base") == base
    finally:
        undeploy(gateway.url, "hub-lora-base")


def test_two_replicas_on_one_node_download_once(hub: Hub, gateway: GatewayProcess) -> None:
    spec = {"name": "hub-twice", "source": {"hf": TWICE_REPO, "file": "*Q8_0.gguf"}, "replicas": 2, **EMBED}
    r = deploy(gateway.url, spec)
    assert r.status_code == 202, r.text
    try:
        status = wait_deployment(gateway.url, "hub-twice", settled, LOAD_TIMEOUT)
        assert status["state"] == "ready" and status["ready"] == 2, status
        assert hub.gets(TWICE_REPO, MINILM.name) == 1
        downloads = [rep["download"] for rep in status["replicas"]]
        assert {d["revision"] for d in downloads} == {hub.commits[TWICE_REPO]}
    finally:
        undeploy(gateway.url, "hub-twice")


def test_a_node_with_the_files_needs_no_hub(hub: Hub, gateway: GatewayProcess) -> None:
    """With the Hub down (and the replica offline, `HF_HUB_OFFLINE=1`), a pinned source that this
    node fetched before loads from the cache."""
    source = {"hf": TWICE_REPO, "file": "*Q8_0.gguf", "revision": hub.commits[TWICE_REPO]}
    warm = deploy(gateway.url, {"name": "hub-warm", "source": source, **EMBED})
    assert warm.status_code == 202, warm.text
    try:
        assert wait_deployment(gateway.url, "hub-warm", settled, LOAD_TIMEOUT)["state"] == "ready"
    finally:
        undeploy(gateway.url, "hub-warm")
    hub.server.stop()
    try:
        spec = {"name": "hub-offline", "source": source, "env": {"HF_HUB_OFFLINE": "1"}, **EMBED}
        r = deploy(gateway.url, spec)
        assert r.status_code == 202, r.text
        status = wait_deployment(gateway.url, "hub-offline", settled, LOAD_TIMEOUT)
        assert status["state"] == "ready", status
        assert status["replicas"][0]["download"]["cached"] is True
        # A branch cannot be pinned while the Hub is down: said at deploy time.
        r = deploy(gateway.url, {"name": "hub-unpinned", "source": {"hf": TWICE_REPO}, **EMBED})
        assert r.status_code == 400, r.text
    finally:
        undeploy(gateway.url, "hub-offline")
        hub.server.start()


def downloading(url: str, name: str) -> dict[str, Any]:
    """The deployment's status once its download has bytes on disk (olah serves ~100 MB in
    seconds on a busy box; the controller reads progress every half second)."""
    status = wait_deployment(
        url, name, lambda s: settled(s) or (s["download"] or {}).get("bytes_done", 0) > 0, LOAD_TIMEOUT
    )
    assert status["state"] == "downloading", status
    return status


def test_a_download_cut_by_the_server_dying_recovers(hub: Hub, gateway: GatewayProcess) -> None:
    """Its progress is in /admin, /metrics and the web console's model list while it downloads
    and while the Hub is away; then it completes. (That it resumes from the bytes on the node is
    tests/e2e/test_hub_resume.py: olah's mirror mode here answers every request with the whole file.)"""
    size = smollm2_gguf().stat().st_size
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page()
        page.set_default_timeout(120_000)
        page.goto(f"{gateway.url}/ui")  # the model list, refreshed every 2 s
        r = deploy(gateway.url, {"name": "hub-cut", "source": {"hf": CUT_REPO}, **CHAT})
        assert r.status_code == 202, r.text
        try:
            progress = downloading(gateway.url, "hub-cut")["download"]
            assert 0 < progress["bytes_done"] <= progress["bytes_total"] == size
            assert progress["bytes_per_s"] >= 0 and progress["repo"] == CUT_REPO and not progress["done"]
            metrics = httpx.get(f"{gateway.url}/metrics", timeout=30).text.splitlines()
            totals = [
                float(line.rsplit(" ", 1)[1])
                for line in metrics
                if line.startswith("raygate:model_download_bytes{")
                and 'kind="total"' in line
                and '"hub-cut"' in line
            ]
            assert totals == [size], [m for m in metrics if "download" in m]
            hub.server.stop()  # the connection drops mid-file; the deployment keeps downloading
            card = page.locator("article.deployment[data-name='hub-cut']")
            expect(card.locator(".head .state")).to_have_text("downloading", timeout=60_000)
            for bar in ("div.download progress", "td.download progress"):
                expect(card.locator(bar)).to_have_attribute("max", str(size))
                # the list is redrawn every 2 s: one drawn before the first bytes landed shows 0
                page.wait_for_function(
                    "([sel, size]) => { const b = document.querySelector(sel);"
                    " return b !== null && b.value > 0 && b.value < size; }",
                    arg=[f"article.deployment[data-name='hub-cut'] {bar}", size],
                    timeout=30_000,
                )
            total = f"{size / 1e6:.1f} MB"
            expect(card.locator("div.download .words")).to_contain_text(f"/ {total} ·")
            expect(card.locator("div.download .words")).to_contain_text("/s")
            hub.server.start()
            status = wait_deployment(gateway.url, "hub-cut", settled, LOAD_TIMEOUT)
            assert status["state"] == "ready", status
            download = status["replicas"][0]["download"]
            assert download["done"] and download["bytes_done"] == download["bytes_total"] == size
            assert hub.gets(CUT_REPO, smollm2_gguf().name) >= 2  # asked for again after the cut
            expect(card.locator("div.download")).to_be_hidden()
            expect(card.locator("td.download .words")).to_contain_text(f"{total} / {total} · done")
        finally:
            if not hub.server.running:  # the tests after this one need the Hub
                hub.server.start()
            undeploy(gateway.url, "hub-cut")
            browser.close()


def test_an_undeploy_while_downloading_stops_the_download(hub: Hub, gateway: GatewayProcess) -> None:
    r = deploy(gateway.url, {"name": "hub-stop", "source": {"hf": STOP_REPO}, **CHAT})
    assert r.status_code == 202, r.text
    downloading(gateway.url, "hub-stop")
    undeploy(gateway.url, "hub-stop")
    assert httpx.get(f"{gateway.url}/admin/deployments/hub-stop", timeout=30).status_code == 404
    partial = hub.partials(STOP_REPO)  # kept: the next download of the file resumes from it
    assert len(partial) == 1, partial
    size = partial[0].stat().st_size
    time.sleep(3)  # a download still running would have grown it (it moves megabytes a second)
    assert partial[0].stat().st_size == size < smollm2_gguf().stat().st_size


def test_a_file_whose_hash_does_not_match_is_deleted_and_fails_the_deployment(
    hub: Hub, gateway: GatewayProcess
) -> None:
    r = deploy(gateway.url, {"name": "hub-corrupt", "source": {"hf": BAD_REPO}, **EMBED})
    assert r.status_code == 202, r.text
    try:
        status = wait_deployment(gateway.url, "hub-corrupt", settled, LOAD_TIMEOUT)
        assert status["state"] == "failed", status
        assert "sha256" in (status["error"] or ""), status
        blobs = hub.blobs(BAD_REPO)
        assert not [p for p in blobs.iterdir() if p.stat().st_size > 1_000_000] if blobs.exists() else True
        # The registry's other models are untouched.
        assert wait_deployment(gateway.url, "minilm", settled, 60)["state"] == "ready"
    finally:
        undeploy(gateway.url, "hub-corrupt")


def test_a_download_bigger_than_the_free_disk_fails_before_downloading(
    hub: Hub, gateway: GatewayProcess
) -> None:
    r = deploy(gateway.url, {"name": "hub-huge", "source": {"hf": HUGE_REPO}, **EMBED})
    assert r.status_code == 202, r.text
    try:
        status = wait_deployment(gateway.url, "hub-huge", settled, LOAD_TIMEOUT)
        assert status["state"] == "failed", status
        assert (
            "not enough disk" in status["error"] and "needed" in status["error"] and "free" in status["error"]
        )
        assert hub.gets(HUGE_REPO, MINILM.name) == 0
    finally:
        undeploy(gateway.url, "hub-huge")


def test_the_cli_short_form_deploys_a_quantisation(hub: Hub, gateway: GatewayProcess) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [str(RAYGATE), "deploy", "hub-cli", "--hf", f"{TWICE_REPO}:Q8_0", "--task", "embed", "--num-cpus", "0.25",
         "--engine", "n_ctx=512", "--url", gateway.url, "--timeout", str(LOAD_TIMEOUT)],
        env=env, capture_output=True, text=True, timeout=LOAD_TIMEOUT + 60,
    )  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        status = httpx.get(f"{gateway.url}/admin/deployments/hub-cli", timeout=30).json()
        source = {k: v for k, v in status["spec"]["source"].items() if v is not None}
        assert source == {
            "hf": TWICE_REPO,
            "file": "*Q8_0*.gguf",
            "revision": hub.commits[TWICE_REPO],
        }
    finally:
        undeploy(gateway.url, "hub-cli")


def test_an_xinference_launch_by_model_id_deploys_from_the_hub(hub: Hub, gateway: GatewayProcess) -> None:
    from xinference_client import RESTfulClient

    family = {
        "version": 1,
        "context_length": 512,
        "model_name": "hub-xi",
        "model_lang": ["en"],
        "model_ability": ["generate"],
        "model_specs": [
            {
                "model_format": "ggufv2",
                "quantizations": ["Q4_1"],
                "model_id": GGUF_REPO,
                "model_hub": "huggingface",
                "model_file_name_template": "SmolLM2-135M-Instruct.{quantization}.gguf",
            }
        ],
    }
    client = RESTfulClient(gateway.url)
    client.register_model("LLM", json.dumps(family), persist=False)
    try:
        uid = client.launch_model("hub-xi", model_type="LLM", model_engine="llama.cpp", quantization="Q4_1")
        status = httpx.get(f"{gateway.url}/admin/deployments/{uid}", timeout=30).json()
        assert status["state"] == "ready", status
        source = {k: v for k, v in status["spec"]["source"].items() if v is not None}
        assert source == {
            "hf": GGUF_REPO,
            "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "revision": hub.commits[GGUF_REPO],
        }
        client.terminate_model(uid)
    finally:
        client.unregister_model("LLM", "hub-xi")


def test_ollamas_pull_deploys_a_hub_gguf_and_streams_its_progress(hub: Hub, gateway: GatewayProcess) -> None:
    """`ollama pull hf.co/ORG/REPO:QUANT` through the `ollama` client: progress lines from the
    deployment's own download, then the model answers under the name it was pulled by."""
    name = f"hf.co/{GGUF_REPO}:Q4_1"
    with ollama.Client(host=gateway.url, timeout=LOAD_TIMEOUT) as client:
        pull_and_chat(client, hub, gateway, name)


def pull_and_chat(client: ollama.Client, hub: Hub, gateway: GatewayProcess, name: str) -> None:
    try:
        lines = list(client.pull(name, stream=True))
        statuses = [line.status for line in lines]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
        assert "verifying sha256 digest" in statuses
        source = deployments_of(gateway.url)["smollm2-gguf-q4_1"]["spec"]["source"]
        assert (source["hf"], source["file"], source["revision"]) == (
            GGUF_REPO,
            "*Q4_1*.gguf",
            hub.commits[GGUF_REPO],
        )
        answer = client.chat(
            model=name, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4}
        )
        assert answer.done and (answer.eval_count or 0) > 0
        assert client.pull(name, stream=False).status == "success"  # pulled already: nothing to do
    finally:
        undeploy(gateway.url, "smollm2-gguf-q4_1")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("llama3.2", "hf.co/ORG/REPO:QUANT"),
        ("hf.co/raygate-tests/no-such-repo:Q4_K_M", "not found"),
        (f"hf.co/{GGUF_REPO}:Q5_K_M", "no file matches"),
    ],
)
def test_ollamas_pull_of_what_cannot_be_pulled_is_a_400(
    gateway: GatewayProcess, name: str, says: str
) -> None:
    with (
        pytest.raises(ollama.ResponseError) as caught,
        ollama.Client(host=gateway.url, timeout=120) as client,
    ):
        client.pull(name)
    assert caught.value.status_code == 400 and says in caught.value.error, caught.value.error
    assert not any(n.startswith("no-such-repo") for n in deployments_of(gateway.url))


def deployments_of(url: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{url}/admin/deployments", timeout=30)
    assert r.status_code == 200, r.text
    return {d["name"]: d for d in r.json()["data"]}
