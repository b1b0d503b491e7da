"""gpuspawner.chartconfig: the Helm chart's rendered settings, then gpuspawner.setup.

The settings files are what chart/gpuspawner/templates/configmap-config.yaml renders
(tests/chart renders them with the real Helm and reads them with the same functions).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from traitlets.config import Config

from gpuspawner import chartconfig

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "config" / "catalog.yaml"
SERVICES = ("gpuspawner-culler", "gpuspawner-admin", "gpuspawner")


def write_settings(tmp_path: Path, **settings) -> Path:
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    return tmp_path


def z2jh_config() -> Config:
    """A hub config as z2jh leaves it before extraConfig: every hub.services entry, with a token."""
    c = Config()
    c.JupyterHub.services = [{"name": name, "api_token": f"token-{name}"} for name in SERVICES]
    c.GPUSpawner.catalog_file = str(CATALOG)
    return c


def test_the_services_listen_on_the_hub_pods_ports_behind_the_hub_service():
    args = chartconfig.setup_arguments({"prometheusUrl": "http://prom.monitoring.svc"})
    assert (args["culler_url"], args["admin_url"], args["user_service_url"]) == (
        "http://hub:10101",
        "http://hub:10102",
        "http://hub:10103",
    )
    assert args["ip"] == "0.0.0.0"
    assert args["culler_args"] == ["--config=/etc/gpuspawner/config/culler_config.json"]
    assert args["admin_args"] == ["--config=/etc/gpuspawner/config/admin_config.json"]
    assert args["prometheus_url"] == "http://prom.monitoring.svc"
    assert args["warning_url"] == "http://proxy-public/services/gpuspawner-culler/"
    # every service on unless the values turn it off; admin users: the hub's (None)
    assert (args["culler"], args["admin"], args["user_service"]) == (True, True, True)
    assert args["admin_users"] is None


def test_admin_users_and_groups_are_passed_as_given():
    args = chartconfig.setup_arguments({"admin": {"users": [], "groups": ["gpu-admins"]}})
    assert args["admin_users"] == () and args["admin_groups"] == ("gpu-admins",)


def test_the_cullers_kueue_cluster_queues_reach_its_command_line():
    """They win over culler_config.json, and the culler reads them (GPUCuller's trait)."""
    from .culler.test_app import make

    args = chartconfig.setup_arguments({"culler": {"kueueClusterQueues": ["notebooks", "batch"]}})
    assert args["culler_args"][1:] == [
        "--GPUCuller.kueue_cluster_queues=notebooks",
        "--GPUCuller.kueue_cluster_queues=batch",
    ]
    assert make(args["culler_args"][1:]).kueue_cluster_queues == ["notebooks", "batch"]


def test_configure_adds_the_services_turned_on_and_drops_the_others(tmp_path):
    c = z2jh_config()
    config_dir = write_settings(
        tmp_path,
        culler={"enabled": True},
        admin={"enabled": False},
        userService={"enabled": True},
        inventoryAllNamespaces=True,
    )
    added = chartconfig.configure(c, config_dir)
    assert sorted(added) == ["gpuspawner", "gpuspawner-culler"]
    by_name = {s["name"]: s for s in c.JupyterHub.services}
    assert sorted(by_name) == ["gpuspawner", "gpuspawner-culler"]
    culler = by_name["gpuspawner-culler"]
    assert culler["api_token"] == "token-gpuspawner-culler"  # z2jh's, kept
    assert culler["url"] == "http://hub:10101"
    assert f"--config={config_dir / 'culler_config.json'}" in culler["command"]
    assert c.GPUSpawner.gpu_inventory_all_namespaces is True


def test_an_unmounted_or_broken_settings_file_is_one_sentence(tmp_path):
    with pytest.raises(chartconfig.ChartConfigError, match="is the ConfigMap gpuspawner-config"):
        chartconfig.configure(z2jh_config(), tmp_path)
    (tmp_path / "settings.json").write_text("{not json")
    with pytest.raises(chartconfig.ChartConfigError, match="is not JSON"):
        chartconfig.read_settings(tmp_path)
    (tmp_path / "settings.json").write_text("[]")
    with pytest.raises(chartconfig.ChartConfigError, match="no mapping"):
        chartconfig.read_settings(tmp_path)


def test_accounting_settings_reach_the_spawner(tmp_path):
    c = z2jh_config()
    chartconfig.configure(c, write_settings(tmp_path, accounting={"enabled": True, "dbUrl": ""}))
    assert c.GPUSpawner.accounting_enabled is True
    # "": the hub's own database, so the spawner's default is left alone
    assert "accounting_db_url" not in c.GPUSpawner
    url = "postgresql://gpuspawner@db.example.org/usage"
    c = z2jh_config()
    chartconfig.configure(c, write_settings(tmp_path, accounting={"enabled": False, "dbUrl": url}))
    assert c.GPUSpawner.accounting_enabled is False
    assert c.GPUSpawner.accounting_db_url == url


def test_a_kueue_queue_puts_gpuspawner_on_kueue(tmp_path):
    c = z2jh_config()
    config_dir = write_settings(
        tmp_path, kueue={"queue": "gpu-notebooks", "priorityClass": "interactive"}
    )
    chartconfig.configure(c, config_dir)
    assert c.GPUSpawner.kueue_queue == "gpu-notebooks"
    assert c.GPUSpawner.kueue_priority_class == "interactive"
    # no queue named: Kueue stays off (the trait's default, not set here)
    c = z2jh_config()
    (tmp_path / "off").mkdir()
    chartconfig.configure(c, write_settings(tmp_path / "off", kueue={"queue": ""}))
    assert "kueue_queue" not in c.GPUSpawner
