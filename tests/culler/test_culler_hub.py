"""The culler against a real JupyterHub (real jupyterhub-singleuser servers) and a real Prometheus.

Servers are real processes on 127.0.0.1; their GPUs are series served in the
DCGM exporter's format (tests/fixtures/dcgm) and scraped by Prometheus every
second. The culler uses a token with exactly the scopes the shipped
config/jupyterhub_config.py gives it, plus admin:server_state (these test
servers' pod names live in spawner state; in a cluster they come from pods).
Timeouts are seconds so that the tests run in real time.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import threading
import time
import urllib.request
from datetime import datetime, timezone

import pytest

from gpuspawner.culler import policy as P

from ..conftest import FIXTURES
from ..hub.hubprocess import free_port
from ..scriptedhttp import scripted_server
from .faultproxy import FaultProxy
from .hubtools import (
    NAMESPACE,
    make_culler,
    pod_name,
    prometheus_token,
    server_state,
    spawn,
    stop_all,
    wait_ready,
    wait_stopped,
)

pytestmark = pytest.mark.hub

A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
H100 = {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
CPU = {"profile": "pytorch", "gpus": "0"}
PODS = json.loads((FIXTURES / "culler-pods" / "podlist.json").read_text())["items"]


def metric(app, name: str, **labels) -> float:
    value = app.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def by_name(decisions) -> dict[str, P.Decision]:
    return {d.server.display: d for d in decisions}


def in_namespace(pod: dict, namespace: str) -> dict:
    pod = copy.deepcopy(pod)
    pod["metadata"]["namespace"] = namespace
    return pod


def running_pod(user: str, gpu_type: str, node: str) -> dict:
    """A running one-GPU server pod of ``user`` on ``node``, named as the test spawner names it."""
    pod = copy.deepcopy(next(p for p in PODS if p["metadata"]["name"] == "jupyter-run"))
    meta = pod["metadata"]
    meta.update(name=pod_name(user), namespace=NAMESPACE, uid=f"uid-{user}")
    meta["annotations"]["hub.jupyter.org/username"] = user
    meta["labels"].update(
        {
            "hub.jupyter.org/username": user,
            "gpuspawner.io/gpu-type": gpu_type,
            "gpuspawner.io/gpus": "1",
        }
    )
    pod["spec"]["nodeName"] = node
    return pod


def start_servers(hub, servers: dict[str, dict]) -> None:
    for user, options in servers.items():
        spawn(hub, user, options)
    for user in servers:
        wait_ready(hub, user)


def gpu_for(exporter, user: str, util: float) -> str:
    """Give the user's pod a GPU (a copy of the sample's GPU 0) at ``util`` percent."""
    device = exporter.add_gpu("0")
    exporter.assign(device, NAMESPACE, pod_name(user), util)
    return device


def wait_scraped(prometheus, *users: str) -> None:
    for user in users:
        prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{pod="{pod_name(user)}"}}', bool)


def set_activity(hub, user: str) -> None:
    """What jupyterhub-singleuser reports on activity: 'now' for the user's default server."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    r = hub.api("POST", f"/users/{user}/activity", {"servers": {"": {"last_activity": now}}})
    assert r.status == 200, r.body


class OpenTab:
    """A browser tab left open: polls the user's server through the proxy every half second."""

    def __init__(self, hub, user: str):
        r = hub.api("POST", f"/users/{user}/tokens", {"note": "open tab"})
        assert r.status == 201, r.body
        self.token = r.json()["token"]
        self.url = f"{hub.public_url}/user/{user}/api/contents"
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stopped.is_set():
            request = urllib.request.Request(
                self.url, headers={"Authorization": f"token {self.token}"}
            )
            try:
                urllib.request.urlopen(request, timeout=5).read()
            except OSError:
                pass
            self.stopped.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()


async def test_per_profile_timeouts_and_pagination(hub, culler_token, exporter, prometheus):
    """8-GPU servers go first, 1-GPU later, CPU-only last, each by its own rule; /users is paged."""
    start_servers(
        hub,
        {
            "big8": {"profile": "pytorch", "gpu_type": "a100", "gpus": "8"},
            "one1": A100,
            "cpu0": CPU,
        },
    )
    gpu_for(exporter, "big8", 0)
    gpu_for(exporter, "one1", 0)
    wait_scraped(prometheus, "big8", "one1")
    app = make_culler(
        hub,
        culler_token,
        prometheus_url=prometheus.url,
        page_size=2,
        timeouts=[
            {"min_gpus": 8, "timeout": 2},
            {"min_gpus": 1, "timeout": 600},
            {"gpu_type": "none", "timeout": 1200},
        ],
    )
    await asyncio.sleep(2.5)
    decisions = by_name(await app.cull_pass())
    assert set(decisions) == {"big8", "one1", "cpu0"}  # all three pages read
    assert app.hub.calls == 2 + 1  # two pages of users, one DELETE (retries not counted)
    assert app.prometheus.requests == 2  # constant: not one per server
    assert decisions["big8"].action == P.CULL, decisions["big8"]
    assert decisions["big8"].reason == P.REASON_IDLE
    assert "8 GPUs" in decisions["big8"].detail
    assert (decisions["one1"].action, decisions["one1"].timeout) == (P.KEEP, 600)
    assert (decisions["cpu0"].action, decisions["cpu0"].timeout) == (P.KEEP, 1200)
    wait_stopped(hub, "big8")
    assert server_state(hub, "one1") == "running"
    assert server_state(hub, "cpu0") == "running"
    assert metric(app, "gpuspawner_culler_culls_total", reason="idle", profile="pytorch") == 1
    assert metric(app, "gpuspawner_culler_gpus_reclaimed_total", gpu_type="a100") == 8


