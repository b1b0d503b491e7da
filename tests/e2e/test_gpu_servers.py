"""GPU and CPU-only servers on the local cluster, through the real hub's REST API and proxy."""

import json
import re
import urllib.request

from .conftest import ensure_user, pod_of, stop_server, wait_ready
from .kernel import run_code

UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

SHOW_GPUS = """
import os, shutil, subprocess
print("VISIBLE=" + os.environ.get("NVIDIA_VISIBLE_DEVICES", "<unset>"))
smi = shutil.which("nvidia-smi")
print("SMI=" + (subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else "<not found>"))
"""


def test_gpu_server_gets_its_gpus_checked_and_answers_through_the_proxy(hub, kube):
    ensure_user(hub, "gina")
    r = hub.api(
        "POST", "/users/gina/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    )
    assert r.status in (201, 202), r.body
    wait_ready(hub, "gina")
    try:
        pod = pod_of(kube, "gina")
        spec = pod["spec"]
        notebook = spec["containers"][0]
        assert notebook["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert notebook["resources"]["requests"]["nvidia.com/gpu"] == "2"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
        assert spec["nodeName"].startswith("gpu-a100-")  # placed by the real scheduler
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
            "tolerations"
        ]
        (check,) = spec["initContainers"]
        assert check["name"] == "gpu-check"
        assert check["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        (check_status,) = pod["status"]["initContainerStatuses"]
        assert check_status["state"]["terminated"]["exitCode"] == 0

        # the notebook server answers through the proxy
        request = urllib.request.Request(
            f"{hub.public_url}/user/gina/api/status",
            headers={"Authorization": f"token {hub.token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert "started" in json.loads(response.read())

        # ... and sees exactly the two GPUs the cluster allocated to it. NVIDIA's runtime
        # (CDI mode) turned the plugin's NVIDIA_VISIBLE_DEVICES=<uuids> into device nodes and
        # left "void" behind, as on a real node; what the kubelet gave is in test_real_nodes.py.
        out = run_code(hub, "gina", SHOW_GPUS)
        assert "VISIBLE=void" in out, out
        listed = UUID.findall(out.split("SMI=", 1)[1])
        assert len(listed) == 2 and len(set(listed)) == 2, out
    finally:
        stop_server(hub, "gina")
    assert pod_of(kube, "gina") is None


def test_cpu_only_server_sees_no_gpu_even_when_image_and_config_say_all(hub, kube):
    # c.KubeSpawner.environment in this hub's config says NVIDIA_VISIBLE_DEVICES=all, as a
    # CUDA image's ENV may (ours set none)
    ensure_user(hub, "carl")
    r = hub.api("POST", "/users/carl/server", {"profile": "pytorch", "gpus": "0"})
    assert r.status in (201, 202), r.body
    wait_ready(hub, "carl")
    try:
        pod = pod_of(kube, "carl")
        notebook = pod["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in (notebook.get("resources") or {}).get("limits", {})
        assert not pod["spec"].get("initContainers")
        assert pod["spec"]["nodeName"]  # scheduled somewhere, GPU node or not
        out = run_code(hub, "carl", SHOW_GPUS)
        assert "VISIBLE=void" in out
        assert "SMI=<not found>" in out
    finally:
        stop_server(hub, "carl")
