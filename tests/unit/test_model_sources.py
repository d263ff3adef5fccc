"""Hub sources without a Hub: what a `source:` may say, which files a glob picks, the CLI's short
form. Downloads, pins and faults against a real Hub-compatible server: tests/e2e/test_model_sources.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from raygate.backends.engines.hub_download import Download
from raygate.backends.engines.hub_plan import PROJECTOR_GLOB, HubError, HubFile, HubPlan, pick
from raygate.backends.engines.model_files import ModelFileError, resolve_model_file
from raygate.backends.engines.model_hub import combined_progress, hub_downloads
from raygate.client.deploy_spec import hub_source
from raygate.protocol.capabilities import VisionConfig
from raygate.protocol.config import ModelConfig
from raygate.protocol.model_source import ModelSource

REPO = [
    "README.md",
    "model-Q4_K_M.gguf",
    "model-Q8_0.gguf",
    "big/model-Q6_K-00001-of-00003.gguf",
    "big/model-Q6_K-00002-of-00003.gguf",
    "big/model-Q6_K-00003-of-00003.gguf",
    "mmproj-f16.gguf",
]


def test_a_glob_picks_one_gguf_case_insensitively() -> None:
    assert pick(REPO, "*q4_k_m.gguf", folder=False) == ["model-Q4_K_M.gguf"]
    assert pick(REPO, "model-Q8_0.gguf", folder=False) == ["model-Q8_0.gguf"]


def test_any_shard_of_a_split_gguf_brings_all_of_them() -> None:
    shards = [n for n in REPO if n.startswith("big/")]
    assert pick(REPO, "*Q6_K*", folder=False) == shards
    assert pick(REPO, "*00002-of-00003.gguf", folder=False) == shards


def test_several_matches_are_refused_with_their_names() -> None:
    with pytest.raises(HubError) as err:
        pick(REPO, "model-*.gguf", folder=False)
    assert "model-Q4_K_M.gguf" in str(err.value) and "model-Q8_0.gguf" in str(err.value)
    with pytest.raises(HubError, match="matches"):
        pick(REPO, None, folder=False)  # no `file`: every GGUF matches


def test_no_match_lists_the_ggufs_there_are() -> None:
    with pytest.raises(HubError) as err:
        pick(REPO, "*IQ2_XS*", folder=False)
    assert "no file matches" in str(err.value) and "model-Q8_0.gguf" in str(err.value)
    with pytest.raises(HubError, match="holds no GGUF"):
        pick(["config.json", "model.safetensors"], None, folder=False)


def test_a_split_gguf_missing_a_shard_is_refused() -> None:
    with pytest.raises(HubError, match="2 of its 3 shards"):
        pick(REPO[:-2], "*Q6_K*", folder=False)


def test_a_whole_repository_for_vllm_leaves_other_formats_out() -> None:
    names = [
        "config.json",
        "model.safetensors",
        "pytorch_model.bin",
        "model-Q8_0.gguf",
        "original/consolidated.pth",
    ]
    assert pick(names, None, folder=True) == ["config.json", "model.safetensors"]
    assert pick(["config.json", "pytorch_model.bin"], None, folder=True) == [
        "config.json",
        "pytorch_model.bin",
    ]


@pytest.mark.parametrize(
    "source",
    [
        {"hf": "org/repo", "path": "/x.gguf"},
        {"hf": "org/repo", "modelscope": "org/repo"},
        {"path": "/x.gguf", "revision": "main"},
        {"path": "/x.gguf", "file": "x.gguf"},
        {"hf": "no-slash"},
        {"hf": "org/repo/extra"},
        {"hf": "org/repo", "revision": "../../etc"},
        {"hf": "org/repo", "file": "../x.gguf"},
    ],
)
def test_a_source_names_one_place(source: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        ModelSource.model_validate(source)


def test_hub_sources_validate_and_know_their_hub() -> None:
    hf = ModelSource.model_validate(
        {"hf": "ggml-org/gemma-3-1b-it-GGUF", "file": "*Q4_K_M.gguf", "revision": "v1.0"}
    )
    assert (hf.hub, hf.repo) == ("hf", "ggml-org/gemma-3-1b-it-GGUF")
    ms = ModelConfig.model_validate(
        {"name": "m", "backend": "vllm", "source": {"modelscope": "Qwen/Qwen3-0.6B"}}
    )
    assert ms.source is not None and (ms.source.hub, ms.source.repo) == ("modelscope", "Qwen/Qwen3-0.6B")


def test_a_hub_source_is_not_looked_for_on_the_local_disk() -> None:
    with pytest.raises(ModelFileError, match="downloads it on its own node"):
        resolve_model_file(ModelSource(hf="org/repo"))


def test_the_cli_short_form_names_the_quantisation() -> None:
    assert hub_source("hf", "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M", None) == {
        "hf": "ggml-org/gemma-3-1b-it-GGUF",
        "file": "*Q4_K_M*.gguf",
    }
    assert hub_source("hf", "Qwen/Qwen3-0.6B", None) == {"hf": "Qwen/Qwen3-0.6B"}
    assert hub_source("modelscope", "org/repo:Q8_0", "exact.gguf") == {
        "modelscope": "org/repo",
        "file": "exact.gguf",
    }


def test_a_download_bigger_than_the_free_disk_fails_before_the_first_byte(tmp_path: Path) -> None:
    huge = HubFile("model.gguf", 10**16, "0" * 64, "0" * 64)  # 10 PB: more than any disk here
    download = Download(ModelSource(hf="raygate-tests/none"), folder=False)
    download.plan = HubPlan("hf", "raygate-tests/none", "1" * 40, (huge,), False)
    with pytest.raises(HubError, match=r"not enough disk .*10000000\.00 GB needed, .* free"):
        download._check_disk(tmp_path)


def test_a_models_glob_never_picks_the_projector_and_the_projectors_glob_picks_it() -> None:
    repo = ["model-Q4_K_M.gguf", "mmproj-f16.gguf"]
    assert pick(repo, None, folder=False) == ["model-Q4_K_M.gguf"]  # the only GGUF that is a model
    with pytest.raises(HubError, match="no file matches"):
        pick(repo, "*f16.gguf", folder=False)
    assert pick(REPO, PROJECTOR_GLOB, folder=False) == ["mmproj-f16.gguf"]
    with pytest.raises(HubError, match="matches 2 files"):
        pick([*REPO, "mmproj-f32.gguf"], PROJECTOR_GLOB, folder=False)


def test_a_replica_fetches_its_hub_source_and_its_hub_projector() -> None:
    config = ModelConfig.model_validate(
        {
            "name": "vlm",
            "source": {"hf": "org/vlm-GGUF", "file": "*Q4_K_M.gguf", "revision": "1" * 40},
            "vision": {"projector": {"hf": "org/vlm-GGUF", "file": "mmproj-f16.gguf", "revision": "1" * 40}},
        }
    )
    downloads = hub_downloads(config)
    assert list(downloads) == ["source", "projector"]
    assert downloads["projector"].source == config.vision.projector  # type: ignore[union-attr]
    local = VisionConfig(projector=ModelSource(path="/models/mmproj.gguf"))
    assert list(hub_downloads(config.model_copy(update={"vision": local}))) == ["source"]


def test_a_replicas_progress_adds_up_its_downloads() -> None:
    def download(name: str, size: int, done: bool) -> Download:
        d = Download(ModelSource(hf="org/vlm-GGUF"), folder=False, done=done)
        d.plan = HubPlan("hf", "org/vlm-GGUF", "1" * 40, (HubFile(name, size),), False)
        return d

    both = combined_progress(
        {"source": download("m.gguf", 100, True), "projector": download("p.gguf", 10, True)}
    )
    assert both is not None and both.files == ["m.gguf", "p.gguf"]
    assert both.bytes_done == both.bytes_total == 110 and both.done
    unplanned = Download(ModelSource(hf="org/vlm-GGUF"), folder=False)
    half = combined_progress({"source": download("m.gguf", 100, True), "projector": unplanned})
    assert half is not None and half.bytes_total == 100 and not half.done


def test_the_cli_deploys_a_vision_model_from_a_hub_with_its_projector_left_to_the_deploy() -> None:
    from raygate.client.deploy_spec import model_spec
    from raygate.server.cli import build_parser

    args = build_parser().parse_args(
        ["deploy", "vlm", "--hf", "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M", "--vision"]
    )
    spec = model_spec(args)
    assert spec["vision"] == {} and spec["source"] == {
        "hf": "ggml-org/gemma-3-4b-it-GGUF",
        "file": "*Q4_K_M*.gguf",
    }
    assert ModelConfig.model_validate(spec).vision == VisionConfig()
    assert "vision" not in model_spec(build_parser().parse_args(["deploy", "txt", "--hf", "org/repo:Q8_0"]))
