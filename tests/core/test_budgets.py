"""GPU-hours budgets: periods in UTC at their boundaries, the rule that applies, what is left."""

from __future__ import annotations

import calendar
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core.budgets import (
    REASON_BUDGET,
    Budget,
    BudgetStatus,
    Period,
    check_budget,
    current_period,
    effective_budget,
    exhaustion_time,
    hours_text,
    reset_text,
    short_duration,
)
from gpuspawner.core.catalog import BudgetRules
from gpuspawner.core.refusals import Refusal


def utc(*parts: int) -> float:
    """Unix seconds of a UTC time (year, month, day[, hour, minute, second])."""
    return float(calendar.timegm((*parts, *(0,) * (6 - len(parts)))))


def period_of(now: float, **rules) -> tuple[float, float]:
    period = current_period(BudgetRules(**rules), now)
    return period.start, period.end


# ---------------------------------------------------------------------------
# periods
# ---------------------------------------------------------------------------


def test_a_week_from_monday_midnight_by_default():
    friday = utc(2026, 12, 4, 10)
    period = current_period(BudgetRules(), friday)
    assert period == Period(
        start=utc(2026, 11, 30),
        end=utc(2026, 12, 7),
        name="this week",
        reset_text="Monday 00:00 UTC",
    )


def test_a_now_equal_to_the_reset_is_in_the_new_period():
    tuesday = utc(2026, 12, 8, 6, 30)  # a Tuesday
    rules = {"period": "week", "reset_weekday": 1, "reset_seconds": 6 * 3600 + 1800}
    assert period_of(tuesday, **rules) == (tuesday, tuesday + 7 * 86400)
    assert period_of(tuesday - 1, **rules) == (tuesday - 7 * 86400, tuesday)
    assert period_of(tuesday - 0.001, **rules) == (tuesday - 7 * 86400, tuesday)
    day = {"period": "day", "reset_seconds": 6 * 3600}
    six = utc(2026, 12, 4, 6)
    assert period_of(six, **day) == (six, six + 86400)
    assert period_of(six - 1, **day) == (six - 86400, six)
    assert period_of(utc(2026, 12, 4, 5, 59, 59), **day) == (six - 86400, six)
    assert period_of(utc(2026, 12, 4, 23, 59, 59), **day) == (six, six + 86400)


def test_a_week_that_resets_on_sunday_evening():
    rules = {"period": "week", "reset_weekday": 6, "reset_seconds": 22 * 3600}
    sunday_night = utc(2026, 12, 6, 22)
    assert datetime.fromtimestamp(sunday_night, timezone.utc).strftime("%A") == "Sunday"
    assert period_of(utc(2026, 12, 6, 21, 59), **rules) == (utc(2026, 11, 29, 22), sunday_night)
    assert period_of(utc(2026, 12, 7, 9), **rules) == (sunday_night, utc(2026, 12, 13, 22))


def test_months_from_the_first_and_across_the_year():
    assert period_of(utc(2026, 12, 31, 23, 59, 59), period="month") == (
        utc(2026, 12, 1),
        utc(2027, 1, 1),
    )
    assert period_of(utc(2027, 1, 1), period="month") == (utc(2027, 1, 1), utc(2027, 2, 1))
    assert period_of(utc(2027, 1, 15), period="month") == (utc(2027, 1, 1), utc(2027, 2, 1))


def test_a_month_that_resets_on_the_28th_in_february():
    rules = {"period": "month", "reset_day": 28, "reset_seconds": 23 * 3600 + 1800}
    # 2027: February has 28 days; the period from Feb 28 23:30 takes in March 1 to 28 23:29
    assert period_of(utc(2027, 3, 1), **rules) == (
        utc(2027, 2, 28, 23, 30),
        utc(2027, 3, 28, 23, 30),
    )
    assert period_of(utc(2027, 2, 28, 23, 29), **rules) == (
        utc(2027, 1, 28, 23, 30),
        utc(2027, 2, 28, 23, 30),
    )
    # 2028 is a leap year: February 29 is in the period that started on the 28th
    assert period_of(utc(2028, 2, 29, 12), **rules) == (
        utc(2028, 2, 28, 23, 30),
        utc(2028, 3, 28, 23, 30),
    )
    # and January's reset is in the year before
    assert period_of(utc(2027, 1, 10), **rules) == (
        utc(2026, 12, 28, 23, 30),
        utc(2027, 1, 28, 23, 30),
    )


