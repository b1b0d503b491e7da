"""Keeps, budgets and max_runtime against a real JupyterHub (real jupyterhub-singleuser servers).

The tokens are the hub's own, checked by the culler's real HubAuth; the pods are
a stand-in Kubernetes API's (tests/kubeapi.py), which applies the culler's
annotation patches as the API server does; the budget's use comes from a real
usage store (SQLite, migrated), filled as the hub's recorder fills it.
Durations are seconds so that the tests run in real time.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gpuspawner.core import labels, stopreasons
from gpuspawner.core.usage import Interval
from gpuspawner.culler import policy as P

from ..hub.hubprocess import free_port
from .hubtools import make_culler, stop_all, wait_stopped
from .test_culler_hub import (
    A100,
    annotations_of,
    by_name,
    fixture_pod_of,
    metric,
    start_servers,
    user_token,
)

pytestmark = pytest.mark.hub

ACCESS = "access:services!service=gpuspawner-culler"
IDLE_TIMEOUT = 5


async def post(url: str, token: str | None, body) -> tuple[int, dict]:
    """(status, JSON answer) of a POST with a hub token, if given."""
    from tornado.httpclient import AsyncHTTPClient

    headers = {"Authorization": f"token {token}"} if token else {}
    r = await AsyncHTTPClient().fetch(
        url, method="POST", headers=headers, body=json.dumps(body), raise_error=False
    )
    return r.code, json.loads(r.body.decode())


async def test_api_keep_records_the_keep_and_the_culler_honours_it(hub, culler_token, kubeapi):
    start_servers(hub, {"keeper": A100, "helped": A100})
    kubeapi.objects["pods"] = [fixture_pod_of("keeper"), fixture_pod_of("helped")]
    await asyncio.sleep(IDLE_TIMEOUT + 0.2)
    port = free_port()
    app = make_culler(
        hub,
        culler_token,
        timeout=IDLE_TIMEOUT,
        warning_period=600,
        kubernetes="on",
        metrics_url=f"http://127.0.0.1:{port}",
        keep_services=["tester"],  # the hub's test service asks on users' behalf
    )
    app._listen()
    url = f"http://127.0.0.1:{port}/api/keep"
    try:
        d = by_name(await app.cull_pass())
        assert d["keeper"].action == d["helped"].action == P.WARN
        # the warning on the pod offers the keeps (the home page's buttons)
        raw = annotations_of(kubeapi, "keeper")[labels.ANNOTATION_CULL_WARNING]
        assert stopreasons.CullWarning.from_state(raw).keep_choices == (3600.0, 14400.0)

        own = user_token(hub, "keeper", ["access:servers!server=keeper/", ACCESS])
        body = {"server": "", "seconds": 3600}
        # refused, each with one sentence: no token, another user's, a choice not offered
        assert (await post(url, None, body))[0] == 403
        other = user_token(hub, "helped", ["inherit"])
        status, answer = await post(url, other, {**body, "user": "keeper"})
        assert (status, answer["message"]) == (
            403,
            "This token may keep only its own user's servers.",
        )
        status, answer = await post(url, own, {"server": "", "seconds": 7200})
        assert status == 400 and answer["message"] == "Choose a keep of 60 minutes or 4 hours."
        status, answer = await post(url, own, "not a keep")
        assert status == 400

        before = time.time()
        status, answer = await post(url, own, body)
        assert status == 200, answer
        keep = json.loads(annotations_of(kubeapi, "keeper")[labels.ANNOTATION_KEEP_UNTIL])
        assert keep["seconds"] == 3600 and before + 3600 <= keep["until"] <= time.time() + 3600
        assert answer["keep_until"] == keep["until"]
        # the keep withdraws the standing warning, on the pod and in /api/warning
        assert labels.ANNOTATION_CULL_WARNING not in annotations_of(kubeapi, "keeper")
        assert ("keeper", "") not in app.warned

        d = by_name(await app.cull_pass())  # the pod says it is kept: idle, but kept
        assert (d["keeper"].action, d["keeper"].reason) == (P.KEEP, P.REASON_KEPT)
        assert d["helped"].action == P.WARN

        # pressure wants helped's GPUs: no keep, and why
        mark = app.warned[("helped", "")]
        app.warned[("helped", "")] = P.WarningMark(mark.warned_at, P.REASON_PRESSURE)
        status, answer = await post(url, hub.token, {**body, "user": "helped"})
        assert status == 409 and answer["message"].startswith("Other users are waiting")
        app.warned[("helped", "")] = mark
        # the keep service (the home page's buttons) asks for the user it names
        status, answer = await post(url, hub.token, {**body, "user": "helped"})
        assert status == 200, answer
        assert labels.ANNOTATION_KEEP_UNTIL in annotations_of(kubeapi, "helped")
    finally:
        await app.pods.close()
        stop_all(hub)


async def test_a_keep_during_a_pass_waits_for_it_so_the_pass_cannot_warn_the_kept_server_again(
    hub, culler_token, kubeapi
):
    """A pass reads the pods, then the GPU figures: a keep asked in between must not let
    that pass, which saw no keep, warn the kept server anew or drop the keep from the
    servers that /api/gpu-status shows (it did, at times, in the e2e keep test)."""
    start_servers(hub, {"keeper": A100})
    kubeapi.objects["pods"] = [fixture_pod_of("keeper")]
    await asyncio.sleep(IDLE_TIMEOUT + 0.2)
    port = free_port()
    app = make_culler(
        hub,
        culler_token,
        timeout=IDLE_TIMEOUT,
        warning_period=600,
        kubernetes="on",
        metrics_url=f"http://127.0.0.1:{port}",
    )
    app._listen()
    url = f"http://127.0.0.1:{port}/api/keep"
    try:
        assert by_name(await app.cull_pass())["keeper"].action == P.WARN
        own = user_token(hub, "keeper", ["access:servers!server=keeper/", ACCESS])

        # the next pass stops after reading the pods, before its decisions
        pods_read, go_on = asyncio.Event(), asyncio.Event()
        gpu_view = app._gpu_view

        async def slow_gpu_view(now):
            pods_read.set()
            await go_on.wait()
            return await gpu_view(now)

        app._gpu_view = slow_gpu_view
        in_flight = asyncio.ensure_future(app.cull_pass())
        await asyncio.wait_for(pods_read.wait(), 10)
        keep = asyncio.ensure_future(post(url, own, {"server": "", "seconds": 3600}))
        await asyncio.sleep(0.5)
        assert not keep.done()  # it waits for the pass under way
        assert labels.ANNOTATION_KEEP_UNTIL not in annotations_of(kubeapi, "keeper")
        go_on.set()
        await asyncio.wait_for(in_flight, 10)
        status, answer = await asyncio.wait_for(keep, 10)
        assert status == 200, answer

        # the keep came after that pass's acts: no warning stands, on the pod or in memory,
        # and the servers the culler shows carry the keep until the next pass reads it
        assert labels.ANNOTATION_CULL_WARNING not in annotations_of(kubeapi, "keeper")
        assert ("keeper", "") not in app.warned
        (decision,) = [d for d in app.last_decisions if d.server.user == "keeper"]
        assert decision.server.keep_until == answer["keep_until"]
        d = by_name(await app.cull_pass())
        assert (d["keeper"].action, d["keeper"].reason) == (P.KEEP, P.REASON_KEPT)
    finally:
        await app.pods.close()
        stop_all(hub)


def catalog_text(budget_hours: float, now: float) -> str:
    # a daily budget whose day began 12 h ago: no reset falls inside the test
    reset = time.strftime("%H:%M", time.gmtime(now - 12 * 3600))
    return f"""