async def test_gpu_signal_busy_idle_and_missing(hub, culler_token, exporter, prometheus):
    """A silent training job is kept (GPU busy), an open tab on idle GPUs is culled,
    a server without GPU metrics is kept, and nothing GPU is culled when Prometheus is down."""
    start_servers(hub, {"trainer": A100, "tab": A100, "nometrics": A100, "idlecpu": CPU})
    gpu_for(exporter, "trainer", 97)
    gpu_for(exporter, "tab", 0)
    wait_scraped(prometheus, "trainer", "tab")
    rules = [{"min_gpus": 1, "timeout": 3, "gpu_timeout": 5}, {"gpus": 0, "timeout": 3}]

    with OpenTab(hub, "tab"):
        await asyncio.sleep(6)
        # Prometheus down: every GPU server counts as busy, CPU servers are unaffected.
        dead = make_culler(
            hub,
            culler_token,
            prometheus_url=f"http://127.0.0.1:{free_port()}",
            timeouts=rules,
            dry_run=True,
        )
        d = by_name(await dead.cull_pass())
        for user in ("trainer", "tab", "nometrics"):
            assert (d[user].action, d[user].reason) == (P.KEEP, P.REASON_GPU_UNAVAILABLE), d[user]
        assert d["idlecpu"].action == P.CULL
        assert metric(dead, "gpuspawner_culler_errors_total", source="prometheus") == 1
        assert metric(dead, "gpuspawner_culler_gpu_metrics_missing_servers") == 3

        app = make_culler(hub, culler_token, prometheus_url=prometheus.url, timeouts=rules)
        d = by_name(await app.cull_pass())

    # Idle since the start would be over the 6 s slept above; a loaded machine
    # delays a scrape or an activity report by a few seconds, so no tighter bound.
    assert (d["trainer"].action, d["trainer"].reason) == (P.KEEP, P.REASON_ACTIVE), d["trainer"]
    assert d["trainer"].idle_seconds < 6  # no Jupyter activity, but the GPU is busy
    assert (d["tab"].action, d["tab"].reason) == (P.CULL, P.REASON_GPU_IDLE), d["tab"]
    assert d["tab"].idle_seconds < 6  # Jupyter saw the tab, yet its GPU sat idle
    assert (d["nometrics"].action, d["nometrics"].reason) == (P.KEEP, P.REASON_GPU_MISSING)
    assert d["idlecpu"].action == P.CULL and d["idlecpu"].reason == P.REASON_IDLE
    assert metric(app, "gpuspawner_culler_gpu_metrics_missing_servers") == 1
    wait_stopped(hub, "tab")
    wait_stopped(hub, "idlecpu")
    assert server_state(hub, "trainer") == "running"
    assert server_state(hub, "nometrics") == "running"


async def test_pressure_culls_longest_idle_of_the_waiting_type(
    hub, culler_token, exporter, prometheus, kubeapi
):
    start_servers(hub, {"busyold": A100, "p1": A100, "p2": A100, "p3": A100, "h1": H100})
    # busyold is the longest idle by Jupyter but its GPU is busy: never picked.
    gpu_for(exporter, "busyold", 80)
    for user in ("p1", "p2", "p3", "h1"):
        gpu_for(exporter, user, 0)
    wait_scraped(prometheus, "busyold", "p1", "p2", "p3", "h1")
    # idle order, longest first: h1 (other type), p1, p2, p3
    await asyncio.sleep(1.5)
    set_activity(hub, "p2")
    await asyncio.sleep(1.5)
    set_activity(hub, "p3")
    await asyncio.sleep(1.2)
    settings = dict(
        prometheus_url=prometheus.url,
        timeout=3600,
        pressure_timeout=1,
        kubernetes="on",
        namespace=NAMESPACE,
    )
    waiting_two = [
        in_namespace(p, NAMESPACE)
        for p in PODS
        if p["metadata"]["name"] in ("jupyter-wait1", "jupyter-wait2--exp")
    ]
    # The servers' pods: where they run decides which GPUs can serve a waiting request.
    running = [
        running_pod(user, gpu_type, node)
        for user, gpu_type, node in [
            ("busyold", "a100", "n0"),
            ("p1", "a100", "n0"),
            ("p2", "a100", "n0"),
            ("p3", "a100", "n1"),
            ("h1", "h100", "h0"),
        ]
    ]

    dry = make_culler(hub, culler_token, dry_run=True, **settings)
    kubeapi.objects["pods"] = waiting_two + running  # two 1-GPU a100 requests waiting
    d = by_name(await dry.cull_pass())
    await dry.pods.close()
    assert kubeapi.requests[-1] == (
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {"labelSelector": "gpuspawner.io/managed=true", "limit": "500"},
    )
    # No node has a GPU free (the hub publishes no figures here): each request
    # frees one idle GPU, the longest idle first, and the busy one is never picked.
    assert {u for u, x in d.items() if x.action == P.CULL} == {"p1", "p2"}
    assert all(d[u].reason == P.REASON_PRESSURE for u in ("p1", "p2"))
    assert d["busyold"].action == P.KEEP and d["h1"].action == P.KEEP
    assert (
        metric(dry, "gpuspawner_culler_would_culls_total", reason="pressure", profile="pytorch")
        == 2
    )
    assert metric(dry, "gpuspawner_culler_pressure_waiting_gpus", gpu_type="a100") == 2
    for user in ("p1", "p2", "p3", "busyold", "h1"):
        assert server_state(hub, user) == "running"  # dry run: nothing stopped

    app = make_culler(hub, culler_token, **settings)
    kubeapi.objects["pods"] = waiting_two[:1] + running  # one 1-GPU a100 request waiting
    d = by_name(await app.cull_pass())
    await app.pods.close()
    assert [u for u, x in d.items() if x.action == P.CULL] == ["p1"]
    wait_stopped(hub, "p1")
    for user in ("p2", "p3", "busyold", "h1"):
        assert server_state(hub, user) == "running"
    assert metric(app, "gpuspawner_culler_gpus_reclaimed_total", gpu_type="a100") == 1


