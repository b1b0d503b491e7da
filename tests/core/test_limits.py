import json
import re

import pytest

from gpuspawner.core.limits import (
    Holding,
    check_request,
    effective_limit,
    format_units,
    holding_for,
    holdings_from_pods,
    merge_reservations,
    remaining,
)
from gpuspawner.core.options import resolve_selection
from gpuspawner.core.refusals import Refusal

from ..conftest import FIXTURES


@pytest.fixture
def pods():
    return json.loads((FIXTURES / "gpu-pods" / "podlist.json").read_text())["items"]


@pytest.fixture
def holdings(pods, pools_catalog):
    return holdings_from_pods(pods, pools_catalog)


def select(catalog, gpu_type, gpus, profile="pytorch"):
    return resolve_selection({"profile": profile, "gpu_type": gpu_type, "gpus": str(gpus)}, catalog)


def test_holdings_come_from_pod_labels_and_skip_finished_or_deleted(holdings):
    by_pod = {h.pod: h for h in holdings}
    assert set(by_pod) == {
        "jupyter-carol",
        "jupyter-carol-exp1",
        "jupyter-dave-big",
        "jupyter-heidi-slice",
        "jupyter-ivan",
    }
    assert by_pod["jupyter-carol-exp1"].server == "exp1"
    assert (
        by_pod["jupyter-carol"].server == "" and by_pod["jupyter-carol"].server_label == "default"
    )
    assert by_pod["jupyter-dave-big"].units == 4
    assert by_pod["jupyter-heidi-slice"].units == pytest.approx(2 / 7, rel=1e-3)
    assert by_pod["jupyter-heidi-slice"].pool_groups == ("students",)


def test_weight_falls_back_to_the_pod_annotation_when_the_type_left_the_catalog(pods):
    holdings = holdings_from_pods(pods, catalog=None)
    slice_ = next(h for h in holdings if h.pod == "jupyter-heidi-slice")
    assert slice_.units == pytest.approx(2 * 0.142857)


@pytest.mark.parametrize(
    "user, groups, total, per_type, rule",
    [
        ("alice", ["students"], None, {}, "user rule 'alice'"),
        ("bob", ["research"], 0, {}, "user rule 'bob'"),
        ("carol", [], 2, {}, "the default rule"),
        ("carol", ["unknown-group"], 2, {}, "the default rule"),
        ("dave", ["research"], 8, {"h100": 4}, "group rule 'research'"),
        ("erin", ["students"], 1, {"h100": 0}, "group rule 'students'"),
        # several groups: the largest total; a per-type cap only if every group has one
        ("frank", ["students", "staff"], 3, {}, "group rules 'staff', 'students'"),
        ("gina", ["students", "research"], 8, {"h100": 4}, "group rules 'research', 'students'"),
    ],
)
def test_effective_limit_precedence(pools_catalog, user, groups, total, per_type, rule):
    limit = effective_limit(pools_catalog.limits, user, groups)
    assert limit.total == total
    assert dict(limit.per_type) == per_type
    assert limit.rule == rule


def test_refusal_names_what_the_user_holds_and_what_to_do(pools_catalog, holdings):
    with pytest.raises(Refusal) as info:
        check_request(
            catalog=pools_catalog,
            user="carol",
            groups=[],
            server="exp2",
            selection=select(pools_catalog, "a100", 1),
            holdings=holdings,
        )
    assert info.value.status == 403
    assert info.value.reason == "limit"
    assert info.value.message == (
        "You are using 2 of your 2 GPUs (servers: default, exp1). Stop one of them or ask for fewer GPUs."
    )


def test_restarting_the_same_server_does_not_count_against_itself(pools_catalog, holdings):
    # carol holds 2 of her 2 GPUs: 1 on her default server and 1 on exp1
    mine = sorted((h.server, h.units) for h in holdings if h.user == "carol")
    assert mine == [("", 1), ("exp1", 1)]
    request = {
        "catalog": pools_catalog,
        "user": "carol",
        "groups": [],
        "selection": select(pools_catalog, "a100", 1),
        "holdings": holdings,
    }
    # exp1's own GPU is not counted against its restart: admitted (no Refusal)...
    assert check_request(server="exp1", **request) is None
    # ...while the same request for another server is over the limit
    with pytest.raises(Refusal) as info:
        check_request(server="exp2", **request)
    assert info.value.message.startswith("You are using 2 of your 2 GPUs")
    # and exp1 cannot grow past what the default server leaves
    with pytest.raises(Refusal):
        check_request(**{**request, "selection": select(pools_catalog, "a100", 2)}, server="exp1")


def test_partial_room_suggests_the_count_that_fits(pools_catalog, holdings):
    holdings = [h for h in holdings if h.pod != "jupyter-carol-exp1"]
    with pytest.raises(Refusal) as info:
        check_request(
            catalog=pools_catalog,
            user="carol",
            groups=[],
            server="new",
            selection=select(pools_catalog, "a100", 2),
            holdings=holdings,
        )
    assert (
        info.value.message
        == "You are using 1 of your 2 GPUs (servers: default). Stop one of them or ask for 1 or fewer."
    )


def test_request_bigger_than_the_limit_with_nothing_held(pools_catalog):
    with pytest.raises(Refusal) as info:
        check_request(
            catalog=pools_catalog,
            user="zoe",
            groups=[],
            server="",
            selection=select(pools_catalog, "a100", 4),
            holdings=[],
        )
    assert info.value.message == "You asked for 4 GPUs but your limit is 2. Ask for 2 or fewer."


