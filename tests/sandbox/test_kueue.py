"""Kueue in the local cluster (gpuspawner_sandbox.kueue): the objects it makes from the
module's manifests and the nodes, and, on real nodes with the cluster network, that its
webhook gates a queued pod, admits it onto a node of its flavor, lists what waits, and
that removing it leaves no trace.

With ``GPUSPAWNER_RECORD_KUEUE=1`` the machine test also writes the real objects it saw
to tests/fixtures/kueue/ (the core's unit tests read them).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from gpuspawner_sandbox import kueue as kq
from gpuspawner_sandbox import nodeconfig, testing
from gpuspawner_sandbox.topology import parse_topology

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED_NODES = FIXTURES / "nodes" / "recorded-nodes.json"
KUEUE_FIXTURES = FIXTURES / "kueue"


def _nodes() -> list[dict]:
    return json.loads(RECORDED_NODES.read_text())["items"]


def _by_name(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


# -- the queues from recorded nodes ----------------------------------------------------


def test_one_flavor_per_gpu_product_with_the_gpus_its_nodes_advertise():
    flavors = {f.name: f for f in kq.gpu_flavors(_nodes())}
    # two 4-GPU A100 nodes, one 8-GPU H100 node; the H100 node split into MIG slices
    # (same product) is a flavor of its own, picked by the MIG strategy label too
    assert flavors["nvidia-a100-sxm4-80gb"].resources == {"nvidia.com/gpu": 8}
    assert flavors["nvidia-a100-sxm4-80gb"].node_labels == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"
    }
    assert flavors["nvidia-h100-80gb-hbm3"].resources == {"nvidia.com/gpu": 8}
    mig = flavors["nvidia-h100-80gb-hbm3-mig"]
    assert mig.resources == {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-3g.40gb": 1}
    assert mig.node_labels == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/mig.strategy": "mixed",
    }
    assert len(flavors) == 3  # the CPU node gives none


def test_a_product_with_mig_nodes_only_keeps_the_products_name():
    nodes_ = [n for n in _nodes() if n["metadata"]["name"] == "gpu-h100-mig-0"]
    (flavor,) = kq.gpu_flavors(nodes_)
    assert flavor.name == "nvidia-h100-80gb-hbm3"
    assert flavor.node_labels == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert flavor.mig


def test_flavor_names_are_lower_cased_label_values_and_valid_names():
    assert kq.flavor_name("NVIDIA-A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"
    assert kq.flavor_name("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") == "nvidia-a100-sxm4-40gb-mig-1g.5gb"
    assert kq.flavor_name("Tesla T4 (PCIe)") == "tesla-t4--pcie"
    assert kq.flavor_name("???") == "gpu"


def test_resource_flavors_select_their_products_nodes():
    objects = kq.queue_objects(kq.gpu_flavors(_nodes()), "jupyterhub")
    flavors = _by_name(objects, "ResourceFlavor")
    assert flavors["default-flavor"]["spec"] == {}
    assert flavors["nvidia-a100-sxm4-80gb"]["spec"] == {
        "nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    }
    assert set(flavors) == {
        "default-flavor",
        "nvidia-a100-sxm4-80gb",
        "nvidia-h100-80gb-hbm3",
        "nvidia-h100-80gb-hbm3-mig",
    }


def _quota(cq: dict, flavor: str, resource: str):
    for group in cq["spec"]["resourceGroups"]:
        for f in group["flavors"]:
            if f["name"] == flavor:
                for r in f["resources"]:
                    if r["name"] == resource:
                        return r["nominalQuota"]
    return None


def test_notebooks_get_the_larger_half_of_each_flavor_and_batch_the_rest():
    odd = copy.deepcopy(_nodes())
    for node in odd:
        if node["metadata"]["name"] == "gpu-h100-0":
            node["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    cqs = _by_name(kq.queue_objects(kq.gpu_flavors(odd), "hub"), "ClusterQueue")
    notebooks, batch = cqs["notebooks"], cqs["batch"]
    assert _quota(notebooks, "nvidia-h100-80gb-hbm3", "nvidia.com/gpu") == 4
    assert _quota(batch, "nvidia-h100-80gb-hbm3", "nvidia.com/gpu") == 3
    assert _quota(notebooks, "nvidia-a100-sxm4-80gb", "nvidia.com/gpu") == 4
    assert _quota(batch, "nvidia-a100-sxm4-80gb", "nvidia.com/gpu") == 4
    assert _quota(notebooks, "nvidia-h100-80gb-hbm3-mig", "nvidia.com/mig-3g.40gb") == 1
    assert _quota(batch, "nvidia-h100-80gb-hbm3-mig", "nvidia.com/mig-3g.40gb") == 0
    assert kq.notebook_share(1) == 1 and kq.notebook_share(0) == 0


def test_both_cluster_queues_share_a_cohort_and_group_gpus_and_mig_apart():
    cqs = _by_name(kq.queue_objects(kq.gpu_flavors(_nodes()), "hub"), "ClusterQueue")
    assert set(cqs) == {"notebooks", "batch"}
    for cq in cqs.values():
        spec = cq["spec"]
        assert spec["cohortName"] == "gpus"
        assert spec["namespaceSelector"] == {}
        assert spec["queueingStrategy"] == "BestEffortFIFO"
        assert spec["preemption"] == {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"}
        groups = [g["coveredResources"] for g in spec["resourceGroups"]]
        assert groups == [
            ["cpu", "memory"],
            ["nvidia.com/gpu"],
            ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"],
        ]
        # a flavor sits in one group only (Kueue refuses it otherwise), and no limits
        names = [f["name"] for g in spec["resourceGroups"] for f in g["flavors"]]
        assert len(names) == len(set(names))
        for group in spec["resourceGroups"]:
            for flavor in group["flavors"]:
                assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
                assert all("borrowingLimit" not in r for r in flavor["resources"])


def test_preemption_is_an_option():
    cqs = _by_name(
        kq.queue_objects(kq.gpu_flavors(_nodes()), "hub", preemption=True), "ClusterQueue"
    )
    for cq in cqs.values():
        assert cq["spec"]["preemption"] == {
            "withinClusterQueue": "LowerPriority",
            "reclaimWithinCohort": "Any",
        }


def test_local_queues_priority_classes_and_the_batch_namespace():
    objects = kq.queue_objects(kq.gpu_flavors(_nodes()), "jupyterhub")
    local = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["clusterQueue"]
        for o in objects
        if o["kind"] == "LocalQueue"
    }
    assert local == {("jupyterhub", "gpu-notebooks"): "notebooks", ("batch", "batch"): "batch"}
    classes = {n: o["value"] for n, o in _by_name(objects, "WorkloadPriorityClass").items()}
    assert classes == {"gpuspawner-interactive": 1000, "gpuspawner-batch": 100}
    kinds = [o["kind"] for o in objects]
    # what a LocalQueue names exists first; the batch namespace before its queue
    assert kinds.index("Namespace") < kinds.index("LocalQueue")
    assert max(i for i, k in enumerate(kinds) if k == "ResourceFlavor") < kinds.index(
        "ClusterQueue"
    )


def test_no_gpu_nodes_leave_only_cpu_and_memory():
    cpu = [n for n in _nodes() if n["metadata"]["name"] == "cpu-0"]
    assert kq.gpu_flavors(cpu) == []
    cqs = _by_name(kq.queue_objects([], "hub"), "ClusterQueue")
    assert [g["coveredResources"] for g in cqs["batch"]["spec"]["resourceGroups"]] == [
        ["cpu", "memory"]
    ]


# -- the control-plane objects from the module's manifests -----------------------------


@pytest.fixture(scope="module")
def components():
    try:
        module = kq.module_dir()
    except Exception as e:  # no Go, or no module proxy
        testing.sandbox_unavailable(f"Kueue's module is not available: {e}")
    return kq.read_components(module)


@pytest.fixture(scope="module")
def stages(components):
    return kq.control_plane_objects(components, "gpuspawner.invalid/kueue:v0.17.0")


def test_stages_come_in_the_order_kueue_needs(stages):
    kinds = [sorted({o["kind"] for o in stage}) for stage in stages]
    assert kinds[0] == ["CustomResourceDefinition"]
    assert kinds[1] == ["Namespace"]
    assert "ClusterRole" in kinds[2] and "ServiceAccount" in kinds[2]
    assert kinds[3] == ["Secret"]
    assert kinds[4] == ["MutatingWebhookConfiguration", "Service", "ValidatingWebhookConfiguration"]
    assert kinds[5] == ["APIService", "RoleBinding", "Service"]
    assert kinds[6] == ["ConfigMap"]
    assert kinds[7] == ["Deployment"]
    (secret,) = stages[3]
    assert secret["metadata"] == {
        "name": "kueue-webhook-server-cert",
        "namespace": "kueue-system",
        "labels": kq.LABELS,
    }
    assert "data" not in secret  # Kueue's certificate rotator fills it


def test_everything_is_named_and_placed_as_config_default_does(stages):
    objects = [o for stage in stages for o in stage]
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] not in ("CustomResourceDefinition", "APIService", "Namespace"):
            assert meta["name"].startswith("kueue-"), meta
        if "namespace" in meta:
            assert meta["namespace"] in ("kueue-system", "kube-system"), meta
        for subject in obj.get("subjects") or []:
            if subject["kind"] == "ServiceAccount":
                assert subject == {
                    "kind": "ServiceAccount",
                    "name": "kueue-controller-manager",
                    "namespace": "kueue-system",
                }
    bindings = _by_name(objects, "ClusterRoleBinding")
    assert bindings["kueue-manager-rolebinding"]["roleRef"]["name"] == "kueue-manager-role"
    assert "kueue-manager-role" in _by_name(objects, "ClusterRole")
    (reader,) = [o for o in objects if o["metadata"].get("namespace") == "kube-system"]
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"


def test_webhooks_and_conversions_reach_the_webhook_service(stages):
    objects = [o for stage in stages for o in stage]
    service = {"name": "kueue-webhook-service", "namespace": "kueue-system"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (config,) = _by_name(objects, kind).values()
        assert config["metadata"]["name"] in (
            "kueue-mutating-webhook-configuration",
            "kueue-validating-webhook-configuration",
        )
        hooks = {h["name"]: h for h in config["webhooks"]}
        for hook in hooks.values():
            assert {k: hook["clientConfig"]["service"][k] for k in ("name", "namespace")} == service
        # pods of kube-system and kueue-system never reach Kueue's pod webhooks
        pod = hooks["mpod.kb.io" if kind.startswith("Mutating") else "vpod.kb.io"]
        (expr,) = pod["namespaceSelector"]["matchExpressions"]
        assert expr["operator"] == "NotIn" and expr["values"] == ["kube-system", "kueue-system"]
    crds = _by_name(objects, "CustomResourceDefinition")
    converted = {n for n, c in crds.items() if c["spec"].get("conversion", {}).get("webhook")}
    assert converted == {
        "localqueues.kueue.x-k8s.io",
        "clusterqueues.kueue.x-k8s.io",
        "cohorts.kueue.x-k8s.io",
        "workloads.kueue.x-k8s.io",
        "multikueueclusters.kueue.x-k8s.io",
    }
    for name in converted:
        client = crds[name]["spec"]["conversion"]["webhook"]["clientConfig"]
        assert {k: client["service"][k] for k in ("name", "namespace")} == service
    services = _by_name(objects, "Service")
    assert services["kueue-webhook-service"]["spec"]["ports"][0]["targetPort"] == 9443
    assert services["kueue-visibility-server"]["spec"]["ports"][0]["targetPort"] == 8082
    deployment = _by_name(objects, "Deployment")["kueue-controller-manager"]
    for svc in services.values():
        assert svc["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_visibility_api_is_served_through_the_aggregation_layer(stages):
    objects = [o for stage in stages for o in stage]
    services = _by_name(objects, "APIService")
    assert "v1beta2.visibility.kueue.x-k8s.io" in services
    for svc in services.values():
        assert svc["spec"]["group"] == "visibility.kueue.x-k8s.io"
        assert svc["spec"]["service"] == {
            "name": "kueue-visibility-server",
            "namespace": "kueue-system",
        }
    assert kq.pending_path("notebooks") == (
        "/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/notebooks/pendingworkloads"
    )
    assert kq.pending_path(local_queue=("hub", "gpu-notebooks")) == (
        "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/hub/localqueues/gpu-notebooks"
        "/pendingworkloads"
    )


def test_the_configuration_queues_only_labelled_jobs_and_pods(stages):
    (config_map,) = stages[6]
    config = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    assert config == kq.configuration()
    assert config["integrations"]["frameworks"] == ["batch/job", "pod"]
    assert config["manageJobsWithoutQueueName"] is False
    (expr,) = config["managedJobsNamespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["kube-system", "kueue-system"] and expr["operator"] == "NotIn"
    assert config["internalCertManagement"] == {
        "enable": True,
        "webhookServiceName": "kueue-webhook-service",
        "webhookSecretName": "kueue-webhook-server-cert",
    }


def test_the_manager_runs_unprivileged_from_the_local_image_ready_from_its_health_port(stages):
    (deployment,) = stages[7]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "gpuspawner.invalid/kueue:v0.17.0"
    assert container["imagePullPolicy"] == "Never"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8081}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == "kueue-controller-manager"
    assert "tolerations" not in pod  # never on a (tainted) GPU node
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp/k8s-webhook-server/serving-certs" in mounts and "/visibility" in mounts


def test_object_paths():
    assert kq.object_path({"kind": "LocalQueue", "metadata": {"name": "q", "namespace": "ns"}}) == (
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/localqueues/q"
    )
    assert kq.object_path({"kind": "APIService", "metadata": {"name": "v1.x"}}) == (
        "/apis/apiregistration.k8s.io/v1/apiservices/v1.x"
    )


def test_the_build_is_keyed_by_the_modules_version():
    assert kq.KUEUE.module == "sigs.k8s.io/kueue" and kq.KUEUE.version == "v0.17.0"
    assert kq.KUEUE.binaries == ("kueue",)
    assert not kq.KUEUE.cgo  # static: the image holds the binary alone
    assert "v0.17.0" in str(kq.nodebuild.tool_dir(kq.KUEUE, Path("/c")))


# -- on real nodes with the cluster network --------------------------------------------

A100 = "kq-a100-0"
H100 = "kq-h100-0"
CPU = "kq-cpu-0"
TOPOLOGY = parse_topology(
    {
        "nodes": [
            {"name": A100, "gpu": {"model": "A100-SXM4-80GB", "count": 2}},
            {"name": H100, "gpu": {"model": "H100-80GB-HBM3", "count": 2}},
            {"name": CPU, "cpu": "8", "memory": "16Gi"},
        ]
    }
)
HUB_NAMESPACE = "kueue-hub"
wait_for = functools.partial(testing.wait_for, timeout=120, interval=0.5)


@pytest.fixture(scope="module")
def cluster(pytestconfig):
    """Control plane on the pods' side + two GPU nodes (A100, H100) and a CPU node."""
    with testing.running_networked_cluster(pytestconfig, TOPOLOGY, "gs-kueue-") as running:
        yield running


