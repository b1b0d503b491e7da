"""The hub API client: what is retried and what is not (over real HTTP on 127.0.0.1)."""

from __future__ import annotations

import json

import pytest

from gpuspawner.clients.hubapi import HubClient, HubError, parse_time

from ..culler.faultproxy import FaultProxy
from ..scriptedhttp import scripted_server


def test_parse_time_accepts_the_hubs_formats():
    assert parse_time("2026-11-29T10:00:00Z") == parse_time("2026-11-29T10:00:00+00:00")
    assert parse_time(None) is None


@pytest.fixture
async def proxy():
    # started inside the test's event loop, where the client runs too
    proxy = FaultProxy("http://127.0.0.1:9")  # upstream never reached: every answer is injected
    proxy.start()
    yield proxy
    proxy.stop()


async def test_errors_that_may_pass_are_retried_with_backoff(proxy):
    proxy.fault = lambda method, path: 503
    client = HubClient(f"{proxy.url}/hub/api", "t", max_retries=3, backoff_base=0.01)
    with pytest.raises(HubError) as e:
        [user async for user in client.iter_users()]
    assert proxy.counts["GET"] == 4 and client.requests == 4
    assert "after 4 attempts" in str(e.value)


async def test_refusals_are_not_retried(proxy):
    proxy.fault = lambda method, path: 403
    client = HubClient(f"{proxy.url}/hub/api", "t", max_retries=3, backoff_base=0.01)
    with pytest.raises(HubError) as e:
        await client.stop_server("alice", "exp 1")
    assert proxy.counts["DELETE"] == 1
    assert e.value.status == 403
    assert str(e.value) == (
        "The hub refused DELETE /users/alice/servers/exp%201 with 403: injected failure"
    )


async def test_a_server_stopped_meanwhile_is_not_an_error(proxy):
    proxy.fault = lambda method, path: 400  # the hub: "alice's server is not running"
    client = HubClient(f"{proxy.url}/hub/api", "t", max_retries=3, backoff_base=0.01)
    assert await client.stop_server("alice", "") == 400
    assert proxy.counts["DELETE"] == 1


@pytest.fixture
async def fake_hub():
    """A "hub" on 127.0.0.1 whose /hub/api/users answers 200 with the body the test sets."""
    with scripted_server(r"/hub/api/users", "application/json") as answer:
        answer["url"] += "/hub/api"
        yield answer


async def test_answers_that_are_not_user_pages_are_hub_errors(fake_hub):
    """The culler abandons a pass on HubError with one logged sentence; anything else was
    an unexpected error with a traceback."""
    client = HubClient(fake_hub["url"], "t", max_retries=0)
    user = {"name": "ann", "servers": {}}
    for body in (
        b"<html>a login page</html>",
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
        json.dumps("users").encode(),
        json.dumps({"items": {"ann": user}}).encode(),
        json.dumps({"items": ["ann"]}).encode(),
        json.dumps([{"servers": {}}]).encode(),
        json.dumps({"items": [user], "_pagination": {"next": {"offset": "x"}}}).encode(),
        json.dumps({"items": [user], "_pagination": {"next": {"offset": 0}}}).encode(),
    ):
        fake_hub["body"] = body
        with pytest.raises(HubError) as e:
            [u async for u in client.iter_users()]
        message = str(e.value)
        assert message.startswith("The hub answered GET /users?") and "\n" not in message, message
        assert len(message) < 200
