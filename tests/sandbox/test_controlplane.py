"""The real control plane: TLS, RBAC, the scheduler and clean shutdown."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import ssl
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpuspawner_sandbox import build, testing
from gpuspawner_sandbox.controlplane import ControlPlane, ControlPlaneError
from gpuspawner_sandbox.kubeapi import ApiError, KubeApi

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
GPU = "nvidia.com/gpu"


# This module's waits: the shared poller with its own default timeout.
wait_for = functools.partial(testing.wait_for, timeout=60, interval=0.25)


def pod_manifest(name: str, gpus: int, node_label: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"gpuspawner.io/test-node": node_label},
            # The test node carries this taint so no other test's pod lands there.
            "tolerations": [
                {"key": "gpuspawner.io/test-only", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "example.invalid/never-pulled:1",
                    "resources": {"limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


def events_for(api: KubeApi, namespace: str, pod: str) -> list[dict]:
    return api.get(
        f"/api/v1/namespaces/{namespace}/events",
        query={"fieldSelector": f"involvedObject.name={pod}"},
    )["items"]


def failed_scheduling(api: KubeApi, namespace: str, pod: str) -> list[dict]:
    return [e for e in events_for(api, namespace, pod) if e["reason"] == "FailedScheduling"]


def test_version_is_the_pinned_release_over_tls(control_plane):
    pinned = build.kubernetes_version((build.GO_MODULE_DIR / "go.mod").read_text())
    trusting = ssl.create_default_context(cafile=str(control_plane.ca_file))
    with urllib.request.urlopen(control_plane.api_url + "/version", context=trusting) as resp:
        info = json.load(resp)
    assert info["gitVersion"] == pinned
    assert control_plane.api_url.startswith("https://127.0.0.1:")

    # A client that does not trust the sandbox's CA must not get through.
    with pytest.raises(urllib.error.URLError) as excinfo:
        urllib.request.urlopen(
            control_plane.api_url + "/version", context=ssl.create_default_context()
        )
    assert isinstance(excinfo.value.reason, ssl.SSLCertVerificationError)


def test_every_component_listens_on_loopback_only(control_plane):
    for name, proc in control_plane.processes.items():
        addresses = testing.listening_addresses(proc.pid)
        assert addresses, f"{name} listens on nothing"
        for address, port in addresses:
            assert address.startswith("127."), f"{name} listens on {address}:{port}"
        # ...and is bound or connected to nothing else either.
        assert testing.non_loopback_sockets(proc.pid) == [], name


def test_admin_kubeconfig_is_cluster_admin(control_plane):
    api = KubeApi.from_kubeconfig(control_plane.admin_kubeconfig)
    review = api.post(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {"spec": {"resourceAttributes": {"verb": "*", "resource": "*", "group": "*"}}},
    )
    assert review["status"]["allowed"] is True


def test_service_account_gets_only_what_its_role_allows(control_plane):
    manifest = FIXTURES / "rbac-test.yaml"
    control_plane.apply_manifests(manifest)
    control_plane.apply_manifests(manifest)  # applying again changes nothing and does not fail
    ns = "sandbox-rbac-test"

    reader = KubeApi.from_kubeconfig(control_plane.service_account_kubeconfig(ns, "pod-reader"))
    assert reader.get(f"/api/v1/namespaces/{ns}/pods")["items"] == []
    # Allowed but absent is 404; not allowed is 403 before any lookup.
    with pytest.raises(ApiError) as missing:
        reader.get(f"/api/v1/namespaces/{ns}/pods/no-such-pod")
    assert missing.value.status == 404
    forbidden = [
        ("DELETE", f"/api/v1/namespaces/{ns}/pods/no-such-pod"),
        ("GET", f"/api/v1/namespaces/{ns}/secrets"),
        ("GET", "/api/v1/namespaces/default/pods"),
        ("GET", "/api/v1/nodes"),
    ]
    for method, path in forbidden:
        with pytest.raises(ApiError) as denied:
            reader.request(method, path)
        assert denied.value.status == 403, (method, path)

    unbound = KubeApi.from_kubeconfig(control_plane.service_account_kubeconfig(ns, "unbound"))
    with pytest.raises(ApiError) as denied:
        unbound.get(f"/api/v1/namespaces/{ns}/pods")
    assert denied.value.status == 403
    assert "system:serviceaccount:sandbox-rbac-test:unbound" in str(denied.value)


def test_token_for_a_missing_service_account_is_a_readable_error(control_plane):
    with pytest.raises(ControlPlaneError, match="default/no-such-account"):
        control_plane.service_account_kubeconfig("default", "no-such-account")


def test_gpu_pod_without_a_node_stays_pending_with_failed_scheduling(control_plane, namespace):
    api = control_plane.admin_api()
    label = uuid.uuid4().hex[:8]
    api.post(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("wants-a-gpu", 1, label))

    events = wait_for(
        "a FailedScheduling event",
        lambda: failed_scheduling(api, namespace, "wants-a-gpu"),
    )
    reporter = events[0].get("reportingComponent") or events[0]["source"].get("component")
    assert reporter == "default-scheduler"

    def scheduled_condition():
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/wants-a-gpu")
        conditions = pod["status"].get("conditions", [])
        return pod, next((c for c in conditions if c["type"] == "PodScheduled"), None)

    # The event and the pod's status are written separately; wait for both.
    wait_for("the PodScheduled condition", lambda: scheduled_condition()[1])
    pod, scheduled = scheduled_condition()
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]


def make_gpu_node(api: KubeApi, name: str, label: str, gpus: int) -> None:
    """A Node whose status reports GPUs, the way a kubelet with a device plugin does."""
    api.post(
        "/api/v1/nodes",
        {
            "metadata": {"name": name, "labels": {"gpuspawner.io/test-node": label}},
            "spec": {
                "taints": [
                    {"key": "gpuspawner.io/test-only", "value": label, "effect": "NoSchedule"}
                ]
            },
        },
    )
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: str(gpus)}
    api.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        json.dumps(
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "test node",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            }
        ),
        content_type="application/strategic-merge-patch+json",
    )
    api.post(
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        {
            "metadata": {"name": name},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        },
    )


def test_scheduler_counts_gpus_as_an_extended_resource(control_plane, namespace):
    api = control_plane.admin_api()
    label = uuid.uuid4().hex[:8]
    node = f"test-gpu-node-{label}"
    make_gpu_node(api, node, label, gpus=4)
    try:
        node_obj = api.get(f"/api/v1/nodes/{node}")
        assert node_obj["status"]["allocatable"][GPU] == "4"

        def bound(pod: str):
            return api.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["spec"].get("nodeName")

        pods = f"/api/v1/namespaces/{namespace}/pods"
        api.post(pods, pod_manifest("two-gpus", 2, label))
        assert wait_for("two-gpus to be bound", lambda: bound("two-gpus")) == node

        # 2 of 4 are taken: 3 more do not fit, and the scheduler says why.
        api.post(pods, pod_manifest("three-gpus", 3, label))
        events = wait_for(
            "three-gpus to fail scheduling",
            lambda: failed_scheduling(api, namespace, "three-gpus"),
        )
        assert f"Insufficient {GPU}" in events[-1]["message"]
        assert bound("three-gpus") is None

        # ...but exactly the 2 that are left do.
        api.post(pods, pod_manifest("two-more-gpus", 2, label))
        assert wait_for("two-more-gpus to be bound", lambda: bound("two-more-gpus")) == node
    finally:
        testing.force_delete_pods(api, namespace)
        api.delete(f"/api/v1/nodes/{node}")
        api.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")


def test_stop_leaves_no_process(control_plane_binary, tmp_path):
    cp = ControlPlane(tmp_path / "state", control_plane_binary)
    cp.start()
    pids = [p.pid for p in cp.processes.values()]
    assert len(pids) == 4
    assert (tmp_path / "state" / "controlplane.json").exists()
    cp.stop()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} is still there"
    assert testing.processes_mentioning(str(tmp_path)) == []
    assert not (tmp_path / "state" / "controlplane.json").exists()


def test_component_dying_at_start_is_named_and_nothing_is_left(
    control_plane_binary, tmp_path, monkeypatch
):
    original = ControlPlane._apiserver_args
    monkeypatch.setattr(
        ControlPlane,
        "_apiserver_args",
        lambda self: [*original(self), "--no-such-flag-for-this-test"],
    )
    cp = ControlPlane(tmp_path / "state", control_plane_binary)
    with pytest.raises(ControlPlaneError) as excinfo:
        cp.start(timeout=120)
    message = str(excinfo.value)
    assert message.startswith("kube-apiserver exited")
    assert "no-such-flag-for-this-test" in message  # the log's last lines are included
    assert cp.processes == {}
    assert testing.processes_mentioning(str(tmp_path)) == []


def test_node_identities_are_held_to_their_own_node(control_plane):
    # The Node authorizer and NodeRestriction are on: a kubelet's credentials
    # may register and update its own Node, never another one.
    me, other = f"node-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"
    kubelet = KubeApi.from_kubeconfig(
        control_plane.client_kubeconfig(f"system:node:{me}", ["system:nodes"])
    )
    admin = control_plane.admin_api()
    try:
        kubelet.post("/api/v1/nodes", {"metadata": {"name": me}})
        with pytest.raises(ApiError) as denied:
            kubelet.post("/api/v1/nodes", {"metadata": {"name": other}})
        assert denied.value.status == 403
        admin.post("/api/v1/nodes", {"metadata": {"name": other}})
        with pytest.raises(ApiError) as denied:
            kubelet.request(
                "PATCH",
                f"/api/v1/nodes/{other}/status",
                json.dumps({"status": {"capacity": {GPU: "8"}}}),
                content_type="application/strategic-merge-patch+json",
            )
        assert denied.value.status == 403
    finally:
        for name in (me, other):
            with contextlib.suppress(ApiError):
                admin.delete(f"/api/v1/nodes/{name}")


def test_a_port_taken_after_it_was_picked_means_a_retry(
    control_plane_binary, tmp_path, monkeypatch
):
    from gpuspawner_sandbox import controlplane

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_free_port = controlplane.free_port
    handed_out = []

    def racy_free_port(host="127.0.0.1"):
        # The first port handed out (etcd's) is grabbed by someone else.
        port = taken if not handed_out else real_free_port(host)
        handed_out.append(port)
        return port

    monkeypatch.setattr(controlplane, "free_port", racy_free_port)
    cp = ControlPlane(tmp_path / "state", control_plane_binary)
    try:
        cp.start(timeout=120)
        assert cp.ports["etcd"] != taken
        assert handed_out[0] == taken
    finally:
        cp.stop()
        squatter.close()
    assert testing.processes_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize(
    ("api_address", "allowed"),
    [("127.0.0.9", True), ("10.244.255.2", True), ("10.244.3.1", False), ("192.0.2.7", False)],
)
def test_the_api_server_listens_on_loopback_or_the_hosts_pod_range_address_only(
    tmp_path, api_address, allowed
):
    if allowed:
        cp = ControlPlane(tmp_path, tmp_path / "k8s", api_address=api_address)
        assert cp.api_address == api_address and cp.host == "127.0.0.1"
    else:
        with pytest.raises(ValueError, match=rf"^{api_address} is neither a loopback address"):
            ControlPlane(tmp_path, tmp_path / "k8s", api_address=api_address)
    assert list(tmp_path.iterdir()) == []


def test_the_kubernetes_service_ip_is_the_first_of_the_pod_range_services(tmp_path):
    assert ControlPlane(tmp_path, tmp_path / "k8s").service_ip == "10.244.255.129"
