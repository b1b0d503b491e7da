"""Kueue in the local cluster: the GPU queue real clusters put in front of their nodes.

Kueue v0.17.0 (``sigs.k8s.io/kueue``) is built from its Go module like the other
node components (:data:`KUEUE`, cached by :mod:`.nodebuild` under its version), packed
as a one-file image (the static binary) and imported into the nodes without GPUs,
and deployed as upstream's ``config/default`` deploys it: a Deployment in
``kueue-system``, with its webhooks and its visibility API behind Services.

Why on the nodes and not as a host process: that is how every real cluster runs it,
and it needs nothing of the host. The API server (a host process) reaches the
webhook and visibility Services' ClusterIPs through kube-proxy's rules on the host
(the cluster network), and Kueue's internal certificate management writes its
webhook certificate into a Secret the kubelet mounts, exactly as upstream. Nothing
listens on a host address, and `down` (which stops the nodes) removes it with them.

The manifests are the module's own kustomize parts (``config/components``): the
CRDs (with the conversion webhooks of ``crd/patches``), the RBAC of ``rbac/``, the
webhook configurations (pod, deployment and statefulset webhooks leave kube-system
and kueue-system alone, as ``webhook/kustomization.yaml`` patches them), the empty
certificate Secret, the visibility APIServices; kustomize's ``namePrefix: kueue-``
and ``namespace: kueue-system`` of ``config/default`` are applied here
(:func:`kustomized`), so no kustomize binary is needed. The Configuration
(:func:`configuration`) enables ``batch/job`` and ``pod`` only and never touches a
pod without the queue label.

The queue objects (:func:`queue_objects`, from the nodes' GFD labels and
allocatable): one ResourceFlavor per GPU product plus ``default-flavor``;
ClusterQueues ``notebooks`` and ``batch`` in cohort ``gpus``, splitting each
flavor's GPUs (``notebooks`` gets the larger half); WorkloadPriorityClasses; the
LocalQueue ``gpu-notebooks`` in the hub's namespace and ``batch`` in namespace
``batch``. docs/sandbox.md ("Kueue") says the same for people.

Pure: :func:`kustomized`, :func:`configuration`, :func:`control_plane_objects`,
:func:`gpu_flavors`, :func:`queue_objects`, :func:`object_path`. I/O:
:func:`build_kueue`, :func:`build_image`, :func:`deploy_kueue`, :func:`remove_kueue`,
:func:`running_kueue`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from . import build, nodebuild, nodeconfig, ociimage, suitecosts
from .controlplane import ControlPlaneError, apply_objects
from .kubeapi import ApiError, KubeApi
from .testing import wait_for

if TYPE_CHECKING:
    from .nodes import RealNodes

MODULE = "sigs.k8s.io/kueue"
VERSION = "v0.17.0"

#: Kueue's manager, static, with its version where ``kueue --version``-like logs say it.
KUEUE = nodebuild.GoTool(
    name="kueue",
    module=MODULE,
    version=VERSION,
    installs=(
        nodebuild.GoInstall(
            ("cmd/kueue",), ldflags=("-s", "-w", f"-X {MODULE}/pkg/version.GitVersion={VERSION}")
        ),
    ),
    cold_estimate="about 10 minutes on 2 cores (its own Kubernetes client modules)",
)

NAMESPACE = "kueue-system"
#: config/default's kustomize namePrefix.
PREFIX = "kueue-"
GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
DEPLOYMENT = f"{PREFIX}controller-manager"
SERVICE_ACCOUNT = f"{PREFIX}controller-manager"
WEBHOOK_SERVICE = f"{PREFIX}webhook-service"
VISIBILITY_SERVICE = f"{PREFIX}visibility-server"
CERT_SECRET = f"{PREFIX}webhook-server-cert"
CONFIG_MAP = f"{PREFIX}manager-config"
CONFIG_FILE = "controller_manager_config.yaml"
WEBHOOK_PORT = 9443
HEALTH_PORT = 8081
VISIBILITY_PORT = 8082
#: The selector config/default gives the Deployment and its Services.
SELECTOR = {"control-plane": "controller-manager"}
LABELS = {"app.kubernetes.io/name": "kueue", "app.kubernetes.io/part-of": "gpuspawner-sandbox"}
#: Kueue's webhooks leave these namespaces alone (and so does its job management).
SYSTEM_NAMESPACES = ("kube-system", NAMESPACE)
#: The webhooks config/components/webhook/kustomization.yaml gives that namespace selector.
SYSTEM_EXCLUDED_WEBHOOKS = frozenset(
    {"mpod.kb.io", "mdeployment.kb.io", "mstatefulset.kb.io"}
    | {"vpod.kb.io", "vdeployment.kb.io", "vstatefulset.kb.io"}
)
#: nobody-ish, as distroless's nonroot user upstream's image runs as.
RUN_AS = 65532

# The queue objects (docs/sandbox.md, "Kueue"; the design of issue 31).
GPU_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
DEFAULT_FLAVOR = "default-flavor"
COHORT = "gpus"
NOTEBOOKS = "notebooks"
BATCH = "batch"
NOTEBOOK_LOCAL_QUEUE = "gpu-notebooks"
BATCH_NAMESPACE = "batch"
BATCH_LOCAL_QUEUE = "batch"
PRIORITY_CLASSES = {"gpuspawner-interactive": 1000, "gpuspawner-batch": 100}
#: cpu and memory are queued too (a pod's every request must be covered), never the limit.
CPU_QUOTA = 1000
MEMORY_QUOTA = "10Ti"

Emit = Callable[[str], None]


class KueueError(Exception):
    """Kueue could not be built, deployed or removed; the message says why."""


# -- pure: the control-plane objects ---------------------------------------------------


def _prefixed(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


def kustomized(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One object of config/components as config/default's kustomization makes it:
    ``kueue-`` name prefix, namespace ``kueue-system``, references to renamed objects
    (role refs, service accounts, Services) following, Kueue's labels added.

    CRDs and APIServices keep their names (their names are their API's); the
    visibility reader's RoleBinding stays in kube-system, where its Role is.
    """
    out = copy.deepcopy(dict(obj))
    kind = out["kind"]
    meta = out.setdefault("metadata", {})
    if kind not in ("CustomResourceDefinition", "APIService", "Namespace"):
        meta["name"] = _prefixed(meta["name"])
    if "namespace" in meta and meta["namespace"] != "kube-system":
        meta["namespace"] = NAMESPACE
    meta["labels"] = {**(meta.get("labels") or {}), **LABELS}
    if "roleRef" in out and out["roleRef"]["name"] != "extension-apiserver-authentication-reader":
        out["roleRef"]["name"] = _prefixed(out["roleRef"]["name"])
    for subject in out.get("subjects") or []:
        if subject.get("kind") == "ServiceAccount":
            subject["name"] = _prefixed(subject["name"])
            subject["namespace"] = NAMESPACE
    for hook in out.get("webhooks") or []:
        service = hook.get("clientConfig", {}).get("service")
        if service:
            service["name"] = _prefixed(service["name"])
            service["namespace"] = NAMESPACE
        if hook["name"] in SYSTEM_EXCLUDED_WEBHOOKS:
            hook["namespaceSelector"] = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": list(SYSTEM_NAMESPACES),
                    }
                ]
            }
    if kind == "APIService":
        out["spec"]["service"] = {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE}
    conversion = (out.get("spec") or {}).get("conversion") or {}
    service = (conversion.get("webhook") or {}).get("clientConfig", {}).get("service")
    if service:
        service["name"] = _prefixed(service["name"])
        service["namespace"] = NAMESPACE
    return out


