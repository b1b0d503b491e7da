"""zero-to-jupyterhub 4.4.0 installed with the real Helm on real nodes, as an admin does.

The commands are README.md's ("Deploy with zero-to-jupyterhub"): the namespace, the
catalog ConfigMap, the RBAC manifests beside the release, the hub database's volume,
then ``helm install`` of the released chart with config/z2jh-values.yaml, the local
images (config/sandbox/z2jh-local-values.yaml) and the local cluster's overrides
(config/sandbox/z2jh-cluster-values.yaml). kubectl's steps are done through the API
(kubectl is no dependency of the project); Helm's are run as written.

Everything then goes through the chart's proxy-public Service, from the host, as a
browser would: log in, spawn a GPU server, reach the hub's services, restart the hub,
change the catalog. The tests share one release and run in this file's order.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest
import requests
import yaml

from gpuspawner_sandbox import build, controlplane, testing

from .conftest import HUB_DB_DIR

REPO = build.REPO_ROOT
NAMESPACE = "jupyterhub"
RELEASE = "jhub"
VALUES = [
    REPO / "config" / "z2jh-values.yaml",
    REPO / "config" / "sandbox" / "z2jh-local-values.yaml",
    REPO / "config" / "sandbox" / "z2jh-cluster-values.yaml",
]
#: Beside the release: the GPU figures' cluster-wide node read, what kube-scheduler v1.37
#: needs beyond z2jh's user-scheduler role, and the hub database's static volume.
MANIFESTS = [
    REPO / "config" / "z2jh-inventory-rbac.yaml",
    REPO / "config" / "sandbox" / "z2jh-user-scheduler-rbac.yaml",
    REPO / "config" / "sandbox" / "z2jh-hub-db-pv.yaml",
]
#: The catalog names the notebook images' Jupyter stage, which the nodes hold (its comment says
#: why it is not the e2e catalog).
CATALOG = Path(__file__).parent / "catalog.yaml"
#: The admin's opt-in to GPU figures that count every namespace's pods (not applied by README).
ALL_NAMESPACES_OPT_IN = REPO / "config" / "z2jh-rbac-opt-in-all-namespaces.yaml"
CULLER_CONFIG = REPO / "config" / "gpuspawner_culler_config.py"
PASSWORD = yaml.safe_load(VALUES[2].read_text())["hub"]["config"]["DummyAuthenticator"]["password"]
ONE_A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}


def wait_for(check, timeout: float, what: str):
    """The sandbox's poller, once a second (each check asks the hub or the API server)."""
    return testing.wait_for(what, check, timeout=timeout, interval=1)


def helm_args(verb: str, chart) -> list[str]:
    """``helm install`` / ``helm upgrade`` as README.md writes them."""
    return [
        verb,
        RELEASE,
        str(chart),
        f"--namespace={NAMESPACE}",
        *(f"--values={v}" for v in VALUES),
        "--wait",
        "--timeout=15m",
    ]


def catalog_configmap(catalog_text: str) -> dict:
    """kubectl create configmap gpuspawner-catalog --from-file=catalog.yaml=… --from-file=culler_config.py=…"""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpuspawner-catalog", "namespace": NAMESPACE},
        "data": {"catalog.yaml": catalog_text, "culler_config.py": CULLER_CONFIG.read_text()},
    }


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


class Browser:
    """A logged-in session through proxy-public, and the user's API token."""

    def __init__(self, base: str, user: str, password: str):
        self.base = base
        self.session = requests.Session()
        self.session.trust_env = False  # the ClusterIP directly, never an HTTP proxy
        self.session.get(f"{base}/hub/login", timeout=30).raise_for_status()
        self.xsrf = self.session.cookies["_xsrf"]
        r = self.session.post(
            f"{base}/hub/login?next=%2Fhub%2Fhome",
            data={"username": user, "password": password, "_xsrf": self.xsrf},
            timeout=60,
        )
        r.raise_for_status()
        assert r.url.endswith("/hub/home"), (r.url, r.text[:500])
        # A login starts a new session, and the XSRF token belongs to the session.
        self.xsrf = self.session.cookies["_xsrf"]
        r = self.api("POST", f"/users/{user}/tokens", json={"note": "tests/z2jh"})
        assert r.status_code in (200, 201), r.text
        self.token = r.json()["token"]

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        """The hub's REST API with the session's cookie (and the XSRF header it needs)."""
        return self.session.request(
            method,
            f"{self.base}/hub/api{path}",
            headers={"X-XSRFToken": self.xsrf},
            timeout=60,
            **kwargs,
        )

    def with_token(self, method: str, path: str, **kwargs) -> requests.Response:
        """Any path behind proxy-public with the token alone (it outlives the session)."""
        return requests.request(
            method,
            f"{self.base}{path}",
            headers={"Authorization": f"token {self.token}"},
            timeout=60,
            proxies={"http": "", "https": ""},
            **kwargs,
        )


