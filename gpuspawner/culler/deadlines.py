"""When each server must stop whatever it does, and how long its user may keep it (pure).

From the catalog: an image's or GPU type's ``max_runtime`` (the smaller
applies) counts from the server's start; an image's ``max_keep`` (else the
culler's ``default_max_keep``) bounds a keep. From the catalog's
``limits.gpu_hours`` and the usage store's figures: the time a user's GPU
servers use up the rest of the user's budget at the rate they hold GPUs now
(:func:`gpuspawner.core.budgets.exhaustion_time`); all of the user's GPU
servers stop then. The earlier of the two is a server's :class:`Deadline`.
No clock: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..core.budgets import BudgetStatus, current_period, effective_budget, exhaustion_time
from ..core.catalog import BudgetRules, Catalog
from .policy import REASON_BUDGET, REASON_MAX_RUNTIME, Deadline, Server


def runtime_limit(catalog: Catalog, server: Server) -> float | None:
    """The smaller of the server's image's and GPU type's ``max_runtime`` (None: neither)."""
    limits = []
    image = catalog.images.get(server.profile) if server.profile else None
    if image is not None and image.max_runtime:
        limits.append(image.max_runtime)
    gpu_type = (
        catalog.gpu_types.get(server.gpu_type) if server.gpus > 0 and server.gpu_type else None
    )
    if gpu_type is not None and gpu_type.max_runtime:
        limits.append(gpu_type.max_runtime)
    return min(limits) if limits else None


def max_keep(catalog: Catalog | None, server: Server, default: float) -> float:
    """The longest keep the server's user may choose: its image's ``max_keep``, else ``default``."""
    image = catalog.images.get(server.profile) if catalog and server.profile else None
    if image is not None and image.max_keep is not None:
        return image.max_keep
    return default


def units(catalog: Catalog | None, server: Server) -> float:
    """The GPU units a server holds: its GPU count times its type's weight (1 if unknown)."""
    if server.gpus <= 0:
        return 0.0
    gpu_type = catalog.gpu_types.get(server.gpu_type) if catalog and server.gpu_type else None
    return server.gpus * (gpu_type.weight if gpu_type is not None else 1.0)


def budget_users(rules: BudgetRules, servers: Iterable[Server]) -> list[str]:
    """The users whose GPU servers a budget applies to: the ones whose usage is needed.

    A user whose groups the hub did not show is left out when group rules exist: the
    budget could be a group's, and a server is never stopped on a guess.
    """
    if not rules.enabled:
        return []
    found = set()
    for s in servers:
        if s.gpus <= 0 or s.user in found:
            continue
        if s.groups is None and rules.groups:
            continue
        if effective_budget(rules, s.user, s.groups or frozenset()).hours is not None:
            found.add(s.user)
    return sorted(found)


def budget_deadlines(
    rules: BudgetRules,
    servers: Iterable[Server],
    used_unit_seconds: Mapping[str, float],
    catalog: Catalog | None,
    now: float,
) -> dict[str, Deadline]:
    """User -> when the user's GPU servers use up the user's budget at today's rate.

    ``used_unit_seconds``: the usage store's weighted GPU-seconds of each user this period
    (open intervals counted to ``now``); users missing from it are not judged.
    """
    servers = list(servers)
    period = current_period(rules, now)
    result = {}
    for user in budget_users(rules, servers):
        if user not in used_unit_seconds:
            continue
        mine = [s for s in servers if s.user == user]
        groups = next((s.groups for s in mine if s.groups is not None), frozenset())
        status = BudgetStatus(
            budget=effective_budget(rules, user, groups),
            period=period,
            used_hours=used_unit_seconds[user] / 3600,
            held_units=sum(units(catalog, s) for s in mine),
        )
        at = exhaustion_time(status, now)  # now when already spent
        if at is not None:
            result[user] = Deadline(at=at, reason=REASON_BUDGET, detail=period.name)
    return result


def with_deadlines(
    servers: Iterable[Server],
    catalog: Catalog | None,
    budgets: Mapping[str, Deadline],
    default_max_keep: float,
) -> list[Server]:
    """The servers with their deadline (the earlier of max_runtime and the budget) and max_keep."""
    result = []
    for s in servers:
        deadlines = []
        limit = runtime_limit(catalog, s) if catalog is not None else None
        if limit is not None and s.started is not None:
            deadlines.append(Deadline(s.started + limit, REASON_MAX_RUNTIME, seconds=limit))
        if s.gpus > 0 and s.user in budgets:
            deadlines.append(budgets[s.user])
        result.append(
            replace(
                s,
                deadline=min(deadlines, key=lambda d: d.at) if deadlines else None,
                max_keep=max_keep(catalog, s, default_max_keep),
            )
        )
    return result
