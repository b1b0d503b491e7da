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
import threading
import time
import urllib.request
from datetime import datetime, timezone

import pytest

from gpuspawner.culler import policy as P

from ..conftest import FIXTURES
from ..hub.hubprocess import free_port
from ..kubeapi import StandInApi
from .faultproxy import FaultProxy
from .hubtools import (
    NAMESPACE,
    make_culler,
    pod_name,
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


@pytest.fixture
async def kubeapi(tmp_path, monkeypatch):
    """A stand-in Kubernetes API server the culler finds through $KUBECONFIG, as a user's would."""
    server = await StandInApi().start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    yield server
    await server.stop()


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
    text = await fetch(f"http://127.0.0.1:{port}/metrics")
    assert "gpuspawner_culler_warned_servers 1.0" in text
    await asyncio.sleep(3)
    d = by_name(await app.cull_pass())
    assert d["warnme"].action == P.CULL
    wait_stopped(hub, "warnme")
    status, body = await fetch_status(f"http://127.0.0.1:{port}/warnings", hub.token)
    assert json.loads(body) == []


async def fetch(url: str) -> str:
    from tornado.httpclient import AsyncHTTPClient

    return (await AsyncHTTPClient().fetch(url)).body.decode()


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


async def test_managed_service_serves_metrics_through_the_proxy(hub):
    """The hub starts the culler as a service (python -m gpuspawner.culler); its /metrics answers."""
    url = f"{hub.public_url}/services/gpuspawner-culler/metrics"
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        try:
            text = await fetch(url)
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
    from gpuspawner import labels, stopnotice

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
            warning = stopnotice.CullWarning.from_state(
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
    notice = stopnotice.StopNotice.from_state(noted[labels.ANNOTATION_STOP_REASON])
    assert notice.reason == stopnotice.REASON_IDLE
    assert notice.seconds == pytest.approx(d["noted"].idle_seconds)  # the decision's idle time
    writes = [r for r in kubeapi.requests if r[0] in ("PATCH", "hub DELETE") and "noted" in str(r)]
    assert [w[0] for w in writes] == ["PATCH", "PATCH", "hub DELETE"]
    assert labels.ANNOTATION_STOP_REASON in json.dumps(writes[1][3])
