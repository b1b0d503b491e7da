"""What the culler writes on a pod for its user: why it stopped it, or that it will (pure).

Before asking the hub to stop a server, the culler annotates its pod with the
reason (``gpuspawner.io/stop-reason``), which GPUSpawner keeps for the user's
next visit; if the hub does not stop it, the reason is taken off again. While
a warning stands, the pod carries it (``gpuspawner.io/cull-warning``) for the
hub's home page; it is removed when the warning is withdrawn. See
:mod:`gpuspawner.core.stopreasons`.

The pods are where warnings live between passes, not the culler's memory: each
pass reads the warnings on the pods it lists, so a culler that restarts takes
up the warnings its predecessor gave (:func:`adopt`) and clears those that no
longer stand (:func:`warning_writes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..core import labels, stopreasons
from . import policy

#: The culler's cull reasons as the stop notice names them.
_REASONS = {
    policy.REASON_IDLE: stopreasons.REASON_IDLE,
    policy.REASON_GPU_IDLE: stopreasons.REASON_GPU_IDLE,
    policy.REASON_PRESSURE: stopreasons.REASON_PRESSURE,
    policy.REASON_MAX_AGE: stopreasons.REASON_MAX_AGE,
    policy.REASON_MAX_RUNTIME: stopreasons.REASON_MAX_RUNTIME,
    policy.REASON_BUDGET: stopreasons.REASON_BUDGET,
}

#: Why a warned server cannot be kept, by cull reason (a keep puts off idle culls only).
KEEP_REFUSED = {
    policy.REASON_PRESSURE: (
        "Other users are waiting for its GPUs, so it cannot be kept: use it, or save your work."
    ),
    policy.REASON_MAX_AGE: "A keep cannot put off its maximum age: save your work.",
    policy.REASON_MAX_RUNTIME: "A keep cannot put off its maximum running time: save your work.",
    policy.REASON_BUDGET: "A keep cannot add GPU-hours to a budget: save your work.",
}
#: Why a server whose image allows no keep cannot be kept.
NO_KEEP = "Its image allows no keep: use it before then, or save your work."

#: Annotation values for a patch: a string sets the annotation, None removes it.
Annotations = dict[str, str | None]


def _seconds(d: policy.Decision) -> float | None:
    if d.reason == policy.REASON_BUDGET:
        return None
    if d.reason in (policy.REASON_MAX_AGE, policy.REASON_MAX_RUNTIME):
        return d.timeout
    return d.idle_seconds


def _detail(d: policy.Decision) -> str:
    deadline = d.server.deadline
    return deadline.detail if d.reason == policy.REASON_BUDGET and deadline else ""


def keep_offer(d: policy.Decision, p: policy.Policy) -> tuple[tuple[float, ...], str]:
    """The keeps a warned server's user may choose, and why none when there are none.

    Idle and GPU-idle warnings offer the policy's choices up to the server's max_keep;
    pressure only when the admin lets a keep override it; deadlines and max_age never.
    """
    refused = KEEP_REFUSED.get(d.reason, "")
    if d.reason == policy.REASON_PRESSURE and p.keep_overrides_pressure:
        refused = ""
    if refused:
        return (), refused
    choices = p.keep_choices_for(d.server)
    return choices, "" if choices else NO_KEEP


def stop_annotations(d: policy.Decision, now: float) -> Annotations:
    """The annotations to write before culling ``d``'s server (and the warning removed)."""
    notice = stopreasons.StopNotice(
        _REASONS.get(d.reason, stopreasons.REASON_IDLE),
        now,
        seconds=_seconds(d),
        detail=_detail(d),
    )
    return {
        labels.ANNOTATION_STOP_REASON: json.dumps(notice.to_state()),
        labels.ANNOTATION_CULL_WARNING: None,
    }


