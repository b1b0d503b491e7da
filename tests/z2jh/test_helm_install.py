"""gpuspawner's chart installed with the real Helm on real nodes, as an admin does.

One ``helm install`` of chart/gpuspawner (its jupyterhub 4.4.0 dependency packaged
offline) with config/chart-values.yaml, the documented example, and the local
cluster's overrides (config/sandbox/chart-local-values.yaml): no kubectl step
(:func:`tests.z2jh.conftest.chart_release`; the cluster provides the hub database's
volume before it, as a provisioner would).

Everything then goes through the chart's proxy-public Service, from the host, as a
browser would: log in, spawn a GPU server, reach the hub's services, restart the hub,
run ``helm test``, change the catalog with ``helm upgrade``. The tests share one
release and run in this file's order.
"""

from __future__ import annotations

import base64
import json
import re

import pytest
import requests
import yaml

from gpuspawner_sandbox import testing

from .conftest import HUB_DB_DIR, NAMESPACE, RELEASE, Browser, ChartRelease

ONE_A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}


def wait_for(check, timeout: float, what: str):
    """The sandbox's poller, once a second (each check asks the hub or the API server)."""
    return testing.wait_for(what, check, timeout=timeout, interval=1)


def hub_pods(api) -> list[dict]:
    pods = api.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods", query={"labelSelector": "component=hub"}
    )["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def hub_log(api, tail: int = 60) -> str:
    """The hub container's last lines (the API server asks the node's kubelet), for failures."""
    pods = hub_pods(api)
    if not pods:
        return "(no hub pod)"
    name = pods[0]["metadata"]["name"]
    r = api.request(
        "GET",
        f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log",
        query={"container": "hub", "tailLines": str(tail)},
        raw=True,
    )
    return r.body


def proxy_routes(api) -> str:
    """The proxy's routing table (its API, with the token in the hub Secret), for failures."""
    secret = api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/hub")["data"]
    token = base64.b64decode(secret["hub.config.ConfigurableHTTPProxy.auth_token"]).decode()
    service = api.get(f"/api/v1/namespaces/{NAMESPACE}/services/proxy-api")["spec"]
    r = requests.get(
        f"http://{service['clusterIP']}:{service['ports'][0]['port']}/api/routes",
        headers={"Authorization": f"token {token}"},
        proxies={"http": "", "https": ""},
        timeout=30,
    )
    return r.text


def diagnosis(api) -> str:
    return f"proxy routes: {proxy_routes(api)}\nhub log:\n{hub_log(api)}"


def ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def user_pod(api, user: str, server: str = "") -> dict | None:
    pods = api.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        query={"labelSelector": f"hub.jupyter.org/username={user}"},
    )["items"]
    for pod in pods:
        if pod["metadata"]["labels"].get("hub.jupyter.org/servername", "") == server:
            return pod
    return None


def spawn_failure(admin: Browser, server: str) -> str:
    """The failure message of a named server's spawn, from its progress event stream."""
    r = admin.with_token("GET", f"/hub/api/users/admin/servers/{server}/progress", stream=True)
    assert r.status_code == 200, r.text
    for line in r.iter_lines(decode_unicode=True):
        if line and line.startswith("data:"):
            event = json.loads(line[len("data:") :])
            if event.get("failed"):
                return event["message"]
            assert not event.get("ready"), f"the server started: {event}"
    raise AssertionError("the progress stream ended without the spawn's outcome")


@pytest.fixture(scope="module")
def admin(chart_release: ChartRelease) -> Browser:
    return chart_release.admin


def helm_revision(release: ChartRelease) -> int:
    status = release.cluster.helm.run(
        "status", release.release, f"--namespace={release.namespace}", "--output=json"
    )
    return json.loads(status)["version"]


def test_the_release_runs_every_part_on_the_nodes(chart_release):
    cluster = chart_release.cluster
    api = cluster.control_plane.admin_api()
    status = cluster.helm.run("status", RELEASE, f"--namespace={NAMESPACE}", "--output=json")
    assert json.loads(status)["info"]["status"] == "deployed"
    for name in ("hub", "proxy", "user-scheduler"):
        d = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}")
        assert d["status"].get("readyReplicas") == d["spec"]["replicas"], (name, d["status"])
    (hub,) = hub_pods(api)
    assert hub["spec"]["nodeName"] == "cpu-0"  # where the database's hostPath volume is
    claim = api.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/hub-db-dir")
    assert claim["spec"]["volumeName"] == "gpuspawner-hub-db"
    assert (HUB_DB_DIR / "jupyterhub.sqlite").is_file()
    # z2jh's continuous puller (singleuser.image) and the chart's own, of the catalog's
    # images, ran on every node (the images are there: pullPolicy Never)
    for name in ("continuous-image-puller", f"{RELEASE}-gpuspawner-image-puller"):
        puller = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{name}")
        assert puller["status"]["numberReady"] == len(cluster.nodes.names), (name, puller)
    catalog = yaml.safe_load(
        api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/gpuspawner-catalog")["data"][
            "catalog.yaml"
        ]
    )
    pulled = {
        c["image"]
        for c in api.get(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}-gpuspawner-image-puller"
        )["spec"]["template"]["spec"]["initContainers"]
    }
    assert pulled == {image["image"] for image in catalog["images"].values()}


