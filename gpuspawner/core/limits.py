"""Per-user GPU limits: which rule applies to a user, what they hold, and whether a request fits.

Usage is computed from the cluster's pods (their labels and annotations, see
:mod:`gpuspawner.core.labels`), never from hub memory, so a hub restart or a pod
the hub lost track of cannot lead to over-allocation. The spawner adds the
requests it has admitted but whose pods do not exist yet (reservations), so
concurrent requests are counted too.

Units: a GPU type's ``weight`` (1 by default; e.g. 1/7 for a ``mig-1g.10gb``
slice) converts its count into GPU units. A user's total limit and a group
pool are in GPU units; a per-type limit is in that type's own count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .catalog import Allowance, Catalog, LimitRules
from .options import Selection
from .refusals import REASON_GROUP_POOL, REASON_LIMIT, Refusal, escape_unprintable, refuse
from .serverpod import server_pods

#: Tolerance for float comparisons of weighted units (1/7 + … sums).
_EPSILON = 1e-9


@dataclass(frozen=True)
class Holding:
    """GPUs held by one server (a pod in the cluster, or a spawn admitted a moment ago)."""

    user: str
    server: str
    gpu_type: str | None
    gpus: int
    units: float
    pool_groups: tuple[str, ...] = ()
    pod: str = ""

    @property
    def server_label(self) -> str:
        return self.server or "default"


@dataclass(frozen=True)
class EffectiveLimit:
    """The limit in effect for one user, and the rule it came from."""

    total: float | None
    per_type: Mapping[str, float | None] = field(default_factory=dict)
    rule: str = "default"

    def for_type(self, gpu_type: str) -> float | None:
        return self.per_type.get(gpu_type)

    def describe(self) -> str:
        """E.g. "4 GPUs (H100: at most 1), from group 'ml-team'"."""
        parts = [f"{format_units(self.total)} GPUs" if self.total is not None else "unlimited GPUs"]
        typed = [
            f"{key}: {'unlimited' if v is None else 'at most ' + format_units(v)}"
            for key, v in self.per_type.items()
        ]
        if typed:
            parts.append(f"({'; '.join(typed)})")
        return f"{' '.join(parts)}, from {self.rule}"


def format_units(value: float | None) -> str:
    """Show 2.0 as "2" and 0.2857… as "0.29"."""
    if value is None:
        return "unlimited"
    if abs(value - round(value)) < _EPSILON:
        return str(round(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _max_limit(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return max(a, b)


def effective_limit(rules: LimitRules, user: str, groups: Iterable[str]) -> EffectiveLimit:
    """The rule for ``user``: a per-user rule wins; else the largest of their groups'; else the default.

    With several groups, the totals and each per-type limit are the largest
    among the groups; a group that sets no per-type limit for a type lets that
    type up to its total.
    """
    if user in rules.users:
        allowance = rules.users[user]
        return EffectiveLimit(allowance.total, dict(allowance.per_type), f"user rule '{user}'")
    matched = sorted(g for g in set(groups) if g in rules.groups)
    if not matched:
        d = rules.default
        return EffectiveLimit(d.total, dict(d.per_type), "the default rule")

    allowances: list[Allowance] = [rules.groups[g] for g in matched]
    total: float | None = allowances[0].total
    for a in allowances[1:]:
        total = _max_limit(total, a.total)
    typed_keys = set().union(*(a.per_type for a in allowances))
    per_type: dict[str, float | None] = {}
    for key in sorted(typed_keys):
        value: float | None = -1.0
        for a in allowances:
            value = _max_limit(value, a.per_type.get(key))
        if value is not None:
            per_type[key] = value
    best = max(
        matched,
        key=lambda g: float("inf") if rules.groups[g].total is None else rules.groups[g].total,
    )
    rule = (
        f"group rule '{best}'"
        if len(matched) == 1
        else f"group rules {', '.join(repr(g) for g in matched)}"
    )
    return EffectiveLimit(total, per_type, rule)


def holdings_from_pods(pods: Iterable[Mapping[str, Any]], catalog: Catalog | None) -> list[Holding]:
    """The GPU holdings recorded on pods (raw API dicts, camelCase).

    Pods that are finished (Succeeded/Failed) or being deleted hold nothing
    any more; pods without GPUs are skipped.
    """
    out = []
    for pod in server_pods(pods):
        if not pod.active or not pod.has_gpus:
            continue
        assert pod.gpu_type is not None
        if catalog is not None and pod.gpu_type in catalog.gpu_types:
            weight = catalog.gpu_types[pod.gpu_type].weight
        else:
            weight = pod.weight or 1.0
        out.append(
            Holding(
                user=pod.user,
                server=pod.server,
                gpu_type=pod.gpu_type,
                gpus=pod.gpus,
                units=pod.gpus * weight,
                pool_groups=pod.pool_groups,
                pod=pod.name,
            )
        )
    return out


def merge_reservations(holdings: list[Holding], reservations: Iterable[Holding]) -> list[Holding]:
    """Add admitted spawns whose pods are not visible yet (one entry per user and server)."""
    seen = {(h.user, h.server) for h in holdings}
    merged = list(holdings)
    for r in reservations:
        if (r.user, r.server) not in seen:
            merged.append(r)
            seen.add((r.user, r.server))
    return merged


def holding_for(
    user: str, server: str, selection: Selection, pool_groups: Iterable[str]
) -> Holding:
    """The holding a selection will create, for reservations."""
    gpu_type = selection.gpu_type
    return Holding(
        user=user,
        server=server,
        gpu_type=gpu_type.key if gpu_type and selection.is_gpu else None,
        gpus=selection.gpus,
        units=selection.gpus * (gpu_type.weight if gpu_type else 1.0),
        pool_groups=tuple(pool_groups),
    )


def pool_groups_for(rules: LimitRules, groups: Iterable[str]) -> tuple[str, ...]:
    """The user's groups that have a shared pool cap."""
    return tuple(sorted(g for g in set(groups) if g in rules.group_pools))


