"""What the culler writes on a pod for its user: why it stopped it, or that it will (pure).

Before asking the hub to stop a server, the culler annotates its pod with the
reason (``gpuspawner.io/stop-reason``), which GPUSpawner keeps for the user's
next visit. While a warning stands, the pod carries it
(``gpuspawner.io/cull-warning``) for the hub's home page; it is removed when
the warning is withdrawn. See :mod:`gpuspawner.stopnotice`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from .. import labels, stopnotice
from . import policy as P

#: The culler's cull reasons as the stop notice names them.
_REASONS = {
    P.REASON_IDLE: stopnotice.REASON_IDLE,
    P.REASON_GPU_IDLE: stopnotice.REASON_GPU_IDLE,
    P.REASON_PRESSURE: stopnotice.REASON_PRESSURE,
    P.REASON_MAX_AGE: stopnotice.REASON_MAX_AGE,
}

#: Annotation values for a patch: a string sets the annotation, None removes it.
Annotations = dict[str, str | None]


def _seconds(d: P.Decision) -> float | None:
    return d.timeout if d.reason == P.REASON_MAX_AGE else d.idle_seconds


def stop_annotations(d: P.Decision, now: float) -> Annotations:
    """The annotations to write before culling ``d``'s server (and the warning removed)."""
    notice = stopnotice.StopNotice(
        _REASONS.get(d.reason, stopnotice.REASON_IDLE), now, seconds=_seconds(d)
    )
    return {
        labels.ANNOTATION_STOP_REASON: json.dumps(notice.to_state()),
        labels.ANNOTATION_CULL_WARNING: None,
    }


def warning_annotations(d: P.Decision, cull_after: float) -> Annotations:
    """The annotation of a warned server: why and when it will be culled."""
    warning = stopnotice.CullWarning(
        _REASONS.get(d.reason, stopnotice.REASON_IDLE), cull_after, seconds=_seconds(d)
    )
    return {labels.ANNOTATION_CULL_WARNING: json.dumps(warning.to_state())}


def withdrawn(
    decisions: Iterable[P.Decision],
    before: Iterable[tuple[str, str]],
    now_warned: Mapping[tuple[str, str], P.WarningMark],
) -> list[P.Server]:
    """Servers whose pod carries a warning no longer standing (neither warned nor culled now)."""
    before = set(before)
    return [
        d.server
        for d in decisions
        if d.server.key in before and d.server.key not in now_warned and d.action != P.CULL
    ]
