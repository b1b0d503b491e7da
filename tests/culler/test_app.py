"""The service's configuration: file, flags, readable refusals, and the generated reference."""

from __future__ import annotations

import subprocess
import sys

import pytest
from traitlets.config import Config

from gpuspawner.culler.app import GPUCuller

from ..conftest import REPO


def make(argv, **traits) -> GPUCuller:
    config = Config()
    config.GPUCuller.api_token = "t"
    config.GPUCuller.kubernetes = "off"
    for key, value in traits.items():
        setattr(config.GPUCuller, key, value)
    app = GPUCuller(config=config)
    app.initialize(argv)
    return app


def test_config_file_and_flags(tmp_path):
    path = tmp_path / "culler_config.py"
    path.write_text(
        "c.GPUCuller.cull_every = 5\n"
        'c.GPUCuller.timeouts = [{"min_gpus": 8, "timeout": 1800}, {"gpu_type": "none", "timeout": 28800}]\n'
        'c.GPUCuller.pressure_timeouts = {"h100": 600}\n'
        'c.GPUCuller.prometheus_url = "http://127.0.0.1:9"\n'
        'c.GPUCuller.pod_label = "exported_pod"\n'
    )
    app = make([f"--config={path}", "--dry-run", "--cull-every=7", "--GPUCuller.max_age=86400"])
    assert app.cull_every == 7  # the command line wins over the file
    assert app.dry_run is True
    assert [r.timeout for r in app.policy.rules] == [1800, 28800]
    assert app.policy.max_age == 86400
    assert app.policy.pressure_timeout_for("h100") == 600
    assert app.policy.pressure_timeout_for("a100") == 900  # pressure_timeout's default
    # the GPU window covers the longest timeout, so "idle for the whole window" is enough
    assert app.prometheus.queries.window == 28800
    assert "exported_pod" in app.prometheus.queries.fresh_query()
    assert app.pods is None  # kubernetes = off


def test_a_malformed_rule_stops_the_service_with_one_line(capfd):
    with pytest.raises(SystemExit) as e:
        make([], timeouts=[{"gpu_type": "a100", "timeout": "2h"}])
    assert e.value.code == 1
    lines = [line for line in capfd.readouterr().err.splitlines() if "CRITICAL" in line]
    assert len(lines) == 1 and "timeout must be seconds above 0" in lines[0], lines
    assert "Traceback" not in capfd.readouterr().err


def test_no_token_is_refused(capfd, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        make([], api_token="")
    assert "no API token" in capfd.readouterr().err


def test_module_and_console_script_answer_help():
    for command in (
        [sys.executable, "-m", "gpuspawner.culler", "--help"],
        [str(REPO / ".venv" / "bin" / "gpuspawner-culler"), "--help"]
        if (REPO / ".venv" / "bin" / "gpuspawner-culler").exists()
        else [sys.executable, "-m", "gpuspawner.culler", "--help-all"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "--dry-run" in result.stdout


def test_z2jh_values_register_the_same_service_and_scopes():
    """The shipped configs wire the culler with gpuspawner.setup (tests/test_hubsetup.py
    shows each one's role and service); z2jh's own culler is off, and the chart keeps a
    token for ours."""
    import yaml

    from gpuspawner.culler.hubconfig import CULLER_SCOPES

    from .hubtools import shipped_culler_role

    assert shipped_culler_role()["scopes"] == list(CULLER_SCOPES)
    values = yaml.safe_load((REPO / "config" / "z2jh-values.yaml").read_text())
    assert "gpuspawner-culler" in values["hub"]["services"]
    assert "gpuspawner.setup(" in "".join(values["hub"]["extraConfig"].values())
    for forbidden in ("access:servers", "admin", "admin:users", "admin:servers"):
        assert forbidden not in CULLER_SCOPES
    assert values["cull"]["enabled"] is False  # one culler only
