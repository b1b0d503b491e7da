"""Kueue's queue as the culler's demand: the head of each ClusterQueue, as pressure requests (pure).

With ``c.GPUCuller.kueue_cluster_queues`` the culler reads, each pass, the pending
workloads of those ClusterQueues (Kueue's visibility API), the Workload at the head
of each (position 0: the next one Kueue tries to admit), the ClusterQueues' flavors
and the ResourceFlavors' node labels. Here that becomes
:class:`~gpuspawner.culler.policy.Request` entries of source ``kueue``: one per pod
of each pod set of the head asking for a GPU resource, for the GPU type of the
catalog whose node labels (selector and ``In`` affinity terms) the flavor's node
labels satisfy (the flavor Kueue would try first for that pod set:
:func:`gpuspawner.core.kueue.request_flavor`).
Notebooks and Jobs count alike. Only the head counts: freeing for the whole queue
at once would stop more than what the next admission needs.

Every name here comes from other namespaces' objects: it is data, quoted where logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import kueue
from ..core.catalog import GPUType
from ..core.refusals import shown
from .policy import KUEUE_SOURCE, Request

SOURCE = KUEUE_SOURCE
#: The most pods of one head counted: a bound on the pass's work whatever a Workload
#: says (a pod set's ``count`` is anyone's to write); a head asking for more is left out.
MAX_HEAD_PODS = 1000


@dataclass(frozen=True)
class KueueDemand:
    """The requests of the heads of the ClusterQueues, and what could not be counted."""

    requests: tuple[Request, ...] = ()
    #: One sentence per head (or pod set) left out, for the culler's log.
    skipped: tuple[str, ...] = ()


def heads(pending: Mapping[str, Sequence[kueue.PendingEntry]]) -> dict[str, kueue.PendingEntry]:
    """Each ClusterQueue's head: its first pending workload by position (position 0)."""
    found = {}
    for name, entries in pending.items():
        if entries:
            found[name] = min(entries, key=lambda e: e.position_in_cluster_queue)
    return found


def type_selectors(
    gpu_types: Mapping[str, GPUType], resource: str
) -> dict[str, dict[str, str | frozenset[str]]]:
    """The node labels of the catalog's GPU types requested as ``resource``, in catalog order.

    As the hub reads them (:func:`gpuspawner.core.kueue.gpu_type_selector`): the node
    selector and the ``In`` terms of the node affinity.
    """
    return {
        key: kueue.gpu_type_selector(t) for key, t in gpu_types.items() if t.resource == resource
    }


def flavor_type(
    flavor: str,
    resource: str,
    flavor_labels: Mapping[str, Mapping[str, str]],
    gpu_types: Mapping[str, GPUType],
) -> str | None:
    """The catalog GPU type a pod gets asking for ``resource`` in ``flavor``; None: none.

    The type whose node labels (selector and ``In`` affinity terms) the flavor's node
    labels satisfy (:func:`gpuspawner.core.kueue.flavor_gpu_types`); else, where the
    catalog has one type only of that resource and it selects no nodes (a MIG slice),
    that type: the resource alone names it.
    """
    selectors = type_selectors(gpu_types, resource)
    found = kueue.flavor_gpu_types({flavor: flavor_labels.get(flavor, {})}, selectors).get(flavor)
    if found is None and len(selectors) == 1:
        ((key, selector),) = selectors.items()
        if not selector:
            return key
    return found


def _head_name(cluster_queue: str, entry: kueue.PendingEntry) -> str:
    """``the head of 'batch' (Job 'ns/train')`` for the log; the names are quoted data."""
    kind = "notebook" if entry.is_notebook else shown(entry.owner_kind or "Workload")
    return (
        f"the head of ClusterQueue {shown(cluster_queue)} "
        f"({kind} {shown(entry.namespace + '/' + entry.name)})"
    )


def head_requests(
    workload: Any,
    cq: kueue.ClusterQueueStatus,
    flavor_labels: Mapping[str, Mapping[str, str]],
    gpu_types: Mapping[str, GPUType],
    what: str = "the head workload",
) -> tuple[list[Request], list[str]]:
    """The requests of one head Workload in ClusterQueue ``cq``, and why parts were left out.

    One :class:`Request` per pod of each pod set asking for a GPU resource (the
    catalog's own resources, or a known GPU prefix), of that pod's GPUs. A pod set
    whose flavor matches no catalog GPU type cannot be served by stopping notebooks
    of a type, and is left out (said in the second list).
    """
    resources = {t.resource for t in gpu_types.values()}
    requests: list[Request] = []
    skipped: list[str] = []
    pod_sets = kueue.workload_requests(workload)
    if sum(p.count for p in pod_sets) > MAX_HEAD_PODS:
        return [], [f"{what} asks for more than {MAX_HEAD_PODS} pods: not counted"]
    for pod_set in pod_sets:
        for resource, gpus in sorted(pod_set.gpu_resources(resources).items()):
            flavor = kueue.request_flavor(pod_set, resource, cq, flavor_labels)
            gpu_type = (
                flavor_type(flavor, resource, flavor_labels, gpu_types)
                if flavor is not None
                else None
            )
            if gpu_type is None:
                where = (
                    f"flavor {shown(flavor)} matches no catalog GPU type"
                    if flavor is not None
                    else f"ClusterQueue {shown(cq.name)} has no flavor for it"
                )
                skipped.append(
                    f"{what}, pod set {shown(pod_set.name)}, asks for {gpus} "
                    f"{shown(resource)} per pod, and {where}: not counted"
                )
                continue
            request = Request(gpu_type=gpu_type, gpus=gpus, source=SOURCE)
            requests.extend([request] * pod_set.count)
    return requests, skipped


def kueue_demand(
    pending: Mapping[str, Sequence[kueue.PendingEntry]],
    workloads: Mapping[tuple[str, str], Any],
    queues: Mapping[str, kueue.ClusterQueueStatus],
    flavor_labels: Mapping[str, Mapping[str, str]],
    gpu_types: Mapping[str, GPUType],
) -> KueueDemand:
    """The pressure requests of the heads of the ClusterQueues in ``pending``.

    ``pending``: each ClusterQueue's pending entries (the visibility API's);
    ``workloads``: the head Workloads by ``(namespace, name)``, as read (a head
    missing here was admitted or deleted since the list: it counts no more);
    ``queues``: the ClusterQueues by name; ``flavor_labels``: the ResourceFlavors'
    node labels; ``gpu_types``: the catalog's GPU types. A head that holds its quota
    by now (admitted between the two reads) counts for nothing.
    """
    requests: list[Request] = []
    skipped: list[str] = []
    seen: set[tuple[str, str]] = set()
    for name, entry in sorted(heads(pending).items()):
        key = (entry.namespace, entry.name)
        workload = workloads.get(key)
        cq = queues.get(name)
        if key in seen or workload is None or cq is None:
            continue
        seen.add(key)
        if not kueue.workload_is_pending(workload):
            continue
        found, left_out = head_requests(
            workload, cq, flavor_labels, gpu_types, what=_head_name(name, entry)
        )
        requests.extend(found)
        skipped.extend(left_out)
    return KueueDemand(tuple(requests), tuple(skipped))


def head_keys(pending: Mapping[str, Sequence[kueue.PendingEntry]]) -> list[tuple[str, str]]:
    """The ``(namespace, name)`` of each ClusterQueue's head Workload, to read."""
    return sorted({(e.namespace, e.name) for e in heads(pending).values() if e.namespace})
