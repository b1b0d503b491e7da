"""Helpers for the image tooling's tests: the repository, its matrix, recorded outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from gpuspawner.images.matrix import Matrix, load_matrix
from gpuspawner_sandbox import machineclaim, suitecosts
from gpuspawner_sandbox.build import image_cache_dir
from gpuspawner_sandbox.dockerd import (
    SHIM_SOCKET_DIRS,
    HarnessError,
    PrivateEngine,
    missing_dirs,
    mounts_under,
)

from .dockerd import LocalRegistry

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
DELIMITER = "# ----- verbatim output below this line -----\n"


def recorded(name: str) -> str:
    """The verbatim nvidia-smi output of tests/fixtures/nvidia-smi/<name>."""
    text = (FIXTURES / "nvidia-smi" / name).read_text()
    return text.split(DELIMITER, 1)[1]


def package_jupyterhub_requirement() -> str:
    """The `jupyterhub` requirement in pyproject.toml's dependencies."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    for dep in data["project"]["dependencies"]:
        if dep.replace(" ", "").lower().startswith("jupyterhub") and not dep.lower().startswith(
            "jupyterhub-"
        ):
            return dep
    raise AssertionError("pyproject.toml has no jupyterhub requirement")


@pytest.fixture(scope="package")
def matrix() -> Matrix:
    return load_matrix(REPO / "images" / "matrix.yaml")


# --- the real engine: a private dockerd, a local registry, the built images ---------

CACHE = image_cache_dir(REPO)


def tool_on_engine(
    engine_host: str, *args: str, timeout: float = 3600
) -> subprocess.CompletedProcess:
    """`gpuspawner-images ARGS` as a user runs it, against the private engine.

    Its output goes to the terminal as well (build steps print their progress) and is returned.
    """
    env = {**os.environ, "DOCKER_HOST": engine_host}
    costly = args[0] in ("base", "build")
    with suitecosts.step(suitecosts.IMAGE_BUILD, " ".join(args)) if costly else nullcontext():
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuspawner.images.cli", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.__stderr__.write(line)
            lines.append(line)
        rc = proc.wait(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, rc, "".join(lines), "")


@pytest.fixture(scope="package")
def engine(tmp_path_factory):
    eng = PrivateEngine(state=tmp_path_factory.mktemp("engine"), data_root=CACHE / "engine")
    missing = missing_dirs(SHIM_SOCKET_DIRS)
    try:
        eng.start()
    except HarnessError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield eng
    finally:
        eng.stop()
        leaked = mounts_under(eng.data_root, eng.exec_root)
        assert not leaked, f"mounts left behind by the private dockerd: {leaked}"
        # the shims' socket directory, where the host had none (real nodes started
        # meanwhile may use it: the engine then keeps it)
        if not machineclaim.CLAIM_PATH.exists():
            left = [str(d) for d in missing if os.path.lexists(d)]
            assert not left, f"directories left behind by the private dockerd: {left}"


@pytest.fixture(scope="package")
def docker_client(engine):
    client = engine.client()
    yield client
    client.close()


@pytest.fixture(scope="package")
def registry(tmp_path_factory):
    reg = LocalRegistry(state=tmp_path_factory.mktemp("registry"))
    try:
        reg.start()
    except HarnessError as e:
        pytest.fail(str(e), pytrace=False)
    yield reg
    reg.stop()


@pytest.fixture(scope="package")
def built(engine, matrix):
    """The base made with debootstrap, then the jupyter stage of every notebook image and
    the hub image (k8s-hub rebuilt under quay.io's reference, then the hub FROM it), built by
    `gpuspawner-images` (layers cached in .cache/images)."""
    base = tool_on_engine(engine.host, "base")
    assert base.returncode == 0, base.stdout[-3000:]
    build = tool_on_engine(
        engine.host,
        "build",
        "--target",
        "jupyter",
        "--network",
        "host",
        *matrix.images,
        "k8s-hub",
        "hub",
    )
    # pytest keeps a passing test's output to itself: the build's log stays readable here.
    (CACHE / "last-build.log").write_text(base.stdout + build.stdout)
    assert build.returncode == 0, build.stdout[-5000:]
    return build.stdout


# The full framework builds download gigabytes of wheels: only when asked (docs/images.md).
FULL_BUILD_ENV = "GPUSPAWNER_FULL_IMAGE_BUILD"
collect_ignore = [] if os.environ.get(FULL_BUILD_ENV) == "1" else ["test_full_build.py"]
