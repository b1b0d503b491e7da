"""chart/gpuspawner rendered and linted by the real Helm (tests/chart/conftest.py).

tests/z2jh installs the same chart on real nodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from traitlets.config.loader import PyFileConfigLoader

from gpuspawner import chartconfig
from gpuspawner.core.catalog import parse_catalog
from gpuspawner_sandbox import helm, imagefacts

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "chart-values.yaml"
LOCAL = REPO / "config" / "sandbox" / "chart-local-values.yaml"
CHART_VALUES = yaml.safe_load((REPO / "chart" / "gpuspawner" / "values.yaml").read_text())
OURS = "gpuspawner"  # app.kubernetes.io/name of this chart's own objects
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


@pytest.fixture
def chart_helm(charts) -> tuple[helm.Helm, Path]:
    return charts.helm, charts.gpuspawner


def render(chart_helm, release="jhub", namespace="jupyterhub", files=(EXAMPLE,), **overrides):
    runner, chart = chart_helm
    return runner.template(
        release, chart, namespace=namespace, values_files=list(files), overrides=overrides
    )


def ours(manifests: list[dict]) -> list[dict]:
    return [
        m
        for m in manifests
        if m["metadata"].get("labels", {}).get("app.kubernetes.io/name") == OURS
    ]


def find(manifests, kind, name):
    (found,) = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def rbac(manifests) -> dict[tuple[str, str], dict]:
    return {
        (m["kind"], m["metadata"]["name"]): m for m in ours(manifests) if m["kind"] in RBAC_KINDS
    }


def test_the_schema_file_is_generated_from_the_catalogs_rules():
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chart_schema.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_helm_lint_passes_with_the_example_and_asks_for_a_catalog_without_one(chart_helm):
    runner, chart = chart_helm
    runner.run("lint", str(chart), "--strict", f"--values={EXAMPLE}")
    runner.run("lint", str(chart), "--strict", f"--values={EXAMPLE}", f"--values={LOCAL}")
    # the defaults hold no catalog (it would merge into the admin's): one is required
    with pytest.raises(helm.HelmError, match="/gpuspawner/catalog': missing property 'images'"):
        render(chart_helm, files=())


@pytest.mark.parametrize(
    "override,message",
    [
        ({"gpuspawner.catalog.images.pytorch.imagee": "x"}, "additional properties 'imagee'"),
        ({"gpuspawner.catalog.gpu_counts": [0, "two"]}, "got string, want integer"),
        ({"gpuspawner.catalog.limits.default": -1}, "/gpuspawner/catalog/limits/default"),
        ({"gpuspawner.culler.enabled": "yes"}, "/gpuspawner/culler/enabled"),
        ({"gpuspawner.cullr": {}}, "additional properties 'cullr'"),
    ],
)
def test_structurally_bad_values_are_refused_with_the_schemas_message(
    chart_helm, override, message
):
    runner, chart = chart_helm
    with pytest.raises(helm.HelmError) as refused:
        render(chart_helm, **override)
    assert "don't meet the specifications of the schema" in str(refused.value)
    assert message in str(refused.value)
    with pytest.raises(helm.HelmError, match="schema"):
        runner.run("lint", str(chart), f"--values={EXAMPLE}", *helm.set_flags(override))


def test_rbac_is_the_charts_for_any_release_name_and_namespace(chart_helm):
    first = rbac(render(chart_helm, "jhub", "jupyterhub"))
    second = rbac(render(chart_helm, "gpu", "team-b"))
    assert set(first).isdisjoint(second)  # two releases never share an object
    for objects, namespace in ((first, "jupyterhub"), (second, "team-b")):
        kinds = sorted(kind for kind, _ in objects)
        assert kinds == sorted(RBAC_KINDS)
        for m in objects.values():
            if m["kind"].endswith("Binding"):
                assert m["subjects"] == [
                    {"kind": "ServiceAccount", "name": "hub", "namespace": namespace}
                ]
                assert (m["roleRef"]["kind"], m["roleRef"]["name"]) in objects
            if m["kind"] in ("Role", "RoleBinding"):
                assert m["metadata"]["namespace"] == namespace


def test_the_hub_gets_exactly_nodes_read_and_pod_annotations(chart_helm):
    """Beyond z2jh's own hub Role: list/watch nodes (config/rbac.yaml's inventory rule), and
    patch pods in the release's namespace; pods elsewhere only with the opt-in."""
    objects = rbac(render(chart_helm))
    rules = {m["kind"]: m["rules"] for m in objects.values() if "rules" in m}
    plain = [d for d in yaml.safe_load_all((REPO / "config" / "rbac.yaml").read_text()) if d]
    (inventory,) = [
        d
        for d in plain
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("inventory")
    ]
    assert rules == {
        "ClusterRole": inventory["rules"],
        "Role": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}],
    }
    opted = rbac(render(chart_helm, **{"gpuspawner.inventory.allNamespaces": True}))
    added = {key: m for key, m in opted.items() if key not in objects}
    assert sorted(kind for kind, _ in added) == ["ClusterRole", "ClusterRoleBinding"]
    (role,) = [m for (kind, _), m in added.items() if kind == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]


