"""Kueue as the cluster's GPU queue, on real nodes, through the real hub (issue 31; docs/kueue.md).

Kueue v0.17.0 runs on the stack's nodes for this module and test_kueue_preemption.py,
deployed once for both and removed after them (conftest.SharedKueue), so the rest of
the suite runs without it. The
A100 flavor has 8 GPUs on two nodes of 4: ClusterQueue ``notebooks`` has 4 of
them, ``batch`` the other 4, one cohort. The hub puts its GPU servers in the
LocalQueue ``gpu-notebooks``; batch Jobs go to LocalQueue ``batch`` in namespace
``batch``.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest
import yaml

from gpuspawner_sandbox.demo import HUB_NAMESPACE, REPO

from .conftest import (
    E2E_CATALOG,
    NODE_IMAGE,
    ensure_user,
    hub_with,
    pod_of,
    server_state,
    stop_servers,
    wait_for,
    wait_ready,
)
from .test_culler import run_culler

A100 = {"profile": "pytorch", "gpu_type": "a100"}
A100_PRODUCT = "NVIDIA-A100-SXM4-80GB"
KUEUE_RBAC = REPO / "config" / "rbac-kueue.yaml"
ADMISSION_GATE = "kueue.x-k8s.io/admission"

KUEUE_HUB_CONFIG = """
c.GPUSpawner.kueue_queue = "gpu-notebooks"
c.GPUSpawner.gpu_queue_timeout = 900
c.KubeSpawner.start_timeout = 1200
# a request that waits is answered 202 at once (its progress is followed)
c.JupyterHub.tornado_settings.update({"slow_spawn_timeout": 1})
"""

USERS = ("quinn", "ann", "bob", "cid", "rhea", "sven", "hog")


@contextlib.contextmanager
def hub_on_kueue(stack):
    """The stack's hub restarted on Kueue with the hub's Kueue rights; both undone after."""
    stack.control_plane.apply_manifests(KUEUE_RBAC)
    try:
        with hub_with(stack, KUEUE_HUB_CONFIG) as hub:
            yield hub
    finally:
        api = stack.control_plane.admin_api()
        for doc in reversed([d for d in yaml.safe_load_all(KUEUE_RBAC.read_text()) if d]):
            plural = doc["kind"].lower() + "s"
            ns = doc["metadata"].get("namespace")
            where = f"namespaces/{ns}/" if ns else ""
            with contextlib.suppress(Exception):
                api.delete(
                    f"/apis/rbac.authorization.k8s.io/v1/{where}{plural}/{doc['metadata']['name']}"
                )


@pytest.fixture
def clean(kueue_hub, kueue):
    yield
    running = []
    for user in USERS:
        with contextlib.suppress(Exception):
            if server_state(kueue_hub, user) is not None:
                running.append((user, ""))
    stop_servers(kueue_hub, running)
    api = kueue.api
    for job in api.get(f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs")["items"]:
        with contextlib.suppress(Exception):
            api.delete(
                f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs/{job['metadata']['name']}",
                query={"propagationPolicy": "Background", "gracePeriodSeconds": "0"},
            )
    wait_for(
        lambda: not api.get(f"/api/v1/namespaces/{kueue.batch_namespace}/pods")["items"],
        120,
        what="the batch Jobs' pods to go",
    )


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def job(name: str, gpus: int, queue: str = "batch") -> dict:
    """A batch/v1 Job of one pod asking for ``gpus`` A100, submitted to Kueue (suspended)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"nvidia.com/gpu.product": A100_PRODUCT},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [
                        {
                            "name": "train",
                            "image": NODE_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                }
            },
        },
    }


def submit(kueue, name: str, gpus: int) -> str:
    path = f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs"
    kueue.api.post(path, job(name, gpus))
    return f"{path}/{name}"


def job_running(kueue, name: str) -> dict | None:
    """The Job's pod once it runs (Kueue admitted it: unsuspended, scheduled), else None."""
    pods = kueue.api.get(
        f"/api/v1/namespaces/{kueue.batch_namespace}/pods",
        query={"labelSelector": f"job-name={name}"},
    )["items"]
    for pod in pods:
        if (pod.get("status") or {}).get("phase") == "Running":
            return pod
    return None


