"""The GPU pool as an admin sees it: tables built from plain data (pure, no I/O).

In: the hub's user models (``GET /users``), GPUSpawner's pods, the figures
per GPU type (:class:`~gpuspawner.inventory.model.Availability`), the catalog
(for display names and limits) and, when Prometheus is configured, the GPU
utilisation per pod; with ``kueue_cluster_queues`` set, Kueue's ClusterQueues,
ResourceFlavors and pending Workloads (:class:`KueueData`). Out: a
:class:`PoolReport`, which the admin page renders as HTML, ``gpuspawner status``
as text, and both as JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..core import kueue
from ..core.catalog import Catalog
from ..core.limits import effective_limit, format_units
from ..core.options import OPTION_GPU_TYPE, OPTION_GPUS, OPTION_PROFILE, parse_count
from ..core.podspec import gpu_resource_names
from ..core.refusals import escape_unprintable, listing, shown
from ..core.serverpod import ServerPod, is_gpu_resource, server_pods
from ..inventory.model import Availability


@dataclass(frozen=True)
class TypeRow:
    """One GPU type's figures across the cluster."""

    key: str
    display_name: str
    allocatable: int
    in_use: int
    free: int
    waiting: int  # GPUs requested by this hub's pods not yet placed on a node
    nodes: int
    excluded_nodes: int = 0


@dataclass(frozen=True)
class ServerRow:
    """One server of a user."""

    user: str
    name: str  # "" for the default server
    state: str  # "running", "starting", "stopping", "pod only"
    profile: str | None
    gpu_type: str | None
    gpu_type_name: str
    gpus: int
    node: str
    pod: str
    namespace: str
    age: float | None  # seconds since the server (or its pod) started
    idle: float | None  # seconds since the hub's last activity
    utilisation: float | None  # 0..1, mean over the window, when Prometheus is configured

    @property
    def label(self) -> str:
        return self.name or "default"


@dataclass(frozen=True)
class UserRow:
    """A user, their servers, and the limit in effect with the rule it came from."""

    name: str
    admin: bool
    groups: tuple[str, ...] | None  # None: the hub did not show them
    servers: tuple[ServerRow, ...]
    gpus_used: float  # GPU units (count × weight) of their GPU servers
    limit: float | None  # None: unlimited
    limit_per_type: Mapping[str, float | None]
    rule: str
    limit_text: str
    image_text: str = ""  # which images the user may use, and why not the others


@dataclass(frozen=True)
class KueueQueueRow:
    """One GPU resource of one flavor in a Kueue ClusterQueue's quota, and the work waiting for it.

    Quantities are in the resource's units (GPUs, MIG slices).
    """

    cluster_queue: str
    cohort: str  # "" when the ClusterQueue is in no cohort
    flavor: str
    gpu_type: str  # the catalog's GPU type the flavor's nodes are; "" when none matches
    gpu_type_name: str  # its display name, else ""
    resource: str
    nominal: float
    borrowing_limit: float | None  # None: it may borrow whatever its cohort lends
    in_use: float  # admitted workloads (status.flavorsUsage)
    reserved: float  # quota reserved, admitted or not yet (status.flavorsReservation)
    pending_workloads: int  # the ClusterQueue's, every flavor (status.pendingWorkloads)
    # the GPUs of this resource the pending Workloads read would take in this flavor; None: not read
    pending_gpus: float | None
    # True: more Workloads were pending than were read, so pending_gpus is a lower bound
    pending_partial: bool = False


