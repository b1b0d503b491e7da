"""Per-user limits through the real hub (concurrency, hub restart) and the hub's exact RBAC."""

import asyncio
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuspawner.compat import SpawnException
from gpuspawner_sandbox.demo import HUB_NAMESPACE

from .conftest import ensure_user, stop_server, stop_servers, user_pods, wait_for, wait_ready


def test_ten_concurrent_requests_start_exactly_two_and_a_restart_changes_nothing(stack, hub, kube):
    ensure_user(hub, "lena")  # default limit: 2 GPUs
    names = [f"s{i}" for i in range(10)]
    with ThreadPoolExecutor(len(names)) as pool:
        answers = list(
            pool.map(
                lambda n: hub.api(
                    "POST",
                    f"/users/lena/servers/{n}",
                    {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"},
                ),
                names,
            )
        )
    started = [n for n, r in zip(names, answers, strict=True) if r.status in (201, 202)]
    refused = [r for r in answers if r.status == 403]
    assert len(started) == 2, [(r.status, r.body) for r in answers]
    assert len(refused) == 8
    assert all("of your 2 GPUs" in r.json()["message"] for r in refused)
    for name in started:
        wait_ready(hub, "lena", name)
    assert len(user_pods(kube, "lena")) == 2

    # a hub restart forgets nothing: usage comes from the cluster's pods
    stack.stop_hub()
    assert len(user_pods(kube, "lena")) == 2  # the servers outlive the hub
    hub = stack.start_hub()
    r = hub.api(
        "POST", "/users/lena/servers/after", {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
    )
    assert r.status == 403, r.body
    assert r.json()["message"] == (
        f"You are using 2 of your 2 GPUs (servers: {', '.join(sorted(started))}). "
        "Stop one of them or ask for fewer GPUs."
    )
    # The servers started before the restart still reach the hub's API: each checks
    # a token made after the restart with the hub, at the address it was given.
    r = hub.api("POST", "/users/lena/tokens", {"note": "after the restart"})
    assert r.status in (200, 201), r.body
    token = r.json()["token"]
    for name in started:
        request = urllib.request.Request(
            f"{hub.public_url}/user/lena/{name}/api/status",
            headers={"Authorization": f"token {token}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
            assert "started" in json.loads(response.read())
    stop_servers(hub, [("lena", name) for name in started])
    wait_for(lambda: not user_pods(kube, "lena"), 60, what="lena's pods to go")
    r = hub.api(
        "POST", "/users/lena/servers/after", {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    )
    assert r.status in (201, 202), r.body
    wait_ready(hub, "lena", "after")
    stop_server(hub, "lena", "after")


def access_allowed(stack, kubeconfig, verb, resource, namespace=None, group=""):
    """Ask the API server whether the kubeconfig's identity may do this (SelfSubjectAccessReview)."""
    from gpuspawner_sandbox.kubeapi import KubeApi

    api = KubeApi.from_kubeconfig(kubeconfig)
    attributes = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attributes["namespace"] = namespace
    review = api.post(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        },
    )
    return review["status"]["allowed"]


NEEDED = [
    ("create", "pods"),
    ("get", "pods"),
    ("list", "pods"),
    ("watch", "pods"),
    ("delete", "pods"),
    ("patch", "pods"),  # why a server stopped (gpuspawner.io/stop-reason)
    ("list", "events"),
    ("watch", "events"),
]
NOT_GRANTED = [
    ("list", "secrets", HUB_NAMESPACE),
    ("create", "services", HUB_NAMESPACE),
    ("create", "pods", "kube-system"),
    ("delete", "pods", "kube-system"),
    ("patch", "pods", "kube-system"),
    ("patch", "nodes", None),
    ("create", "roles", HUB_NAMESPACE),
]


def test_hub_service_account_has_the_permissions_it_needs_and_no_more(stack):
    kubeconfig = stack.hub_kubeconfig
    for verb, resource in NEEDED:
        assert access_allowed(stack, kubeconfig, verb, resource, HUB_NAMESPACE), (verb, resource)
    for verb, resource, namespace in NOT_GRANTED:
        group = "rbac.authorization.k8s.io" if resource == "roles" else ""
        assert not access_allowed(stack, kubeconfig, verb, resource, namespace, group), (
            verb,
            resource,
        )


REDUCED_RBAC = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: hub-without-list, namespace: jupyterhub}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: hub-without-list, namespace: jupyterhub}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "watch", "create", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: hub-without-list, namespace: jupyterhub}
subjects: [{kind: ServiceAccount, name: hub-without-list, namespace: jupyterhub}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: hub-without-list}
"""


def test_a_missing_permission_shows_up_as_a_clear_refusal(stack, tmp_path, monkeypatch):
    manifest = tmp_path / "reduced.yaml"
    manifest.write_text(REDUCED_RBAC)
    cp = stack.control_plane
    cp.apply_manifests(manifest)
    cp.wait_for_service_account(HUB_NAMESPACE, "hub-without-list")
    kubeconfig = cp.service_account_kubeconfig(HUB_NAMESPACE, "hub-without-list")
    assert access_allowed(stack, stack.hub_kubeconfig, "list", "pods", HUB_NAMESPACE)
    assert not access_allowed(stack, kubeconfig, "list", "pods", HUB_NAMESPACE)

    # GPUSpawner with that account, against the real API server: the GPU request is
    # refused with a sentence, not a traceback, because usage cannot be counted
    from kubernetes_asyncio.config import kube_config
    from traitlets.config import Config

    from gpuspawner.spawner import GPUSpawner

    from ..conftest import FIXTURES
    from ..test_spawner import OrmSpawner, User

    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    c = Config()
    c.GPUSpawner.catalog_file = str(FIXTURES / "catalogs" / "e2e.yaml")
    c.KubeSpawner.namespace = HUB_NAMESPACE

    async def attempt():
        spawner = GPUSpawner(
            _mock=True, config=c, user=User("rbac-probe"), orm_spawner=OrmSpawner("")
        )
        spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        await spawner.load_user_options()

    with pytest.raises(SpawnException) as info:
        asyncio.run(attempt())
    assert info.value.status_code == 503
    assert "could not be checked" in info.value.jupyterhub_message
    assert json.dumps(info.value.jupyterhub_message).count("\\n") == 0
