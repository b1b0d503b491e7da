"""Why a server stopped, told to its user on the hub's home and spawn pages, after a hub restart.

Each stop is made by its real writer against the real control plane, with the
hub's service account (config/rbac.yaml): the culler's annotation
(gpuspawner.culler.annotations) and the admin GPU page's (GPUAdmin.annotate_stop)
before the hub's DELETE, as they do; GPUSpawner's own for a failed GPU check.
The culler writing before its DELETE is tests/culler's; node lost and stuck
Pending are tests/hub/test_spawner_stopnotice.py's (they would take a node or the
whole H100 pool from the session's other tests).
"""

from __future__ import annotations

import html
import json
import re
import time
import urllib.error

from gpuspawner.admin.collect import KubeReader
from gpuspawner.admin.service import GPUAdmin
from gpuspawner.clients.kube import KubeClient
from gpuspawner.core import stopreasons
from gpuspawner.culler import annotations
from gpuspawner.culler import policy as P
from gpuspawner_sandbox import gpudriver
from gpuspawner_sandbox.demo import HUB_NAMESPACE, REPO

from .conftest import (
    ensure_user,
    pod_of,
    server_state,
    stop_server,
    stop_servers,
    wait_for,
    wait_ready,
)
from .test_capacity import browser

SANDBOX_CULLER_CONFIG = REPO / "config" / "sandbox" / "culler_config.py"
USER = "whyuser"
CPU = {"profile": "pytorch", "gpus": "0"}
A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}

#: server -> (options, the culler's decision for it)
CULLED = {
    "idle": (CPU, P.Decision(P.Server(USER, "idle"), P.CULL, P.REASON_IDLE, idle_seconds=5400)),
    "gpuidle": (
        A100,
        P.Decision(P.Server(USER, "gpuidle"), P.CULL, P.REASON_GPU_IDLE, idle_seconds=7200),
    ),
    "pressure": (
        CPU,
        P.Decision(P.Server(USER, "pressure"), P.CULL, P.REASON_PRESSURE, idle_seconds=1800),
    ),
    "maxage": (
        CPU,
        P.Decision(
            P.Server(USER, "maxage"), P.CULL, P.REASON_MAX_AGE, idle_seconds=5, timeout=28800
        ),
    ),
}


def page_text(opener, url) -> str:
    """The page as a reader sees it: tags dropped, entities decoded."""
    with opener.open(url, timeout=30) as response:
        return html.unescape(re.sub(r"<[^>]+>", "", response.read().decode()))


def clock(at: float) -> str:
    return stopreasons.utc_clock(at)


