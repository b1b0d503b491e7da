"""The battery's real parts: a stand-in API server the hub lists pods from, and Chromium."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ..chromium import sync_browser


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by playwright (tests/chromium.py)."""
    with sync_browser() as b:
        yield b


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
