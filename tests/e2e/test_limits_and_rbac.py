"""Per-user limits through the real hub (concurrency, hub restart) and the hub's exact RBAC."""

import asyncio
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuspawner.hub.compat import SpawnException
from gpuspawner_sandbox.demo import HUB_NAMESPACE

from .conftest import ensure_user, stop_server, stop_servers, user_pods, wait_for, wait_ready

#: Where pods of other workloads live (None: the cluster-wide list), whose environment
#: the hub must not read unless the admin opts in.
OTHER_NAMESPACES = ("default", "kube-system", None)


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


def pod_reads(stack, namespace):
    """Whether the hub's account may list and may watch pods there (None: cluster-wide)."""
    kubeconfig = stack.hub_kubeconfig
    return [
        access_allowed(stack, kubeconfig, verb, "pods", namespace) for verb in ("list", "watch")
    ]


def figures_for_a_user(hub):
    """What the gpuspawner service (the hub's account too) answers a user's form."""
    ensure_user(hub, "rbac-reader")
    r = hub.api("POST", "/users/rbac-reader/tokens", {"note": "rbac test"})
    assert r.status in (200, 201), r.body
    request = urllib.request.Request(
        f"{hub.public_url}/services/gpuspawner/availability",
        headers={"Authorization": f"token {r.json()['token']}"},
    )

    def answered():
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as e:  # the service still starting
            assert e.code in (502, 503), e.read()
            return None
        return payload if payload["available"] else None

    return wait_for(answered, 60, what="the gpuspawner service's figures")


def test_the_hub_reads_pods_only_in_its_namespace_unless_the_admin_opts_in(stack, hub):
    """A pod list carries every container's environment (other workloads' credentials):
    with config/rbac.yaml the hub, and the gpuspawner service running with its account,
    may read pods of its own namespace only; config/rbac-opt-in-all-namespaces.yaml
    adds the cluster-wide read. The real API server answers (SelfSubjectAccessReview)."""
    assert pod_reads(stack, HUB_NAMESPACE) == [True, True]
    for namespace in OTHER_NAMESPACES:
        assert pod_reads(stack, namespace) == [False, False], namespace
    # nodes hold no secrets: read cluster-wide, for the figures
    assert access_allowed(stack, stack.hub_kubeconfig, "list", "nodes")
    assert access_allowed(stack, stack.hub_kubeconfig, "watch", "nodes")

    # The default settings ask for no more than that: the figures come, counted in the
    # hub's namespace (and say so), and nothing was refused on the way.
    assert figures_for_a_user(hub)["pods_namespace"] == HUB_NAMESPACE
    log = hub.log()
    assert "may not list" not in log, log[-3000:]

    stack.opt_in_all_namespaces()
    try:
        for namespace in OTHER_NAMESPACES:
            wait_for(
                lambda n=namespace: pod_reads(stack, n) == [True, True],
                30,
                what=f"the opt-in to let the hub read pods in {namespace or 'every namespace'}",
            )
        # With the setting too (from the hub's next start), the hub and the service count
        # every namespace's pods, and are refused nothing.
        stack.stop_hub()
        opted = stack.start_hub()
        assert figures_for_a_user(opted)["pods_namespace"] == ""
        log = opted.log()
        assert "may not list" not in log, log[-3000:]
    finally:
        stack.opt_in_all_namespaces(on=False)
        stack.stop_hub()
        stack.start_hub()
    for namespace in OTHER_NAMESPACES:
        wait_for(
            lambda n=namespace: pod_reads(stack, n) == [False, False],
            30,
            what=f"the opt-in's read in {namespace or 'every namespace'} to be taken back",
        )
    assert pod_reads(stack, HUB_NAMESPACE) == [True, True]


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

    from gpuspawner.hub.spawner import GPUSpawner

    from ..conftest import FIXTURES
    from ..hub.test_spawner import OrmSpawner, User

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
