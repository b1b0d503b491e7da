"""The GPU page in a real browser, `gpuspawner status` and the hub's /metrics, on the local cluster.

The admin service runs as the sandbox hub config registers it
(config/sandbox/jupyterhub_config.py): a hub-managed service behind the hub's
OAuth, reading the cluster with the hub's service account.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import (
    browser_log_in,
    ensure_user,
    pod_of,
    server_state,
    stop_server,
    wait_for,
    wait_ready,
)

PAGE = "/services/gpuspawner-admin/"


def log_in(browser, hub, name):
    """A browser page logged into the hub as ``name``, opened at the GPU page."""
    return browser_log_in(browser, hub, name, PAGE)


def user_token(hub, name, scopes=None):
    body = {"note": "admin-page test"}
    if scopes is not None:
        body["scopes"] = scopes
    r = hub.api("POST", f"/users/{name}/tokens", body)
    assert r.status == 201, r.body
    return r.json()["token"]


def start_gpu_server(hub, user, gpu_type="a100", gpus="1"):
    ensure_user(hub, user)
    r = hub.api(
        "POST", f"/users/{user}/server", {"profile": "pytorch", "gpu_type": gpu_type, "gpus": gpus}
    )
    assert r.status in (201, 202), r.body
    wait_ready(hub, user)


def status_cli(*args, token):
    return subprocess.run(
        [sys.executable, "-m", "gpuspawner.cli", "status", *args],
        env={"JUPYTERHUB_API_TOKEN": token, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_admin_sees_gpu_servers_and_stops_one(browser, hub, kube):
    start_gpu_server(hub, "pagealice", "a100", "2")
    try:
        pod = pod_of(kube, "pagealice")
        assert pod is not None
        page = log_in(browser, hub, "admin")
        assert page.url.rstrip("/").endswith(PAGE.rstrip("/")), page.url
        types = page.inner_text("#gpu-types")
        assert "NVIDIA A100 (a100)" in types
        # 2 × 4 A100s in the topology, 2 held by this server (others may hold more)
        a100 = page.locator("#gpu-types tr", has_text="(a100)").inner_text().split("\t")
        allocatable, in_use, free = (int(a100[i]) for i in (1, 2, 3))
        assert allocatable == 8 and in_use >= 2 and free == allocatable - in_use

        row = page.locator('tr[data-server="pagealice/"]')
        text = row.inner_text()
        assert "pytorch" in text and "NVIDIA A100" in text and "running" in text
        assert pod["spec"]["nodeName"] in text
        assert "the default rule" in text and "2 of 2" in text

        row.get_by_role("button", name="stop").click()
        page.wait_for_load_state()
        assert "pagealice/default" in page.inner_text("[role=status]")
        wait_for(
            lambda: server_state(hub, "pagealice") is None, 90, what="pagealice's server to stop"
        )
        wait_for(lambda: pod_of(kube, "pagealice") is None, 90, what="pagealice's pod to go")
        # the hub logged the API call, the service who asked for it
        assert "DELETE /hub/api/users/pagealice/server" in hub.log()
        # names are quoted in the service's log: a name cannot forge a line of it
        assert "Admin 'admin' asked to stop 'pagealice/default'" in hub.log()
        # the outcome is shown once, and a link cannot write one
        response = page.goto(hub.public_url + PAGE + "?notice=Sign+in+again+at+evil.example")
        assert page.locator('tr[data-server="pagealice/"]').count() == 0
        assert page.locator("[role=status]").count() == 0
        assert response is not None
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        page.context.close()
    finally:
        if server_state(hub, "pagealice") is not None:
            stop_server(hub, "pagealice")


def test_non_admin_gets_403(browser, hub):
    ensure_user(hub, "pagebob")
    page = log_in(browser, hub, "pagebob")
    response = page.goto(hub.public_url + PAGE)
    assert response is not None and response.status == 403
    assert "GPU pool" not in page.content()
    page.context.close()

    # a non-admin's token is refused by the service itself
    token = user_token(hub, "pagebob")
    request = urllib.request.Request(
        hub.public_url + PAGE + "api/status", headers={"Authorization": f"token {token}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403
    result = status_cli("--hub-url", hub.public_url, token=token)
    assert result.returncode == 1
    assert "custom:gpuspawner:admin" in result.stderr


def test_status_command_against_the_hub(hub, kube, stack):
    start_gpu_server(hub, "statuscai", "h100", "1")
    try:
        token = user_token(hub, "admin", ["custom:gpuspawner:admin"])
        result = status_cli("--hub-url", hub.public_url, "--json", token=token)
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        h100 = next(t for t in data["types"] if t["key"] == "h100")
        assert h100["allocatable"] == 8 and h100["in_use"] >= 1
        user = next(u for u in data["users"] if u["name"] == "statuscai")
        (server,) = user["servers"]
        assert server["gpu_type"] == "h100" and server["gpus"] == 1
        assert server["node"] == pod_of(kube, "statuscai")["spec"]["nodeName"]
        assert user["rule"] == "the default rule" and user["limit"] == 2

        missing = status_cli("--hub-url", hub.public_url, "--user", "nobody", token=token)
        assert missing.returncode == 1 and "no user 'nobody'" in missing.stderr
        ensure_user(hub, "hog")
        text = status_cli("--hub-url", hub.public_url, "--user", "hog", token=token)
        assert text.returncode == 0, text.stderr
        assert "user rule 'hog'" in text.stdout and "unlimited" in text.stdout

        # directly from the cluster (kubeconfig) with the catalog, no admin service
        ensure_user(hub, "student")
        direct = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuspawner.cli",
                "status",
                "--hub-url",
                hub.public_url,
                "--catalog",
                str(stack.catalog),
                "--user",
                "statuscai",
            ],
            env={
                "JUPYTERHUB_API_TOKEN": hub.token,
                "KUBECONFIG": str(stack.control_plane.admin_kubeconfig),
                "PATH": "/usr/bin:/bin",
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert direct.returncode == 0, direct.stderr
        assert "NVIDIA H100 (h100)" in direct.stdout
        assert "statuscai" in direct.stdout and "holds 1 GPUs now" in direct.stdout
    finally:
        stop_server(hub, "statuscai")


def test_hub_metrics(hub):
    start_gpu_server(hub, "metricsdan", "a100", "1")
    try:
        r = hub.api("POST", "/users/metricsdan/servers/more", {"gpus": "1.5"})
        assert r.status == 400
        with urllib.request.urlopen(hub.public_url + "/hub/metrics", timeout=30) as response:
            text = response.read().decode()
    finally:
        stop_server(hub, "metricsdan")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }

    def value(name, **labels):
        return samples.get((name, tuple(sorted(labels.items()))))

    # metricsdan is in no group: group=""; never a user label
    assert value("gpuspawner_gpus_allocated", gpu_type="a100", group="") >= 1
    assert value("gpuspawner_gpus_requested", gpu_type="a100", group="") >= 1
    assert value("gpuspawner_pool_gpus", gpu_type="a100", figure="allocatable") == 8
    assert value("gpuspawner_pool_gpus", gpu_type="a100", figure="in_use") >= 1
    assert value("gpuspawner_spawn_refusals_total", reason="invalid-request") >= 1
    assert value("gpuspawner_gpu_spawn_duration_seconds_count", gpu_type="a100") >= 1
    assert "metricsdan" not in text
