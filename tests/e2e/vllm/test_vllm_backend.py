"""What the vLLM backend has to show beyond the shared OpenAI suite: requests batched in one
engine, aborts that leave the engine, the tokenizer's chat template, sampling parameters that
reach the engine, and agreement with the llama.cpp backend serving the same weights."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import ray

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.structured import penalty_must_change
from tests.support.vllm import VllmDeployment

HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
NO_EOS = {"0": -100, "2": -100}  # SmolLM2's end-of-text and end-of-turn tokens


def stats(vllm: VllmDeployment, model: str = CHAT_MODEL) -> Any:
    return ray.get(vllm.replica(model).stats.remote())


def wait_for_stats(vllm: VllmDeployment, done: Callable[[Any], bool], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        s = stats(vllm)
        if done(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.1)


def test_suffix_is_refused_by_name(base_url: str) -> None:
    """Fill-in-the-middle is not mapped on vLLM (its own server refuses it too): a 400 naming the
    field and the backend, never a completion that ignored the suffix."""
    r = httpx.post(
        f"{base_url}/completions",
        json={"model": CHAT_MODEL, "prompt": "def f(", "suffix": "return x", "max_tokens": 4},
        timeout=60,
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_parameter" and err["param"] == "suffix" and "vllm" in err["message"]


def test_tokenize_and_detokenize_with_the_models_tokenizer(
    base_url: str, default_gateway: GatewayProcess
) -> None:
    """vLLM's shapes, from the HF tokenizer: the same ids as llama.cpp's GGUF vocabulary."""
    root = base_url.removesuffix("/v1")
    r = httpx.post(
        f"{root}/tokenize",
        json={"model": CHAT_MODEL, "prompt": "Hello world", "return_token_strs": True},
        timeout=60,
    )
    assert r.json() == {
        "count": 2,
        "max_model_len": 2048,
        "tokens": [19556, 905],
        "token_strs": ["Hello", " world"],
    }
    back = httpx.post(f"{root}/detokenize", json={"model": CHAT_MODEL, "tokens": [19556, 905]}, timeout=60)
    assert back.json() == {"prompt": "Hello world"}
    chat = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "return_token_strs": True}
    ours = httpx.post(f"{root}/tokenize", json=chat, timeout=60).json()
    theirs = httpx.post(f"{default_gateway.url}/tokenize", json=chat, timeout=60).json()
    assert ours["tokens"] == theirs["tokens"]
    assert "".join(ours["token_strs"]).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    emb = httpx.post(
        f"{root}/tokenize", json={"model": EMBED_MODEL, "prompt": "hello world"}, timeout=60
    ).json()
    assert emb["count"] == 4  # [CLS] hello world [SEP]
    text = httpx.post(
        f"{root}/detokenize", json={"model": EMBED_MODEL, "tokens": emb["tokens"][1:-1]}, timeout=60
    )
    assert text.json()["prompt"] == "hello world"


def test_logprob_bytes_are_the_tokens_own(base_url: str, default_gateway: GatewayProcess) -> None:
    """A token holding part of a UTF-8 character reports its real bytes, not the replacement
    character vLLM's decoded string has: the same bytes llama.cpp reads from its GGUF vocabulary."""
    root = base_url.removesuffix("/v1")
    tokens = httpx.post(
        f"{root}/tokenize", json={"model": CHAT_MODEL, "prompt": "𝄞", "return_token_strs": True}, timeout=60
    ).json()
    partial = next(t for t, s in zip(tokens["tokens"], tokens["token_strs"], strict=True) if "\ufffd" in s)
    body = {
        "model": CHAT_MODEL,
        "messages": HELLO,
        "max_tokens": 1,
        "logprobs": True,
        "logit_bias": {str(partial): 100},
    }
    ours = httpx.post(f"{base_url}/chat/completions", json=body, timeout=60).json()
    theirs = httpx.post(f"{default_gateway.url}/v1/chat/completions", json=body, timeout=60).json()
    raw = bytes(ours["choices"][0]["logprobs"]["content"][0]["bytes"])
    assert raw == bytes(theirs["choices"][0]["logprobs"]["content"][0]["bytes"])
    with pytest.raises(UnicodeDecodeError):
        raw.decode()


