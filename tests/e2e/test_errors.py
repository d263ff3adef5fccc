"""Client mistakes get OpenAI-shaped 4xx errors (never a 500 or a hang), and the next request works:
the suite every backend passes (tests/support/suites/errors.py; tests/e2e/vllm reruns it), then the
llama.cpp backend's own refusals (a wrong task, fields it does not support, named by backend).
"""

from __future__ import annotations

from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.suites.errors import (  # noqa: F401
    HELLO,
    assert_error,
    post,
    test_bad_chat_bodies_are_400,
    test_bad_embedding_inputs,
    test_context_length_exceeded,
    test_huge_invalid_body_gets_bounded_error,
    test_malformed_bodies_are_400,
    test_unknown_fields_are_accepted,
    test_unknown_model_is_404_and_sdk_raises,
    test_unknown_route_and_method,
)


def test_wrong_task_and_unsupported_fields_are_400(base_url: str) -> None:
    assert_error(post(base_url, "/embeddings", json={"model": CHAT_MODEL, "input": "x"}), 400, param="model")
    assert_error(
        post(base_url, "/chat/completions", json={"model": EMBED_MODEL, "messages": HELLO}),
        400,
        param="model",
    )
    r = post(
        base_url,
        "/chat/completions",
        json={"model": CHAT_MODEL, "messages": HELLO, "functions": [{"name": "f"}]},
    )
    err = assert_error(r, 400, "unsupported_parameter", "functions")
    assert "llama_cpp" in err["message"]
    r = post(
        base_url,
        "/chat/completions",
        json={
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
    )
    err = assert_error(r, 400)
    assert "image_url" in err["message"]
