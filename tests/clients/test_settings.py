"""The settings the culler and the admin service share: one set of names, honoured by both."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from gpuspawner.admin.service import GPUAdmin
from gpuspawner.culler.app import GPUCuller


def build(cls, config: Config, argv=()):
    config[cls.__name__].api_token = "t"
    app = cls(config=config)
    app.initialize(list(argv))
    return app


@pytest.mark.parametrize("cls", [GPUCuller, GPUAdmin])
def test_one_config_section_sets_the_metric_names_for_both(cls):
    config = Config()
    config.PrometheusSettings.prometheus_url = "http://127.0.0.1:9"
    config.PrometheusSettings.gpu_util_metric = "SITE_GPU_UTIL"
    config.PrometheusSettings.gpu_engine_metric = "SITE_ENGINE_ACTIVE"
    config.PrometheusSettings.pod_label = "exported_pod"
    config.PrometheusSettings.namespace_label = "exported_namespace"
    config[cls.__name__].kubernetes = "off"
    app = build(cls, config)
    client = app.prometheus if cls is GPUCuller else app.collector.prometheus
    promql = client.queries.activity("avg_over_time", 300)
    assert "SITE_GPU_UTIL{exported_pod!=" in promql
    assert "SITE_ENGINE_ACTIVE{exported_pod!=" in promql
    assert "by (exported_namespace, exported_pod)" in promql
    assert "DCGM" not in promql


def test_the_admin_page_takes_the_metric_names_on_its_command_line():
    config = Config()
    config.GPUAdmin.kubernetes = "off"
    app = build(
        GPUAdmin,
        config,
        ["--prometheus-url=http://127.0.0.1:9", "--GPUAdmin.gpu_util_metric=SITE_GPU_UTIL"],
    )
    assert app.collector.prometheus.queries.util_metric == "SITE_GPU_UTIL"
    assert app.collector.prometheus.queries.engine_metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


@pytest.mark.parametrize("cls", [GPUCuller, GPUAdmin])
def test_a_bad_metric_name_stops_either_service_with_one_sentence(cls, capfd):
    config = Config()
    config[cls.__name__].kubernetes = "off"
    config[cls.__name__].prometheus_url = "http://127.0.0.1:9"
    config[cls.__name__].gpu_util_metric = 'x"} or vector(1)'
    with pytest.raises(SystemExit) as stopped:
        build(cls, config)
    assert stopped.value.code == 1
    err = capfd.readouterr().err
    assert "is not a valid Prometheus name" in err and "Traceback" not in err


@pytest.mark.parametrize("cls", [GPUCuller, GPUAdmin])
def test_kubernetes_and_namespace(cls, monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("POD_NAMESPACE", "hub-ns")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr("gpuspawner.clients.kube.SERVICE_ACCOUNT", str(tmp_path))
    app = build(cls, Config())
    assert app.namespace == "hub-ns"
    assert app.kubernetes == "auto" and not app.use_kubernetes()  # no kubeconfig, no pod
    with pytest.raises(SystemExit):
        build(cls, Config(), ["--kubernetes=sometimes"])
    err = capfd.readouterr().err
    assert f"{cls.__name__}.kubernetes must be 'auto', 'on' or 'off', not 'sometimes'" in err
    assert "Traceback" not in err


def test_one_config_file_for_both_services(tmp_path):
    path = tmp_path / "gpuspawner_services_config.py"
    path.write_text(
        'c.PrometheusSettings.prometheus_url = "http://127.0.0.1:9"\n'
        'c.PrometheusSettings.gpu_util_metric = "SITE_GPU_UTIL"\n'
        'c.KubernetesSettings.kubernetes = "off"\n'
        "c.GPUCuller.cull_every = 60\n"
    )
    culler = build(GPUCuller, Config(), [f"--config={path}"])
    admin = build(GPUAdmin, Config(), [f"--config={path}", "--GPUAdmin.refresh_seconds=5"])
    assert culler.cull_every == 60 and culler.pods is None
    assert culler.prometheus.queries.util_metric == "SITE_GPU_UTIL"
    assert admin.collector.prometheus.queries.util_metric == "SITE_GPU_UTIL"
    assert admin.collector.kube is None and admin.refresh_seconds == 5


def test_service_endpoint_defaults_to_the_hubs_url_else_the_services_own_port(monkeypatch):
    from gpuspawner.clients.settings import ServiceEndpointSettings

    class Service(ServiceEndpointSettings):
        default_port = 10999

    monkeypatch.delenv("JUPYTERHUB_SERVICE_URL", raising=False)
    assert Service().listen_address() == (10999, "127.0.0.1")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_URL", "http://hub:10101")
    assert Service().service_url == "http://hub:10101"
    # in a pod the proxy reaches from another pod, it listens on every address of the pod
    assert Service(ip="0.0.0.0").listen_address() == (10101, "0.0.0.0")
    assert Service(service_url="http://127.0.0.5").listen_address() == (80, "127.0.0.5")


def test_admin_and_user_service_share_the_endpoint_and_catalog_settings(monkeypatch):
    from gpuspawner.admin.service import GPUAdmin
    from gpuspawner.userservice.app import UserService

    monkeypatch.delenv("JUPYTERHUB_SERVICE_URL", raising=False)
    monkeypatch.setenv("GPUSPAWNER_CATALOG", "/etc/gpuspawner/catalog.yaml")
    admin, users = GPUAdmin(), UserService()
    assert admin.listen_address() == (10102, "127.0.0.1")
    assert users.listen_address() == (10103, "127.0.0.1")
    assert admin.catalog_file == users.catalog_file == "/etc/gpuspawner/catalog.yaml"
