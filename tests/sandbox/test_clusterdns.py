"""The cluster DNS: CoreDNS built from its Go module, against the session's real control plane."""

from __future__ import annotations

import ipaddress
import sys

import pytest

from gpuspawner_sandbox import build, clusterdns, testing
from gpuspawner_sandbox.controlplane import SERVICE_CIDR
from gpuspawner_sandbox.ports import free_port

DNS_IP = "127.0.10.53"


def test_corefile_serves_only_the_clusters_zones_on_one_address(tmp_path):
    address = clusterdns.DNSAddress("10.244.0.1", 53, 8080, 8181)
    text = clusterdns.corefile(address, tmp_path / "kc")
    first = text.splitlines()[0]
    assert first == "cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {"
    assert "    bind 10.244.0.1\n" in text
    assert "health 10.244.0.1:8080" in text and "ready 10.244.0.1:8181" in text
    assert f"kubeconfig {tmp_path / 'kc'}" in text
    # as kubeadm's: the cluster's names come from the watch, never from the cache
    assert "    cache 30 {\n        disable success cluster.local\n" in text
    assert "        disable denial cluster.local\n" in text
    # nothing is ever sent elsewhere
    assert "forward" not in text and "0.0.0.0" not in text


def test_coredns_links_only_the_plugins_we_name():
    main = (clusterdns.COREDNS_MODULE_DIR / "main.go").read_text()
    assert "coredns/core/plugin" not in main  # CoreDNS's own list links every plugin
    assert "plugin/forward" not in main
    for plugin in ("bind", "kubernetes", "health", "ready"):
        assert f'"github.com/coredns/coredns/plugin/{plugin}"' in main


@pytest.fixture(scope="module")
def coredns_binary(pytestconfig):
    with testing.capture_disabled(pytestconfig):
        try:
            return clusterdns.build_coredns(out=sys.stderr)
        except build.GoMissing as e:
            testing.sandbox_unavailable(str(e))


@pytest.fixture(scope="module")
def dns(control_plane, coredns_binary, tmp_path_factory):
    control_plane.apply_manifests(clusterdns.RBAC_MANIFEST)
    control_plane.wait_for_service_account(clusterdns.NAMESPACE, clusterdns.SERVICE_ACCOUNT)
    kubeconfig = control_plane.service_account_kubeconfig(
        clusterdns.NAMESPACE, clusterdns.SERVICE_ACCOUNT
    )
    address = clusterdns.DNSAddress(DNS_IP, free_port(DNS_IP), free_port(DNS_IP), free_port(DNS_IP))
    state = tmp_path_factory.mktemp("coredns")
    with clusterdns.running_coredns(coredns_binary, state, address, kubeconfig) as process:
        yield address, process


def resolve(dns, name):
    address, _ = dns
    return testing.dns_query(address.ip, address.port, name)


def test_the_api_servers_service_resolves_to_its_cluster_ip(dns):
    rcode, addresses = resolve(dns, "kubernetes.default.svc.cluster.local")
    assert rcode == testing.DNS_NOERROR
    # the first address of the service range, as the API server allocates it
    assert addresses == [str(ipaddress.ip_network(SERVICE_CIDR)[1])]


def test_a_new_service_resolves_by_name(dns, control_plane, namespace):
    api = control_plane.admin_api()
    service = api.post(
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": "hub"},
            "spec": {"selector": {"app": "hub"}, "ports": [{"port": 8081}]},
        },
    )
    cluster_ip = service["spec"]["clusterIP"]
    name = f"hub.{namespace}.svc.cluster.local"
    found = testing.wait_for(
        f"{name} in the cluster DNS",
        lambda: resolve(dns, name)[1] or None,
        timeout=30,
    )
    assert found == [cluster_ip]
    api.delete(f"/api/v1/namespaces/{namespace}/services/hub")
    rcode = testing.wait_for(
        f"{name} to be gone",
        lambda: resolve(dns, name)[0] == testing.DNS_NXDOMAIN,
        timeout=30,
    )
    assert rcode


def test_unknown_cluster_names_do_not_exist(dns, namespace):
    assert resolve(dns, f"nothing.{namespace}.svc.cluster.local") == (testing.DNS_NXDOMAIN, [])


def test_names_outside_the_cluster_are_refused_not_forwarded(dns):
    assert resolve(dns, "pypi.org") == (testing.DNS_REFUSED, [])


def test_it_listens_only_on_its_own_loopback_address(dns):
    address, process = dns
    listening = testing.listening_addresses(process.pid)
    assert {ip for ip, _ in listening} == {DNS_IP}
    assert {port for _, port in listening} == {
        address.port,
        address.health_port,
        address.ready_port,
    }
    udp = [s["local"] for s in testing.sockets(process.pid) if s["proto"].startswith("udp")]
    assert udp == [(DNS_IP, address.port)]


def test_a_coredns_that_cannot_start_says_why(coredns_binary, tmp_path):
    address = clusterdns.DNSAddress(DNS_IP, free_port(DNS_IP), free_port(DNS_IP), free_port(DNS_IP))
    with (
        pytest.raises(clusterdns.DNSStartError, match="CoreDNS exited; its log"),
        clusterdns.running_coredns(
            coredns_binary, tmp_path, address, tmp_path / "missing.kubeconfig", timeout=30
        ),
    ):
        pass