def test_period_names_and_reset_texts():
    assert current_period(BudgetRules(period="day"), 0).name == "today"
    assert current_period(BudgetRules(period="month"), 0).name == "this month"
    assert reset_text(BudgetRules(period="day", reset_seconds=6 * 3600 + 300)) == "06:05 UTC"
    assert reset_text(BudgetRules(period="week", reset_weekday=4)) == "Friday 00:00 UTC"
    texts = [
        reset_text(BudgetRules(period="month", reset_day=d))
        for d in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 28)
    ]
    assert texts == [
        f"the {d}, 00:00 UTC"
        for d in (
            "1st",
            "2nd",
            "3rd",
            "4th",
            "11th",
            "12th",
            "13th",
            "21st",
            "22nd",
            "23rd",
            "28th",
        )
    ]


def test_an_unknown_period_is_an_error():
    with pytest.raises(ValueError):
        current_period(BudgetRules(period="year"), 0)


RULES = st.builds(
    BudgetRules,
    period=st.sampled_from(["day", "week", "month"]),
    reset_weekday=st.integers(0, 6),
    reset_day=st.integers(1, 28),
    reset_seconds=st.integers(0, 1439).map(lambda m: m * 60),
)
NOW = st.integers(utc(2000, 1, 1), utc(2100, 1, 1)) | st.floats(utc(2000, 1, 1), utc(2100, 1, 1))


@settings(max_examples=500, deadline=None)
@given(RULES, NOW)
def test_every_period_holds_now_and_starts_at_a_reset(rules, now):
    period = current_period(rules, now)
    assert period.start <= now < period.end
    start = datetime.fromtimestamp(period.start, timezone.utc)
    assert start.hour * 3600 + start.minute * 60 + start.second == rules.reset_seconds
    if rules.period == "week":
        assert start.weekday() == rules.reset_weekday
        assert period.end - period.start == 7 * 86400
    elif rules.period == "month":
        assert start.day == rules.reset_day
        assert 28 * 86400 <= period.end - period.start <= 31 * 86400
    else:
        assert period.end - period.start == 86400
    # the periods tile time: the next starts where this one ends, the start is in this one
    assert current_period(rules, period.start) == period
    assert current_period(rules, period.end).start == period.end
    assert current_period(rules, period.start - 1).end == period.start


# ---------------------------------------------------------------------------
# whose budget
# ---------------------------------------------------------------------------

BUDGETS = BudgetRules(
    default=40,
    groups={"ml-team": 100, "class": 10, "staff": None},
    users={"alice": 5, "root": None},
)


@pytest.mark.parametrize(
    "user, groups, expected",
    [
        (
            "alice",
            ["ml-team"],
            Budget(5, "user rule 'alice'"),
        ),  # a user's own rule wins, even smaller
        ("root", [], Budget(None, "user rule 'root'")),
        ("bob", ["class", "ml-team"], Budget(100, "group rule 'ml-team'")),  # the most generous
        ("bob", ["ml-team", "staff"], Budget(None, "group rule 'staff'")),  # unlimited is most
        ("bob", ["class", "unknown"], Budget(10, "group rule 'class'")),  # even below the default
        ("bob", ["unknown"], Budget(40, "the default rule")),
        ("bob", [], Budget(40, "the default rule")),
    ],
)
def test_the_budget_that_applies(user, groups, expected):
    assert effective_budget(BUDGETS, user, groups) == expected


def test_equal_groups_name_the_alphabetically_first():
    rules = BudgetRules(groups={"b": 10, "a": 10})
    assert effective_budget(rules, "x", ["b", "a"]).rule == "group rule 'a'"


def test_without_rules_everyone_is_unlimited():
    assert effective_budget(BudgetRules(), "x", ["g"]) == Budget(None, "the default rule")
    assert not BudgetRules().enabled
    assert BudgetRules(users={"x": 0}).enabled


# ---------------------------------------------------------------------------
# what is left, and what the form says
# ---------------------------------------------------------------------------

WEEK = current_period(BudgetRules(), utc(2026, 12, 4, 10))


def status(hours, used, held=0.0, period=WEEK):
    return BudgetStatus(Budget(hours, "the default rule"), period, used, held)


