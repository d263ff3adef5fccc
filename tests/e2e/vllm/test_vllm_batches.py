"""The Files and Batch API suite (tests/support/suites/batches.py) rerun on the vLLM-served models:
this folder's conftest points `client` and `base_url` at the vLLM gateway, so batch lines go
through vLLM's engine and must come back shaped like its interactive answers.

Left out: keys, quotas and the restart (the store and the runner are the gateway's, not the
engine's: tests/e2e/test_batches.py covers them)."""

from __future__ import annotations

from tests.support.suites.batches import (  # noqa: F401
    test_chat_batch_completes_with_interactive_shaped_bodies,
    test_embeddings_batch,
)
