"""The local cluster the zero-to-jupyterhub chart is installed on, with the real Helm.

Started once for the package (tests/z2jh): the control plane with the API server on
the pods' side (the ``kubernetes`` Service's endpoint), and real nodes with the
cluster network (kube-proxy, CoreDNS) holding every image the chart runs: the hub
image and z2jh's images (:func:`gpuspawner_sandbox.chartimages.ensure_deploy_images`)
and the notebook images' Jupyter stage. Nothing of the hub runs on the host: the
tests deploy it as an admin does (test_helm_install.py).

Where real nodes cannot run (no Go, no runc, not root) or the chart is missing,
these tests skip loudly, and fail in CI. The host is compared with its state before
the nodes started when they stop.

The local cluster also provides what a real cluster's operator would before any release:
the hub database's static volume (it has no storage provisioner) and what its
kube-scheduler v1.37 needs beyond z2jh's user-scheduler role. On it,
:func:`chart_release` installs gpuspawner's chart once for the package, with one
``helm install`` of config/chart-values.yaml and the local overrides.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from gpuspawner_sandbox import build, chartimages, helm, hoststate, nodeconfig, testing
from gpuspawner_sandbox.controlplane import ControlPlane
from gpuspawner_sandbox.nodes import RealNodes
from gpuspawner_sandbox.notebookimage import ensure_notebook_images
from gpuspawner_sandbox.topology import load_topology

TOPOLOGY = Path(__file__).parent / "topology.yaml"
IMAGE_CACHE = build.image_cache_dir()
#: config/sandbox/z2jh-hub-db-pv.yaml's directory, which an admin makes before installing.
HUB_DB_DIR = Path("/var/lib/gpuspawner-sandbox/hub-db")
#: What the local cluster provides before any release: the hub database's static volume, and
#: what kube-scheduler v1.37 (the chart's user scheduler here) needs beyond z2jh's role.
CLUSTER_MANIFESTS = [
    build.REPO_ROOT / "config" / "sandbox" / "z2jh-user-scheduler-rbac.yaml",
    build.REPO_ROOT / "config" / "sandbox" / "z2jh-hub-db-pv.yaml",
]
#: gpuspawner's chart as an admin installs it: the documented example values, then the
#: local cluster's overrides (local images, ClusterIP proxy, the hub database's volume).
CHART_VALUES = [
    build.REPO_ROOT / "config" / "chart-values.yaml",
    build.REPO_ROOT / "config" / "sandbox" / "chart-local-values.yaml",
]
NAMESPACE = "jupyterhub"
RELEASE = "jhub"
PASSWORD = yaml.safe_load(CHART_VALUES[1].read_text())["jupyterhub"]["hub"]["config"][
    "DummyAuthenticator"
]["password"]


def emit(line: str) -> None:
    """Progress of the cluster's start, past pytest's capture."""
    sys.__stderr__.write(line + "\n")


@dataclass
class Cluster:
    control_plane: ControlPlane
    nodes: RealNodes
    helm: helm.Helm
    #: the chart as released (version and image tags 4.4.0, values.schema.json)
    chart: Path
    state_dir: Path


@pytest.fixture(scope="package")
def cluster(tmp_path_factory, pytestconfig):
    binaries = testing.node_binaries(pytestconfig)  # skip (fail in CI) where nodes cannot run
    if not (helm.Z2JH_CHART / "Chart.yaml").is_file():
        testing.third_party_missing(
            f"THE ZERO-TO-JUPYTERHUB 4.4.0 CHART IS MISSING at {helm.Z2JH_CHART} "
            "(a copy of shared/ beside the clone), so the Helm install test does not run"
        )
    state_dir = tmp_path_factory.mktemp("z2jh")
    with testing.capture_disabled(pytestconfig):
        helm_binary = helm.build_helm(out=sys.stderr)
        notebook = ensure_notebook_images(IMAGE_CACHE, build.REPO_ROOT, emit)
        deploy = chartimages.ensure_deploy_images(
            IMAGE_CACHE, build.REPO_ROOT, emit, build_out=sys.stderr
        )
    chart = helm.release_chart(helm.Z2JH_CHART, state_dir / "chart" / "jupyterhub")
    topology = load_topology(TOPOLOGY)
    names = [n.name for n in topology.nodes]
    roots = [nodeconfig.cgroup_root(n) for n in names]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    cp = ControlPlane(state_dir, binaries.k8s, api_address=nodeconfig.API_ADDRESS)
    nodes = RealNodes(
        state_dir,
        cp,
        binaries,
        names,
        specs={n.name: n for n in topology.nodes},
        images=[notebook.archive, deploy.archive],
        cluster_network=True,
        machine_wait=testing.MACHINE_WAIT,
        emit=emit,
    )
    # A stale database of an earlier run would be this release's: start from none.
    shutil.rmtree(HUB_DB_DIR, ignore_errors=True)
    try:
        with testing.capture_disabled(pytestconfig):
            nodes.prepare()  # the host's link first: the API server listens on it
            cp.start()
            emit(f"Starting real nodes: {', '.join(names)}…")
            nodes.start()
        # install -d -o 1000 -g 1000 /var/lib/gpuspawner-sandbox/hub-db; kubectl apply -f …
        HUB_DB_DIR.mkdir(parents=True)
        os.chown(HUB_DB_DIR, 1000, 1000)
        for manifest in CLUSTER_MANIFESTS:
            cp.apply_manifests(manifest)
        yield Cluster(
            cp,
            nodes,
            helm.Helm(helm_binary, state_dir / "helm-home", cp.admin_kubeconfig),
            chart,
            state_dir,
        )
    finally:
        nodes.stop()
        cp.stop()
        shutil.rmtree(HUB_DB_DIR, ignore_errors=True)
        with contextlib.suppress(OSError):
            HUB_DB_DIR.parent.rmdir()  # only if nothing else is there
    assert hoststate.differences(before, hoststate.snapshot(state_dir / "nodes", roots)) == []


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


def proxy_public(api, namespace: str) -> str:
    """proxy-public's URL from the host (a ClusterIP: the host routes the Service range)."""
    service = api.get(f"/api/v1/namespaces/{namespace}/services/proxy-public")
    assert service["spec"]["type"] == "ClusterIP"
    return f"http://{service['spec']['clusterIP']}"


