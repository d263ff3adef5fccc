"""Embeddings and rerank on vLLM's pooling runner: their inputs as token ids, and their requests.

An embedding model and a cross-encoder (`rank`, run as a classifier) take no sampling and stream
nothing: each input is one `AsyncLLM.encode` call, all of a request's inputs sent at once so the
engine batches them like concurrent requests. This path shares nothing with generation's
(translate.py) but the tokenizer and the engine, so it reads on its own; engine.py checks that
the model serves it and counts the request. Nothing here imports vLLM at module level.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raygate.backends.engines.base import check_token_ids
from raygate.protocol.embeddings import unit_vector
from raygate.protocol.errors import ContextLengthExceededError, EngineError
from raygate.protocol.generation import EmbedResult, RankRequest, RankResult

# ---- inputs -> token ids (run on the tokenizer's thread) ----------------------------------------


def embed_ids(
    tokenizer: Any, inputs: list[str] | list[list[int]], context: int, vocab: int
) -> list[list[int]]:
    """Each embedding input as token ids, none longer than the context."""
    seqs = [
        list(x) if isinstance(x, list) else list(tokenizer.encode(x, add_special_tokens=True)) for x in inputs
    ]
    for i, seq in enumerate(seqs):
        if len(seq) > context:
            raise ContextLengthExceededError(
                f"Input {i} has {len(seq)} tokens; this model's maximum is {context}.",
                param="input",
            )
        check_token_ids(seq, vocab, "input")
    return seqs


def pair_inputs(tokenizer: Any, request: RankRequest, context: int) -> list[tuple[list[int], int]]:
    """Each pair as the tokenizer lays it out for a cross-encoder (`[CLS] q [SEP] d [SEP]`),
    with where its second segment starts: vLLM takes token types in that compressed form
    (its own score endpoint does the same, `compressed_token_type_ids`)."""
    out: list[tuple[list[int], int]] = []
    for i, (query, doc) in enumerate(request.pairs):
        enc = tokenizer(query, doc, add_special_tokens=True)
        ids = list(enc["input_ids"])
        if len(ids) > context:
            raise ContextLengthExceededError(
                f"Pair {i} (query and {request.param}[{i}]) has {len(ids)} tokens; this model's "
                f"maximum is {context}. Shorten the document or the query.",
                param=request.param,
            )
        types = list(enc.get("token_type_ids") or [])
        out.append((ids, types.index(1) if 1 in types else len(ids)))
    return out


# ---- token ids -> vectors and scores ------------------------------------------------------------


async def embed(llm: Any, request_id: str, seqs: list[list[int]]) -> EmbedResult:
    """Each sequence's embedding (unit length) and the prompt tokens they took."""
    from vllm import PoolingParams
    from vllm.v1.engine.exceptions import EngineDeadError

    async def one(i: int, ids: list[int]) -> tuple[list[float], int]:
        final = None
        rid = f"{request_id}-{i}"
        async for out in llm.encode({"prompt_token_ids": ids}, PoolingParams(task="embed"), rid):
            final = out
        assert final is not None
        vec = [float(v) for v in final.outputs.data.tolist()]
        return unit_vector(vec), len(final.prompt_token_ids)

    try:
        # All inputs go to the engine at once: it batches them like concurrent requests.
        results = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(seqs)))
    except EngineDeadError:
        raise EngineError(
            "The model's engine failed while embedding; retry the request.", code="engine_dead"
        ) from None
    return EmbedResult(embeddings=[vec for vec, _ in results], prompt_tokens=sum(n for _, n in results))


async def rank(llm: Any, request_id: str, inputs: list[tuple[list[int], int]]) -> RankResult:
    """Raw classifier logits (no activation: the gateway applies it), all pairs at once."""
    from vllm import PoolingParams
    from vllm.v1.engine.exceptions import EngineDeadError

    async def one(i: int, ids: list[int], second: int) -> tuple[float, int]:
        params = PoolingParams(
            task="classify", use_activation=False, extra_kwargs={"compressed_token_type_ids": second}
        )
        final = None
        async for out in llm.encode({"prompt_token_ids": ids}, params, f"{request_id}-{i}"):
            final = out
        assert final is not None
        return float(final.outputs.data.reshape(-1)[0]), len(final.prompt_token_ids)

    try:
        results = await asyncio.gather(*(one(i, ids, second) for i, (ids, second) in enumerate(inputs)))
    except EngineDeadError:
        raise EngineError(
            "The model's engine failed while scoring; retry the request.", code="engine_dead"
        ) from None
    return RankResult(scores=[s for s, _ in results], prompt_tokens=sum(n for _, n in results))
