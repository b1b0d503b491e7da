"""The RBAC the inventory runs with: config/rbac.yaml, config/z2jh-inventory-rbac.yaml, their opt-ins.

By default the hub (and its gpuspawner service, which runs with the same
account) reads nodes cluster-wide and pods of its own namespace only: a pod
list returns every container's environment, other workloads' credentials
among them. The cluster-wide pod read is a separate, opt-in file. Here the
manifests (and z2jh 4.4.0's own hub Role, from the chart's source) are
evaluated as RBAC evaluates them, against every request the inventory's
watches make to a stand-in API server; the real API server answers the same
questions in tests/e2e/test_limits_and_rbac.py.
"""

from __future__ import annotations

import asyncio
import re
import subprocess

import pytest
import yaml

from gpuspawner.inventory.reflectors import InventoryReflector

from ..conftest import REPO
from ..kubeapi import StandInApi, core_api_for

CONFIG = REPO / "config"
MANIFEST = CONFIG / "z2jh-inventory-rbac.yaml"
OPT_IN = CONFIG / "z2jh-rbac-opt-in-all-namespaces.yaml"
RBAC = CONFIG / "rbac.yaml"
RBAC_OPT_IN = CONFIG / "rbac-opt-in-all-namespaces.yaml"
CHART = REPO.parent / "shared" / "third-party" / "zero-to-jupyterhub-k8s-4.4.0" / "jupyterhub"
NAMESPACE = "jupyterhub"
#: config/rbac.yaml's account, and the chart's hub account (hub.serviceAccount.name)
OURS = ("gpuspawner-hub", NAMESPACE)
Z2JH = ("hub", NAMESPACE)
READS = (("list", "pods"), ("watch", "pods"))
ELSEWHERE = ("default", "kube-system", None)  # None: cluster-wide


def load(*paths) -> list[dict]:
    return [d for path in paths for d in yaml.safe_load_all(path.read_text()) if d]


def documents(path):
    return {d["kind"]: d for d in load(path)}


def z2jh_hub_role() -> list[dict]:
    """The chart's hub Role and RoleBinding as a release in NAMESPACE renders them."""
    template = CHART / "templates" / "hub" / "rbac.yaml"
    if not template.is_file():
        pytest.fail(
            f"the z2jh 4.4.0 chart is expected at {CHART} (a copy of shared/ beside the clone)"
        )
    # The rules and subjects are plain YAML; only names, labels and the condition are templated.
    lines = [
        line
        for line in template.read_text().splitlines()
        if "{{-" not in line or "name:" in line or "namespace:" in line
    ]
    text = "\n".join(lines)
    text = re.sub(r'"?\{\{ include "jupyterhub\.hub\.fullname" \. \}\}"?', "hub", text)
    text = re.sub(
        r'"?\{\{ include "jupyterhub\.hub-serviceaccount\.fullname" \. \}\}"?', "hub", text
    )
    text = text.replace('"{{ .Release.Namespace }}"', NAMESPACE)
    assert "{{" not in text, text
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = NAMESPACE  # Helm installs them in the release's
    return docs


def allowed(docs, account, verb, resource, namespace):
    """Whether RBAC lets the ServiceAccount ``account`` (name, namespace) do this.

    ``namespace`` None is a cluster-wide request. A ClusterRoleBinding grants
    its role everywhere; a RoleBinding only in its own namespace.
    """
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": account[0], "namespace": account[1]}
        if not any({k: s.get(k) for k in subject} == subject for s in binding["subjects"]):
            continue
        where = binding["metadata"].get("namespace")
        if binding["kind"] == "RoleBinding" and namespace != where:
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else None, ref["name"]))
        for rule in (role or {}).get("rules", []):
            if "" in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
                return True
    return False


#: Each deployment's RBAC as shipped, and with its opt-in applied.
DEPLOYMENTS = {
    "config/rbac.yaml": (OURS, lambda: load(RBAC), lambda: load(RBAC, RBAC_OPT_IN)),
    "zero-to-jupyterhub": (
        Z2JH,
        lambda: z2jh_hub_role() + load(MANIFEST),
        lambda: z2jh_hub_role() + load(MANIFEST, OPT_IN),
    ),
}


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_by_default_the_hub_reads_pods_only_in_its_own_namespace(deployment):
    account, shipped, _ = DEPLOYMENTS[deployment]
    docs = shipped()
    for verb, resource in READS:
        assert allowed(docs, account, verb, resource, NAMESPACE), (verb, NAMESPACE)
        for namespace in ELSEWHERE:
            assert not allowed(docs, account, verb, resource, namespace), (verb, namespace)
    # nodes hold no secrets: cluster-wide, read-only
    for verb in ("list", "watch"):
        assert allowed(docs, account, verb, "nodes", None)
    assert not allowed(docs, account, "get", "nodes", None)
    assert not allowed(docs, account, "patch", "nodes", None)


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_with_the_opt_in_the_hub_reads_pods_everywhere_and_nothing_more(deployment):
    account, shipped, opted_in = DEPLOYMENTS[deployment]
    docs = opted_in()
    for verb, resource in READS:
        for namespace in (NAMESPACE, *ELSEWHERE):
            assert allowed(docs, account, verb, resource, namespace), (verb, namespace)
    # only list and watch are added: nothing else, anywhere
    for verb in ("get", "create", "delete", "patch"):
        for namespace in ELSEWHERE:
            assert allowed(docs, account, verb, "pods", namespace) == allowed(
                shipped(), account, verb, "pods", namespace
            )
    assert not allowed(docs, account, "list", "secrets", "default")


