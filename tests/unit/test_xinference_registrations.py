"""Xinference registrations without Ray: prompt styles render as Xinference renders them, and every
refusal of a registration or launch names the problem and stores nothing (file included)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from raygate.backends.cluster.control.registrations import (
    REGISTRATIONS_FILE,
    Registrations,
    load_registrations,
)
from raygate.backends.cluster.stores.state_file import StateFileError
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError, ModelNotFoundError
from raygate.protocol.xinference import LaunchRequest, PromptStyle, chat_template

REPO = Path(__file__).resolve().parent.parent.parent
MINILM = REPO / "models" / "all-minilm-l6-v2.Q8_0.gguf"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": 'Hi "you"'},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "2+2?"},
]


def render(style: PromptStyle) -> str:
    formatter = Jinja2ChatFormatter(template=chat_template(style), eos_token="</s>", bos_token="<s>")
    return str(formatter(messages=CHAT).prompt)


def test_prompt_styles_render_like_xinference() -> None:
    chatml = PromptStyle(
        style_name="CHATML",
        roles=["<|im_start|>user", "<|im_start|>assistant"],
        intra_message_sep="<|im_end|>",
        inter_message_sep="\n",
    )
    assert render(chatml) == (
        '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi "you"<|im_end|>\n'
        "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    two = PromptStyle(
        style_name="ADD_COLON_TWO",
        system_prompt="ignored: a system message wins",
        roles=["USER", "ASSISTANT"],
        intra_message_sep=" ",
        inter_message_sep="</s>",
    )
    assert render(two) == 'Be brief. USER: Hi "you" ASSISTANT: Hello</s>USER: 2+2? ASSISTANT:'
    with pytest.raises(ValueError, match="not one Raygate renders"):
        PromptStyle(style_name="LLAMA9", roles=["a", "b"])


def embed_family(name: str, folder: Path) -> dict[str, Any]:
    return {
        "model_name": name,
        "model_ability": ["embed"],
        "max_tokens": 512,
        "model_specs": [
            {
                "model_format": "ggufv2",
                "quantizations": ["Q8_0"],
                "model_file_name_template": "all-minilm-l6-v2.{quantization}.gguf",
                "model_uri": str(folder),
            }
        ],
    }


def test_refusals_store_nothing_and_persisted_ones_come_back(tmp_path: Path) -> None:
    folder = tmp_path / "weights"
    folder.mkdir()
    shutil.copy(MINILM, folder / MINILM.name)
    builtin = ModelConfig(name="builtin-embed", task="embed", source={"path": str(MINILM)})  # type: ignore[arg-type]
    regs = Registrations(tmp_path, [builtin])
    regs.register("embedding", embed_family("mine", folder), persist=True)
    saved = (tmp_path / REGISTRATIONS_FILE).read_bytes()
    listing = regs.list("embedding", detailed=True)

    bad: list[tuple[Any, str]] = [
        (
            lambda: regs.register("embedding", embed_family("gone", tmp_path / "nowhere"), True),
            "do not exist",
        ),
        (lambda: regs.register("embedding", embed_family("mine", folder), True), "already registered"),
        (lambda: regs.register("embedding", embed_family("a b", folder), True), "model_name"),
        (lambda: regs.register("image", embed_family("img", folder), True), "not served"),
        (lambda: regs.register("embedding", {**embed_family("x", folder), "typo": 1}, True), "typo"),
        (lambda: regs.unregister("embedding", "builtin-embed"), "built-in"),
        (lambda: regs.launch_spec(LaunchRequest(model_name="nope", model_type="embedding")), "nope"),
        (
            lambda: regs.launch_spec(
                LaunchRequest(model_name="mine", model_type="embedding", model_engine="vLLM")
            ),
            "no spec Raygate can run",
        ),
        (
            lambda: regs.launch_spec(
                LaunchRequest(model_name="mine", model_type="embedding", model_engine="sglang")
            ),
            "cannot run engine `sglang`",
        ),
        (
            lambda: regs.launch_spec(
                LaunchRequest(model_name="mine", model_type="embedding", worker_ip="1.2.3.4")
            ),
            "worker_ip",
        ),
    ]
    for call, fragment in bad:
        with pytest.raises((BadRequestError, ModelNotFoundError)) as info:
            call()
        assert fragment in info.value.message, info.value.message
    assert (tmp_path / REGISTRATIONS_FILE).read_bytes() == saved
    assert regs.list("embedding", detailed=True) == listing

    spec = regs.launch_spec(
        LaunchRequest(model_name="mine", model_type="embedding", model_uid="e1", replica=2, n_threads=1)
    )
    assert spec.name == "e1" and spec.task == "embed" and spec.replicas == 2
    assert spec.engine == {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512, "n_threads": 1}
    assert spec.origin is not None and spec.origin.model_name == "mine"
    assert (
        regs.launch_spec(LaunchRequest(model_name="builtin-embed", model_type="embedding")).source
        == builtin.source
    )

    # The embedding built-in is also a `rerank` one (cosine, and it says so): the same deployment,
    # remembered as rerank so that Xinference's client hands out its rerank handle.
    rerank = regs.get("rerank", "builtin-embed")
    assert rerank.family.model_ability == ["rerank"] and "not a cross-encoder" in str(
        rerank.family.model_description
    )
    assert [r["model_name"] for r in regs.list("rerank", detailed=False)] == ["builtin-embed"]
    cosine = regs.launch_spec(LaunchRequest(model_name="builtin-embed", model_type="rerank", model_uid="r1"))
    assert cosine.task == "embed" and cosine.source == builtin.source
    assert cosine.origin is not None and cosine.origin.model_type == "rerank"
    assert cosine.origin.model_ability == ["rerank"] and cosine.origin.model_engine == "llama.cpp"

    # A new controller reads the persisted family back; an unpersisted one would be gone.
    again = Registrations(tmp_path, [builtin])
    assert {r["model_name"] for r in again.list("embedding", detailed=False)} == {"builtin-embed", "mine"}


def test_a_damaged_registrations_file_is_refused_with_its_path(tmp_path: Path) -> None:
    (tmp_path / REGISTRATIONS_FILE).write_text('{"format": 1, "registrations": [{"model_type": "LLM"}]}')
    with pytest.raises(StateFileError, match=REGISTRATIONS_FILE):
        load_registrations(tmp_path)


def test_a_launched_built_in_runs_the_launchs_replicas_whatever_its_autoscaling(tmp_path: Path) -> None:
    """models/default.yaml's embedding model loads on demand (autoscaling from zero); Xinference's
    launch loads a model now, on `replica` copies."""
    on_demand = ModelConfig(
        name="builtin-embed",
        task="embed",
        source={"path": str(MINILM)},  # type: ignore[arg-type]
        autoscaling={"min_replicas": 0, "max_replicas": 1},  # type: ignore[arg-type]
    )
    regs = Registrations(tmp_path, [on_demand])
    spec = regs.launch_spec(LaunchRequest(model_name="builtin-embed", model_type="embedding", replica=2))
    assert spec.replicas == 2 and spec.autoscaling is None and spec.source == on_demand.source
