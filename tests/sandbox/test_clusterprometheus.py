"""The in-cluster Prometheus (gpuspawner_sandbox.clusterprometheus): what it deploys, and,
on real nodes with the cluster network, that a pod reaches it through its Service and
finds a GPU pod's GPUs in it, with the pod's labels as dcgm-exporter sets them.
"""

from __future__ import annotations

import functools
import re
import sys

import pytest
import yaml

from gpuspawner_sandbox import clusterprometheus as cp_mod
from gpuspawner_sandbox import nodeconfig, nodes, testing
from gpuspawner_sandbox.prometheus import DCGM_JOB, prometheus_binary, server_args
from gpuspawner_sandbox.topology import GPU_RESOURCE, parse_topology

EXPORTERS = {"gpu-b": "10.244.1.1:40001", "gpu-a": "10.244.0.1:40000"}
IMAGE = "gpuspawner.invalid/prometheus:2.42.0_ds-5_deb12u1"


def _by_kind(manifests: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for m in manifests:
        out.setdefault(m["kind"], []).append(m)
    return out


def test_everything_lives_in_monitoring_and_the_namespace_comes_first():
    manifests = cp_mod.manifests(IMAGE, EXPORTERS)
    assert manifests[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "monitoring"},
    }
    assert {m["metadata"]["namespace"] for m in manifests[1:]} == {"monitoring"}
    assert cp_mod.URL == "http://prometheus.monitoring.svc:9090"


def test_each_gpu_nodes_exporter_is_an_endpoint_of_the_dcgm_exporter_service():
    kinds = _by_kind(cp_mod.manifests(IMAGE, EXPORTERS))
    (exporter,) = [s for s in kinds["Service"] if s["metadata"]["name"] == "dcgm-exporter"]
    assert "selector" not in exporter["spec"]
    assert exporter["spec"]["ports"] == [{"name": "metrics", "port": 9400, "protocol": "TCP"}]
    slices = kinds["EndpointSlice"]
    assert [
        (s["endpoints"][0]["nodeName"], s["endpoints"][0]["addresses"], s["ports"][0]["port"])
        for s in slices
    ] == [("gpu-a", ["10.244.0.1"], 40000), ("gpu-b", ["10.244.1.1"], 40001)]
    for s in slices:
        assert s["metadata"]["labels"]["kubernetes.io/service-name"] == "dcgm-exporter"
        # not the EndpointSlice controller's, which would otherwise remove them
        assert s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == (
            "gpuspawner-sandbox"
        )
        assert s["ports"][0]["name"] == "metrics"