async def test_a_refused_pod_list_is_an_error_not_an_empty_cluster(
    hub, culler_token, kubeapi, capfd
):
    """HTTP 403 from the API server: counted and logged as a Kubernetes error, never read as "no pods"."""
    kubeapi.objects["pods"] = [p for p in PODS if p["metadata"]["name"] == "jupyter-wait1"]
    app = make_culler(hub, culler_token, kubernetes="on", pressure_timeout=1)
    try:
        assert await app.cull_pass() is not None
        assert metric(app, "gpuspawner_culler_errors_total", source="kubernetes") == 0
        assert metric(app, "gpuspawner_culler_pressure_waiting_gpus", gpu_type="a100") == 1

        kubeapi.always = 403
        before = len(kubeapi.requests)
        capfd.readouterr()
        assert await app.cull_pass() is not None
    finally:
        await app.pods.close()
    assert len(kubeapi.requests) == before + 1  # a refusal is not retried
    assert metric(app, "gpuspawner_culler_errors_total", source="kubernetes") == 1
    warnings = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert any(
        "failed with HTTP 403" in w and 'cannot list resource "pods"' in w and "no pressure" in w
        for w in warnings
    ), warnings


async def test_dry_run_and_warning_period(hub, culler_token):
    start_servers(hub, {"warnme": CPU})
    await asyncio.sleep(1.2)

    dry = make_culler(hub, culler_token, timeout=1, dry_run=True)
    d = by_name(await dry.cull_pass())
    assert d["warnme"].action == P.CULL
    assert metric(dry, "gpuspawner_culler_would_culls_total", reason="idle", profile="pytorch") == 1
    assert metric(dry, "gpuspawner_culler_culls_total", reason="idle", profile="pytorch") == 0
    assert server_state(hub, "warnme") == "running"

    port = free_port()
    app = make_culler(
        hub, culler_token, timeout=1, warning_period=3, metrics_url=f"http://127.0.0.1:{port}"
    )
    app._listen()
    d = by_name(await app.cull_pass())
    assert d["warnme"].action == P.WARN
    # every warned server, only for a token that may read every server
    assert (await fetch_status(f"http://127.0.0.1:{port}/warnings"))[0] == 403
    user_token = hub.api("POST", "/users/warnme/tokens", {"scopes": ["inherit"]}).json()["token"]
    assert (await fetch_status(f"http://127.0.0.1:{port}/warnings", user_token))[0] == 403
    status, body = await fetch_status(f"http://127.0.0.1:{port}/warnings", hub.token)
    assert status == 200, body
    warnings = json.loads(body)
    assert [(w["user"], w["server"], w["reason"]) for w in warnings] == [("warnme", "", "idle")]
    d = by_name(await app.cull_pass())
    assert d["warnme"].action == P.WARN  # not yet: the period has not passed
    assert server_state(hub, "warnme") == "running"
    text = await fetch(f"http://127.0.0.1:{port}/metrics", prometheus_token(culler_token))
    assert "gpuspawner_culler_warned_servers 1.0" in text
    await asyncio.sleep(3)
    d = by_name(await app.cull_pass())
    assert d["warnme"].action == P.CULL
    wait_stopped(hub, "warnme")
    status, body = await fetch_status(f"http://127.0.0.1:{port}/warnings", hub.token)
    assert json.loads(body) == []


async def fetch(url: str, token: str) -> str:
    """The body of a GET with a hub token, sent as Prometheus sends one (Bearer)."""
    from tornado.httpclient import AsyncHTTPClient

    headers = {"Authorization": f"Bearer {token}"}
    return (await AsyncHTTPClient().fetch(url, headers=headers)).body.decode()


