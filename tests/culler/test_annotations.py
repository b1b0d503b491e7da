"""The culler's warnings on pods, worked out from the pods on each pass (pure)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from gpuspawner.core import labels, stopreasons
from gpuspawner.culler import annotations as N
from gpuspawner.culler import policy as P
from gpuspawner.culler.pods import warnings_on_pods

from ..conftest import FIXTURES

NOW = 1_800_000_000.0
PERIOD = 600.0
EVERY = 300.0
PODS = json.loads((FIXTURES / "culler-pods" / "podlist.json").read_text())["items"]


def warning(cull_after: float, reason: str = stopreasons.REASON_IDLE) -> stopreasons.CullWarning:
    return stopreasons.CullWarning(reason, cull_after, seconds=3600)


def decision(user: str, action: str, reason: str = P.REASON_IDLE) -> P.Decision:
    return P.Decision(P.Server(user=user, pod=f"jupyter-{user}"), action, reason, idle_seconds=9)


def test_a_restarted_culler_takes_up_warnings_still_ahead_and_drops_stale_ones():
    on_pods = {
        ("ahead", ""): warning(NOW + 200, stopreasons.REASON_GPU_IDLE),
        ("due", ""): warning(NOW - 10),  # due at this pass: the culler was there for it
        ("stale", ""): warning(NOW - EVERY - 1),  # due passes ago, nobody acted: not kept
        ("too-far", ""): warning(NOW + PERIOD + 1),  # later than this culler would announce
        ("unreadable", ""): None,
        ("not-ours", ""): warning(NOW + 10, stopreasons.REASON_ADMIN),
    }
    marks = N.adopt(on_pods, NOW, PERIOD, grace=EVERY)
    assert marks == {
        ("ahead", ""): P.WarningMark(warned_at=NOW + 200 - PERIOD, reason=P.REASON_GPU_IDLE),
        ("due", ""): P.WarningMark(warned_at=NOW - 10 - PERIOD, reason=P.REASON_IDLE),
    }
    assert N.adopt(on_pods, NOW, 0, grace=EVERY) == {}  # warnings turned off: none stands


def test_taken_up_warnings_are_kept_to_their_time_or_culled_at_it():
    servers = [P.Server(user=u, started=NOW - 9000, last_activity=NOW - 9000) for u in ("a", "d")]
    marks = N.adopt(
        {("a", ""): warning(NOW + 200), ("d", ""): warning(NOW - 10)}, NOW, PERIOD, grace=EVERY
    )
    policy = P.Policy(default_timeout=3600, warning_period=PERIOD)
    decisions, _ = P.decide(servers, NOW, policy, warned=marks)
    assert [(d.server.user, d.action) for d in decisions] == [("a", P.WARN), ("d", P.CULL)]


def test_the_pods_warnings_are_made_to_match_the_decisions():
    marks = {
        ("new", ""): P.WarningMark(NOW, P.REASON_IDLE),
        ("same", ""): P.WarningMark(NOW - 100, P.REASON_IDLE),
        ("moved", ""): P.WarningMark(NOW, P.REASON_IDLE),
    }
    on_pods = {
        ("same", ""): NOW - 100 + PERIOD + 0.5,  # what it carries already: not written again
        ("moved", ""): NOW - 5000,  # a stale time: replaced
        ("used", ""): NOW + 10,  # used again: its warning goes
        ("junk", ""): None,  # unreadable, on a server kept: it goes
        ("culled", ""): NOW - 1,  # the stop annotations take it off
    }
    decisions = [
        decision("new", P.WARN),
        decision("same", P.WARN),
        decision("moved", P.WARN),
        decision("used", P.KEEP, P.REASON_ACTIVE),
        decision("junk", P.SKIP, P.REASON_EXEMPT),
        decision("culled", P.CULL),
        decision("plain", P.KEEP, P.REASON_ACTIVE),
    ]
    writes = N.warning_writes(decisions, marks, on_pods, PERIOD)
    assert sorted(writes) == [("junk", ""), ("moved", ""), ("new", ""), ("used", "")]
    for key in (("new", ""), ("moved", "")):
        cull_after = marks[key].warned_at + PERIOD
        assert writes[key].cull_after == cull_after
        written = writes[key].annotations[labels.ANNOTATION_CULL_WARNING]
        assert stopreasons.CullWarning.from_state(written).cull_after == cull_after
    for key in (("used", ""), ("junk", "")):
        assert writes[key].annotations == {labels.ANNOTATION_CULL_WARNING: None}
        assert writes[key].cull_after is None


def test_a_failed_stop_takes_the_reason_off_and_puts_the_warning_back():
    d = decision("x", P.CULL, P.REASON_GPU_IDLE)
    assert N.stop_failed_annotations(d, None) == {
        labels.ANNOTATION_STOP_REASON: None,
        labels.ANNOTATION_CULL_WARNING: None,
    }
    back = N.stop_failed_annotations(d, NOW - 1)
    assert back[labels.ANNOTATION_STOP_REASON] is None
    restored = stopreasons.CullWarning.from_state(back[labels.ANNOTATION_CULL_WARNING])
    assert (restored.reason, restored.cull_after) == (stopreasons.REASON_GPU_IDLE, NOW - 1)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (json.dumps(warning(NOW).to_state()), warning(NOW)),
        ("{not json", None),
        (json.dumps({"reason": "idle", "cull_after": "soon"}), None),
        ("", None),
    ],
)
def test_warnings_are_read_from_the_pods_annotations(raw, expected):
    pods = copy.deepcopy(PODS)
    run = next(p for p in pods if p["metadata"]["name"] == "jupyter-run")
    run["metadata"]["annotations"][labels.ANNOTATION_CULL_WARNING] = raw
    gone = next(p for p in pods if p["metadata"].get("deletionTimestamp"))
    gone["metadata"].setdefault("annotations", {})[labels.ANNOTATION_CULL_WARNING] = raw
    # one entry: the running server's pod; a pod being deleted is no server's any more
    assert warnings_on_pods(pods) == {("run", ""): expected}


def test_keep_offers_follow_the_reason_and_the_servers_max_keep():
    policy = P.Policy(keep_choices=(3600.0, 14400.0))
    server = P.Server(user="u", pod="jupyter-u", max_keep=3600)
    idle = P.Decision(server, P.WARN, P.REASON_IDLE, idle_seconds=9)
    assert N.keep_offer(idle, policy) == ((3600.0,), "")
    written = N.warning_annotations(idle, NOW + PERIOD, policy)[labels.ANNOTATION_CULL_WARNING]
    warning = stopreasons.CullWarning.from_state(written)
    assert (warning.keep_choices, warning.keep_refused) == ((3600.0,), "")
    pressure = P.Decision(server, P.WARN, P.REASON_PRESSURE, idle_seconds=9)
    choices, refused = N.keep_offer(pressure, policy)
    assert choices == () and refused.startswith("Other users are waiting")
    assert N.keep_offer(pressure, replace(policy, keep_overrides_pressure=True))[0] == (3600.0,)
    for reason in (P.REASON_MAX_AGE, P.REASON_MAX_RUNTIME, P.REASON_BUDGET):
        choices, refused = N.keep_offer(P.Decision(server, P.WARN, reason), policy)
        assert choices == () and "save your work" in refused, reason
    none = P.Decision(P.Server(user="u", max_keep=0), P.WARN, P.REASON_IDLE)
    assert N.keep_offer(none, policy) == ((), N.NO_KEEP)


def test_deadline_stops_and_warnings_say_which_and_a_keep_withdraws_the_warning():
    budget = P.Server(
        user="u", pod="jupyter-u", deadline=P.Deadline(NOW, P.REASON_BUDGET, detail="this week")
    )
    d = P.Decision(budget, P.CULL, P.REASON_BUDGET, idle_seconds=5)
    notice = stopreasons.StopNotice.from_state(
        N.stop_annotations(d, NOW)[labels.ANNOTATION_STOP_REASON]
    )
    assert (notice.reason, notice.detail, notice.seconds) == ("budget", "this week", None)
    runtime = P.Decision(
        P.Server(user="u"), P.CULL, P.REASON_MAX_RUNTIME, idle_seconds=5, timeout=8 * 3600
    )
    notice = stopreasons.StopNotice.from_state(
        N.stop_annotations(runtime, NOW)[labels.ANNOTATION_STOP_REASON]
    )
    assert (notice.reason, notice.seconds) == ("max-runtime", 8 * 3600)
    assert "maximum running time of 8 hours" in notice.sentence()
    keep = N.keep_annotations(NOW + 3600, 3600, NOW)
    assert json.loads(keep[labels.ANNOTATION_KEEP_UNTIL]) == {
        "until": NOW + 3600,
        "seconds": 3600,
        "at": NOW,
    }
    assert keep[labels.ANNOTATION_CULL_WARNING] is None
