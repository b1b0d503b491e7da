"""The docker SDK layer, against a stand-in engine and a socket where nothing listens."""

from __future__ import annotations

import tarfile

import docker
import pytest

from gpuspawner.images import engine
from gpuspawner.images.plan import HUB_REQUIREMENTS_IN_CONTEXT, plan_builds, plan_test

from .conftest import REPO
from .fakedocker import FakeClient, FakeEngine, build_events


def test_connect_without_an_engine_is_one_sentence(monkeypatch, tmp_path):
    host = f"unix://{tmp_path}/no-such.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    with pytest.raises(engine.EngineUnavailable) as err:
        engine.connect(timeout=2)
    message = str(err.value)
    assert message.startswith(f"No Docker engine is reachable at {host}")
    assert message.endswith(".") and "\n" not in message
    assert err.value.__cause__ is None and err.value.__suppress_context__


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}}, True),
        ({"Runtimes": {"runc": {}}, "DefaultRuntime": "nvidia"}, True),
        ({"Runtimes": {"runc": {}, "io.containerd.runc.v2": {}}}, False),
        ({}, False),
    ],
)
def test_nvidia_runtime_detection(info, expected):
    assert engine.has_nvidia_runtime(info) is expected


def test_follow_build_streams_steps_and_returns_the_image_id():
    lines: list[str] = []
    image_id = engine.follow_build(build_events("sha256:" + "a" * 64), lines.append)
    assert image_id == "sha256:" + "a" * 64
    assert lines[0] == "Step 1/30 : ARG BASE_IMAGE=ubuntu:24.04"
    # Progress bars are not repeated line by line; state changes are.
    assert "a1 Pull complete" in lines
    assert not any("Downloading" in line for line in lines)


def test_follow_build_raises_the_engine_error():
    with pytest.raises(engine.EngineError, match="returned a non-zero code: 1"):
        engine.follow_build(
            build_events(
                "x",
                fail="The command '/bin/bash -o pipefail -c pip install' returned a non-zero code: 1",
            ),
            lambda line: None,
        )


def test_build_context_is_the_repository_less_dockerignore_plus_extra_files(matrix, tmp_path):
    """What the engine receives: what the Dockerfiles COPY, z2jh's requirements, no .venv."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("jupyterhub==5.5.0\n")
    pytorch, rebuild, hub = plan_builds(
        matrix,
        ["cuda-pytorch", "k8s-hub", "hub"],
        context=str(REPO),
        hub_requirements=str(requirements),
    )
    with engine.build_context(pytorch) as f:
        names = tarfile.open(fileobj=f).getnames()
    assert "images/cuda-pytorch/Dockerfile" in names
    assert "images/common/start.sh" in names
    assert "gpuspawner/images/smoke.py" in names
    assert not [n for n in names if n.startswith((".venv", ".git/", ".cache"))]
    assert HUB_REQUIREMENTS_IN_CONTEXT not in names
    # only the offline k8s-hub rebuild needs z2jh's pins; the hub is FROM k8s-hub
    with engine.build_context(rebuild) as f:
        tar = tarfile.open(fileobj=f)
        sent = tar.extractfile(HUB_REQUIREMENTS_IN_CONTEXT).read()
    assert sent == b"jupyterhub==5.5.0\n"
    with engine.build_context(hub) as f:
        assert HUB_REQUIREMENTS_IN_CONTEXT not in tarfile.open(fileobj=f).getnames()


def test_missing_hub_requirements_is_one_sentence(matrix, tmp_path):
    (step,) = plan_builds(
        matrix, ["k8s-hub"], context=str(REPO), hub_requirements=str(tmp_path / "absent.txt")
    )
    with pytest.raises(
        engine.EngineError, match=r"cannot read .*absent.txt for k8s-hub's build context"
    ):
        with engine.build_context(step):
            pass


def test_gpu_test_run_requests_all_gpus():
    fake = FakeEngine(runtimes=("runc", "nvidia"))
    run = plan_test("img:1", nvidia_runtime=True)
    result = engine.run_test(FakeClient(fake), run)
    (call,) = fake.runs
    (request,) = call["device_requests"]
    assert isinstance(request, docker.types.DeviceRequest)
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert result.ok and "RESULT: PASS" in result.output
    assert fake.containers[0].removed


def test_failed_test_run_is_reported_with_its_exit_code():
    fake = FakeEngine(test_results={"img:1": (1, b"RESULT: FAIL (1 of 4 checks failed)\n")})
    result = engine.run_test(FakeClient(fake), plan_test("img:1", nvidia_runtime=False))
    assert not result.ok and result.exit_code == 1
    assert fake.runs[0]["environment"] == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert "device_requests" not in fake.runs[0]


def test_push_returns_the_digest():
    fake = FakeEngine()
    lines: list[str] = []
    digest = engine.push(FakeClient(fake), "registry.test/a/cuda-pytorch:1.0", lines.append)
    assert fake.pushes == [("registry.test/a/cuda-pytorch", "1.0")]
    assert digest == "sha256:" + "d" * 64
    assert "a1 Pushed" in lines and not any("Pushing" in line for line in lines)


def test_push_error_is_raised():
    events = [
        {"status": "Preparing", "id": "a1"},
        {"error": "denied: requested access to the resource is denied"},
    ]
    with pytest.raises(engine.EngineError, match="denied"):
        engine.follow_push(events, lambda line: None)
