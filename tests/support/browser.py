"""Headless Chromium for the web console's tests: Debian's `/usr/bin/chromium` driven by
Playwright for Python (`make test` installs both: `scripts/ensure-chromium.sh` and the
`dev` extra). Playwright's own browser download is never used.

Chromium starts with a fresh profile, without background networking (this machine's
network is closed; Chromium would otherwise keep trying Google's hosts), and as root it
needs --no-sandbox. Screenshots go to `build/console-screenshots/` (or
`$TIDEMQ_SCREENSHOTS`), kept after the run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

__all__ = ["CHROMIUM", "SCREENSHOTS", "chromium_page"]

CHROMIUM = Path(os.environ.get("TIDEMQ_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = Path(
    os.environ.get(
        "TIDEMQ_SCREENSHOTS", Path(__file__).parents[2] / "build" / "console-screenshots"
    )
)
_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
#: Longest wait for one page or element, on a loaded machine.
TIMEOUT_MS = 30_000


@contextlib.contextmanager
def chromium_page() -> Iterator[Page]:
    """A Playwright page in headless Chromium. A missing Chromium fails the test (never a
    skip: `make test` installs it, and a console test that silently skipped would prove
    nothing)."""
    if not CHROMIUM.exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/ensure-chromium.sh (make test does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=_ARGS, headless=True
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            yield page
            context.close()
        finally:
            browser.close()
