"""Free GPUs per type and per node, from Node and Pod objects (pure: data in, data out).

The watches in :mod:`gpuspawner.inventory.reflectors` feed raw API objects
into an :class:`Inventory`. It keeps only what the arithmetic needs (a few
hundred bytes per object, so the hub's memory stays flat as the cluster
grows) and keeps the GPUs requested on each node up to date as pods come and
go, so that answering "how many A100s are free?" walks the nodes, never the
pods.

The arithmetic follows the scheduler's:

- a node counts only while it is Ready and not cordoned (``spec.unschedulable``);
- a GPU type is a resource name plus the node selector, required node
  affinity and tolerations of the catalog entry, so a node of another model,
  or with a taint the type does not tolerate, is not counted for it;
- a pod holds GPUs on its node from the moment it is bound
  (``spec.nodeName``) until it finishes (phase Succeeded/Failed) or is being
  deleted (``metadata.deletionTimestamp``: its GPUs are free within seconds);
- a pod's request of a resource is the larger of what its app containers need
  together (plus restartable "sidecar" init containers) and what its largest
  init container needs, plus ``spec.overhead``, as in the scheduler's
  ``computePodResourceRequest``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.availability import Availability, NodeFigures
from ..core.serverpod import effective_requests, is_gpu_resource, pod_is_active

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?)([kMGTPE]?|[KMGTPE]i|m)?$")
_SUFFIX = {
    "": 1,
    "m": 0.001,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(value: Any) -> int:
    """A device count from a Kubernetes quantity ("4", 4, "1k"); 0 when unreadable.

    Extended resources are whole numbers, so fractions are rounded down.
    """
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, float)):
        return max(int(value), 0)
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return 0
    return int(float(match.group(1)) * _SUFFIX[match.group(2) or ""])


# ---------------------------------------------------------------------------
# compact records
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What the inventory keeps of a Node."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect), NoSchedule/NoExecute only
    allocatable: Mapping[str, int]  # accelerator resources only
    cordoned: bool
    ready: bool

    @property
    def usable(self) -> bool:
        return self.ready and not self.cordoned

    @property
    def state(self) -> str:
        """ "ready", "cordoned" or "not ready" (for the admin's eyes)."""
        if not self.ready:
            return "not ready"
        return "cordoned" if self.cordoned else "ready"


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the inventory keeps of a Pod that requests accelerators."""

    key: str  # namespace/name
    node: str  # "" while not bound
    requests: Mapping[str, int]
    created: str  # creationTimestamp (RFC 3339 sorts as text)
    uid: str = ""


def node_record(node: Mapping[str, Any], extra_resources: Iterable[str] = ()) -> NodeRecord:
    """The compact record of a Node object (API JSON)."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    extra = frozenset(extra_resources)
    allocatable = {
        name: parse_quantity(value)
        for name, value in (status.get("allocatable") or {}).items()
        if is_gpu_resource(name, extra)
    }
    taints = tuple(
        (t.get("key", ""), t.get("value", "") or "", t.get("effect", ""))
        for t in spec.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return NodeRecord(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        taints=taints,
        allocatable={k: v for k, v in allocatable.items() if v > 0},
        cordoned=bool(spec.get("unschedulable")),
        ready=ready,
    )


def _container_requests(container: Mapping[str, Any], extra: frozenset[str]) -> dict[str, int]:
    resources = container.get("resources") or {}
    # The API server defaults an extended resource's request to its limit;
    # objects that were never stored (tests, dry runs) may have only the limit.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {
        name: parse_quantity(value)
        for name, value in merged.items()
        if is_gpu_resource(name, extra) and parse_quantity(value) > 0
    }


def pod_requests(pod: Mapping[str, Any], extra_resources: Iterable[str] = ()) -> dict[str, int]:
    """The accelerators a pod occupies on its node, as the scheduler computes them."""
    spec = pod.get("spec") or {}
    extra = frozenset(extra_resources)
    overhead = {
        k: parse_quantity(v)
        for k, v in (spec.get("overhead") or {}).items()
        if is_gpu_resource(k, extra)
    }
    total = effective_requests(spec, lambda c: _container_requests(c, extra), overhead)
    return {k: v for k, v in total.items() if v > 0}


def pod_record(pod: Mapping[str, Any], extra_resources: Iterable[str] = ()) -> PodRecord | None:
    """The compact record of a Pod, or None if it holds no accelerators (or no longer will)."""
    if not pod_is_active(pod):
        return None
    requests = pod_requests(pod, extra_resources)
    if not requests:
        return None
    meta = pod.get("metadata") or {}
    return PodRecord(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        node=(pod.get("spec") or {}).get("nodeName") or "",
        requests=requests,
        created=meta.get("creationTimestamp") or "",
        uid=meta.get("uid", ""),
    )


# ---------------------------------------------------------------------------
# which nodes serve a GPU type
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Demand:
    """Where pods of one GPU type may run: a resource plus node selection and tolerations.

    Built from a catalog GPU type with :func:`demand_for`; ``key`` and
    ``display_name`` only label the result.
    """

    key: str
    resource: str
    display_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()


def demand_for(
    gpu_type: Any,
    extra_node_selector: Mapping[str, str] | None = None,
    extra_tolerations: Sequence[Mapping[str, Any]] = (),
) -> Demand:
    """The :class:`Demand` of a catalog :class:`~gpuspawner.core.catalog.GPUType`.

    ``extra_node_selector``/``extra_tolerations`` are the admin's KubeSpawner
    settings every pod also gets.
    """
    return Demand(
        key=gpu_type.key,
        resource=gpu_type.resource,
        display_name=gpu_type.display_name,
        node_selector={**(extra_node_selector or {}), **dict(gpu_type.node_selector)},
        node_affinity=tuple(gpu_type.node_affinity),
        tolerations=tuple(gpu_type.tolerations) + tuple(extra_tolerations),
    )


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = expr.get("key", "")
    op = expr.get("operator", "")
    values = [str(v) for v in expr.get("values") or []]
    present = key in labels
    value = labels.get(key)
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            have, bound = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t.get("effect") != effect:
            continue
        operator = t.get("operator") or "Equal"
        if operator == "Exists":
            if not t.get("key") or t.get("key") == key:
                return True
        elif t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


#: Taints the node lifecycle controller adds to cordoned and NotReady nodes; they
#: go when the node comes back, so they do not decide which types a node serves.
LIFECYCLE_TAINT_PREFIX = "node.kubernetes.io/"


def serves(node: NodeRecord, demand: Demand) -> bool:
    """Whether pods of the demand could be placed on the node once it is usable (free or not)."""
    if node.allocatable.get(demand.resource, 0) <= 0:
        return False
    if any(node.labels.get(k) != v for k, v in demand.node_selector.items()):
        return False
    if not all(_expression_matches(e, node.labels) for e in demand.node_affinity):
        return False
    return all(
        _tolerates(demand.tolerations, taint)
        for taint in node.taints
        if not (taint[0].startswith(LIFECYCLE_TAINT_PREFIX) and not node.usable)
    )


# ---------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------


class Inventory:
    """Accelerator nodes and the pods holding them, kept up to date event by event.

    Not thread-safe: the hub updates and reads it on its one event loop.
    """

    def __init__(self, extra_resources: Iterable[str] = ()):
        self.extra_resources = frozenset(extra_resources)
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        # node name -> resource -> GPUs requested by bound pods
        self._requested: dict[str, dict[str, int]] = {}
        # resource -> number of unbound pods requesting it
        self._pending: dict[str, int] = {}
        #: Bumped on every change that can alter a figure; readers cache on it.
        self.generation = 0
        self._cache: dict[str, Availability] = {}
        self._cache_generation = -1
        # Which nodes serve a demand changes only with the nodes, not with pods.
        self._nodes_generation = 0
        self._serving: dict[str, list[NodeRecord]] = {}
        self._serving_generation = -1
        #: The one namespace whose pods are fed in ("": every namespace); the figures carry it.
        self.pods_namespace = ""

    # -- updates --------------------------------------------------------

    def count_pods_of(self, namespace: str) -> None:
        """Say whose pods are fed in: one namespace's, or every namespace's ("")."""
        if namespace != self.pods_namespace:
            self.pods_namespace = namespace
            self.generation += 1

    def set_node(self, node: Mapping[str, Any]) -> None:
        record = node_record(node, self.extra_resources)
        if not record.allocatable:
            # A node without accelerators cannot change a figure.
            self.remove_node(record.name)
            return
        if self.nodes.get(record.name) != record:
            self.nodes[record.name] = record
            self.generation += 1
            self._nodes_generation += 1

    def remove_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self.generation += 1
            self._nodes_generation += 1

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """After a full list: exactly these nodes."""
        self.replace_node_records(node_record(n, self.extra_resources) for n in nodes)

    def replace_node_records(self, records: Iterable[NodeRecord]) -> None:
        """After a full list read page by page into records: exactly these nodes."""
        self.nodes = {r.name: r for r in records if r.allocatable}
        self.generation += 1
        self._nodes_generation += 1

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        record = pod_record(pod, self.extra_resources)
        old = self.pods.get(key)
        if old == record:
            return
        if old is not None:
            self._account(old, -1)
        if record is None:
            self.pods.pop(key, None)
        else:
            self.pods[key] = record
            self._account(record, +1)
        self.generation += 1

    def remove_pod(self, namespace: str, name: str) -> None:
        old = self.pods.pop(f"{namespace}/{name}", None)
        if old is not None:
            self._account(old, -1)
            self.generation += 1

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """After a full list: exactly these pods."""
        self.replace_pod_records(pod_record(p, self.extra_resources) for p in pods)

    def replace_pod_records(self, records: Iterable[PodRecord | None]) -> None:
        """After a full list read page by page into records: exactly these pods."""
        self.pods = {}
        self._requested = {}
        self._pending = {}
        for record in records:
            if record is not None:
                self.pods[record.key] = record
                self._account(record, +1)
        self.generation += 1

    def _account(self, record: PodRecord, sign: int) -> None:
        if record.node:
            per_node = self._requested.setdefault(record.node, {})
            for name, value in record.requests.items():
                per_node[name] = per_node.get(name, 0) + sign * value
                if per_node[name] <= 0:
                    del per_node[name]
            if not per_node:
                del self._requested[record.node]
        else:
            for name in record.requests:
                self._pending[name] = self._pending.get(name, 0) + sign
                if self._pending[name] <= 0:
                    del self._pending[name]

    # -- figures --------------------------------------------------------

    def requested_on(self, node: str, resource: str) -> int:
        return self._requested.get(node, {}).get(resource, 0)

    def availability(self, demand: Demand) -> Availability:
        """The figures of one GPU type (cached until the next change)."""
        if self._cache_generation != self.generation:
            self._cache = {}
            self._cache_generation = self.generation
        cache_key = repr(demand)
        cached = self._cache.get(cache_key)
        if cached is None:
            cached = self._cache[cache_key] = self._compute(demand, cache_key)
        return cached

    def _serving_nodes(self, demand: Demand, cache_key: str) -> list[NodeRecord]:
        if self._serving_generation != self._nodes_generation:
            self._serving = {}
            self._serving_generation = self._nodes_generation
        found = self._serving.get(cache_key)
        if found is None:
            found = self._serving[cache_key] = [n for n in self.nodes.values() if serves(n, demand)]
        return found

    def _compute(self, demand: Demand, cache_key: str = "") -> Availability:
        usable: list[NodeFigures] = []
        excluded: list[NodeFigures] = []
        for node in self._serving_nodes(demand, cache_key or repr(demand)):
            figures = NodeFigures(
                node=node.name,
                allocatable=node.allocatable[demand.resource],
                requested=self.requested_on(node.name, demand.resource),
                state=node.state,
            )
            (usable if node.usable else excluded).append(figures)
        return Availability(
            key=demand.key,
            resource=demand.resource,
            display_name=demand.display_name,
            nodes=tuple(sorted(usable, key=lambda n: n.node)),
            excluded=tuple(sorted(excluded, key=lambda n: n.node)),
            pending=self._pending.get(demand.resource, 0),
            pods_namespace=self.pods_namespace,
        )

    def by_resource(self) -> dict[str, Availability]:
        """Figures per resource name over every usable node (no type's node selection)."""
        resources = sorted({r for n in self.nodes.values() for r in n.allocatable})
        return {r: self.availability(Demand(key=r, resource=r, display_name=r)) for r in resources}

    def pending_before(self, resource: str, created: str, key: str = "") -> int:
        """Unbound pods requesting ``resource`` created before ``created`` (queue place)."""
        return sum(
            1
            for p in self.pods.values()
            if not p.node and resource in p.requests and (p.created, p.key) < (created, key)
        )


def inventory_from(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    extra_resources: Iterable[str] = (),
) -> Inventory:
    """An :class:`Inventory` from lists of Node and Pod objects."""
    inventory = Inventory(extra_resources)
    inventory.replace_nodes(nodes)
    inventory.replace_pods(pods)
    return inventory