def job_suspended(kueue, name: str) -> bool:
    found = kueue.api.get(f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs/{name}")
    return bool(found["spec"].get("suspend"))


def spawn(hub, user, gpus, server=""):
    ensure_user(hub, user)
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    return hub.api("POST", path, {**A100, "gpus": str(gpus)})


def gated(kube, user) -> dict | None:
    pod = pod_of(kube, user)
    if pod is None:
        return None
    gates = [g.get("name") for g in pod["spec"].get("schedulingGates") or []]
    return pod if ADMISSION_GATE in gates else None


def queued(hub, kube, user, gpus) -> dict:
    """Ask for ``gpus`` A100 and wait until the pod waits, gated, in Kueue."""
    r = spawn(hub, user, gpus)
    assert r.status in (201, 202), r.body
    return wait_for(lambda: gated(kube, user), 60, what=f"{user}'s pod to wait in Kueue")


def progress_line(hub, user, want=lambda m: True, seconds=20.0) -> str:
    """The latest Kueue line of the user's progress stream that ``want`` accepts."""
    import urllib.request

    deadline = time.monotonic() + seconds
    last = ""
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"{hub.public_url}/hub/api/users/{user}/server/progress",
            headers={"Authorization": f"token {hub.token}", "Accept": "text/event-stream"},
        )
        with contextlib.suppress(TimeoutError, OSError):
            with urllib.request.urlopen(request, timeout=6) as stream:
                started = time.monotonic()
                for raw in stream:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        message = json.loads(line[5:]).get("message", "")
                        if "cluster's GPU queue" in message:
                            last = message
                            if want(message):
                                return message
                    if time.monotonic() - started > 5:
                        break
    raise AssertionError(f"no progress line of {user} as wanted; last: {last!r}")


def place(hub, user, expected: str) -> str:
    return progress_line(hub, user, lambda m: expected in m)


def workloads_of(kueue, pod_uid: str) -> list[dict]:
    items = kueue.api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{HUB_NAMESPACE}/workloads")[
        "items"
    ]
    return [
        w
        for w in items
        if any(o.get("uid") == pod_uid for o in w["metadata"].get("ownerReferences") or [])
    ]


# ---------------------------------------------------------------------------
# the tests (in this order: the first reads the quotas before anything is cached)
# ---------------------------------------------------------------------------


