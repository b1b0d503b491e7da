import subprocess
import sys

from .conftest import REPO


def test_configuration_reference_is_current():
    generated = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "config_reference.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    on_disk = (REPO / "docs" / "configuration.md").read_text()
    assert generated == on_disk, (
        "run: .venv/bin/python scripts/config_reference.py > docs/configuration.md"
    )
    assert "## `c.GPUSpawner.catalog_file`" in on_disk
