"""The pure answer of the culler's /api/gpu-status: whose servers, which figures, when it stops."""

from __future__ import annotations

import pytest

from gpuspawner.clients.prometheus import GPUQueries
from gpuspawner.culler import gpustatus as G
from gpuspawner.culler.policy import (
    REASON_MAX_RUNTIME,
    Deadline,
    Policy,
    Server,
    WarningMark,
    parse_rule,
)

NOW = 1_800_000_000.0
NS = "jupyterhub"
M = 60.0
MIB = 1024 * 1024
QUERIES = GPUQueries(window=7200)
UTIL, ENGINE = QUERIES.util_metric, QUERIES.engine_metric
USED, FREE = QUERIES.memory_used_metric, QUERIES.memory_free_metric


def server(user="ada", name="", gpus=2, idle=5 * M, age=2 * 3600.0, **kw) -> Server:
    return Server(
        user=user,
        name=name,
        gpus=gpus,
        gpu_type="a100" if gpus else None,
        profile="pytorch",
        started=NOW - age,
        last_activity=NOW - idle,
        pod=kw.pop("pod", f"jupyter-{user}" + (f"--{name}" if name else "")),
        namespace=kw.pop("namespace", NS),
        **kw,
    )


def series(pod: str, gpu: str, metric: str, value: float, namespace: str = NS, **labels):
    return (
        {
            "__name__": metric,
            "namespace": namespace,
            "pod": pod,
            "gpu": gpu,
            "UUID": f"GPU-{pod}-{gpu}",
            **labels,
        },
        value,
    )


def two_gpus(pod: str = "jupyter-ada", util=(90.0, 10.0)) -> list:
    return [
        series(pod, "0", UTIL, util[0]),
        series(pod, "0", USED, 1000),
        series(pod, "0", FREE, 80000),
        series(pod, "1", UTIL, util[1]),
        series(pod, "1", USED, 24),
        series(pod, "1", FREE, 80976),
    ]


def figures(rows, last_busy=None, pods=((NS, "jupyter-ada"),)) -> G.Figures:
    return G.figures_from(rows, last_busy or {}, pods, QUERIES, NOW)


def user(name, *scopes):
    return {"kind": "user", "name": name, "scopes": list(scopes)}


ADA = user("ada", "access:servers!user=ada")
RULES = G.Rules(Policy(default_timeout=3600.0), last_pass=NOW - 10, cull_every=300)


def answer(servers, figs, model=ADA, rules=RULES, histories=None) -> dict:
    return G.status_answer(model, servers, figs, histories or {}, rules, 0.05, 15)


def test_device_figures_from_the_exporters_series():
    rows = [
        *two_gpus(),
        # a MIG instance reports no GPU_UTIL: its engine-active ratio stands in
        series("jupyter-ada", "2", ENGINE, 0.5, GPU_I_ID="7"),
        series("jupyter-ada", "2", USED, 13, GPU_I_ID="7"),
        # the same pod name in another namespace matches the query's regexes, not the pod
        series("jupyter-ada", "0", UTIL, 100.0, namespace="other"),
    ]
    pod = figures(rows, {(NS, "jupyter-ada"): NOW - 30}).pods[(NS, "jupyter-ada")]
    assert pod.last_busy == NOW - 30
    assert [d.gpu for d in pod.devices] == ["0", "1", "2/7"]
    zero, one, mig = pod.devices
    assert (zero.utilization, zero.uuid) == (0.9, "GPU-jupyter-ada-0")
    assert (zero.memory_used_bytes, zero.memory_total_bytes) == (1000 * MIB, 81000 * MIB)
    assert (mig.utilization, mig.memory_used_bytes, mig.memory_total_bytes) == (0.5, 13 * MIB, None)
    assert one.utilization == 0.1


