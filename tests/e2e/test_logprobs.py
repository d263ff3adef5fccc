"""Log-probabilities in both of OpenAI's formats, streamed and not, on the default (llama.cpp)
gateway: the suite in tests/support/suites/logprobs.py, which
tests/e2e/vllm/test_vllm_openai_suite.py reruns on vLLM."""

from __future__ import annotations

from tests.support.suites.logprobs import (  # noqa: F401
    test_chat_logprobs_shape_and_values,
    test_chat_logprobs_stream,
    test_completions_echo_scores_the_prompt,
    test_completions_logprobs,
    test_completions_logprobs_stream,
    test_top_logprobs_needs_logprobs,
)
