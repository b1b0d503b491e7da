"""What the culler tells one user about their own warned servers (``/api/warning``).

Pure: takes the hub's whoami model of the caller's token and the culler's
warnings, returns the JSON answer. The caller's servers come from the token's
scopes: a single-user server's ``$JUPYTERHUB_API_TOKEN`` holds
``access:servers!server=<user>/<name>`` for its own server only (the hub's
``server`` role, JupyterHub 4 to 6), so a server learns about itself and about
no other server, not even its owner's others; a user's own token
(``access:servers!user=<user>``, or the unfiltered scope of an admin) learns
about that user's servers, never about another user's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from .policy import REASON_GPU_IDLE, REASON_IDLE, REASON_MAX_AGE, REASON_PRESSURE, WarningMark

#: How to keep a server warned for each cull reason (shown to its user).
KEEP = {
    REASON_IDLE: "To keep it, use it before then (run a cell or a terminal command).",
    REASON_GPU_IDLE: "To keep it, run something on its GPUs before then.",
    REASON_PRESSURE: "To keep it, use it or its GPUs before then.",
    REASON_MAX_AGE: "It cannot be kept running longer: save your work.",
}

#: Why, in words, for each cull reason.
WHY = {
    REASON_IDLE: "it has been idle",
    REASON_GPU_IDLE: "its GPUs have been idle",
    REASON_PRESSURE: "it is idle while others wait for its GPUs",
    REASON_MAX_AGE: "it has reached its maximum age",
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
) -> dict:
    """The ``/api/warning`` answer for the token described by ``model``.

    ``cull_at`` is the first pass at or after the end of the warning period:
    the cull comes at that pass if the server is still idle then, not before.
    """
    user, names = token_servers(model)
    servers = []
    for (owner, name), mark in sorted(warned.items()):
        if owner != user or (names is not None and name not in names):
            continue
        at = cull_at(mark, warning_period, cull_every)
        keep = KEEP.get(mark.reason, "To keep it, use it before then.")
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
                "message": (
                    f"Your server {'/'.join(filter(None, (owner, name)))!r} will be stopped "
                    f"at {_iso(at)} because {WHY.get(mark.reason, mark.reason)}. "
                    f"{keep}"
                ),
            }
        )
    return {"user": user, "warnings": servers}
