"""gpuspawner-culler against the local cluster: real hub, real pods, the real scheduler's Pending pods."""

import os
import subprocess
import sys

from .conftest import NODE_IMAGE, ensure_user, server_state, stop_server, wait_for, wait_ready

CULLER_CONFIG = """
c = get_config()  # noqa
c.GPUCuller.timeouts = [{"min_gpus": 1, "timeout": 3600}, {"gpu_type": "none", "timeout": 3600}]
c.GPUCuller.timeout = 3600
c.GPUCuller.min_running = 0
c.GPUCuller.pressure_timeout = 1
c.GPUCuller.kubernetes = "on"
c.Application.log_level = "INFO"
"""

# A GPU pod the scheduler cannot place for lack of H100s. The hub refuses (or
# queues) such requests before a pod exists, so this one arrives the way
# competing GPU pods do: straight at the API server (another hub replica, a
# request that raced the hub's inventory).
WAITING_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "waiting-h100",
        "labels": {
            "gpuspawner.io/managed": "true",
            "gpuspawner.io/profile": "pytorch",
            "gpuspawner.io/gpu-type": "h100",
            "gpuspawner.io/gpus": "1",
        },
        "annotations": {"hub.jupyter.org/username": "wendy"},
    },
    "spec": {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "job",
                "image": NODE_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "600"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }
        ],
        "terminationGracePeriodSeconds": 1,
    },
}
WAITING = "/api/v1/namespaces/jupyterhub/pods/waiting-h100"


def run_culler(stack, hub, tmp_path, *extra):
    config = tmp_path / "culler_config.py"
    config.write_text(CULLER_CONFIG)
    env = {
        **os.environ,
        "JUPYTERHUB_API_URL": f"{hub.public_url}/hub/api",
        "JUPYTERHUB_API_TOKEN": hub.token,
        "KUBECONFIG": str(
            stack.hub_kubeconfig
        ),  # the hub's service account, as when the hub starts it
    }
    return subprocess.run(
        [sys.executable, "-m", "gpuspawner.culler", f"--config={config}", "--once", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_pressure_mode_frees_the_idle_gpus_a_waiting_pod_needs(stack, hub, kube, tmp_path):
    ensure_user(hub, "hog")  # unlimited: takes all 8 H100
    ensure_user(hub, "cora")  # a CPU-only server, idle as long: not touched by H100 pressure
    for user, body in [("hog", {"gpu_type": "h100", "gpus": "8"}), ("cora", {"gpus": "0"})]:
        r = hub.api("POST", f"/users/{user}/server", {"profile": "pytorch", **body})
        assert r.status in (201, 202), r.body
    wait_ready(hub, "hog")
    wait_ready(hub, "cora")
    try:
        # with nobody waiting, nothing is idle long enough (timeouts are 1 h)
        quiet = run_culler(stack, hub, tmp_path)
        assert quiet.returncode == 0, quiet.stderr
        assert server_state(hub, "hog") is not None

        kube.post("/api/v1/namespaces/jupyterhub/pods", WAITING_POD)
        wait_for(
            lambda: any(
                c.get("reason") == "Unschedulable"
                for c in kube.get(WAITING)["status"].get("conditions") or []
            ),
            30,
            what="the waiting pod to be unschedulable",
        )

        dry = run_culler(stack, hub, tmp_path, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "hog" in dry.stdout + dry.stderr
        assert server_state(hub, "hog") is not None  # a dry run stops nothing

        real = run_culler(stack, hub, tmp_path)
        assert real.returncode == 0, real.stderr
        wait_for(
            lambda: server_state(hub, "hog") is None,
            60,
            what="the idle 8 x H100 server to be culled",
        )
        assert server_state(hub, "cora") is not None  # pressure on H100 leaves CPU servers alone
        # the freed GPUs go to the waiting pod, through the real scheduler
        wait_for(
            lambda: kube.get(WAITING)["spec"].get("nodeName"),
            60,
            what="the waiting pod to be scheduled",
        )
    finally:
        kube.delete(WAITING, query={"gracePeriodSeconds": "0"})
        for user in ("hog", "cora"):
            if server_state(hub, user) is not None:
                stop_server(hub, user)
