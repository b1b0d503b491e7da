"""Why a server stopped, and when it will be stopped: the notices users read (pure).

Whoever stops a server for a reason other than its user's own action (the
culler, the admin GPU page, GPUSpawner itself) writes a :class:`StopNotice`
as JSON on the pod's ``gpuspawner.io/stop-reason`` annotation before deleting
it; GPUSpawner reads it back when the server stops, adds the server's name
and what it held, and keeps it in its persisted state until the user starts
that server again. Kueue, which preempts a pod without writing one, is read from the
pod's own ``TerminationTarget`` condition instead (``ServerPod.stop_notice``). The
culler's warning before a cull is a :class:`CullWarning` on the
``gpuspawner.io/cull-warning`` annotation.

Times are UTC epochs. A sentence names the time as ``14:02 UTC`` (plain text:
the REST API, logs); :func:`notice_html` wraps it in
``<time datetime="...">`` so the hub's page can show the reader's local time
(:data:`LOCAL_TIME_SCRIPT`), with the UTC text as the fallback without
JavaScript. Everything read back from an annotation or a stored state is
checked: a value that does not parse reads as no notice, never an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any

from markupsafe import Markup, escape

#: The culler found no Jupyter activity for its idle timeout.
REASON_IDLE = "idle"
#: The culler found the server's GPUs idle for its GPU timeout.
REASON_GPU_IDLE = "gpu-idle"
#: The culler freed the GPUs for users waiting for that type.
REASON_PRESSURE = "pressure"
#: The culler's maximum server age was reached.
REASON_MAX_AGE = "max-age"
#: The GPU check (the init container) failed; ``kind`` names how.
REASON_GPU_CHECK = "gpu-check"
#: The GPU check's kind when the runtime could not start it (no python3 in its image):
#: it never ran, so nothing is known of the GPUs. validation.podstatus assigns it.
NOT_STARTABLE_KIND = "check-not-startable"
#: No node could take the server's GPUs for GPUSpawner.gpu_unschedulable_timeout.
REASON_STUCK_PENDING = "stuck-pending"
#: An admin stopped it from the GPU page (gpuspawner-admin).
REASON_ADMIN = "admin"
#: The node it ran on went away (deleted, or not Ready) and the pod with it.
REASON_NODE_LOST = "node-lost"
#: The culler stopped it when its user's GPU-hours budget ran out; ``detail`` names the
#: period ("this week").
REASON_BUDGET = "budget"
#: The culler stopped it at its image's or GPU type's ``max_runtime`` (``seconds``).
REASON_MAX_RUNTIME = "max-runtime"
#: Kueue evicted its pod to admit other work (preemption, where admins turn it on): the
#: pod's ``TerminationTarget`` condition says so (:func:`gpuspawner.core.kueue.was_preempted`);
#: ``detail`` names why (:func:`gpuspawner.core.kueue.preemption_cause`).
REASON_PREEMPTED = "preempted"
#: Why Kueue preempted a server (its notice's ``detail``, read from Kueue's message by
#: :func:`gpuspawner.core.kueue.preemption_cause`): to admit higher-priority work in the
#: same ClusterQueue, to give back quota borrowed from another ClusterQueue of the
#: cohort, or by fair sharing between them.
PREEMPTED_FOR_PRIORITY = "priority"
PREEMPTED_TO_RECLAIM = "reclaim"
PREEMPTED_FOR_FAIR_SHARING = "fair-sharing"
#: Each cause's words in the notice's sentence.
PREEMPTION_WORDS = {
    PREEMPTED_FOR_PRIORITY: "Kueue gave its GPUs to higher-priority work",
    PREEMPTED_TO_RECLAIM: "its GPUs were borrowed from another queue, which took them back",
    PREEMPTED_FOR_FAIR_SHARING: "Kueue's fair sharing gave its GPUs to another queue",
}

REASONS: tuple[str, ...] = (
    REASON_IDLE,
    REASON_GPU_IDLE,
    REASON_PRESSURE,
    REASON_MAX_AGE,
    REASON_GPU_CHECK,
    REASON_STUCK_PENDING,
    REASON_ADMIN,
    REASON_NODE_LOST,
    REASON_BUDGET,
    REASON_MAX_RUNTIME,
    REASON_PREEMPTED,
)
#: Reasons no keep can put off: the stop comes at a fixed time, whatever the server does.
DEADLINE_REASONS: tuple[str, ...] = (REASON_MAX_AGE, REASON_BUDGET, REASON_MAX_RUNTIME)

#: Longest free text (a check's message, a node's name) kept in a notice.
MAX_TEXT = 300


def duration_text(seconds: float) -> str:
    """``45 seconds``, ``12 minutes``, ``2 hours``, ``2 hours 30 minutes``, ``3 days``."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return _plural(seconds, "second")
    minutes = seconds // 60
    if minutes < 120:
        return _plural(minutes, "minute")
    hours, minutes = divmod(minutes, 60)
    if hours >= 48:
        return _plural(hours // 24, "day")
    return _plural(hours, "hour") + (f" {_plural(minutes, 'minute')}" if minutes else "")


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def utc_clock(epoch: float) -> str:
    """``14:02 UTC``."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%H:%M UTC")


def iso_time(epoch: float) -> str:
    """``2026-12-01T14:02:00Z``: what ``<time datetime>`` and the REST API carry."""
    return datetime.fromtimestamp(int(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def held_text(gpus: int, gpu_name: str | None) -> str:
    """``2 × NVIDIA A100``; "" for a CPU-only server."""
    if gpus <= 0 or not gpu_name:
        return ""
    return f"{gpus} × {gpu_name}"


def _server_phrase(server: str, held: str) -> str:
    name = f"Your server '{server}'" if server else "Your server"
    return f"{name} ({held})" if held else name


def _stored(data: Any) -> Mapping[str, Any] | None:
    """A stored notice or warning (a dict, or its JSON text) with a known reason; else None."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    if not isinstance(data, Mapping) or data.get("reason") not in REASONS:
        return None
    return data


def _compact(record: Any) -> dict[str, Any]:
    """A dataclass as a JSON-able dict without its empty fields."""
    return {k: v for k, v in asdict(record).items() if v not in ("", None)}


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


#: The latest time a notice may name: 9999-12-31 23:59:59 UTC, the end of what
#: ``datetime`` can show. Annotations are written by anyone who may edit the pod.
MAX_EPOCH = 253402300799.0
#: The longest idle time, age or wait a notice may name (100 years).
MAX_SECONDS = 100 * 365.25 * 86400


def _number(value: Any, maximum: float) -> float | None:
    """A non-negative finite number up to ``maximum``; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= maximum else None


def _epoch(value: Any) -> float | None:
    return _number(value, MAX_EPOCH)


def _seconds(value: Any) -> float | None:
    return _number(value, MAX_SECONDS)


@dataclass(frozen=True)
class StopNotice:
    """Why and when a server was stopped by someone other than its user."""

    #: One of :data:`REASONS`.
    reason: str
    #: When it was stopped (UTC epoch).
    at: float
    #: The hub's server name; "" for the default server.
    server: str = ""
    #: What it held (``2 × NVIDIA A100``); "" for none or unknown.
    held: str = ""
    #: The idle time (idle, gpu-idle, pressure), the age limit (max-age), the
    #: running time limit (max-runtime) or the wait (stuck-pending), in seconds.
    seconds: float | None = None
    #: The GPU check's failure kind (gpu-check).
    kind: str = ""
    #: Free text: the GPU check's reason (gpu-check), the node's name (node-lost),
    #: the budget's period (budget: "this week").
    detail: str = ""

    def because(self) -> str:
        """The reason, as the end of a sentence starting "because"."""
        span = duration_text(self.seconds) if self.seconds is not None else None
        if self.reason == REASON_IDLE:
            return f"it was not used for {span}" if span else "it was not used for a long time"
        if self.reason == REASON_GPU_IDLE:
            return f"its GPUs were idle for {span}" if span else "its GPUs were idle too long"
        if self.reason == REASON_PRESSURE:
            idle = f" for {span}" if span else ""
            return f"its GPUs were idle{idle} while other users were waiting for them"
        if self.reason == REASON_MAX_AGE:
            return f"it reached the maximum age of {span}" if span else "it reached its maximum age"
        if self.reason == REASON_GPU_CHECK:
            detail = self.detail.rstrip(".")
            if self.kind == NOT_STARTABLE_KIND:
                # the check never ran: this says nothing of the GPUs
                return "its GPUs could not be checked" + (f": {detail}" if detail else "")
            kind = f" ({self.kind})" if self.kind else ""
            return f"its GPUs failed their check{kind}" + (f": {detail}" if detail else "")
        if self.reason == REASON_STUCK_PENDING:
            wait = f" for {span}" if span else ""
            return f"no node had free GPUs for it{wait}"
        if self.reason == REASON_ADMIN:
            return "an admin stopped it from the GPU page"
        if self.reason == REASON_NODE_LOST:
            node = f" ({self.detail})" if self.detail else ""
            return f"the node it ran on{node} was lost"
        if self.reason == REASON_BUDGET:
            period = f" for {self.detail}" if self.detail else ""
            return f"it used up its user's GPU-hours budget{period}"
        if self.reason == REASON_MAX_RUNTIME:
            if span:
                return f"it reached the maximum running time of {span}"
            return "it reached its maximum running time"
        if self.reason == REASON_PREEMPTED:
            why = PREEMPTION_WORDS.get(self.detail, "Kueue gave its GPUs to other work")
            return f"it was preempted for queued work ({why})"
        return "it was stopped by the hub"

    def sentence(self) -> str:
        """``Your server 'train' (2 × NVIDIA A100) was stopped at 14:02 UTC because ...``"""
        who = _server_phrase(self.server, self.held)
        return f"{who} was stopped at {utc_clock(self.at)} because {self.because()}."

    def to_state(self) -> dict[str, Any]:
        """A JSON-able dict: the annotation's value and the spawner's state."""
        return _compact(self)

    @classmethod
    def from_state(cls, data: Any) -> StopNotice | None:
        """The notice in ``data`` (a dict, or its JSON text); None when it is not one."""
        data = _stored(data)
        if data is None:
            return None
        at = _epoch(data.get("at"))
        if at is None:
            return None
        return cls(
            reason=data["reason"],
            at=at,
            server=_text(data.get("server")),
            held=_text(data.get("held")),
            seconds=_seconds(data.get("seconds")),
            kind=_text(data.get("kind")),
            detail=_text(data.get("detail")),
        )

    def for_server(self, server: str, held: str) -> StopNotice:
        """This notice naming the server as the hub knows it (an annotation does not)."""
        return replace(self, server=server, held=held or self.held)

    def as_json(self) -> dict[str, Any]:
        """What the REST endpoint answers for it."""
        return {
            "server": self.server,
            "reason": self.reason,
            "stopped_at": iso_time(self.at),
            "held": self.held,
            "message": self.sentence(),
        }


@dataclass(frozen=True)
class CullWarning:
    """The culler's warning that a server will be stopped, and how to keep it."""

    #: The cull reason it will be stopped for (one of the culler's: idle, gpu-idle, ...).
    reason: str
    #: When it will be stopped if nothing changes (UTC epoch).
    cull_after: float
    #: The idle time so far, in seconds (as :attr:`StopNotice.seconds`).
    seconds: float | None = None
    server: str = ""
    held: str = ""
    #: As :attr:`StopNotice.detail` (budget: the period).
    detail: str = ""
    #: The keeps its user may choose now, in seconds ("Keep for 1 h"); empty: it cannot
    #: be kept (a deadline, a maximum age, pressure, or keeps not allowed for its image).
    keep_choices: tuple[float, ...] = ()
    #: Why it cannot be kept, one sentence ("" when it can, or when nobody asked).
    keep_refused: str = ""

    def keep_text(self) -> str:
        """How to keep it, ending the warning's sentence."""
        clock = utc_clock(self.cull_after)
        if self.reason in (REASON_GPU_IDLE, REASON_PRESSURE):
            return f"use it, or its GPUs, before {clock}"
        if self.reason == REASON_MAX_AGE:
            return "save your work: a server this old is stopped even when in use"
        if self.reason == REASON_MAX_RUNTIME:
            return "save your work: it is stopped at its maximum running time even when in use"
        if self.reason == REASON_BUDGET:
            return "save your work: it is stopped when the budget runs out, even when in use"
        return f"use it before {clock}"

    def sentence(self) -> str:
        notice = StopNotice(
            reason=self.reason, at=self.cull_after, seconds=self.seconds, detail=self.detail
        )
        who = _server_phrase(self.server, self.held)
        return (
            f"{who} will be stopped at {utc_clock(self.cull_after)} because "
            f"{_present(notice.because())}. To keep it, {self.keep_text()}."
        )

    def to_state(self) -> dict[str, Any]:
        state = _compact(self)
        # JSON has no tuples; an empty list says nothing a missing key does not
        state["keep_choices"] = list(self.keep_choices)
        if not self.keep_choices:
            del state["keep_choices"]
        return state

    @classmethod
    def from_state(cls, data: Any) -> CullWarning | None:
        data = _stored(data)
        if data is None:
            return None
        cull_after = _epoch(data.get("cull_after"))
        if cull_after is None:
            return None
        return cls(
            reason=data["reason"],
            cull_after=cull_after,
            seconds=_seconds(data.get("seconds")),
            server=_text(data.get("server")),
            held=_text(data.get("held")),
            detail=_text(data.get("detail")),
            keep_choices=_choices(data.get("keep_choices")),
            keep_refused=_text(data.get("keep_refused")),
        )

    def for_server(self, server: str, held: str) -> CullWarning:
        return replace(self, server=server, held=held or self.held)


#: The most keep choices a warning offers (buttons on a page); more are dropped.
MAX_KEEP_CHOICES = 4


def _choices(value: Any) -> tuple[float, ...]:
    """Keep choices read back: positive seconds up to :data:`MAX_SECONDS`, at most
    :data:`MAX_KEEP_CHOICES`; anything else reads as none."""
    if not isinstance(value, list):
        return ()
    seconds = [_seconds(v) for v in value[:MAX_KEEP_CHOICES]]
    return tuple(s for s in seconds if s)


def _present(because: str) -> str:
    """A stop reason in the present perfect, for a warning ("its GPUs have been idle ...")."""
    for past, present in (
        ("its GPUs were idle", "its GPUs have been idle"),
        ("it was not used", "it has not been used"),
        ("other users were waiting", "other users are waiting"),
        ("it reached the maximum age", "it reaches the maximum age"),
        ("it reached the maximum running time", "it reaches the maximum running time"),
        ("it used up", "it uses up"),
    ):
        because = because.replace(past, present)
    return because


def _html_with_time(sentence: str, epoch: float) -> Markup:
    clock = utc_clock(epoch)
    stamp = Markup('<time datetime="{}" data-gpuspawner-time>{}</time>').format(
        iso_time(epoch), clock
    )
    return stamp.join(escape(part) for part in sentence.split(clock))


def notice_html(notice: StopNotice) -> Markup:
    """The notice's sentence as HTML (escaped), its time in a ``<time>`` element."""
    return _html_with_time(notice.sentence(), notice.at)


def warning_html(warning: CullWarning) -> Markup:
    """The warning's sentence as HTML (escaped), its times in ``<time>`` elements."""
    return _html_with_time(warning.sentence(), warning.cull_after)


#: Replaces each ``<time data-gpuspawner-time>`` text by the reader's local HH:MM.
LOCAL_TIME_SCRIPT = Markup("""<script>
document.querySelectorAll("time[data-gpuspawner-time]").forEach(function (t) {
  var d = new Date(t.getAttribute("datetime"));
  if (!isNaN(d)) {
    t.textContent = d.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"});
    t.title = t.getAttribute("datetime");
  }
});
</script>""")


#: The spawner's state keys: the notice of the last stop, and what the running server
#: holds and where (for the notice of a stop the hub did not make).
STATE_KEY = "gpuspawner_stop_notice"
RUNNING_STATE_KEY = "gpuspawner_running"


def node_is_lost(nodes: list[Mapping[str, Any]], name: str) -> bool:
    """Whether the node ``name`` is gone from ``nodes`` (the API's listing) or not Ready."""
    for node in nodes:
        if (node.get("metadata") or {}).get("name") != name:
            continue
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return condition.get("status") != "True"
        return True
    return True