@dataclass(frozen=True)
class KueueData:
    """What the collector read of Kueue for the named ClusterQueues (plain objects, as the API gave them).

    ``cluster_queues``: the ClusterQueue objects read, by name (a name not here was not read,
    and the collector said why). ``pending``: per ClusterQueue, the pending Workloads read
    (absent: not read); ``partial``: the ClusterQueues with more pending Workloads than read.
    """

    names: tuple[str, ...]
    cluster_queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    flavors: Sequence[Mapping[str, Any]] = ()
    pending: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    partial: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PoolReport:
    generated: float
    types: tuple[TypeRow, ...]
    users: tuple[UserRow, ...]
    # "prometheus": utilisation known; "unavailable": Prometheus failed; "": not configured
    utilisation_source: str = ""
    problems: tuple[str, ...] = field(default_factory=tuple)
    # the ClusterQueues the admin named (GPUAdmin.kueue_cluster_queues); (): Kueue not read
    kueue_cluster_queues: tuple[str, ...] = ()
    kueue: tuple[KueueQueueRow, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``gpuspawner status --json`` and the service's ``api/status``)."""
        data = asdict(self)
        data["kueue_cluster_queues"] = list(self.kueue_cluster_queues)
        for user in data["users"]:
            user["groups"] = None if user["groups"] is None else list(user["groups"])
            user["limit_per_type"] = dict(user["limit_per_type"])
        return data

    def user(self, name: str) -> UserRow | None:
        return next((u for u in self.users if u.name == name), None)


def parse_time(value: str | None) -> float | None:
    """ISO 8601 from the hub or Kubernetes (``...Z``) -> POSIX seconds."""
    if not value:
        return None
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def report_from_dict(data: Mapping[str, Any]) -> PoolReport:
    """The inverse of :meth:`PoolReport.as_dict` (the CLI reads the service's JSON)."""
    types = tuple(TypeRow(**t) for t in data.get("types") or [])
    users = []
    for u in data.get("users") or []:
        servers = tuple(ServerRow(**s) for s in u.get("servers") or [])
        groups = u.get("groups")
        users.append(
            UserRow(
                **{
                    **u,
                    "servers": servers,
                    "groups": None if groups is None else tuple(groups),
                    "limit_per_type": dict(u.get("limit_per_type") or {}),
                }
            )
        )
    return PoolReport(
        generated=float(data.get("generated") or 0),
        types=types,
        users=tuple(users),
        utilisation_source=data.get("utilisation_source") or "",
        problems=tuple(data.get("problems") or ()),
        # a service older than the Kueue table sends neither
        kueue_cluster_queues=tuple(data.get("kueue_cluster_queues") or ()),
        kueue=tuple(KueueQueueRow(**r) for r in data.get("kueue") or ()),
    )


def type_rows(
    figures: Mapping[str, Availability],
    pods: Iterable[ServerPod],
    catalog: Catalog | None,
) -> tuple[TypeRow, ...]:
    """Per GPU type: allocatable / in use / free from the figures, waiting from unbound pods."""
    waiting: dict[str, int] = {}
    for pod in pods:
        if pod.active and not pod.bound and pod.gpu_type is not None:
            waiting[pod.gpu_type] = waiting.get(pod.gpu_type, 0) + pod.gpus
    keys = list(catalog.gpu_types) if catalog is not None else sorted(figures)
    keys += sorted(k for k in {*figures, *waiting} if k not in keys)
    rows = []
    for key in keys:
        a = figures.get(key)
        name = key
        if catalog is not None and key in catalog.gpu_types:
            name = catalog.gpu_types[key].display_name
        elif a is not None and a.display_name:
            name = a.display_name
        rows.append(
            TypeRow(
                key=key,
                display_name=name,
                allocatable=a.allocatable if a else 0,
                in_use=a.requested if a else 0,
                free=a.free if a else 0,
                waiting=waiting.get(key, 0),
                nodes=len(a.nodes) if a else 0,
                excluded_nodes=len(a.excluded) if a else 0,
            )
        )
    return tuple(rows)


def pending_amounts(
    workloads: Iterable[Mapping[str, Any]] | None,
    queue: kueue.ClusterQueueStatus,
    flavor_labels: Mapping[str, Mapping[str, str]],
    gpu_resources: Iterable[str] = (),
) -> dict[tuple[str, str], float] | None:
    """Per (flavor, GPU resource): what ``workloads`` pending in ``queue`` ask for; None: not read.

    Each pod set's GPUs (per pod × count) go to the flavor Kueue would try first
    for them (:func:`~gpuspawner.core.kueue.request_flavor`); a pod set no flavor
    of the queue can take is counted nowhere. A Workload admitted since the
    pending list was read is no longer pending and is left out.
    """
    if workloads is None:
        return None
    extra = tuple(gpu_resources)
    amounts: dict[tuple[str, str], float] = {}
    for workload in workloads:
        if not kueue.workload_is_pending(workload):
            continue
        for request in kueue.workload_requests(workload):
            for resource, amount in request.gpu_resources(extra).items():
                flavor = kueue.request_flavor(request, resource, queue, flavor_labels)
                if flavor is not None:
                    key = (flavor, resource)
                    amounts[key] = amounts.get(key, 0.0) + amount * request.count
    return amounts


def kueue_rows(
    data: KueueData, catalog: Catalog | None
) -> tuple[tuple[KueueQueueRow, ...], tuple[str, ...]]:
    """The rows of each ClusterQueue read, in the order named, and a note for each shown without rows.

    One row per GPU resource per flavor of a ClusterQueue's quota (cpu and memory
    are not the GPU page's); the GPU type is the catalog's type of that resource
    whose node selector the flavor's node labels satisfy
    (:func:`~gpuspawner.core.kueue.flavor_gpu_types`).
    """
    extra = tuple(gpu_resource_names(catalog)) if catalog is not None else ()
    flavor_labels = kueue.flavor_node_labels(data.flavors)
    selectors = kueue.catalog_type_selectors(catalog) if catalog is not None else {}
    types_by_resource: dict[str, dict[str, str]] = {}

    def gpu_type(flavor: str, resource: str) -> tuple[str, str]:
        if catalog is None:
            return "", ""
        if resource not in types_by_resource:
            # a MIG type and the full GPU of the same nodes match the same flavor: the
            # resource tells them apart
            of_resource = {
                key: wanted
                for key, wanted in selectors.items()
                if catalog.gpu_types[key].resource == resource
            }
            types_by_resource[resource] = kueue.flavor_gpu_types(flavor_labels, of_resource)
        key = types_by_resource[resource].get(flavor, "")
        return key, catalog.gpu_types[key].display_name if key in catalog.gpu_types else ""

    rows: list[KueueQueueRow] = []
    notes: list[str] = []
    for name in dict.fromkeys(data.names):
        obj = data.cluster_queues.get(name)
        if obj is None:
            continue
        queue = kueue.cluster_queue_status(obj)
        if queue is None:
            notes.append(
                f"The ClusterQueue {shown(name)} is not shown: what Kueue answered is not a "
                "ClusterQueue."
            )
            continue
        quotas = [q for q in queue.quotas if is_gpu_resource(q.resource, extra)]
        if not quotas:
            notes.append(f"The ClusterQueue {shown(name)} has no GPU resource in its quota.")
            continue
        pending = pending_amounts(data.pending.get(name), queue, flavor_labels, extra)
        for quota in quotas:
            key, display_name = gpu_type(quota.flavor, quota.resource)
            rows.append(
                KueueQueueRow(
                    cluster_queue=name,
                    cohort=queue.cohort,
                    flavor=quota.flavor,
                    gpu_type=key,
                    gpu_type_name=display_name,
                    resource=quota.resource,
                    nominal=quota.nominal,
                    borrowing_limit=quota.borrowing_limit,
                    in_use=quota.used,
                    reserved=quota.reserved,
                    pending_workloads=queue.pending,
                    pending_gpus=None
                    if pending is None
                    else pending.get((quota.flavor, quota.resource), 0.0),
                    pending_partial=pending is not None and name in data.partial,
                )
            )
    return tuple(rows), tuple(notes)


def _server_state(model: Mapping[str, Any]) -> str:
    pending = model.get("pending")
    if pending == "stop":
        return "stopping"
    if pending or not model.get("ready"):
        return "starting"
    return "running"


def build_report(
    *,
    users: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    figures: Mapping[str, Availability],
    catalog: Catalog | None,
    now: float,
    utilisation: Mapping[tuple[str, str], float] | None = None,
    problems: Iterable[str] = (),
    utilisation_failed: bool = False,
    queues: KueueData | None = None,
) -> PoolReport:
    """The whole report. ``utilisation`` is keyed by (namespace, pod); None: not configured,
    or, with ``utilisation_failed``, configured but not read. ``queues``: what was read of
    Kueue's named ClusterQueues (None: none named).

    Servers are taken from the hub; a pod of a server the hub does not know
    (it lost track of it, or the server was removed) is listed as "pod only",
    because it still holds GPUs and counts against the user's limit.
    """
    active = [p for p in server_pods(pods) if p.active]
    by_server = {pod.key: pod for pod in active if pod.user}

    def type_name(key: str | None) -> str:
        if key is None:
            return "CPU only"
        if catalog is not None and key in catalog.gpu_types:
            return catalog.gpu_types[key].display_name
        return key

    def weight(key: str | None) -> float:
        if catalog is not None and key in (catalog.gpu_types if catalog else {}):
            return catalog.gpu_types[key].weight
        return 1.0

    def row(user: str, name: str, state: str, model: Mapping[str, Any]) -> ServerRow:
        pod = by_server.get((user, name))
        options = model.get("user_options") or {}
        if pod is not None:
            gpu_type, gpus, profile = pod.gpu_type, pod.gpus, pod.profile
        else:
            gpu_type = options.get(OPTION_GPU_TYPE) or None
            gpus = parse_count(options.get(OPTION_GPUS)) or 0
            gpu_type = gpu_type if gpus > 0 and isinstance(gpu_type, str) else None
            profile = None
        started = parse_time(model.get("started")) or parse_time(pod.created if pod else None)
        last_active = parse_time(model.get("last_activity"))
        util = None
        if utilisation is not None and pod is not None:
            util = utilisation.get((pod.namespace, pod.name))
            # Prometheus answers NaN and Inf too; they are no figure, and JSON has no word for them
            if util is not None and not math.isfinite(util):
                util = None
        return ServerRow(
            user=user,
            name=name,
            state=state,
            profile=profile or options.get(OPTION_PROFILE) or None,
            gpu_type=gpu_type,
            gpu_type_name=type_name(gpu_type),
            gpus=gpus,
            node=pod.node if pod else "",
            pod=pod.name if pod else "",
            namespace=pod.namespace if pod else "",
            age=None if started is None else max(now - started, 0.0),
            idle=None if last_active is None else max(now - last_active, 0.0),
            utilisation=util,
        )

    rows: list[UserRow] = []
    seen: set[tuple[str, str]] = set()
    user_models = {u["name"]: u for u in users}
    orphans: dict[str, list[str]] = {}
    for user, server in by_server:
        if server not in ((user_models.get(user) or {}).get("servers") or {}):
            orphans.setdefault(user, []).append(server)
    for name in sorted({*user_models, *orphans}):
        model = user_models.get(name) or {"name": name}
        servers = []
        for server, server_model in sorted((model.get("servers") or {}).items()):
            servers.append(row(name, server, _server_state(server_model), server_model))
            seen.add((name, server))
        for server in sorted(orphans.get(name, [])):
            servers.append(row(name, server, "pod only", {}))
        groups = tuple(sorted(model["groups"])) if "groups" in model else None
        if catalog is not None:
            limit = effective_limit(catalog.limits, name, groups or ())
            total, per_type, rule, text = (
                limit.total,
                dict(limit.per_type),
                limit.rule,
                limit.describe(),
            )
        else:
            total, per_type, rule, text = None, {}, "no catalog", "no limits (no catalog)"
        used = sum(s.gpus * weight(s.gpu_type) for s in servers if s.gpu_type)
        image_text = explain_images(catalog, name, groups) if catalog is not None else ""
        rows.append(
            UserRow(
                name=name,
                admin=bool(model.get("admin")),
                groups=groups,
                servers=tuple(servers),
                gpus_used=used,
                limit=total,
                limit_per_type=per_type,
                rule=rule,
                limit_text=text,
                image_text=image_text,
            )
        )
    problems = list(problems)
    queue_rows: tuple[KueueQueueRow, ...] = ()
    if queues is not None:
        queue_rows, notes = kueue_rows(queues, catalog)
        problems += notes
    return PoolReport(
        generated=now,
        types=type_rows(figures, active, catalog),
        users=tuple(rows),
        utilisation_source="prometheus"
        if utilisation is not None
        else "unavailable"
        if utilisation_failed
        else "",
        problems=tuple(problems),
        kueue_cluster_queues=tuple(queues.names) if queues is not None else (),
        kueue=queue_rows,
    )


# ---------------------------------------------------------------------------
# formatting shared by the page and the terminal
# ---------------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """42 s, 5 min, 3 h 20 min, 2 d 4 h; "-" when unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def format_utilisation(value: float | None, source: str) -> str:
    if not source:
        return "not configured"
    if source == "unavailable":
        return "unknown"
    if value is None or not math.isfinite(value):
        return "no data"
    return f"{value * 100:.0f} %"


def type_table(report: PoolReport) -> tuple[list[str], list[list[str]]]:
    head = ["GPU type", "allocatable", "in use", "free", "waiting", "nodes"]
    rows = []
    for t in report.types:
        nodes = str(t.nodes) + (f" (+{t.excluded_nodes} unusable)" if t.excluded_nodes else "")
        rows.append(
            [
                f"{t.display_name} ({t.key})",
                str(t.allocatable),
                str(t.in_use),
                str(t.free),
                str(t.waiting),
                nodes,
            ]
        )
    return head, rows


KUEUE_HEAD = (
    "cluster queue",
    "cohort",
    "flavor",
    "GPU type",
    "resource",
    "nominal",
    "borrowing limit",
    "in use",
    "reserved",
    "pending workloads",
    "pending GPUs",
)


def format_pending(row: KueueQueueRow) -> str:
    """The pending GPUs: "3", "at least 3" (not every pending Workload read), "unknown"."""
    if row.pending_gpus is None:
        return "unknown"
    amount = format_units(row.pending_gpus)
    return f"at least {amount}" if row.pending_partial else amount


def kueue_table(report: PoolReport) -> tuple[list[str], list[list[str]]]:
    """The ClusterQueues' GPU quota per flavor, beside the pool figures."""
    rows = []
    for r in report.kueue:
        rows.append(
            [
                r.cluster_queue,
                r.cohort or "-",
                r.flavor,
                f"{r.gpu_type_name or r.gpu_type} ({r.gpu_type})" if r.gpu_type else "-",
                r.resource,
                format_units(r.nominal),
                "none" if r.borrowing_limit is None else format_units(r.borrowing_limit),
                format_units(r.in_use),
                format_units(r.reserved),
                str(r.pending_workloads),
                format_pending(r),
            ]
        )
    return list(KUEUE_HEAD), rows


def server_table(report: PoolReport) -> tuple[list[str], list[list[str]]]:
    head = [
        "user",
        "server",
        "state",
        "profile",
        "GPU type",
        "GPUs",
        "node",
        "age",
        "idle",
        "GPU util",
        "GPUs used / limit",
        "limit from",
    ]
    rows = []
    for u in report.users:
        limit = f"{format_units(u.gpus_used)} / {format_units(u.limit)}"
        for s in u.servers or ():
            rows.append(
                [
                    u.name,
                    s.label,
                    s.state,
                    s.profile or "-",
                    s.gpu_type_name,
                    str(s.gpus),
                    s.node or "-",
                    format_duration(s.age),
                    format_duration(s.idle),
                    format_utilisation(s.utilisation, report.utilisation_source)
                    if s.gpu_type
                    else "-",
                    limit,
                    u.rule,
                ]
            )
        if not u.servers:
            rows.append(
                [u.name, "-", "no server", "-", "-", "0", "-", "-", "-", "-", limit, u.rule]
            )
    return head, rows


def printable(text: str) -> str:
    """``text`` safe for a terminal (:func:`~gpuspawner.core.refusals.escape_unprintable`).

    User and server names, groups and pod labels reach the terminal through
    ``gpuspawner status``; written raw, ESC would start a terminal control
    sequence, CR or LF a forged line, and U+202E turn the rest of a line around.
    """
    return escape_unprintable(text)


def text_table(head: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; cells made :func:`printable`."""
    head = [printable(h) for h in head]
    rows = [[printable(c) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def format_text(report: PoolReport, user: str | None = None) -> str:
    """The terminal view: the pool by type, every server, and with ``user`` their limit explained."""
    parts = ["GPU pool", text_table(*type_table(report)), ""]
    if report.kueue_cluster_queues:
        parts += ["Cluster queues (Kueue)", text_table(*kueue_table(report))]
        if not report.kueue:
            parts.append("No GPU quota of the named ClusterQueues was read (see the notes).")
        parts.append("")
    if user is None:
        parts += ["Servers", text_table(*server_table(report))]
    else:
        row = report.user(user)
        if row is None:
            parts.append(printable(f"{user}: no such user."))
        else:
            parts.append(printable(explain_limit(row)))
            if row.image_text:
                parts.append(printable(row.image_text))
            servers = PoolReport(report.generated, (), (row,), report.utilisation_source)
            parts += ["", text_table(*server_table(servers))]
    for problem in report.problems:
        parts += ["", printable(f"Note: {problem}")]
    return "\n".join(parts).rstrip() + "\n"


def explain_limit(row: UserRow) -> str:
    """E.g. "student (groups: students) may hold 1 GPUs (h100: at most 0), from group rule
    'students'; holds 1 now." """
    groups = (
        "groups unknown" if row.groups is None else f"groups: {', '.join(row.groups) or 'none'}"
    )
    return (
        f"{row.name} ({groups}) may hold {row.limit_text}; "
        f"holds {format_units(row.gpus_used)} GPUs now."
    )


def explain_images(catalog: Catalog, user: str, groups: tuple[str, ...] | None) -> str:
    """Which catalog images ``user`` may use, with who may use each restricted one.

    E.g. "student may use the images PyTorch; not MATLAB (groups 'licensed')."
    ``groups`` None: the hub did not show them, so an image open to some
    groups (and not to the user by name) can be neither granted nor ruled out.
    """

    def name(image: Any) -> str:
        if not image.restricted:
            return image.display_name
        return f"{image.display_name} ({image.describe_access()})"

    usable, barred, unknown = [], [], []
    for image in catalog.images.values():
        if image.allows(user, groups or ()):
            usable.append(name(image))
        elif groups is None and image.groups:
            unknown.append(name(image))
        else:
            barred.append(name(image))
    text = f"{user} may use the images {listing(usable, 'and')}"
    if barred:
        text += f"; not {listing(barred)}"
    if unknown:
        text += f"; perhaps {listing(unknown)}, depending on the groups the hub did not show"
    return text + "."