def test_zero_limit_allows_cpu_only_and_says_so(pools_catalog):
    check_request(
        catalog=pools_catalog,
        user="bob",
        groups=[],
        server="",
        selection=select(pools_catalog, "a100", 0),
        holdings=[],
    )
    with pytest.raises(
        Refusal,
        match=r"Your GPU limit is 0 \(user rule 'bob'\): you can start servers without GPUs",
    ):
        check_request(
            catalog=pools_catalog,
            user="bob",
            groups=[],
            server="",
            selection=select(pools_catalog, "a100", 1),
            holdings=[],
        )


def test_per_type_limit(pools_catalog, holdings):
    # dave (research: 8 total, at most 4 H100) already holds 4 H100
    with pytest.raises(Refusal) as info:
        check_request(
            catalog=pools_catalog,
            user="dave",
            groups=["research"],
            server="more",
            selection=select(pools_catalog, "h100", 1),
            holdings=holdings,
        )
    assert info.value.message == (
        "You are using 4 of your 4 NVIDIA H100 GPUs (servers: big). Stop one of them or ask for fewer GPUs."
    )
    # but A100s still fit within the total
    check_request(
        catalog=pools_catalog,
        user="dave",
        groups=["research"],
        server="more",
        selection=select(pools_catalog, "a100", 4),
        holdings=holdings,
    )


def test_type_forbidden_by_group(pools_catalog):
    with pytest.raises(
        Refusal,
        match=re.escape(
            "You may not use NVIDIA H100 GPUs (group rule 'students'): choose another GPU type."
        ),
    ):
        check_request(
            catalog=pools_catalog,
            user="erin",
            groups=["students"],
            server="",
            selection=select(pools_catalog, "h100", 1),
            holdings=[],
        )


def test_unlimited_user(pools_catalog, holdings):
    many = holdings + [
        Holding(user="alice", server=f"s{i}", gpu_type="a100", gpus=4, units=4) for i in range(10)
    ]
    check_request(
        catalog=pools_catalog,
        user="alice",
        groups=[],
        server="x",
        selection=select(pools_catalog, "h100", 8),
        holdings=many,
    )
    # a personal rule does not take a user out of a group's shared pool
    with pytest.raises(Refusal, match="The group 'students'"):
        check_request(
            catalog=pools_catalog,
            user="alice",
            groups=["students"],
            server="x",
            selection=select(pools_catalog, "h100", 8),
            holdings=many,
        )


def test_group_pool_counts_every_member(pools_catalog, holdings):
    # students pool: 3 GPUs; ivan holds 1 A100 and heidi 2/7 of slices -> 1.29 used
    check_request(
        catalog=pools_catalog,
        user="judy",
        groups=["students"],
        server="",
        selection=select(pools_catalog, "a100", 1),
        holdings=holdings,
    )
    crowded = [
        *holdings,
        Holding(user="ken", server="", gpu_type="a100", gpus=1, units=1, pool_groups=("students",)),
    ]
    with pytest.raises(Refusal) as info:
        check_request(
            catalog=pools_catalog,
            user="judy",
            groups=["students"],
            server="",
            selection=select(pools_catalog, "a100", 1),
            holdings=crowded,
        )
    assert info.value.reason == "group-pool"
    assert info.value.message.startswith("The group 'students' is using 2.29 of its 3 shared GPUs.")


def test_mig_slices_count_by_weight(pools_catalog):
    held = [
        Holding(user="zoe", server=f"s{i}", gpu_type="mig", gpus=2, units=2 / 7) for i in range(6)
    ]
    # 12 slices = 12/7 units: one more pair of slices (2/7) fits within 2 GPUs
    check_request(
        catalog=pools_catalog,
        user="zoe",
        groups=[],
        server="new",
        selection=select(pools_catalog, "mig", 2),
        holdings=held,
    )
    held += [Holding(user="zoe", server="s6", gpu_type="mig", gpus=2, units=2 / 7)]
    with pytest.raises(Refusal):
        check_request(
            catalog=pools_catalog,
            user="zoe",
            groups=[],
            server="new",
            selection=select(pools_catalog, "mig", 1),
            holdings=held,
        )


def test_reservations_fill_in_pods_not_visible_yet(pools_catalog, holdings):
    selection = select(pools_catalog, "a100", 1)
    reserved = holding_for("carol", "exp1", selection, ())
    again = merge_reservations(holdings, [reserved, holding_for("zoe", "", selection, ())])
    # carol/exp1 has a pod already: no double count; zoe's reservation is added
    assert len(again) == len(holdings) + 1
    assert again[-1].user == "zoe"


def test_remaining_room_per_type(pools_catalog, holdings):
    room = remaining(pools_catalog, "dave", ["research"], "", holdings)
    assert room["h100"] == 0
    assert room["a100"] == 4
    assert room["mig"] == pytest.approx(4 * 7, rel=1e-3)
    assert remaining(pools_catalog, "alice", [], "", holdings) == {
        "a100": None,
        "h100": None,
        "mig": None,
    }
    # carol is at her limit except for the server being restarted
    assert remaining(pools_catalog, "carol", [], "exp1", holdings)["a100"] == 1


def test_format_units():
    assert format_units(2.0) == "2"
    assert format_units(2 / 7) == "0.29"
    assert format_units(None) == "unlimited"