def with_conversion(crd: Mapping[str, Any], patch: Mapping[str, Any] | None) -> dict[str, Any]:
    """A CRD with crd/patches' conversion webhook (if it has one) merged in."""
    out = copy.deepcopy(dict(crd))
    if patch and (patch.get("spec") or {}).get("conversion"):
        out["spec"]["conversion"] = copy.deepcopy(patch["spec"]["conversion"])
    return out


def configuration() -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2), as the ConfigMap's file.

    ``batch/job`` and ``pod`` only; a pod (or Job) without the queue label is never
    touched (``manageJobsWithoutQueueName: false``), nor anything in kube-system or
    kueue-system. One replica: no leader election. Its own certificates.
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f":{HEALTH_PORT}"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": WEBHOOK_PORT},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": CERT_SECRET,
        },
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": list(SYSTEM_NAMESPACES),
                }
            ]
        },
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job", "pod"]},
    }


def _service(name: str, port: int, target: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {
            "selector": dict(SELECTOR),
            "ports": [{"name": "https", "port": port, "targetPort": target, "protocol": "TCP"}],
        },
    }


def deployment(image: str) -> dict[str, Any]:
    """Kueue's manager (config/components/manager with config/default's patches): the
    Configuration mounted, the webhook certificate's Secret, the visibility server's
    scratch directory; ready when its health port says so."""
    labels = {**LABELS, **SELECTOR}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": dict(SELECTOR)},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS},
                    "containers": [
                        {
                            "name": "manager",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["/manager"],
                            "args": [f"--config=/{CONFIG_FILE}", "--zap-log-level=2"],
                            "ports": [
                                {"name": "webhook-server", "containerPort": WEBHOOK_PORT},
                                {"name": "visibility", "containerPort": VISIBILITY_PORT},
                                {"name": "health", "containerPort": HEALTH_PORT},
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": HEALTH_PORT},
                                "periodSeconds": 2,
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/healthz", "port": HEALTH_PORT},
                                "initialDelaySeconds": 15,
                                "periodSeconds": 20,
                            },
                            # upstream's limit; the request is what it uses here (see docs)
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {
                                    "name": "manager-config",
                                    "mountPath": f"/{CONFIG_FILE}",
                                    "subPath": CONFIG_FILE,
                                },
                                {
                                    "name": "cert",
                                    "mountPath": "/tmp/k8s-webhook-server/serving-certs",
                                    "readOnly": True,
                                },
                                {"name": "visibility", "mountPath": "/visibility"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "manager-config", "configMap": {"name": CONFIG_MAP}},
                        {"name": "cert", "secret": {"secretName": CERT_SECRET, "defaultMode": 420}},
                        {"name": "visibility", "emptyDir": {}},
                    ],
                },
            },
        },
    }


