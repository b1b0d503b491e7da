"""GPU activity queries: names checked, answers read by the configured label names."""

from __future__ import annotations

import pytest

from gpuspawner.services.prometheus import GPUQueries, PrometheusError, parse_vector


def test_names_are_checked_so_nothing_is_injected_into_promql():
    with pytest.raises(ValueError):
        GPUQueries(pod_label='pod"} or vector(1) #')
    with pytest.raises(ValueError):
        GPUQueries(util_metric="1abc")
    q = GPUQueries(pod_label="exported_pod", namespace_label="exported_namespace")
    assert 'exported_pod!=""' in q.fresh_query()
    assert "by (exported_namespace, exported_pod)" in q.last_busy_query()


def test_error_answers_raise():
    with pytest.raises(PrometheusError):
        parse_vector({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(PrometheusError):
        parse_vector({"status": "success", "data": {"resultType": "matrix", "result": []}})


def test_answers_are_read_by_the_configured_label_names():
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {
                        "exported_namespace": "jupyterhub",
                        "exported_pod": "jupyter-ann",
                        "namespace": "gpu-operator",
                        "pod": "dcgm-exporter-x7k2p",
                    },
                    "value": [1764547200, "0.6"],
                }
            ],
        },
    }
    exported = GPUQueries(pod_label="exported_pod", namespace_label="exported_namespace")
    assert parse_vector(body, exported) == {("jupyterhub", "jupyter-ann"): 0.6}
    assert parse_vector(body) == {("gpu-operator", "dcgm-exporter-x7k2p"): 0.6}
    assert "exported_pod" in body["data"]["result"][0]["metric"]  # the answer is not rewritten