async def fetch_status(url: str, token: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET, with a hub token if given."""
    from tornado.httpclient import AsyncHTTPClient

    headers = {"Authorization": f"token {token}"} if token else {}
    r = await AsyncHTTPClient().fetch(url, headers=headers, raise_error=False)
    return r.code, r.body.decode()


def user_token(hub, user: str, scopes: list[str]) -> str:
    hub.api("POST", f"/users/{user}")
    r = hub.api("POST", f"/users/{user}/tokens", {"scopes": scopes})
    assert r.status == 201, (r.status, r.body)
    return r.json()["token"]


async def test_api_warning_tells_each_token_only_its_own_servers(hub, culler_token):
    """/api/warning: a server's token sees its own server's warning, nobody sees another's."""
    start_servers(hub, {"owner": CPU, "bystander": CPU})
    await asyncio.sleep(1.2)
    port = free_port()
    app = make_culler(
        hub, culler_token, timeout=1, warning_period=600, metrics_url=f"http://127.0.0.1:{port}"
    )
    app._listen()
    d = by_name(await app.cull_pass())
    assert d["owner"].action == P.WARN and d["bystander"].action == P.WARN
    url = f"http://127.0.0.1:{port}/api/warning"

    # a token like the server's own: access to that one server only
    access = "access:services!service=gpuspawner-culler"
    own = user_token(hub, "owner", ["access:servers!server=owner/", access])
    status, body = await fetch_status(url, own)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["user"] == "owner"
    [w] = answer["warnings"]
    assert (w["user"], w["server"], w["reason"]) == ("owner", "", "idle")
    assert w["cull_at"] >= w["warned_at"] + 600
    assert "will be stopped at" in w["message"] and "use it before then" in w["message"]

    # the same user's token for another of its servers learns nothing about this one
    other_server = user_token(hub, "owner", ["access:servers!server=owner/train", access])
    assert json.loads((await fetch_status(url, other_server))[1])["warnings"] == []
    # another user's full token: only its own server, never the owner's
    bystander = user_token(hub, "bystander", ["inherit"])
    answer = json.loads((await fetch_status(url, bystander))[1])
    assert [(w["user"], w["server"]) for w in answer["warnings"]] == [("bystander", "")]
    # a user with no warned server: nothing
    free = user_token(hub, "idle-free", ["inherit"])
    assert json.loads((await fetch_status(url, free))[1])["warnings"] == []
    # a service's token without access to the culler (the hub's test service): refused
    assert (await fetch_status(url, hub.token))[0] == 403
    # a token of the owner without access to the culler: refused, saying what to grant
    status, body = await fetch_status(url, user_token(hub, "owner", ["access:servers!user"]))
    assert status == 403 and access in json.loads(body)["message"], body
    # no token, or one the hub does not know: refused, in JSON
    for token in (None, "not-a-token"):
        status, body = await fetch_status(url, token)
        assert status == 403 and json.loads(body)["status"] == 403, body


async def test_hub_errors_are_retried_and_never_crash(hub, culler_token):
    start_servers(hub, {"err1": CPU, "err2": CPU})
    await asyncio.sleep(1.2)
    proxy = FaultProxy(hub.public_url)
    proxy.start()
    try:
        app = make_culler(hub, culler_token, timeout=1, hub_api_url=f"{proxy.url}/hub/api")
        # DELETE of err1 fails for good (500), everything else works after two 503s
        proxy.fail_first(2, 503)
        first = proxy.fault

        def fault(method, path):
            if method == "DELETE" and "/users/err1/" in path:
                return 500
            return first(method, path)

        proxy.fault = fault
        d = by_name(await app.cull_pass())
        assert d["err1"].action == P.CULL and d["err2"].action == P.CULL
        wait_stopped(hub, "err2")
        assert server_state(hub, "err1") == "running"
        assert metric(app, "gpuspawner_culler_errors_total", source="hub") == 1
        assert metric(app, "gpuspawner_culler_culls_total", reason="idle", profile="pytorch") == 1
        assert proxy.counts["GET"] == 3  # two 503s, then the page

        # A request that hangs is abandoned at hub_timeout and retried.
        app.hub.timeout = 0.5
        hangs = [1]

        def hang_once(method, path):
            if hangs[0]:
                hangs[0] -= 1
                return 0
            return None

        proxy.fault = hang_once
        d = by_name(await app.cull_pass())
        assert d["err1"].action == P.CULL
        wait_stopped(hub, "err1")

        # The hub gone entirely: the pass is abandoned, counted, and the service lives on.
        proxy.stop()
        before = metric(app, "gpuspawner_culler_errors_total", source="hub")
        assert await app.cull_pass() is None
        assert metric(app, "gpuspawner_culler_errors_total", source="hub") == before + 1
        app.once = True
        await app.run()  # a failing pass inside the service loop does not raise
    finally:
        proxy.stop()


async def test_managed_service_serves_metrics_through_the_proxy(hub, culler_token):
    """The hub starts the culler as a service (python -m gpuspawner.culler); its /metrics
    answers a token with read:metrics (Prometheus's), and nobody else through the proxy."""
    url = f"{hub.public_url}/services/gpuspawner-culler/metrics"
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        try:
            text = await fetch(url, prometheus_token(culler_token))
            if "gpuspawner_culler_last_success_timestamp_seconds" in text:
                value = [
                    line
                    for line in text.splitlines()
                    if line.startswith("gpuspawner_culler_last_success_timestamp_seconds ")
                ]
                if value and float(value[0].split()[1]) > 0:
                    break
        except OSError:
            pass
        await asyncio.sleep(0.5)
    else:
        pytest.fail(f"no successful pass reported at {url}:\n{text[-1000:]}\n{hub.log()[-2000:]}")
    assert 'gpuspawner_culler_errors_total{source="hub"} 0.0' in text
    # anyone reaching the proxy, and a token that may do much but not read metrics: refused
    need = "a JupyterHub token with the read:metrics scope is needed"
    for token in (None, "not-a-token", hub.token):
        status, body = await fetch_status(url, token)
        assert (status, json.loads(body)["message"]) == (403, need), (token, body)
    # the service's own port refuses them too: with a url, it is what the proxy forwards to
    direct = f"http://127.0.0.1:{hub.managed_culler_port}/metrics"
    assert (await fetch_status(direct))[0] == 403
    assert (await fetch_status(direct, prometheus_token(culler_token)))[0] == 200


def fixture_pod_of(user: str) -> dict:
    """The fixture's running A100 pod (namespace jupyterhub), as the user's."""
    pod = json.loads(json.dumps(next(p for p in PODS if p["metadata"]["name"] == "jupyter-run")))
    pod["metadata"]["name"] = pod_name(user)
    pod["metadata"]["annotations"]["hub.jupyter.org/username"] = user
    pod["metadata"]["labels"]["hub.jupyter.org/username"] = user
    return pod


def patches_of(kubeapi, *users: str) -> list:
    """The stand-in's PATCH requests for these users' pods (servers left by earlier tests are culled too)."""
    paths = {f"/api/v1/namespaces/jupyterhub/pods/{pod_name(u)}" for u in users}  # the fixture's
    return [r for r in kubeapi.requests if r[0] == "PATCH" and r[1] in paths]


IDLE_TIMEOUT = 5


async def test_the_pod_carries_the_warning_then_the_reason_before_the_stop(
    hub, culler_token, kubeapi
):
    from gpuspawner.core import labels, stopreasons

    start_servers(hub, {"noted": A100, "kept": A100})
    kubeapi.objects["pods"] = [fixture_pod_of("noted"), fixture_pod_of("kept")]
    pods = {p["metadata"]["name"]: p["metadata"] for p in kubeapi.objects["pods"]}
    # Idle for longer than the timeout; the timeout long enough that a pass on a loaded
    # machine does not make 'kept' idle again right after its activity.
    await asyncio.sleep(IDLE_TIMEOUT + 0.2)
    app = make_culler(hub, culler_token, timeout=IDLE_TIMEOUT, warning_period=600, kubernetes="on")
    stop_server = app.hub.stop_server

    async def stop_and_record(user, server):
        kubeapi.requests.append(("hub DELETE", user))
        return await stop_server(user, server)

    app.hub.stop_server = stop_and_record
    try:
        d = by_name(await app.cull_pass())
        assert d["noted"].action == d["kept"].action == P.WARN
        for user in ("noted", "kept"):
            warning = stopreasons.CullWarning.from_state(
                pods[pod_name(user)]["annotations"][labels.ANNOTATION_CULL_WARNING]
            )
            assert warning.reason == "idle"
            assert warning.cull_after == pytest.approx(app.warned[(user, "")].warned_at + 600)
        assert len(patches_of(kubeapi, "noted", "kept")) == 2
        await app.cull_pass()  # still warned: not written again
        assert len(patches_of(kubeapi, "noted", "kept")) == 2

        set_activity(hub, "kept")  # the warning is withdrawn, and so is its annotation
        # the warning period has passed for 'noted'
        mark = app.warned[("noted", "")]
        app.warned[("noted", "")] = P.WarningMark(mark.warned_at - 600, mark.reason)
        d = by_name(await app.cull_pass())
        assert d["noted"].action == P.CULL and d["kept"].action != P.WARN
        wait_stopped(hub, "noted")
    finally:
        await app.pods.close()
        stop_all(hub)
    assert labels.ANNOTATION_CULL_WARNING not in pods[pod_name("kept")]["annotations"]
    noted = pods[pod_name("noted")]["annotations"]
    assert labels.ANNOTATION_CULL_WARNING not in noted
    notice = stopreasons.StopNotice.from_state(noted[labels.ANNOTATION_STOP_REASON])
    assert notice.reason == stopreasons.REASON_IDLE
    assert notice.seconds == pytest.approx(d["noted"].idle_seconds)  # the decision's idle time
    writes = [r for r in kubeapi.requests if r[0] in ("PATCH", "hub DELETE") and "noted" in str(r)]
    assert [w[0] for w in writes] == ["PATCH", "PATCH", "hub DELETE"]
    assert labels.ANNOTATION_STOP_REASON in json.dumps(writes[1][3])


def annotations_of(kubeapi, user: str) -> dict:
    pod = next(p for p in kubeapi.objects["pods"] if p["metadata"]["name"] == pod_name(user))
    return pod["metadata"]["annotations"]


def cull_after_on(kubeapi, user: str) -> float | None:
    from gpuspawner.core import labels, stopreasons

    raw = annotations_of(kubeapi, user).get(labels.ANNOTATION_CULL_WARNING)
    warning = stopreasons.CullWarning.from_state(raw)
    return None if warning is None else warning.cull_after


def put_warning(kubeapi, user: str, raw) -> None:
    """A warning left on the pod by an earlier culler process (raw: a cull time, or text)."""
    from gpuspawner.core import labels, stopreasons

    if not isinstance(raw, str):
        raw = json.dumps(stopreasons.CullWarning("idle", raw, seconds=60).to_state())
    annotations_of(kubeapi, user)[labels.ANNOTATION_CULL_WARNING] = raw


async def test_a_dry_run_warns_nobody(hub, culler_token, kubeapi, capfd):
    """A dry run stops nothing, so it tells no user that it will: no /api/warning answer,
    no /warnings entry, no annotation; it logs and counts what it would warn."""
    start_servers(hub, {"drywarn": A100})
    kubeapi.objects["pods"] = [fixture_pod_of("drywarn")]
    await asyncio.sleep(1.2)
    port = free_port()
    app = make_culler(
        hub,
        culler_token,
        timeout=1,
        warning_period=600,
        dry_run=True,
        kubernetes="on",
        metrics_url=f"http://127.0.0.1:{port}",
    )
    app._listen()
    capfd.readouterr()
    try:
        for _ in range(2):
            d = by_name(await app.cull_pass())
            assert d["drywarn"].action == P.WARN
    finally:
        await app.pods.close()
    base = f"http://127.0.0.1:{port}"
    access = "access:services!service=gpuspawner-culler"
    own = user_token(hub, "drywarn", ["access:servers!server=drywarn/", access])
    status, body = await fetch_status(f"{base}/api/warning", own)
    assert status == 200 and json.loads(body)["warnings"] == [], body
    status, body = await fetch_status(f"{base}/warnings", hub.token)
    assert status == 200 and json.loads(body) == [], body
    assert patches_of(kubeapi, "drywarn") == []
    from gpuspawner.core import labels

    assert labels.ANNOTATION_CULL_WARNING not in annotations_of(kubeapi, "drywarn")
    assert server_state(hub, "drywarn") == "running"
    log = capfd.readouterr().err
    assert "would warn 'drywarn'" in log, log[-2000:]
    assert (
        metric(app, "gpuspawner_culler_would_warnings_total", reason="idle", profile="pytorch") == 2
    )
    assert metric(app, "gpuspawner_culler_warnings_total", reason="idle", profile="pytorch") == 0
    assert metric(app, "gpuspawner_culler_warned_servers") == 0


async def test_a_restarted_culler_takes_up_and_clears_the_warnings_on_pods(
    hub, culler_token, kubeapi
):
    """Warnings live on the pods, so a new culler process converges: it keeps a warning still
    ahead to its time, replaces stale and unreadable ones, and removes those of servers
    used since."""
    users = ("wkeep", "wused", "wstale", "wjunk")
    start_servers(hub, dict.fromkeys(users, A100))
    kubeapi.objects["pods"] = [fixture_pod_of(u) for u in users]
    await asyncio.sleep(IDLE_TIMEOUT + 0.2)
    now = time.time()
    put_warning(kubeapi, "wkeep", now + 3)  # announced by the culler before the restart
    put_warning(kubeapi, "wused", now + 300)
    put_warning(kubeapi, "wstale", now - 3600)  # its time passed long ago, and nobody acted
    put_warning(kubeapi, "wjunk", "{not a warning")
    set_activity(hub, "wused")
    settings = dict(timeout=IDLE_TIMEOUT, warning_period=600, kubernetes="on")

    first = make_culler(hub, culler_token, **settings)
    try:
        d = by_name(await first.cull_pass())
    finally:
        await first.pods.close()
    assert {u: d[u].action for u in users} == {
        "wkeep": P.WARN,
        "wused": P.KEEP,
        "wstale": P.WARN,
        "wjunk": P.WARN,
    }
    assert patches_of(kubeapi, "wkeep") == []  # it carries the right time already
    assert cull_after_on(kubeapi, "wkeep") == pytest.approx(now + 3)
    assert first.warned[("wkeep", "")].warned_at == pytest.approx(now + 3 - 600)
    assert cull_after_on(kubeapi, "wused") is None
    from gpuspawner.core import labels

    assert labels.ANNOTATION_CULL_WARNING not in annotations_of(kubeapi, "wused")
    for user in ("wstale", "wjunk"):  # a new warning: a whole period from now
        assert cull_after_on(kubeapi, user) == pytest.approx(
            first.warned[(user, "")].warned_at + 600
        )
        assert cull_after_on(kubeapi, user) > now + 590

    # Another restart after wkeep's time: it is culled then, as its user was told;
    # the others' warnings are taken up as they are, not written again.
    await asyncio.sleep(max(0.0, now + 3.5 - time.time()))
    before = {u: len(patches_of(kubeapi, u)) for u in ("wstale", "wjunk")}
    second = make_culler(hub, culler_token, **settings)
    try:
        d = by_name(await second.cull_pass())
    finally:
        await second.pods.close()
    assert d["wkeep"].action == P.CULL, d["wkeep"]
    wait_stopped(hub, "wkeep")
    assert labels.ANNOTATION_STOP_REASON in annotations_of(kubeapi, "wkeep")
    assert (d["wstale"].action, d["wjunk"].action) == (P.WARN, P.WARN)
    assert {u: len(patches_of(kubeapi, u)) for u in ("wstale", "wjunk")} == before


async def test_a_failed_stop_leaves_no_stop_reason(hub, culler_token, kubeapi):
    """A user who later stops the server themselves must not read that the culler did; a
    warned server keeps its warning, due as it was, and the next pass stops it."""
    from gpuspawner.core import labels, stopreasons

    start_servers(hub, {"stopfail": A100, "warnfail": A100})
    kubeapi.objects["pods"] = [fixture_pod_of("stopfail"), fixture_pod_of("warnfail")]
    await asyncio.sleep(1.2)
    proxy = FaultProxy(hub.public_url)
    proxy.start()
    failing = {"stopfail", "warnfail"}
    proxy.fault = lambda method, path: (
        500 if method == "DELETE" and any(f"/users/{u}/" in path for u in failing) else None
    )
    settings = dict(timeout=1, kubernetes="on", hub_api_url=f"{proxy.url}/hub/api", max_retries=1)
    # one culler without a warning period (stopfail), one with (warnfail), each leaving
    # the other's server alone
    plain = make_culler(hub, culler_token, exempt_users=["warnfail"], **settings)
    warning = make_culler(
        hub, culler_token, exempt_users=["stopfail"], warning_period=600, **settings
    )

    def stop_reason_writes(user: str) -> list:
        patches = [r[3]["metadata"]["annotations"] for r in patches_of(kubeapi, user)]
        return [
            p[labels.ANNOTATION_STOP_REASON] for p in patches if labels.ANNOTATION_STOP_REASON in p
        ]

    try:
        assert by_name(await plain.cull_pass())["stopfail"].action == P.CULL
        put_warning(kubeapi, "warnfail", time.time() - 1)  # due: this pass culls it
        assert by_name(await warning.cull_pass())["warnfail"].action == P.CULL
        for app in (plain, warning):
            assert metric(app, "gpuspawner_culler_errors_total", source="hub") == 1
            assert (
                metric(app, "gpuspawner_culler_culls_total", reason="idle", profile="pytorch") == 0
            )
        for user in ("stopfail", "warnfail"):
            assert server_state(hub, user) == "running"
            assert labels.ANNOTATION_STOP_REASON not in annotations_of(kubeapi, user), user
            written, removed = stop_reason_writes(user)  # before the stop, and after it failed
            assert stopreasons.StopNotice.from_state(written) is not None and removed is None
        assert cull_after_on(kubeapi, "stopfail") is None  # it had no warning
        restored = cull_after_on(kubeapi, "warnfail")
        assert restored == pytest.approx(warning.warned[("warnfail", "")].warned_at + 600)
        assert restored < time.time()  # as due as before: no new warning period

        failing.clear()  # the hub stops servers again: the next passes stop both
        assert by_name(await plain.cull_pass())["stopfail"].action == P.CULL
        assert by_name(await warning.cull_pass())["warnfail"].action == P.CULL
        for user in ("stopfail", "warnfail"):
            wait_stopped(hub, user)
            notice = stopreasons.StopNotice.from_state(
                annotations_of(kubeapi, user)[labels.ANNOTATION_STOP_REASON]
            )
            assert notice.reason == stopreasons.REASON_IDLE
    finally:
        await plain.pods.close()
        await warning.pods.close()
        proxy.stop()


@pytest.fixture
async def garbage_prometheus():
    """A "Prometheus" whose query API answers 200 with the body the test sets."""
    with scripted_server(r"/api/v1/query", "application/json") as answer:
        yield answer


GARBAGE_ANSWERS = [
    b"[]",
    b"<html>a login page</html>",
    b'{"status": "success", "data": []}',
    b'{"status": "success", "data": {"resultType": "vector", "result": {}}}',
    b'{"status": "success", "data": {"resultType": "vector", "result": [["x"]]}}',
    b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}',
    b'{"status": "success", "data": {"resultType": "vector", '
    b'"result": [{"metric": {"pod": 1}, "value": [1, "1"]}]}}',
    b'{"status": "success", "data": {"resultType": "vector", '
    b'"result": [{"metric": {}, "value": [1, "NaN"]}]}}',
]


