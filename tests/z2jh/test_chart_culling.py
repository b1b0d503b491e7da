"""GPU-aware culling in a Helm-installed hub, by DCGM utilisation from a Prometheus in the cluster.

The chart's culler and GPU page run in the hub pod and read Prometheus at
``gpuspawner.prometheus.url``; on the local cluster that is
``http://prometheus.monitoring.svc:9090`` (config/sandbox/chart-local-values.yaml), a
Prometheus pod scraping every GPU node's DCGM exporter
(:mod:`gpuspawner_sandbox.clusterprometheus`), as kube-prometheus-stack gives a real
cluster. Short idle timeouts come from the chart's values (``gpuspawner.culler.config``,
one ``helm upgrade`` and a hub restart, as docs/culler.md tells an admin), and are put
back afterwards.

Two users each start a 1-GPU server; one keeps its GPU busy with the notebook images'
``gpu-burn-emulated`` in its terminal's place (run in the notebook container), the other
leaves it idle. The GPU page shows both utilisations; the culler, by itself, stops the
idle one for GPU idleness and keeps the busy one.
"""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from gpuspawner_sandbox import clusterprometheus, testing

from .conftest import NAMESPACE, PASSWORD, Browser, ChartRelease
from .test_helm_install import hub_log, hub_pods, ready, user_pod

ONE_A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
BUSY, IDLE = "bea", "ida"
#: Seconds a 1-GPU server's GPU may sit idle; from the server's start, as the culler counts.
GPU_TIMEOUT = 120
#: The culler's settings for this test, through the chart's values (GPU idleness alone
#: decides: no Jupyter idle timeout, no pressure, no warning first).
CULLING_VALUES = {
    "gpuspawner": {
        "culler": {
            "config": {
                "GPUCuller": {
                    "cull_every": 10,
                    "timeouts": [{"min_gpus": 1, "gpu_timeout": GPU_TIMEOUT}],
                    "timeout": 0,
                    "min_running": 0,
                    "max_age": 0,
                    "warning_period": 0,
                    "pressure_timeout": 0,
                    # the whole idle time fits in the window looked at
                    "gpu_window": GPU_TIMEOUT + 60,
                    "gpu_query_step": 5,
                    "gpu_freshness": 60,
                }
            }
        }
    }
}
HUB_DEPLOYMENT = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hub"


def wait_for(check, timeout: float, what: str):
    return testing.wait_for(what, check, timeout=timeout, interval=2)


def emit(line: str) -> None:
    sys.__stderr__.write(line + "\n")


def restart_hub(release: ChartRelease) -> None:
    """`kubectl rollout restart deployment/hub`: the culler reads its settings at start."""
    api = release.cluster.control_plane.admin_api()
    old = {p["metadata"]["uid"] for p in hub_pods(api)}
    api.request(
        "PATCH",
        HUB_DEPLOYMENT,
        {
            "spec": {
                "template": {
                    "metadata": {
                        "annotations": {"kubectl.kubernetes.io/restartedAt": uuid.uuid4().hex}
                    }
                }
            }
        },
        content_type="application/strategic-merge-patch+json",
    )

    def new_hub_ready():
        pods = hub_pods(api)
        return len(pods) == 1 and pods[0]["metadata"]["uid"] not in old and ready(pods[0])

    wait_for(new_hub_ready, 300, "the restarted hub pod to be ready")
    admin = release.admin

    def culler_routed():
        r = admin.with_token("GET", "/services/gpuspawner-culler/api/warning")
        return r.status_code == 200

    wait_for(culler_routed, 180, "the restarted hub to route its culler")


def helm_upgrade(release: ChartRelease, *more_values: Path) -> None:
    release.cluster.helm.run(*release.helm_args("upgrade", *more_values), timeout=1000)


@pytest.fixture(scope="module")
def in_cluster_prometheus(chart_release: ChartRelease):
    """The local cluster's Prometheus in ``monitoring`` (kept if there already)."""
    return clusterprometheus.deploy_in_cluster_prometheus(chart_release.cluster.nodes, emit=emit)


@pytest.fixture(scope="module")
def short_timeouts(chart_release: ChartRelease, in_cluster_prometheus, tmp_path_factory):
    values = tmp_path_factory.mktemp("culling") / "culling-values.yaml"
    values.write_text(yaml.safe_dump(CULLING_VALUES))
    helm_upgrade(chart_release, values)
    restart_hub(chart_release)
    try:
        yield
    finally:
        # the release's own values again, for the package's other tests
        helm_upgrade(chart_release)
        restart_hub(chart_release)


