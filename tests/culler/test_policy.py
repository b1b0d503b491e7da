"""The pure culling policy: plain data in, decisions out."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.culler import policy as P
from gpuspawner.culler.policy import GPUSample, GPUView, Policy, Server, decide, parse_rule

NOW = 1_800_000_000.0
H = 3600.0
NS = "jupyterhub"


def server(user="u", name="", gpus=0, gpu_type=None, idle=0.0, age=10 * H, **kw) -> Server:
    return Server(
        user=user,
        name=name,
        gpus=gpus,
        gpu_type=gpu_type if gpus else None,
        profile=kw.pop("profile", "pytorch"),
        started=NOW - age,
        last_activity=NOW - idle,
        pod=kw.pop("pod", f"jupyter-{user}"),
        namespace=NS,
        **kw,
    )


def gpu_view(*entries, window=24 * H) -> GPUView:
    """entries: (user, seconds since the GPU was last busy, or None for 'not in the window')."""
    return GPUView(
        enabled=True,
        samples={
            (NS, f"jupyter-{u}"): GPUSample(
                last_busy=None if ago is None else NOW - ago, window_start=NOW - window
            )
            for u, ago in entries
        },
    )


TIERS = Policy(
    rules=(
        parse_rule({"min_gpus": 8, "timeout": 0.5 * H}),
        parse_rule({"min_gpus": 1, "timeout": 2 * H}),
        parse_rule({"gpu_type": "none", "timeout": 8 * H}),
    ),
    default_timeout=None,
)


def one(s: Server, policy: Policy = TIERS, gpu: GPUView | None = None, **kw) -> P.Decision:
    decisions, _ = decide([s], NOW, policy, gpu=gpu, **kw)
    return decisions[0]


@pytest.mark.parametrize(
    ("gpus", "gpu_type", "idle", "action"),
    [
        (8, "h100", 0.6 * H, P.CULL),
        (8, "h100", 0.4 * H, P.KEEP),
        (1, "a100", 1.5 * H, P.KEEP),
        (1, "a100", 2.1 * H, P.CULL),
        (0, None, 7 * H, P.KEEP),
        (0, None, 8.5 * H, P.CULL),
    ],
)
def test_timeouts_per_gpu_count(gpus, gpu_type, idle, action):
    assert one(server(gpus=gpus, gpu_type=gpu_type, idle=idle)).action == action


def test_first_matching_rule_wins_and_profile_rules():
    policy = Policy(
        rules=(
            parse_rule({"profile": "tensorflow", "timeout": 10 * H}),
            parse_rule({"gpu_type": "a100", "gpus": 2, "timeout": 1 * H}),
        ),
        default_timeout=5 * H,
    )
    assert (
        one(server(profile="tensorflow", gpus=2, gpu_type="a100", idle=2 * H), policy).action
        == P.KEEP
    )
    d = one(server(gpus=2, gpu_type="a100", idle=2 * H), policy)
    assert (d.action, d.timeout) == (P.CULL, 1 * H)
    assert "GPU type a100, 2 GPUs" in d.detail
    assert one(server(gpus=4, gpu_type="a100", idle=2 * H), policy).timeout == 5 * H


def test_idle_is_the_later_of_jupyter_and_gpu_activity():
    s = server(gpus=1, gpu_type="a100", idle=5 * H)
    # GPU busy 10 minutes ago: idle only 10 minutes although Jupyter is silent for 5 h
    d = one(s, gpu=gpu_view(("u", 600)))
    assert (d.action, d.reason) == (P.KEEP, P.REASON_ACTIVE)
    assert d.idle_seconds == pytest.approx(600)
    # GPU not busy in the window: Jupyter's 5 h counts
    d = one(s, gpu=gpu_view(("u", None)))
    assert d.action == P.CULL and d.idle_seconds == pytest.approx(5 * H)
    # a window shorter than the idle time caps what the GPU can vouch for
    d = one(s, gpu=gpu_view(("u", None), window=1 * H))
    assert d.action == P.KEEP and d.idle_seconds == pytest.approx(1 * H)


def test_missing_metrics_and_unavailable_prometheus_count_as_busy():
    s = server(gpus=1, gpu_type="a100", idle=50 * H)
    d = one(s, gpu=gpu_view(("someone-else", None)))
    assert (d.action, d.reason, d.gpu_state) == (P.KEEP, P.REASON_GPU_MISSING, P.GPU_MISSING)
    d = one(s, gpu=GPUView(enabled=True, ok=False))
    assert (d.action, d.reason) == (P.KEEP, P.REASON_GPU_UNAVAILABLE)
    d = one(Server(user="u", gpus=1, gpu_type="a100", started=NOW - 60 * H), gpu=gpu_view())
    assert d.reason == P.REASON_GPU_MISSING  # no pod known at all
    # a CPU server is unaffected by GPU data, and without Prometheus only Jupyter counts
    assert one(server(idle=9 * H), gpu=GPUView(enabled=True, ok=False)).action == P.CULL
    assert one(s, gpu=None).action == P.CULL


def test_gpu_timeout_culls_an_open_tab_on_idle_gpus():
    policy = Policy(rules=(parse_rule({"min_gpus": 1, "timeout": 2 * H, "gpu_timeout": 1 * H}),))
    tab = server(gpus=1, gpu_type="a100", idle=60)  # Jupyter active a minute ago
    d = one(tab, policy, gpu=gpu_view(("u", 1.5 * H)))
    assert (d.action, d.reason, d.timeout) == (P.CULL, P.REASON_GPU_IDLE, 1 * H)
    assert one(tab, policy, gpu=gpu_view(("u", 0.5 * H))).action == P.KEEP
    # never on missing data
    assert one(tab, policy, gpu=gpu_view()).reason == P.REASON_GPU_MISSING
    # a server younger than the GPU timeout has not had idle GPUs that long
    young = server(gpus=1, gpu_type="a100", idle=60, age=0.5 * H)
    assert one(young, policy, gpu=gpu_view(("u", None))).action == P.KEEP


def test_skips_exemptions_admins_and_young_servers():
    policy = Policy(
        default_timeout=H,
        exempt_users=frozenset({"vip"}),
        exempt_groups=frozenset({"long-jobs"}),
        min_running=600,
    )
    assert one(server(idle=2 * H, pending="spawn"), policy).reason == P.REASON_PENDING
    assert one(server(idle=2 * H, pending="stop"), policy).reason == P.REASON_PENDING
    assert one(server(idle=2 * H, ready=False), policy).reason == P.REASON_NOT_READY
    assert one(server("vip", idle=2 * H), policy).reason == P.REASON_EXEMPT
    grouped = server(idle=2 * H, groups=frozenset({"long-jobs", "x"}))
    assert one(grouped, policy).reason == P.REASON_EXEMPT
    unknown = server(idle=2 * H, groups=None)  # the hub did not show groups
    assert one(unknown, policy).reason == P.REASON_GROUPS_UNKNOWN
    assert one(unknown, Policy(default_timeout=H)).action == P.CULL  # no exempt groups: fine
    young = server(idle=2 * H, age=300)
    assert one(young, policy).reason == P.REASON_TOO_YOUNG
    admin = server(idle=2 * H, admin=True)
    assert one(admin, policy).action == P.CULL  # admins are culled like everyone
    no_admins = Policy(default_timeout=H, cull_admin_users=False)
    assert one(admin, no_admins).reason == P.REASON_ADMIN


def test_max_age_is_a_backstop_even_for_busy_servers():
    policy = Policy(default_timeout=H, max_age=24 * H)
    d = one(server(gpus=1, gpu_type="a100", idle=0, age=25 * H), policy, gpu=gpu_view(("u", 0)))
    assert (d.action, d.reason) == (P.CULL, P.REASON_MAX_AGE)
    assert one(server(idle=0, age=23 * H), policy).action == P.KEEP


def wait(*requests, free=None) -> P.Pressure:
    """requests: (GPUs, type) or (GPUs, type, source); free: {type: {node: free GPUs}}."""
    return P.Pressure(
        requests=tuple(P.Request(r[1], r[0], r[2] if len(r) > 2 else "pending") for r in requests),
        free=free or {},
    )


PRESSURE = Policy(default_timeout=10 * H, default_pressure_timeout=0.5 * H)

# Two 4 x A100 nodes. n0: 1 free, "a" (1 GPU, idle 3 h) and "b" (2, idle 2 h).
# n1: "c" (1, idle 1 h), "d" (1, idle under the pressure timeout), "busy" (2, GPUs busy).
# "missing" has no GPU metrics, "h" is an H100 server, "nowhere" has no known node.
FLEET = [
    server("a", gpus=1, gpu_type="a100", idle=3 * H, node="n0"),
    server("b", gpus=2, gpu_type="a100", idle=2 * H, node="n0"),
    server("c", gpus=1, gpu_type="a100", idle=1 * H, node="n1"),
    server("d", gpus=1, gpu_type="a100", idle=0.2 * H, node="n1"),
    server("busy", gpus=2, gpu_type="a100", idle=9 * H, node="n1"),
    server("missing", gpus=4, gpu_type="a100", idle=9 * H, node="n2"),
    server("h", gpus=1, gpu_type="h100", idle=9 * H, node="h0"),
    server("nowhere", gpus=4, gpu_type="a100", idle=9 * H),
]
FLEET_GPUS = gpu_view(
    ("a", None), ("b", None), ("c", None), ("d", None), ("busy", 30), ("h", None), ("nowhere", None)
)
FLEET_FREE = {"a100": {"n0": 1, "n1": 0}, "h100": {"h0": 7}}


def pressure_pass(*requests, servers=FLEET, policy=PRESSURE, free=FLEET_FREE):
    result = P.decide_pass(
        servers, NOW, policy, gpu=FLEET_GPUS, pressure=wait(*requests, free=free)
    )
    culled = [d.server.user for d in result.decisions if d.action == P.CULL]
    return culled, result.pressure


@pytest.mark.parametrize(
    ("gpus", "culled"),
    [
        (1, []),  # fits on n0 already: nothing is freed
        (2, ["a"]),  # n0: 1 free + a's 1
        (3, ["a", "b"]),  # n0: 1 + 1 + 2
        (4, ["a", "b"]),
        (5, []),  # no node has 5: nothing is freed for it
    ],
)
def test_pressure_frees_what_makes_the_request_fit_on_one_node_and_no_more(gpus, culled):
    found, outcomes = pressure_pass((gpus, "a100"))
    assert found == culled
    assert outcomes[0].served == (gpus <= 4)
    if culled:
        assert outcomes[0].node == "n0"
        assert set(outcomes[0].freed) == {(u, "") for u in culled}


def test_a_4_gpu_request_never_frees_gpus_spread_over_nodes():
    spread = [server(f"s{i}", gpus=1, gpu_type="a100", idle=5 * H, node=f"n{i}") for i in range(4)]
    gpus = gpu_view(*((f"s{i}", None) for i in range(4)))
    result = P.decide_pass(
        spread,
        NOW,
        PRESSURE,
        gpu=gpus,
        pressure=wait((4, "a100"), free={"a100": {f"n{i}": 2 for i in range(4)}}),
    )
    # Each node would have 3 free after its server went: not 4 on any one node.
    assert [d.action for d in result.decisions] == [P.KEEP] * 4
    (outcome,) = result.pressure
    assert not outcome.served
    assert outcome.why == (
        "no node would have 4 free a100 GPUs even if its idle servers were stopped"
    )


def test_pressure_picks_the_node_needing_the_fewest_gpus_freed():
    servers = [
        server("long-idle", gpus=4, gpu_type="a100", idle=9 * H, node="n0"),
        server("short-idle", gpus=2, gpu_type="a100", idle=1 * H, node="n1"),
    ]
    gpus = gpu_view(("long-idle", None), ("short-idle", None))
    result = P.decide_pass(
        servers,
        NOW,
        PRESSURE,
        gpu=gpus,
        pressure=wait((4, "a100"), free={"a100": {"n0": 0, "n1": 2}}),
    )
    assert [d.server.user for d in result.decisions if d.action == P.CULL] == ["short-idle"]
    assert result.pressure[0].node == "n1"


def test_every_waiting_request_gets_its_own_gpus():
    # Two requests for 2: a (plus n0's 1 free) serves the first, b the second.
    culled, outcomes = pressure_pass((2, "a100", "queued"), (2, "a100", "refused"))
    assert culled == ["a", "b"]
    assert [o.served for o in outcomes] == [True, True]


def test_queued_requests_are_served_before_refused_ones():
    only_b = [FLEET[1], FLEET[4]]
    culled, outcomes = pressure_pass((3, "a100", "refused"), (3, "a100", "queued"), servers=only_b)
    assert culled == ["b"]  # n0: 1 free + b's 2 = 3, for one of them
    assert [(o.request.source, o.served) for o in outcomes] == [
        ("queued", True),
        ("refused", False),
    ]


def test_a_kueue_head_frees_exactly_what_it_needs_on_one_node():
    """A 4-GPU Job at the head of a ClusterQueue waits for quota, which the nodes' free
    figures do not show (nor other namespaces' pods): only GPUs this pass frees count for it.
    n0 shows 2 free but has only 3 idle GPUs to free; n1 has 4: exactly n1's are stopped."""
    servers = [
        server("k1", gpus=1, gpu_type="a100", idle=3 * H, node="n0"),
        server("k2", gpus=1, gpu_type="a100", idle=2 * H, node="n0"),
        server("k3", gpus=1, gpu_type="a100", idle=1 * H, node="n0"),
        *(server(f"m{i}", gpus=1, gpu_type="a100", idle=9 * H, node="n1") for i in range(4)),
    ]
    gpus = gpu_view(*((s.user, None) for s in servers))
    result = P.decide_pass(
        servers,
        NOW,
        PRESSURE,
        gpu=gpus,
        pressure=wait((4, "a100", "kueue"), free={"a100": {"n0": 2, "n1": 0}}),
    )
    culled = [d for d in result.decisions if d.action == P.CULL]
    assert [d.server.user for d in culled] == ["m0", "m1", "m2", "m3"]
    (outcome,) = result.pressure
    assert outcome.node == "n1" and len(outcome.freed) == 4
    assert "for 4 a100 GPUs (kueue) start" in culled[0].detail
    # a pod of 2 GPUs: n0's 2 "free" do not count for it, 2 GPUs are freed on one node
    result = P.decide_pass(
        servers,
        NOW,
        PRESSURE,
        gpu=gpus,
        pressure=wait((2, "a100", "kueue"), free={"a100": {"n0": 2, "n1": 0}}),
    )
    culled = [d for d in result.decisions if d.action == P.CULL]
    assert sum(d.server.gpus for d in culled) == 2
    assert len({d.server.node for d in culled}) == 1
    assert result.pressure[0].node == culled[0].server.node


def test_kueues_head_is_served_after_pending_pods_and_before_refused_requests():
    only_b = [FLEET[1], FLEET[4]]
    culled, outcomes = pressure_pass(
        (3, "a100", "refused"), (3, "a100", "kueue"), (1, "a100", "pending"), servers=only_b
    )
    # n0's 1 free goes to the pending pod; b's 2 alone are not 3 for anyone after it
    assert culled == []
    assert [(o.request.source, o.served) for o in outcomes] == [
        ("pending", True),
        ("kueue", False),
        ("refused", False),
    ]
    # Kueue's head first: b's 2 are freed for it (n0's 1 "free" does not count for Kueue's
    # quota); what is left on n0, 1, is not 3 for the refused request
    culled, outcomes = pressure_pass((3, "a100", "refused"), (2, "a100", "kueue"), servers=only_b)
    assert culled == ["b"]
    assert [(o.request.source, o.served) for o in outcomes] == [
        ("kueue", True),
        ("refused", False),
    ]


def test_pressure_never_touches_busy_young_unknown_or_other_type_servers():
    culled, _ = pressure_pass((4, "a100"), free={"a100": {}})
    assert "busy" not in culled and "d" not in culled and "missing" not in culled
    assert "nowhere" not in culled and "h" not in culled
    culled, outcomes = pressure_pass((8, "h100"))
    assert culled == ["h"]  # 7 free + h's 1
    assert outcomes[0].node == "h0"


def test_pressure_needs_a_pressure_timeout_for_the_type():
    per_type = Policy(default_timeout=10 * H, pressure_timeouts={"h100": 0.5 * H})
    culled, outcomes = pressure_pass((2, "a100"), policy=per_type)
    assert culled == []
    assert outcomes[0].why == "no pressure timeout is set for its GPU type"


def test_pressure_decisions_say_why():
    result = P.decide_pass(
        FLEET, NOW, PRESSURE, gpu=FLEET_GPUS, pressure=wait((2, "a100", "queued"), free=FLEET_FREE)
    )
    (d,) = [d for d in result.decisions if d.action == P.CULL]
    assert d.reason == P.REASON_PRESSURE
    assert d.detail == (
        "idle 3h00m, over the pressure timeout 30m00s; its GPUs on n0 let a waiting request "
        "for 2 a100 GPUs (queued) start"
    )


def test_pressure_counts_gpus_already_freed_by_normal_culls():
    policy = Policy(default_timeout=2 * H, default_pressure_timeout=0.5 * H)
    servers = [
        server("old", gpus=2, gpu_type="a100", idle=3 * H, node="n0"),  # culled anyway
        server("mid", gpus=1, gpu_type="a100", idle=1 * H, node="n0"),
    ]
    decisions, _ = decide(
        servers, NOW, policy, pressure=wait((2, "a100"), free={"a100": {"n0": 0}})
    )
    assert [(d.server.user, d.reason) for d in decisions if d.action == P.CULL] == [
        ("old", P.REASON_IDLE)
    ]


def test_warning_period_then_cull_on_a_later_pass():
    policy = Policy(default_timeout=H, warning_period=900)
    s = server(idle=2 * H)
    d1, warned = decide([s], NOW, policy)
    assert d1[0].action == P.WARN and s.key in warned
    d2, warned = decide([s], NOW + 600, policy, warned=warned)
    assert d2[0].action == P.WARN  # 10 minutes after the warning: not yet
    d3, warned = decide([s], NOW + 901, policy, warned=warned)
    assert d3[0].action == P.CULL and warned == {}


def test_a_warning_is_dropped_when_the_server_becomes_active():
    policy = Policy(default_timeout=H, warning_period=900)
    _, warned = decide([server(idle=2 * H)], NOW, policy)
    active = server(idle=60)
    d, warned = decide([active], NOW + 1000, policy, warned=warned)
    assert d[0].action == P.KEEP and warned == {}
    d, warned = decide([server(idle=2 * H)], NOW + 1100, policy, warned=warned)
    assert d[0].action == P.WARN  # warned afresh, not culled


@pytest.mark.parametrize(
    "raw",
    [
        {"gpu_type": "a100"},
        {"timeout": 0},
        {"timeout": "1h"},
        {"timeout": 60, "gpus": -1},
        {"timeout": 60, "gpus": True},
        {"timeout": 60, "colour": "red"},
        {"timeout": 60, "profile": 3},
        "60",
    ],
)
def test_malformed_rules_are_refused_with_a_sentence(raw):
    with pytest.raises(ValueError) as e:
        parse_rule(raw)
    assert "\n" not in str(e.value)


def test_log_line_names_user_server_gpus_idle_time_and_reason():
    s = server("alice", "exp1", gpus=2, gpu_type="a100", idle=3 * H)
    d = one(s, gpu=gpu_view(("alice", None)))
    line = P.log_line(d)
    for part in ("culling", "'alice/exp1'", "2 x a100", "reason idle", "idle 3h00m"):
        assert part in line, line
    assert P.log_line(d, dry_run=True).startswith("would cull")


# --- when the rules would stop a server (/api/gpu-status) ---------------------------


def test_stop_forecast_names_the_earliest_rule():
    rules = Policy(
        rules=(parse_rule({"min_gpus": 1, "timeout": 2 * H, "gpu_timeout": 0.5 * H}),),
        max_age=24 * H,
    )
    gpu = gpu_view(("g", 600))
    forecast = P.stop_forecast(server("g", gpus=1, gpu_type="a100", idle=60), rules, gpu)
    assert (forecast.due, forecast.reason) == (NOW - 600 + 0.5 * H, P.REASON_GPU_IDLE)
    assert forecast.rule == "GPU idle timeout of 30 min"
    # Jupyter idle longer than the GPUs: the idle rule counts from the later of the two
    forecast = P.stop_forecast(server("c", idle=3 * H), Policy(default_timeout=4 * H), GPUView())
    assert (forecast.due, forecast.rule) == (NOW + H, "idle timeout of 4 h")
    forecast = P.stop_forecast(server("o", age=23.5 * H, idle=0), rules, gpu_view(("o", 0)))
    assert (forecast.due, forecast.reason) == (NOW + 0.5 * H, P.REASON_MAX_AGE)
    assert forecast.rule == "maximum age of 24 h"
    # not before min_running
    young = Policy(default_timeout=60.0, min_running=600.0)
    assert P.stop_forecast(server("y", age=10, idle=10), young, GPUView()).due == NOW + 590
    # GPU data missing: counted busy, only max_age could stop it
    assert P.stop_forecast(server("m", gpus=1, gpu_type="a100"), rules, gpu_view()).reason == (
        P.REASON_MAX_AGE
    )
    assert P.stop_forecast(server("n"), Policy(default_timeout=None), GPUView()) is None


def test_next_pass_rounds_up_to_a_pass():
    assert P.next_pass(100.0, 100.0, 300) == 400.0  # the last pass did not cull
    assert P.next_pass(50.0, 100.0, 300) == 400.0
    assert P.next_pass(400.0, 100.0, 300) == 400.0
    assert P.next_pass(400.5, 100.0, 300) == 700.0
    forecast = P.stop_at(
        server("w", idle=0), Policy(default_timeout=H, warning_period=600), GPUView(), NOW, 300
    )
    assert forecast.due == NOW + H + 600


@settings(max_examples=300, deadline=None)
@given(
    gpus=st.integers(0, 8),
    idle=st.floats(0, 10 * H),
    gpu_ago=st.none() | st.floats(0, 10 * H),
    age=st.floats(0, 20 * H),
    timeout=st.none() | st.floats(1, 5 * H),
    gpu_timeout=st.none() | st.floats(1, 5 * H),
    max_age=st.none() | st.floats(1, 20 * H),
    min_running=st.floats(0, H),
)
def test_the_forecast_is_when_decide_one_first_culls(
    gpus, idle, gpu_ago, age, timeout, gpu_timeout, max_age, min_running
):
    """One place decides: at the forecast time decide_one culls, for the forecast's reason,
    and a second before it does not (the server staying as it is)."""
    idle = min(idle, age)
    s = server("p", gpus=gpus, gpu_type="a100", idle=idle, age=age)
    rules = Policy(
        rules=(
            parse_rule({"min_gpus": 1, "timeout": timeout or H, "gpu_timeout": gpu_timeout})
            if gpu_timeout
            else parse_rule({"min_gpus": 1, "timeout": timeout or H}),
        ),
        default_timeout=timeout,
        max_age=max_age,
        min_running=min_running,
    )
    gpu = gpu_view(("p", gpu_ago), window=12 * H)
    forecast = P.stop_forecast(s, rules, gpu)
    if forecast is None:
        assert P.decide_one(s, NOW + 100 * H, rules, gpu).action != P.CULL
        return
    # a millisecond after: times are floats near 1.8e9, the sums round
    at = max(forecast.due, NOW) + 1e-3
    decision = P.decide_one(s, at, rules, gpu)
    assert decision.action == P.CULL, (forecast, decision)
    if forecast.due > NOW:  # overdue by several rules, decide_one names max_age first
        assert decision.reason == forecast.reason, (forecast, decision)
    if forecast.due - 1 > NOW:
        assert P.decide_one(s, forecast.due - 1, rules, gpu).action != P.CULL


# --- deadlines (max_runtime, budgets), keeps, the user's idle timeout -----------------


def runtime(at: float, seconds: float = 8 * H) -> P.Deadline:
    return P.Deadline(at=at, reason=P.REASON_MAX_RUNTIME, seconds=seconds)


def budget(at: float) -> P.Deadline:
    return P.Deadline(at=at, reason=P.REASON_BUDGET, detail="this week")


@pytest.mark.parametrize("deadline", [runtime(NOW - 1), budget(NOW)])
def test_a_deadline_reached_culls_a_busy_young_or_kept_server(deadline):
    policy = Policy(default_timeout=H, min_running=H, warning_period=600)
    for s in (
        server(idle=0, deadline=deadline),  # busy
        server(idle=0, age=60, deadline=deadline),  # younger than min_running
        server(idle=2 * H, keep_until=NOW + H, deadline=deadline),  # kept
        server(gpus=1, gpu_type="a100", deadline=deadline),  # GPU data missing
    ):
        d = one(s, policy, gpu=gpu_view())
        assert (d.action, d.reason) == (P.CULL, deadline.reason), d
        assert d.timeout == deadline.seconds


def test_a_deadline_is_warned_its_warning_period_ahead_and_culled_at_it():
    policy = Policy(default_timeout=None, warning_period=600)
    s = server(idle=0, max_keep=4 * H, deadline=runtime(NOW + 900))
    d, warned = decide([s], NOW, policy)
    assert d[0].action == P.KEEP and warned == {}  # 15 min ahead: not yet
    d, warned = decide([s], NOW + 301, policy, warned=warned)
    assert (d[0].action, d[0].reason) == (P.WARN, P.REASON_MAX_RUNTIME)
    # the mark says when: the warning's cull time is the deadline, not a period from now
    assert warned[s.key] == P.WarningMark(NOW + 300, P.REASON_MAX_RUNTIME)
    assert "maximum running time 8h00m in 9m59s" in d[0].detail
    d, warned = decide([s], NOW + 900, policy, warned=warned)
    assert (d[0].action, d[0].reason) == (P.CULL, P.REASON_MAX_RUNTIME) and warned == {}
    # no warning period: culled at the deadline, never warned
    d, _ = decide([s], NOW + 899, Policy(default_timeout=None))
    assert d[0].action == P.KEEP
    # a culler that starts after the deadline stops it at once: a deadline is not put off
    d, _ = decide([s], NOW + 2000, policy)
    assert d[0].action == P.CULL


def test_a_deadline_warning_outranks_an_idle_one_but_not_max_age():
    policy = Policy(default_timeout=H, warning_period=600, max_age=10 * H)
    idle = server(idle=2 * H, age=5 * H, deadline=budget(NOW + 300))
    d = one(idle, policy)
    assert (d.action, d.reason) == (P.WARN, P.REASON_BUDGET)
    old = server(idle=0, age=11 * H, deadline=budget(NOW + 300))
    assert one(old, policy).reason == P.REASON_MAX_AGE


def test_a_kept_server_is_not_culled_for_idleness_until_its_keep_ends():
    policy = Policy(
        rules=(parse_rule({"min_gpus": 1, "timeout": H, "gpu_timeout": 0.5 * H}),),
        warning_period=600,
    )
    kept = server(gpus=1, gpu_type="a100", idle=2 * H, keep_until=NOW + H)
    tab = replace(kept, last_activity=NOW - 60)  # GPU-idle only: Jupyter was active
    for s in (kept, tab):
        d, warned = decide([s], NOW, policy, gpu=gpu_view(("u", None)))
        assert (d[0].action, d[0].reason) == (P.KEEP, P.REASON_KEPT) and warned == {}
        assert "kept by its user for 1h00m more" in d[0].detail
    # a standing idle warning is withdrawn by the keep
    d, warned = decide(
        [kept],
        NOW,
        policy,
        gpu=gpu_view(("u", None)),
        warned={kept.key: P.WarningMark(NOW - 601, "idle")},
    )
    assert d[0].action == P.KEEP and warned == {}
    # once the keep ends it is idle again, and warned first
    later, _ = decide([kept], NOW + H, policy, gpu=gpu_view(("u", None)))
    assert (later[0].action, later[0].reason) == (P.WARN, P.REASON_GPU_IDLE)
    # a keep does not help against max_age
    aged = Policy(default_timeout=H, max_age=5 * H)
    assert one(server(idle=2 * H, keep_until=NOW + H), aged).reason == P.REASON_MAX_AGE


def test_pressure_takes_a_kept_server_unless_keeps_override_pressure():
    fleet = [
        server("kept", gpus=1, gpu_type="a100", idle=3 * H, node="n0", keep_until=NOW + H),
        server("other", gpus=1, gpu_type="a100", idle=1 * H, node="n0"),
    ]
    gpus = gpu_view(("kept", None), ("other", None))
    free = {"a100": {"n0": 0}}

    def culled(policy):
        result = P.decide_pass(fleet, NOW, policy, gpu=gpus, pressure=wait((1, "a100"), free=free))
        return [d.server.user for d in result.decisions if d.action == P.CULL]

    assert culled(PRESSURE) == ["kept"]  # the longest idle, kept or not
    assert culled(replace(PRESSURE, keep_overrides_pressure=True)) == ["other"]


def test_the_users_idle_timeout_replaces_the_rules():
    policy = Policy(
        rules=(parse_rule({"min_gpus": 1, "timeout": 2 * H, "gpu_timeout": 3 * H}),),
        default_timeout=H,
    )
    chosen = server(gpus=1, gpu_type="a100", idle=5 * H, idle_timeout=6 * H)
    # idle 2.5 h by both signals: over the rule's 2 h, under the user's 6 h
    d = one(chosen, policy, gpu=gpu_view(("u", 2.5 * H)))
    assert (d.action, d.timeout) == (P.KEEP, 6 * H)
    assert "the idle timeout its user chose" in d.detail
    d = one(replace(chosen, idle_timeout=0.5 * H), policy, gpu=gpu_view(("u", 0.9 * H)))
    assert (d.action, d.reason, d.timeout) == (P.CULL, P.REASON_IDLE, 0.5 * H)
    # the rule's GPU timeout stays
    assert policy.timeout_for(chosen) == (6 * H, 3 * H, "the idle timeout its user chose")
    # no rule matches: it replaces the default
    assert Policy(default_timeout=None).timeout_for(server(idle_timeout=60))[0] == 60


def test_keep_choices_are_bounded_by_the_servers_max_keep():
    policy = Policy(keep_choices=(3600.0, 14400.0))
    assert policy.keep_choices_for(server(max_keep=4 * H)) == (3600.0, 14400.0)
    assert policy.keep_choices_for(server(max_keep=2 * H)) == (3600.0,)
    assert policy.keep_choices_for(server(max_keep=0)) == ()


def test_stop_forecast_with_deadlines_and_keeps():
    policy = Policy(default_timeout=H, warning_period=600)
    s = server(idle=0.5 * H, deadline=runtime(NOW + 600, seconds=2 * H))
    forecast = P.stop_forecast(s, policy, GPUView())
    assert (forecast.due, forecast.reason) == (NOW + 600, P.REASON_MAX_RUNTIME)
    assert forecast.rule == "maximum running time of 2 h"
    # warned ahead: stopped at the first pass at or after the deadline, no period added
    assert P.stop_at(s, policy, GPUView(), NOW, 300).due == NOW + 600
    b = P.stop_forecast(server(idle=0, deadline=budget(NOW + 60)), policy, GPUView())
    assert (b.due, b.rule) == (NOW + 60, "GPU-hours budget this week")
    kept = server(idle=0.5 * H, keep_until=NOW + 3 * H)
    assert P.stop_forecast(kept, policy, GPUView()).due == NOW + 3 * H
    assert P.stop_at(kept, policy, GPUView(), NOW, 300).due == NOW + 3 * H + 600


@settings(max_examples=300, deadline=None)
@given(
    idle=st.floats(0, 10 * H),
    timeout=st.floats(1, 5 * H),
    user_timeout=st.none() | st.floats(1, 5 * H),
    keep=st.none() | st.floats(-H, 5 * H),
    deadline=st.none() | st.floats(-H, 10 * H),
    reason=st.sampled_from([P.REASON_MAX_RUNTIME, P.REASON_BUDGET]),
)
def test_the_forecast_with_deadlines_and_keeps_is_when_decide_one_first_culls(
    idle, timeout, user_timeout, keep, deadline, reason
):
    s = server(
        "p",
        idle=idle,
        age=20 * H,
        idle_timeout=user_timeout,
        keep_until=None if keep is None else NOW + keep,
        deadline=None if deadline is None else P.Deadline(NOW + deadline, reason, 8 * H),
    )
    rules = Policy(default_timeout=timeout)
    forecast = P.stop_forecast(s, rules, GPUView())
    at = max(forecast.due, NOW) + 1e-3
    decision = P.decide_one(s, at, rules, GPUView())
    assert decision.action == P.CULL, (forecast, decision)
    # a deadline due within the millisecond too comes first in decide_one
    tie = s.deadline is not None and s.deadline.at <= at
    if forecast.due > NOW and not tie:
        assert decision.reason == forecast.reason, (forecast, decision)
    if forecast.due - 1 > NOW:
        assert P.decide_one(s, forecast.due - 1, rules, GPUView()).action != P.CULL