async def test_wrong_prometheus_answers_never_end_the_pass(
    hub, culler_token, kubeapi, garbage_prometheus, capfd
):
    """Without GPU data the pass goes on: CPU servers are culled when idle, max_age holds,
    pressure sees the demand, and GPU servers count as busy."""
    start_servers(hub, {"gcpu": CPU, "ga100": A100})
    kubeapi.objects["pods"] = [
        running_pod("ga100", "a100", "n0"),
        *[
            in_namespace(p, NAMESPACE)
            for p in PODS
            if p["metadata"]["name"] == "jupyter-wait1"  # one a100 GPU waited for
        ],
    ]
    await asyncio.sleep(1.2)
    settings = dict(
        prometheus_url=garbage_prometheus["url"],
        timeout=1,
        pressure_timeout=1,
        kubernetes="on",
        namespace=NAMESPACE,
        dry_run=True,
        hub_demand=False,
    )
    for body in GARBAGE_ANSWERS:
        garbage_prometheus["body"] = body
        capfd.readouterr()
        idle = make_culler(hub, culler_token, **settings)
        aged = make_culler(hub, culler_token, max_age=1, **settings)
        try:
            d = by_name(await idle.cull_pass())
            old = by_name(await aged.cull_pass())
        finally:
            await idle.pods.close()
            await aged.pods.close()
        assert (d["gcpu"].action, d["gcpu"].reason) == (P.CULL, P.REASON_IDLE), body
        assert (d["ga100"].action, d["ga100"].reason) == (P.KEEP, P.REASON_GPU_UNAVAILABLE), body
        assert metric(idle, "gpuspawner_culler_pressure_waiting_gpus", gpu_type="a100") == 1
        assert metric(idle, "gpuspawner_culler_errors_total", source="prometheus") == 1
        assert metric(idle, "gpuspawner_culler_errors_total", source="internal") == 0
        assert metric(idle, "gpuspawner_culler_last_success_timestamp_seconds") > 0
        assert {u: x.reason for u, x in old.items() if u in ("gcpu", "ga100")} == {
            "gcpu": P.REASON_MAX_AGE,
            "ga100": P.REASON_MAX_AGE,
        }
        log = capfd.readouterr().err
        lines = [line for line in log.splitlines() if "every GPU server counts as busy" in line]
        assert lines and "Prometheus" in lines[0], log[-2000:]
        assert "Traceback" not in log
    for user in ("gcpu", "ga100"):
        assert server_state(hub, user) == "running"  # dry run


