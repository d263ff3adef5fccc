"""The registry file: deployment specs persisted under the state directory.

Only the *desired* state is stored (the specs, as `ModelConfig` JSON); replica states are live
facts that a restart re-creates. Writes go to a temporary file in the same folder, are fsynced and
then renamed over the old file, so a crash leaves either the old or the new registry, never half.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from raygate.protocol.base import describe_errors
from raygate.protocol.config import ModelConfig

STATE_FILE = "registry.json"
FORMAT = 1


class StateFileError(ValueError):
    """The registry file exists but cannot be read back."""


def state_file(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def load_specs(state_dir: Path) -> list[ModelConfig] | None:
    """The persisted specs, or None when there is no registry file yet (first start)."""
    path = state_file(state_dir)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise StateFileError(f"cannot read registry {path}: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise StateFileError(f"registry {path} is not a format-{FORMAT} Raygate registry")
    try:
        return [ModelConfig.model_validate(d) for d in raw.get("deployments", [])]
    except ValidationError as exc:
        raise StateFileError(
            f"registry {path} holds an invalid deployment:\n{describe_errors(exc)}"
        ) from None


def save_specs(state_dir: Path, specs: list[ModelConfig]) -> None:
    body = {
        "format": FORMAT,
        "saved_at": time.time(),
        "deployments": [s.model_dump(mode="json") for s in specs],
    }
    write_json(state_dir, STATE_FILE, body)


def write_json(state_dir: Path, name: str, body: dict[str, Any]) -> None:
    """Replace `state_dir/name` with `body` atomically (temporary file, fsync, rename, fsync the
    folder): the registry and the Xinference registrations file share this one writer."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=state_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, state_dir / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