images:
  pytorch: {{display_name: PyTorch, image: example.org/pytorch:1}}
  short: {{display_name: Short, image: example.org/short:1, max_runtime: 30s}}
gpu_types:
  a100: {{display_name: NVIDIA A100}}
limits:
  gpu_hours: {{period: day, reset: "{reset}", default: {budget_hours}}}
"""


def store_at(path, spender_left: float, now: float):
    """A migrated usage store where 'spender' (holding 2 A100 since ``now``) has
    ``spender_left`` seconds of a 1 GPU-hour budget left, as the recorder would have it."""
    from gpuspawner.accounting.store import UsageStore

    store = UsageStore(f"sqlite:///{path}")
    store.migrate()
    used = 3600 - 2 * spender_left
    common = {"user": "spender", "charge_group": "", "gpu_type": "a100", "image": "pytorch"}
    store.open(Interval("old", server="", gpus=1, units=1.0, start=now - 7200, end=None, **common))
    store.close_interval("old", now - 7200 + used, "pod")
    store.open(Interval("now", server="", gpus=2, units=2.0, start=now, end=None, **common))
    return store


async def test_budget_and_max_runtime_are_warned_then_stopped_with_their_reason(
    hub, culler_token, kubeapi, tmp_path
):
    start_servers(hub, {"spender": A100, "runner": A100})
    runner = fixture_pod_of("runner")
    runner["metadata"]["labels"][labels.LABEL_PROFILE] = "short"
    kubeapi.objects["pods"] = [fixture_pod_of("spender"), runner]
    now = time.time()
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(catalog_text(1, now))
    store = store_at(tmp_path / "usage.sqlite", 8, now)
    app = make_culler(
        hub,
        culler_token,
        timeout=3600,
        warning_period=600,
        kubernetes="on",
        catalog_file=str(catalog),
        accounting_db_url=f"sqlite:///{tmp_path / 'usage.sqlite'}",
    )
    try:
        d = by_name(await app.cull_pass())
        assert (d["spender"].action, d["spender"].reason) == (P.WARN, P.REASON_BUDGET)
        assert d["spender"].server.deadline.at == pytest.approx(now + 8, abs=0.01)
        assert (d["runner"].action, d["runner"].reason) == (P.WARN, P.REASON_MAX_RUNTIME)
        for user, reason in (("spender", "budget"), ("runner", "max-runtime")):
            raw = annotations_of(kubeapi, user)[labels.ANNOTATION_CULL_WARNING]
            warning = stopreasons.CullWarning.from_state(raw)
            assert warning.reason == reason and warning.keep_choices == ()
            assert warning.cull_after == pytest.approx(d[user].server.deadline.at, abs=1)
            assert "save your work" in warning.sentence()
        # a keep cannot put a deadline off
        assert app.keep_offers()[("spender", "")][0] == ()

        last = max(d[u].server.deadline.at for u in ("spender", "runner"))
        await asyncio.sleep(max(0.0, last - time.time()) + 0.1)
        d = by_name(await app.cull_pass())
        assert (d["spender"].action, d["spender"].reason) == (P.CULL, P.REASON_BUDGET)
        assert (d["runner"].action, d["runner"].reason) == (P.CULL, P.REASON_MAX_RUNTIME)
        wait_stopped(hub, "spender")
        wait_stopped(hub, "runner")
        notice = stopreasons.StopNotice.from_state(
            annotations_of(kubeapi, "spender")[labels.ANNOTATION_STOP_REASON]
        )
        assert notice.because() == "it used up its user's GPU-hours budget for today"
        notice = stopreasons.StopNotice.from_state(
            annotations_of(kubeapi, "runner")[labels.ANNOTATION_STOP_REASON]
        )
        assert notice.because() == "it reached the maximum running time of 30 seconds"
        assert metric(app, "gpuspawner_culler_culls_total", reason="budget", profile="pytorch")

        # a store that cannot be read: the pass goes on without budgets, counted
        start_servers(hub, {"spender": A100})
        from gpuspawner.accounting.store import UsageStore

        app.store = UsageStore(f"sqlite:///{tmp_path / 'not-migrated.sqlite'}")
        d = by_name(await app.cull_pass())
        assert d["spender"].action == P.KEEP
        assert metric(app, "gpuspawner_culler_errors_total", source="accounting") == 1
    finally:
        store.close()
        await app.pods.close()
        stop_all(hub)
