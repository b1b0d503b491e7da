"""PromQL for GPU activity: label variants against a real Prometheus, answers parsed."""

from __future__ import annotations

import time

from gpuspawner.clients.prometheus import GPUQueries, PrometheusClient
from gpuspawner.culler.prometheus import gpu_view

from .dcgm import DCGMExporter
from .promserver import start_prometheus


async def test_exported_labels_without_honor_labels(tmp_path):
    """Scraped without honor_labels from a target that has pod/namespace labels of its own,
    the exporter's labels become exported_pod/exported_namespace; the culler finds them when
    told to, and treats the pods as missing (busy) when not."""
    exporter = DCGMExporter()
    exporter.assign("0", "jupyterhub", "jupyter-alice", 0)
    exporter.assign("2/7", "jupyterhub", "jupyter-bob", 60)  # a MIG slice: no GPU_UTIL series
    target = exporter.start()
    prometheus = start_prometheus(
        tmp_path,
        target,
        honor_labels=False,
        target_labels={"pod": "dcgm-exporter-x7k2p", "namespace": "gpu-operator"},
    )
    try:
        prometheus.wait_for('DCGM_FI_DEV_GPU_UTIL{exported_pod="jupyter-alice"}', bool)
        prometheus.wait_for('DCGM_FI_PROF_GR_ENGINE_ACTIVE{exported_pod="jupyter-bob"}', bool)
        time.sleep(1.5)
        exported = PrometheusClient(
            prometheus.url,
            GPUQueries(
                pod_label="exported_pod",
                namespace_label="exported_namespace",
                window=60,
                step=1,
                freshness=5,
            ),
        )
        view = await gpu_view(exported)
        assert set(view.samples) == {
            ("jupyterhub", "jupyter-alice"),
            ("jupyterhub", "jupyter-bob"),
        }
        assert view.samples[("jupyterhub", "jupyter-alice")].last_busy is None
        bob = view.samples[("jupyterhub", "jupyter-bob")].last_busy
        assert bob is not None and time.time() - bob < 5  # busy through GR_ENGINE_ACTIVE
        assert exported.requests == 2

        plain = PrometheusClient(prometheus.url, GPUQueries(window=60, step=1, freshness=5))
        view = await gpu_view(plain)
        # only the exporter's own pod label is left: none of the notebook pods match
        assert ("jupyterhub", "jupyter-alice") not in view.samples
    finally:
        prometheus.stop()
        exporter.stop()


def test_sample_fixture_has_the_exporters_shape():
    exporter = DCGMExporter()
    assert exporter.sample_devices() == ["0", "1", "2/7"]
    util_devices = {s.device for s in exporter.series if s.metric == "DCGM_FI_DEV_GPU_UTIL"}
    assert util_devices == {"0", "1"}  # the MIG instance reports no GPU_UTIL
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(exporter.render())}
    assert families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].type == "gauge"