def test_prometheus_runs_unprivileged_with_the_hosts_flags_behind_a_cluster_ip():
    kinds = _by_kind(cp_mod.manifests(IMAGE, EXPORTERS))
    (deployment,) = kinds["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE and container["imagePullPolicy"] == "Never"
    assert container["args"] == server_args(
        "/etc/prometheus/prometheus.yml", "/prometheus", ":9090"
    )
    assert pod["securityContext"]["runAsUser"] == 65534 and pod["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (service,) = [s for s in kinds["Service"] if s["metadata"]["name"] == "prometheus"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 9090
    (config,) = kinds["ConfigMap"]
    assert yaml.safe_load(config["data"]["prometheus.yml"]) == cp_mod.prometheus_config()


def test_prometheus_gets_no_kubernetes_rights_at_all():
    manifests = cp_mod.manifests(IMAGE, EXPORTERS)
    kinds = _by_kind(manifests)
    assert not {"ServiceAccount", "Role", "RoleBinding", "ClusterRole"} & set(kinds)
    (deployment,) = kinds["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod


def test_the_scrape_job_finds_the_exporters_in_the_cluster_dns():
    config = cp_mod.prometheus_config("5s")
    (job,) = config["scrape_configs"]
    assert job["job_name"] == DCGM_JOB and job["honor_labels"] is True
    (sd,) = job["dns_sd_configs"]
    assert sd["type"] == "SRV"
    assert sd["names"] == ["_metrics._tcp.dcgm-exporter.monitoring.svc.cluster.local"]
    assert "static_configs" not in job
    assert config["global"]["scrape_interval"] == "5s"
    kinds = _by_kind(cp_mod.manifests(IMAGE, EXPORTERS))
    (exporter,) = [s for s in kinds["Service"] if s["metadata"]["name"] == "dcgm-exporter"]
    # headless: the DNS names every endpoint rather than one virtual address
    assert exporter["spec"]["clusterIP"] == "None"


def test_the_image_holds_the_packages_programs_and_the_libraries_ldd_names():
    ldd = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n"
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n"
    )
    assert cp_mod.ldd_paths(ldd) == [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ]
    assert cp_mod.ldd_paths("\tnot a dynamic executable\n") == []
    files = cp_mod.image_files({"prometheus": b"P"}, {"/lib64/ld.so": b"L"})
    assert files == {"bin/prometheus": (b"P", 0o755), "lib64/ld.so": (b"L", 0o755)}


def test_the_tag_is_the_debian_packages_revision():
    text = "prometheus, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5+deb12u1)\n"
    assert cp_mod.image_tag(text) == "2.42.0_ds-5_deb12u1"
    assert cp_mod.image_tag("prometheus, version 3.1.0 (branch: HEAD)") == "3.1.0"
    with pytest.raises(cp_mod.ClusterPrometheusError, match="nothing like a version"):
        cp_mod.image_tag("command not found")


def test_api_paths():
    kinds = _by_kind(cp_mod.manifests(IMAGE, EXPORTERS))
    assert cp_mod.api_path(kinds["Namespace"][0]) == "/api/v1/namespaces"
    assert cp_mod.api_path(kinds["EndpointSlice"][0]) == (
        "/apis/discovery.k8s.io/v1/namespaces/monitoring/endpointslices"
    )
    assert (
        cp_mod.api_path(kinds["Deployment"][0]) == "/apis/apps/v1/namespaces/monitoring/deployments"
    )
    assert cp_mod.api_path(kinds["ConfigMap"][0]) == "/api/v1/namespaces/monitoring/configmaps"


# -- on real nodes with the cluster network -------------------------------------------

GPU_NODE = "prom-gpu-0"
CPU_NODE = "prom-cpu-0"
TOPOLOGY = parse_topology(
    {
        "nodes": [
            {"name": GPU_NODE, "gpu": {"model": "A100-SXM4-80GB", "count": 4}},
            {"name": CPU_NODE, "cpu": "8", "memory": "16Gi"},
        ]
    }
)
wait_for = functools.partial(testing.wait_for, timeout=120, interval=0.5)


@pytest.fixture(scope="module")
def cluster(pytestconfig):
    """Control plane on the pods' side + a GPU and a CPU node with kube-proxy and CoreDNS."""
    if prometheus_binary() is None:
        from tests.culler.promserver import require_prometheus

        require_prometheus()  # skips loudly, fails in CI
    with testing.running_networked_cluster(
        pytestconfig, TOPOLOGY, "gs-clusterprometheus-"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def prometheus(cluster, pytestconfig):
    with testing.capture_disabled(pytestconfig):
        return cp_mod.deploy_in_cluster_prometheus(
            cluster, emit=lambda line: sys.__stderr__.write(line + "\n")
        )


def _pod(name: str, image: str, args: list[str], **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "Never", "args": args}
            ],
            **spec,
        },
    }


