"""Headless Chromium for the web console's tests (Playwright for Python, Debian's `chromium`:
Playwright's own browser download needs the internet)."""

from __future__ import annotations

import os
import shutil

import pytest
from playwright.sync_api import Browser, Playwright


def chromium_path() -> str:
    """The browser `make setup` installs (Makefile, target `browser`); a missing one fails, never skips."""
    path = os.environ.get("RAYGATE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("No chromium found: `make browser` installs Debian's chromium (or set RAYGATE_CHROMIUM)")
    return path


def launch_chromium(playwright: Playwright) -> Browser:
    # Bounds on a hang, not expectations: on two busy cores Chromium takes well over
    # Playwright's 30 s default to start, and a click or a page load over its 30 s.
    # No GPU process: on a GPU-less box under load its start failed, and every `new_page()`
    # after it hung with no timeout (microsoft/playwright#4761; four tests, 300 s each).
    return playwright.chromium.launch(
        executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"], timeout=300_000
    )
