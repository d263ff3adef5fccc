"""Tools through the openai SDK: forced, automatic and streamed calls, follow-up turns, on the
default (llama.cpp) gateway: the suite in tests/support/suites/tools.py, which
tests/e2e/vllm/test_vllm_openai_suite.py reruns on vLLM."""

from __future__ import annotations

from tests.support.suites.tools import (  # noqa: F401
    test_auto_lets_the_model_choose,
    test_bad_tool_requests_are_400,
    test_follow_up_turn_with_tool_results,
    test_named_choice_forces_that_function,
    test_none_never_calls,
    test_required_forces_a_call,
    test_required_parallel_calls_are_each_valid,
    test_streamed_calls_carry_index_on_every_piece,
    test_tool_message_needs_its_call_id,
)
