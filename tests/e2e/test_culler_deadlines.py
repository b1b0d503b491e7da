"""Deadlines on real nodes: ``max_runtime`` and a GPU-hours budget, warned first, then stopped.

The hub's own culler (the service the hub starts) runs with short durations and a
catalog of its own: the session catalog plus ``max_runtime: 60s`` on the image
``licensed`` and a 1 GPU-hour daily budget for one user only, so that no other
test's server is touched. The budget's use comes from a usage store (SQLite)
filled as the hub's recorder fills it: an earlier interval, and the running
server's own from its pod's real ``PodScheduled`` time, so that its budget runs
out about 30 s after it started. Each user then reads why on the hub's home page
and through the gpuspawner service's REST stop notices.
"""

from __future__ import annotations

import html
import json
import re
import time
from datetime import datetime

import pytest
import yaml

from gpuspawner.core import labels, stopreasons
from gpuspawner.core.usage import Interval
from gpuspawner_sandbox.demo import REPO

from .conftest import E2E_CATALOG, ensure_user, pod_of, server_state, wait_for, wait_ready
from .test_capacity import browser

SANDBOX_CULLER_CONFIG = REPO / "config" / "sandbox" / "culler_config.py"
RUNTIME_USER = "runtimer"
BUDGET_USER = "budgeter"
MAX_RUNTIME = 60
WARNING_PERIOD = 20
BUDGET_LEFT = 30


def page_text(opener, url) -> str:
    with opener.open(url, timeout=30) as response:
        return html.unescape(re.sub(r"<[^>]+>", "", response.read().decode()))


def rest_notices(opener, hub) -> dict:
    url = f"{hub.public_url}/services/gpuspawner/stop-notices"
    with opener.open(url, timeout=30) as response:
        return {n["server"]: n for n in json.loads(response.read())["notices"]}


@pytest.fixture(scope="module")
def deadline_hub(stack, tmp_path_factory):
    """The session's hub, its culler running every 5 s with the deadlines' catalog and store."""
    from gpuspawner.accounting.store import UsageStore

    workdir = tmp_path_factory.mktemp("deadlines")
    catalog = yaml.safe_load(E2E_CATALOG.read_text())
    catalog["images"]["licensed"]["max_runtime"] = f"{MAX_RUNTIME}s"
    # a daily budget whose day began 12 h ago: no reset falls inside the test
    reset = time.strftime("%H:%M", time.gmtime(time.time() - 12 * 3600))
    catalog["limits"]["gpu_hours"] = {
        "period": "day",
        "reset": reset,
        "users": {BUDGET_USER: 1},
    }
    catalog_path = workdir / "catalog.yaml"
    catalog_path.write_text(yaml.safe_dump(catalog))
    db_url = f"sqlite:///{workdir / 'usage.sqlite'}"
    store = UsageStore(db_url)
    store.migrate()
    config = workdir / "culler_config.py"
    config.write_text(
        f"load_subconfig({str(SANDBOX_CULLER_CONFIG)!r})\n"
        "c.GPUCuller.cull_every = 5\n"
        f"c.GPUCuller.warning_period = {WARNING_PERIOD}\n"
        "c.GPUCuller.min_running = 0\n"
        "c.GPUCuller.pressure_timeout = 0\n"
        f"c.GPUCuller.catalog_file = {str(catalog_path)!r}\n"
        f"c.GPUCuller.accounting_db_url = {db_url!r}\n"
    )
    before = stack.hub_env.get("GPUSPAWNER_CULLER_CONFIG")
    stack.hub_env["GPUSPAWNER_CULLER_CONFIG"] = str(config)
    stack.stop_hub()
    hub = stack.start_hub()
    try:
        yield hub, store
    finally:
        store.close()
        if before is None:
            stack.hub_env.pop("GPUSPAWNER_CULLER_CONFIG", None)
        else:
            stack.hub_env["GPUSPAWNER_CULLER_CONFIG"] = before
        stack.stop_hub()
        stack.start_hub()


def warning_on_pod(kube, user) -> stopreasons.CullWarning | None:
    pod = pod_of(kube, user)
    if pod is None:
        return None
    annotations = pod["metadata"].get("annotations") or {}
    return stopreasons.CullWarning.from_state(annotations.get(labels.ANNOTATION_CULL_WARNING))