@dataclass(frozen=True)
class Components:
    """The module's kustomize parts, read (config/components)."""

    crds: list[dict[str, Any]]
    #: CRD name -> crd/patches' webhook_in_* patch
    conversions: dict[str, dict[str, Any]]
    rbac: list[dict[str, Any]]
    webhooks: list[dict[str, Any]]
    visibility: list[dict[str, Any]]


def control_plane_objects(parts: Components, image: str) -> list[list[dict[str, Any]]]:
    """Everything but the queues, in stages applied one after the other (the order
    Kueue needs: CRDs; namespace; RBAC; the empty certificate Secret; the webhook
    configurations and their Service, which its certificate rotator looks for before
    it starts its controllers; the visibility APIServices and Service; the
    Configuration; the Deployment)."""
    crds = [
        kustomized(with_conversion(c, parts.conversions.get(c["metadata"]["name"])))
        for c in parts.crds
    ]
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": dict(LABELS)},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CERT_SECRET, "namespace": NAMESPACE, "labels": dict(LABELS)},
    }
    visibility = [kustomized(o) for o in parts.visibility if o["kind"] != "Service"]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "data": {CONFIG_FILE: yaml.safe_dump(configuration(), sort_keys=False)},
    }
    return [
        crds,
        [namespace],
        [kustomized(o) for o in parts.rbac],
        [secret],
        [
            *(kustomized(o) for o in parts.webhooks if o["kind"] != "Service"),
            _service(WEBHOOK_SERVICE, 443, WEBHOOK_PORT),
        ],
        [*visibility, _service(VISIBILITY_SERVICE, 443, VISIBILITY_PORT)],
        [config_map],
        [deployment(image)],
    ]


#: kind -> (apiVersion's collection prefix, plural, namespaced), for the kinds we create.
KINDS: dict[str, tuple[str, str, bool]] = {
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
    "APIService": ("/apis/apiregistration.k8s.io/v1", "apiservices", False),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ResourceFlavor": (f"/apis/{API_VERSION}", "resourceflavors", False),
    "ClusterQueue": (f"/apis/{API_VERSION}", "clusterqueues", False),
    "LocalQueue": (f"/apis/{API_VERSION}", "localqueues", True),
    "WorkloadPriorityClass": (f"/apis/{API_VERSION}", "workloadpriorityclasses", False),
}


def object_path(obj: Mapping[str, Any]) -> str:
    """The object's own URL path on the API server."""
    prefix, plural, namespaced = KINDS[obj["kind"]]
    meta = obj["metadata"]
    where = f"/namespaces/{meta['namespace']}" if namespaced else ""
    return f"{prefix}{where}/{plural}/{meta['name']}"


# -- pure: the queues ------------------------------------------------------------------


@dataclass(frozen=True)
class GpuFlavor:
    """One GPU product of the cluster (a GFD ``nvidia.com/gpu.product`` value), the node
    labels that pick its nodes, and what they advertise: resource -> count over them."""

    name: str
    product: str
    resources: dict[str, int] = field(default_factory=dict)
    node_labels: dict[str, str] = field(default_factory=dict)

    @property
    def mig(self) -> bool:
        return any(r.startswith(MIG_PREFIX) for r in self.resources)


