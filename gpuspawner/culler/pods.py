"""Read the culler's facts from Kubernetes pod objects (JSON as the API returns them). Pure.

Two things come from GPUSpawner's pods (label ``gpuspawner.io/managed=true``):

* which pod belongs to which hub server, with its profile, GPU type and count,
  so GPU metrics (labelled by pod) can be matched to servers;
* how many GPUs of each type are requested by pods the scheduler could not
  place for lack of GPUs (``PodScheduled`` False, reason ``Unschedulable``,
  message ``... Insufficient nvidia.com/gpu ...``): the pressure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..labels import (
    ANNOTATION_GPU_RESOURCE,
    KUBESPAWNER_ANNOTATION_SERVER,
    KUBESPAWNER_ANNOTATION_USER,
    LABEL_GPU_TYPE,
    LABEL_GPUS,
    LABEL_PROFILE,
    NO_GPU_TYPE,
)
from ..options import parse_count

#: The resource the scheduler names when a pod's annotation does not say.
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class PodInfo:
    name: str
    namespace: str
    user: str
    server: str
    profile: str | None
    gpu_type: str | None
    gpus: int
    phase: str


def _meta(pod: Mapping) -> Mapping:
    return pod.get("metadata") or {}


def pod_info(pod: Mapping) -> PodInfo | None:
    """The server a pod belongs to, or None if it lacks KubeSpawner's user annotation."""
    meta = _meta(pod)
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    user = annotations.get(KUBESPAWNER_ANNOTATION_USER)
    if not user:
        return None
    gpu_type = labels.get(LABEL_GPU_TYPE)
    gpus = parse_count(labels.get(LABEL_GPUS, "0")) or 0
    return PodInfo(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        user=user,
        server=annotations.get(KUBESPAWNER_ANNOTATION_SERVER) or "",
        profile=labels.get(LABEL_PROFILE),
        gpu_type=None if gpu_type in (None, "", NO_GPU_TYPE) else gpu_type,
        gpus=gpus,
        phase=(pod.get("status") or {}).get("phase", ""),
    )


def pods_by_server(pods: Iterable[Mapping]) -> dict[tuple[str, str], PodInfo]:
    """``(user, server name)`` -> the server's pod; pods being deleted are left out."""
    result = {}
    for pod in pods:
        if _meta(pod).get("deletionTimestamp"):
            continue
        info = pod_info(pod)
        if info is not None:
            result[(info.user, info.server)] = info
    return result


def unschedulable_for_gpus(pod: Mapping) -> bool:
    """True when the scheduler left the pod Pending for lack of its GPU resource."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or _meta(pod).get("deletionTimestamp"):
        return False
    resource = (_meta(pod).get("annotations") or {}).get(
        ANNOTATION_GPU_RESOURCE, DEFAULT_GPU_RESOURCE
    )
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
            and f"Insufficient {resource}" in (condition.get("message") or "")
        ):
            return True
    return False


def waiting_gpus(pods: Iterable[Mapping]) -> dict[str, int]:
    """GPU type -> GPUs requested by pods waiting for GPUs of that type."""
    waiting: dict[str, int] = {}
    for pod in pods:
        if not unschedulable_for_gpus(pod):
            continue
        info = pod_info(pod)
        if info is None or info.gpu_type is None or info.gpus <= 0:
            continue
        waiting[info.gpu_type] = waiting.get(info.gpu_type, 0) + info.gpus
    return waiting


def with_pods(servers: Iterable, pods: Mapping[tuple[str, str], PodInfo]) -> list:
    """Servers with pod name, namespace, profile, GPU type and count taken from their pods.

    The pod's labels are what was actually spawned (``user_options`` may be
    empty when the catalog's defaults were used), so they win.
    """
    from dataclasses import replace

    result = []
    for server in servers:
        pod = pods.get(server.key)
        if pod is None:
            result.append(server)
            continue
        result.append(
            replace(
                server,
                pod=pod.name,
                namespace=pod.namespace,
                profile=pod.profile or server.profile,
                gpu_type=pod.gpu_type,
                gpus=pod.gpus,
            )
        )
    return result
