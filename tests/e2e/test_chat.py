"""Chat completions through the openai SDK, on the default (llama.cpp) gateway: the suite in
tests/support/suites/chat.py, which tests/e2e/vllm/test_vllm_openai_suite.py reruns on vLLM."""

from __future__ import annotations

from tests.support.suites.chat import (  # noqa: F401
    test_alias_reaches_model,
    test_content_parts_and_roles,
    test_greedy_is_deterministic_and_seed_repeats,
    test_max_completion_tokens_is_honoured,
    test_n_choices,
    test_non_stream_shape_and_usage,
    test_raw_sse_framing,
    test_stop_in_stream,
    test_stop_sequence_ends_text_without_leaking,
    test_stream_with_usage,
)