def test_logprobs_agree_with_llama_cpp(client: openai.OpenAI, default_gateway: GatewayProcess) -> None:
    """The same weights (bf16 here, a Q4_1 GGUF there) give nearly the same log-probabilities
    for the same greedy continuation: the values are the model's, not something made up.

    Greedy texts agree only as long as no step is a near tie: the two engines' numbers differ
    (by up to ~0.15 here), and where they tip a tie the other way, the continuations part. So
    the tokens are compared up to the first difference, which must be such a tie: each engine
    lists the other's token among its two likeliest, close behind its own."""
    kwargs: dict[str, Any] = {
        "model": CHAT_MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": 2,
    }
    ours = client.completions.create(**kwargs).choices[0].logprobs
    with openai.OpenAI(base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0) as other:
        theirs = other.completions.create(**kwargs).choices[0].logprobs
    assert ours is not None and theirs is not None
    assert ours.tokens and theirs.tokens and ours.token_logprobs and theirs.token_logprobs
    assert ours.top_logprobs and theirs.top_logprobs
    steps = zip(ours.tokens, theirs.tokens, ours.token_logprobs, theirs.token_logprobs, strict=False)
    for (ours_token, their_token, a, b), ours_top, their_top in zip(
        steps, ours.top_logprobs, theirs.top_logprobs, strict=False
    ):
        assert a is not None and b is not None
        if ours_token != their_token:
            assert their_token in ours_top and a - ours_top[their_token] < 0.3, (ours, theirs)
            assert ours_token in their_top and b - their_top[ours_token] < 0.3, (ours, theirs)
            break
        assert abs(a - b) < 0.15, (ours, theirs)


def test_token_ids_outside_the_vocabulary_are_400(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/completions",
        json={"model": CHAT_MODEL, "prompt": [1, 10**9], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_greedy_completion_matches_transformers(client: openai.OpenAI) -> None:
    """transformers' greedy decoding of the same bf16 folder starts with " Paris"
    (models/build_vllm_models.py --check), by a margin no CPU's rounding closes; what follows
    the first token is the machine's (bf16 kernels round differently from CPU to CPU)."""
    out = client.completions.create(
        model=CHAT_MODEL,
        prompt="The capital of France is",
        max_tokens=3,
        temperature=0,
        extra_body={"repetition_penalty": 1.0},  # pure greedy, as transformers' (no `defaults:`)
    )
    assert out.choices[0].text.startswith(" Paris"), out.choices[0].text
    assert out.usage is not None and out.usage.prompt_tokens == 5
    assert out.usage.completion_tokens == 3 or out.choices[0].finish_reason == "stop"


def test_chat_template_is_the_models_own(client: openai.OpenAI, default_gateway: GatewayProcess) -> None:
    """The tokenizer's template (vLLM) and the GGUF's template (llama.cpp) render the same prompt."""
    with openai.OpenAI(base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0) as llama:
        for messages in (HELLO, [{"role": "system", "content": "Be terse."}, *HELLO]):
            ours = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=1)  # type: ignore[arg-type]
            theirs = llama.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=1)  # type: ignore[arg-type]
            assert ours.usage is not None and theirs.usage is not None
            assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens > 10


def test_embeddings_agree_with_llama_cpp(client: openai.OpenAI, default_gateway: GatewayProcess) -> None:
    """Same model, two engines (vLLM on the HF weights, llama.cpp on a Q8_0 GGUF): same meaning."""
    texts = ["A cat sits on the mat.", "Stock markets fell sharply today.", "hello world"]
    ours = client.embeddings.create(model=EMBED_MODEL, input=texts, encoding_format="float")
    with openai.OpenAI(base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0) as llama:
        theirs = llama.embeddings.create(model=EMBED_MODEL, input=texts, encoding_format="float")
    for a, b in zip(ours.data, theirs.data, strict=True):
        assert sum(x * y for x, y in zip(a.embedding, b.embedding, strict=True)) > 0.998
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens


