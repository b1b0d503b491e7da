"""GPU metrics inside the local cluster, as kube-prometheus-stack gives a real one.

On a real cluster NVIDIA's dcgm-exporter is a DaemonSet behind a Service, and the
Prometheus of kube-prometheus-stack finds it through a ServiceMonitor (Kubernetes
service discovery of the Service's endpoints) and is itself a Service pods reach,
e.g. ``http://prometheus-operated.monitoring.svc:9090``. A Helm-installed hub's
culler and GPU page (pods) read it there.

Here, in namespace ``monitoring`` (:func:`manifests`):

- Service ``dcgm-exporter`` (headless, port ``metrics``, no selector) with one
  EndpointSlice per GPU node pointing at that node's emulated exporter. The exporter
  stays where the node runs it (:mod:`.nodes`: a host process beside the kubelet, in
  the node's mount namespace, listening on the node IP only, reading the kubelet's
  PodResources socket), because that is how it reaches the node's driver state and
  kubelet; a node IP is in the pod range, so pods reach it on the one route they
  have. The Service and its EndpointSlices are what a real cluster's dcgm-exporter
  DaemonSet gives: one endpoint per GPU node, found by the Service's name.
- Deployment + Service ``prometheus`` (ClusterIP, port 9090): Debian's ``prometheus``
  package in an image (:func:`build_image`). It finds the exporters through the
  cluster DNS: the SRV records CoreDNS serves for the headless Service's endpoints
  (``dns_sd_configs``), one target per GPU node. kube-prometheus-stack discovers
  them through the API server instead (a ServiceMonitor, ``kubernetes_sd_configs``),
  but Debian builds Prometheus without Kubernetes service discovery; the targets
  and their labels are the same, and Prometheus needs no Kubernetes rights at all
  (no ServiceAccount token is mounted).

Everything listens inside the cluster's own network namespaces (the pod's, the
nodes' bridges): nothing on a host address outside the pod range.

The image is one layer of the host's Debian package files (``prometheus``,
``promtool`` and the C library they link), packed by :mod:`.ociimage` like the
nodes' pause and tool images, deterministic for one package version, and imported
into the running nodes' containerd (:func:`load_image`). No registry, no Docker.

:func:`manifests`, :func:`prometheus_config`, :func:`image_spec`'s file choice
(:func:`ldd_paths`) are pure; :func:`deploy_in_cluster_prometheus` is the thin I/O.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import build, nodeconfig, ociimage
from .clusterdns import CLUSTER_DOMAIN
from .kubeapi import ApiError, KubeApi
from .nodebuild import go_arch
from .prometheus import (
    DCGM_JOB,
    INSTALL_HINT,
    PrometheusApi,
    PrometheusMissing,
    dcgm_scrape_config,
    prometheus_binary,
    server_args,
)
from .testing import wait_for

if TYPE_CHECKING:
    from .nodes import RealNodes

NAMESPACE = "monitoring"
PROMETHEUS = "prometheus"
PORT = 9090
#: The exporter's Service and its port (dcgm-exporter's own default, 9400).
EXPORTER_SERVICE = "dcgm-exporter"
EXPORTER_PORT = 9400
EXPORTER_PORT_NAME = "metrics"
#: What pods (the chart's culler and GPU page) use: the Service's cluster DNS name.
URL = f"http://{PROMETHEUS}.{NAMESPACE}.svc:{PORT}"
#: Who made our EndpointSlices (the EndpointSlice controller leaves them alone).
MANAGED_BY = "gpuspawner-sandbox"
CONFIG_DIR = "/etc/prometheus"
DATA_DIR = "/prometheus"
#: nobody, as kube-prometheus-stack runs Prometheus (not root).
RUN_AS = 65534

Emit = Callable[[str], None]


class ClusterPrometheusError(Exception):
    """The in-cluster Prometheus could not be deployed; the message says why."""


# -- pure ---------------------------------------------------------------------------


def exporter_srv_name(domain: str = CLUSTER_DOMAIN) -> str:
    """The SRV name CoreDNS answers with one record per exporter endpoint (node IP, port)."""
    return f"_{EXPORTER_PORT_NAME}._tcp.{EXPORTER_SERVICE}.{NAMESPACE}.svc.{domain}"


def prometheus_config(scrape_interval: str = "2s") -> dict[str, Any]:
    """prometheus.yml in the cluster: the host's DCGM job, its targets the exporters'
    Service's endpoints, found in the cluster DNS."""
    return dcgm_scrape_config(
        dns_sd={"names": [exporter_srv_name()], "type": "SRV", "refresh_interval": "5s"},
        scrape_interval=scrape_interval,
    )


def image_tag(version_text: str) -> str:
    """The image's tag from ``prometheus --version``: the Debian package's revision,
    e.g. ``2.42.0_ds-5_deb12u1`` (a tag has no ``+``)."""
    match = re.search(r"revision: ([^)\s]+)", version_text) or re.search(
        r"version (\S+)", version_text
    )
    if not match:
        raise ClusterPrometheusError(
            f"`prometheus --version` said nothing like a version: {version_text[:200]!r}"
        )
    return re.sub(r"[^\w.-]", "_", match.group(1))[:128]