def test_a_busy_server_shows_its_load_and_the_stop_its_idle_timeout_would_bring():
    figs = figures(two_gpus(), {(NS, "jupyter-ada"): NOW})
    history = [(NOW - 120, 0.2), (NOW - 60, 1.4)]
    result = answer([server()], figs, histories={("ada", ""): history})
    assert (result["user"], result["poll_seconds"]) == ("ada", 15)
    [entry] = result["servers"]
    assert entry["source"] == "dcgm" and entry["unavailable"] is None
    assert entry["utilization"] == pytest.approx(0.5)
    assert entry["memory_used_bytes"] == 1024 * MIB
    assert entry["memory_total_bytes"] == 2 * 81000 * MIB
    assert [d["gpu"] for d in entry["devices"]] == ["0", "1"]
    assert entry["busy"] is True
    assert entry["idle_since"] is None and entry["idle_seconds"] is None
    # busy GPUs: idle from now at the earliest; Jupyter was active 5 min ago, later
    # than nothing; the idle timeout counts from the later of the two (now)
    assert entry["stop_rule"] == "idle timeout of 60 min"
    assert entry["stop_at"] == RULES.last_pass + 13 * 300  # first pass at or after NOW + 1 h
    assert entry["stop_at_iso"].endswith("+00:00")
    assert entry["history"] == {"step": 60, "points": [[NOW - 120, 0.2], [NOW - 60, 1.0]]}


def test_idle_gpus_count_from_their_last_busy_time_and_the_gpu_rule_comes_first():
    policy = Policy(rules=(parse_rule({"min_gpus": 1, "timeout": 7200, "gpu_timeout": 1800}),))
    rules = G.Rules(policy, last_pass=NOW - 10, cull_every=60)
    figs = figures(two_gpus(util=(0, 1)), {(NS, "jupyter-ada"): NOW - 600})
    [entry] = answer([server(idle=10)], figs, rules=rules)["servers"]
    assert entry["busy"] is False
    assert (entry["idle_since"], entry["idle_seconds"]) == (NOW - 600, 600)
    assert entry["stop_rule"] == "GPU idle timeout of 30 min"
    # due at NOW + 1200 s, 1210 s after the last pass: the 21st pass after it
    assert entry["stop_at"] == rules.last_pass + 21 * 60
    # never busy in the window: idle since the window's start, not before the start
    figs = figures(two_gpus(util=(0, 0)))
    [entry] = answer([server(age=600)], figs, rules=rules)["servers"]
    assert entry["idle_since"] == NOW - 600
    [entry] = answer([server(age=5 * 3600)], figs, rules=rules)["servers"]
    assert entry["idle_since"] == NOW - 7200


def test_max_age_a_warning_period_and_a_standing_warning():
    aged = Policy(default_timeout=3600.0, max_age=3 * 3600.0)
    rules = G.Rules(aged, last_pass=NOW - 10, cull_every=300)
    figs = figures(two_gpus(util=(0, 0)), {(NS, "jupyter-ada"): NOW - 60})
    [entry] = answer([server(age=2.9 * 3600)], figs, rules=rules)["servers"]
    assert entry["stop_rule"] == "maximum age of 3 h"
    assert entry["stop_at"] == rules.last_pass + 2 * 300  # due NOW + 360 s: the second pass
    # with a warning period, the cull comes a period after the warning's pass
    warned = G.Rules(
        Policy(default_timeout=3600.0, warning_period=900), last_pass=NOW - 10, cull_every=300
    )
    [entry] = answer([server()], figs, rules=warned)["servers"]
    assert entry["stop_at"] == warned.last_pass + 12 * 300 + 900
    # a warning standing already: its cull, earlier, wins
    standing = G.Rules(
        warned.policy,
        warned.last_pass,
        300,
        warned={("ada", ""): WarningMark(warned_at=NOW - 100, reason="gpu-idle")},
    )
    [entry] = answer([server()], figs, rules=standing)["servers"]
    assert entry["stop_at"] == NOW - 100 + 900
    assert entry["stop_rule"] == "the cull warning given because its GPUs have been idle"


