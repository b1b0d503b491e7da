"""Tests for gpuspawner.core.stopreasons: every reason's sentence, the state round trip, junk."""

import json
from datetime import datetime, timezone

import pytest

from gpuspawner.core import stopreasons as S

AT = datetime(2026, 12, 1, 14, 2, 30, tzinfo=timezone.utc).timestamp()


def test_the_issue_example():
    notice = S.StopNotice(
        reason=S.REASON_GPU_IDLE, at=AT, server="train", held="2 × NVIDIA A100", seconds=7200
    )
    assert notice.sentence() == (
        "Your server 'train' (2 × NVIDIA A100) was stopped at 14:02 UTC "
        "because its GPUs were idle for 2 hours."
    )


@pytest.mark.parametrize(
    "notice, because",
    [
        (S.StopNotice(S.REASON_IDLE, AT, seconds=5400), "it was not used for 90 minutes"),
        (
            S.StopNotice(S.REASON_GPU_IDLE, AT, seconds=9000),
            "its GPUs were idle for 2 hours 30 minutes",
        ),
        (
            S.StopNotice(S.REASON_PRESSURE, AT, seconds=1800),
            "its GPUs were idle for 30 minutes while other users were waiting for them",
        ),
        (
            S.StopNotice(S.REASON_MAX_AGE, AT, seconds=3 * 86400),
            "it reached the maximum age of 3 days",
        ),
        (
            S.StopNotice(S.REASON_GPU_CHECK, AT, kind="xid-error", detail="GPU 1 reported Xid 79."),
            "its GPUs failed their check (xid-error): GPU 1 reported Xid 79",
        ),
        (
            S.StopNotice(
                S.REASON_GPU_CHECK,
                AT,
                kind=S.NOT_STARTABLE_KIND,
                detail="The check image 'x' has no python3.",
            ),
            "its GPUs could not be checked: The check image 'x' has no python3",
        ),
        (
            S.StopNotice(S.REASON_STUCK_PENDING, AT, seconds=300),
            "no node had free GPUs for it for 5 minutes",
        ),
        (S.StopNotice(S.REASON_ADMIN, AT), "an admin stopped it from the GPU page"),
        (
            S.StopNotice(S.REASON_NODE_LOST, AT, detail="gpu-a-1"),
            "the node it ran on (gpu-a-1) was lost",
        ),
        (
            S.StopNotice(S.REASON_BUDGET, AT, detail="this week"),
            "it used up its user's GPU-hours budget for this week",
        ),
        (
            S.StopNotice(S.REASON_MAX_RUNTIME, AT, seconds=8 * 3600),
            "it reached the maximum running time of 8 hours",
        ),
        (
            S.StopNotice(S.REASON_PREEMPTED, AT, detail=S.PREEMPTED_FOR_PRIORITY),
            "it was preempted for queued work (Kueue gave its GPUs to higher-priority work)",
        ),
        (
            S.StopNotice(S.REASON_PREEMPTED, AT, detail=S.PREEMPTED_TO_RECLAIM),
            "it was preempted for queued work (its GPUs were borrowed from another queue, "
            "which took them back)",
        ),
        (
            S.StopNotice(S.REASON_PREEMPTED, AT, detail=S.PREEMPTED_FOR_FAIR_SHARING),
            "it was preempted for queued work (Kueue's fair sharing gave its GPUs to another "
            "queue)",
        ),
        (
            # a cause Kueue did not say, or a stored one this version does not know
            S.StopNotice(S.REASON_PREEMPTED, AT, detail="<b>later</b>"),
            "it was preempted for queued work (Kueue gave its GPUs to other work)",
        ),
    ],
)
def test_every_reason_has_its_sentence(notice, because):
    assert notice.sentence() == f"Your server was stopped at 14:02 UTC because {because}."


def test_every_reason_is_covered_by_a_sentence_without_a_duration():
    for reason in S.REASONS:
        sentence = S.StopNotice(reason, AT).sentence()
        assert "stopped by the hub" not in sentence, reason
        assert "None" not in sentence, reason


def test_duration_text():
    assert S.duration_text(1) == "1 second"
    assert S.duration_text(119) == "119 seconds"
    assert S.duration_text(120) == "2 minutes"
    assert S.duration_text(3600) == "60 minutes"
    assert S.duration_text(7260) == "2 hours 1 minute"
    assert S.duration_text(86400) == "24 hours"
    assert S.duration_text(2 * 86400) == "2 days"


def test_held_text():
    assert S.held_text(2, "NVIDIA A100") == "2 × NVIDIA A100"
    assert S.held_text(0, "NVIDIA A100") == ""
    assert S.held_text(1, None) == ""


def test_state_round_trip_through_json():
    notice = S.StopNotice(
        S.REASON_GPU_CHECK, AT, server="x", held="1 × T4", kind="driver-too-old", detail="old"
    )
    stored = json.loads(json.dumps(notice.to_state()))
    assert S.StopNotice.from_state(stored) == notice
    assert S.StopNotice.from_state(json.dumps(stored)) == notice


@pytest.mark.parametrize(
    "junk",
    [
        None,
        "",
        "not json",
        "[1, 2]",
        42,
        [],
        {},
        {"reason": "idle"},
        {"reason": "eaten-by-grue", "at": AT},
        {"reason": "idle", "at": "yesterday"},
        {"reason": "idle", "at": -5},
        {"reason": "idle", "at": float("nan")},
        {"reason": "idle", "at": True},
        {"reason": ["idle"], "at": AT},
    ],
)
def test_junk_reads_as_no_notice(junk):
    assert S.StopNotice.from_state(junk) is None
    assert S.CullWarning.from_state(junk) is None


