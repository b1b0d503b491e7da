"""Real Helm (built from helm.sh/helm/v3) over zero-to-jupyterhub 4.4.0 with our values.

The chart is read from ../shared/third-party (as in git); where it is missing
these tests skip loudly, and fail in CI.
"""

from __future__ import annotations

import base64
import json
import sys

import pytest
import yaml

from gpuspawner_sandbox import build, helm, imagefacts, testing

VALUES = build.REPO_ROOT / "config" / "z2jh-values.yaml"
#: The overrides for a cluster that reaches no registry: only images built on this machine.
LOCAL_VALUES = build.REPO_ROOT / "config" / "sandbox" / "z2jh-local-values.yaml"
#: What the local cluster lacks (load balancer, provisioner, identity provider): tests/z2jh.
CLUSTER_VALUES = build.REPO_ROOT / "config" / "sandbox" / "z2jh-cluster-values.yaml"
HUB_DB_PV = build.REPO_ROOT / "config" / "sandbox" / "z2jh-hub-db-pv.yaml"
NAMESPACE = "jupyterhub"
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")
#: What the chart's user-scheduler ClusterRole lacks for kube-scheduler v1.37.
USER_SCHEDULER_RBAC = build.REPO_ROOT / "config" / "sandbox" / "z2jh-user-scheduler-rbac.yaml"


def test_chart_yaml_gets_the_release_version():
    text = "apiVersion: v2\nname: jupyterhub\nversion: 0.0.1-set.by.chartpress\nappVersion: 5.5.0\n"
    released = yaml.safe_load(helm.release_chart_yaml(text, "4.4.0"))
    assert released == {
        "apiVersion": "v2",
        "name": "jupyterhub",
        "version": "4.4.0",
        "appVersion": "5.5.0",
    }
    with pytest.raises(helm.HelmError, match="no top-level version"):
        helm.release_chart_yaml("apiVersion: v2\n", "4.4.0")


def test_values_yaml_gets_the_release_tag_everywhere():
    text = 'a:\n  tag: "set-by-chartpress"\nb:\n  image:\n    tag: "set-by-chartpress"\nc: {tag: "1"}\n'
    released = yaml.safe_load(helm.release_values_yaml(text, "4.4.0"))
    assert released == {"a": {"tag": "4.4.0"}, "b": {"image": {"tag": "4.4.0"}}, "c": {"tag": "1"}}
    with pytest.raises(helm.HelmError, match="set-by-chartpress"):
        helm.release_values_yaml("a: {tag: '1'}\n", "4.4.0")


def test_helm_runs_with_its_own_home_whatever_the_callers_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HELM_REPOSITORY_CONFIG", "/elsewhere/repositories.yaml")
    monkeypatch.setenv("KUBECONFIG", "/elsewhere/kubeconfig")
    env = helm.Helm(tmp_path / "helm", tmp_path / "home").env()
    assert env["HELM_CACHE_HOME"] == str(tmp_path / "home" / "cache")
    assert env["HELM_DATA_HOME"] == str(tmp_path / "home" / "data")
    assert "HELM_REPOSITORY_CONFIG" not in env
    assert "KUBECONFIG" not in env
    with_cluster = helm.Helm(tmp_path / "helm", tmp_path / "home", tmp_path / "kc").env()
    assert with_cluster["KUBECONFIG"] == str(tmp_path / "kc")


