"""The red-team schema and Unicode suite (issue #12; tests/support/suites/redteam.py), run unchanged
against the same model names served by vLLM (this folder's conftest points `gateway` at the vLLM
gateway): the limits live in protocol/, so vLLM's guided decoding (xgrammar) and tokenizer never see
what llama.cpp's grammar parser or tokenizer could not take, and both engines answer the same 400s.
Each test also checks that every replica (the vLLM ones included) is still the same process
afterwards."""

from __future__ import annotations

from tests.support.suites.redteam import (  # noqa: F401
    test_deeply_nested_json_is_400,
    test_lone_surrogate_is_400_naming_the_field,
    test_schema_at_the_limits_is_served,
    test_schema_over_a_limit_is_400_and_every_replica_survives,
    test_surrogate_pairs_and_odd_unknown_fields_are_not_refused,
    test_tools_over_the_per_request_totals_are_400,
)