def image_ref(tag: str) -> str:
    return f"{nodeconfig.IMAGE_REGISTRY}/{PROMETHEUS}:{tag}"


def ldd_paths(ldd_output: str) -> list[str]:
    """The absolute paths of the shared objects ``ldd`` lists (the vDSO has none)."""
    paths = []
    for line in ldd_output.splitlines():
        words = line.split()
        found = words[2] if len(words) > 2 and words[1] == "=>" else words[0] if words else ""
        if found.startswith("/"):
            paths.append(found)
    return sorted(set(paths))


def image_files(
    programs: Mapping[str, bytes], libraries: Mapping[str, bytes]
) -> dict[str, tuple[bytes, int]]:
    """The image's files: the programs under /bin, the libraries where the loader looks."""
    files = {f"bin/{name}": (data, 0o755) for name, data in programs.items()}
    files |= {path.lstrip("/"): (data, 0o755) for path, data in libraries.items()}
    return files


def exporter_endpoints(nodes: Mapping[str, str]) -> list[tuple[str, str, int]]:
    """``(node, ip, port)`` of each GPU node's exporter, from ``node -> "IP:PORT"``."""
    out = []
    for node, address in sorted(nodes.items()):
        ip, port = address.rsplit(":", 1)
        out.append((node, ip, int(port)))
    return out


def manifests(
    image: str, exporters: Mapping[str, str], scrape_interval: str = "2s"
) -> list[dict[str, Any]]:
    """Everything in namespace ``monitoring``, in the order to create it.

    ``exporters``: ``node -> "IP:PORT"`` of every GPU node's DCGM exporter.
    """
    labels = {"app.kubernetes.io/name": PROMETHEUS, "app.kubernetes.io/part-of": MANAGED_BY}
    meta = {"namespace": NAMESPACE}
    out: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": PROMETHEUS, **meta},
            # JSON is YAML
            "data": {"prometheus.yml": json.dumps(prometheus_config(scrape_interval), indent=1)},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": EXPORTER_SERVICE, **meta, "labels": {"app": EXPORTER_SERVICE}},
            # No selector: the endpoints are the nodes' exporters, listed below. Headless:
            # the cluster DNS names each endpoint (SRV), which Prometheus scrapes one by one.
            "spec": {
                "clusterIP": "None",
                "ports": [{"name": EXPORTER_PORT_NAME, "port": EXPORTER_PORT, "protocol": "TCP"}],
            },
        },
    ]
    for node, ip, port in exporter_endpoints(exporters):
        out.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{EXPORTER_SERVICE}-{node}",
                    **meta,
                    "labels": {
                        "kubernetes.io/service-name": EXPORTER_SERVICE,
                        "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                    },
                },
                "addressType": "IPv4",
                "ports": [{"name": EXPORTER_PORT_NAME, "port": port, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "nodeName": node, "conditions": {"ready": True}}],
            }
        )
    out += [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": PROMETHEUS, **meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        # It reads nothing from the API server.
                        "automountServiceAccountToken": False,
                        "terminationGracePeriodSeconds": 5,
                        "securityContext": {
                            "runAsUser": RUN_AS,
                            "runAsGroup": RUN_AS,
                            "fsGroup": RUN_AS,
                            "runAsNonRoot": True,
                        },
                        "containers": [
                            {
                                "name": PROMETHEUS,
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": server_args(
                                    f"{CONFIG_DIR}/prometheus.yml", DATA_DIR, f":{PORT}"
                                ),
                                "ports": [{"name": "http", "containerPort": PORT}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/-/ready", "port": PORT},
                                    "periodSeconds": 2,
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [
                                    {"name": "config", "mountPath": CONFIG_DIR},
                                    {"name": "data", "mountPath": DATA_DIR},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "config", "configMap": {"name": PROMETHEUS}},
                            {"name": "data", "emptyDir": {}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": PROMETHEUS, **meta, "labels": labels},
            "spec": {
                "type": "ClusterIP",
                "selector": labels,
                "ports": [{"name": "http", "port": PORT, "targetPort": PORT, "protocol": "TCP"}],
            },
        },
    ]
    return out


def api_path(manifest: Mapping[str, Any]) -> str:
    """The collection a manifest is created in (POST)."""
    group, _, version = manifest["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    plural = {"EndpointSlice": "endpointslices"}.get(
        manifest["kind"], manifest["kind"].lower() + "s"
    )
    if manifest["kind"] == "Namespace":
        return f"{base}/{plural}"
    return f"{base}/namespaces/{manifest['metadata']['namespace']}/{plural}"


# -- I/O ----------------------------------------------------------------------------


@dataclass(frozen=True)
class InClusterPrometheus:
    """The deployed Prometheus: the URL pods use, and its pod's API for the host."""

    #: ``http://prometheus.monitoring.svc:9090``: for the chart's culler and GPU page.
    url: str
    #: The pod's own address (in the pod range, which the host routes to our bridges).
    api: PrometheusApi


def build_image(cache_dir: Path | None = None, binary: str | None = None) -> tuple[Path, str]:
    """The image archive (OCI layout) of the host's Debian ``prometheus`` package, and its
    reference; made once per package version (the file name holds the image ID)."""
    binary = binary or prometheus_binary()
    if binary is None:
        raise PrometheusMissing(f"the prometheus binary is not installed: run {INSTALL_HINT}")
    programs = {"prometheus": Path(binary), "promtool": Path(binary).with_name("promtool")}
    if not programs["promtool"].is_file():
        raise PrometheusMissing(f"promtool is missing beside {binary}: run {INSTALL_HINT}")
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    ref = image_ref(image_tag(version.stdout + version.stderr))
    libraries: dict[str, bytes] = {}
    for path in programs.values():
        ldd = subprocess.run(
            ["ldd", str(path)], capture_output=True, text=True, timeout=30, check=False
        )
        # A static program: ldd says "not a dynamic executable" and lists nothing.
        for lib in ldd_paths(ldd.stdout):
            libraries[lib] = Path(lib).read_bytes()  # through symlinks: the file itself
    spec = ociimage.ImageSpec(
        ref=ref,
        files=image_files({n: p.read_bytes() for n, p in programs.items()}, libraries),
        entrypoint=["/bin/prometheus"],
        env=("PATH=/bin",),
        architecture=go_arch(),
        labels={"org.opencontainers.image.title": f"prometheus (Debian package, {ref})"},
    )
    return ociimage.cached_archive(
        spec, (cache_dir or build.cache_dir()) / "images", "prometheus"
    ), ref


def load_image(nodes: RealNodes, archive: Path, names: Sequence[str] | None = None) -> None:
    """Import an image archive into running nodes' containerd (their own image stores:
    new blobs are new files of that node, the seed's linked ones are never written)."""
    for name in names or nodes.names:
        socket = nodes.paths(name).containerd_socket
        ctr = [str(nodes.binaries.ctr), "--address", str(socket), "-n", "k8s.io"]
        result = nodes.in_node(name, [*ctr, "images", "import", str(archive)], timeout=300)
        if result.returncode != 0:
            raise ClusterPrometheusError(
                f"Importing {archive.name} into node {name} failed: {result.stderr.strip()[-500:]}"
            )


def _create(api: KubeApi, manifest: Mapping[str, Any]) -> None:
    """Create; one that exists already is kept (a second deploy changes nothing)."""
    try:
        api.post(api_path(manifest), manifest)
    except ApiError as e:
        if e.status != 409:
            raise


def _ready_pod_ip(api: KubeApi) -> str | None:
    pods = api.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        query={"labelSelector": f"app.kubernetes.io/name={PROMETHEUS}"},
    )["items"]
    for pod in pods:
        status = pod.get("status") or {}
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []
        )
        if ready and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            return status["podIP"]
    return None


