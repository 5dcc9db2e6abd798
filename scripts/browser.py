"""Debian's headless chromium driven by Playwright's Python package, for the web page's test
and `make screenshots`. Playwright never downloads a browser here: it launches the system's
/usr/bin/chromium (installed by scripts/install_system_deps.sh), with the flags that keep it
from calling home (no background networking, component updates, sync or QUIC)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def chromium_missing() -> str | None:
    """Why the browser cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing: run `make install` (scripts/install_system_deps.sh)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is missing: run `make install`"
    return None


@contextmanager
def chromium() -> Iterator["object"]:
    """A launched Browser, closed (with Playwright's driver) on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                             headless=True)
        try:
            yield browser
        finally:
            browser.close()