def test_naming_cluster_queues_for_the_gpu_page_grants_exactly_its_kueue_reads(chart_helm):
    """gpuspawner.admin.kueueClusterQueues: the page's setting, and read-only Kueue rights
    for it (get by name; flavors listed; no Workload list), only while it names any."""
    queues = ["notebooks", "batch"]
    manifests = render(chart_helm, **{"gpuspawner.admin.kueueClusterQueues": queues})
    plain = rbac(render(chart_helm))
    added = {key: m for key, m in rbac(manifests).items() if key not in plain}
    name = "jupyterhub-jhub-gpuspawner-admin-kueue"
    assert sorted(added) == [("ClusterRole", name), ("ClusterRoleBinding", name)]
    assert added[("ClusterRole", name)]["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues", "workloads"],
            "verbs": ["get"],
        },
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors"], "verbs": ["list"]},
        {
            "apiGroups": ["visibility.kueue.x-k8s.io"],
            "resources": ["clusterqueues/pendingworkloads"],
            "verbs": ["get"],
        },
    ]
    binding = added[("ClusterRoleBinding", name)]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hub", "namespace": "jupyterhub"}
    ]
    assert binding["roleRef"]["name"] == name
    # the page is started with them on its command line, which wins over admin.config
    settings = json.loads(
        find(manifests, "ConfigMap", "gpuspawner-config")["data"]["settings.json"]
    )
    args = chartconfig.setup_arguments(settings)
    assert args["admin_args"][1:] == [
        "--GPUAdmin.kueue_cluster_queues=notebooks",
        "--GPUAdmin.kueue_cluster_queues=batch",
    ]
    assert chartconfig.setup_arguments(
        json.loads(
            find(render(chart_helm), "ConfigMap", "gpuspawner-config")["data"]["settings.json"]
        )
    )["admin_args"] == [f"--config={chartconfig.CONFIG_DIR / 'admin_config.json'}"]
    # the page turned off: no rights for it
    off = render(
        chart_helm,
        **{"gpuspawner.admin.kueueClusterQueues": queues, "gpuspawner.admin.enabled": False},
    )
    assert not [key for key in rbac(off) if key[1] == name]


def test_naming_cluster_queues_for_the_culler_grants_exactly_its_kueue_reads(chart_helm):
    """gpuspawner.culler.kueueClusterQueues: the culler's setting, and read-only Kueue rights
    for its demand (get by name; flavors listed; no Workload list), only while it names any."""
    queues = ["notebooks", "batch"]
    manifests = render(chart_helm, **{"gpuspawner.culler.kueueClusterQueues": queues})
    plain = rbac(render(chart_helm))
    added = {key: m for key, m in rbac(manifests).items() if key not in plain}
    name = "jupyterhub-jhub-gpuspawner-culler-kueue"
    assert sorted(added) == [("ClusterRole", name), ("ClusterRoleBinding", name)]
    assert added[("ClusterRole", name)]["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues", "workloads"],
            "verbs": ["get"],
        },
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors"], "verbs": ["list"]},
        {
            "apiGroups": ["visibility.kueue.x-k8s.io"],
            "resources": ["clusterqueues/pendingworkloads"],
            "verbs": ["get"],
        },
    ]
    binding = added[("ClusterRoleBinding", name)]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hub", "namespace": "jupyterhub"}
    ]
    assert binding["roleRef"]["name"] == name
    # the culler is started with them on its command line, which wins over culler.config
    settings = json.loads(
        find(manifests, "ConfigMap", "gpuspawner-config")["data"]["settings.json"]
    )
    assert chartconfig.setup_arguments(settings)["culler_args"][1:] == [
        "--GPUCuller.kueue_cluster_queues=notebooks",
        "--GPUCuller.kueue_cluster_queues=batch",
    ]
    # the culler turned off: no rights for it
    off = render(
        chart_helm,
        **{"gpuspawner.culler.kueueClusterQueues": queues, "gpuspawner.culler.enabled": False},
    )
    assert not [key for key in rbac(off) if key[1] == name]


