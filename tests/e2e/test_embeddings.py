"""Embeddings: input forms, encodings, normalisation, meaning, on the default (llama.cpp) gateway:
the suite in tests/support/suites/embeddings.py, which tests/e2e/vllm/test_vllm_openai_suite.py
reruns on vLLM."""

from __future__ import annotations

from tests.support.suites.embeddings import (  # noqa: F401
    test_dimensions_truncate_and_renormalise,
    test_float_response_shape,
    test_sdk_default_base64_batch_and_meaning,
    test_token_id_input,
)