def start_server(browser: Browser, user: str) -> None:
    r = browser.api("POST", f"/users/{user}/server", json=ONE_A100)
    assert r.status_code in (201, 202), r.text


def wait_ready(release: ChartRelease, browser: Browser, user: str) -> dict:
    api = release.cluster.control_plane.admin_api()

    def started():
        server = browser.api("GET", f"/users/{user}").json()["servers"].get("")
        assert server is not None, f"{user}'s server stopped while starting:\n{hub_log(api)}"
        return server["ready"]

    wait_for(started, 600, f"{user}'s server to be ready")
    return user_pod(api, user)


def burn(pod: dict, seconds: int, percent: int):
    """gpu-burn-emulated in the notebook container, as its user types it in a terminal."""
    return testing.in_pod_container(pod, ["gpu-burn-emulated", str(seconds), str(percent)])


def utilisation_cells(html: str, users: tuple[str, ...]) -> dict[str, str]:
    """The GPU page's utilisation figure ("N %") of each user's default server, if shown."""
    shown = {}
    for user in users:
        row = re.search(rf'<tr data-server="{re.escape(user)}/">(.*?)</tr>', html, re.S)
        if row and (figure := re.search(r">(\d+) %<", row.group(1))):
            shown[user] = figure.group(1)
    return shown


def test_the_helm_installed_culler_culls_the_gpu_idle_server_and_keeps_the_busy_one(
    chart_release, in_cluster_prometheus, short_timeouts
):
    api = chart_release.cluster.control_plane.admin_api()
    # the hub's settings as the chart rendered them: the culler and the page ask there
    settings = api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/gpuspawner-config")["data"]
    assert '"prometheusUrl": "http://prometheus.monitoring.svc:9090"' in settings["settings.json"]
    browsers = {user: Browser(chart_release.url, user, PASSWORD) for user in (BUSY, IDLE)}
    # The busy user's GPU is busy well within its timeout: started first, burned at once.
    start_server(browsers[BUSY], BUSY)
    busy_pod = wait_ready(chart_release, browsers[BUSY], BUSY)
    burner = burn(busy_pod, 900, 90)
    try:
        start_server(browsers[IDLE], IDLE)
        idle_pod = wait_ready(chart_release, browsers[IDLE], IDLE)
        util = "DCGM_FI_DEV_GPU_UTIL"
        prometheus = in_cluster_prometheus.api
        prometheus.wait_for(
            f'{util}{{namespace="{NAMESPACE}",pod="{busy_pod["metadata"]["name"]}"}} > 50',
            bool,
            timeout=90,
        )
        prometheus.wait_for(
            f'{util}{{namespace="{NAMESPACE}",pod="{idle_pod["metadata"]["name"]}"}} == 0',
            bool,
            timeout=90,
        )

        # The GPU page in the cluster shows both figures, from the same Prometheus.
        admin = chart_release.admin

        def figures():
            r = admin.session.get(f"{admin.base}/services/gpuspawner-admin/", timeout=60)
            assert r.status_code == 200, r.text[:500]
            shown = utilisation_cells(r.text, (BUSY, IDLE))
            return len(shown) == 2 and int(shown[BUSY]) >= 10 and shown

        shown = wait_for(figures, 120, "the GPU page's utilisation figures")
        assert shown[IDLE] == "0", shown

        # The culler, by itself: the idle server goes once its GPU has been idle that long.
        def culled():
            return browsers[IDLE].api("GET", f"/users/{IDLE}").json()["servers"].get("") is None

        wait_for(culled, GPU_TIMEOUT + 180, f"{IDLE}'s GPU-idle server to be culled")
        log = hub_log(api, tail=400)
        # stopped by the culler's token, for its GPU idleness (the notice the user reads)
        assert re.search(rf"DELETE /hub/api/users/{IDLE}/server \(gpuspawner-culler@", log), log
        assert re.search(rf"{IDLE} stopped: .* because its GPUs were idle for ", log), log
        assert f"DELETE /hub/api/users/{BUSY}/server" not in log, log
        server = browsers[BUSY].api("GET", f"/users/{BUSY}").json()["servers"].get("")
        assert server is not None and server["ready"], hub_log(api, tail=400)
        assert burner.poll() is None, burner.stderr.read().decode(errors="replace")
    finally:
        burner.terminate()
        burner.wait(timeout=30)
        for user, browser in browsers.items():
            browser.api("DELETE", f"/users/{user}/server")