def _servers(holdings: list[Holding]) -> str:
    # Server names are the user's: a character that is not printable is written as an escape.
    names = sorted({h.server_label for h in holdings})
    return escape_unprintable(", ".join(names))


def check_request(
    *,
    catalog: Catalog,
    user: str,
    groups: Iterable[str],
    server: str,
    selection: Selection,
    holdings: list[Holding],
) -> None:
    """Raise :class:`Refusal` (403) when the request would exceed a limit.

    ``holdings`` are all current holdings (every user: group pools need
    them); the server being started is not counted against itself.
    """
    if not selection.is_gpu or selection.gpu_type is None:
        return
    groups = list(groups)
    gpu_type = selection.gpu_type
    limit = effective_limit(catalog.limits, user, groups)
    others = [h for h in holdings if not (h.user == user and h.server == server)]
    mine = [h for h in others if h.user == user]
    wanted_units = selection.gpus * gpu_type.weight

    if limit.total is not None:
        if limit.total < _EPSILON:
            raise refuse(REASON_LIMIT, "limit-zero", rule=limit.rule)
        used = sum(h.units for h in mine)
        if used + wanted_units > limit.total + _EPSILON:
            raise _over_limit(used, limit.total, None, mine, wanted_units)

    type_limit = limit.for_type(gpu_type.key)
    if type_limit is not None:
        if type_limit < _EPSILON:
            raise refuse(
                REASON_LIMIT, "type-barred", gpu_type=gpu_type.display_name, rule=limit.rule
            )
        of_type = [h for h in mine if h.gpu_type == gpu_type.key]
        used_type = sum(h.gpus for h in of_type)
        if used_type + selection.gpus > type_limit + _EPSILON:
            raise _over_limit(used_type, type_limit, gpu_type.display_name, of_type, selection.gpus)

    for group in pool_groups_for(catalog.limits, groups):
        cap = catalog.limits.group_pools[group]
        used_pool = sum(h.units for h in others if group in h.pool_groups)
        if used_pool + wanted_units > cap + _EPSILON:
            raise refuse(
                REASON_GROUP_POOL,
                "pool-full",
                group=group,
                used=format_units(used_pool),
                cap=format_units(cap),
            )


def _over_limit(
    used: float, limit: float, gpu_type: str | None, held: list[Holding], wanted: float
) -> Refusal:
    """Over the total limit (``gpu_type`` None) or the limit of one GPU type (its name).

    ``held`` are the holdings that count against the limit; when they hold
    something (``used``), they name at least one server.
    """
    typed = {} if gpu_type is None else {"gpu_type": gpu_type}
    if used < _EPSILON:
        return refuse(
            REASON_LIMIT,
            "over-limit" if gpu_type is None else "over-type-limit",
            wanted=format_units(wanted),
            limit=format_units(limit),
            **typed,
        )
    room = limit - used
    figures = {"used": format_units(used), "limit": format_units(limit), "servers": _servers(held)}
    if room > _EPSILON:
        return refuse(
            REASON_LIMIT,
            "using" if gpu_type is None else "using-type",
            "stop-or-ask-for-room",
            room=format_units(room),
            **figures,
            **typed,
        )
    return refuse(
        REASON_LIMIT,
        "using" if gpu_type is None else "using-type",
        "stop-or-ask-for-fewer",
        **figures,
        **typed,
    )


def remaining(
    catalog: Catalog, user: str, groups: Iterable[str], server: str, holdings: list[Holding]
) -> dict[str, float | None]:
    """How many more GPUs of each type the user may take now (None: no limit), for the form."""
    groups = list(groups)
    limit = effective_limit(catalog.limits, user, groups)
    mine = [h for h in holdings if h.user == user and h.server != server]
    used = sum(h.units for h in mine)
    out: dict[str, float | None] = {}
    for key, gpu_type in catalog.gpu_types.items():
        room: float | None = None
        if limit.total is not None:
            room = max(0.0, (limit.total - used) / gpu_type.weight)
        type_limit = limit.for_type(key)
        if type_limit is not None:
            used_type = sum(h.gpus for h in mine if h.gpu_type == key)
            typed_room = max(0.0, type_limit - used_type)
            room = typed_room if room is None else min(room, typed_room)
        for group in pool_groups_for(catalog.limits, groups):
            used_pool = sum(
                h.units
                for h in holdings
                if group in h.pool_groups and not (h.user == user and h.server == server)
            )
            pool_room = max(0.0, (catalog.limits.group_pools[group] - used_pool) / gpu_type.weight)
            room = pool_room if room is None else min(room, pool_room)
        out[key] = room
    return out
