"""The hub client: user models -> servers, and what is retried (over real HTTP on 127.0.0.1)."""

from __future__ import annotations

import pytest

from gpuspawner.culler.hub import HubClient, HubError, parse_time, servers_from_user

from .faultproxy import FaultProxy


def test_servers_from_a_user_model():
    user = {
        "kind": "user",
        "name": "alice",
        "admin": True,
        "groups": ["ml-research"],
        "servers": {
            "": {
                "name": "",
                "ready": True,
                "pending": None,
                "started": "2026-11-29T10:00:00.000000Z",
                "last_activity": "2026-11-29T11:30:00.123456Z",
                "user_options": {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"},
                "state": {"pod_name": "jupyter-alice", "namespace": "jupyterhub"},
            },
            "exp": {
                "name": "exp",
                "ready": False,
                "pending": "spawn",
                "started": None,
                "last_activity": None,
                "user_options": {"gpu_type": "h100"},
            },
            "cpu": {"name": "cpu", "ready": True, "user_options": {}},
        },
    }
    default, exp, cpu = servers_from_user(user)
    assert (default.user, default.name, default.admin, default.groups) == (
        "alice",
        "",
        True,
        frozenset({"ml-research"}),
    )
    assert (default.profile, default.gpu_type, default.gpus) == ("pytorch", "a100", 2)
    assert (default.pod, default.namespace) == ("jupyter-alice", "jupyterhub")
    assert default.last_activity - default.started == pytest.approx(5400.123456)
    # a type without a count gets the type's smallest count: at least one GPU
    assert (exp.gpu_type, exp.gpus, exp.pending, exp.ready) == ("h100", 1, "spawn", False)
    assert (cpu.gpu_type, cpu.gpus, cpu.pod) == (None, 0, None)
    del user["groups"]  # what a token without read:users:groups sees
    assert all(s.groups is None for s in servers_from_user(user))


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
        await client.list_servers()
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
