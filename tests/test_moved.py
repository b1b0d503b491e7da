"""Modules that moved into the layer folders keep their old import paths."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from gpuspawner._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_new_module(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def test_from_old_path_imports_names() -> None:
    from gpuspawner.hubpages import configure
    from gpuspawner.options import Refusal

    assert configure is importlib.import_module("gpuspawner.hub.pages").configure
    assert Refusal.__module__.startswith("gpuspawner.core")


def test_python_m_old_path_runs_the_new_module(tmp_path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("images: {}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpuspawner.startup", str(catalog)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # the catalog check itself answers (an empty catalog is refused with a sentence)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "catalog.yaml" in result.stdout + result.stderr


def test_unknown_names_are_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("gpuspawner.nosuchmodule")
