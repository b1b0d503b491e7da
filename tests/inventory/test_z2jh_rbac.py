"""config/z2jh-inventory-rbac.yaml: the inventory's ClusterRole bound to zero-to-jupyterhub's hub.

Its rules must be config/rbac.yaml's (the local cluster's tests prove those
suffice) and cover every request the inventory's watches make, observed
against a stand-in API server.
"""

from __future__ import annotations

import asyncio
import re
import subprocess

import yaml

from gpuspawner.inventory.reflectors import InventoryReflector

from ..conftest import REPO
from ..kubeapi import StandInApi, core_api_for

MANIFEST = REPO / "config" / "z2jh-inventory-rbac.yaml"


def documents(path):
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def grants(role):
    return {
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if rule["apiGroups"] == [""]
    }


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


def test_rules_are_those_of_config_rbac():
    ours = [d for d in yaml.safe_load_all((REPO / "config" / "rbac.yaml").read_text()) if d]
    cluster_role = next(d for d in ours if d["kind"] == "ClusterRole")
    role = documents(MANIFEST)["ClusterRole"]
    assert role["metadata"]["name"] == cluster_role["metadata"]["name"]
    assert (
        grants(role)
        == grants(cluster_role)
        == {
            ("nodes", "list"),
            ("nodes", "watch"),
            ("pods", "list"),
            ("pods", "watch"),
        }
    )


def test_the_readmes_namespace_command_moves_the_binding_and_only_it(tmp_path):
    command = re.search(r"sed '([^']+)' config/z2jh-inventory-rbac.yaml", MANIFEST.read_text())
    moved = subprocess.run(
        ["sed", command.group(1).replace("gpu-hub", "team-a"), str(MANIFEST)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "moved.yaml").write_text(moved)
    docs = documents(tmp_path / "moved.yaml")
    assert docs["ClusterRoleBinding"]["subjects"][0]["namespace"] == "team-a"
    assert docs["ClusterRoleBinding"]["metadata"]["name"] == "gpuspawner-hub-inventory-team-a"
    assert docs["ClusterRole"] == documents(MANIFEST)["ClusterRole"]


async def test_the_inventory_needs_nothing_more():
    """Every request of the inventory's watches, as (resource, verb), is granted."""
    server = await StandInApi().start()
    api = await core_api_for(server)
    reflector = InventoryReflector(api, namespace="jupyterhub", all_namespaces=True)
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
    used = set()
    for path, query in server.requests:
        assert path in ("/api/v1/nodes", "/api/v1/pods"), path  # cluster-wide only
        used.add(
            (
                path.rsplit("/", 1)[1],
                "watch" if query.get("watch", "").lower() == "true" else "list",
            )
        )
    assert used == {("nodes", "list"), ("nodes", "watch"), ("pods", "list"), ("pods", "watch")}
    assert used <= grants(documents(MANIFEST)["ClusterRole"])
