"""The layers' import contracts hold, and breaking one on purpose fails ``make lint``.

The contracts are in pyproject.toml ([tool.importlinter]); docs/architecture.md
draws the layers. Each case copies the package and the sandbox into a scratch
folder, adds one import that crosses a layer the wrong way, and runs the real
``lint-imports`` over the copy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "gpuspawner", tmp_path / "gpuspawner", ignore=ignore)
    shutil.copytree(
        REPO / "sandbox" / "gpuspawner_sandbox", tmp_path / "gpuspawner_sandbox", ignore=ignore
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_import(module: Path, line: str) -> None:
    module.write_text(module.read_text() + f"\n{line}  # added by tests/test_layers.py\n")


def test_the_contracts_hold(copy: Path) -> None:
    result = lint(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # the core importing the hub glue
        ("gpuspawner/core/labels.py", "from gpuspawner.hub import state", "Layers"),
        # the core importing a client
        ("gpuspawner/core/catalog.py", "import gpuspawner.clients.kube", "Layers"),
        # the core importing JupyterHub
        ("gpuspawner/core/options.py", "import tornado.web", "The core imports no"),
        # a service importing the hub glue
        ("gpuspawner/culler/policy.py", "import gpuspawner.hub.capacity", "Layers"),
        ("gpuspawner/userservice/base.py", "from gpuspawner.hub import capacity", "Layers"),
        # the hub importing a service
        ("gpuspawner/hub/metrics.py", "import gpuspawner.admin.report", "Layers"),
        # the in-pod check importing the package
        ("gpuspawner/validation/gpucheck.py", "import gpuspawner.core.labels", "in-pod"),
        # the sandbox importing the package, and the other way round
        ("gpuspawner_sandbox/cli.py", "import gpuspawner.core.catalog", "never import"),
        ("gpuspawner/images/cli.py", "import gpuspawner_sandbox.cli", "never import"),
    ],
)
def test_an_import_the_wrong_way_breaks_a_contract(
    copy: Path, module: str, line: str, broken: str
) -> None:
    add_import(copy / module, line)
    result = lint(copy)
    assert result.returncode != 0, result.stdout
    broken_section = result.stdout.split("Broken contracts", 1)[-1]
    assert broken in broken_section, result.stdout


def test_docs_architecture_names_every_module() -> None:
    """docs/architecture.md draws the layers as they are: a new module gets its row."""
    text = (REPO / "docs" / "architecture.md").read_text()
    package = REPO / "gpuspawner"
    missing = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.name not in {"__init__.py", "__main__.py"}
        and path.parent.name != "__pycache__"
        and f"`{path.relative_to(package)}`" not in text
    ]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"
