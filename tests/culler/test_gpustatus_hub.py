"""The culler's /api/gpu-status against a real JupyterHub and a real Prometheus.

Built as the /api/warning tests in test_culler_hub.py are: real jupyterhub-singleuser
servers on 127.0.0.1, their GPUs series in the DCGM exporter's format
(tests/fixtures/dcgm/exporter-sample.prom) scraped by Prometheus every second,
and the culler's token with the scopes the shipped config gives it.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gpuspawner.culler import gpustatus as G
from gpuspawner.culler import policy as P

from ..hub.hubprocess import free_port
from .hubtools import NAMESPACE, make_culler, pod_name
from .test_culler_hub import A100, CPU, by_name, fetch_status, gpu_for, start_servers, user_token

pytestmark = pytest.mark.hub

ACCESS = "access:services!service=gpuspawner-culler"
#: The sample's GPU 0, which gpu_for copies: framebuffer used and free, in MiB.
SAMPLE_USED, SAMPLE_FREE = 480, 80557
MIB = 1024 * 1024


def wait_scraped(prometheus, user: str, util: float) -> None:
    """Until Prometheus holds the user's GPU at ``util`` percent."""
    prometheus.wait_for(
        f'DCGM_FI_DEV_GPU_UTIL{{pod="{pod_name(user)}"}}',
        lambda r: bool(r) and float(r[0]["value"][1]) == util,
    )


def last_activity(hub, user: str) -> str | None:
    return hub.api("GET", f"/users/{user}").json()["servers"][""]["last_activity"]


def settled_activity(hub, user: str) -> str | None:
    """The server's last activity once its start's own reports are in.

    A freshly started single-user server reports activity once just after the hub
    sees it answer; the hub folds the proxy's figures in every 2 s. Two equal reads
    4 s apart mean neither is still on its way.
    """
    before = last_activity(hub, user)
    for _ in range(20):
        time.sleep(4)
        now = last_activity(hub, user)
        if now == before:
            return now
        before = now
    raise AssertionError(f"the last activity of {user!r} never settled: {before}")


async def status(url: str, token: str | None) -> dict:
    code, body = await fetch_status(url, token)
    assert code == 200, body
    return json.loads(body)


async def test_gpu_status_tells_each_token_its_own_servers_load_and_stop(
    hub, culler_token, exporter, prometheus
):
    start_servers(hub, {"gsbusy": A100, "gsidle": A100, "gsnoseries": A100, "gscpu": CPU})
    busy_gpu = gpu_for(exporter, "gsbusy", 87)
    gpu_for(exporter, "gsidle", 0)
    wait_scraped(prometheus, "gsbusy", 87)
    wait_scraped(prometheus, "gsidle", 0)
    port = free_port()
    app = make_culler(
        hub,
        culler_token,
        prometheus_url=prometheus.url,
        timeouts=[{"min_gpus": 1, "timeout": 3600, "gpu_timeout": 1800}],
        cull_every=300,
        metrics_url=f"http://127.0.0.1:{port}",
    )
    app._listen()
    d = by_name(await app.cull_pass())
    assert all(decision.action == P.KEEP for decision in d.values()), d
    passes_requests = app.prometheus.requests
    url = f"http://127.0.0.1:{port}/api/gpu-status"
    activity_before = settled_activity(hub, "gsidle")

    # the busy server's own token: its own entry, with the exporter's figures
    own = user_token(hub, "gsbusy", ["access:servers!server=gsbusy/", ACCESS])
    answer = await status(url, own)
    assert (answer["user"], answer["poll_seconds"]) == ("gsbusy", 15)
    [entry] = answer["servers"]
    assert (entry["user"], entry["server"], entry["gpus"], entry["gpu_type"]) == (
        "gsbusy",
        "",
        1,
        "a100",
    )
    assert (entry["source"], entry["unavailable"]) == ("dcgm", None)
    assert entry["utilization"] == pytest.approx(0.87)
    assert entry["busy"] is True and entry["idle_since"] is None
    assert entry["memory_used_bytes"] == SAMPLE_USED * MIB
    assert entry["memory_total_bytes"] == (SAMPLE_USED + SAMPLE_FREE) * MIB
    [device] = entry["devices"]
    assert device["gpu"] == busy_gpu and device["uuid"].startswith("GPU-")
    # busy GPUs: the GPU-idle rule counts from about now, before the idle timeout's hour
    assert entry["stop_rule"] == "GPU idle timeout of 30 min"
    assert app.last_pass_at + 1800 <= entry["stop_at"] <= app.last_pass_at + 2400
    assert (entry["stop_at"] - app.last_pass_at) % 300 == 0  # on a pass
    points = entry["history"]["points"]
    assert entry["history"]["step"] == 60 and points
    assert points[-1][1] == pytest.approx(0.87)

    # the idle server's user token: idle since it started, stopped by the GPU rule
    started = hub.api("GET", "/users/gsidle").json()["servers"][""]["started"]
    idle_user = user_token(hub, "gsidle", ["inherit"])
    [entry] = (await status(url, idle_user))["servers"]
    assert (entry["server"], entry["busy"], entry["utilization"]) == ("", False, 0.0)
    assert entry["idle_since"] is not None and entry["idle_seconds"] >= 0
    assert entry["stop_rule"] == "GPU idle timeout of 30 min"
    assert entry["idle_since"] + 1800 <= entry["stop_at"] <= entry["idle_since"] + 2100
    assert started and entry["idle_since"] >= app.last_pass_at - 600

    # no series for its pod: 200, no figures, one sentence
    [entry] = (await status(url, user_token(hub, "gsnoseries", ["inherit"])))["servers"]
    assert (entry["source"], entry["unavailable"]) == (None, G.NO_SERIES)
    assert entry["history"]["points"] == [] and entry["utilization"] is None
    # a CPU-only server is not listed
    assert (await status(url, user_token(hub, "gscpu", ["inherit"])))["servers"] == []

    # least rights: another user's token, or the owner's token for another of its
    # servers, hears nothing of this one
    assert [e["user"] for e in (await status(url, idle_user))["servers"]] == ["gsidle"]
    other_server = user_token(hub, "gsbusy", ["access:servers!server=gsbusy/train", ACCESS])
    assert (await status(url, other_server))["servers"] == []
    # a service's token without access to the culler, no token, an unknown one: refused
    for token in (hub.token, None, "not-a-token"):
        code, body = await fetch_status(url, token)
        assert code == 403 and json.loads(body)["status"] == 403, (token, body)
    code, body = await fetch_status(url, user_token(hub, "gsbusy", ["access:servers!user"]))
    assert code == 403 and ACCESS in json.loads(body)["message"], body

    # one reading per poll interval for every caller: two queries for the pods' figures,
    # one last hour per server with series, however often each is asked
    await asyncio.gather(*(status(url, own) for _ in range(5)))
    assert app.gpu_status.client.requests == 2 + 2
    assert app.prometheus.requests == passes_requests  # the passes' client is not used
    # asking is not activity
    assert last_activity(hub, "gsidle") == activity_before