def test_a_request_no_quota_can_ever_admit_is_refused_at_once(stack, kueue_hub, kueue, clean):
    # notebooks may never borrow H100s: its quota is 4 of the 8, so 8 can never be admitted
    api = kueue.api
    path = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/notebooks"
    before = api.get(path)
    patched = json.loads(json.dumps(before))
    for group in patched["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            if "h100" in flavor["name"]:
                for resource in flavor["resources"]:
                    resource["borrowingLimit"] = 0
    api.request("PUT", path, patched)
    try:
        ensure_user(kueue_hub, "hog")
        r = kueue_hub.api(
            "POST", "/users/hog/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "8"}
        )
        assert r.status == 400, r.body
        assert r.json()["message"] == (
            "The cluster's GPU queue 'gpu-notebooks' can never admit 8 NVIDIA H100 GPUs: "
            "its quota, with what it may borrow, is 4 at most. Ask for 4 or fewer."
        )
        assert pod_of(kueue.api, "hog") is None  # refused before any pod
    finally:
        current = api.get(path)
        current["spec"] = before["spec"]
        api.request("PUT", path, current)


def test_a_job_and_three_notebooks_compete_and_places_move_as_work_ends(
    stack, kueue_hub, kueue, clean
):
    hub, kube = kueue_hub, kueue.api
    submit(kueue, "hold", 4)  # batch's own 4 A100
    wait_for(lambda: job_running(kueue, "hold"), 120, what="the first Job to run")
    r = spawn(hub, "quinn", 4)  # notebooks' own 4 A100
    assert r.status in (201, 202), r.body
    wait_ready(hub, "quinn", timeout=240)
    # every A100 is held: the next Job and three notebooks wait, each in its ClusterQueue
    submit(kueue, "train", 4)
    for user in ("ann", "bob", "cid"):
        queued(hub, kube, user, 2)
    assert job_suspended(kueue, "train")

    assert "1 of 3 in this hub's queue, 1 in the notebooks queue (nothing ahead of it)" in place(
        hub, "ann", "1 of 3"
    )
    line = place(hub, "bob", "2 of 3")
    assert "2 in the notebooks queue (ahead of it: 1 notebook and 0 jobs)" in line
    assert "insufficient unused quota" in line  # Kueue's own reason, as it gives it
    assert "3 of 3 in this hub's queue" in place(hub, "cid", "3 of 3")

    # quinn's 4 A100 go back to notebooks: ann and bob fit its quota and start;
    # cid now heads the hub's queue. The Job would have to borrow: it still waits.
    stop_servers(hub, [("quinn", "")])
    wait_ready(hub, "ann", timeout=240)
    wait_ready(hub, "bob", timeout=240)
    assert "1 of 1 in this hub's queue" in place(hub, "cid", "1 of 1")
    assert job_suspended(kueue, "train")

    # the first Job ends: batch's quota takes its own Job first (no borrowing needed)
    kube.delete(
        f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs/hold",
        query={"propagationPolicy": "Background", "gracePeriodSeconds": "0"},
    )
    wait_for(lambda: job_running(kueue, "train"), 180, what="the queued Job to run")
    assert gated(kube, "cid") is not None

    # and when ann stops, cid starts on her GPUs
    stop_servers(hub, [("ann", "")])
    wait_ready(hub, "cid", timeout=240)
    assert {pod_of(kube, u)["spec"]["nodeName"] for u in ("bob", "cid")} == {
        pod_of(kube, "bob")["spec"]["nodeName"]
    }


def test_a_cancelled_request_leaves_no_pod_and_no_workload(stack, kueue_hub, kueue, clean):
    hub, kube = kueue_hub, kueue.api
    submit(kueue, "hold-a", 4)
    submit(kueue, "hold-b", 4)
    wait_for(lambda: job_running(kueue, "hold-a") and job_running(kueue, "hold-b"), 180)
    pod = queued(hub, kube, "ann", 2)
    uid = pod["metadata"]["uid"]
    wait_for(lambda: workloads_of(kueue, uid), 30, what="Kueue's Workload of the pod")
    stop_servers(hub, [("ann", "")])
    wait_for(lambda: pod_of(kube, "ann") is None, 60, what="the pod to go")
    wait_for(lambda: not workloads_of(kueue, uid), 60, what="its Workload to go")
    assert server_state(hub, "ann") is None


def test_a_hub_restart_keeps_both_places_and_both_start(stack, kueue_hub, kueue, clean):
    hub, kube = kueue_hub, kueue.api
    submit(kueue, "hold-a", 4)
    submit(kueue, "hold-b", 4)
    wait_for(lambda: job_running(kueue, "hold-a") and job_running(kueue, "hold-b"), 180)
    before = {user: queued(hub, kube, user, 2)["metadata"]["uid"] for user in ("ann", "bob")}
    assert "1 of 2 in this hub's queue" in place(hub, "ann", "1 of 2")

    stack.stop_hub()
    stack.start_hub()
    hub = stack.hub
    # the same pods (so the same Workloads and places) still wait
    assert {u: gated(kube, u)["metadata"]["uid"] for u in ("ann", "bob")} == before
    for job_name in ("hold-a", "hold-b"):
        kube.delete(
            f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs/{job_name}",
            query={"propagationPolicy": "Background", "gracePeriodSeconds": "0"},
        )
    for user in ("ann", "bob"):
        wait_ready(hub, user, timeout=300)
        assert pod_of(kube, user)["metadata"]["uid"] == before[user]


def test_the_culler_frees_one_idle_notebook_so_a_queued_job_starts(
    stack, kueue_hub, kueue, clean, tmp_path
):
    hub = kueue_hub
    submit(kueue, "hold", 4)
    wait_for(lambda: job_running(kueue, "hold"), 120, what="the first Job to run")
    for user in ("rhea", "sven"):  # two idle 2 x A100 notebooks: the other node full
        assert spawn(hub, user, 2).status in (201, 202)
    for user in ("rhea", "sven"):
        wait_ready(hub, user, timeout=240)
    submit(kueue, "train", 2)
    wait_for(
        lambda: any(
            e["metadata"]["name"].startswith("job-train")
            for e in kueue.pending("batch").get("items") or []
        ),
        60,
        what="the Job to wait in Kueue",
    )

    run = run_culler(
        stack,
        hub,
        tmp_path,
        "--GPUCuller.kueue_cluster_queues=batch",
        # Kueue's flavors are named by node labels: the catalog says which GPU type each is
        f"--GPUCuller.catalog_file={E2E_CATALOG}",
    )
    print(run.stdout, run.stderr)  # shown when the test fails
    assert run.returncode == 0, run.stderr
    assert "(kueue)" in run.stdout + run.stderr
    # one notebook's 2 GPUs make the Job fit: exactly one is stopped
    wait_for(
        lambda: sum(server_state(hub, u) is None for u in ("rhea", "sven")) == 1,
        90,
        what="one notebook to be culled",
    )
    wait_for(lambda: job_running(kueue, "train"), 180, what="the queued Job to run")
    kept = [u for u in ("rhea", "sven") if server_state(hub, u) is not None]
    assert len(kept) == 1 and server_state(hub, kept[0])["ready"]
