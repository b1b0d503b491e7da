"""What the culler tells one user about their own warned servers (``/api/warning``).

Pure: takes the hub's whoami model of the caller's token and the culler's
warnings, returns the JSON answer. The caller's servers come from the token's
scopes: a single-user server's ``$JUPYTERHUB_API_TOKEN`` holds
``access:servers!server=<user>/<name>`` for its own server only (the hub's
``server`` role, JupyterHub 4 to 6), so a server learns about itself and about
no other server, not even its owner's others; a user's own token
(``access:servers!user=<user>``, or the unfiltered scope of an admin) learns
about that user's servers, never about another user's.

``/api/keep`` (:func:`keep_request`) follows the same rule for what a token may
keep; a service named in the culler's ``keep_services`` (the user service behind
the home page's buttons) asks on behalf of the user it names.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..core.stopreasons import duration_text, utc_clock
from .annotations import KEEP_REFUSED
from .policy import (
    REASON_BUDGET,
    REASON_GPU_IDLE,
    REASON_IDLE,
    REASON_MAX_AGE,
    REASON_MAX_RUNTIME,
    REASON_PRESSURE,
    Policy,
    Server,
    WarningMark,
)

#: How to keep a server warned for each cull reason (shown to its user).
KEEP = {
    REASON_IDLE: "To keep it, use it before then (run a cell or a terminal command).",
    REASON_GPU_IDLE: "To keep it, run something on its GPUs before then.",
    REASON_PRESSURE: "To keep it, use it or its GPUs before then.",
    REASON_MAX_AGE: "It cannot be kept running longer: save your work.",
    REASON_MAX_RUNTIME: "It cannot be kept running longer: save your work.",
    REASON_BUDGET: "It cannot be kept running longer: save your work.",
}

#: Why, in words, for each cull reason.
WHY = {
    REASON_IDLE: "it has been idle",
    REASON_GPU_IDLE: "its GPUs have been idle",
    REASON_PRESSURE: "it is idle while others wait for its GPUs",
    REASON_MAX_AGE: "it has reached its maximum age",
    REASON_MAX_RUNTIME: "it reaches its maximum running time",
    REASON_BUDGET: "its user's GPU-hours budget runs out",
}


def token_servers(model: Mapping) -> tuple[str | None, frozenset[str] | None]:
    """The user a token belongs to and the server names it speaks for.

    Returns ``(None, frozenset())`` for a service's token (services own no
    servers); ``(user, None)`` when the token may act for all of its user's
    servers; ``(user, names)`` when it is a server's token (or was narrowed
    to some servers).
    """
    if model.get("kind", "user") != "user" or not model.get("name"):
        return None, frozenset()
    user = model["name"]
    names: set[str] = set()
    for scope in model.get("scopes") or ():
        base, _, filter_ = scope.partition("!")
        if base != "access:servers":
            continue
        if not filter_ or filter_ == f"user={user}":
            return user, None
        owner, slash, name = filter_.removeprefix("server=").partition("/")
        if filter_.startswith("server=") and slash and owner == user:
            names.add(name)
    return user, frozenset(names)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def cull_at(mark: WarningMark, warning_period: float, cull_every: float) -> float:
    """When a warned server is culled if it stays idle: the first pass at or after the
    end of its warning period (the ``/api/warning`` and ``/api/gpu-status`` answers)."""
    # culls happen on passes: the first one at or after the period's end
    passes = -(-warning_period // cull_every) if cull_every > 0 else 1
    return mark.warned_at + passes * (cull_every if cull_every > 0 else warning_period)


def warning_answer(
    model: Mapping,
    warned: Mapping[tuple[str, str], WarningMark],
    warning_period: float,
    cull_every: float,
    keeps: Mapping[tuple[str, str], tuple[tuple[float, ...], str]] | None = None,
) -> dict:
    """The ``/api/warning`` answer for the token described by ``model``.

    ``cull_at`` is the first pass at or after the end of the warning period:
    the cull comes at that pass if the server is still idle then, not before.
    ``keeps``: each warned server's keep choices (seconds) and why none
    (:func:`gpuspawner.culler.annotations.keep_offer`).
    """
    user, names = token_servers(model)
    servers = []
    for (owner, name), mark in sorted(warned.items()):
        if owner != user or (names is not None and name not in names):
            continue
        at = cull_at(mark, warning_period, cull_every)
        keep = KEEP.get(mark.reason, "To keep it, use it before then.")
        choices, refused = (keeps or {}).get((owner, name), ((), ""))
        servers.append(
            {
                "user": owner,
                "server": name,
                "reason": mark.reason,
                "why": WHY.get(mark.reason, f"of {mark.reason}"),
                "keep": keep,
                "warned_at": mark.warned_at,
                "cull_at": at,
                "cull_at_iso": _iso(at),
                "keep_choices": list(choices),
                "keep_refused": refused,
                "message": (
                    f"Your server {'/'.join(filter(None, (owner, name)))!r} will be stopped "
                    f"at {_iso(at)} because {WHY.get(mark.reason, mark.reason)}. "
                    f"{keep}"
                ),
            }
        )
    return {"user": user, "warnings": servers}


#: What a keep request looks like, for the answer to one that does not.
KEEP_BODY = 'Send JSON like {"server": "", "seconds": 3600}.'


@dataclass(frozen=True)
class KeepAnswer:
    """The answer to a keep request: its HTTP status and one sentence; for a keep granted,
    the server and until when (the caller records it on the pod)."""

    status: int
    message: str
    server: Server | None = None
    until: float | None = None
    seconds: float | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def keep_request(
    model: Mapping,
    body: Any,
    servers: Mapping[tuple[str, str], Server],
    warned: Mapping[tuple[str, str], WarningMark],
    policy: Policy,
    keep_services: Collection[str],
    now: float,
    freed: Collection[tuple[str, str]] = (),
) -> KeepAnswer:
    """The answer to ``POST /api/keep`` with ``body`` from the token described by ``model``.

    ``servers``: the last pass's servers; ``warned``: the standing warnings; ``freed``:
    the servers pressure mode chose for a waiting request in the last pass. A server's
    token keeps its own server, a user's token its user's servers, a service in
    ``keep_services`` any user's it names in ``"user"``. The keep is one of the offered
    choices (:meth:`Policy.keep_choices_for`); it is refused (409) while a deadline or
    max_age warning stands, and while pressure wants the server's GPUs unless the admin
    let keeps override pressure.
    """
    if not isinstance(body, Mapping):
        return KeepAnswer(400, KEEP_BODY)
    name, seconds, on_behalf = (
        body.get("server", ""),
        _number(body.get("seconds")),
        body.get("user"),
    )
    if not isinstance(name, str) or seconds is None:
        return KeepAnswer(400, KEEP_BODY)
    if model.get("kind", "user") == "service":
        if model.get("name") not in keep_services:
            return KeepAnswer(
                403, "This service may not keep servers: add it to c.GPUCuller.keep_services."
            )
        if not isinstance(on_behalf, str) or not on_behalf:
            return KeepAnswer(400, 'A service names the user it asks for: {"user": "name", ...}.')
        user, names = on_behalf, None
    else:
        user, names = token_servers(model)
        if user is None or (on_behalf is not None and on_behalf != user):
            return KeepAnswer(403, "This token may keep only its own user's servers.")
        if names is not None and name not in names:
            return KeepAnswer(403, "This token may keep only its own server.")
    key = (user, name)
    server = servers.get(key)
    if server is None:
        return KeepAnswer(404, "The culler knows no running server of that name for this user.")
    mark = warned.get(key)
    if mark is not None and mark.reason in (REASON_MAX_AGE, REASON_MAX_RUNTIME, REASON_BUDGET):
        return KeepAnswer(409, KEEP_REFUSED[mark.reason])
    pressed = key in freed or (mark is not None and mark.reason == REASON_PRESSURE)
    if pressed and not policy.keep_overrides_pressure:
        return KeepAnswer(409, KEEP_REFUSED[REASON_PRESSURE])
    choices = policy.keep_choices_for(server)
    if not choices:
        return KeepAnswer(409, "This server's image allows no keep.")
    if seconds not in choices:
        offered = " or ".join(duration_text(c) for c in choices)
        return KeepAnswer(400, f"Choose a keep of {offered}.")
    until = now + seconds
    return KeepAnswer(
        200,
        f"Kept until {utc_clock(until)}: it is not stopped for being idle before then.",
        server=server,
        until=until,
        seconds=seconds,
    )
