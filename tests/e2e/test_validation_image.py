"""c.GPUSpawner.validation_image on real nodes: the check runs in an image of its own.

The sandbox loads the GPU check's image (images/validation, built by `gpuspawner-images
build validation`) into every node's containerd beside the notebook image
(gpuspawner_sandbox.validationimage). NVIDIA's real container runtime, in CDI mode, mounts
the emulated driver's nvidia-smi into the check's container because the container was
given GPUs; the image brings only python3.
"""

from __future__ import annotations

from gpuspawner.core.labels import VALIDATION_CONTAINER_NAME
from gpuspawner_sandbox import nodeconfig

from .conftest import ensure_user, hub_with, pod_of, stop_server, wait_for, wait_ready


def check_container(pod):
    (container,) = [
        c for c in pod["spec"]["initContainers"] if c["name"] == VALIDATION_CONTAINER_NAME
    ]
    return container


def check_status(pod):
    (status,) = [
        s
        for s in pod["status"].get("initContainerStatuses") or []
        if s["name"] == VALIDATION_CONTAINER_NAME
    ]
    return status


def test_a_gpu_server_passes_its_check_in_the_validation_image_and_starts(stack, kube):
    image = stack.validation_image
    assert image and image.endswith("/validation:trixie-py3.13"), image
    user = "vera"
    with hub_with(stack, f"c.GPUSpawner.validation_image = {image!r}\n") as hub:
        ensure_user(hub, user)
        r = hub.api(
            "POST", f"/users/{user}/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "2"}
        )
        assert r.status in (201, 202), r.body
        try:
            wait_ready(hub, user, timeout=240)
            pod = pod_of(kube, user)
            # the check ran in its own image, the notebook in the catalog's
            assert check_container(pod)["image"] == image
            assert pod["spec"]["containers"][0]["image"] != image
            terminated = check_status(pod)["state"]["terminated"]
            assert terminated["exitCode"] == 0
            assert terminated["message"].strip() == "GPU check passed."
            log = kube.request(
                "GET",
                f"/api/v1/namespaces/jupyterhub/pods/{pod['metadata']['name']}/log",
                query={"container": VALIDATION_CONTAINER_NAME},
                raw=True,
            ).body
            # the runtime's nvidia-smi (the emulated driver's), seen by the image's python3
            assert "nvidia-smi sees 2 GPUs" in log, log
        finally:
            stop_server(hub, user)


def test_an_image_without_python3_fails_the_spawn_with_one_sentence_naming_it(stack, kube):
    # The nodes' tool image: a static program and no python3, as NVIDIA's cuda:*-base images.
    image = nodeconfig.TOOL_IMAGE
    user = "vince"
    with hub_with(stack, f"c.GPUSpawner.validation_image = {image!r}\n") as hub:
        ensure_user(hub, user)
        r = hub.api(
            "POST", f"/users/{user}/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
        )
        assert r.status in (202, 503), r.body
        wait_for(
            lambda: hub.api("GET", f"/users/{user}").json()["servers"].get("") is None,
            120,
            1,
            what=f"{user}'s spawn without python3 to end",
        )
        (line,) = [ln for ln in hub.log().splitlines() if f"Not starting {user}'s server" in ln]
        assert "reason=gpu-check" in line, line
        assert (
            "The GPUs given to this server could not be checked, so it was not started: "
            f"The GPU check could not start because there is no python3 in its image {image!r}; "
            "ask an admin to set validation_image to an image with python3 (docs/validation.md)."
        ) in line, line
        assert "Traceback" not in line
        # it ended on the runtime's refusal, not on the hub's start timeout
        assert f"{user}'s server failed to start" not in hub.log()
        wait_for(lambda: pod_of(kube, user) is None, 60, what=f"{user}'s pod to be deleted")
