"""Who may reach the hub pod's service ports (10101-10103), as the chart renders our values.

The culler, the GPU page and the gpuspawner service listen in the hub pod on
10101, 10102 and 10103 for the proxy, which routes ``/services/…`` to them
(and the hub, which checks that its services answer). z2jh's
``hub.networkPolicy.allowedIngressPorts`` would open them to every source;
config/z2jh-values.yaml allows them from those two pods only. Read from
``helm template`` with the real Helm and the released chart; no cluster is
started. (The local cluster's CNI enforces no NetworkPolicy, so the deployed
release in test_helm_install.py cannot show it.)
"""

from __future__ import annotations

import sys

import pytest

from gpuspawner_sandbox import build, helm, testing

VALUES = build.REPO_ROOT / "config" / "z2jh-values.yaml"
NAMESPACE = "jupyterhub"
SERVICE_PORTS = (10101, 10102, 10103)


@pytest.fixture(scope="module")
def rendered(pytestconfig, tmp_path_factory) -> list[dict]:
    if not (helm.Z2JH_CHART / "Chart.yaml").is_file():
        testing.third_party_missing(
            f"THE ZERO-TO-JUPYTERHUB 4.4.0 CHART IS MISSING at {helm.Z2JH_CHART} "
            "(a copy of shared/ beside the clone), so the NetworkPolicy test does not run"
        )
    with testing.capture_disabled(pytestconfig):
        try:
            binary = helm.build_helm(out=sys.stderr)
        except build.GoMissing as e:
            testing.sandbox_unavailable(str(e))
    home = tmp_path_factory.mktemp("helm")
    chart = helm.release_chart(helm.Z2JH_CHART, home / "chart" / "jupyterhub")
    return helm.Helm(binary, home / "home").template(
        "jhub", chart, namespace=NAMESPACE, values_files=[VALUES]
    )


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