def _queued_pod(name: str, gpus: int, product: str, queue: str = "gpu-notebooks") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "kueue.x-k8s.io/queue-name": queue,
                "kueue.x-k8s.io/priority-class": "gpuspawner-interactive",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": nodeconfig.TOOL_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["sleep", "infinity"],
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "16Mi"},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }


def _workload_of(api, namespace: str, pod_uid: str) -> dict | None:
    workloads = api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads")
    for wl in workloads["items"]:
        if any(o.get("uid") == pod_uid for o in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def _condition(obj: dict, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _resident_kib(cluster, pod: dict) -> int:
    """The manager's resident memory (VmRSS), from its process on the host."""
    container = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    total = 0
    for pid in testing.container_pids(pod["spec"]["nodeName"], container):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _record(name: str, obj: dict) -> None:
    if os.environ.get("GPUSPAWNER_RECORD_KUEUE") != "1":
        return
    KUEUE_FIXTURES.mkdir(parents=True, exist_ok=True)
    (KUEUE_FIXTURES / name).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def _kueue_leftovers(api) -> list[str]:
    crds = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
    left = [c["metadata"]["name"] for c in crds if c["spec"]["group"].endswith("kueue.x-k8s.io")]
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        items = api.get(f"/apis/admissionregistration.k8s.io/v1/{plural}")["items"]
        left += [i["metadata"]["name"] for i in items if "kueue" in i["metadata"]["name"]]
    services = api.get("/apis/apiregistration.k8s.io/v1/apiservices")["items"]
    left += [s["metadata"]["name"] for s in services if "kueue" in s["metadata"]["name"]]
    for plural in ("clusterroles", "clusterrolebindings"):
        items = api.get(f"/apis/rbac.authorization.k8s.io/v1/{plural}")["items"]
        left += [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith("kueue-")]
    namespaces = api.get("/api/v1/namespaces")["items"]
    left += [
        n["metadata"]["name"]
        for n in namespaces
        if n["metadata"]["name"] in ("kueue-system", "batch", HUB_NAMESPACE)
    ]
    return left


def test_kueue_gates_admits_and_lists_queued_pods_and_leaves_nothing(cluster, pytestconfig):
    api = cluster.api()
    h100 = next(n.model.product for n in TOPOLOGY.nodes if n.name == H100)
    with testing.running_kueue(cluster, HUB_NAMESPACE, pytestconfig) as kueue:
        sys.__stderr__.write(f"Kueue started in {kueue.started_in:.1f}s\n")
        pods = f"/api/v1/namespaces/{HUB_NAMESPACE}/pods"
        # A pod without the queue label is none of Kueue's business.
        plain = _queued_pod("plain", 0, h100)
        del plain["metadata"]["labels"]
        plain["spec"]["containers"][0]["resources"] = {}
        created = api.post(pods, plain)
        assert not created["spec"].get("schedulingGates")
        assert not created["metadata"].get("finalizers")

        # Both H100s: one of notebooks' own, one borrowed from batch in the cohort.
        created = api.post(pods, _queued_pod("holder", 2, h100))
        assert {"name": "kueue.x-k8s.io/admission"} in created["spec"]["schedulingGates"]
        workload = wait_for(
            "the holder's Workload to be admitted",
            lambda: (
                wl
                if (wl := _workload_of(api, HUB_NAMESPACE, created["metadata"]["uid"]))
                and _condition(wl, "Admitted")
                else None
            ),
        )
        (assignment,) = workload["status"]["admission"]["podSetAssignments"]
        assert assignment["flavors"]["nvidia.com/gpu"] == kq.flavor_name(h100)
        assert workload["status"]["admission"]["clusterQueue"] == "notebooks"
        running = wait_for(
            "the holder to run", lambda: testing.running_pod(api, HUB_NAMESPACE, "holder")
        )
        assert running["spec"]["nodeName"] == H100
        assert not running["spec"].get("schedulingGates")

        # Nothing left of the H100s: the next one waits, and the visibility API says where.
        waiting = api.post(pods, _queued_pod("waiter", 1, h100))
        assert {"name": "kueue.x-k8s.io/admission"} in waiting["spec"]["schedulingGates"]
        summary = wait_for(
            "the waiter in notebooks' pending workloads",
            lambda: s if (s := kueue.pending("notebooks")).get("items") else None,
        )
        (entry,) = summary["items"]
        assert entry["metadata"]["namespace"] == HUB_NAMESPACE
        assert entry["positionInClusterQueue"] == 0 and entry["positionInLocalQueue"] == 0
        assert entry["localQueueName"] == "gpu-notebooks"
        assert entry["metadata"]["ownerReferences"][0]["uid"] == waiting["metadata"]["uid"]
        local = kueue.pending_in_local_queue(HUB_NAMESPACE, "gpu-notebooks")
        assert [i["metadata"]["name"] for i in local["items"]] == [entry["metadata"]["name"]]
        pending_wl = _workload_of(api, HUB_NAMESPACE, waiting["metadata"]["uid"])
        assert pending_wl is not None and not _condition(pending_wl, "QuotaReserved")
        still = api.get(f"{pods}/waiter")
        assert {"name": "kueue.x-k8s.io/admission"} in still["spec"]["schedulingGates"]

        pod = kueue.pod()
        assert pod is not None and pod["spec"]["nodeName"] == CPU
        sys.__stderr__.write(
            f"Kueue's resident memory: {_resident_kib(cluster, pod) / 1024:.0f} MiB\n"
        )

        # (its status follows Kueue's cache a moment later)
        cq = wait_for(
            "notebooks' status to count the holder and the waiter",
            lambda: (
                q
                if (q := api.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/notebooks"))[
                    "status"
                ].get("pendingWorkloads")
                == 1
                and q["status"].get("admittedWorkloads") == 1
                else None
            ),
        )
        _record("workload-admitted.json", workload)
        _record("workload-pending.json", pending_wl)
        _record("clusterqueue-notebooks.json", cq)
        _record(
            "clusterqueue-batch.json", api.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/batch")
        )
        _record(
            "resourceflavor.json",
            api.get(f"/apis/kueue.x-k8s.io/v1beta2/resourceflavors/{kq.flavor_name(h100)}"),
        )
        _record("pending-clusterqueue.json", summary)
        _record("pending-localqueue.json", local)
        testing.force_delete_pods(api, HUB_NAMESPACE)
    assert _kueue_leftovers(api) == []
    # and pods are Kueue's no more
    api.post("/api/v1/namespaces", {"metadata": {"name": "after-kueue"}})
    cluster.cp.wait_for_service_account("after-kueue")
    try:
        created = api.post("/api/v1/namespaces/after-kueue/pods", _queued_pod("later", 1, h100))
        assert not created["spec"].get("schedulingGates")
    finally:
        testing.force_delete_pods(api, "after-kueue")
        api.delete("/api/v1/namespaces/after-kueue")


def test_a_second_start_with_preemption_and_a_clean_stop(cluster, pytestconfig):
    api = cluster.api()
    with testing.running_kueue(cluster, HUB_NAMESPACE, pytestconfig, preemption=True) as kueue:
        sys.__stderr__.write(f"Kueue started again (warm) in {kueue.started_in:.1f}s\n")
        for name in ("notebooks", "batch"):
            cq = api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{name}")
            assert cq["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
            assert cq["spec"]["preemption"]["reclaimWithinCohort"] == "Any"
        assert {f.name for f in kueue.flavors} == {
            "nvidia-a100-sxm4-80gb",
            "nvidia-h100-80gb-hbm3",
        }
        assert kueue.pending("batch")["items"] == []
    assert _kueue_leftovers(api) == []


def test_up_refuses_kueue_without_nodes(tmp_path, capsys):
    from gpuspawner_sandbox import cli

    assert cli.main(["--state-dir", str(tmp_path), "up", "--kueue", "--no-kubelet"]) == 1
    assert "--kueue needs them" in capsys.readouterr().err


def test_the_demo_queues_the_hubs_gpu_servers_in_kueue_with_its_flag():
    from gpuspawner_sandbox import demo

    assert "c.GPUSpawner.kueue_queue = 'gpu-notebooks'" in demo.KUEUE_HUB_CONFIG
    stack = demo.SandboxStack(Path("/nonexistent"), kueue=True, kueue_preemption=True)
    assert stack.kueue and stack.kueue_preemption and stack.running_kueue is None


class _FakeApi:
    """The few calls _Remount makes: the Secret, the manager's pods, their deletion."""

    def __init__(self):
        self.secret: dict = {"metadata": {}}
        self.ready = False
        self.deleted: list[str] = []

    def get(self, path, query=None):
        if path.endswith("/secrets/kueue-webhook-server-cert"):
            return self.secret
        status = {"conditions": [{"type": "Ready", "status": "True" if self.ready else "False"}]}
        return {"items": [{"metadata": {"name": "kueue-1"}, "status": status}]}

    def delete(self, path, query=None):
        self.deleted.append(path)


def test_a_pod_that_misses_its_filled_certificate_is_replaced_once(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(kq.time, "monotonic", lambda: clock[0])
    api = _FakeApi()
    remount = kq._Remount(api)
    assert remount.check() is False and api.deleted == []  # the Secret is still empty
    api.secret = {"data": {"tls.crt": "Y2VydA=="}}
    remount.check()
    clock[0] += kq._Remount.GRACE - 1
    remount.check()
    assert api.deleted == []  # the kubelet may still update the volume
    clock[0] += 2
    remount.check()
    assert api.deleted == ["/api/v1/namespaces/kueue-system/pods/kueue-1"]
    clock[0] += 100
    remount.check()
    assert len(api.deleted) == 1  # once only


def test_a_ready_pod_is_left_alone(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(kq.time, "monotonic", lambda: clock[0])
    api = _FakeApi()
    api.secret = {"data": {"tls.crt": "Y2VydA=="}}
    api.ready = True
    remount = kq._Remount(api)
    remount.check()
    clock[0] += 60
    remount.check()
    assert api.deleted == []


class _DefaultingApi:
    """ClusterQueues as the API server keeps them: a merge patch applied, then Kueue's CRD
    defaults (``borrowWithinCohort``) filled in, and Kueue's Active condition."""

    def __init__(self, names):
        self.queues = {
            n: {"spec": {"preemption": kq.preemption_policy(False)}, "status": {}} for n in names
        }
        for q in self.queues.values():
            q["spec"]["preemption"]["borrowWithinCohort"] = {"policy": "Never"}
            q["status"]["conditions"] = [{"type": "Active", "status": "True"}]

    def request(self, method, path, body=None, **kw):
        assert method == "PATCH" and kw["content_type"] == "application/merge-patch+json"
        spec = self.queues[path.rsplit("/", 1)[1]]["spec"]
        spec["preemption"] = {**spec["preemption"], **body["spec"]["preemption"]}

    def get(self, path, query=None):
        return self.queues[path.rsplit("/", 1)[1]]


def test_preemption_switches_on_a_running_kueue_whose_crd_adds_defaults():
    api = _DefaultingApi(kq.Kueue(None, "jupyterhub", [], []).cluster_queues)
    running = kq.Kueue(api, "jupyterhub", [], [])
    running.set_preemption(True, timeout=2)
    for q in api.queues.values():
        assert q["spec"]["preemption"]["reclaimWithinCohort"] == "Any"
        assert q["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    running.set_preemption(False, timeout=2)
    assert all(
        q["spec"]["preemption"]["reclaimWithinCohort"] == "Never" for q in api.queues.values()
    )