@pytest.fixture(scope="module")
def release(cluster):
    """The chart installed as README.md says; the URL of proxy-public from the host."""
    cp = cluster.control_plane
    api = cp.admin_api()
    # kubectl create namespace jupyterhub
    api.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    cp.wait_for_service_account(NAMESPACE)
    # kubectl -n jupyterhub create configmap gpuspawner-catalog --from-file=…
    api.post(f"/api/v1/namespaces/{NAMESPACE}/configmaps", catalog_configmap(CATALOG.read_text()))
    # install -d -o 1000 -g 1000 /var/lib/gpuspawner-sandbox/hub-db
    HUB_DB_DIR.mkdir(parents=True)
    os.chown(HUB_DB_DIR, 1000, 1000)
    # kubectl apply -f … (server-side apply)
    for manifest in MANIFESTS:
        cp.apply_manifests(manifest)
    # The culler and the GPU page annotate pods (config/z2jh-values.yaml's comment):
    # kubectl -n jupyterhub create role gpuspawner-hub-annotate --verb=patch --resource=pods
    # kubectl -n jupyterhub create rolebinding gpuspawner-hub-annotate …
    controlplane.apply_objects(
        api,
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "gpuspawner-hub-annotate", "namespace": NAMESPACE},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "gpuspawner-hub-annotate", "namespace": NAMESPACE},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "gpuspawner-hub-annotate",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": NAMESPACE}],
            },
        ],
    )
    # helm install jhub <chart> -n jupyterhub -f … --wait
    cluster.helm.run(*helm_args("install", cluster.chart), timeout=1000)
    service = api.get(f"/api/v1/namespaces/{NAMESPACE}/services/proxy-public")
    assert service["spec"]["type"] == "ClusterIP"
    return f"http://{service['spec']['clusterIP']}"


@pytest.fixture(scope="module")
def admin(release):
    return Browser(release, "admin", PASSWORD)


def test_the_release_runs_every_part_on_the_nodes(cluster, release):
    api = cluster.control_plane.admin_api()
    status = cluster.helm.run("status", RELEASE, f"--namespace={NAMESPACE}", "--output=json")
    assert '"status":"deployed"' in status.replace(" ", "")
    for name in ("hub", "proxy", "user-scheduler"):
        d = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}")
        assert d["status"].get("readyReplicas") == d["spec"]["replicas"], (name, d["status"])
    (hub,) = hub_pods(api)
    assert hub["spec"]["nodeName"] == "cpu-0"  # where the database's hostPath volume is
    claim = api.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/hub-db-dir")
    assert claim["spec"]["volumeName"] == "gpuspawner-hub-db"
    assert (HUB_DB_DIR / "jupyterhub.sqlite").is_file()
    # The continuous image puller ran on every node (the images are there: pullPolicy Never).
    puller = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/continuous-image-puller")
    assert puller["status"]["numberReady"] == len(cluster.nodes.names), puller["status"]


def may(api, pod: dict, verb: str, resource: str, namespace: str | None = None) -> bool:
    """The API server's answer (SubjectAccessReview): may this pod's service account do it?"""
    account = pod["spec"]["serviceAccountName"]
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