def may(api, account: str, verb: str, resource: str, namespace: str | None = None) -> bool:
    """The API server's answer (SubjectAccessReview): may this service account do it?"""
    attributes = {"verb": verb, "resource": resource, "group": ""}
    if namespace:
        attributes["namespace"] = namespace
    review = api.post(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{NAMESPACE}:{account}",
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{NAMESPACE}",
                    "system:authenticated",
                ],
                "resourceAttributes": attributes,
            },
        },
    )
    return review["status"]["allowed"]


def test_the_hubs_rights_are_the_charts_and_the_all_namespaces_read_is_opt_in(chart_release):
    """The deployed hub (and the services in its pod) reads nodes, and pods of its namespace
    only, and annotates pods there: a pod list carries every container's environment, so
    pods elsewhere are read only once the admin turns gpuspawner.inventory.allNamespaces on,
    and no longer once it is off again."""
    cluster = chart_release.cluster
    api = cluster.control_plane.admin_api()
    (hub,) = hub_pods(api)
    account = hub["spec"]["serviceAccountName"]
    assert account == "hub"

    def pod_reads(namespace):
        return [may(api, account, verb, "pods", namespace) for verb in ("list", "watch")]

    elsewhere = ("default", "kube-system", None)  # None: cluster-wide
    assert pod_reads(NAMESPACE) == [True, True]
    assert may(api, account, "patch", "pods", NAMESPACE)
    for namespace in elsewhere:
        assert pod_reads(namespace) == [False, False], namespace
        assert not may(api, account, "patch", "pods", namespace), namespace
    assert may(api, account, "list", "nodes") and may(api, account, "watch", "nodes")
    assert not may(api, account, "patch", "nodes") and not may(api, account, "get", "secrets")

    opt_in = chart_release.cluster.state_dir / "all-namespaces.yaml"
    opt_in.write_text("gpuspawner:\n  inventory:\n    allNamespaces: true\n")
    cluster.helm.run(*chart_release.helm_args("upgrade", opt_in), timeout=1000)
    # (the API server's authorizer sees a new binding within moments)
    for namespace in elsewhere:
        wait_for(
            lambda n=namespace: pod_reads(n) == [True, True],
            30,
            f"the opt-in to let the hub read pods in {namespace or 'every namespace'}",
        )
    # helm upgrade without it takes the grant away
    cluster.helm.run(*chart_release.helm_args("upgrade"), timeout=1000)
    for namespace in elsewhere:
        wait_for(
            lambda n=namespace: pod_reads(n) == [False, False],
            30,
            f"the hub's read in {namespace or 'every namespace'} to be taken back",
        )


def test_an_admin_logs_in_and_the_spawn_form_offers_the_catalog(admin):
    r = admin.session.get(f"{admin.base}/hub/spawn", timeout=60)
    assert r.status_code == 200, r.text[:500]
    for offered in ("PyTorch", "TensorFlow", "NVIDIA A100"):
        assert offered in r.text, offered


