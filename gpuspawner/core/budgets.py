"""GPU-hours budgets: the current period, a user's budget, what is left, and refusals (pure).

A budget (``limits.gpu_hours`` in the catalog, :class:`~gpuspawner.core.catalog.BudgetRules`)
counts *weighted* GPU-hours: GPU units (a GPU type's ``weight``; MIG slices are less
than 1) times hours, per period (a day, a week or a month) that starts at its reset
time in UTC. Usage comes from the usage store (:mod:`gpuspawner.accounting.store`);
what the user holds now from the cluster's pods. The spawner refuses a request the
rest cannot run for ``min_session`` (:func:`check_budget`); the culler stops a user's
servers when they use up the rest (:func:`exhaustion_time`).

This module is pure: no clock (``now`` is passed in) and no I/O. Times are Unix
seconds; periods are computed in UTC, so a ``now`` equal to a reset is in the new period.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from .catalog import WEEKDAYS, BudgetRules
from .refusals import REASON_BUDGET, Refusal, refuse

__all__ = [
    "REASON_BUDGET",
    "Budget",
    "BudgetStatus",
    "Period",
    "check_budget",
    "current_period",
    "effective_budget",
    "exhaustion_time",
    "hours_text",
    "most_generous",
    "short_duration",
]

_DAY = 86400
_WEEK = 7 * _DAY
# 1970-01-05, the first Monday of the Unix epoch: weeks are counted from it.
_FIRST_MONDAY = 4 * _DAY
# Tolerance for float comparisons of summed hours.
_EPSILON = 1e-9

_PERIOD_NAMES = {"day": "today", "week": "this week", "month": "this month"}


@dataclass(frozen=True)
class Period:
    """One budget period, ``[start, end)`` in Unix seconds."""

    start: float
    end: float
    #: "today", "this week" or "this month": how sentences name it.
    name: str
    #: When it resets, as sentences say it: "Monday 00:00 UTC", "00:00 UTC", "the 1st, 00:00 UTC".
    reset_text: str


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d} UTC"


def _ordinal(day: int) -> str:
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def reset_text(rules: BudgetRules) -> str:
    """When the rules' periods reset: "Monday 00:00 UTC", "06:00 UTC", "the 1st, 00:00 UTC"."""
    clock = _clock(rules.reset_seconds)
    if rules.period == "week":
        return f"{WEEKDAYS[rules.reset_weekday].capitalize()} {clock}"
    if rules.period == "month":
        return f"the {_ordinal(rules.reset_day)}, {clock}"
    return clock


def _month_reset(year: int, month: int, rules: BudgetRules) -> float:
    """The reset moment of a month (day 1-28 exists in every month)."""
    while month < 1:
        year, month = year - 1, month + 12
    while month > 12:
        year, month = year + 1, month - 12
    return float(calendar.timegm((year, month, rules.reset_day, 0, 0, 0)) + rules.reset_seconds)


def current_period(rules: BudgetRules, now: float) -> Period:
    """The period ``now`` is in: it started at the latest reset at or before ``now``."""
    name = _PERIOD_NAMES.get(rules.period)
    if name is None:
        raise ValueError(f"not a budget period: {rules.period!r}")
    if rules.period == "day":
        start = math.floor((now - rules.reset_seconds) / _DAY) * _DAY + rules.reset_seconds
        end = start + _DAY
    elif rules.period == "week":
        offset = _FIRST_MONDAY + rules.reset_weekday * _DAY + rules.reset_seconds
        start = math.floor((now - offset) / _WEEK) * _WEEK + offset
        end = start + _WEEK
    else:
        moment = datetime.fromtimestamp(now, timezone.utc)
        this_month = _month_reset(moment.year, moment.month, rules)
        if now >= this_month:
            start, end = this_month, _month_reset(moment.year, moment.month + 1, rules)
        else:
            start, end = _month_reset(moment.year, moment.month - 1, rules), this_month
    return Period(start=float(start), end=float(end), name=name, reset_text=reset_text(rules))


@dataclass(frozen=True)
class Budget:
    """A user's budget in weighted GPU-hours per period (None: unlimited), and its rule."""

    hours: float | None
    #: Which rule it comes from, as limits name theirs: "user rule 'alice'",
    #: "group rule 'ml-team'", "the default rule".
    rule: str


def most_generous(names: Iterable[str], amounts: Mapping[str, float | None]) -> str:
    """The name whose amount is largest (None, unlimited, is the largest); ties: alphabetically first.

    "" when ``names`` is empty.
    """
    return min(
        names,
        key=lambda n: (-(math.inf if amounts[n] is None else amounts[n]), n),
        default="",
    )