def test_the_opt_ins_hold_only_the_cluster_wide_pod_read():
    for path, account in ((RBAC_OPT_IN, OURS), (OPT_IN, Z2JH)):
        docs = documents(path)
        assert set(docs) == {"ClusterRole", "ClusterRoleBinding"}, path
        assert docs["ClusterRole"]["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
        ]
        subject = {"kind": "ServiceAccount", "name": account[0], "namespace": account[1]}
        assert docs["ClusterRoleBinding"]["subjects"] == [subject]
        assert (
            docs["ClusterRoleBinding"]["roleRef"]["name"]
            == (docs["ClusterRole"]["metadata"]["name"])
        )
    # one role, two bindings: the same grant, under one clearly named role
    assert documents(RBAC_OPT_IN)["ClusterRole"] == documents(OPT_IN)["ClusterRole"]


def test_binds_the_inventory_role_to_the_charts_hub_service_account():
    docs = documents(MANIFEST)
    assert set(docs) == {"ClusterRole", "ClusterRoleBinding"}
    role, binding = docs["ClusterRole"], docs["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    # z2jh's default hub.serviceAccount name, in the release's namespace
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hub", "namespace": "jupyterhub"}
    ]
    assert binding["metadata"]["name"].endswith("-jupyterhub")


def test_the_cluster_role_is_config_rbacs_and_reads_nodes_only():
    cluster_role = next(d for d in load(RBAC) if d["kind"] == "ClusterRole")
    role = documents(MANIFEST)["ClusterRole"]
    assert role["metadata"]["name"] == cluster_role["metadata"]["name"]
    # the same name as before, so applying the file over an older one takes the pod read away
    assert role["metadata"]["name"] == "gpuspawner-hub-inventory"
    assert (
        role["rules"]
        == cluster_role["rules"]
        == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    )


@pytest.mark.parametrize("path", [MANIFEST, OPT_IN])
def test_the_readmes_namespace_command_moves_the_binding_and_only_it(tmp_path, path):
    command = re.search(rf"sed '([^']+)' config/{path.name}", path.read_text())
    moved = subprocess.run(
        ["sed", command.group(1).replace("gpu-hub", "team-a"), str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "moved.yaml").write_text(moved)
    docs = documents(tmp_path / "moved.yaml")
    binding = docs["ClusterRoleBinding"]
    assert binding["subjects"][0]["namespace"] == "team-a"
    original = documents(path)["ClusterRoleBinding"]["metadata"]["name"]
    assert binding["metadata"]["name"] == original.removesuffix("jupyterhub") + "team-a"
    assert docs["ClusterRole"] == documents(path)["ClusterRole"]


async def requests_of_the_inventory(all_namespaces: bool) -> list[tuple[str, str, str | None]]:
    """Every request the inventory's watches make, as (verb, resource, namespace or None)."""
    server = await StandInApi().start()
    api = await core_api_for(server)
    reflector = InventoryReflector(api, namespace=NAMESPACE, all_namespaces=all_namespaces)
    try:
        reflector.start()
        assert await reflector.wait_ready(timeout=30)
        for _ in range(200):  # both watches open after their lists
            if sum(1 for _, q in server.requests if q.get("watch", "").lower() == "true") >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        await reflector.stop()
        await server.stop()
        await api.api_client.close()
    used = []
    for path, query in server.requests:
        found = re.fullmatch(r"/api/v1(?:/namespaces/([^/]+))?/(nodes|pods)", path)
        assert found, path
        verb = "watch" if query.get("watch", "").lower() == "true" else "list"
        used.append((verb, found.group(2), found.group(1)))
    return used


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
async def test_the_inventory_needs_nothing_more_than_the_default(deployment):
    """The default setting asks only for what the default RBAC grants (no warning, all figures)."""
    account, shipped, _ = DEPLOYMENTS[deployment]
    used = await requests_of_the_inventory(all_namespaces=False)
    assert set(used) == {
        ("list", "nodes", None),
        ("watch", "nodes", None),
        ("list", "pods", NAMESPACE),
        ("watch", "pods", NAMESPACE),
    }
    assert all(allowed(shipped(), account, *request) for request in used)


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
async def test_counting_every_namespace_needs_the_opt_in(deployment):
    account, shipped, opted_in = DEPLOYMENTS[deployment]
    used = await requests_of_the_inventory(all_namespaces=True)
    assert ("list", "pods", None) in used and ("watch", "pods", None) in used
    assert not all(allowed(shipped(), account, *request) for request in used)
    assert all(allowed(opted_in(), account, *request) for request in used)
