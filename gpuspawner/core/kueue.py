"""Kueue, the cluster's GPU queue, as gpuspawner reads it (pure: Kueue's objects in, data out).

With ``c.GPUSpawner.kueue_queue`` a notebook's pod carries Kueue's queue label and
waits, gated, until Kueue admits it (see docs/kueue.md). The hub, the culler and
the GPU page read the same Kueue objects (``kueue.x-k8s.io/v1beta2`` ClusterQueues,
ResourceFlavors and Workloads, and the visibility API's pending workloads); they
read them here, so each fact is parsed one way. Every string in them may come from
another namespace: it is data, never trusted for anything but display.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .catalog import Catalog, GPUType, quantity_bytes
from .refusals import REASON_NEVER, Refusal, refuse
from .serverpod import effective_requests, is_gpu_resource
from .stopreasons import PREEMPTED_FOR_FAIR_SHARING, PREEMPTED_FOR_PRIORITY, PREEMPTED_TO_RECLAIM

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSION = "v1beta2"

#: The pod label that puts a pod in a LocalQueue (Kueue's plain-pod integration).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The pod label naming its WorkloadPriorityClass.
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
#: The scheduling gate Kueue's webhook puts on a queued pod until it is admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: The label Kueue puts on a Workload: the uid of the object it was made for (a pod, a Job).
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: The WorkloadPriorityClass of notebooks unless the admin names another.
DEFAULT_PRIORITY_CLASS = "gpuspawner-interactive"
#: The condition Kueue sets on a pod it stops, and the reason it gives when it evicts one.
TERMINATION_CONDITION = "TerminationTarget"
EVICTED_REASON = "WorkloadEvicted"
#: The reason on a plain pod that Kueue preempted. The pod integration is a composable
#: job, so the stop reason is "WorkloadEvicted" + "DueTo" + the Workload's Evicted reason
#: ("Preempted"): pkg/controller/jobframework/reconciler.go, stopJob (Kueue v0.17).
PREEMPTED_REASON = EVICTED_REASON + "DueToPreempted"

#: The longest Kueue message shown to a user (its messages are one line, often long).
MESSAGE_LENGTH = 300


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    if isinstance(value, int):
        # math.isfinite(10**400) raises OverflowError: JSON integers have no bound
        return value
    return int(value) if math.isfinite(value) else default


#: Suffixes below one unit: quantity_bytes rounds them up to whole units (bytes), a CPU's
#: "500m" or "100u" must not become 1.
_SUB_UNITS = {"m": Decimal("1e-3"), "u": Decimal("1e-6"), "n": Decimal("1e-9")}


def amount(value: Any) -> float:
    """A Kubernetes quantity as a number ("4", 4, "500m", "16Gi"); 0 when unreadable."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, (int, float)):
        try:
            number = float(value)  # an int too large for a float raises OverflowError
        except OverflowError:
            return 0.0
        return number if math.isfinite(number) and number > 0 else 0.0
    if not isinstance(value, str) or not value.isascii():
        return 0.0
    text = value.strip()
    try:
        whole = quantity_bytes(text)  # checks the syntax; rounds up to a whole unit
        suffix = text.lstrip("0123456789.")
        if suffix in _SUB_UNITS:
            number = float(Decimal(text[: -len(suffix)]) * _SUB_UNITS[suffix])
        elif not suffix:
            number = float(Decimal(text))  # "0.5" is half a CPU, not one
        else:
            number = float(whole)
    except (ValueError, ArithmeticError):  # OverflowError for "99999…E" is one
        return 0.0
    return number if math.isfinite(number) else 0.0


def _one_line(text: str, limit: int = MESSAGE_LENGTH) -> str:
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


# ---------------------------------------------------------------------------
# pods
# ---------------------------------------------------------------------------


def pod_labels(queue: str, priority_class: str) -> dict[str, str]:
    """The labels that put a notebook's pod in Kueue's LocalQueue ``queue``."""
    found = {QUEUE_LABEL: queue}
    if priority_class:
        found[PRIORITY_CLASS_LABEL] = priority_class
    return found


