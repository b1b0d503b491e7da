"""Helpers for the image tooling's tests: the repository, its matrix, recorded outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from gpuspawner.images.matrix import Matrix, load_matrix

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


@pytest.fixture(scope="session")
def matrix() -> Matrix:
    return load_matrix(REPO / "images" / "matrix.yaml")
