"""Images in (docs/vision.md) on the llama.cpp gateway: the shared bodies in tests/support/suites/vision.py."""

from __future__ import annotations

from tests.support.suites.vision import (  # noqa: F401
    test_text_only_model_refuses_images_in_each_apis_shape,
)
