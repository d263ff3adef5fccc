"""LangChain's OpenAI integrations work unchanged against the gateway.

LangChain builds its own openai clients, on HTTP clients it caches for the whole process (closed
by nobody); each model here gets one that the `langchain_http` fixture (tests/e2e/conftest.py) closes. Tool
arguments and structured outputs bound their strings and get a `max_tokens` above the longest
call or object that allows (tests/support/structured.py), so they end on any machine."""

from __future__ import annotations

from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field

from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.structured import max_call_bytes, max_json_bytes


def chat(base_url: str, http: dict[str, Any], **kw: Any) -> ChatOpenAI:
    settings = {"max_tokens": 12, **kw, **http}
    return ChatOpenAI(model=CHAT_MODEL, base_url=base_url, api_key="unused", max_retries=0, **settings)


def test_chat_invoke_stream_batch(base_url: str, langchain_http: dict[str, Any]) -> None:
    llm = chat(base_url, langchain_http)
    reply = llm.invoke("Say hello.")
    assert isinstance(reply.content, str) and reply.content
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] <= 12
    pieces = [c.content for c in llm.stream("Say hello.")]
    assert len(pieces) > 1 and "".join(str(p) for p in pieces)
    replies = llm.batch(["Say one.", "Say two."])
    assert len(replies) == 2 and all(r.content for r in replies)


def test_embeddings(base_url: str, langchain_http: dict[str, Any]) -> None:
    # tiktoken pre-tokenisation is OpenAI-specific (and needs a download): send plain text.
    emb = OpenAIEmbeddings(
        model=EMBED_MODEL,
        base_url=base_url,
        api_key="unused",
        check_embedding_ctx_length=False,
        **langchain_http,
    )
    docs = emb.embed_documents(["The cat sat.", "Dogs bark."])
    query = emb.embed_query("A cat was sitting.")
    assert len(docs) == 2 and len(query) == 384
    sims = [sum(a * b for a, b in zip(d, query, strict=True)) for d in docs]
    assert sims[0] > sims[1]


class WeatherArgs(BaseModel):
    city: str = Field(max_length=30, description="The city")


def test_bind_tools_round_trip(base_url: str, langchain_http: dict[str, Any]) -> None:
    """An agent turn: the model calls a tool, the tool's answer goes back, the model replies."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool(args_schema=WeatherArgs)
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"18 degrees and sunny in {city}"

    budget = max_call_bytes([convert_to_openai_tool(get_weather)])
    llm = chat(base_url, langchain_http, max_tokens=budget, temperature=0)
    # LangChain's "any" is OpenAI's "required"; one call, so it ends within the budget.
    forced = llm.bind_tools([get_weather], tool_choice="any", parallel_tool_calls=False)
    question = HumanMessage("What is the weather in Paris?")
    ai = forced.invoke([question])
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather"
    assert isinstance(ai.tool_calls[0]["args"]["city"], str)
    streamed = None
    for piece in forced.stream([question]):
        streamed = piece if streamed is None else streamed + piece
    assert streamed is not None and streamed.tool_calls and streamed.tool_calls[0]["name"] == "get_weather"
    result = get_weather.invoke(ai.tool_calls[0])
    assert isinstance(result, ToolMessage)
    reply = llm.bind_tools([get_weather], tool_choice="none").invoke([question, ai, result])
    assert isinstance(reply.content, str) and reply.content and not reply.tool_calls


def test_with_structured_output(base_url: str, langchain_http: dict[str, Any]) -> None:
    class Person(BaseModel):
        """A person."""

        name: str = Field(description="The person's first name", max_length=20)
        age: int

    tool = convert_to_openai_tool(Person)
    budget = max(max_json_bytes(tool["function"]["parameters"]), max_call_bytes([tool]))
    llm = chat(base_url, langchain_http, max_tokens=budget, temperature=0)
    for method in ("json_schema", "function_calling"):
        person = llm.with_structured_output(Person, method=method).invoke("Invent a person named Ada.")
        assert isinstance(person, Person) and isinstance(person.age, int), method