def pods_for_pressure() -> list[dict]:
    """One running a100 server pod of 'kfault' and one pod waiting for an a100 GPU."""
    return [
        running_pod("kfault", "a100", "n0"),
        *[in_namespace(p, NAMESPACE) for p in PODS if p["metadata"]["name"] == "jupyter-wait1"],
    ]


async def test_kubernetes_faults_never_end_the_pass(hub, culler_token, kubeapi, capfd):
    """429 and 5xx are retried; when they last, the pass goes on without pressure and says
    so; a list whose continue token expired (410 Gone) is read again from the start."""
    from gpuspawner.clients.kube import Reader, RetryPolicy

    start_servers(hub, {"kfault": A100})
    kubeapi.objects["pods"] = pods_for_pressure()
    app = make_culler(
        hub,
        culler_token,
        kubernetes="on",
        namespace=NAMESPACE,
        pressure_timeout=1,
        hub_demand=False,
        dry_run=True,  # pressure picks kfault: it stays for the next pass
    )
    # pages of one pod (a continue token to expire), retries for a second, not thirty
    app.pods.reader = Reader(
        retry=RetryPolicy(timeout=1, first_delay=0.05, max_delay=0.1), page_size=1, logger=app.log
    )

    def waiting() -> float:
        return metric(app, "gpuspawner_culler_pressure_waiting_gpus", gpu_type="a100")

    try:
        kubeapi.fail = [429, 500, 503]  # then the answers
        assert await app.cull_pass() is not None
        assert waiting() == 1
        assert metric(app, "gpuspawner_culler_errors_total", source="kubernetes") == 0

        kubeapi.fail = [None, 410]  # the second page: "the continue token is too old"
        app.log_level = logging.INFO  # the list read again is logged, as a matter of course
        capfd.readouterr()
        d = by_name(await app.cull_pass())
        assert waiting() == 1 and d["kfault"].server.node == "n0"
        assert metric(app, "gpuspawner_culler_errors_total", source="kubernetes") == 0
        assert "listing the pods again from the start" in capfd.readouterr().err

        for status in (500, 429):
            kubeapi.always = status
            capfd.readouterr()
            assert await app.cull_pass() is not None
            kubeapi.always = None
            assert waiting() == 0
            log = capfd.readouterr().err
            assert f"failed with HTTP {status}" in log and "no pressure mode this pass" in log
            assert "Traceback" not in log
        assert metric(app, "gpuspawner_culler_errors_total", source="kubernetes") == 2
    finally:
        await app.pods.close()


