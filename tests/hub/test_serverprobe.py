"""serverprobe: noticing a started server as soon as it answers HTTP."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler

from gpuspawner.hub import serverprobe


def test_waits_grow_from_the_first_and_stop_at_the_longest():
    first = list(itertools.islice(serverprobe.waits(0.05, 2, 0.25), 6))
    assert first == [0.05, 0.1, 0.2, 0.25, 0.25, 0.25]
    default = list(itertools.islice(serverprobe.waits(), 50))
    assert default[0] == serverprobe.FIRST_WAIT
    assert default == sorted(default)
    assert max(default) == serverprobe.LONGEST_WAIT


@pytest.mark.parametrize("status", [200, 302, 401, 404])
def test_any_status_below_500_is_an_answer(status):
    assert serverprobe.is_answer(status)


@pytest.mark.parametrize("status", [0, 500, 502, 503, serverprobe.NO_ANSWER])
def test_errors_and_no_answer_are_not(status):
    assert not serverprobe.is_answer(status)


async def test_asks_until_the_first_answer_and_no_more():
    answers = iter([599, 599, 503, 404, 200])
    asked: list[str] = []

    async def status(url):
        asked.append(url)
        return next(answers)

    await serverprobe.wait_until_answering("http://10.244.0.9:8888", timeout=10, status=status)
    assert asked == ["http://10.244.0.9:8888"] * 4


async def test_a_server_that_never_answers_times_out_with_jupyterhubs_message():
    async def status(url):
        return serverprobe.NO_ANSWER

    with pytest.raises(TimeoutError, match=r"^Server at http://x:1 didn't respond in 0.3 seconds$"):
        await serverprobe.wait_until_answering("http://x:1", timeout=0.3, status=status)


async def test_a_real_server_is_found_once_it_listens():
    """Refused connections count as "not yet"; the first real answer (here 404) ends the wait."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    client = AsyncHTTPClient(force_instance=True)
    assert await serverprobe.ask(client, url) == serverprobe.NO_ANSWER

    class Missing(RequestHandler):
        def get(self):
            self.set_status(404)

    server = HTTPServer(Application([(r"/.*", Missing)]))

    async def listen_later():
        await asyncio.sleep(0.3)
        server.listen(port, "127.0.0.1")

    later = asyncio.ensure_future(listen_later())
    try:
        await serverprobe.wait_until_answering(url, timeout=20)
        assert later.done()
        assert await serverprobe.ask(client, url) == 404
    finally:
        await later
        server.stop()
        client.close()
