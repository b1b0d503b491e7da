"""This server's GPU load as the culler sees it, and how often to ask (pure, no I/O).

The culler's ``/api/gpu-status`` answers for every server the token speaks
for; a single-user server's own token speaks for itself only, but the answer
is still filtered here so a broader token never shows another server's GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping

from traitlets import Integer
from traitlets.config import Configurable

#: The bounds of the culler's poll_seconds (the contract's): a broken or
#: hostile answer must neither hammer the culler nor silence the item for hours.
MIN_POLL_SECONDS = 5
MAX_POLL_SECONDS = 60


class GpuStatus(Configurable):
    """How JupyterLab's GPU status-bar item is fed (where the culler is: ``CullWarning``)."""

    poll_seconds = Integer(
        30,
        help="""Seconds between two questions of JupyterLab when the culler does not say
        (it usually does: its Prometheus scrape cadence, bounded to 5..60 s).""",
    ).tag(config=True)


def gpu_status_url(culler_url: str) -> str:
    """The culler's /api/gpu-status under its base URL."""
    return culler_url.rstrip("/") + "/api/gpu-status"


def poll_seconds(answer: Mapping | None, fallback: int) -> int:
    """How often JupyterLab should ask: the culler's cadence, bounded, else ``fallback``."""
    value = answer.get("poll_seconds") if isinstance(answer, Mapping) else None
    # bool is an int: true must not read as "every second"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        value = fallback
    return int(min(max(value, MIN_POLL_SECONDS), MAX_POLL_SECONDS))


def this_servers_status(answer: Mapping, server_name: str) -> dict | None:
    """This server's entry in the culler's answer, or None (a CPU server is not listed)."""
    servers = answer.get("servers") if isinstance(answer, Mapping) else None
    if not isinstance(servers, list):
        return None
    for entry in servers:
        if isinstance(entry, Mapping) and entry.get("server") == server_name:
            return dict(entry)
    return None


def status_answer(culler_answer: Mapping | None, server_name: str, fallback_poll: int) -> dict:
    """What ``/gpuspawner/gpu-status`` answers JupyterLab (``status`` None: show no item)."""
    status = None
    if isinstance(culler_answer, Mapping):
        status = this_servers_status(culler_answer, server_name)
    return {"status": status, "poll_seconds": poll_seconds(culler_answer, fallback_poll)}
