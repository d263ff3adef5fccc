"""The Responses API (`/v1/responses`) on the default (llama.cpp) gateway: the suite every backend
passes (tests/support/suites/responses.py; tests/e2e/vllm/test_vllm_responses.py reruns it on
vLLM), then what is checked here only: `instructions`, `store: false`, unknown models and ids, and
the openai-agents `Runner`.

Every body is validated against OpenAI's published spec; assertions are about what the feature
guarantees, never the text a tiny model writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import openai
import pytest
from pydantic import Field

from tests.support.models import CHAT_MODEL
from tests.support.structured import max_call_bytes
from tests.support.suites.responses import (  # noqa: F401
    assert_error,
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


def test_instructions_reach_the_model(client: openai.OpenAI) -> None:
    """Instructions are the system turn (the template's default system prompt gives way to them)."""
    short, long = (
        "Be brief.",
        "Be brief. " + "Answer in French, in one short sentence, and nothing else. " * 3,
    )
    usage = []
    for instructions in (short, long):
        out = client.responses.create(
            model=CHAT_MODEL, input="Hi", instructions=instructions, max_output_tokens=16, temperature=0
        )
        assert out.instructions == instructions and out.usage is not None
        usage.append(out.usage.input_tokens)
    assert usage[1] > usage[0] + 20


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    out = client.responses.create(model=CHAT_MODEL, input="Hi", max_output_tokens=16, store=False)
    assert out.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=CHAT_MODEL, input="And?", previous_response_id=out.id)


def test_unknown_model_and_ids(client: openai.OpenAI, base_url: str) -> None:
    assert_error(httpx.post(f"{base_url}/responses", json={"model": "nope", "input": "x"}, timeout=30), 404)
    for method in ("GET", "DELETE"):
        assert_error(httpx.request(method, f"{base_url}/responses/resp_unknown", timeout=30), 404)
    assert_error(httpx.get(f"{base_url}/responses/resp_unknown/input_items", timeout=30), 404)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=CHAT_MODEL, input="x", previous_response_id="resp_unknown")


# --- openai-agents -------------------------------------------------------------------------------


@pytest.fixture
async def agents_client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    import agents

    agents.set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


async def test_agents_runner_with_function_tool(agents_client: openai.AsyncOpenAI) -> None:
    """The agents SDK's Responses model drives a function tool through the gateway: each turn
    must call it (`tool_choice: required`, kept after the first call), the tool runs, its output
    goes back as a `function_call_output` item, and the run ends with a final output.

    One call a turn (`parallel_tool_calls` off) and a bounded argument, so each turn's call ends
    within `max_tokens` on any machine: whether a tiny model would call again by itself, or how
    many calls it would write, moves with the CPU."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool
    from agents.agent import ToolsToFinalOutputResult

    calls: list[str] = []

    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=30)]) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    async def after_second_call(context: Any, results: list[Any]) -> ToolsToFinalOutputResult:
        """Let the model see the first result (a second model turn); stop at the second call."""
        return ToolsToFinalOutputResult(is_final_output=len(calls) > 1, final_output=results[-1].output)

    budget = max_call_bytes(
        [
            {
                "type": "function",
                "function": {"name": get_weather.name, "parameters": get_weather.params_json_schema},
            }
        ]
    )
    agent = Agent(
        name="weather",
        instructions="Use the get_weather tool to answer.",
        model=OpenAIResponsesModel(model=CHAT_MODEL, openai_client=agents_client),
        tools=[get_weather],
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=budget
        ),
        reset_tool_choice=False,  # the second turn must call too (the SDK resets it to `auto`)
        tool_use_behavior=after_second_call,
    )
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    assert calls and all(isinstance(c, str) for c in calls)
    assert len(result.raw_responses) >= 2  # the tool's output went back to the model
    assert isinstance(result.final_output, str) and result.final_output
    # The second request carried the first call's result as a function_call_output item.
    second_input = result.to_input_list()
    kinds = [item.get("type") for item in second_input if isinstance(item, dict)]
    assert "function_call" in kinds and "function_call_output" in kinds
