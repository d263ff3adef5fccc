"""Ollama's API suite (tests/support/suites/ollama.py), which tests/e2e/test_ollama.py runs on the
default (llama.cpp) gateway, rerun unchanged against the same model names served by vLLM (this
folder's conftest points `gateway` at the vLLM gateway). Listed by name, as in
test_vllm_messages.py.

Left out (tests/e2e/test_ollama.py only): the metrics test (the default gateway's counters) and
the operations-gateway tests (keys, a late failure, a client that leaves, delete: gateway-side,
the same on every backend).
"""

from __future__ import annotations

from tests.support.suites.ollama import (  # noqa: F401
    test_bad_inputs_are_400_in_ollamas_body,
    test_chat_stream_lines_parse_and_end_with_done,
    test_chat_whole_counts_are_the_engines,
    test_curl_streams_ndjson,
    test_embed_and_embeddings,
    test_format_schema_and_json,
    test_generate_templated_raw_and_streamed,
    test_langchain_chat_ollama_and_embeddings,
    test_malformed_body_is_400,
    test_root_and_version_probes,
    test_tags_show_ps,
    test_tools_forced_call_and_round_trip,
    test_unknown_model_is_ollamas_404,
)
