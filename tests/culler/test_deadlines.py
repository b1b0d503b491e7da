"""Deadlines from the catalog and the budgets (gpuspawner.culler.deadlines): plain data in and out."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpuspawner.core.catalog import parse_catalog
from gpuspawner.culler import deadlines as D
from gpuspawner.culler import policy as P

H = 3600.0
# a Wednesday noon: the week began Monday 00:00 UTC, 2.5 days ago, and ends in 4.5 days
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc).timestamp()

CATALOG = parse_catalog(
    {
        "images": {
            "pytorch": {
                "display_name": "PyTorch",
                "image": "example.org/pytorch:1",
                "max_runtime": "8h",
                "max_keep": "2h",
            },
            "short": {"display_name": "Short", "image": "example.org/s:1", "max_runtime": "30m"},
            "nokeep": {"display_name": "No keep", "image": "example.org/n:1", "max_keep": 0},
        },
        "gpu_types": {
            "a100": {"display_name": "A100", "max_runtime": "4h"},
            "mig": {"display_name": "MIG", "resource": "nvidia.com/mig-1g.10gb", "weight": 0.25},
        },
        "limits": {
            "gpu_hours": {
                "period": "week",
                "default": 10,
                "groups": {"ml": 200},
                "users": {"vip": "unlimited"},
            }
        },
    }
)
RULES = CATALOG.limits.gpu_hours


def server(user="u", profile="pytorch", gpu_type=None, gpus=0, age=H, groups=frozenset(), **kw):
    return P.Server(
        user=user,
        name=kw.pop("name", ""),
        profile=profile,
        gpu_type=gpu_type,
        gpus=gpus,
        started=NOW - age,
        groups=groups,
        **kw,
    )


def test_max_runtime_is_the_smaller_of_the_images_and_the_types():
    assert D.runtime_limit(CATALOG, server()) == 8 * H
    assert D.runtime_limit(CATALOG, server(gpu_type="a100", gpus=1)) == 4 * H
    assert D.runtime_limit(CATALOG, server("u", "short", "a100", 1)) == 0.5 * H
    assert D.runtime_limit(CATALOG, server(profile="nokeep", gpu_type="mig", gpus=1)) is None
    # a profile or type the catalog no longer has: no limit, never an error
    assert D.runtime_limit(CATALOG, server(profile="gone", gpu_type="gone", gpus=1)) is None
    [s] = D.with_deadlines([server(gpu_type="a100", gpus=1, age=H)], CATALOG, {}, 14400)
    assert s.deadline == P.Deadline(NOW + 3 * H, P.REASON_MAX_RUNTIME, seconds=4 * H)


def test_max_keep_is_the_images_else_the_cullers():
    assert D.max_keep(CATALOG, server(), 14400) == 2 * H
    assert D.max_keep(CATALOG, server(profile="nokeep"), 14400) == 0
    assert D.max_keep(CATALOG, server(profile="short"), 14400) == 14400
    assert D.max_keep(None, server(), 600) == 600


def test_a_budget_stops_all_of_its_users_gpu_servers_when_the_rest_runs_out():
    servers = [
        server(gpu_type="a100", gpus=1, name="a", age=3.5 * H),
        server(gpu_type="mig", gpus=2, name="m"),  # 0.5 units
        server(name="cpu"),
    ]
    assert D.budget_users(RULES, servers) == ["u"]
    # 7 of 10 weighted GPU-hours used, 1.5 units held: 2 h left
    found = D.budget_deadlines(RULES, servers, {"u": 7 * H}, CATALOG, NOW)
    assert found == {"u": P.Deadline(NOW + 2 * H, P.REASON_BUDGET, detail="this week")}
    marked = D.with_deadlines(servers, CATALOG, found, 14400)
    assert [s.deadline.reason if s.deadline else None for s in marked] == [
        P.REASON_MAX_RUNTIME,  # A100's 4 h, counted from 3.5 h ago: before the budget
        P.REASON_BUDGET,
        P.REASON_MAX_RUNTIME,  # a CPU server uses no GPU-hours: only its image's 8 h
    ]
    assert marked[2].deadline.at == NOW + 7 * H
    # spent already: stopped now
    assert D.budget_deadlines(RULES, servers, {"u": 11 * H}, CATALOG, NOW)["u"].at == NOW


def test_no_deadline_when_the_period_resets_first_or_the_budget_is_unlimited():
    servers = [server(gpu_type="a100", gpus=1)]
    assert D.budget_deadlines(RULES, servers, {"u": 0.0}, CATALOG, NOW) == {
        "u": P.Deadline(NOW + 10 * H, P.REASON_BUDGET, detail="this week")
    }
    # 200 h for the group 'ml', at 1 unit: the week ends first (in 108 h)
    ml = [server(gpu_type="a100", gpus=1, groups=frozenset({"ml"}))]
    assert D.budget_deadlines(RULES, ml, {"u": 0.0}, CATALOG, NOW) == {}
    assert D.budget_users(RULES, [server("vip", gpu_type="a100", gpus=1)]) == []
    # no usage figure for a user: not judged
    assert D.budget_deadlines(RULES, servers, {}, CATALOG, NOW) == {}


def test_unknown_groups_are_never_guessed_when_group_budgets_exist():
    unknown = [server(gpu_type="a100", gpus=1, groups=None)]
    assert D.budget_users(RULES, unknown) == []
    no_groups = parse_catalog(
        {
            "images": {"p": {"display_name": "P", "image": "example.org/p:1"}},
            "gpu_types": {"a100": {"display_name": "A100"}},
            "limits": {"gpu_hours": {"default": 5}},
        }
    ).limits.gpu_hours
    assert D.budget_users(no_groups, unknown) == ["u"]


@pytest.mark.parametrize("disabled", [{}, {"gpu_hours": {"default": "unlimited"}}])
def test_no_budgets_no_users(disabled):
    catalog = parse_catalog(
        {
            "images": {"p": {"display_name": "P", "image": "example.org/p:1"}},
            "gpu_types": {"a100": {"display_name": "A100"}},
            "limits": disabled,
        }
    )
    assert D.budget_users(catalog.limits.gpu_hours, [server(gpu_type="a100", gpus=1)]) == []
