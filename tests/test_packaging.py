"""What `pip install gpuspawner` carries: the spawner, culler, admin service and image tool only.

The local cluster (sandbox/) is a test and demo harness with its own
distribution, ``gpuspawner-sandbox``; neither it nor its certificate library
may reach the hub image through gpuspawner's wheel.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from .conftest import REPO


def build_wheel(source: Path, out: Path) -> zipfile.ZipFile:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def metadata(wheel: zipfile.ZipFile) -> tuple[list[str], str]:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    message = Parser().parsestr(wheel.read(meta).decode())
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return message.get_all("Requires-Dist") or [], wheel.read(entry_points).decode()


@pytest.fixture(scope="module")
def gpuspawner_wheel(tmp_path_factory) -> zipfile.ZipFile:
    return build_wheel(REPO, tmp_path_factory.mktemp("gpuspawner-wheel"))


@pytest.fixture(scope="module")
def sandbox_wheel(tmp_path_factory) -> zipfile.ZipFile:
    return build_wheel(REPO / "sandbox", tmp_path_factory.mktemp("sandbox-wheel"))


def test_gpuspawner_wheel_holds_only_the_gpuspawner_package(gpuspawner_wheel):
    top_level = {
        name.split("/", 1)[0] for name in gpuspawner_wheel.namelist() if "dist-info" not in name
    }
    assert top_level == {"gpuspawner"}
    assert not [n for n in gpuspawner_wheel.namelist() if "sandbox" in n]
    # what the spawner ships besides the sandbox is still there
    for module in (
        "hub/spawner.py",
        "core/catalog.py",
        "culler/app.py",
        "admin/service.py",
        "images/cli.py",
    ):
        assert f"gpuspawner/{module}" in gpuspawner_wheel.namelist()


def test_cryptography_is_no_runtime_dependency_of_gpuspawner(gpuspawner_wheel):
    requires, entry_points = metadata(gpuspawner_wheel)
    runtime = [r for r in requires if "extra ==" not in r]
    assert runtime, "the wheel lists no runtime dependency at all"
    assert not [r for r in runtime if r.lower().startswith("cryptography")]
    assert "gpuspawner-sandbox" not in entry_points
    assert "gpuspawner-culler" in entry_points


def test_sandbox_has_its_own_distribution_with_its_data(sandbox_wheel):
    names = sandbox_wheel.namelist()
    assert "gpuspawner_sandbox/topology.yaml" in names
    assert not [n for n in names if n.startswith("gpuspawner/")]
    requires, entry_points = metadata(sandbox_wheel)
    assert [r for r in requires if r.lower().startswith("cryptography")]
    assert "gpuspawner-sandbox = gpuspawner_sandbox.cli:main" in entry_points
