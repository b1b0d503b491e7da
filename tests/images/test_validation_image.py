"""The GPU check's image (images/validation/Dockerfile), for c.GPUSpawner.validation_image.

First what a reviewer would check by eye, without an engine: python3 and nothing else, no
NVIDIA_VISIBLE_DEVICES, no ENTRYPOINT, a non-root user, the config's example naming it.
Then the image built by `gpuspawner-images build validation` on the tests' private Docker
engine, running the spawner's own init container command as the node would: without a
driver it fails with the check's own reason (so python3 and every module the check
imports are there); with an emulated driver's nvidia-smi mounted where NVIDIA's runtime
puts it, it passes as the non-root user.
"""

from __future__ import annotations

import ast
import shlex
import sys

import pytest

from gpuspawner.images.plan import plan_builds, validation_ref
from gpuspawner.validation import gpucheck
from gpuspawner.validation.command import check_command

from .conftest import REPO, tool_on_engine
from .test_built_images import emulated_driver, run
from .test_dockerfiles import OCI_LABELS, all_envs, instructions, parse, resolve

DOCKERFILE = "images/validation/Dockerfile"


@pytest.fixture
def check(matrix):
    return matrix.validation


def apt_packages(runs: list[str]) -> list[str]:
    """The packages every ``apt-get install`` of these RUN lines names."""
    found = []
    for run_line in runs:
        for command in run_line.split("&&"):
            words = shlex.split(command.replace("\\\n", " "))
            if words[:2] == ["apt-get", "install"]:
                found += [w for w in words[2:] if not w.startswith("-")]
    return found


def test_the_matrix_names_this_dockerfile(check):
    assert check.dockerfile == DOCKERFILE
    assert (REPO / DOCKERFILE).is_file()


def test_base_and_arg_defaults_repeat_the_matrix(check):
    df = parse(DOCKERFILE, check.build_args())
    assert df.parent_images == [check.base_image]
    # a plain `docker build` gets the same image as the tool's
    assert parse(DOCKERFILE).parent_images == [check.base_image]
    declared = parse(DOCKERFILE).args
    assert declared["PYTHON_VERSION"] == check.python
    assert declared["IMAGE_VERSION"] == check.tag
    for key in OCI_LABELS:
        assert df.labels.get(f"org.opencontainers.image.{key}"), key
    assert df.labels["io.gpuspawner.image.python"] == check.python


def test_python3_and_its_standard_library_only(check):
    df = parse(DOCKERFILE, check.build_args())
    runs = instructions(df, "RUN")
    # python3-minimal lacks dataclasses and shutil, which the check imports.
    assert sorted(apt_packages(runs)) == ["libpython3-stdlib", "python3-minimal"]
    assert "--no-install-recommends" in " ".join(runs)
    assert "rm -rf /var/lib/apt/lists/*" in " ".join(runs)
    # The check is not baked in: the spawner sends its source in the command.
    assert instructions(df, "COPY") == [] and instructions(df, "ADD") == []


def test_the_check_imports_only_the_standard_library():
    """What the image must provide: the check's imports, all from the standard library."""
    tree = ast.parse((REPO / "gpuspawner" / "validation" / "gpucheck.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and not node.level
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_no_entrypoint_a_non_root_user_and_no_visible_devices(check):
    df = parse(DOCKERFILE, check.build_args())
    assert instructions(df, "ENTRYPOINT") == []
    (user,) = instructions(df, "USER")
    uid = resolve(user, df.args).split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    env = all_envs(df, df.args)
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")


def test_the_config_example_names_the_built_image(matrix):
    """config/jupyterhub_config.py suggests exactly what `build validation` tags."""
    text = (REPO / "config" / "jupyterhub_config.py").read_text()
    assert f'# c.GPUSpawner.validation_image = "{validation_ref(matrix)}"' in text
    assert "cuda:12.8.1-base" not in text


# --- on the real engine --------------------------------------------------------------


@pytest.fixture(scope="module")
def check_image(engine, matrix):
    """The image, built by `gpuspawner-images build validation` (layers cached)."""
    base = tool_on_engine(engine.host, "base")
    assert base.returncode == 0, base.stdout[-3000:]
    build = tool_on_engine(engine.host, "build", "--network", "host", matrix.validation.name)
    assert build.returncode == 0, build.stdout[-5000:]
    return validation_ref(matrix)


def test_the_built_image_has_the_matrix_python_and_runs_as_nobody(
    docker_client, check_image, matrix
):
    rc, out = run(docker_client, check_image, ["sh", "-c", "python3 --version; id -u; id -g"])
    assert rc == 0, out
    version, uid, gid = out.split("\n")[:3]
    assert version.startswith(f"Python {matrix.validation.python}."), out
    assert (uid, gid) == ("65534", "65534")
    image = docker_client.images.get(check_image)
    (step,) = plan_builds(matrix, ["validation"], context=str(REPO))
    assert image.labels["org.opencontainers.image.version"] == matrix.validation.tag
    assert step.refs == [check_image]
    # no pip, no compiler: the image is the interpreter and its library
    rc, out = run(docker_client, check_image, ["sh", "-c", "command -v pip pip3 gcc || true"])
    assert out.strip() == "", out
    # Measured, not asserted: docs/images.md records it.
    print(f"{check_image}: {image.attrs['Size'] / 1e6:.1f} MB")


def test_the_spawners_check_command_fails_with_its_own_reason_without_a_driver(
    docker_client, check_image
):
    """No GPU here: the check itself runs (python3, every module it imports) and says so."""
    rc, out = run(
        docker_client,
        check_image,
        # The init container sets `command`, which replaces any entry point.
        entrypoint=check_command(1, "nvidia.com/gpu", "13.2", timeout=30),
    )
    assert rc == gpucheck.EXIT_NO_NVIDIA_SMI, out
    assert "nvidia-smi was not found in the container" in out
    assert "Traceback" not in out


def test_the_spawners_check_command_passes_with_the_emulated_driver(
    docker_client, check_image, tmp_path
):
    """nvidia-smi where the driver's would be (recorded H200 output): the check passes."""
    bindir = emulated_driver(tmp_path, "h200_590.48.01")
    rc, out = run(
        docker_client,
        check_image,
        entrypoint=check_command(1, "nvidia.com/gpu", "13.2"),
        volumes={str(bindir): {"bind": "/usr/local/nvidia/bin", "mode": "ro"}},
        environment={"NVIDIA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000000"},
    )
    assert rc == 0, out
    assert "nvidia-smi sees 1 GPU" in out, out
