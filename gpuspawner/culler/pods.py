"""Read the culler's facts from GPUSpawner's pods (JSON as the API returns them). Pure.

Two things come from GPUSpawner's pods (label ``gpuspawner.io/managed=true``),
read with :class:`~gpuspawner.serverpod.ServerPod`:

* which pod belongs to which hub server, with its profile, GPU type and count,
  so GPU metrics (labelled by pod) can be matched to servers;
* how many GPUs of each type are requested by pods the scheduler could not
  place for lack of GPUs (``PodScheduled`` False, reason ``Unschedulable``,
  message ``... Insufficient nvidia.com/gpu ...``): the pressure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..serverpod import ServerPod, server_pods


def pods_by_server(pods: Iterable[Mapping]) -> dict[tuple[str, str], ServerPod]:
    """``(user, server name)`` -> the server's pod; pods being deleted or without a user are left out."""
    return {pod.key: pod for pod in server_pods(pods) if pod.user and not pod.deleting}


def waiting_gpus(pods: Iterable[Mapping]) -> dict[str, int]:
    """GPU type -> GPUs requested by pods waiting for GPUs of that type."""
    waiting: dict[str, int] = {}
    for pod in server_pods(pods):
        if pod.user and pod.gpu_type is not None and pod.waiting_for_gpus:
            waiting[pod.gpu_type] = waiting.get(pod.gpu_type, 0) + pod.gpus
    return waiting


def with_pods(servers: Iterable, pods: Mapping[tuple[str, str], ServerPod]) -> list:
    """Servers with pod name, namespace, profile, GPU type and count taken from their pods.

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
            )
        )
    return result