def effective_budget(rules: BudgetRules, user: str, groups: Iterable[str]) -> Budget:
    """The budget for ``user``: their own rule; else their most generous group's; else the default."""
    if user in rules.users:
        return Budget(rules.users[user], f"user rule '{user}'")
    best = most_generous((g for g in set(groups) if g in rules.groups), rules.groups)
    if not best:
        return Budget(rules.default, "the default rule")
    return Budget(rules.groups[best], f"group rule '{best}'")


def hours_text(hours: float) -> str:
    """GPU-hours as sentences show them: ``40``, ``14.5``, ``0.2`` (one decimal at most)."""
    return f"{hours:.1f}".removesuffix(".0")


def short_duration(seconds: float) -> str:
    """``25 h 30 min``, ``12 h``, ``45 min``, ``less than 1 min``."""
    minutes = int(max(0.0, seconds) // 60)
    if minutes < 1:
        return "less than 1 min"
    hours, minutes = divmod(minutes, 60)
    if not hours:
        return f"{minutes} min"
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


@dataclass(frozen=True)
class BudgetStatus:
    """Where a user stands: their budget, the period, what they used and what they hold now."""

    budget: Budget
    period: Period
    #: Weighted GPU-hours used this period (running servers included, up to now).
    used_hours: float
    #: GPU units the user's servers hold now: they keep using the rest.
    held_units: float

    @property
    def remaining_hours(self) -> float | None:
        """Weighted GPU-hours left this period; None when unlimited."""
        if self.budget.hours is None:
            return None
        return max(0.0, self.budget.hours - self.used_hours)

    @property
    def spent(self) -> bool:
        """Nothing is left (a budget of 0 is spent from the start)."""
        remaining = self.remaining_hours
        return remaining is not None and remaining <= _EPSILON

    def text(self) -> str:
        """ "14.5 of 40 GPU-hours used this week; resets Monday 00:00 UTC"."""
        used = hours_text(self.used_hours)
        if self.budget.hours is None:
            return f"{used} GPU-hours used {self.period.name}; no budget applies"
        return (
            f"{used} of {hours_text(self.budget.hours)} GPU-hours used {self.period.name}; "
            f"resets {self.period.reset_text}"
        )

    def hours_for(self, units: float) -> float | None:
        """How long a new request of ``units`` could run on the rest, beside what is held now.

        None when unlimited (or when nothing would use GPUs).
        """
        remaining = self.remaining_hours
        rate = self.held_units + units
        if remaining is None or rate <= 0:
            return None
        return remaining / rate

    def choices_text(self, options: list[tuple[str, float]], now: float | None = None) -> str:
        """ "The rest allows 1 × A100 for 25 h 30 min, 2 × A100 for 12 h 45 min." ("" if unlimited).

        ``options``: (label, units) of each choice the form offers. With ``now``, a choice the
        rest would run past the period's end reads "until the reset" (the budget renews first).
        """
        parts = []
        for label, units in options:
            hours = self.hours_for(units)
            if hours is None:
                continue
            if now is not None and now + hours * 3600 >= self.period.end:
                parts.append(f"{label} until the reset")
            else:
                parts.append(f"{label} for {short_duration(hours * 3600)}")
        if not parts:
            return ""
        return f"The rest allows {', '.join(parts)}."


def check_budget(
    status: BudgetStatus, units: float, min_session: float, label: str
) -> Refusal | None:
    """The refusal of a request of ``units`` (shown as ``label``, "2 × NVIDIA A100"); None if it fits.

    Refused when the budget is 0, when it is spent, and when the rest, shared with
    what the user holds now, would run the request for less than ``min_session`` seconds.
    """
    hours = status.hours_for(units)
    if hours is None:
        return None
    period = status.period
    if status.budget.hours == 0:
        return refuse(REASON_BUDGET, "budget-zero", rule=status.budget.rule)
    if status.spent:
        return refuse(
            REASON_BUDGET,
            "spent",
            limit=hours_text(status.budget.hours or 0.0),
            period=period.name,
            reset=period.reset_text,
        )
    if hours * 3600 < min_session - _EPSILON:
        return refuse(
            REASON_BUDGET,
            "short",
            remaining=hours_text(status.remaining_hours or 0.0),
            period=period.name,
            label=label,
            duration=short_duration(hours * 3600),
            minimum=short_duration(min_session),
            reset=period.reset_text,
        )
    return None


def exhaustion_time(status: BudgetStatus, now: float) -> float | None:
    """When what the user holds now uses up the rest of the budget, at today's rate.

    ``now`` for a spent budget with GPUs held. None when unlimited, when nothing is
    held, or when the period resets first.
    """
    remaining = status.remaining_hours
    if remaining is None or status.held_units <= 0:
        return None
    at = now + remaining * 3600 / status.held_units
    return None if at >= status.period.end else at
