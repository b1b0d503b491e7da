"""The battery's real parts: a stand-in API server the hub lists pods from, and Chromium."""

from __future__ import annotations

import asyncio
import shutil
import threading

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by playwright (which never downloads a browser here)."""
    from playwright.sync_api import sync_playwright

    if not shutil.which(CHROMIUM):
        pytest.fail("Chromium is not installed: run scripts/install-system-packages.sh")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Background:
    """An event loop in a thread of its own, for servers a hub process talks to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def background():
    loop = Background()
    yield loop
    loop.close()
