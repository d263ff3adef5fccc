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
