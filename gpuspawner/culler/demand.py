"""The GPU demand the hub publishes, as the culler reads it. Pure: metrics text in, data out.

GPUSpawner publishes on the hub's ``/hub/metrics`` (see :mod:`gpuspawner.hub.metrics`):

- ``gpuspawner_gpu_demand{gpu_type,gpus,source}``: how many requests of each
  size wait for each GPU type: ``queued`` in the hub's queue, ``refused`` for
  lack of free GPUs lately, ``pending`` pods the scheduler cannot place;
- ``gpuspawner_node_gpus{gpu_type,node,figure="free"}``: the GPUs free on each
  node serving a type, with GPUs promised to starting servers counted as taken.

The culler takes the queued and refused requests from there and the pending
ones from its own list of pods (which also sees pods of other hub replicas),
so a pending pod is never counted twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from .policy import Request

DEMAND_METRIC = "gpuspawner_gpu_demand"
NODE_METRIC = "gpuspawner_node_gpus"
HUB_SOURCES = ("queued", "refused")


@dataclass(frozen=True)
class HubDemand:
    """The requests the hub holds back, and the free GPUs per type and node."""

    requests: tuple[Request, ...] = ()
    free: dict[str, dict[str, int]] = field(default_factory=dict)


def _count(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def parse_hub_metrics(text: str) -> HubDemand:
    """The hub's demand and per-node free GPUs from its metrics text.

    Samples that are malformed (a count that is not a whole number, a negative
    value) are left out rather than trusted.
    """
    requests: list[Request] = []
    free: dict[str, dict[str, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == DEMAND_METRIC:
                gpus = _count(labels.get("gpus", ""))
                source = labels.get("source", "")
                if gpus is None or gpus <= 0 or source not in HUB_SOURCES or sample.value < 1:
                    continue
                request = Request(gpu_type=labels.get("gpu_type", ""), gpus=gpus, source=source)
                requests.extend([request] * int(sample.value))
            elif sample.name == NODE_METRIC and labels.get("figure") == "free":
                gpu_type, node = labels.get("gpu_type", ""), labels.get("node", "")
                if gpu_type and node and sample.value >= 0:
                    free.setdefault(gpu_type, {})[node] = int(sample.value)
    return HubDemand(tuple(r for r in requests if r.gpu_type), free)


def total_by_type(requests: Iterable[Request]) -> dict[tuple[str, str], int]:
    """GPUs requested per (GPU type, source), for the culler's metrics and log."""
    totals: dict[tuple[str, str], int] = {}
    for r in requests:
        totals[(r.gpu_type, r.source)] = totals.get((r.gpu_type, r.source), 0) + r.gpus
    return totals