# --- the real helm -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_helm(pytestconfig, tmp_path_factory) -> helm.Helm:
    with testing.capture_disabled(pytestconfig):
        try:
            binary = helm.build_helm(out=sys.stderr)
        except build.GoMissing as e:
            testing.sandbox_unavailable(str(e))
    return helm.Helm(binary, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def chart(tmp_path_factory):
    if not (helm.Z2JH_CHART / "Chart.yaml").is_file():
        testing.third_party_missing(
            f"THE ZERO-TO-JUPYTERHUB 4.4.0 CHART IS MISSING at {helm.Z2JH_CHART} "
            "(a copy of shared/ beside the clone), so the Helm tests do not run"
        )
    return helm.release_chart(helm.Z2JH_CHART, tmp_path_factory.mktemp("chart") / "jupyterhub")


@pytest.fixture(scope="module")
def rendered(real_helm, chart) -> list[dict]:
    return real_helm.template("jhub", chart, namespace=NAMESPACE, values_files=[VALUES])


def containers(manifests) -> list[dict]:
    """Every container and init container of the rendered workloads."""
    return [
        c
        for m in manifests
        if m["kind"] in WORKLOADS
        for c in [
            *m["spec"]["template"]["spec"].get("initContainers", []),
            *m["spec"]["template"]["spec"]["containers"],
        ]
    ]


def find(manifests, kind, name):
    matches = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered"
    return matches[0]


def test_helm_is_the_pinned_release(real_helm):
    assert f'Version:"{helm.HELM_VERSION}"' in real_helm.run("version")


def test_our_values_pass_helm_lint_with_the_released_chart(real_helm, chart):
    out = real_helm.run("lint", "--strict", str(chart), f"--values={VALUES}")
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_the_hub_runs_our_image_with_the_released_chart_around_it(rendered, chart):
    values = yaml.safe_load(VALUES.read_text())
    hub = find(rendered, "Deployment", "hub")
    (container,) = [c for c in hub["spec"]["template"]["spec"]["containers"] if c["name"] == "hub"]
    assert container["image"] == f"{values['hub']['image']['name']}:{values['hub']['image']['tag']}"
    assert hub["metadata"]["labels"]["helm.sh/chart"] == f"jupyterhub-{helm.Z2JH_VERSION}"
    # every image the chart tags with its own release is tagged 4.4.0, as published
    chart_images = [
        c["image"] for c in containers(rendered) if c["image"].startswith("quay.io/jupyterhub/k8s-")
    ]
    assert chart_images
    assert {image.rsplit(":", 1)[1] for image in chart_images} == {helm.Z2JH_VERSION}
    assert "set-by-chartpress" not in yaml.safe_dump_all(rendered)


def test_the_hub_gets_our_spawner_services_and_catalog(rendered):
    secret = find(rendered, "Secret", "hub")
    chart_values = yaml.safe_load(base64.b64decode(secret["data"]["values.yaml"]))
    config = chart_values["hub"]["config"]
    assert config["JupyterHub"]["spawner_class"] == "gpu"
    assert config["GPUSpawner"]["catalog_file"] == "/etc/gpuspawner/catalog.yaml"
    assert {"gpuspawner-culler", "gpuspawner-admin"} <= set(chart_values["hub"]["services"])
    # z2jh generates each service's API token into the same Secret
    assert {
        "hub.services.gpuspawner-culler.apiToken",
        "hub.services.gpuspawner-admin.apiToken",
    } <= set(secret["data"])
    hub = find(rendered, "Deployment", "hub")
    mounts = {
        m["mountPath"]
        for c in hub["spec"]["template"]["spec"]["containers"]
        for m in c.get("volumeMounts", [])
    }
    assert "/etc/gpuspawner" in mounts


def test_helm_refuses_values_the_charts_schema_does_not_allow(real_helm, chart, tmp_path):
    bad = tmp_path / "bad-values.yaml"
    bad.write_text(yaml.safe_dump({"hub": {"imagee": {"name": "x"}}}))
    with pytest.raises(helm.HelmError, match="imagee"):
        real_helm.template("jhub", chart, namespace=NAMESPACE, values_files=[VALUES, bad])


def test_the_released_chart_carries_the_json_schema_helm_reads(chart):
    source = yaml.safe_load((helm.Z2JH_CHART / "values.schema.yaml").read_text())
    assert json.loads((chart / "values.schema.json").read_text()) == source
    assert not (helm.Z2JH_CHART / "values.schema.json").exists()  # the source is untouched


def images_our_build_makes() -> set[str]:
    """What `make test` builds: the hub and the notebook images' Jupyter stage
    (tests/images/conftest.py's `built`), and z2jh's other images (chartimages), as the
    image tool names them (`gpuspawner-images facts --json`, which the sandbox asks)."""
    facts = imagefacts.image_facts(build.REPO_ROOT)
    notebooks = facts.stage_refs(facts.notebook_refs, "jupyter")
    return {facts.hub_ref, *notebooks, *(i.ref for i in facts.chart_images)}


def test_with_the_local_overrides_the_chart_runs_only_images_built_here(real_helm, chart):
    manifests = real_helm.template(
        "jhub", chart, namespace=NAMESPACE, values_files=[VALUES, LOCAL_VALUES]
    )
    rendered = containers(manifests)
    assert {c["image"] for c in rendered} == images_our_build_makes()
    # z2jh's image pullers give two containers no imagePullPolicy (singleuser.image's and
    # the pause container): Kubernetes' default for a tag, IfNotPresent, uses the node's.
    unset = {c["name"] for c in rendered if "imagePullPolicy" not in c}
    assert unset == {"image-pull-singleuser", "pause"}
    assert {c["imagePullPolicy"] for c in rendered if c["name"] not in unset} == {"Never"}
    # the chart's own commands for the images we rebuilt
    scheduler = find(manifests, "Deployment", "user-scheduler")
    (container,) = scheduler["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "/usr/local/bin/kube-scheduler"
    awaiter = find(manifests, "Job", "hook-image-awaiter")
    assert awaiter["spec"]["template"]["spec"]["containers"][0]["command"][0] == "/image-awaiter"
    proxy = find(manifests, "Deployment", "proxy")
    assert proxy["spec"]["template"]["spec"]["containers"][0]["command"][0] == (
        "configurable-http-proxy"
    )


def test_the_local_overrides_pass_helm_lint(real_helm, chart):
    out = real_helm.run(
        "lint", "--strict", str(chart), f"--values={VALUES}", f"--values={LOCAL_VALUES}"
    )
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_the_local_clusters_overrides_pass_helm_lint_and_bind_the_hub_db_to_its_pv(
    real_helm, chart
):
    files = [VALUES, LOCAL_VALUES, CLUSTER_VALUES]
    out = real_helm.run("lint", "--strict", str(chart), *(f"--values={f}" for f in files))
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    rendered = real_helm.template("jhub", chart, namespace=NAMESPACE, values_files=files)
    assert find(rendered, "Service", "proxy-public")["spec"]["type"] == "ClusterIP"
    # The hub's database claim can bind only to the static PV (no provisioner makes one).
    claim = find(rendered, "PersistentVolumeClaim", "hub-db-dir")
    (pv,) = [d for d in yaml.safe_load_all(HUB_DB_PV.read_text()) if d]
    assert claim["spec"]["storageClassName"] == pv["spec"]["storageClassName"]
    assert claim["spec"]["accessModes"] == pv["spec"]["accessModes"]
    assert claim["spec"]["resources"]["requests"]["storage"] == pv["spec"]["capacity"]["storage"]
    hub = find(rendered, "Deployment", "hub")["spec"]["template"]["spec"]
    assert hub["securityContext"]["fsGroup"] == 1000  # ignored by hostPath: the PV's comment
    assert hub["containers"][0]["securityContext"]["runAsUser"] == 1000
    # User servers get no volume claim (z2jh-values asks for dynamic ones).
    config = yaml.safe_load(
        base64.b64decode(find(rendered, "Secret", "hub")["data"]["values.yaml"])
    )
    assert config["singleuser"]["storage"]["type"] == "none"


# --- the user-scheduler's RBAC against the kube-scheduler we run ---------------------------

#: The bootstrap ClusterRoles a kube-scheduler runs with (the API server creates them).
SCHEDULER_ROLES = ("system:kube-scheduler", "system:volume-scheduler")


def role_grants(rules) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) a ClusterRole's rules grant; resourceNames are ignored
    (the chart names its own lock lease where the bootstrap role names kube-scheduler's)."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def test_user_scheduler_rbac_is_what_our_kube_scheduler_is_granted(real_helm, chart, control_plane):
    """The chart's user-scheduler role (written for v1.30) plus ours grant what the live
    control plane's bootstrap roles grant its own kube-scheduler (the same binary), no more."""
    api = control_plane.admin_api()
    needed = set()
    for name in SCHEDULER_ROLES:
        role = api.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}")
        needed |= role_grants(role["rules"])
    manifests = real_helm.template(
        "jhub", chart, namespace=NAMESPACE, values_files=[VALUES, LOCAL_VALUES]
    )
    chart_role = find(manifests, "ClusterRole", "jhub-user-scheduler")
    chart_binding = find(manifests, "ClusterRoleBinding", "jhub-user-scheduler")
    docs = {d["kind"]: d for d in yaml.safe_load_all(USER_SCHEDULER_RBAC.read_text()) if d}
    ours, binding = role_grants(docs["ClusterRole"]["rules"]), docs["ClusterRoleBinding"]
    chart_grants = role_grants(chart_role["rules"])
    missing = needed - chart_grants - ours
    assert not missing, "\n".join(map(str, sorted(missing)))
    assert ours <= needed - chart_grants, sorted(ours - (needed - chart_grants))
    assert binding["subjects"] == chart_binding["subjects"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    # the API server takes it as it is
    control_plane.apply_manifests(USER_SCHEDULER_RBAC)
    try:
        applied = api.get(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/"
            + docs["ClusterRole"]["metadata"]["name"]
        )
        assert role_grants(applied["rules"]) == ours
    finally:
        for kind, doc in (("clusterrolebindings", binding), ("clusterroles", docs["ClusterRole"])):
            api.delete(f"/apis/rbac.authorization.k8s.io/v1/{kind}/{doc['metadata']['name']}")


def test_the_dependency_is_packaged_once_and_copied_after(real_helm, chart, tmp_path, monkeypatch):
    """`make chart`, the chart's tests and the chart installs of a run share one `helm package`."""
    import json

    from gpuspawner_sandbox import suitecosts

    steps = tmp_path / "steps.jsonl"
    monkeypatch.setenv(suitecosts.ENV, str(steps))
    cache = tmp_path / "cache"
    first = helm.packaged_release(real_helm, chart, cache)
    second = helm.packaged_release(real_helm, chart, cache)
    assert first == second and first.is_file()
    packaged = [json.loads(line) for line in steps.read_text().splitlines()]
    assert [s["kind"] for s in packaged if s["kind"] == suitecosts.HELM_PACKAGE] == [
        suitecosts.HELM_PACKAGE
    ]
    # another content is another archive
    (chart / "values.yaml").write_text((chart / "values.yaml").read_text() + "\n# changed\n")
    try:
        assert helm.packaged_release(real_helm, chart, cache) != first
    finally:
        helm.release_chart(helm.Z2JH_CHART, chart)
