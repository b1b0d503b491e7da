"""Read the culler's facts from GPUSpawner's pods (JSON as the API returns them). Pure.

What comes from GPUSpawner's pods (label ``gpuspawner.io/managed=true``),
read with :class:`~gpuspawner.core.serverpod.ServerPod`:

* which pod belongs to which hub server, with its profile, GPU type and count,
  so GPU metrics (labelled by pod) can be matched to servers;
* which node each server's pod runs on, so pressure mode frees GPUs where a
  waiting request can use them;
* the idle timeout its user chose on the form, and until when its user keeps it;
* the culler's own warnings on the pods (``gpuspawner.io/cull-warning``), so
  that a restarted culler knows which servers were warned and when;
* the pods the scheduler could not place for lack of GPUs (``PodScheduled``
  False, reason ``Unschedulable``, message ``... Insufficient nvidia.com/gpu
  ...``): one waiting request each; pods Kueue still gates wait in its queue
  instead, and are not counted here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..core import kueue, labels
from ..core.serverpod import ServerPod, server_pods
from ..core.stopreasons import CullWarning
from .policy import Request


def pods_by_server(pods: Iterable[Mapping]) -> dict[tuple[str, str], ServerPod]:
    """``(user, server name)`` -> the server's pod; pods being deleted or without a user are left out."""
    return {pod.key: pod for pod in server_pods(pods) if pod.user and not pod.deleting}


def warnings_on_pods(pods: Iterable[Mapping]) -> dict[tuple[str, str], CullWarning | None]:
    """``(user, server name)`` -> the cull warning its pod carries (None: one that does not parse).

    Servers whose pod carries no ``gpuspawner.io/cull-warning`` are left out;
    so are pods being deleted or without a user, as in :func:`pods_by_server`.
    """
    result = {}
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if labels.ANNOTATION_CULL_WARNING not in annotations:
            continue
        server = ServerPod.from_pod(pod)
        if server.user and not server.deleting:
            result[server.key] = server.cull_warning
    return result


def waiting_requests(pods: Iterable[Mapping]) -> list[Request]:
    """One pending :class:`Request` per pod waiting for GPUs of its type.

    A pod Kueue still gates is not one: it waits in Kueue's queue, and is counted
    there when it heads it (:mod:`gpuspawner.culler.kueuedemand`), never twice.
    """
    return [
        Request(gpu_type=pod.gpu_type, gpus=pod.gpus, source="pending")
        for pod in server_pods(pods)
        if pod.user
        and pod.gpu_type is not None
        and pod.gpus > 0
        and pod.waiting_for_gpus
        and not kueue.is_gated(pod.raw)
    ]


def with_pods(servers: Iterable, pods: Mapping[tuple[str, str], ServerPod]) -> list:
    """Servers with pod name, namespace, profile, GPU type and count, the user's idle
    timeout and keep taken from their pods.

    The pod's labels are what was actually spawned (``user_options`` may be
    empty when the catalog's defaults were used), so they win.
    """
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
                node=pod.node or None,
                idle_timeout=pod.idle_timeout,
                keep_until=pod.keep_until,
            )
        )
    return result