async def test_each_stop_reason_is_shown_to_its_user_after_a_hub_restart(
    stack, hub, kube, monkeypatch, tmp_path
):
    ensure_user(hub, USER)
    servers = {**{name: options for name, (options, _) in CULLED.items()}}
    servers.update(admin=CPU, warned=CPU)
    for name, options in servers.items():
        r = hub.api("POST", f"/users/{USER}/servers/{name}", options)
        assert r.status in (201, 202), r.body
    for name in servers:
        wait_ready(hub, USER, name)

    # the writers, with the hub's service account as in the cluster
    monkeypatch.setenv("KUBECONFIG", str(stack.hub_kubeconfig))
    client = KubeClient(HUB_NAMESPACE)
    stopped_at: dict[str, float] = {}
    try:
        for name, (_, decision) in CULLED.items():
            stopped_at[name] = time.time()
            pod = pod_of(kube, USER, name)["metadata"]["name"]
            await client.annotate_pod(
                pod, HUB_NAMESPACE, annotations.stop_annotations(decision, stopped_at[name])
            )
        admin = GPUAdmin()
        admin.kube = KubeReader(client)
        stopped_at["admin"] = time.time()
        await admin.annotate_stop(USER, "admin")
        # each annotated first, then the hub's DELETE, as the culler and the GPU page do
        stop_servers(hub, [(USER, name) for name in [*CULLED, "admin"]])
    finally:
        await client.close()

    # a GPU check that fails: GPUSpawner's own stop
    driver = stack.nodes.paths("gpu-h100-0").driver_state
    gpudriver.inject_fault(driver, kind="ecc", withdraw=False, value="3")
    try:
        hub.api(
            "POST",
            f"/users/{USER}/servers/check",
            {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"},
        )
        wait_for(lambda: server_state(hub, USER, "check") is None, 60, what="the check to fail")
    finally:
        gpudriver.clear_faults(driver)

    # A warning as the culler writes one, and a hub whose culler runs dry: the live
    # culler takes the warnings on the pods as its own on each pass (docs/culler.md)
    # and would clear this one, the server not being idle. A dry run touches none.
    dry_run = tmp_path / "culler_dry_run.py"
    dry_run.write_text(
        f"load_subconfig({str(SANDBOX_CULLER_CONFIG)!r})\nc.GPUCuller.dry_run = True\n"
    )
    monkeypatch.setitem(stack.hub_env, "GPUSPAWNER_CULLER_CONFIG", str(dry_run))
    stack.stop_hub()
    client = KubeClient(HUB_NAMESPACE)
    try:
        warned_pod = pod_of(kube, USER, "warned")["metadata"]["name"]
        cull_after = time.time() + 3600
        decision = P.Decision(P.Server(USER, "warned"), P.WARN, P.REASON_IDLE, idle_seconds=600)
        await client.annotate_pod(
            warned_pod, HUB_NAMESPACE, annotations.warning_annotations(decision, cull_after)
        )
    finally:
        await client.close()
    hub = stack.start_hub()
    opener = browser(hub, USER)
    home = page_text(opener, f"{hub.public_url}/hub/home")
    expected = {
        "idle": f"Your server 'idle' was stopped at {clock(stopped_at['idle'])} because it was "
        "not used for 90 minutes.",
        "gpuidle": f"Your server 'gpuidle' (1 × NVIDIA A100) was stopped at "
        f"{clock(stopped_at['gpuidle'])} because its GPUs were idle for 2 hours.",
        "pressure": f"Your server 'pressure' was stopped at {clock(stopped_at['pressure'])} "
        "because its GPUs were idle for 30 minutes while other users were waiting for them.",
        "maxage": f"Your server 'maxage' was stopped at {clock(stopped_at['maxage'])} because "
        "it reached the maximum age of 8 hours.",
        "admin": f"Your server 'admin' was stopped at {clock(stopped_at['admin'])} because an "
        "admin stopped it from the GPU page.",
    }
    for name, sentence in expected.items():
        assert sentence in home, (name, home)
    check = re.search(r"Your server 'check' \(1 × NVIDIA H100\) was stopped at [^.]*", home)
    assert check, home
    assert "because its GPUs failed their check (" in check.group(0)
    assert (
        f"Your server 'warned' will be stopped at {clock(cull_after)} because it has not been "
        f"used for 10 minutes. To keep it, use it before {clock(cull_after)}." in home
    )
    # the page localises the times; the text above is its fallback
    with opener.open(f"{hub.public_url}/hub/home", timeout=30) as response:
        raw = response.read().decode()
    assert raw.count("data-gpuspawner-time") >= len(expected) + 2
    assert "<script>" in raw and "toLocaleTimeString" in raw

    # the same notices through the gpuspawner service's REST endpoint
    def rest():
        try:
            with opener.open(f"{hub.public_url}/services/gpuspawner/stop-notices", timeout=30) as r:
                return {n["server"]: n for n in json.loads(r.read())["notices"]}
        except urllib.error.HTTPError as e:  # the service still starting after the restart
            assert e.code in (502, 503), e.read()
            return None

    served = wait_for(rest, 60, what="the gpuspawner service")
    assert sorted(served) == sorted([*expected, "check"])
    for name, sentence in expected.items():
        assert served[name]["message"] == sentence
    assert served["gpuidle"]["held"] == "1 × NVIDIA A100"
    assert served["check"]["reason"] == "gpu-check"

    # the spawn page of that server shows its line too
    spawn = page_text(opener, f"{hub.public_url}/hub/spawn/{USER}/idle")
    assert expected["idle"] in spawn

    # starting it again clears it, for good (a stop by the user leaves none)
    r = hub.api("POST", f"/users/{USER}/servers/idle", CPU)
    assert r.status in (201, 202), r.body
    wait_ready(hub, USER, "idle")
    stop_server(hub, USER, "idle")
    home = page_text(opener, f"{hub.public_url}/hub/home")
    assert "Your server 'idle' was stopped" not in home
    assert expected["admin"] in home  # the others stay
    stop_server(hub, USER, "warned")
    home = page_text(opener, f"{hub.public_url}/hub/home")
    assert "will be stopped" not in home
    # the user stopped 'warned' themselves: no line for it
    assert "Your server 'warned'" not in home
    # the later tests get the hub with its live culler back
    monkeypatch.undo()
    stack.stop_hub()
    stack.start_hub()