def chart_copy(cluster: Cluster, name: str) -> Path:
    """chart/gpuspawner with its jupyterhub dependency packaged offline, in this run's state.

    A copy, so that the repository's charts/ (other runs', `make chart`'s) is never written.
    """
    chart = cluster.state_dir / name / "gpuspawner"
    shutil.rmtree(chart.parent, ignore_errors=True)
    shutil.copytree(helm.GPUSPAWNER_CHART, chart, ignore=shutil.ignore_patterns("charts"))
    helm.package_dependency(cluster.helm, chart, cluster.state_dir / name / "z2jh")
    return chart


@dataclass
class ChartRelease:
    cluster: Cluster
    #: the chart as installed (chart/gpuspawner with its dependency packaged)
    chart: Path
    namespace: str
    release: str
    values: list[Path]
    #: proxy-public's URL from the host
    url: str
    #: the admin (a member of gpu-admins), logged in through proxy-public
    admin: Browser

    def helm_args(self, verb: str, *more_values: Path) -> list[str]:
        """``helm install`` / ``helm upgrade`` as docs/install-chart.md writes them."""
        return [
            verb,
            self.release,
            str(self.chart),
            f"--namespace={self.namespace}",
            *(["--create-namespace"] if verb == "install" else []),
            *(f"--values={v}" for v in (*self.values, *more_values)),
            "--wait",
            "--timeout=15m",
        ]


@pytest.fixture(scope="package")
def chart_release(cluster) -> ChartRelease:
    """gpuspawner's chart installed once for the package: one ``helm install``, nothing else.

    (Package scope, as the cluster's: tests/z2jh is one package, so every module in it
    shares this one release.)
    """
    chart = chart_copy(cluster, "gpuspawner-chart")
    release = ChartRelease(
        cluster,
        chart,
        NAMESPACE,
        RELEASE,
        CHART_VALUES,
        url="",
        admin=None,  # type: ignore[arg-type]
    )
    # helm install jhub chart/gpuspawner -n jupyterhub --create-namespace -f … -f … --wait
    cluster.helm.run(*release.helm_args("install"), timeout=1000)
    release.url = proxy_public(cluster.control_plane.admin_api(), NAMESPACE)
    release.admin = Browser(release.url, "admin", PASSWORD)
    return release
