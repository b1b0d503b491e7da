"""The hub's GPU metrics on /hub/metrics (JupyterHub's default registry).

``gpuspawner_gpu_seconds_total`` is read from the usage recorder, whose store
holds user names: none of them may reach the metrics.
"""

from __future__ import annotations

import json

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuspawner.clients import kube
from gpuspawner.core.usage import Interval
from gpuspawner.hub import metrics
from gpuspawner.hub import state as hubstate
from gpuspawner.hub.accounting import AccountingRecorder

from .test_accounting import RECORDED, Clock, FakeApi, scheduled

SECRET_USER = "alice-the-secret-user"


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_gpu_seconds_by_type_and_charge_group_never_by_user(usage_store):
    pod = json.loads((RECORDED / "stopped-by-hub.json").read_text())[6]["object"]
    start = scheduled(pod)
    store = usage_store
    # A server of the user's that ended before this hub started, charged to their group.
    store.open(
        Interval(
            "old-pod", SECRET_USER, "big", "ml-team", "h100", "pytorch", 4, 4.0, 0, 1000, "pod"
        )
    )
    state = hubstate.reset()
    try:
        recorder = state.accounting(
            lambda: AccountingRecorder(
                lambda: store,
                kube.Reader(),
                "jupyterhub",
                api=FakeApi(pods=[pod]),
                clock=Clock(start + 30),
            )
        )
        assert await recorder.wait_reconciled(30)
        text = generate_latest(REGISTRY).decode()
    finally:
        await state.close()
        hubstate.reset()
    assert samples(text, "gpuspawner_gpu_seconds_total") == {
        (("gpu_type", "h100"), ("group", "ml-team")): 4 * 1000.0,
        (("gpu_type", "a100"), ("group", "")): 30.0,  # ada's running server, until the scrape
    }
    assert SECRET_USER not in text
    assert '"ada"' not in text and "jupyter-ada" not in text


def test_without_a_recorder_the_counter_has_no_series():
    assert metrics.gpu_seconds_family(None).samples == []
    hubstate.reset()
    text = generate_latest(REGISTRY).decode()
    assert "# TYPE gpuspawner_gpu_seconds_total counter" in text
    assert samples(text, "gpuspawner_gpu_seconds_total") == {}
