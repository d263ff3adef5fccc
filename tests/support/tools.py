"""Two tools in the OpenAI shape, shared by the tool-call suite (tests/support/suites/tools.py), the
engine tests and the batched-API test.

Every tool's parameters bound their strings, so one call has a longest text (`CALL_TOKENS`); with
that budget a single forced call must end (`tool_calls`) on any machine, whatever the model
writes into it."""

from __future__ import annotations

from typing import Any

from tests.support.structured import max_call_bytes

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 20}},
    "required": ["zone"],
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a time zone",
            "parameters": TIME_PARAMS,
        },
    },
]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
CALL_TOKENS = max_call_bytes(TOOLS)  # one call always ends within this many tokens