def test_penalties_reach_the_engine(client: openai.OpenAI) -> None:
    """Greedy decoding, so any difference comes from the penalty (vLLM applies it to generated
    tokens). Whether a penalty changes a greedy text depends on the text, which depends on the
    CPU: of a few prompts, the test takes one whose greedy text, by its own logprobs, a penalty
    of 2 must change (tests/support/structured.py), then checks that it does."""

    def complete(prompt: str, **kw: float) -> Any:
        return client.completions.create(
            model=CHAT_MODEL,
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            logprobs=5,
            extra_body={"repetition_penalty": 1.0},  # off, whatever the model's `defaults:` say
            **kw,
        ).choices[0]

    for prompt in ("My favourite things are", "la la la la la la", "1, 2, 1, 2, 1, 2,", "Once upon a time"):
        plain = complete(prompt)
        lp = plain.logprobs
        assert lp is not None and lp.tokens and lp.top_logprobs
        if penalty_must_change(lp.tokens, lp.top_logprobs, frequency=2.0) and penalty_must_change(
            lp.tokens, lp.top_logprobs, presence=2.0
        ):
            break
    else:
        raise AssertionError("no prompt's greedy text is one a penalty must change")
    assert complete(prompt).text == plain.text
    assert complete(prompt, frequency_penalty=2.0).text != plain.text
    assert complete(prompt, presence_penalty=2.0).text != plain.text
    assert complete(prompt, frequency_penalty=0.0).text == plain.text


def test_disconnect_aborts_the_request_in_the_engine(base_url: str, vllm: VllmDeployment) -> None:
    before = stats(vllm)
    # Only the disconnect can end it: a greedy stop at the model's EOS (after 54 tokens on a
    # loaded box, before the gateway saw the client go) would prove nothing.
    long = {
        "model": CHAT_MODEL,
        "prompt": "1, 2, 3,",
        "max_tokens": 1000,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    events = 0
    with httpx.stream("POST", f"{base_url}/completions", json=long, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events += 1
                if events == 3:
                    break
    after = wait_for_stats(
        vllm,
        lambda s: (
            s.aborted_total > before.aborted_total
            and s.running == 0
            and s.engine_unfinished == 0
            and s.core_running == 0
            and s.core_waiting == 0
        ),
    )
    assert after.aborted_total == before.aborted_total + 1, after
    assert after.running == after.engine_unfinished == 0, after  # gone from AsyncLLM's front end
    assert after.core_running == after.core_waiting == 0, after  # and from the EngineCore scheduler
    assert after.tokens_generated_total - before.tokens_generated_total < 1000


async def test_eight_streams_share_engine_steps(
    async_client: openai.AsyncOpenAI, vllm: VllmDeployment
) -> None:
    """Eight streams on one replica run as one batch: the engine produces several tokens per step
    (one per step when the same streams run one after another), every stream has started before
    any has finished, and the scheduler reports all eight running together. Counted, not timed;
    the wall times are printed for the record (bench/ measures speed)."""
    tokens = 24

    async def one(i: int, events: list[tuple[str, int]]) -> int:
        stream = await async_client.completions.create(
            model=CHAT_MODEL,
            prompt=f"{i}, {i + 1}, {i + 2},",
            max_tokens=tokens,
            logit_bias=NO_EOS,  # all 24 tokens, wherever the model would have ended on this CPU
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        started, used = False, 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text and not started:
                started = True
                events.append(("first", i))
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        events.append(("done", i))
        return used

    s0, t0 = stats(vllm), time.monotonic()
    serial_events: list[tuple[str, int]] = []
    serial = [await one(i, serial_events) for i in range(8)]
    s1, t1 = stats(vllm), time.monotonic()
    events: list[tuple[str, int]] = []
    together = await asyncio.wait_for(asyncio.gather(*(one(i, events) for i in range(8))), timeout=240)
    s2, t2 = stats(vllm), time.monotonic()
    print(f"8 streams x {tokens} tokens: serial {t1 - t0:.1f}s, concurrent {t2 - t1:.1f}s")

    assert serial == together == [tokens] * 8
    per_step_serial = (s1.decode_tokens - s0.decode_tokens) / (s1.decode_steps - s0.decode_steps)
    per_step_together = (s2.decode_tokens - s1.decode_tokens) / (s2.decode_steps - s1.decode_steps)
    assert per_step_serial < 1.2, (s0, s1)
    assert per_step_together > 3, (s1, s2)
    first_done = next(k for k, (kind, _) in enumerate(events) if kind == "done")
    assert sorted(i for kind, i in events[:first_done] if kind == "first") == list(range(8)), events
    assert s2.core_peak_running >= 8
    assert s2.running == 0


@pytest.mark.parametrize("bad", [{"max_tokens": 3000}, {"prompt": "hello " * 2100}])
def test_context_check_happens_before_the_engine(base_url: str, vllm: VllmDeployment, bad: dict) -> None:
    before = stats(vllm)
    body = {"model": CHAT_MODEL, "prompt": "hi", "max_tokens": 5} | bad
    r = httpx.post(f"{base_url}/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert stats(vllm).requests_total == before.requests_total  # never handed to vLLM