def warning_annotations(
    d: policy.Decision, cull_after: float, p: policy.Policy | None = None
) -> Annotations:
    """The annotation of a warned server: why and when it will be culled, and the keeps
    its user may choose (none without ``p``)."""
    choices, refused = keep_offer(d, p) if p is not None else ((), "")
    warning = stopreasons.CullWarning(
        _REASONS.get(d.reason, stopreasons.REASON_IDLE),
        cull_after,
        seconds=_seconds(d),
        detail=_detail(d),
        keep_choices=choices,
        keep_refused=refused,
    )
    return {labels.ANNOTATION_CULL_WARNING: json.dumps(warning.to_state())}


def keep_annotations(until: float, seconds: float, now: float) -> Annotations:
    """A keep chosen by the server's user: until when, and the warning it withdraws."""
    keep = {"until": until, "seconds": seconds, "at": now}
    return {labels.ANNOTATION_KEEP_UNTIL: json.dumps(keep), labels.ANNOTATION_CULL_WARNING: None}


def stop_failed_annotations(
    d: policy.Decision, cull_after: float | None, p: policy.Policy | None = None
) -> Annotations:
    """What ``d``'s pod carries again when the hub did not stop the server: no stop
    reason (its user did not lose it to the culler), and its warning if it had one."""
    warning = None if cull_after is None else warning_annotations(d, cull_after, p)
    return {
        labels.ANNOTATION_STOP_REASON: None,
        labels.ANNOTATION_CULL_WARNING: warning and warning[labels.ANNOTATION_CULL_WARNING],
    }


#: The stop notice's reasons as the culler's policy names them (the same words today).
_POLICY_REASONS = {notice: policy for policy, notice in _REASONS.items()}

#: A warning on a pod is already what the culler would write if its time is this close, in seconds.
SAME_TIME = 1.0


def adopt(
    on_pods: Mapping[tuple[str, str], stopreasons.CullWarning | None],
    now: float,
    warning_period: float,
    grace: float,
) -> dict[tuple[str, str], policy.WarningMark]:
    """The warnings standing on pods that a culler takes up as its own.

    A warning is taken up when its cull time is still ahead, no further than
    ``warning_period`` (a later time is not one this culler would have given,
    and would put the cull off), or passed less than ``grace`` seconds ago
    (one pass interval: the culler was there to act on it). One whose time
    passed longer ago was not acted on when announced: it is stale, and the
    server gets a new warning, with a new time, if it is still eligible.
    """
    if warning_period <= 0:
        return {}
    marks = {}
    for key, warning in on_pods.items():
        if warning is None or warning.reason not in _POLICY_REASONS:
            continue
        if now - grace < warning.cull_after <= now + warning_period:
            marks[key] = policy.WarningMark(
                warned_at=warning.cull_after - warning_period,
                reason=_POLICY_REASONS[warning.reason],
            )
    return marks


@dataclass(frozen=True)
class WarningWrite:
    """One annotation patch of a warned (or no longer warned) server's pod."""

    server: policy.Server
    annotations: Annotations
    #: The cull time the pod's warning says once this is written; None: no warning left.
    cull_after: float | None


def warning_writes(
    decisions: Iterable[policy.Decision],
    marks: Mapping[tuple[str, str], policy.WarningMark],
    on_pods: Mapping[tuple[str, str], float | None],
    warning_period: float,
    p: policy.Policy | None = None,
) -> dict[tuple[str, str], WarningWrite]:
    """The patches that make the pods' warnings match this pass's decisions.

    ``on_pods``: the cull time of the warning each server's pod carries (None:
    one that does not parse). A warned server's pod gets its warning unless it
    carries that time already; a warning on the pod of a server that is neither
    warned nor culled now (used again, exempt, stale, or warnings turned off) is
    removed. A culled server's warning goes with its stop annotations.
    """
    writes = {}
    for d in decisions:
        key = d.server.key
        current = on_pods.get(key)
        if d.action == policy.WARN and key in marks:
            cull_after = marks[key].warned_at + warning_period
            if current is None or abs(current - cull_after) > SAME_TIME:
                writes[key] = WarningWrite(
                    d.server, warning_annotations(d, cull_after, p), cull_after
                )
        elif d.action != policy.CULL and key in on_pods:
            writes[key] = WarningWrite(d.server, {labels.ANNOTATION_CULL_WARNING: None}, None)
    return writes