@pytest.fixture(scope="module")
def gpu_pod(cluster):
    """A pod holding two GPUs, and the GPUs' UUIDs as its kubelet allocated them."""
    api = cluster.api()
    with testing.temporary_namespace(cluster.cp, "gpu-metrics") as namespace:
        pod = _pod(
            "holder",
            nodeconfig.TOOL_IMAGE,
            ["sleep", "infinity"],
            nodeSelector={"kubernetes.io/hostname": GPU_NODE},
            tolerations=[{"operator": "Exists"}],
        )
        pod["spec"]["containers"][0]["resources"] = {"limits": {GPU_RESOURCE: "2"}}
        api.post(f"/api/v1/namespaces/{namespace}/pods", pod)
        wait_for("the GPU pod to run", lambda: testing.running_pod(api, namespace, "holder"))
        (held,) = [
            a
            for a in cluster.pod_resources(GPU_NODE)
            if a["namespace"] == namespace and a["pod"] == "holder"
        ]
        yield namespace, set(held["device_ids"])


def test_prometheus_runs_as_a_pod_and_scrapes_the_gpu_nodes_exporter(cluster, prometheus):
    assert prometheus.url == cp_mod.URL
    (instance,) = {
        s["metric"]["instance"]
        for s in prometheus.api.query('up{job="dcgm-exporter"} == 1')["data"]["result"]
    }
    # found in the cluster DNS: the endpoint's name there (its IP, dashed), the node's port
    ip, port = cluster.dcgm_exporter(GPU_NODE).rsplit(":", 1)
    assert instance == (f"{ip.replace('.', '-')}.dcgm-exporter.monitoring.svc.cluster.local:{port}")
    pods = cluster.api().get("/api/v1/namespaces/monitoring/pods")["items"]
    (pod,) = pods
    # no toleration of the GPU taint: it runs on the CPU node, as a cluster's monitoring does
    assert pod["spec"]["nodeName"] == CPU_NODE
    assert pod["status"]["podIP"] in prometheus.api.url


def test_a_pod_reaches_prometheus_by_its_service_and_finds_the_gpu_pods_gpus(
    cluster, prometheus, gpu_pod
):
    namespace, gpus = gpu_pod
    query = f'DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}",pod="holder"}}'
    # the host, on the pod's address, first: until both are scraped
    prometheus.api.wait_for(query, lambda r: len(r) == 2, timeout=120)
    api = cluster.api()
    image = next(
        c["image"]
        for c in api.get("/api/v1/namespaces/monitoring/pods")["items"][0]["spec"]["containers"]
    )
    # promtool from the same image, in a pod on the CPU node: cluster DNS, the Service
    # (kube-proxy), the pod network.
    client = _pod(
        "promtool",
        image,
        ["query", "instant", cp_mod.URL, query],
        nodeSelector={"kubernetes.io/hostname": CPU_NODE},
    )
    client["spec"]["containers"][0]["command"] = ["/bin/promtool"]
    api.post(f"/api/v1/namespaces/{namespace}/pods", client)

    def finished():
        phase = api.get(f"/api/v1/namespaces/{namespace}/pods/promtool")["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for("promtool's query to finish", finished)
    log = api.request("GET", f"/api/v1/namespaces/{namespace}/pods/promtool/log", raw=True).body
    assert phase == "Succeeded", log
    lines = [line for line in log.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert {re.search(r'UUID="([^"]+)"', line).group(1) for line in lines} == gpus, log
    for line in lines:
        assert 'container="main"' in line and f'Hostname="{GPU_NODE}"' in line, line
    # nothing forwarded out of the pod range on the way
    assert nodes.forward_drops() == 0


def test_a_second_deploy_keeps_what_is_there(cluster, prometheus):
    before = cluster.api().get("/apis/apps/v1/namespaces/monitoring/deployments/prometheus")
    again = cp_mod.deploy_in_cluster_prometheus(cluster, emit=lambda line: None)
    after = cluster.api().get("/apis/apps/v1/namespaces/monitoring/deployments/prometheus")
    assert again.url == prometheus.url
    assert after["metadata"]["uid"] == before["metadata"]["uid"]


def test_without_the_cluster_network_it_refuses_before_anything():
    class Bare:
        cluster_network = False

    with pytest.raises(cp_mod.ClusterPrometheusError, match="cluster network"):
        cp_mod.deploy_in_cluster_prometheus(Bare())  # type: ignore[arg-type]
