"""The Messages API suite (tests/support/suites/messages.py), which tests/e2e/test_messages.py runs
on the default (llama.cpp) gateway, rerun unchanged against the same model names served by vLLM
(this folder's conftest points `gateway` at the vLLM gateway, and tests/e2e/conftest.py's
`anthropic_client` follows it). Listed by name, as in test_vllm_openai_suite.py.

Left out (tests/e2e/test_messages.py only): the operations-gateway errors (keys, limits, fault injection: gateway-side, the same on
every backend) and the metrics test (the default gateway's counters).
"""

from __future__ import annotations

from tests.support.suites.messages import (  # noqa: F401
    test_any_forces_a_schema_valid_call,
    test_bad_requests_are_400,
    test_count_tokens_equals_create_usage,
    test_create_shape_and_usage,
    test_image_block_is_a_clear_400,
    test_max_tokens_is_honoured,
    test_missing_max_tokens_is_400,
    test_named_tool_forces_that_tool_once,
    test_none_never_calls,
    test_output_format_constrains_the_text,
    test_sdk_stream_accumulates,
    test_stop_sequence_is_reported,
    test_stream_events_in_order,
    test_streamed_input_json_parses_to_valid_input,
    test_system_blocks_and_block_content,
    test_tool_result_round_trip,
    test_unknown_model_and_route_are_404,
)