def test_no_rule_no_stop_and_a_dry_run_stops_nothing():
    figs = figures(two_gpus())
    none = G.Rules(Policy(default_timeout=None), last_pass=NOW, cull_every=300)
    exempt = G.Rules(Policy(exempt_users=frozenset({"ada"})), last_pass=NOW, cull_every=300)
    dry = G.Rules(RULES.policy, RULES.last_pass, 300, dry_run=True)
    for rules in (none, exempt, dry):
        [entry] = answer([server()], figs, rules=rules)["servers"]
        assert (entry["stop_at"], entry["stop_at_iso"], entry["stop_rule"]) == (None,) * 3
        assert entry["source"] == "dcgm"


@pytest.mark.parametrize(
    ("figs", "unavailable"),
    [
        (G.Figures(at=NOW, window_start=NOW, enabled=False), G.NO_PROMETHEUS),
        (G.Figures(at=NOW, window_start=NOW, unavailable=G.PROMETHEUS_DOWN), G.PROMETHEUS_DOWN),
        (figures(two_gpus(pod="jupyter-someone-else")), G.NO_SERIES),
    ],
    ids=["no-prometheus", "prometheus-down", "no-series"],
)
def test_no_dcgm_source_is_one_sentence_and_no_figures(figs, unavailable):
    [entry] = answer([server()], figs, histories={("ada", ""): [(NOW, 1.0)]})["servers"]
    assert entry["source"] is None and entry["unavailable"] == unavailable
    assert unavailable.endswith(".") and unavailable.count(".") == 1
    for key in ("utilization", "memory_used_bytes", "memory_total_bytes", "busy", "idle_since"):
        assert entry[key] is None, key
    assert entry["devices"] == [] and entry["history"] == {"step": 60, "points": []}
    if unavailable == G.NO_PROMETHEUS:
        # Jupyter activity alone decides, as in a pass without Prometheus
        assert entry["stop_rule"] == "idle timeout of 60 min"
        assert entry["stop_at"] == RULES.last_pass + 12 * 300
    else:
        # missing GPU data counts as busy: no idle rule applies
        assert entry["stop_at"] is None


def test_a_server_with_no_known_pod():
    [entry] = answer([server(pod=None)], figures(two_gpus()))["servers"]
    assert entry["unavailable"] == G.NO_POD and entry["source"] is None


def test_each_token_hears_about_its_own_gpu_servers_only():
    servers = [
        server(),
        server(name="train"),
        server(name="cpu", gpus=0),
        server(user="bob"),
    ]
    figs = figures(two_gpus())

    def names(model):
        return [(e["user"], e["server"]) for e in answer(servers, figs, model=model)["servers"]]

    # the user's own token: its GPU servers, not its CPU-only one
    assert names(ADA) == [("ada", ""), ("ada", "train")]
    # a server's own token: that server only
    assert names(user("ada", "access:servers!server=ada/train")) == [("ada", "train")]
    # another user's token, even one that may access ada's servers: nothing of ada's
    assert names(user("bob", "access:servers!user=ada")) == []
    assert names(user("bob", "access:servers")) == [("bob", "")]
    # a service's token: nobody's
    assert names({"kind": "service", "name": "x", "scopes": ["access:servers"]}) == []
    assert answer(servers, figs, model={"kind": "service", "name": "x"})["user"] is None


def test_poll_seconds_are_bounded():
    assert [G.poll_seconds(s) for s in (1, 15, 600)] == [5, 15, 60]


def test_the_stop_of_a_kept_server_or_one_with_a_deadline():
    figs = figures(two_gpus(util=(0.0, 0.0)), {(NS, "jupyter-ada"): NOW - 2 * 3600})
    kept = server(idle=2 * 3600, keep_until=NOW + 3 * 3600)
    [entry] = answer([kept], figs)["servers"]
    # idle for its timeout already, but kept: the rule waits for the keep's end
    assert entry["keep_until"] == NOW + 3 * 3600
    assert entry["stop_at"] == RULES.last_pass + 37 * 300  # first pass at or after the keep
    deadline = server(deadline=Deadline(NOW + 600, REASON_MAX_RUNTIME, seconds=8 * 3600))
    [entry] = answer([deadline], figs)["servers"]
    assert entry["keep_until"] is None
    assert (entry["stop_at"], entry["stop_rule"]) == (
        RULES.last_pass + 3 * 300,
        "maximum running time of 8 h",
    )