def test_the_hub_pod_reads_pods_only_in_its_namespace_unless_the_admin_opts_in(cluster, release):
    """A pod list carries every container's environment: the deployed hub (and the gpuspawner
    service in its pod) may read pods of the release's namespace only, until the admin applies
    config/z2jh-rbac-opt-in-all-namespaces.yaml."""
    api = cluster.control_plane.admin_api()
    (hub,) = hub_pods(api)

    def pod_reads(namespace):
        return [may(api, hub, verb, "pods", namespace) for verb in ("list", "watch")]

    elsewhere = ("default", "kube-system", None)  # None: cluster-wide
    assert pod_reads(NAMESPACE) == [True, True]
    for namespace in elsewhere:
        assert pod_reads(namespace) == [False, False], namespace
    assert may(api, hub, "list", "nodes") and may(api, hub, "watch", "nodes")

    cp = cluster.control_plane
    cp.apply_manifests(ALL_NAMESPACES_OPT_IN)
    opt_in = [d for d in yaml.safe_load_all(ALL_NAMESPACES_OPT_IN.read_text()) if d]
    try:
        for namespace in elsewhere:
            wait_for(
                lambda n=namespace: pod_reads(n) == [True, True],
                30,
                f"the opt-in to let the hub read pods in {namespace or 'every namespace'}",
            )
    finally:
        # kubectl delete -f …, the binding first
        for doc in sorted(opt_in, key=lambda d: d["kind"] != "ClusterRoleBinding"):
            plural = doc["kind"].lower() + "s"
            api.delete(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{doc['metadata']['name']}")
    for namespace in elsewhere:
        wait_for(
            lambda n=namespace: pod_reads(n) == [False, False],
            30,
            f"the hub's read in {namespace or 'every namespace'} to be taken back",
        )


def test_an_admin_logs_in_and_the_spawn_form_offers_the_catalog(admin):
    r = admin.session.get(f"{admin.base}/hub/spawn", timeout=60)
    assert r.status_code == 200, r.text[:500]
    assert "PyTorch" in r.text
    assert "NVIDIA A100" in r.text
    # 'licensed' is offered to its group only
    assert "PyTorch (licensed)" not in r.text


def test_a_one_gpu_a100_server_starts_checked_on_the_gpu_node(cluster, admin):
    r = admin.api("POST", "/users/admin/server", json=ONE_A100)
    assert r.status_code in (201, 202), r.text

    api = cluster.control_plane.admin_api()

    def started():
        server = admin.api("GET", "/users/admin").json()["servers"].get("")
        assert server is not None, f"the server stopped while starting:\n{hub_log(api)}"
        return server["ready"]

    wait_for(started, 600, "admin's server to be ready")
    pod = user_pod(cluster.control_plane.admin_api(), "admin")
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


def test_the_culler_and_the_gpu_page_run_as_the_charts_hub_services(cluster, admin):
    api = cluster.control_plane.admin_api()

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


def test_a_new_hub_pod_knows_the_running_server_and_the_limits_hold(cluster, admin):
    api = cluster.control_plane.admin_api()
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


def test_helm_upgrade_with_a_changed_catalog_needs_no_hub_restart(cluster, admin):
    api = cluster.control_plane.admin_api()
    # z2jh's first upgrade after the install rolls the hub once: at install its
    # generated secrets (cookie secret, tokens) are not in the cluster yet, so the hub
    # pod's checksum/secret was taken of another random rendering than the Secret
    # holds; from then on Helm's lookup reads them back and the checksum is stable.
    cluster.helm.run(*helm_args("upgrade", cluster.chart), timeout=1000)
    (before,) = hub_pods(api)
    hub_deployment = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hub"
    template_before = api.get(hub_deployment)["spec"]["template"]["metadata"]
    catalog = yaml.safe_load(CATALOG.read_text())
    catalog["images"]["tensorflow"] = {
        "display_name": "TensorFlow (from the upgrade)",
        "image": "registry.example.org/gpuspawner/cuda-tensorflow:2.21.0-cuda12.9-py3.13-jupyter",
        "cuda": "12.9",
    }
    # kubectl create configmap … --dry-run=client -o yaml | kubectl apply -f -
    controlplane.apply_objects(api, [catalog_configmap(yaml.safe_dump(catalog))])
    cluster.helm.run(*helm_args("upgrade", cluster.chart), timeout=1000)

    def offered():
        # a named server's form: the default server runs (its /hub/spawn goes to it)
        r = admin.session.get(f"{admin.base}/hub/spawn/admin/form", timeout=60)
        return r.status_code == 200 and "TensorFlow (from the upgrade)" in r.text

    # The kubelet updates the ConfigMap's files within its sync period (10 s on this
    # test's nodes, tests/z2jh/topology.yaml); the hub re-reads.
    wait_for(offered, 240, "the spawn form to offer the new image")
    (after,) = hub_pods(api)
    template_after = api.get(hub_deployment)["spec"]["template"]["metadata"]
    # the hub's pod template (its config checksums) is unchanged, so the pod is the same
    assert template_after == template_before
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert not any(s.get("restartCount") for s in after["status"].get("containerStatuses") or [])
    revision = re.search(
        r'"version":\s*(\d+)',
        cluster.helm.run("status", RELEASE, f"--namespace={NAMESPACE}", "--output=json"),
    )
    assert revision and revision[1] == "3"
