"""The models the session's default gateway serves (models/default.yaml), by the names requests use.

The vLLM gateway (examples/vllm-cpu.yaml) serves the same names, so the suites in
tests/support/suites run unchanged against either."""

from __future__ import annotations

from tests.support.gateway import REPO

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"
DEFAULT_CONFIG = REPO / "models" / "default.yaml"
