"""The core Responses API tests (tests/support/suites/responses.py) rerun on the vLLM-served models:
this folder's conftest points `client` and `base_url` at the vLLM gateway, so the same requests go
through vLLM's engine (guided decoding for the formats and forced calls) and must meet the same
guarantees. A separate file from test_vllm_openai_suite.py so the two lists evolve on their own.

Left out: the per-key and two-gateway store tests (the store is the gateway's, not the engine's) and
the agents Runner (one more client over the same requests)."""

from __future__ import annotations

from tests.support.suites.responses import (  # noqa: F401
    test_bad_input,
    test_chat_json_object_with_schema_is_a_constraint,
    test_json_object_output,
    test_json_schema_output,
    test_max_output_tokens_makes_it_incomplete,
    test_named_tool_choice_and_streamed_call,
    test_parallel_tool_calls_false_allows_one_call,
    test_plain_create_shape_and_usage,
    test_previous_response_id_continues_the_conversation,
    test_retrieve_input_items_delete,
    test_stream_event_sequence,
    test_tools_round_trip,
)
