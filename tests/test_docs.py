"""The three configuration references are generated from the traits and are current."""

import subprocess
import sys

from .conftest import REPO


def test_configuration_references_are_current():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "config_reference.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_reference_lists_its_own_settings_only():
    configuration = (REPO / "docs" / "configuration.md").read_text()
    culler = (REPO / "docs" / "culler.md").read_text()
    admin = (REPO / "docs" / "admin.md").read_text()
    assert "`c.GPUSpawner.catalog_file`" in configuration
    assert "`c.KubeSpawner" not in configuration.split("do not edit below")[1]
    assert "`c.GPUCuller.pressure_timeout`" in culler
    assert "`c.GPUCuller.log_level`" not in culler  # Application's own settings are left out
    # the Prometheus settings the culler and the admin page share, documented for both
    for name in ("gpu_util_metric", "gpu_engine_metric", "pod_label", "namespace_label"):
        assert f"`c.GPUCuller.{name}`" in culler
        assert f"`c.GPUAdmin.{name}`" in admin
    assert "| [`dry_run`](#dry-run) | Bool | `False` | `--dry-run` |" in culler
