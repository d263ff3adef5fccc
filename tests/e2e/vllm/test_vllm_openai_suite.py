"""The OpenAI-level suites (tests/support/suites), which tests/e2e runs on the default (llama.cpp)
gateway, run unchanged against the same model names served by vLLM (this folder's conftest points
`client`, `base_url` ... at the vLLM gateway). Listed by name rather than `*`-imported: a test
added to a suite for a feature the vLLM backend does not map yet should be added here
deliberately, not fail here by surprise.

Left out (tests/e2e only), with the vLLM version in test_vllm_backend.py: the unsupported-field and suffix tests
(they name the llama_cpp backend), /tokenize (vLLM's tokenizers spell word pieces differently), the
disconnect test (vLLM's proves more) and the two-replica spread (this config runs one replica: one
engine batches everything).
"""

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
)
from tests.support.suites.chat import test_stream_with_usage as test_chat_stream_with_usage  # noqa: F401
from tests.support.suites.completions import (  # noqa: F401
    test_completion_shape,
    test_default_max_tokens_is_16,
    test_echo,
    test_several_prompts,
    test_token_id_prompt_matches_text_prompt,
)
from tests.support.suites.completions import (  # noqa: F401
    test_stream_with_usage as test_completion_stream_with_usage,
)
from tests.support.suites.embeddings import (  # noqa: F401
    test_dimensions_truncate_and_renormalise,
    test_float_response_shape,
    test_sdk_default_base64_batch_and_meaning,
    test_token_id_input,
)
from tests.support.suites.errors import (  # noqa: F401
    test_bad_chat_bodies_are_400,
    test_bad_embedding_inputs,
    test_context_length_exceeded,
    test_huge_invalid_body_gets_bounded_error,
    test_malformed_bodies_are_400,
    test_unknown_fields_are_accepted,
    test_unknown_model_is_404_and_sdk_raises,
    test_unknown_route_and_method,
)
from tests.support.suites.langchain import (  # noqa: F401
    test_bind_tools_round_trip,
    test_chat_invoke_stream_batch,
    test_embeddings,
    test_with_structured_output,
)
from tests.support.suites.logprobs import (  # noqa: F401
    test_chat_logprobs_shape_and_values,
    test_chat_logprobs_stream,
    test_completions_echo_scores_the_prompt,
    test_completions_logprobs,
    test_completions_logprobs_stream,
    test_top_logprobs_needs_logprobs,
)
from tests.support.suites.models_endpoint import test_health, test_list_models, test_retrieve_model  # noqa: F401
from tests.support.suites.parameters import (  # noqa: F401
    test_a_stream_sends_a_chunk_per_token_while_a_character_is_incomplete,
    test_bad_logit_bias_is_400,
    test_developer_role_is_a_system_turn,
    test_logit_bias_forces_and_bans,
    test_tokenizer_errors,
)
from tests.support.suites.sampling_extras import (  # noqa: F401
    test_a_regex_llama_cpp_cannot_express_is_400,
    test_bad_extensions_are_400_naming_the_field,
    test_bad_words_and_allowed_token_ids,
    test_choice,
    test_gbnf_grammar,
    test_ignore_eos_runs_to_max_tokens,
    test_include_stop_str_in_output_keeps_the_stop_string,
    test_json_schema,
    test_min_tokens_holds_off_the_end,
    test_regex,
    test_repetition_penalty_covers_the_prompt,
    test_skip_special_tokens_false_shows_them,
    test_stop_token_ids_end_generation,
    test_top_k_1_and_min_p_1_equal_greedy,
    test_truncate_prompt_tokens_keeps_the_end,
)
from tests.support.suites.streaming import test_curl_streaming  # noqa: F401
from tests.support.suites.structured_output import (  # noqa: F401
    test_bad_formats_are_400,
    test_json_object,
    test_json_schema_output_validates,
    test_json_schema_streamed,
    test_sdk_parse_with_pydantic_model,
)
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