def flavor_name(product: str) -> str:
    """The ResourceFlavor's name for a GPU product: the label value lower-cased
    (``NVIDIA-A100-SXM4-80GB`` -> ``nvidia-a100-sxm4-80gb``), anything a name may not
    hold turned into ``-``."""
    name = re.sub(r"[^a-z0-9.-]", "-", product.lower()).strip("-.")
    return name[:249] or "gpu"


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def gpu_flavors(nodes: Iterable[Mapping[str, Any]]) -> list[GpuFlavor]:
    """The GPU flavors of Node objects: one per distinct ``nvidia.com/gpu.product``, with
    the GPUs (``nvidia.com/gpu``) or MIG devices (``nvidia.com/mig-*``, NVIDIA's mixed
    strategy) its nodes advertise in ``status.allocatable``. Nodes without the label
    are left out.

    A ClusterQueue holds a flavor in one resource group only, and MIG devices have a
    group of their own: where one product has both full-GPU and mixed-MIG nodes, its
    MIG nodes form a second flavor, ``<name>-mig``, picked by ``nvidia.com/mig.strategy``
    too.
    """
    full: dict[str, dict[str, int]] = {}
    mig: dict[str, dict[str, int]] = {}
    products: dict[str, str] = {}
    for node in nodes:
        product = ((node.get("metadata") or {}).get("labels") or {}).get(GPU_LABEL)
        if not product:
            continue
        name = flavor_name(product)
        products.setdefault(name, product)
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        counts = {
            r: _count(v)
            for r, v in allocatable.items()
            if r == GPU_RESOURCE or r.startswith(MIG_PREFIX)
        }
        kind = mig if any(r.startswith(MIG_PREFIX) for r in counts) else full
        into = kind.setdefault(name, {})
        for resource, n in counts.items():
            if kind is full or resource.startswith(MIG_PREFIX):
                into[resource] = into.get(resource, 0) + n
    out = []
    for name in sorted(products):
        product = products[name]
        if name in full:
            out.append(GpuFlavor(name, product, _nonzero(full[name]), {GPU_LABEL: product}))
        if name in mig:
            if name in full:
                labels = {GPU_LABEL: product, "nvidia.com/mig.strategy": "mixed"}
                out.append(GpuFlavor(f"{name}-mig", product, _nonzero(mig[name]), labels))
            else:
                out.append(GpuFlavor(name, product, _nonzero(mig[name]), {GPU_LABEL: product}))
    return out


def _nonzero(counts: Mapping[str, int]) -> dict[str, int]:
    return {r: n for r, n in sorted(counts.items()) if n}


def notebook_share(total: int) -> int:
    """The ``notebooks`` ClusterQueue's nominal quota of a flavor's ``total``: the larger half."""
    return math.ceil(total / 2)


def _group(
    flavors: Sequence[GpuFlavor], resources: Sequence[str], share: Callable[[int], int]
) -> dict[str, Any]:
    return {
        "coveredResources": list(resources),
        "flavors": [
            {
                "name": f.name,
                "resources": [
                    {"name": r, "nominalQuota": share(f.resources.get(r, 0))} for r in resources
                ],
            }
            for f in flavors
        ],
    }


def preemption_policy(preemption: bool) -> dict[str, str]:
    """A ClusterQueue's ``spec.preemption``: lower priorities preempted within the queue
    and the cohort's lent quota reclaimed, or neither."""
    if preemption:
        return {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    return {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"}


def cluster_queue(
    name: str, flavors: Sequence[GpuFlavor], share: Callable[[int], int], preemption: bool
) -> dict[str, Any]:
    """One of the two ClusterQueues: cpu/memory in ``default-flavor``, full GPUs in their
    products' flavors, MIG devices in a group of their own (a flavor sits in one group)."""
    groups: list[dict[str, Any]] = [
        {
            "coveredResources": ["cpu", "memory"],
            "flavors": [
                {
                    "name": DEFAULT_FLAVOR,
                    "resources": [
                        {"name": "cpu", "nominalQuota": CPU_QUOTA},
                        {"name": "memory", "nominalQuota": MEMORY_QUOTA},
                    ],
                }
            ],
        }
    ]
    full = [f for f in flavors if not f.mig and GPU_RESOURCE in f.resources]
    if full:
        groups.append(_group(full, [GPU_RESOURCE], share))
    mig = [f for f in flavors if f.mig]
    if mig:
        resources = sorted({r for f in mig for r in f.resources if r.startswith(MIG_PREFIX)})
        groups.append(_group(mig, resources, share))
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": preemption_policy(preemption),
            "resourceGroups": groups,
        },
    }