def test_the_charts_own_objects_render_the_same_every_time(chart_helm):
    """Only z2jh's generated secrets differ between renders (Helm's randAlphaNum)."""
    assert ours(render(chart_helm)) == ours(render(chart_helm))


def test_the_pre_puller_pulls_each_catalog_image_once(chart_helm):
    same = "registry.example.org/gpuspawner/cuda-pytorch:2.15.0-cuda13.2-py3.13"
    manifests = render(
        chart_helm, **{"gpuspawner.catalog.images.again": {"image": same, "gpu_types": ["a100"]}}
    )
    puller = find(manifests, "DaemonSet", "jhub-gpuspawner-image-puller")
    spec = puller["spec"]["template"]["spec"]
    catalog = yaml.safe_load(EXAMPLE.read_text())["gpuspawner"]["catalog"]
    images = sorted({i["image"] for i in catalog["images"].values()})
    assert [c["image"] for c in spec["initContainers"]] == images
    assert [c["name"] for c in spec["containers"]] == ["pause"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    off = render(chart_helm, **{"gpuspawner.prePuller.enabled": False})
    assert not [m for m in ours(off) if m["kind"] == "DaemonSet"]
    # z2jh's hook puller (singleuser.image only) is off: this one pulls the catalog's
    assert not [m for m in manifests if m["metadata"]["name"] == "hook-image-puller"]


def test_the_catalog_configmap_is_the_values_catalog_mounted_as_a_directory(chart_helm):
    manifests = render(chart_helm)
    data = find(manifests, "ConfigMap", "gpuspawner-catalog")["data"]
    catalog = yaml.safe_load(data["catalog.yaml"])
    assert catalog == yaml.safe_load(EXAMPLE.read_text())["gpuspawner"]["catalog"]
    parse_catalog(catalog)
    hub = find(manifests, "Deployment", "hub")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in hub["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in hub["volumes"]}
    for name in ("gpuspawner-catalog", "gpuspawner-config"):
        assert volumes[name]["configMap"]["name"] == name
        # never subPath: the kubelet updates a directory's files in place, not a subPath's
        assert "subPath" not in mounts[name]
    catalog_file = CHART_VALUES["jupyterhub"]["hub"]["config"]["GPUSpawner"]["catalog_file"]
    assert Path(catalog_file).parent == Path(mounts["gpuspawner-catalog"]["mountPath"])
    assert Path(mounts["gpuspawner-config"]["mountPath"]) == chartconfig.CONFIG_DIR


def test_the_settings_are_what_the_hub_side_reads(chart_helm):
    data = find(render(chart_helm), "ConfigMap", "gpuspawner-config")["data"]
    settings = json.loads(data["settings.json"])
    args = chartconfig.setup_arguments(settings)
    assert (args["culler"], args["admin"], args["user_service"]) == (True, True, True)
    assert args["prometheus_url"] == "http://prometheus-server.monitoring.svc"
    assert args["admin_users"] == () and args["admin_groups"] == ("gpu-admins",)
    # accounting on, in the hub's own database, unless the values say otherwise
    assert settings["accounting"] == {"enabled": True, "dbUrl": ""}
    assert (
        json.loads(data["culler_config.json"])
        == yaml.safe_load(EXAMPLE.read_text())["gpuspawner"]["culler"]["config"]
    )
    off = find(
        render(chart_helm, **{"gpuspawner.culler.enabled": False}), "ConfigMap", "gpuspawner-config"
    )
    assert chartconfig.turned_off(json.loads(off["data"]["settings.json"])) == {"gpuspawner-culler"}


def test_the_local_release_runs_the_hub_image_the_image_tool_builds(chart_helm):
    """tests/z2jh imports the tool's hub image into the nodes (pullPolicy Never): the chart
    must name exactly that one, or the hub pod never starts (ErrImageNeverPull)."""
    manifests = render(chart_helm, files=(EXAMPLE, LOCAL))
    hub = find(manifests, "Deployment", "hub")["spec"]["template"]["spec"]["containers"][0]
    assert hub["image"] == imagefacts.image_facts(REPO).hub_ref
    assert hub["imagePullPolicy"] == "Never"


def test_helm_test_pods_ask_each_part(chart_helm):
    def tests(manifests):
        return {
            m["metadata"]["name"]: m
            for m in ours(manifests)
            if m["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
        }

    pods = tests(render(chart_helm, files=(EXAMPLE, LOCAL)))
    assert sorted(pods) == [
        f"jhub-gpuspawner-test-{p}" for p in ("admin-page", "culler", "hub-api", "user-service")
    ]
    hub = CHART_VALUES["jupyterhub"]["hub"]["image"]
    for pod in pods.values():
        (container,) = pod["spec"]["containers"]
        assert container["image"] == f"{hub['name']}:{hub['tag']}"
        assert container["imagePullPolicy"] == "Never"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["URL"].startswith("http://proxy-public/")
    off = tests(render(chart_helm, **{"gpuspawner.admin.enabled": False}))
    assert "jhub-gpuspawner-test-admin-page" not in off


def test_the_example_values_are_the_documented_catalog_and_culler_settings():
    example = yaml.safe_load(EXAMPLE.read_text())["gpuspawner"]
    assert parse_catalog(example["catalog"]) == parse_catalog(
        yaml.safe_load((REPO / "config" / "catalog.yaml").read_text())
    )
    py = PyFileConfigLoader("gpuspawner_culler_config.py", str(REPO / "config")).load_config()
    assert example["culler"]["config"]["GPUCuller"] == dict(py.GPUCuller)
    assert example["prometheus"]["url"] == py.PrometheusSettings.prometheus_url


def test_naming_a_kueue_queue_puts_the_hub_on_kueue_with_exactly_its_reads(chart_helm):
    """gpuspawner.kueue.queue: GPUSpawner.kueue_queue, and the hub's read-only Kueue rights:
    its LocalQueue and Workloads in the release's namespace (Role), the ClusterQueues and
    flavors cluster-wide (no Workloads of other namespaces), only while a queue is named."""
    manifests = render(chart_helm, **{"gpuspawner.kueue.queue": "gpu-notebooks"})
    plain = rbac(render(chart_helm))
    added = {key: m for key, m in rbac(manifests).items() if key not in plain}
    role, cluster = "jhub-gpuspawner-hub-kueue", "jupyterhub-jhub-gpuspawner-hub-kueue"
    assert sorted(added) == [
        ("ClusterRole", cluster),
        ("ClusterRoleBinding", cluster),
        ("Role", role),
        ("RoleBinding", role),
    ]
    assert added[("Role", role)]["metadata"]["namespace"] == "jupyterhub"
    assert added[("Role", role)]["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["localqueues", "workloads"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["visibility.kueue.x-k8s.io"],
            "resources": ["localqueues/pendingworkloads"],
            "verbs": ["get"],
        },
    ]
    assert added[("ClusterRole", cluster)]["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues", "resourceflavors"],
            "verbs": ["get", "list"],
        },
        {
            "apiGroups": ["visibility.kueue.x-k8s.io"],
            "resources": ["clusterqueues/pendingworkloads"],
            "verbs": ["get"],
        },
    ]
    for key in (("RoleBinding", role), ("ClusterRoleBinding", cluster)):
        assert added[key]["subjects"] == [
            {"kind": "ServiceAccount", "name": "hub", "namespace": "jupyterhub"}
        ]
    settings = json.loads(
        find(manifests, "ConfigMap", "gpuspawner-config")["data"]["settings.json"]
    )
    assert settings["kueue"] == {
        "queue": "gpu-notebooks",
        "priorityClass": "gpuspawner-interactive",
    }