def test_junk_fields_are_dropped_not_fatal():
    notice = S.StopNotice.from_state(
        {"reason": "idle", "at": AT, "seconds": "long", "server": 7, "detail": "x" * 5000}
    )
    assert notice == S.StopNotice("idle", AT, detail="x" * S.MAX_TEXT)
    assert notice.sentence().endswith("because it was not used for a long time.")


def test_for_server_names_the_server_and_keeps_a_known_holding():
    notice = S.StopNotice(S.REASON_ADMIN, AT, held="1 × T4")
    assert notice.for_server("b", "").sentence().startswith("Your server 'b' (1 × T4) was")
    assert notice.for_server("b", "2 × A100").held == "2 × A100"


def test_html_escapes_user_text_and_marks_the_time():
    notice = S.StopNotice(S.REASON_NODE_LOST, AT, server="<b>x</b>", detail="n&1")
    html = S.notice_html(notice)
    assert "<b>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html
    assert "(n&amp;1)" in html
    assert '<time datetime="2026-12-01T14:02:30Z" data-gpuspawner-time>14:02 UTC</time>' in html


def test_as_json_for_the_rest_endpoint():
    notice = S.StopNotice(S.REASON_ADMIN, AT, server="a", held="1 × T4")
    assert notice.as_json() == {
        "server": "a",
        "reason": "admin",
        "stopped_at": "2026-12-01T14:02:30Z",
        "held": "1 × T4",
        "message": notice.sentence(),
    }


def test_cull_warning_sentences():
    warning = S.CullWarning(S.REASON_GPU_IDLE, AT, seconds=7200, server="x", held="1 × T4")
    assert warning.sentence() == (
        "Your server 'x' (1 × T4) will be stopped at 14:02 UTC because its GPUs have been "
        "idle for 2 hours. To keep it, use it, or its GPUs, before 14:02 UTC."
    )
    idle = S.CullWarning(S.REASON_IDLE, AT, seconds=3600)
    assert idle.sentence() == (
        "Your server will be stopped at 14:02 UTC because it has not been used for 60 minutes. "
        "To keep it, use it before 14:02 UTC."
    )
    html = S.warning_html(warning)
    assert html.count("<time ") == 2


def test_cull_warning_round_trip():
    warning = S.CullWarning(S.REASON_PRESSURE, AT, seconds=60)
    assert S.CullWarning.from_state(json.dumps(warning.to_state())) == warning


def test_deadline_warnings_say_no_keep_helps():
    budget = S.CullWarning(S.REASON_BUDGET, AT, detail="this week", server="train")
    assert budget.sentence() == (
        "Your server 'train' will be stopped at 14:02 UTC because it uses up its user's "
        "GPU-hours budget for this week. To keep it, save your work: it is stopped when the "
        "budget runs out, even when in use."
    )
    runtime = S.CullWarning(S.REASON_MAX_RUNTIME, AT, seconds=8 * 3600)
    assert runtime.sentence() == (
        "Your server will be stopped at 14:02 UTC because it reaches the maximum running time "
        "of 8 hours. To keep it, save your work: it is stopped at its maximum running time "
        "even when in use."
    )
    assert set(S.DEADLINE_REASONS) == {S.REASON_MAX_AGE, S.REASON_BUDGET, S.REASON_MAX_RUNTIME}


def test_keep_choices_round_trip_and_junk():
    warning = S.CullWarning(S.REASON_IDLE, AT, seconds=60, keep_choices=(3600.0, 14400.0))
    state = json.loads(json.dumps(warning.to_state()))
    assert state["keep_choices"] == [3600.0, 14400.0]
    assert S.CullWarning.from_state(state) == warning
    refused = S.CullWarning(S.REASON_PRESSURE, AT, keep_refused="Other users are waiting.")
    assert "keep_choices" not in refused.to_state()
    assert S.CullWarning.from_state(refused.to_state()) == refused
    # an annotation anyone who may edit the pod could write: junk reads as no choices
    for junk in ("3600", [True, -1, "x", float("nan"), 1e30], {"a": 1}, [0]):
        state = {"reason": "idle", "cull_after": AT, "keep_choices": junk}
        assert S.CullWarning.from_state(state).keep_choices == (), junk
    many = {"reason": "idle", "cull_after": AT, "keep_choices": [60] * 10}
    assert len(S.CullWarning.from_state(many).keep_choices) == S.MAX_KEEP_CHOICES


def test_a_preemption_notice_is_kept_and_read_back_like_any_other():
    """The spawner keeps it in its state; the home page and the REST endpoint show it."""
    notice = S.StopNotice(
        S.REASON_PREEMPTED,
        AT,
        server="train",
        held="1 × NVIDIA A100",
        detail=S.PREEMPTED_FOR_PRIORITY,
    )
    stored = json.loads(json.dumps(notice.to_state()))
    assert stored == {
        "reason": "preempted",
        "at": AT,
        "server": "train",
        "held": "1 × NVIDIA A100",
        "detail": "priority",
    }
    assert S.StopNotice.from_state(stored) == notice
    assert notice.as_json()["message"] == (
        "Your server 'train' (1 × NVIDIA A100) was stopped at 14:02 UTC because it was "
        "preempted for queued work (Kueue gave its GPUs to higher-priority work)."
    )
    html = str(S.notice_html(notice))
    assert "because it was preempted for queued work (Kueue gave its GPUs" in html
    assert '<time datetime="' in html