def test_a_one_gpu_a100_server_starts_checked_on_the_gpu_node(chart_release, admin):
    cluster = chart_release.cluster
    r = admin.api("POST", "/users/admin/server", json=ONE_A100)
    assert r.status_code in (201, 202), r.text

    api = cluster.control_plane.admin_api()

    def started():
        server = admin.api("GET", "/users/admin").json()["servers"].get("")
        assert server is not None, f"the server stopped while starting:\n{hub_log(api)}"
        return server["ready"]

    wait_for(started, 600, "admin's server to be ready")
    pod = user_pod(api, "admin")
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-a100-0"
    # placed by the chart's user scheduler (the local control plane's kube-scheduler image)
    assert spec["schedulerName"] == f"{RELEASE}-user-scheduler"
    notebook = spec["containers"][0]
    assert notebook["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert notebook["image"].endswith("-jupyter")
    # z2jh's block-cloud-metadata first, then GPUSpawner's nvidia-smi check: both ran.
    assert [c["name"] for c in spec["initContainers"]] == ["block-cloud-metadata", "gpu-check"]
    for status in pod["status"]["initContainerStatuses"]:
        assert status["state"]["terminated"]["exitCode"] == 0, status
    # the server answers through proxy-public
    r = admin.with_token("GET", "/user/admin/api/status")
    assert r.status_code == 200, r.text[:500]
    assert "started" in r.json()


def test_the_culler_and_the_gpu_page_run_as_the_charts_hub_services(chart_release, admin):
    api = chart_release.cluster.control_plane.admin_api()

    def routed(response):
        # The hub pod is Ready once the hub answers; it then starts its managed
        # services one after another and routes each once it answers, so for the
        # first seconds a service's path is the hub's 404. (In a tuple: a requests
        # Response is false for any 4xx or 5xx, which must end the wait too.)
        return (response,) if response.status_code != 404 else None

    # The culler answers a user about their own servers (JupyterLab's cull warning).
    (r,) = wait_for(
        lambda: routed(admin.with_token("GET", "/services/gpuspawner-culler/api/warning")),
        90,
        "the hub to route its culler service",
    )
    assert r.status_code == 200, f"{r.status_code} {r.url}\n{diagnosis(api)}"
    # The GPU page, through the hub's OAuth as a browser follows it.
    r = admin.session.get(f"{admin.base}/services/gpuspawner-admin/", timeout=60)
    assert r.status_code == 200, f"{r.status_code} {r.url}\n{diagnosis(api)}"
    assert "<h1>GPU pool</h1>" in r.text
    assert "gpu-a100-0" in r.text


def test_helm_test_passes(chart_release):
    """The chart's own test pods: the hub's API, the culler, the GPU page, the user service."""
    out = chart_release.cluster.helm.run(
        "test", RELEASE, f"--namespace={NAMESPACE}", "--timeout=5m", timeout=400
    )
    suites = {block.split()[0]: block for block in out.split("TEST SUITE:")[1:] if block.strip()}
    assert sorted(suites) == [
        f"{RELEASE}-gpuspawner-test-{part}"
        for part in ("admin-page", "culler", "hub-api", "user-service")
    ], out
    for name, block in suites.items():
        assert re.search(r"^Phase:\s+Succeeded$", block, re.M), (name, out)


def test_a_new_hub_pod_knows_the_running_server_and_the_limits_hold(chart_release, admin):
    api = chart_release.cluster.control_plane.admin_api()
    (old,) = hub_pods(api)
    api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{old['metadata']['name']}")

    def new_hub_ready():
        pods = [p for p in hub_pods(api) if p["metadata"]["uid"] != old["metadata"]["uid"]]
        return pods and ready(pods[0]) and pods[0]

    new = wait_for(new_hub_ready, 300, "a new hub pod to be ready")
    assert new["metadata"]["name"] != old["metadata"]["name"]
    # Its database is the old one's: the token still works and the server is known.
    r = wait_for(
        lambda: (r := admin.with_token("GET", "/hub/api/users/admin")).status_code == 200 and r,
        120,
        "the new hub to answer",
    )
    server = r.json()["servers"][""]
    assert server["ready"], server
    assert user_pod(api, "admin") is not None
    # Default limit 2 GPUs, one in use: two more are refused. z2jh sets the hub's
    # slow_spawn_timeout to 0, so the request is accepted (202) and the refusal is the
    # spawn's failure, as its progress page shows it.
    r = admin.with_token(
        "POST", "/hub/api/users/admin/servers/more", json={**ONE_A100, "gpus": "2"}
    )
    assert r.status_code == 202, r.text
    failure = spawn_failure(admin, "more")
    assert "You are using 1 of your 2 GPUs (servers: " in failure, failure
    assert user_pod(api, "admin", "more") is None
    r = admin.with_token("GET", "/user/admin/api/status")
    assert r.status_code == 200, r.text[:500]


def test_helm_upgrade_with_a_changed_catalog_needs_no_hub_restart(chart_release, admin):
    """The catalog in the values, changed by ``helm upgrade``: the ConfigMap changes, the
    kubelet updates the mounted file, the hub re-reads it; the hub pod stays as it is."""
    cluster = chart_release.cluster
    api = cluster.control_plane.admin_api()
    (before,) = hub_pods(api)
    hub_deployment = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hub"
    template_before = api.get(hub_deployment)["spec"]["template"]["metadata"]
    revision = helm_revision(chart_release)
    changed = cluster.state_dir / "changed-catalog.yaml"
    changed.write_text(
        yaml.safe_dump(
            {
                "gpuspawner": {
                    "catalog": {
                        "images": {"tensorflow": {"display_name": "TensorFlow (from the upgrade)"}}
                    }
                }
            }
        )
    )
    cluster.helm.run(*chart_release.helm_args("upgrade", changed), timeout=1000)

    def offered():
        # a named server's form: the default server runs (its /hub/spawn goes to it)
        r = admin.session.get(f"{admin.base}/hub/spawn/admin/form", timeout=60)
        return r.status_code == 200 and "TensorFlow (from the upgrade)" in r.text

    # The kubelet updates the ConfigMap's files within its sync period (10 s on this
    # test's nodes, tests/z2jh/topology.yaml); the hub re-reads.
    wait_for(offered, 240, "the spawn form to offer the changed image")
    (after,) = hub_pods(api)
    template_after = api.get(hub_deployment)["spec"]["template"]["metadata"]
    # the hub's pod template (its config checksums) is unchanged, so the pod is the same
    assert template_after == template_before
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert not any(s.get("restartCount") for s in after["status"].get("containerStatuses") or [])
    assert helm_revision(chart_release) == revision + 1