def test_the_forms_line_and_choices():
    s = status(40, 14.5)
    assert s.text() == "14.5 of 40 GPU-hours used this week; resets Monday 00:00 UTC"
    assert (s.remaining_hours, s.spent) == (25.5, False)
    assert s.choices_text([("1 × A100", 1), ("2 × A100", 2)]) == (
        "The rest allows 1 × A100 for 25 h 30 min, 2 × A100 for 12 h 45 min."
    )
    # what the user holds now shares the rest: 1 held + 1 asked for
    assert status(40, 14.5, held=1).choices_text([("1 × A100", 1)]) == (
        "The rest allows 1 × A100 for 12 h 45 min."
    )
    # four hours before the reset, the budget renews before 25 h run out
    late = utc(2026, 12, 6, 20)
    assert s.choices_text([("1 × A100", 1), ("8 × A100", 8)], now=late) == (
        "The rest allows 1 × A100 until the reset, 8 × A100 for 3 h 11 min."
    )
    # a MIG slice (1/7 of a GPU) runs seven times as long
    assert status(40, 39, held=0).hours_for(1 / 7) == pytest.approx(7)


def test_unlimited_and_spent():
    unlimited = status(None, 3.25)
    assert unlimited.remaining_hours is None and not unlimited.spent
    assert unlimited.hours_for(1) is None and unlimited.choices_text([("1 × A100", 1)]) == ""
    assert unlimited.text() == "3.2 GPU-hours used this week; no budget applies"
    over = status(40, 41)  # a server ran past it before it was stopped
    assert over.remaining_hours == 0 and over.spent
    assert over.text() == "41 of 40 GPU-hours used this week; resets Monday 00:00 UTC"
    assert status(0, 0).spent


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "less than 1 min"),
        (59, "less than 1 min"),
        (60, "1 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (91800, "25 h 30 min"),
        (-5, "less than 1 min"),
    ],
)
def test_short_durations(seconds, text):
    assert short_duration(seconds) == text


def test_hours_text():
    assert [hours_text(h) for h in (40, 14.5, 0.04, 0.25, 99.96)] == [
        "40",
        "14.5",
        "0",
        "0.2",
        "100",
    ]


# ---------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------


def test_a_request_the_budget_covers_is_not_refused():
    assert check_budget(status(40, 14.5), 2, 900, "2 × A100") is None
    assert check_budget(status(None, 1e6, held=8), 8, 900, "8 × A100") is None
    # exactly min_session left: it fits
    assert check_budget(status(40, 39.5), 2, 900, "2 × A100") is None


def test_a_spent_budget_is_refused_in_one_sentence():
    refusal = check_budget(status(40, 40), 1, 900, "1 × A100")
    assert isinstance(refusal, Refusal)
    assert (refusal.reason, refusal.status) == (REASON_BUDGET, 403)
    assert refusal.message == (
        "You have used all 40 of your GPU-hours this week; your budget resets Monday 00:00 UTC."
    )


def test_a_budget_of_zero_names_its_rule():
    refusal = BudgetStatus(Budget(0, "group rule 'class'"), WEEK, 0, 0)
    message = check_budget(refusal, 1, 900, "1 × A100").message
    assert message.startswith("Your GPU-hours budget is 0 (group rule 'class'):")


def test_a_rest_too_short_for_the_request_is_refused_with_what_to_do():
    refusal = check_budget(status(40, 39.8, held=1), 2, 900, "2 × NVIDIA A100")
    assert refusal.reason == REASON_BUDGET
    assert refusal.message == (
        "The 0.2 GPU-hours left of your budget this week would run 2 × NVIDIA A100 for only "
        "4 min, less than 15 min; choose fewer GPUs, or wait until Monday 00:00 UTC."
    )
    # fewer GPUs fit
    assert check_budget(status(40, 39.5), 1, 900, "1 × A100") is None
    # min_session 0 refuses only a spent budget
    assert check_budget(status(40, 39.999), 8, 0, "8 × A100") is None


# ---------------------------------------------------------------------------
# when a running server uses it up
# ---------------------------------------------------------------------------


def test_when_the_held_gpus_use_up_the_rest():
    now = utc(2026, 12, 4, 10)
    assert exhaustion_time(status(40, 38, held=2), now) == now + 3600
    assert exhaustion_time(status(40, 40, held=1), now) == now  # spent: now
    assert exhaustion_time(status(40, 38, held=0), now) is None  # nothing held
    assert exhaustion_time(status(None, 38, held=2), now) is None  # unlimited
    # the week resets (Monday 00:00) before 30 h at 1 GPU run out
    late = utc(2026, 12, 6, 20)
    assert exhaustion_time(status(40, 10, held=1), late) is None