def warned_then_stopped(hub, kube, user: str, reason: str) -> stopreasons.CullWarning:
    """The culler's warning, seen on the pod while the server still runs; then the stop."""
    warning = wait_for(
        lambda: (w := warning_on_pod(kube, user)) is not None and w.reason == reason and w,
        60,
        what=f"the {reason} warning on {user}'s pod",
    )
    assert server_state(hub, user) is not None  # warned first: still running
    assert warning.keep_choices == () and warning.keep_refused  # no keep helps
    wait_for(lambda: server_state(hub, user) is None, 90, what=f"{user}'s server to be stopped")
    return warning


def test_max_runtime_stops_a_server_after_its_warning(deadline_hub, kube):
    hub, _ = deadline_hub
    ensure_user(hub, RUNTIME_USER)
    hub.api("POST", "/groups/licensed")  # 201, or 409 when another test made it
    r = hub.api("POST", "/groups/licensed/users", {"users": [RUNTIME_USER]})
    assert r.status == 200, r.body
    try:
        r = hub.api("POST", f"/users/{RUNTIME_USER}/server", {"profile": "licensed", "gpus": "0"})
        assert r.status in (201, 202), r.body
        runtime_stop(hub, kube)
    finally:
        # the group's members are test_spawn_form's to count
        hub.api("DELETE", "/groups/licensed/users", {"users": [RUNTIME_USER]})


def runtime_stop(hub, kube) -> None:
    wait_ready(hub, RUNTIME_USER)
    opener = browser(hub, RUNTIME_USER)
    started = hub.api("GET", f"/users/{RUNTIME_USER}").json()["servers"][""]["started"]
    started = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()

    # the user reads the warning on the home page while the server runs
    home = wait_for(
        lambda: (
            (text := page_text(opener, f"{hub.public_url}/hub/home"))
            and "maximum running time" in text
            and text
        ),
        60,
        what="the warning on the home page",
    )
    assert "because it reaches the maximum running time of 60 seconds" in home
    warning = warned_then_stopped(hub, kube, RUNTIME_USER, stopreasons.REASON_MAX_RUNTIME)
    assert warning.cull_after == pytest.approx(started + MAX_RUNTIME, abs=1)

    home = page_text(opener, f"{hub.public_url}/hub/home")
    assert re.search(
        r"Your server was stopped at \d\d:\d\d UTC because it reached the maximum running "
        r"time of 60 seconds\.",
        home,
    ), home
    [notice] = rest_notices(opener, hub).values()
    assert notice["reason"] == "max-runtime"


def test_a_running_server_is_stopped_at_its_budget_with_the_reason_shown(deadline_hub, kube):
    hub, store = deadline_hub
    ensure_user(hub, BUDGET_USER)
    r = hub.api(
        "POST",
        f"/users/{BUDGET_USER}/server",
        {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"},
    )
    assert r.status in (201, 202), r.body
    wait_ready(hub, BUDGET_USER)
    pod = pod_of(kube, BUDGET_USER)
    [scheduled] = [
        c["lastTransitionTime"]
        for c in pod["status"]["conditions"]
        if c["type"] == "PodScheduled" and c["status"] == "True"
    ]
    scheduled = datetime.fromisoformat(scheduled.replace("Z", "+00:00")).timestamp()
    # the running server's interval, and an earlier one that leaves BUDGET_LEFT seconds
    # from now at the 1 A100 it holds
    now = time.time()
    earlier = 3600 - BUDGET_LEFT - (now - scheduled)
    common = {"user": BUDGET_USER, "charge_group": "", "gpu_type": "a100", "image": "pytorch"}
    store.open(
        Interval("earlier", server="", gpus=1, units=1.0, start=now - 6 * 3600, end=None, **common)
    )
    store.close_interval("earlier", now - 6 * 3600 + earlier, "pod")
    uid = pod["metadata"]["uid"]
    store.open(Interval(uid, server="", gpus=1, units=1.0, start=scheduled, end=None, **common))

    opener = browser(hub, BUDGET_USER)
    warning = warned_then_stopped(hub, kube, BUDGET_USER, stopreasons.REASON_BUDGET)
    assert warning.cull_after == pytest.approx(now + BUDGET_LEFT, abs=1)
    assert warning.detail == "today"

    expected = (
        "Your server (1 × NVIDIA A100) was stopped at {} because it used up its user's "
        "GPU-hours budget for today."
    )
    home = page_text(opener, f"{hub.public_url}/hub/home")
    assert re.search(re.escape(expected).replace(r"\{\}", r"\d\d:\d\d UTC"), home), home
    [notice] = rest_notices(opener, hub).values()
    assert notice["reason"] == "budget"
    assert notice["message"].endswith("because it used up its user's GPU-hours budget for today.")
