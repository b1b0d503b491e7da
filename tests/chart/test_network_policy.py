"""Who may reach the hub pod's service ports (10101-10103), as the chart renders.

The culler, the GPU page and the gpuspawner service listen in the hub pod on
10101, 10102 and 10103 for the proxy, which routes ``/services/…`` to them
(and the hub, which checks that its services answer). z2jh's
``hub.networkPolicy.allowedIngressPorts`` would open them to every source;
chart/gpuspawner (and config/z2jh-values.yaml, for a plain z2jh release) allow
them from those two pods only. Read from ``helm template`` with the real Helm; no
cluster is started (the local cluster's CNI enforces no NetworkPolicy, so the
deployed release in tests/z2jh cannot show it).
"""

from __future__ import annotations

import pytest

from gpuspawner_sandbox import build

EXAMPLE = build.REPO_ROOT / "config" / "chart-values.yaml"
PLAIN_Z2JH = build.REPO_ROOT / "config" / "z2jh-values.yaml"
NAMESPACE = "jupyterhub"
SERVICE_PORTS = (10101, 10102, 10103)


@pytest.fixture(params=["chart", "plain-z2jh"])
def rendered(request, charts) -> list[dict]:
    chart, values = (
        (charts.gpuspawner, EXAMPLE)
        if request.param == "chart"
        else (charts.jupyterhub, PLAIN_Z2JH)
    )
    return charts.helm.template("jhub", chart, namespace=NAMESPACE, values_files=[values])


def find(manifests, kind, name):
    (found,) = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def rules_for(policy: dict, port: int) -> list[dict]:
    """The ingress rules that let traffic in on ``port`` (a rule without ports covers all)."""
    return [
        rule
        for rule in policy["spec"].get("ingress") or []
        if not rule.get("ports") or any(p.get("port") == port for p in rule["ports"])
    ]


def admits(peer: dict, labels: dict[str, str]) -> bool:
    """Whether a peer admits a pod of the policy's namespace with these labels."""
    if set(peer) != {"podSelector"}:
        return True  # a namespace selector or an IP block reaches beyond this namespace's pods
    selector = peer["podSelector"]
    if selector.get("matchExpressions"):
        return True  # not used by our values; count it as open rather than guess
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def pod_labels(manifests, name: str) -> dict[str, str]:
    return find(manifests, "Deployment", name)["spec"]["template"]["metadata"]["labels"]


def test_the_service_ports_admit_the_proxy_and_the_hub_and_no_other_source(rendered):
    policy = find(rendered, "NetworkPolicy", "hub")
    proxy, hub = pod_labels(rendered, "proxy"), pod_labels(rendered, "hub")
    # what else runs in the namespace: users' servers, the chart's other parts
    others = [
        {**proxy, "component": "singleuser-server"},
        pod_labels(rendered, "user-scheduler"),
        {"app": "prometheus"},
        {},
    ]
    for port in SERVICE_PORTS:
        rules = rules_for(policy, port)
        assert rules, f"port {port} is not reachable at all"
        for rule in rules:
            peers = rule.get("from")
            assert peers, f"port {port} is open to every source: {rule}"
            assert all(set(p) == {"podSelector"} for p in peers), peers
            for labels in others:
                assert not any(admits(p, labels) for p in peers), (port, labels)
        assert any(admits(p, proxy) for r in rules for p in r["from"]), port
        assert any(admits(p, hub) for r in rules for p in r["from"]), port


def test_the_hub_service_still_carries_the_ports(rendered):
    service = find(rendered, "Service", "hub")
    ports = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert all(ports.get(port) == port for port in SERVICE_PORTS), ports


def test_an_open_port_would_be_caught():
    """The check itself: allowedIngressPorts' rule (ports, no 'from') admits any source."""
    open_policy = {"spec": {"ingress": [{"ports": [{"port": 10103}]}]}}
    (rule,) = rules_for(open_policy, 10103)
    assert not rule.get("from")
    namespaced = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"component": "proxy"}}}
    assert admits(namespaced, {})
