"""The registry file and the placement check, without Ray: round trip, atomic replace, clear
errors for a damaged file, and which clusters can host which replicas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygate.backends.cluster.runtime.placement import infeasible_reason, replica_demand
from raygate.backends.cluster.stores.state_file import StateFileError, load_specs, save_specs, state_file
from raygate.protocol.config import ModelConfig

SPECS = [
    ModelConfig.model_validate(
        {
            "name": "a",
            "aliases": ["x"],
            "source": {"path": "/m/a.gguf"},
            "replicas": 2,
            "engine": {"n_ctx": 512},
        }
    ),
    ModelConfig.model_validate(
        {"name": "b", "task": "embed", "source": {"package": "p", "file": "b.gguf"}, "resources": {"side": 1}}
    ),
]


def test_round_trip(tmp_path: Path) -> None:
    assert load_specs(tmp_path) is None  # no file yet: the config seeds the registry
    save_specs(tmp_path / "nested", SPECS)
    assert load_specs(tmp_path / "nested") == SPECS
    save_specs(tmp_path / "nested", SPECS[:1])
    assert load_specs(tmp_path / "nested") == SPECS[:1]
    assert [p.name for p in (tmp_path / "nested").iterdir()] == ["registry.json"]  # no temp file left


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_specs(tmp_path, SPECS)

    def disk_full(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("raygate.backends.cluster.stores.state_file.os.replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_specs(tmp_path, SPECS[:1])
    monkeypatch.undo()
    assert load_specs(tmp_path) == SPECS
    assert [p.name for p in tmp_path.iterdir()] == ["registry.json"]  # the temporary file is gone


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "cannot read registry"),
        (json.dumps({"format": 99, "deployments": []}), "not a format-1"),
        (json.dumps({"format": 1, "deployments": [{"name": "a", "sorce": {}}]}), "invalid deployment"),
    ],
)
def test_a_damaged_file_is_a_clear_error(tmp_path: Path, content: str, fragment: str) -> None:
    state_file(tmp_path).write_text(content)
    with pytest.raises(StateFileError, match=fragment):
        load_specs(tmp_path)


def test_placement_uses_alive_node_totals() -> None:
    head = {"Alive": True, "Resources": {"CPU": 4.0}}
    side = {"Alive": True, "Resources": {"CPU": 1.0, "side": 1.0}}
    dead_gpu = {"Alive": False, "Resources": {"CPU": 8.0, "GPU": 1.0}}
    assert replica_demand(SPECS[1]) == {"CPU": 1.0, "side": 1.0}
    assert infeasible_reason(replica_demand(SPECS[1]), [head, side]) is None
    why = infeasible_reason(replica_demand(SPECS[1]), [head])
    assert why is not None and "'side': 1.0" in why and "1 alive node" in why
    gpu = SPECS[0].model_copy(update={"num_gpus": 1.0})
    assert infeasible_reason(replica_demand(gpu), [head, side, dead_gpu]) is not None
