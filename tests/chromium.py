"""Debian's headless Chromium for the browser tests, driven by playwright.

playwright never downloads a browser here: every test launches the one
``scripts/install-system-packages.sh`` installs, with these settings.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: ``chromium.launch(**LAUNCH)``, sync or async.
LAUNCH: dict[str, Any] = {"executable_path": CHROMIUM, "args": ["--no-sandbox"]}


def require_chromium() -> None:
    if not shutil.which(CHROMIUM):
        pytest.fail("Chromium is not installed: run scripts/install-system-packages.sh")


@contextmanager
def sync_browser() -> Iterator[Any]:
    """A launched browser for playwright's sync API, closed at the end.

    Use it in a module-scoped fixture: the sync API keeps an event loop running
    in this thread while it is open, which later modules' asyncio tests cannot share.
    """
    from playwright.sync_api import sync_playwright

    require_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(**LAUNCH)
        try:
            yield browser
        finally:
            browser.close()
