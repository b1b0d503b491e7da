"""What `pip install gpuspawner` carries, built as a release is built and installed as a user
installs it.

`python -m build` makes the sdist and, from it, the wheel (so a file the sdist lacks
breaks the wheel too), once per module. Each is installed into a fresh virtualenv
(`python -m venv`, dependencies from the package index under the suite's JupyterHub
pins), outside the repository, and every command pyproject declares must answer
`--help` (and `--version` where it has one) from there.

The local cluster (sandbox/) is a test and demo harness with its own
distribution, ``gpuspawner-sandbox``; neither it nor its certificate library
may reach the hub image through gpuspawner's wheel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from gpuspawner._version import __version__
from gpuspawner.images import release

from .conftest import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
#: The commands whose --version prints the package version.
VERSIONED = ("gpuspawner", "gpuspawner-images", "gpuspawner-culler")
#: The suite's JupyterHub line, so that the clean install resolves as the tested one does.
CONSTRAINTS = REPO / ".ci" / "jupyterhub-6.1.txt"


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
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel made from it by `python -m build` (the `build` package)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        cwd=out,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def gpuspawner_wheel(dist) -> zipfile.ZipFile:
    (wheel,) = dist.glob("gpuspawner-*.whl")
    return zipfile.ZipFile(wheel)


@pytest.fixture(scope="module")
def gpuspawner_sdist(dist) -> tarfile.TarFile:
    (sdist,) = dist.glob("gpuspawner-*.tar.gz")
    return tarfile.open(sdist)


@pytest.fixture(scope="module")
def sandbox_wheel(tmp_path_factory) -> zipfile.ZipFile:
    return build_wheel(REPO / "sandbox", tmp_path_factory.mktemp("sandbox-wheel"))


def test_both_artifacts_carry_the_package_version(dist):
    assert sorted(p.name for p in dist.iterdir()) == [
        f"gpuspawner-{__version__}-py3-none-any.whl",
        f"gpuspawner-{__version__}.tar.gz",
    ]


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
        "images/release.py",
        # PEP 561: type checkers read the package's hints
        "py.typed",
    ):
        assert f"gpuspawner/{module}" in gpuspawner_wheel.namelist()
    # the JupyterLab extension is a distribution of its own (extensions/gpuspawner-jupyterlab),
    # installed in the notebook images, not in the hub
    assert not [n for n in gpuspawner_wheel.namelist() if "labextension" in n]


def test_the_wheels_metadata_names_the_project(gpuspawner_wheel):
    (meta,) = [n for n in gpuspawner_wheel.namelist() if n.endswith(".dist-info/METADATA")]
    message = Parser().parsestr(gpuspawner_wheel.read(meta).decode())
    assert message["Version"] == __version__
    urls = dict(u.split(", ", 1) for u in message.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues", "Changelog"}
    assert urls["Changelog"].endswith("/CHANGELOG.md")
    classifiers = message.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Framework :: Jupyter :: JupyterHub" in classifiers


def test_the_sdist_holds_the_package_and_its_metadata_files(gpuspawner_sdist):
    root = f"gpuspawner-{__version__}"
    names = {n.removeprefix(f"{root}/") for n in gpuspawner_sdist.getnames()}
    for path in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "gpuspawner/py.typed"):
        assert path in names, path
    # package data (the spawn form's templates) is in it, as the wheel built from it needs
    assert [n for n in names if n.startswith("gpuspawner/hub/templates/") and n.endswith(".html")]
    # the suite needs the repository (sandbox, images, fixtures): MANIFEST.in leaves it out
    assert not [n for n in names if n.startswith(("tests/", "sandbox/", "chart/", ".venv"))]


def test_cryptography_is_no_runtime_dependency_of_gpuspawner(gpuspawner_wheel):
    requires, entry_points = metadata(gpuspawner_wheel)
    runtime = [r for r in requires if "extra ==" not in r]
    assert runtime, "the wheel lists no runtime dependency at all"
    assert not [r for r in runtime if r.lower().startswith("cryptography")]
    assert "gpuspawner-sandbox" not in entry_points
    for name, target in SCRIPTS.items():
        assert f"{name} = {target}" in entry_points


def test_sandbox_has_its_own_distribution_with_its_data(sandbox_wheel):
    names = sandbox_wheel.namelist()
    assert "gpuspawner_sandbox/topology.yaml" in names
    assert not [n for n in names if n.startswith("gpuspawner/")]
    requires, entry_points = metadata(sandbox_wheel)
    assert [r for r in requires if r.lower().startswith("cryptography")]
    assert "gpuspawner-sandbox = gpuspawner_sandbox.cli:main" in entry_points


# --- installed into a clean virtualenv ------------------------------------------------

#: Run by the clean venv's python, outside the repository: what a user's install gives.
PROBE = """
import importlib.metadata as md, json, pathlib, sys
import gpuspawner
(spawner,) = [e for e in md.entry_points(group="jupyterhub.spawners") if e.name == "gpu"]
print(json.dumps({
    "version": md.version("gpuspawner"),
    "module": gpuspawner.__file__,
    "py_typed": (pathlib.Path(gpuspawner.__file__).parent / "py.typed").is_file(),
    "spawner": spawner.load().__name__,
    "scripts": sorted(e.name for e in md.entry_points(group="console_scripts")
                      if e.value.startswith("gpuspawner")),
}))
"""


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory, dist) -> Path:
    """A fresh virtualenv with the wheel and its dependencies from the package index."""
    venv = tmp_path_factory.mktemp("clean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (wheel,) = dist.glob("gpuspawner-*.whl")
    pip_install(venv, str(wheel), "-c", str(CONSTRAINTS))
    return venv


def pip_install(venv: Path, *args: str) -> None:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("artifact", ["whl", "tar.gz"])
def test_each_artifact_installs_and_its_commands_run(artifact, clean_venv, dist, tmp_path):
    """The wheel, then the sdist (built from source there) in its place: no file of the
    repository is on the path, every command answers, the spawner entry point loads."""
    (path,) = dist.glob(f"gpuspawner-*.{artifact}")
    pip_install(clean_venv, "--force-reinstall", "--no-deps", str(path))
    python = str(clean_venv / "bin" / "python")
    proc = subprocess.run(
        [python, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["version"] == __version__
    assert Path(found["module"]).is_relative_to(clean_venv)
    assert found["py_typed"] and found["spawner"] == "GPUSpawner"
    assert found["scripts"] == sorted(SCRIPTS)

    def command(name: str, *args: str) -> str:
        """The installed command's output; it must exit 0."""
        ran = subprocess.run(
            [str(clean_venv / "bin" / name), *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert ran.returncode == 0, f"{name} {' '.join(args)}: {ran.stderr[-2000:]}"
        return ran.stdout

    for name in SCRIPTS:
        assert command(name, "--help").strip(), name
    for name in VERSIONED:
        assert __version__ in command(name, "--version"), name
    # the installed image tool names the release as the repository does
    matrix = str(REPO / "images" / "matrix.yaml")
    names = json.loads(command("gpuspawner-images", "version", "--json", "--matrix", matrix))
    assert (names["chart_version"], names["app_version"]) == (
        release.chart_version(),
        release.app_version(),
    )