async def test_hub_faults_never_end_the_service(hub, culler_token, kubeapi, capfd):
    """The hub's metrics answering 500: pressure counts pending pods only; the user list
    timing out on every try: the pass is abandoned with one sentence, the next one works."""
    start_servers(hub, {"hfault": CPU})
    kubeapi.objects["pods"] = [
        in_namespace(p, NAMESPACE) for p in PODS if p["metadata"]["name"] == "jupyter-wait1"
    ]
    proxy = FaultProxy(hub.public_url)
    proxy.start()
    app = make_culler(
        hub,
        culler_token,
        kubernetes="on",
        namespace=NAMESPACE,
        pressure_timeout=1,
        hub_api_url=f"{proxy.url}/hub/api",
        max_retries=1,
    )
    try:
        proxy.fault = lambda method, path: 500 if path == "/hub/metrics" else None
        capfd.readouterr()
        assert await app.cull_pass() is not None
        assert metric(app, "gpuspawner_culler_errors_total", source="hub-metrics") == 1
        assert metric(app, "gpuspawner_culler_pressure_waiting_gpus", gpu_type="a100") == 1
        assert "pressure mode counts only Pending pods" in capfd.readouterr().err

        proxy.fault = lambda method, path: 0 if path.startswith("/hub/api/users") else None
        app.hub.timeout = 0.5  # each try hangs until abandoned
        assert await app.cull_pass() is None
        log = capfd.readouterr().err
        [line] = [line for line in log.splitlines() if "Pass abandoned" in line]
        assert "did not answer GET /users" in line and "Timeout" in line, line
        assert metric(app, "gpuspawner_culler_errors_total", source="hub") == 1

        proxy.fault = lambda method, path: None
        app.hub.timeout = 30
        d = by_name(await app.cull_pass())
        assert "hfault" in d
    finally:
        await app.pods.close()
        proxy.stop()