def queue_of(pod: Mapping[str, Any] | None) -> str:
    """The LocalQueue a pod was put in ("" for a pod Kueue does not manage)."""
    labels = _mapping(_mapping(_mapping(pod).get("metadata")).get("labels"))
    return _text(labels.get(QUEUE_LABEL))


def is_gated(pod: Mapping[str, Any] | None) -> bool:
    """Whether a pod still waits for Kueue's admission (it carries Kueue's scheduling gate)."""
    gates = _list(_mapping(_mapping(pod).get("spec")).get("schedulingGates"))
    return any(gate.get("name") == ADMISSION_GATE for gate in gates)


def termination(pod: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Kueue's ``TerminationTarget`` condition on a pod it stopped, or None."""
    for condition in _list(_mapping(_mapping(pod).get("status")).get("conditions")):
        if condition.get("type") == TERMINATION_CONDITION and condition.get("status") == "True":
            return condition
    return None


def was_preempted(pod: Mapping[str, Any] | None) -> bool:
    """Whether Kueue evicted the pod to give its quota to other work (preemption).

    Kueue v0.17 says so in the reason (``WorkloadEvictedDueToPreempted``); a plain
    ``WorkloadEvicted`` (a job integration that is not composable) counts when its
    message is the preemption's ("Preempted to accommodate a workload ...").
    Evictions for other causes (``WorkloadEvictedDueToPodsReadyTimeout``, a stopped
    queue, node failures) are not preemptions.
    """
    condition = termination(pod)
    if condition is None:
        return False
    reason = condition.get("reason")
    if reason == PREEMPTED_REASON:
        return True
    return reason == EVICTED_REASON and "preempt" in _text(condition.get("message")).lower()


#: The words of Kueue's preemption message for each cause ("Preempted to accommodate a
#: workload (...) due to <words>; preemptor path: ..."): v0.17's
#: ``preemption.HumanReadablePreemptionReasons``, "while borrowing" included in reclaim.
_CAUSE_WORDS = (
    ("due to prioritization in the clusterqueue", PREEMPTED_FOR_PRIORITY),
    ("due to reclamation within the cohort", PREEMPTED_TO_RECLAIM),
    ("due to fair sharing within the cohort", PREEMPTED_FOR_FAIR_SHARING),
)


def preemption_cause(pod: Mapping[str, Any] | None) -> str:
    """Why Kueue preempted the pod: a key of :data:`~gpuspawner.core.stopreasons.PREEMPTION_WORDS`
    (``priority``, ``reclaim``, ``fair-sharing``); "" when unknown or not preempted."""
    if not was_preempted(pod):
        return ""
    message = _text((termination(pod) or {}).get("message")).lower()
    return next((cause for words, cause in _CAUSE_WORDS if words in message), "")


# ---------------------------------------------------------------------------
# the visibility API: pending workloads in order
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PendingEntry:
    """One pending workload as the visibility API lists it (positions start at 0)."""

    namespace: str
    name: str
    owner_kind: str
    owner_uid: str
    local_queue: str
    priority: int
    position_in_cluster_queue: int
    position_in_local_queue: int

    @property
    def is_notebook(self) -> bool:
        """A plain pod's workload (Kueue's pod integration): a notebook, not a Job."""
        return self.owner_kind == "Pod"


def pending_page_length(summary: Any) -> int:
    """How many items a ``PendingWorkloadsSummary`` holds, readable or not (for paging)."""
    items = _mapping(summary).get("items")
    return len(items) if isinstance(items, list) else 0


def pending_entries(summary: Any) -> list[PendingEntry]:
    """The items of a ``PendingWorkloadsSummary``, by position in the ClusterQueue.

    Items without a name or a position are left out rather than guessed.
    """
    entries = []
    for item in _list(_mapping(summary).get("items")):
        meta = _mapping(item.get("metadata"))
        owners = _list(meta.get("ownerReferences"))
        owner = owners[0] if owners else {}
        position = item.get("positionInClusterQueue")
        if (
            not _text(meta.get("name"))
            or isinstance(position, bool)
            or not isinstance(position, int)
        ):
            continue
        entries.append(
            PendingEntry(
                namespace=_text(meta.get("namespace")),
                name=_text(meta.get("name")),
                owner_kind=_text(owner.get("kind")),
                owner_uid=_text(owner.get("uid")),
                local_queue=_text(item.get("localQueueName")),
                priority=_int(item.get("priority")),
                position_in_cluster_queue=max(position, 0),
                position_in_local_queue=max(_int(item.get("positionInLocalQueue")), 0),
            )
        )
    return sorted(entries, key=lambda e: e.position_in_cluster_queue)


# ---------------------------------------------------------------------------
# ClusterQueues and ResourceFlavors
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FlavorQuota:
    """One resource of one flavor in a ClusterQueue: its quota and what is taken of it."""

    flavor: str
    resource: str
    nominal: float
    #: How much more it may borrow from its cohort (None: no limit).
    borrowing_limit: float | None
    #: How much of its quota it may lend (None: all of it).
    lending_limit: float | None
    #: Held by admitted workloads (``status.flavorsUsage``).
    used: float = 0.0
    #: Reserved by workloads with quota (``status.flavorsReservation``).
    reserved: float = 0.0


@dataclass(frozen=True)
class ClusterQueueStatus:
    """A ClusterQueue's quotas in order (the order Kueue tries flavors) and its counts."""

    name: str
    cohort: str
    quotas: tuple[FlavorQuota, ...]
    pending: int = 0
    admitted: int = 0
    reserving: int = 0

    def quota(self, flavor: str, resource: str) -> FlavorQuota | None:
        for quota in self.quotas:
            if quota.flavor == flavor and quota.resource == resource:
                return quota
        return None

    def flavors_for(self, resource: str) -> list[str]:
        """The flavors that cover ``resource``, in the order Kueue tries them."""
        return [q.flavor for q in self.quotas if q.resource == resource]


def _usage(status: Mapping[str, Any], field: str) -> dict[tuple[str, str], float]:
    found: dict[tuple[str, str], float] = {}
    for flavor in _list(status.get(field)):
        for resource in _list(flavor.get("resources")):
            key = (_text(flavor.get("name")), _text(resource.get("name")))
            found[key] = amount(resource.get("total"))
    return found


def cluster_queue_status(cq: Any) -> ClusterQueueStatus | None:
    """A ClusterQueue object as data; None when it has no name."""
    cq = _mapping(cq)
    name = _text(_mapping(cq.get("metadata")).get("name"))
    if not name:
        return None
    spec, status = _mapping(cq.get("spec")), _mapping(cq.get("status"))
    used, reserved = _usage(status, "flavorsUsage"), _usage(status, "flavorsReservation")
    quotas = []
    for group in _list(spec.get("resourceGroups")):
        for flavor in _list(group.get("flavors")):
            flavor_name = _text(flavor.get("name"))
            for resource in _list(flavor.get("resources")):
                resource_name = _text(resource.get("name"))
                if not flavor_name or not resource_name:
                    continue
                key = (flavor_name, resource_name)
                quotas.append(
                    FlavorQuota(
                        flavor=flavor_name,
                        resource=resource_name,
                        nominal=amount(resource.get("nominalQuota")),
                        borrowing_limit=(
                            amount(resource["borrowingLimit"])
                            if resource.get("borrowingLimit") is not None
                            else None
                        ),
                        lending_limit=(
                            amount(resource["lendingLimit"])
                            if resource.get("lendingLimit") is not None
                            else None
                        ),
                        used=used.get(key, 0.0),
                        reserved=reserved.get(key, 0.0),
                    )
                )
    return ClusterQueueStatus(
        name=name,
        cohort=_text(spec.get("cohortName")) or _text(spec.get("cohort")),
        quotas=tuple(quotas),
        pending=max(_int(status.get("pendingWorkloads")), 0),
        admitted=max(_int(status.get("admittedWorkloads")), 0),
        reserving=max(_int(status.get("reservingWorkloads")), 0),
    )


def flavor_node_labels(flavors: Iterable[Any]) -> dict[str, dict[str, str]]:
    """ResourceFlavor objects as ``{name: nodeLabels}``."""
    found: dict[str, dict[str, str]] = {}
    for flavor in flavors if isinstance(flavors, Iterable) else ():
        flavor = _mapping(flavor)
        name = _text(_mapping(flavor.get("metadata")).get("name"))
        if not name:
            continue
        labels = _mapping(_mapping(flavor.get("spec")).get("nodeLabels"))
        found[name] = {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
    return found


#: A GPU type's node labels as :func:`flavor_gpu_types` compares them: a value, or the values allowed.
TypeSelector = Mapping[str, "str | Collection[str]"]


def gpu_type_selector(gpu_type: GPUType) -> dict[str, str | frozenset[str]]:
    """A GPU type's node labels: its node selector and its ``In`` affinity terms."""
    wanted: dict[str, str | frozenset[str]] = dict(gpu_type.node_selector)
    for expression in gpu_type.node_affinity:
        values = expression.get("values") or []
        if expression.get("operator") == "In" and isinstance(expression.get("key"), str):
            wanted[expression["key"]] = frozenset(str(v) for v in values)
    return wanted


def catalog_type_selectors(catalog: Catalog) -> dict[str, dict[str, str | frozenset[str]]]:
    """Each catalog GPU type's node labels (:func:`gpu_type_selector`), in catalog order."""
    return {key: gpu_type_selector(t) for key, t in catalog.gpu_types.items()}


def _label_matches(have: str | None, wanted: str | Collection[str]) -> bool:
    if have is None:
        return False
    return have == wanted if isinstance(wanted, str) else have in wanted


def flavor_gpu_types(
    flavor_labels: Mapping[str, Mapping[str, str]],
    type_selectors: Mapping[str, TypeSelector],
) -> dict[str, str]:
    """Each flavor's catalog GPU type: the first type whose node labels the flavor's labels satisfy.

    A type without node labels matches no flavor (it would match them all);
    flavors that match no type are left out.
    """
    found = {}
    for flavor, labels in flavor_labels.items():
        for type_key, wanted in type_selectors.items():
            if wanted and all(_label_matches(labels.get(k), v) for k, v in wanted.items()):
                found[flavor] = type_key
                break
    return found


def max_admissible(
    queues: Iterable[ClusterQueueStatus], name: str, flavor: str, resource: str
) -> float | None:
    """The most of ``resource`` in ``flavor`` the ClusterQueue ``name`` can ever admit at once.

    Its nominal quota plus what it may borrow from the other ClusterQueues of its
    cohort (each lends its lending limit, else its whole quota), within its own
    borrowing limit. None when the queue is unknown or does not cover the pair.
    """
    queues = list(queues)
    own = next((q for q in queues if q.name == name), None)
    if own is None:
        return None
    quota = own.quota(flavor, resource)
    if quota is None:
        return None
    lendable = 0.0
    if own.cohort:
        for other in queues:
            if other.name == name or other.cohort != own.cohort:
                continue
            theirs = other.quota(flavor, resource)
            if theirs is not None:
                lent = theirs.nominal if theirs.lending_limit is None else theirs.lending_limit
                lendable += min(lent, theirs.nominal)
    if quota.borrowing_limit is not None:
        lendable = min(lendable, quota.borrowing_limit)
    return quota.nominal + lendable


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PodSetRequest:
    """What one pod set of a Workload asks for, per pod, and how many pods."""

    name: str
    count: int
    resources: dict[str, float]
    node_selector: dict[str, str]

    def gpu_resources(self, extra: Iterable[str] = ()) -> dict[str, int]:
        """The GPU resources a pod asks for, as whole counts (``serverpod.is_gpu_resource``)."""
        extra = tuple(extra)
        return {
            name: int(value)
            for name, value in self.resources.items()
            if is_gpu_resource(name, extra) and value >= 1
        }


def _container_resources(container: Mapping[str, Any]) -> dict[str, float]:
    """A container's requests, its limits where it requests nothing (Kubernetes' defaulting)."""
    resources = _mapping(container.get("resources"))
    found = {str(name): amount(value) for name, value in _mapping(resources.get("limits")).items()}
    found.update(
        {str(name): amount(value) for name, value in _mapping(resources.get("requests")).items()}
    )
    return found


def pod_resources(pod_spec: Mapping[str, Any]) -> dict[str, float]:
    """A pod's effective request, every resource, as Kueue counts it (:func:`effective_requests`)."""
    pod_spec = _mapping(pod_spec)
    overhead = {str(k): amount(v) for k, v in _mapping(pod_spec.get("overhead")).items()}
    return effective_requests(pod_spec, _container_resources, overhead)


def workload_requests(workload: Any) -> list[PodSetRequest]:
    """The pod sets of a Workload: per pod resources, pod count, node selector."""
    requests = []
    for pod_set in _list(_mapping(_mapping(workload).get("spec")).get("podSets")):
        template_spec = _mapping(_mapping(pod_set.get("template")).get("spec"))
        selector = _mapping(template_spec.get("nodeSelector"))
        requests.append(
            PodSetRequest(
                name=_text(pod_set.get("name")),
                count=max(_int(pod_set.get("count"), 1), 0),
                resources=pod_resources(template_spec),
                node_selector={
                    k: v for k, v in selector.items() if isinstance(k, str) and isinstance(v, str)
                },
            )
        )
    return requests


def _condition(workload: Any, kind: str) -> Mapping[str, Any] | None:
    status = _mapping(_mapping(workload).get("status"))
    for condition in _list(status.get("conditions")):
        if condition.get("type") == kind:
            return condition
    return None


def workload_is_pending(workload: Any) -> bool:
    """Whether a Workload waits for quota: no quota reserved, not finished."""
    reserved = _condition(workload, "QuotaReserved")
    finished = _condition(workload, "Finished")
    if finished is not None and finished.get("status") == "True":
        return False
    return reserved is None or reserved.get("status") != "True"


def blocking_reason(workload: Any) -> str:
    """Why Kueue has not admitted a Workload yet, as it says it (one line); "" when unknown."""
    reserved = _condition(workload, "QuotaReserved")
    if reserved is None or reserved.get("status") == "True":
        return ""
    return _one_line(_text(reserved.get("message")))


def workloads_selector(owner_uids: Iterable[str]) -> str:
    """The label selector of the Workloads made for these pods (or Jobs); "" for none.

    Uids are the API server's (hex and dashes); one that is no valid label value
    (letters, digits, ``-``, ``_``, ``.``, at most 63) is left out, so no text reaches
    the selector's syntax.
    """
    uids = sorted(
        {
            u
            for u in owner_uids
            if 0 < len(u) <= 63 and u.isascii() and all(c.isalnum() or c in "-_." for c in u)
        }
    )
    return f"{JOB_UID_LABEL} in ({','.join(uids)})" if uids else ""


def workload_owner_uid(workload: Any) -> str:
    """The uid of the object a Workload was made for (a notebook's pod, a Job)."""
    owners = _list(_mapping(_mapping(workload).get("metadata")).get("ownerReferences"))
    return _text(owners[0].get("uid")) if owners else ""


def request_flavor(
    request: PodSetRequest,
    resource: str,
    cq: ClusterQueueStatus,
    flavor_labels: Mapping[str, Mapping[str, str]],
) -> str | None:
    """The flavor Kueue would try first for ``resource``: the first one in the ClusterQueue's
    order that covers it and whose node labels the pod's node selector does not contradict."""
    for flavor in cq.flavors_for(resource):
        labels = flavor_labels.get(flavor, {})
        if all(request.node_selector.get(k, v) == v for k, v in labels.items()):
            return flavor
    return None


# ---------------------------------------------------------------------------
# a notebook's place, for its progress page
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a notebook's workload waits (positions start at 1)."""

    local_queue: str
    cluster_queue: str
    position_in_local_queue: int
    waiting_in_local_queue: int
    position_in_cluster_queue: int
    ahead_notebooks: int
    ahead_jobs: int
    blocked_by: str = ""


def place_of(
    owner_uid: str,
    local: list[PendingEntry],
    cluster: list[PendingEntry] | None,
    cluster_queue: str,
    blocked_by: str = "",
) -> Place | None:
    """The place of the workload made for the pod ``owner_uid``; None when it is not listed.

    ``cluster`` (the whole ClusterQueue, other namespaces too) gives what is ahead as
    notebooks and jobs, counted, never named; without it only the LocalQueue's
    entries are counted.
    """
    index = next((i for i, e in enumerate(local) if owner_uid and e.owner_uid == owner_uid), None)
    if index is None:
        return None
    mine = local[index]
    pool = cluster if cluster is not None else local
    in_pool = next((e for e in pool if e.owner_uid == owner_uid), mine)
    ahead = [e for e in pool if e.position_in_cluster_queue < in_pool.position_in_cluster_queue]
    return Place(
        local_queue=mine.local_queue,
        cluster_queue=cluster_queue,
        # Counted here, not Kueue's own position: it lists a LocalQueue's name in
        # every namespace (v0.17), and the caller keeps its own namespace's entries.
        position_in_local_queue=index + 1,
        waiting_in_local_queue=len(local),
        position_in_cluster_queue=in_pool.position_in_cluster_queue + 1,
        ahead_notebooks=sum(1 for e in ahead if e.is_notebook),
        ahead_jobs=sum(1 for e in ahead if not e.is_notebook),
        blocked_by=blocked_by,
    )


def _counted(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def progress_message(place: Place | None, gpus: int, gpu_name: str) -> str:
    """The progress page's line while a notebook waits in Kueue."""
    what = f"{gpus} {gpu_name} GPU{'' if gpus == 1 else 's'}"
    if place is None:
        return f"Waiting in the cluster's GPU queue for {what}."
    if place.ahead_notebooks or place.ahead_jobs:
        ahead = (
            f"ahead of it: {_counted(place.ahead_notebooks, 'notebook', 'notebooks')} and "
            f"{_counted(place.ahead_jobs, 'job', 'jobs')}"
        )
    else:
        ahead = "nothing ahead of it"
    message = (
        f"Waiting in the cluster's GPU queue for {what}: "
        f"{place.position_in_local_queue} of {place.waiting_in_local_queue} in this hub's queue, "
        f"{place.position_in_cluster_queue} in the {place.cluster_queue!s} queue ({ahead})."
    )
    if place.blocked_by:
        message += f" Kueue: {place.blocked_by}"
    return message


def quota_refusal(
    *,
    local_queue: str,
    cluster_queue: str,
    queues: Iterable[ClusterQueueStatus],
    flavors: Iterable[str],
    resource: str,
    gpus: int,
    gpu_name: str,
) -> Refusal | None:
    """The refusal of a request no flavor's quota can ever hold, else None.

    ``flavors``: those serving the request's GPU type (:func:`flavor_gpu_types`).
    Quota is what Kueue admits against: a request larger than the ClusterQueue's
    quota plus what it may borrow would wait for ever.
    """
    queues = list(queues)
    largest = [
        most
        for flavor in flavors
        if (most := max_admissible(queues, cluster_queue, flavor, resource)) is not None
    ]
    if not largest:
        return refuse(REASON_NEVER, "quota-none", "ask-admin", queue=local_queue, gpu_type=gpu_name)
    most = int(max(largest))
    if gpus <= most:
        return None
    plural = "" if gpus == 1 else "s"
    return refuse(
        REASON_NEVER,
        "quota-too-small",
        "ask-for-fewer",
        queue=local_queue,
        request=f"{gpus} {gpu_name} GPU{plural}",
        largest=most,
    )
