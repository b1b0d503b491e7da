"""The GPU pool as an admin sees it: tables built from plain data (pure, no I/O).

In: the hub's user models (``GET /users``), GPUSpawner's pods, the figures
per GPU type (:class:`~gpuspawner.inventory.model.Availability`), the catalog
(for display names and limits) and, when Prometheus is configured, the GPU
utilisation per pod. Out: a :class:`PoolReport`, which the admin page renders
as HTML, ``gpuspawner status`` as text, and both as JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..core.catalog import Catalog
from ..core.limits import effective_limit, format_units
from ..core.options import OPTION_GPU_TYPE, OPTION_GPUS, OPTION_PROFILE, parse_count
from ..core.refusals import escape_unprintable, listing
from ..core.serverpod import ServerPod, server_pods
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
class PoolReport:
    generated: float
    types: tuple[TypeRow, ...]
    users: tuple[UserRow, ...]
    # "prometheus": utilisation known; "unavailable": Prometheus failed; "": not configured
    utilisation_source: str = ""
    problems: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``gpuspawner status --json`` and the service's ``api/status``)."""
        data = asdict(self)
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
) -> PoolReport:
    """The whole report. ``utilisation`` is keyed by (namespace, pod); None: not configured,
    or, with ``utilisation_failed``, configured but not read.

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