def deploy_in_cluster_prometheus(
    nodes: RealNodes,
    *,
    scrape_interval: str = "2s",
    timeout: float = 180,
    emit: Emit = print,
) -> InClusterPrometheus:
    """Deploy the exporters' Service and a Prometheus pod in ``monitoring`` on running
    real nodes (with the cluster network: CoreDNS, kube-proxy, the API server on the
    pods' side), and wait until it scrapes every GPU node's exporter.

    A second call on the same cluster keeps what is there and waits again.
    """
    if not nodes.cluster_network:
        raise ClusterPrometheusError(
            "The in-cluster Prometheus needs real nodes with the cluster network "
            "(RealNodes(cluster_network=True)): pods reach it through a Service."
        )
    exporters = {name: address for name in nodes.names if (address := nodes.dcgm_exporter(name))}
    if not exporters:
        raise ClusterPrometheusError("These real nodes have no GPU node, so no DCGM exporter.")
    started = time.monotonic()
    archive, ref = build_image()
    emit(f"In-cluster Prometheus: importing {ref} into {len(nodes.names)} node(s)")
    load_image(nodes, archive)
    api = nodes.api()
    for manifest in manifests(ref, exporters, scrape_interval):
        _create(api, manifest)
    ip = wait_for(
        "the Prometheus pod in monitoring to be ready",
        lambda: _ready_pod_ip(api),
        timeout,
        interval=0.5,
        error=ClusterPrometheusError,
    )
    prometheus = PrometheusApi(f"http://{ip}:{PORT}")
    wait_for(
        f"Prometheus to scrape the DCGM exporters of {', '.join(sorted(exporters))}",
        lambda: _scraping(prometheus, len(exporters)),
        timeout,
        interval=0.5,
        error=ClusterPrometheusError,
    )
    emit(f"In-cluster Prometheus: {URL} ready in {time.monotonic() - started:.0f}s")
    return InClusterPrometheus(URL, prometheus)


def _scraping(prometheus: PrometheusApi, count: int) -> bool:
    try:
        up = prometheus.query(f'up{{job="{DCGM_JOB}"}} == 1')["data"]["result"]
    except OSError:
        return False
    return len(up) == count
