""" "Keep for 1 h" clicked in JupyterLab on real nodes, and the culler keeping that server.

The session's hub (GPUSpawner), restarted with a culler whose GPU-idle rule is
short (a GPU server idle 30 s is warned, and stopped 150 s later) and which
passes every 5 s, reading the stack's real Prometheus (the emulated DCGM
exporters, scraped every 2 s). One user holds two idle A100 servers: both
are warned, with "Keep for 1 h" buttons on the home page; in headless Chromium
the user opens JupyterLab on one and clicks "Keep for 1 h" on the warning. The culler records the keep on that pod, stops
the other one when its warning runs out, as its rule says, and keeps skipping
the kept one pass after pass.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from gpuspawner.core import labels

from .conftest import (
    browser,  # noqa: F401 (the fixture)
    browser_log_in,
    ensure_user,
    pod_of,
    server_state,
    stop_servers,
    wait_for,
    wait_ready,
)

USER = "keeper"
A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
CULLER_CONFIG_ENV = "GPUSPAWNER_CULLER_CONFIG"
GPU_IDLE_TIMEOUT = 30
WARNING_PERIOD = 150
CULL_EVERY = 5
CULLER_CONFIG = f"""
c = get_config()  # noqa
c.GPUCuller.timeouts = [{{"min_gpus": 1, "gpu_timeout": {GPU_IDLE_TIMEOUT}}}]
c.GPUCuller.timeout = 0
c.GPUCuller.min_running = 0
c.GPUCuller.cull_every = {CULL_EVERY}
c.GPUCuller.warning_period = {WARNING_PERIOD}
c.GPUCuller.gpu_query_step = 5
c.GPUCuller.gpu_freshness = 60
c.GPUCuller.pressure_timeout = 0
c.GPUCuller.keep_choices = [3600, 14400]
c.GPUCuller.kubernetes = "on"
c.Application.log_level = "INFO"
"""


@pytest.fixture
def keep_hub(stack, tmp_path):
    """The session's hub with the culler above; the usual one again afterwards."""
    config = tmp_path / "culler_config.py"
    config.write_text(CULLER_CONFIG)
    before = stack.hub_env.get(CULLER_CONFIG_ENV)
    stack.hub_env[CULLER_CONFIG_ENV] = str(config)
    stack.stop_hub()
    try:
        yield stack.start_hub()
    finally:
        if before is None:
            stack.hub_env.pop(CULLER_CONFIG_ENV, None)
        else:
            stack.hub_env[CULLER_CONFIG_ENV] = before
        stack.stop_hub()
        stack.start_hub()


def annotation(kube, name: str, key: str):
    """The JSON value of ``key`` on the live pod of USER's server ``name``, or None."""
    pod = pod_of(kube, USER, name)
    value = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(key)
    return json.loads(value) if value else None


def gpu_status(hub, token: str) -> dict:
    """The culler's /api/gpu-status for the user's own token, through the hub's proxy."""
    request = urllib.request.Request(
        f"{hub.public_url}/services/gpuspawner-culler/api/gpu-status",
        headers={"Authorization": f"token {token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_keep_for_1_h_in_jupyterlab_makes_the_culler_skip_that_server(
    stack,
    keep_hub,
    kube,
    browser,  # noqa: F811
    report,
):
    hub = keep_hub
    ensure_user(hub, USER)
    for name in ("kept", "control"):
        r = hub.api("POST", f"/users/{USER}/servers/{name}", A100)
        assert r.status in (201, 202), r.body
    try:
        wait_ready(hub, USER, "kept", timeout=240)
        wait_ready(hub, USER, "control", timeout=240)
        # both idle GPU servers are warned by the culler, with the keep choices
        warnings = {
            name: wait_for(
                lambda name=name: annotation(kube, name, labels.ANNOTATION_CULL_WARNING),
                180,
                what=f"the culler's warning on {name!r}",
            )
            for name in ("kept", "control")
        }
        for warning in warnings.values():
            assert warning["reason"] == "gpu-idle", warning
            assert warning["keep_choices"] == [3600, 14400], warning
        report(f"warned: {warnings}")

        # the home page offers the same choices on each warning; a button opens the
        # gpuspawner service's page (through the hub's OAuth), which asks once more
        page = browser_log_in(browser, hub, USER, "/hub/home")
        buttons = page.locator("a.gpuspawner-keep")
        assert buttons.count() == 4, page.content()
        page.locator("a.gpuspawner-keep[href*='server=control&seconds=3600']").click()
        page.locator("button.gpuspawner-keep-button").wait_for(timeout=60_000)
        asked = page.locator(".gpuspawner-keep").inner_text()
        assert "Keep your server 'control' running though it is idle, until" in asked, asked
        assert page.locator("button.gpuspawner-keep-button").inner_text() == "Keep for 1 h"

        page.goto(f"{hub.public_url}/user/{USER}/kept/lab")
        toast = page.get_by_text("This server will be stopped at")
        toast.first.wait_for(timeout=120_000)
        assert page.get_by_role("button", name="Keep for 4 h").count() == 1
        clicked = time.time()
        page.get_by_role("button", name="Keep for 1 h").click()
        kept = page.get_by_text("Kept until ")
        kept.first.wait_for(timeout=60_000)
        shown = kept.first.inner_text()
        record = wait_for(
            lambda: annotation(kube, "kept", labels.ANNOTATION_KEEP_UNTIL),
            30,
            what="the keep on the pod",
        )
        # the time the notification names, in the browser's own time zone
        clock = page.evaluate(
            "t => new Date(t * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'})",
            record["until"],
        )
        assert f"Kept until {clock}." in shown, shown
        page.context.close()
        assert record["seconds"] == 3600, record
        assert clicked - 5 <= record["at"] <= time.time() + 5, record
        assert record["until"] == pytest.approx(record["at"] + 3600, abs=1), record
        report(f"JupyterLab said {shown!r}; the pod carries {record}")

        # the kept server's warning is withdrawn; the control keeps its own
        wait_for(
            lambda: annotation(kube, "kept", labels.ANNOTATION_CULL_WARNING) is None,
            60,
            what="the kept server's warning to be withdrawn",
        )
        token = hub.api("POST", f"/users/{USER}/tokens", {"note": "keep e2e"}).json()["token"]
        status = {s["server"]: s for s in gpu_status(hub, token)["servers"]}
        assert status["kept"]["keep_until"] == pytest.approx(record["until"], abs=1), status

        # the same rule stops the other server when its warning runs out...
        wait_for(
            lambda: server_state(hub, USER, "control") is None,
            WARNING_PERIOD + 120,
            what="the control server to be culled",
        )
        culled_at = time.time()
        # ...and the culler's later passes skip the kept one, idle as long
        deadline = culled_at + 4 * CULL_EVERY
        while time.time() < deadline:
            assert server_state(hub, USER, "kept") is not None, hub.log()[-3000:]
            time.sleep(1)
        assert annotation(kube, "kept", labels.ANNOTATION_CULL_WARNING) is None
        assert annotation(kube, "kept", labels.ANNOTATION_KEEP_UNTIL) == record
        log = hub.log()
        assert "kept by its user for 3600s" in log, log[-3000:]
        report(
            f"control culled {culled_at - clicked:.0f} s after the click; the kept server "
            f"still runs {4 * CULL_EVERY} s (4 passes) later"
        )
    finally:
        running = [name for name in ("kept", "control") if server_state(hub, USER, name)]
        stop_servers(hub, [(USER, name) for name in running])
