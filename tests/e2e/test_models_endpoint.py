"""`/v1/models` list and retrieve, and `/health`, on the default (llama.cpp) gateway: the suite in
tests/support/suites/models_endpoint.py, which tests/e2e/vllm/test_vllm_openai_suite.py reruns on
vLLM."""

from __future__ import annotations

from tests.support.suites.models_endpoint import (  # noqa: F401
    test_health,
    test_list_models,
    test_retrieve_model,
)