def queue_objects(
    flavors: Sequence[GpuFlavor], hub_namespace: str, *, preemption: bool = False
) -> list[dict[str, Any]]:
    """The queue objects, in the order to create them: ResourceFlavors, the priority
    classes, the ClusterQueues ``notebooks`` and ``batch`` (cohort ``gpus``), namespace
    ``batch``, the LocalQueues."""
    meta = {"labels": dict(LABELS)}
    out: list[dict[str, Any]] = [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": {"name": DEFAULT_FLAVOR, **meta},
            "spec": {},
        }
    ]
    out += [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": {"name": f.name, **meta},
            "spec": {"nodeLabels": dict(f.node_labels)},
        }
        for f in flavors
    ]
    out += [
        {
            "apiVersion": API_VERSION,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name, **meta},
            "value": value,
            "description": f"gpuspawner: {name.split('-', 1)[1]} work",
        }
        for name, value in PRIORITY_CLASSES.items()
    ]
    out += [
        cluster_queue(NOTEBOOKS, flavors, notebook_share, preemption),
        cluster_queue(BATCH, flavors, lambda n: n - notebook_share(n), preemption),
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": BATCH_NAMESPACE, **meta},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": NOTEBOOK_LOCAL_QUEUE, "namespace": hub_namespace, **meta},
            "spec": {"clusterQueue": NOTEBOOKS},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": BATCH_LOCAL_QUEUE, "namespace": BATCH_NAMESPACE, **meta},
            "spec": {"clusterQueue": BATCH},
        },
    ]
    return out


def pending_path(
    cluster_queue: str | None = None, local_queue: tuple[str, str] | None = None
) -> str:
    """The visibility API's pending workloads of a ClusterQueue, or of a LocalQueue
    ``(namespace, name)``."""
    base = f"/apis/{VISIBILITY_GROUP}/v1beta2"
    if local_queue is not None:
        namespace, name = local_queue
        return f"{base}/namespaces/{namespace}/localqueues/{name}/pendingworkloads"
    return f"{base}/clusterqueues/{cluster_queue}/pendingworkloads"


# -- I/O: the build, the module's manifests, the image ---------------------------------


def build_kueue(cache: Path | None = None, *, out: TextIO | None = None) -> Path:
    """Build (or find cached) Kueue's manager; the binary's path."""
    return nodebuild.build_tool(KUEUE, cache, out=out) / "kueue"


