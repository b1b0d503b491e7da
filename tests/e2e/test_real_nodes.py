"""What real nodes show, through the real hub and proxy (the package's stack, tests/e2e/conftest.py).

Covered: a CPU-only server as a real
container, a whole-GPU and a MIG server with their GPU checks, every emulated
GPU fault failing the spawn with the check's sentence, GPU-aware culling and
the admin page's utilisation. The last test of the package stops the stack and
checks the host is as before.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from gpuspawner.core import labels
from gpuspawner_sandbox import gpudriver, hoststate, nodeconfig, testing
from gpuspawner_sandbox.demo import DEMO_PASSWORD

from .conftest import (
    browser_log_in,
    ensure_user,
    pod_of,
    stop_server,
    stop_servers,
    user_pods,
    wait_for,
)

ADMIN_PAGE = "/services/gpuspawner-admin/"
MEMORY_LIMIT = 768 * 1024 * 1024  # the catalog's 768Mi
USER = "rina"
# Run with the host's Python inside a pod's network namespace: the HTTP status
# of a GET with a hub token, as the notebook's JupyterLab extension asks.
ASK = """
import sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "token " + sys.argv[2]})
try:
    print(opener.open(request, timeout=20).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def _logged_in(hub, name: str) -> requests.Session:
    """A browser-like session logged into the hub through the proxy (the login form, with its xsrf)."""
    session = requests.Session()
    session.trust_env = False  # loopback only; no proxies
    r = session.get(f"{hub.public_url}/hub/login")
    assert r.status_code == 200, r.text[:300]
    r = session.post(
        f"{hub.public_url}/hub/login",
        data={"username": name, "password": DEMO_PASSWORD, "_xsrf": session.cookies["_xsrf"]},
    )
    assert r.status_code == 200 and "/hub/login" not in r.url, (r.status_code, r.url)
    return session


def _ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def _ns_pid(pid: int) -> int:
    """The pid a host process has in its innermost pid namespace (NSpid's last field)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid for {pid}")


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def test_the_hub_listens_on_loopback_and_its_pod_range_address_only(real):
    stack = real.stack
    hub = stack.hub
    allowed = ipaddress.ip_address(nodeconfig.HUB_ADDRESS)
    listening = testing.listening_addresses(hub.process.pid)
    assert nodeconfig.HUB_ADDRESS in {address for address, _ in listening}, listening
    for address, _ in listening:
        ip = ipaddress.ip_address(address)
        assert ip.is_loopback or ip == allowed, address


def test_a_cpu_server_runs_as_a_real_container_and_serves_jupyterlab(real):
    stack = real.stack
    hub, kube = stack.hub, stack.control_plane.admin_api()
    ensure_user(hub, USER)
    session = _logged_in(hub, USER)
    # As the logged-in user (cookie and xsrf, as JupyterLab's hub extension asks): the image, no GPUs.
    r = session.post(
        f"{hub.public_url}/hub/api/users/{USER}/server",
        json={"profile": "pytorch", "gpus": "0"},
        headers={"X-XSRFToken": session.cookies["_xsrf"]},
    )
    assert r.status_code in (201, 202), r.text[:500]

    _wait_ready(hub, USER)

    # JupyterLab and the server's API through the proxy, after the OAuth round
    # trip in which the notebook asked the hub's API (on HUB_ADDRESS) itself.
    lab = session.get(f"{hub.public_url}/user/{USER}/lab")
    assert lab.status_code == 200, lab.text[:500]
    assert "jupyter-config-data" in lab.text
    status = session.get(f"{hub.public_url}/user/{USER}/api/status")
    assert status.status_code == 200 and "started" in status.json()
    contents = session.get(f"{hub.public_url}/user/{USER}/api/contents")
    assert contents.status_code == 200 and contents.json()["type"] == "directory"

    pod = pod_of(kube, USER)
    node = pod["spec"]["nodeName"]
    assert node == "cpu-0"  # GPU nodes are tainted; a CPU-only server lands here
    index = stack.nodes.names.index(node)
    assert ipaddress.ip_address(pod["status"]["podIP"]) in nodeconfig.NodeNetwork(index).subnet
    (container,) = pod["status"]["containerStatuses"]
    assert container["image"].endswith("cuda-pytorch:2.15.0-cuda13.2-py3.13-jupyter"), container[
        "image"
    ]
    container_id = container["containerID"].split("://", 1)[1]

    # The container's processes, from its cgroup under the node's cgroup root.
    pids = testing.container_pids(node, container_id)
    assert pids
    (init,) = [p for p in pids if _ns_pid(p) == 1]
    assert Path(_cmdline(init)[0]).name == "tini", _cmdline(init)  # the image's ENTRYPOINT
    notebook = [p for p in pids if any("jupyterhub-singleuser" in a for a in _cmdline(p))]
    assert notebook, [_cmdline(p) for p in pids]
    for kind in ("pid", "mnt", "net", "uts"):
        assert _ns(notebook[0], kind) == _ns(init, kind), kind
        assert _ns(notebook[0], kind) != _ns(os.getpid(), kind), kind
    hostname = subprocess.run(
        ["nsenter", f"--target={init}", "--uts", "hostname"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert hostname == pod["metadata"]["name"]
    # It runs as the image's user, not root.
    uid = next(
        line.split()[1]
        for line in Path(f"/proc/{notebook[0]}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    assert uid == "1000"

    # JupyterLab's cull warning: the notebook asks the culler itself, from its own network.
    env = testing.process_environment(notebook[0])
    culler = env["GPUSPAWNER_CULLER_URL"]
    assert culler.startswith(f"http://{nodeconfig.HUB_ADDRESS}:"), culler
    asked = subprocess.run(
        [
            "nsenter",
            f"--target={init}",
            "--net",
            sys.executable,
            "-c",
            ASK,
            culler + "api/warning",
            env["JUPYTERHUB_API_TOKEN"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # the culler answered the server's own token (after asking the hub who it is)
    assert asked.stdout.strip() == "200", (asked.stdout, asked.stderr[-500:])

    # The profile's memory limit, set by the real kubelet in the container's cgroup.
    cgroup, limit_file = testing.container_memory_cgroup(node, container_id)
    assert int((cgroup / limit_file).read_text()) == MEMORY_LIMIT
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == str(MEMORY_LIMIT)

    # Stopping the server deletes its pod through the real kubelet.
    stop_server(hub, USER)
    wait_for(lambda: not user_pods(kube, USER), 90, what=f"{USER}'s pod to be deleted")
    assert testing.container_pids(node, container_id) == []


def _in_container(init: int, *command: str) -> subprocess.CompletedProcess:
    """Run a command of the container's own image in its namespaces (as `kubectl exec`)."""
    return subprocess.run(
        ["nsenter", f"--target={init}", "--mount", "--uts", "--ipc", "--net", "--pid", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _start_gpu_server(hub, user: str, gpus: int = 1, gpu_type: str = "a100") -> None:
    ensure_user(hub, user)
    r = hub.api(
        "POST",
        f"/users/{user}/server",
        {"profile": "pytorch", "gpu_type": gpu_type, "gpus": str(gpus)},
    )
    assert r.status in (201, 202), r.body


def _wait_ready(hub, user: str) -> None:
    def ready():
        server = hub.api("GET", f"/users/{user}").json()["servers"].get("")
        if server is None:
            raise AssertionError(f"{user}'s server stopped while starting:\n{hub.log()[-3000:]}")
        return server["ready"]

    wait_for(ready, 240, 1, what=f"{user}'s server to be ready")


def _assert_check_passed(pod: dict) -> None:
    """The GPU check ran in its init container (nvidia-smi inside it) and passed."""
    (check,) = [
        c
        for c in pod["status"]["initContainerStatuses"]
        if c["name"] == labels.VALIDATION_CONTAINER_NAME
    ]
    assert check["state"]["terminated"]["exitCode"] == 0, check


def _held(nodes, pod: dict, resource: str) -> list[str]:
    """The device IDs of ``resource`` the kubelet allocated to the notebook, from PodResources."""
    (held,) = [
        a
        for a in nodes.pod_resources(pod["spec"]["nodeName"])
        if a["pod"] == pod["metadata"]["name"]
        and a["resource"] == resource
        and a["container"] == "notebook"
    ]
    return held["device_ids"]


def _kubelet_metric(kube, node: str, name: str) -> float:
    """One unlabelled series of a node's kubelet /metrics, through the API server's node proxy."""
    text = kube.request("GET", f"/api/v1/nodes/{node}/proxy/metrics", raw=True).body
    values = [float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name]
    assert values, f"{node}'s kubelet exports no {name}"
    return values[0]


def _notebook_init(pod: dict) -> int:
    """The host pid of the notebook container's pid 1."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    (init,) = [
        p for p in testing.container_pids(pod["spec"]["nodeName"], container_id) if _ns_pid(p) == 1
    ]
    return init


def _burn(pod: dict, seconds: int, percent: int) -> subprocess.Popen:
    """gpu-burn-emulated in the notebook, as its user types it in a terminal."""
    return subprocess.Popen(
        [
            "nsenter",
            f"--target={_notebook_init(pod)}",
            "--mount",
            "--pid",
            "--setuid=1000",
            "--setgid=100",
            "gpu-burn-emulated",
            str(seconds),
            str(percent),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_a_gpu_server_gets_exactly_its_gpus_checked_before_it_started(real):
    """2 × A100 through the real hub: the kubelet's allocation, NVIDIA's runtime, the GPU check."""
    stack = real.stack
    hub, kube, nodes = stack.hub, stack.control_plane.admin_api(), stack.nodes
    user = "gita"
    ensure_user(hub, user)
    _start_gpu_server(hub, user, gpus=2)
    _wait_ready(hub, user)
    pod = pod_of(kube, user)
    node = pod["spec"]["nodeName"]
    assert node.startswith("gpu-a100"), node
    # The GPU check ran in its init container (nvidia-smi inside it) and passed.
    _assert_check_passed(pod)
    # The default topology's EventedPLEG: the kubelet follows containerd's container
    # events (the check's exit among them), not only its one-second relist.
    assert _kubelet_metric(kube, node, "kubelet_evented_pleg_connection_success_count") >= 1
    assert _kubelet_metric(kube, node, "kubelet_evented_pleg_connection_latency_seconds_count") > 0

    # What the kubelet allocated, through its PodResources API.
    allocated = sorted(_held(nodes, pod, "nvidia.com/gpu"))
    assert len(allocated) == 2

    init = _notebook_init(pod)
    # NVIDIA's runtime gave the container exactly those two device nodes ...
    devices = sorted(
        name
        for name in os.listdir(f"/proc/{init}/root/dev")
        if name.startswith("nvidia") and name[len("nvidia") :].isdigit()
    )
    assert len(devices) == 2, devices
    # ... and the emulated driver's nvidia-smi inside lists exactly those GPUs.
    listed = _in_container(init, "nvidia-smi", "-L")
    assert listed.returncode == 0, listed.stderr
    uuids = sorted(line.rsplit("UUID: ", 1)[1].rstrip(")") for line in listed.stdout.splitlines())
    assert uuids == allocated

    # The node's DCGM exporter, scraped by the stack's Prometheus, names the pod on exactly them.
    assert stack.prometheus is not None
    series = stack.prometheus.wait_for(
        f'DCGM_FI_DEV_GPU_UTIL{{pod="{pod["metadata"]["name"]}"}}',
        lambda result: len(result) == 2,
        timeout=60,
    )
    assert sorted(item["metric"]["UUID"] for item in series) == allocated

    stop_server(hub, user)
    wait_for(lambda: not user_pods(kube, user), 90, what=f"{user}'s pod to be deleted")


MIG_NODE = "gpu-mig-0"
MIG_RESOURCE = "nvidia.com/mig-1g.5gb"


def test_a_mig_server_gets_exactly_its_mig_device_and_its_own_activity(real):
    """A 1g.5gb MIG slice through the real hub: the kubelet's allocation, the check, DCGM."""
    stack = real.stack
    hub, kube, nodes = stack.hub, stack.control_plane.admin_api(), stack.nodes
    user = "mika"
    _start_gpu_server(hub, user, 1, "a100-1g")
    burn = None
    try:
        _wait_ready(hub, user)
        pod = pod_of(kube, user)
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == MIG_NODE
        notebook = pod["spec"]["containers"][0]
        assert notebook["resources"]["limits"][MIG_RESOURCE] == "1"
        assert "nvidia.com/gpu" not in notebook["resources"]["limits"]
        _assert_check_passed(pod)

        # The kubelet's device manager gave the notebook one MIG device ...
        (mig_uuid,) = _held(nodes, pod, MIG_RESOURCE)
        # ... and nvidia-smi inside lists exactly it, under its parent GPU (R470+ format).
        listed = _in_container(_notebook_init(pod), "nvidia-smi", "-L")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert len(lines) == 2 and lines[0].startswith("GPU "), lines
        assert "MIG 1g.5gb" in lines[1] and f"UUID: {mig_uuid})" in lines[1], lines

        # Its activity is its own: the busy instance's series rise, and its neighbours on the
        # same GPU (each MIG device has its own usage directory) stay idle.
        engine = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
        (own,) = stack.prometheus.wait_for(
            f'{engine}{{pod="{name}"}}', lambda result: len(result) == 1, timeout=60
        )
        parent = own["metric"]["UUID"]
        assert own["metric"]["GPU_I_PROFILE"] == "1g.5gb"
        burn = _burn(pod, 120, 80)
        stack.prometheus.wait_for(f'{engine}{{pod="{name}"}} > 0.5', bool, timeout=60)
        neighbours = stack.prometheus.wait_for(
            f'{engine}{{UUID="{parent}",pod!="{name}"}}', bool, timeout=30
        )
        assert len(neighbours) >= 1
        assert all(float(item["value"][1]) == 0 for item in neighbours), neighbours
    finally:
        if burn is not None:
            burn.terminate()
            burn.wait(timeout=30)
        stop_server(hub, user)
    wait_for(lambda: not user_pods(kube, user), 90, what=f"{user}'s pod to be deleted")


#: Seconds of idle GPUs after which the culler below stops a GPU server.
IDLE_GPU_TIMEOUT = 10
GPU_CULLER_CONFIG = f"""
c = get_config()  # noqa
# GPU idleness alone decides (an open JupyterLab tab keeps Jupyter 'active'):
c.GPUCuller.timeouts = [{{"min_gpus": 1, "gpu_timeout": {IDLE_GPU_TIMEOUT}}}]
c.GPUCuller.timeout = 0
c.GPUCuller.min_running = 0
c.GPUCuller.gpu_window = 40
c.GPUCuller.gpu_query_step = 5
c.GPUCuller.gpu_freshness = 60
c.GPUCuller.pressure_timeout = 0
c.GPUCuller.kubernetes = "on"
c.Application.log_level = "INFO"
"""


def test_the_culler_stops_the_idle_gpu_server_and_keeps_the_busy_one(
    real, browser, tmp_path, report
):
    """GPU activity from the DCGM exporter via the real Prometheus, driven by gpu-burn-emulated.

    The admin page, a hub service reading the same Prometheus, shows it first.
    """
    stack = real.stack
    hub, kube = stack.hub, stack.control_plane.admin_api()
    busy, idle = "bea", "ida"
    for user in (busy, idle):
        _start_gpu_server(hub, user)
    for user in (busy, idle):
        _wait_ready(hub, user)
    pods = {user: pod_of(kube, user) for user in (busy, idle)}
    busy_pod = pods[busy]
    burn = _burn(busy_pod, 300, 90)
    try:
        util = "DCGM_FI_DEV_GPU_UTIL"
        stack.prometheus.wait_for(
            f'{util}{{pod="{busy_pod["metadata"]["name"]}"}} > 50', bool, timeout=90
        )
        stack.prometheus.wait_for(
            f'{util}{{pod="{pods[idle]["metadata"]["name"]}"}} == 0', bool, timeout=90
        )
        page = browser_log_in(browser, hub, "admin", ADMIN_PAGE)

        def utilisation_shown():
            page.goto(hub.public_url + ADMIN_PAGE)
            shown = {
                user: re.search(r"(\d+) %", page.locator(f'tr[data-server="{user}/"]').inner_text())
                for user in (busy, idle)
            }
            if all(shown.values()) and int(shown[busy].group(1)) >= 10:
                return {user: int(match.group(1)) for user, match in shown.items()}
            return None

        shown = wait_for(utilisation_shown, 90, 2, what="the admin page's GPU utilisation")
        assert shown[idle] == 0, shown
        page.screenshot(path=str(tmp_path / "admin-page.png"), full_page=True)
        report(f"admin page with GPU utilisation: {tmp_path / 'admin-page.png'}")
        page.context.close()
        # The idle server's GPU idle past its gpu_timeout since the server started
        # (the culler counts from then), with a few scrapes to spare.
        started = datetime.fromisoformat(
            hub.api("GET", f"/users/{idle}").json()["servers"][""]["started"].replace("Z", "+00:00")
        ).timestamp()
        time.sleep(max(0.0, started + IDLE_GPU_TIMEOUT + 5 - time.time()))
        config = tmp_path / "culler_config.py"
        config.write_text(GPU_CULLER_CONFIG)
        culled = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuspawner.culler",
                f"--config={config}",
                f"--prometheus-url={stack.prometheus.url}",
                "--once",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={
                **os.environ,
                "JUPYTERHUB_API_URL": f"{hub.public_url}/hub/api",
                "JUPYTERHUB_API_TOKEN": hub.token,
                "KUBECONFIG": str(stack.hub_kubeconfig),
            },
        )
        assert culled.returncode == 0, culled.stderr[-3000:]
        wait_for(
            lambda: hub.api("GET", f"/users/{idle}").json()["servers"].get("") is None,
            60,
            what=f"{idle}'s idle GPU server to be culled",
        )
        assert hub.api("GET", f"/users/{busy}").json()["servers"][""]["ready"], culled.stderr[
            -3000:
        ]
    finally:
        burn.terminate()
        burn.wait(timeout=30)
        stop_servers(hub, [(busy, ""), (idle, "")])


H100_NODE = "gpu-h100-0"


@pytest.mark.parametrize(
    ("user", "fault", "said"),
    [
        # Faults the device plugin does not notice (or was not told of): the GPU stays
        # allocatable, so only GPUSpawner's check, with nvidia-smi in the container, catches it.
        ("vera", {"kind": "ecc", "withdraw": False, "value": "3"}, ["uncorrectable"]),
        ("olga", {"kind": "driver-too-old", "value": "535.161.08"}, ["535.161.08", "13.2"]),
        # every GPU of the node gone from the bus: 'No devices were found', exit 6
        ("mila", {"kind": "missing"}, ["finds no gpu", "no devices were found"]),
        # fallen off the bus (XID 79) before the plugin's health check saw it: exit 15
        ("lena", {"kind": "lost", "withdraw": False}, ["fallen off the bus"]),
        # the kernel module not loaded: exit 9
        ("nina", {"kind": "driver-not-loaded"}, ["driver is not loaded"]),
        ("romy", {"kind": "row-remap-pending"}, ["row remapping pending"]),
    ],
)
def test_a_gpu_fault_fails_the_spawn_through_the_real_kubelet_and_removes_the_pod(
    real, user, fault, said, report
):
    stack = real.stack
    hub, kube = stack.hub, stack.control_plane.admin_api()
    state = stack.nodes.paths(H100_NODE).driver_state
    ensure_user(hub, user)
    gpudriver.inject_fault(state, **fault)
    try:
        asked = time.monotonic()
        r = hub.api(
            "POST", f"/users/{user}/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
        )
        assert r.status in (202, 503), r.body
        if r.status == 202:
            wait_for(
                lambda: hub.api("GET", f"/users/{user}").json()["servers"].get("") is None,
                120,
                1,
                what=f"{user}'s failed spawn to end",
            )
        # The check's termination message, through the real kubelet's initContainerStatuses,
        # is the user's error: one sentence naming the fault.
        (line,) = [ln for ln in hub.log().splitlines() if f"Not starting {user}'s server" in ln]
        assert "reason=gpu-check" in line
        assert "The GPUs given to this server failed their check, so it was not started:" in line
        for word in said:
            assert word in line.lower() or word in line, line
        # it ended on the check's failure, not on the hub's start timeout
        assert f"{user}'s server failed to start" not in hub.log()
        # Measured, not asserted (docs/benchmarks.md): request -> the user's error.
        report(
            f"fault {fault['kind']}: the spawn failed {time.monotonic() - asked:.1f} s after the request"
        )
        wait_for(lambda: pod_of(kube, user) is None, 60, what=f"{user}'s pod to be deleted")
    finally:
        gpudriver.clear_faults(state)


def test_nothing_was_forwarded_out_of_the_pod_ranges(real):
    stack = real.stack
    assert stack.nodes.forward_drops() == 0
    # ...and the host itself sent nothing to the pod range out of another interface.
    assert stack.nodes.host_drops() == 0


def test_down_restores_the_host(real):
    """Runs after every test that uses the stack (tests/e2e/conftest.py): it stops it."""
    stack = real.stack
    state_dir = stack.state_dir
    control_plane = dict(stack.control_plane.processes)
    stack.stop()
    # The API server stops first (it listens on our link), while every kubelet still
    # holds its connections: SIGTERM alone must end it, not the SIGKILL after its grace.
    assert control_plane["kube-apiserver"].returncode == 0
    after = hoststate.snapshot(state_dir / "nodes", real.cgroup_roots)
    assert hoststate.differences(real.before, after) == []
    assert testing.processes_mentioning(str(state_dir)) == []
