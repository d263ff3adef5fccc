"""Text completions: prompt forms, echo, streaming, usage, on the default (llama.cpp) gateway: the
suite in tests/support/suites/completions.py, which tests/e2e/vllm/test_vllm_openai_suite.py reruns
on vLLM."""

from __future__ import annotations

from tests.support.suites.completions import (  # noqa: F401
    test_completion_shape,
    test_default_max_tokens_is_16,
    test_echo,
    test_several_prompts,
    test_stream_with_usage,
    test_token_id_prompt_matches_text_prompt,
)
