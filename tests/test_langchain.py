"""LangChain's OpenAI integrations work unchanged against the gateway."""

from __future__ import annotations

from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from tests.conftest import CHAT_MODEL, EMBED_MODEL


def chat(base_url: str) -> ChatOpenAI:
    return ChatOpenAI(model=CHAT_MODEL, base_url=base_url, api_key="unused", max_tokens=12, max_retries=0)


def test_chat_invoke_stream_batch(base_url: str) -> None:
    llm = chat(base_url)
    reply = llm.invoke("Say hello.")
    assert isinstance(reply.content, str) and reply.content
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] <= 12
    pieces = [c.content for c in llm.stream("Say hello.")]
    assert len(pieces) > 1 and "".join(str(p) for p in pieces)
    replies = llm.batch(["Say one.", "Say two."])
    assert len(replies) == 2 and all(r.content for r in replies)


def test_embeddings(base_url: str) -> None:
    # tiktoken pre-tokenisation is OpenAI-specific (and needs a download): send plain text.
    emb = OpenAIEmbeddings(
        model=EMBED_MODEL, base_url=base_url, api_key="unused", check_embedding_ctx_length=False
    )
    docs = emb.embed_documents(["The cat sat.", "Dogs bark."])
    query = emb.embed_query("A cat was sitting.")
    assert len(docs) == 2 and len(query) == 384
    sims = [sum(a * b for a, b in zip(d, query, strict=True)) for d in docs]
    assert sims[0] > sims[1]


def test_bind_tools_round_trip(base_url: str) -> None:
    """An agent turn: the model calls a tool, the tool's answer goes back, the model replies."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"18 degrees and sunny in {city}"

    llm = ChatOpenAI(
        model=CHAT_MODEL, base_url=base_url, api_key="unused", max_tokens=60, max_retries=0, temperature=0
    )
    forced = llm.bind_tools([get_weather], tool_choice="any")  # LangChain's "any" is OpenAI's "required"
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


def test_with_structured_output(base_url: str) -> None:
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person."""

        name: str = Field(description="The person's first name")
        age: int

    llm = ChatOpenAI(
        model=CHAT_MODEL, base_url=base_url, api_key="unused", max_tokens=60, max_retries=0, temperature=0
    )
    for method in ("json_schema", "function_calling"):
        person = llm.with_structured_output(Person, method=method).invoke("Invent a person named Ada.")
        assert isinstance(person, Person) and isinstance(person.age, int), method
