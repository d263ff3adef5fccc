"""`response_format`: JSON that validates against the requested schema, on the default (llama.cpp)
gateway: the suite in tests/support/suites/structured_output.py, which
tests/e2e/vllm/test_vllm_openai_suite.py reruns on vLLM."""

from __future__ import annotations

from tests.support.suites.structured_output import (  # noqa: F401
    test_bad_formats_are_400,
    test_json_object,
    test_json_schema_output_validates,
    test_json_schema_streamed,
    test_sdk_parse_with_pydantic_model,
)
