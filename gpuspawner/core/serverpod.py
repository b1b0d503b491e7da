"""The one reader of GPUSpawner's pods: what a pod says about its server (pure).

Limits, the hub's metrics, the culler, the admin page and the GPU check's
progress all read the same labels and annotations (:mod:`gpuspawner.core.labels`)
from pods as the API returns them (raw JSON, camelCase). They read them here,
through :meth:`ServerPod.from_pod`, so a label is parsed one way only. Also
here: which resource names are GPUs (:func:`is_gpu_resource`) and the
scheduler's "unschedulable" condition (:func:`unschedulable_message`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import labels
from .options import parse_count
from .stopreasons import CullWarning, StopNotice

#: Resource name prefixes counted as accelerators besides the catalog's own
#: resources: NVIDIA full GPUs, MIG slices and time-sliced replicas
#: (``nvidia.com/gpu.shared``), AMD, Intel and Habana devices.
GPU_RESOURCE_PREFIXES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "nvidia.com/mig-",
    "amd.com/gpu",
    "gpu.intel.com/",
    "habana.ai/",
)

_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def is_gpu_resource(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a Kubernetes resource name is a GPU: one of ``extra`` (the catalog's) or a known prefix."""
    return name in extra or name.startswith(GPU_RESOURCE_PREFIXES)


def pod_is_active(pod: Mapping[str, Any]) -> bool:
    """Whether any pod holds (or waits for) resources: not finished and not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in _FINISHED_PHASES


def selector(user_label: str | None = None) -> str:
    """The label selector of GPUSpawner's pods, of one user (KubeSpawner's escaped name) or all."""
    terms = [f"{labels.LABEL_MANAGED}=true"]
    if user_label is not None:
        terms.append(f"{labels.KUBESPAWNER_LABEL_USER}={user_label}")
    return ",".join(terms)


def is_managed(pod: Mapping[str, Any]) -> bool:
    """Whether GPUSpawner made the pod (it carries ``gpuspawner.io/managed=true``)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(labels.LABEL_MANAGED) == "true"


def unschedulable_message(pod: Mapping[str, Any] | None) -> str | None:
    """The scheduler's message while a pending, unbound pod is unschedulable, else None."""
    if not pod:
        return None
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending") or (pod.get("spec") or {}).get("nodeName"):
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return condition.get("message") or ""
    return None


def _weight(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


@dataclass(frozen=True)
class ServerPod:
    """What one of GPUSpawner's pods says about its server."""

    name: str
    namespace: str
    #: The hub's user and server names (KubeSpawner's annotations); "" when missing.
    user: str
    server: str
    profile: str | None
    #: The catalog GPU type key; None for CPU-only servers (and pods without GPUs).
    gpu_type: str | None
    gpus: int
    #: GPU units per GPU as recorded at spawn; None when not recorded.
    weight: float | None
    pool_groups: tuple[str, ...]
    #: The Kubernetes resource the GPUs were requested as.
    gpu_resource: str
    node: str
    phase: str
    deleting: bool
    created: str
    #: The scheduler's message while the pod cannot be placed, else None.
    unschedulable: str | None
    #: Why it is being stopped (``gpuspawner.io/stop-reason``); None when not recorded or unreadable.
    stop_notice: StopNotice | None = None
    #: The culler's pending warning (``gpuspawner.io/cull-warning``); None when none or unreadable.
    cull_warning: CullWarning | None = None

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> ServerPod:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        gpu_type = pod_labels.get(labels.LABEL_GPU_TYPE)
        gpus = parse_count(pod_labels.get(labels.LABEL_GPUS, "0")) or 0
        if gpu_type in (None, "", labels.NO_GPU_TYPE) or gpus <= 0:
            gpu_type, gpus = None, 0
        pools = annotations.get(labels.ANNOTATION_POOL_GROUPS) or ""
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            user=annotations.get(labels.KUBESPAWNER_ANNOTATION_USER) or "",
            server=annotations.get(labels.KUBESPAWNER_ANNOTATION_SERVER) or "",
            profile=pod_labels.get(labels.LABEL_PROFILE) or None,
            gpu_type=gpu_type,
            gpus=gpus,
            weight=_weight(annotations.get(labels.ANNOTATION_GPU_WEIGHT)),
            pool_groups=tuple(g for g in pools.split(",") if g),
            gpu_resource=annotations.get(labels.ANNOTATION_GPU_RESOURCE)
            or labels.DEFAULT_GPU_RESOURCE,
            node=(pod.get("spec") or {}).get("nodeName") or "",
            phase=(pod.get("status") or {}).get("phase") or "",
            deleting=bool(meta.get("deletionTimestamp")),
            created=meta.get("creationTimestamp") or "",
            unschedulable=unschedulable_message(pod),
            stop_notice=StopNotice.from_state(annotations.get(labels.ANNOTATION_STOP_REASON)),
            cull_warning=CullWarning.from_state(annotations.get(labels.ANNOTATION_CULL_WARNING)),
        )

    @property
    def key(self) -> tuple[str, str]:
        """(user, server name) as the hub names the server."""
        return self.user, self.server

    @property
    def has_gpus(self) -> bool:
        return self.gpu_type is not None

    @property
    def active(self) -> bool:
        """Holds (or waits for) its GPUs: not finished and not being deleted."""
        return not self.deleting and self.phase not in _FINISHED_PHASES

    @property
    def terminated(self) -> bool:
        """Finished (Succeeded/Failed) or being deleted: it holds nothing any more."""
        return not self.active

    @property
    def pending(self) -> bool:
        """Active and in phase Pending: waiting for a node, or bound and starting (pulling, GPU check)."""
        return self.active and self.phase == "Pending"

    @property
    def bound(self) -> bool:
        """Placed on a node (``spec.nodeName``): from then on it holds its GPUs there."""
        return bool(self.node)

    @property
    def waiting_for_gpus(self) -> bool:
        """The scheduler left it pending for lack of its own GPU resource."""
        return (
            self.unschedulable is not None
            and f"Insufficient {self.gpu_resource}" in self.unschedulable
        )


def server_pods(pods: Iterable[Mapping[str, Any]]) -> list[ServerPod]:
    """:meth:`ServerPod.from_pod` of each pod."""
    return [ServerPod.from_pod(pod) for pod in pods]
