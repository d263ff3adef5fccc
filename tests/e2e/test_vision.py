"""Images in (docs/vision.md) on the llama.cpp gateway: `tiny-vlm` (tests/support/vision.py, a tiny
Idefics3 with its mmproj) deployed beside the default models; the bodies are shared with any engine
in tests/support/suites/vision.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.admin import deployed
from tests.support.gateway import GatewayProcess
from tests.support.suites.vision import (  # noqa: F401
    image_server,
    test_a_repeated_image_hits_the_prompt_cache,
    test_bad_images_are_400s_naming_the_field,
    test_different_images_give_different_greedy_answers,
    test_every_api_and_client_reads_images,
    test_image_urls_fetched_only_where_allowed,
    test_images_count_in_prompt_tokens,
    test_limits_in_each_apis_shape,
    test_text_only_model_refuses_images_in_each_apis_shape,
)
from tests.support.vision import vlm_spec


@pytest.fixture(scope="module")
def vlm(gateway: GatewayProcess) -> Iterator[str]:
    with deployed(gateway.url, vlm_spec()) as name:
        yield name