async def test_gpu_status_hostile_pod_names_reach_prometheus_as_names(
    hub, culler_token, exporter, prometheus
):
    """Names that would break out of a PromQL string, or match every pod as a regex, are
    sent as themselves: the real Prometheus answers, and only for the pods named."""
    start_servers(hub, {"gshostile": A100})
    gpu_for(exporter, "gshostile", 50)
    wait_scraped(prometheus, "gshostile", 50)
    app = make_culler(hub, culler_token, prometheus_url=prometheus.url)
    real = (NAMESPACE, pod_name("gshostile"))
    hostile = {
        (NAMESPACE, 'x"} or vector(1) #'),
        (NAMESPACE, ".*"),
        (".*", ".*"),
        (NAMESPACE, "back\\slash\nnew|line"),
    }
    figures = await app.gpu_status.figures(frozenset({real, *hostile}))
    assert figures.unavailable is None
    assert set(figures.pods) == {real}
    assert figures.pods[real].devices[0].utilization == pytest.approx(0.5)
    figures = await app.gpu_status.figures(frozenset(hostile))
    assert (figures.unavailable, dict(figures.pods)) == (None, {})
    points = await app.gpu_status.history(NAMESPACE, 'x"} or vector(1) #')
    assert points == []


async def test_gpu_status_without_prometheus_or_while_it_is_down(hub, culler_token):
    start_servers(hub, {"gsdown": A100})
    own = user_token(hub, "gsdown", ["access:servers!server=gsdown/", ACCESS])
    for prometheus_url, unavailable in (
        ("", G.NO_PROMETHEUS),
        (f"http://127.0.0.1:{free_port()}", G.PROMETHEUS_DOWN),
    ):
        port = free_port()
        app = make_culler(
            hub,
            culler_token,
            prometheus_url=prometheus_url,
            prometheus_timeout=30,
            timeout=3600,
            metrics_url=f"http://127.0.0.1:{port}",
        )
        if app.gpu_status.client is not None:
            assert app.gpu_status.client.timeout == 5  # short, whatever the passes wait
        app._listen()
        await app.cull_pass()
        url = f"http://127.0.0.1:{port}/api/gpu-status"
        for _ in range(2):  # the failure is kept for the poll interval too
            [entry] = (await status(url, own))["servers"]
            assert (entry["source"], entry["unavailable"]) == (None, unavailable)
            assert entry["history"] == {"step": 60, "points": []}
        if prometheus_url:
            # missing GPU data counts as busy: no idle rule would stop it
            assert entry["stop_at"] is None
            assert app.gpu_status.client.requests == 1
        else:
            assert entry["stop_rule"] == "idle timeout of 60 min"


async def test_the_managed_service_answers_under_its_prefix(hub, culler_token):
    """Through the proxy, at /services/gpuspawner-culler/api/gpu-status, as /api/warning."""
    url = f"{hub.public_url}/services/gpuspawner-culler/api/gpu-status"
    token = user_token(hub, "gsprefix", ["inherit"])
    deadline = time.monotonic() + 30
    code, body = 0, ""
    while time.monotonic() < deadline:
        code, body = await fetch_status(url, token)
        if code == 200:
            break
        await asyncio.sleep(0.5)
    assert code == 200, body
    assert json.loads(body) == {"user": "gsprefix", "poll_seconds": 15, "servers": []}
    code, body = await fetch_status(url, None)
    assert code == 403, body