def module_dir() -> Path:
    """Kueue's module in Go's module cache (downloaded if missing): its manifests."""
    go = build.find_go()
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    cache = subprocess.run(
        [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    path = Path(cache) / f"{MODULE}@{VERSION}"
    if not (path / "config" / "components").is_dir():
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            check=False,
        )
        if done.returncode != 0:
            raise KueueError(f"Cannot download {MODULE}@{VERSION}: {done.stdout[-500:]}")
        path = Path(json.loads(done.stdout)["Dir"])
    return path


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _resources(component: Path) -> list[dict[str, Any]]:
    """The objects a component's kustomization.yaml lists as resources."""
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for name in kustomization.get("resources") or []:
        out += _documents(component / name)
    return out


def read_components(module: Path) -> Components:
    """The module's config/components parts we apply."""
    components = module / "config" / "components"
    crd_kustomization = yaml.safe_load((components / "crd" / "kustomization.yaml").read_text())
    conversions = {}
    for patch in crd_kustomization.get("patches") or []:
        (doc,) = _documents(components / "crd" / patch["path"])
        conversions[doc["metadata"]["name"]] = doc
    return Components(
        crds=_resources(components / "crd"),
        conversions=conversions,
        rbac=_resources(components / "rbac"),
        webhooks=_resources(components / "webhook"),
        visibility=_resources(components / "visibility"),
    )


def image_ref() -> str:
    return f"{nodeconfig.IMAGE_REGISTRY}/kueue:{VERSION}"


def build_image(binary: Path, cache_dir: Path | None = None) -> tuple[Path, str]:
    """The image archive (OCI layout) with the static manager at /manager, and its
    reference; made once per binary (the file name holds the image ID)."""
    ref = image_ref()
    spec = ociimage.ImageSpec(
        ref=ref,
        files={"manager": (binary.read_bytes(), 0o755)},
        entrypoint=["/manager"],
        architecture=nodebuild.go_arch(),
        labels={"org.opencontainers.image.title": f"kueue {VERSION} (built from {MODULE})"},
    )
    return ociimage.cached_archive(spec, (cache_dir or build.cache_dir()) / "images", "kueue"), ref


# -- I/O: deploy, wait, remove ---------------------------------------------------------


@dataclass
class Kueue:
    """Kueue running in the local cluster, and its queues."""

    api: KubeApi
    hub_namespace: str
    flavors: list[GpuFlavor]
    #: every object we applied, in the order applied (removed in reverse)
    objects: list[dict[str, Any]]
    #: whether we created the hub's namespace (then we remove it)
    created_hub_namespace: bool = False
    #: seconds from the first object applied to the visibility API answering
    started_in: float = 0.0
    cluster_queues: tuple[str, str] = (NOTEBOOKS, BATCH)
    local_queue: str = NOTEBOOK_LOCAL_QUEUE
    batch_namespace: str = BATCH_NAMESPACE
    batch_local_queue: str = BATCH_LOCAL_QUEUE

    def pending(self, cluster_queue: str = NOTEBOOKS) -> dict[str, Any]:
        """The visibility API's PendingWorkloadsSummary of a ClusterQueue."""
        return self.api.get(pending_path(cluster_queue))

    def pending_in_local_queue(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.get(pending_path(local_queue=(namespace, name)))

    def pod(self) -> dict[str, Any] | None:
        """Kueue's running manager pod, if any."""
        return _manager_pod(self.api)

    def set_preemption(self, preemption: bool, timeout: float = 60) -> None:
        """Turn preemption on or off in both ClusterQueues of a running Kueue (what
        ``deploy_kueue(preemption=...)`` would have made), once they are active again."""
        for name in self.cluster_queues:
            self.api.request(
                "PATCH",
                f"/apis/{API_VERSION}/clusterqueues/{name}",
                {"spec": {"preemption": preemption_policy(preemption)}},
                content_type="application/merge-patch+json",
            )
        want = preemption_policy(preemption)

        def applied() -> bool:
            # Kueue's CRD defaults more fields (borrowWithinCohort): ours must be there.
            for name in self.cluster_queues:
                got = self.api.get(f"/apis/{API_VERSION}/clusterqueues/{name}")["spec"]
                if any((got.get("preemption") or {}).get(k) != v for k, v in want.items()):
                    return False
            return _active(self.api, self.cluster_queues)

        wait_for(
            "the ClusterQueues' new preemption", applied, timeout, interval=0.5, error=KueueError
        )


def _manager_pod(api: KubeApi) -> dict[str, Any] | None:
    selector = ",".join(f"{k}={v}" for k, v in SELECTOR.items())
    pods = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", query={"labelSelector": selector})
    for pod in pods["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return pod
    return None


def _apply(api: KubeApi, objects: list[dict[str, Any]]) -> None:
    try:
        apply_objects(api, objects, field_manager="gpuspawner-sandbox-kueue")
    except ControlPlaneError as e:
        raise KueueError(str(e)) from None


def _established(api: KubeApi, names: Iterable[str]) -> bool:
    for name in names:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return False
    return True


def _webhooks_answer(api: KubeApi) -> bool:
    """Whether Kueue's webhooks answer: a dry-run ResourceFlavor passes them (LocalQueues
    have no webhook, so one of those would pass without Kueue)."""
    probe = {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": "gpuspawner-sandbox-probe"},
        "spec": {},
    }
    try:
        api.post(f"/apis/{API_VERSION}/resourceflavors", probe, query={"dryRun": "All"})
    except (ApiError, OSError):
        return False
    return True


class _Remount:
    """Restart Kueue's first pod once its certificate Secret is filled, if it is not
    ready by then.

    Its certificate rotator writes the Secret the kubelet mounted empty, and waits
    for the files to appear; the kubelet refreshes a mounted Secret only at its next
    periodic sync of the pod (a minute or more; measured up to 165 s here). A new
    pod mounts the filled Secret at once, and its rotator finds valid certificates.
    """

    #: How long the pod may take to see its filled Secret before it is replaced.
    GRACE = 10.0

    def __init__(self, api: KubeApi):
        self.api = api
        self.filled_at: float | None = None
        self.done = False

    def check(self) -> bool:
        if self.done:
            return False
        if self.filled_at is None:
            with contextlib.suppress(ApiError, OSError):
                secret = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{CERT_SECRET}")
                if (secret.get("data") or {}).get("tls.crt"):
                    self.filled_at = time.monotonic()
            return False
        if time.monotonic() - self.filled_at < self.GRACE or _manager_pod(self.api) is not None:
            return False
        with contextlib.suppress(ApiError, OSError):
            for pod in self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
                _delete(self.api, f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
        self.done = True
        return False


def _visibility_answers(api: KubeApi) -> bool:
    try:
        api.get(pending_path(NOTEBOOKS))
    except (ApiError, OSError):
        return False
    return True


def _active(api: KubeApi, names: Iterable[str]) -> bool:
    for name in names:
        try:
            cq = api.get(f"/apis/{API_VERSION}/clusterqueues/{name}")
        except ApiError:
            return False
        conditions = (cq.get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Active" and c["status"] == "True" for c in conditions):
            return False
    return True


def _ensure_namespace(api: KubeApi, name: str) -> bool:
    """Create a namespace if it is missing; whether we created it."""
    try:
        api.get(f"/api/v1/namespaces/{name}")
        return False
    except ApiError as e:
        if e.status != 404:
            raise
    api.post("/api/v1/namespaces", {"metadata": {"name": name, "labels": dict(LABELS)}})
    return True


def _log_tail(api: KubeApi) -> str:
    with contextlib.suppress(ApiError, OSError, KeyError):
        pods = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        for pod in pods:
            text = api.request(
                "GET",
                f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/log",
                query={"tailLines": "30"},
                raw=True,
            ).body
            return f"\nKueue's log (last lines):\n{text}"
    return ""


@suitecosts.recorded(
    suitecosts.KUEUE,
    lambda *a, preemption=False, **k: "preemption on" if preemption else "preemption off",
)
def deploy_kueue(
    nodes: RealNodes,
    hub_namespace: str,
    *,
    preemption: bool = False,
    timeout: float = 300,
    emit: Emit = print,
    out: TextIO | None = None,
) -> Kueue:
    """Build (if needed) and deploy Kueue and its queues on running real nodes with the
    cluster network; return once its webhooks and visibility API answer and both
    ClusterQueues are active.

    On failure what was applied is removed again before the error is raised.
    """
    if not nodes.cluster_network:
        raise KueueError(
            "Kueue needs real nodes with the cluster network (RealNodes(cluster_network=True)): "
            "the API server reaches its webhooks through a Service."
        )
    hosts = [n for n in nodes.names if nodes.gpu_spec(n) is None]
    if not hosts:
        raise KueueError("Kueue runs on a node without GPUs, and this cluster has none.")
    binary = build_kueue(out=out if out is not None else sys.stderr)
    archive, ref = build_image(binary)
    parts = read_components(module_dir())
    emit(f"Kueue: importing {ref} into {', '.join(hosts)}")
    from .clusterprometheus import ClusterPrometheusError, load_image

    try:
        load_image(nodes, archive, hosts)
    except ClusterPrometheusError as e:
        raise KueueError(str(e)) from None
    api = nodes.api()
    kueue = Kueue(api, hub_namespace, [], [])
    started = time.monotonic()
    try:
        kueue.created_hub_namespace = _ensure_namespace(api, hub_namespace)
        stages = control_plane_objects(parts, ref)
        for stage in stages:
            kueue.objects += stage
            _apply(api, stage)
            if stage is stages[0]:
                wait_for(
                    "Kueue's CRDs to be established",
                    lambda: _established(api, (c["metadata"]["name"] for c in stages[0])),
                    60,
                    interval=0.5,
                    error=KueueError,
                )
        remount = _Remount(api)
        wait_for(
            "Kueue's webhooks to answer (its pod ready, its certificate mounted)",
            lambda: _webhooks_answer(api) or remount.check(),
            timeout,
            interval=1,
            error=KueueError,
        )
        kueue.flavors = gpu_flavors(api.get("/api/v1/nodes")["items"])
        queues = queue_objects(kueue.flavors, hub_namespace, preemption=preemption)
        kueue.objects += queues
        for obj in queues:  # one at a time: the batch namespace before its LocalQueue
            _apply(api, [obj])
        wait_for(
            "Kueue's ClusterQueues to be active and its visibility API to answer",
            lambda: _active(api, kueue.cluster_queues) and _visibility_answers(api),
            timeout,
            interval=1,
            error=KueueError,
        )
    except KueueError as e:
        log = _log_tail(api)
        remove_kueue(kueue)
        raise KueueError(f"{e}{log}") from None
    except BaseException:
        remove_kueue(kueue)
        raise
    kueue.started_in = time.monotonic() - started
    flavors = ", ".join(f"{f.name} {f.resources}" for f in kueue.flavors) or "none"
    emit(f"Kueue: ready in {kueue.started_in:.0f}s; GPU flavors: {flavors}")
    return kueue


def _strip_finalizers(api: KubeApi, path: str, obj: Mapping[str, Any]) -> None:
    finalizers = obj["metadata"].get("finalizers") or []
    keep = [f for f in finalizers if not f.startswith(f"{GROUP}/")]
    if keep == finalizers:
        return
    with contextlib.suppress(ApiError):
        api.request(
            "PATCH",
            path,
            {
                "metadata": {
                    "finalizers": keep,
                    "resourceVersion": obj["metadata"]["resourceVersion"],
                }
            },
            content_type="application/merge-patch+json",
        )


def _delete(api: KubeApi, path: str, **query: str) -> None:
    try:
        api.delete(path, query=query or None)
    except ApiError as e:
        if e.status != 404:
            raise


def _gone(api: KubeApi, path: str) -> bool:
    try:
        api.get(path)
    except ApiError as e:
        return e.status == 404
    return False


def remove_kueue(kueue: Kueue, timeout: float = 120) -> None:
    """Remove everything :func:`deploy_kueue` applied, so the cluster is as before.

    The webhook configurations and APIServices go first (nothing then depends on
    Kueue answering), then its pods (the kubelet stops them), then the finalizers
    only a running Kueue would remove (on its objects and on pods it managed), then
    the CRDs (with every Kueue object), the namespaces and the RBAC.
    """
    api = kueue.api
    objects = kueue.objects
    first = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "APIService")
    for obj in objects:
        if obj["kind"] in first:
            _delete(api, object_path(obj))
    _delete(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}")
    with contextlib.suppress(ApiError):
        for pod in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
            _delete(api, f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
    with contextlib.suppress(KueueError):
        wait_for(
            "Kueue's pods to stop",
            lambda: not api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"],
            30,
            interval=0.5,
            error=KueueError,
        )
    # Whatever a stopped Kueue still holds with its finalizers.
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        spec = crd["spec"]
        plural = spec["names"]["plural"]
        for version in spec["versions"]:
            if not version.get("storage"):
                continue
            base = f"/apis/{spec['group']}/{version['name']}"
            with contextlib.suppress(ApiError):
                for item in api.get(f"{base}/{plural}")["items"]:
                    meta = item["metadata"]
                    where = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
                    _strip_finalizers(api, f"{base}{where}/{plural}/{meta['name']}", item)
    with contextlib.suppress(ApiError):
        for pod in api.get("/api/v1/pods")["items"]:
            meta = pod["metadata"]
            _strip_finalizers(
                api, f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", pod
            )
    for obj in reversed(objects):
        if obj["kind"] in first or (obj.get("metadata") or {}).get("namespace") == NAMESPACE:
            continue  # gone already, or with the namespace
        if KINDS[obj["kind"]][0].startswith(f"/apis/{GROUP}") or obj["kind"] == "LocalQueue":
            continue  # with the CRDs
        _delete(api, object_path(obj))
    if kueue.created_hub_namespace:
        _delete(api, f"/api/v1/namespaces/{kueue.hub_namespace}")
    leftover = [
        object_path(o) for o in objects if o["kind"] in ("CustomResourceDefinition", "Namespace")
    ]
    if kueue.created_hub_namespace:
        leftover.append(f"/api/v1/namespaces/{kueue.hub_namespace}")
    wait_for(
        "Kueue's CRDs and namespaces to be deleted",
        lambda: all(_gone(api, p) for p in leftover),
        timeout,
        interval=0.5,
        error=KueueError,
    )


@contextlib.contextmanager
def running_kueue(
    nodes: RealNodes,
    hub_namespace: str,
    *,
    preemption: bool = False,
    timeout: float = 300,
    emit: Emit = print,
    out: TextIO | None = None,
) -> Iterator[Kueue]:
    """Kueue and its queues until the block ends; then nothing of it is left."""
    kueue = deploy_kueue(
        nodes, hub_namespace, preemption=preemption, timeout=timeout, emit=emit, out=out
    )
    try:
        yield kueue
    finally:
        remove_kueue(kueue)
