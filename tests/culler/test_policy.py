"""The pure culling policy: plain data in, decisions out."""

from __future__ import annotations

import pytest

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


def test_pressure_culls_longest_idle_of_the_type_only_as_many_as_needed():
    policy = Policy(default_timeout=10 * H, default_pressure_timeout=0.5 * H)
    servers = [
        server("a", gpus=1, gpu_type="a100", idle=3 * H),
        server("b", gpus=2, gpu_type="a100", idle=2 * H),
        server("c", gpus=1, gpu_type="a100", idle=1 * H),
        server("d", gpus=1, gpu_type="a100", idle=0.2 * H),  # under the pressure timeout
        server("busy", gpus=4, gpu_type="a100", idle=9 * H),  # GPU busy: never
        server("missing", gpus=4, gpu_type="a100", idle=9 * H),  # no metrics: never
        server("h", gpus=1, gpu_type="h100", idle=9 * H),  # another type
    ]
    gpu = gpu_view(("a", None), ("b", None), ("c", None), ("d", None), ("busy", 30), ("h", None))

    def culled(waiting):
        decisions, _ = decide(servers, NOW, policy, gpu=gpu, waiting=waiting)
        return [d.server.user for d in decisions if d.action == P.CULL]

    assert culled({"a100": 1}) == ["a"]
    assert culled({"a100": 2}) == ["a", "b"]
    assert culled({"a100": 3}) == ["a", "b"]  # a (1) + b (2) cover 3
    assert culled({"a100": 50}) == ["a", "b", "c"]  # d, busy and missing are never taken
    assert culled({"h100": 1}) == ["h"]
    assert culled({}) == []
    decisions, _ = decide(servers, NOW, policy, gpu=gpu, waiting={"a100": 1})
    assert decisions[0].reason == P.REASON_PRESSURE


def test_pressure_counts_gpus_already_freed_by_normal_culls():
    policy = Policy(default_timeout=2 * H, default_pressure_timeout=0.5 * H)
    servers = [
        server("old", gpus=2, gpu_type="a100", idle=3 * H),  # culled anyway
        server("mid", gpus=1, gpu_type="a100", idle=1 * H),
    ]
    decisions, _ = decide(servers, NOW, policy, waiting={"a100": 2})
    assert [(d.server.user, d.reason) for d in decisions if d.action == P.CULL] == [
        ("old", P.REASON_IDLE)
    ]
    per_type = Policy(default_timeout=10 * H, pressure_timeouts={"a100": 2 * H})
    decisions, _ = decide(servers, NOW, per_type, waiting={"a100": 1})
    assert [d.server.user for d in decisions if d.action == P.CULL] == ["old"]


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
