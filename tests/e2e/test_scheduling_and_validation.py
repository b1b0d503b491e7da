"""The real scheduler's view of GPUs: placement, validation, and what a user waits for (GPU faults: test_real_nodes.py)."""

import time

import pytest

from gpuspawner_sandbox import gpudriver

from .conftest import (
    ensure_user,
    pod_of,
    server_state,
    stop_server,
    stop_servers,
    wait_for,
    wait_ready,
)


def progress_messages(hub, user, seconds=8.0, until=None):
    """Messages of the hub's spawn-progress event stream, read for a few seconds.

    With ``until`` (a test of one message), reading stops at the first message it accepts.
    """
    import urllib.request

    request = urllib.request.Request(
        f"{hub.public_url}/hub/api/users/{user}/server/progress",
        headers={"Authorization": f"token {hub.token}", "Accept": "text/event-stream"},
    )
    messages = []
    deadline = time.monotonic() + seconds
    try:
        with urllib.request.urlopen(request, timeout=seconds) as stream:
            for raw in stream:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    messages.append(line[5:].strip())
                    if until is not None and until(messages[-1]):
                        break
                if time.monotonic() > deadline:
                    break
    except TimeoutError:
        pass
    return messages


@pytest.fixture
def hub_without_inventory(stack):
    """A second hub on the same cluster that leaves scheduling to the scheduler alone."""
    hub = stack.start_second_hub(
        "hub-no-inventory",
        # a request the scheduler keeps Pending is answered 202 after 1 s, not 10
        'c.GPUSpawner.gpu_inventory_enabled = False\nc.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}',
    )
    yield hub
    hub.stop()


def test_exhausted_type_is_refused_at_once_with_the_figures(hub, kube):
    ensure_user(hub, "hog")  # unlimited in the e2e catalog
    ensure_user(hub, "wally")
    r = hub.api(
        "POST", "/users/hog/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "8"}
    )
    assert r.status in (201, 202), r.body
    wait_ready(hub, "hog")
    try:
        r = hub.api(
            "POST", "/users/wally/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
        )
        assert r.status == 503, r.body
        assert r.json()["message"].startswith(
            "No node has 1 NVIDIA H100 GPU free right now: all 8 are in use."
        )
        assert (
            pod_of(kube, "wally") is None
        )  # refused before any pod: nothing waits in the scheduler
    finally:
        stop_server(hub, "hog")


def test_without_the_inventory_the_scheduler_keeps_it_pending_with_the_reason_until_gpus_return(
    hub_without_inventory, kube
):
    hub = hub_without_inventory
    hogs = [
        "sched-hog1",
        "sched-hog2",
        "sched-hog3",
        "sched-hog4",
    ]  # 4 users x 2 (their limit) = all 8 H100
    ensure_user(hub, "wanda")
    for user in hogs:
        ensure_user(hub, user)
        r = hub.api(
            "POST", f"/users/{user}/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "2"}
        )
        assert r.status in (201, 202), r.body
    for user in hogs:
        wait_ready(hub, user)
    try:
        r = hub.api(
            "POST", "/users/wanda/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
        )
        assert r.status == 202, r.body  # still starting after the hub's slow-spawn wait

        def unschedulable():
            pod = pod_of(kube, "wanda")
            if not pod:
                return None
            for condition in pod["status"].get("conditions") or []:
                if (
                    condition["type"] == "PodScheduled"
                    and condition.get("reason") == "Unschedulable"
                ):
                    return condition["message"]
            return None

        message = wait_for(unschedulable, 30, what="the scheduler to report the pod unschedulable")
        assert "Insufficient nvidia.com/gpu" in message
        assert server_state(hub, "wanda")["pending"] == "spawn"
        shown = progress_messages(
            hub, "wanda", until=lambda m: "H100" in m or "nvidia.com/gpu" in m
        )
        assert any("H100" in m or "nvidia.com/gpu" in m for m in shown), shown
    finally:
        stop_server(hub, hogs[0])
    # 2 H100 are back: the waiting server is scheduled and starts
    wait_ready(hub, "wanda", timeout=120)
    assert pod_of(kube, "wanda")["spec"]["nodeName"] == "gpu-h100-0"
    stop_servers(hub, [(user, "") for user in [*hogs[1:], "wanda"]])


def test_a_hung_gpu_fails_the_spawn_with_the_checks_deadline_and_the_pod_is_deleted(
    stack, hub, kube, report
):
    # Every GPU of the node hangs in the driver: the emulated nvidia-smi in the check's
    # container never answers, and the device plugin does not notice (GPUs stay allocatable).
    user = "hedy"
    state = stack.nodes.paths("gpu-h100-0").driver_state
    ensure_user(hub, user)
    gpudriver.inject_fault(state, "hung")
    try:
        asked = time.monotonic()
        r = hub.api(
            "POST", f"/users/{user}/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
        )
        assert r.status in (202, 503), r.body
        wait_for(
            lambda: hub.api("GET", f"/users/{user}").json()["servers"].get("") is None,
            180,
            1,
            what=f"{user}'s spawn on a hung GPU to end",
        )
        (line,) = [ln for ln in hub.log().splitlines() if f"Not starting {user}'s server" in ln]
        assert "reason=gpu-check" in line, line
        # The check's own reason, through the termination message: the default deadline
        # (GPUSpawner.validation_timeout) passed with nvidia-smi -L silent.
        assert (
            "The GPUs given to this server failed their check, so it was not started: "
            "nvidia-smi did not finish within the GPU check's 30-second limit (nvidia-smi -L "
            "printed nothing), so the GPU or its driver is hung; ask an admin to check the node."
        ) in line, line
        # it ended on the check's deadline, not on the hub's start timeout
        assert f"{user}'s server failed to start" not in hub.log()
        # Measured, not asserted (docs/benchmarks.md): request -> the user's error.
        report(f"hung GPU: the spawn failed {time.monotonic() - asked:.1f} s after the request")
        wait_for(lambda: pod_of(kube, user) is None, 60, what=f"{user}'s pod to be deleted")
    finally:
        gpudriver.clear_faults(state)
