"""LangChain's OpenAI integrations, on the default (llama.cpp) gateway: the suite in
tests/support/suites/langchain.py, which tests/e2e/vllm/test_vllm_openai_suite.py reruns on vLLM."""

from __future__ import annotations

from tests.support.suites.langchain import (  # noqa: F401
    test_bind_tools_round_trip,
    test_chat_invoke_stream_batch,
    test_embeddings,
    test_with_structured_output,
)
