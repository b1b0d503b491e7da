"""The one reader of GPUSpawner's pods: what a pod says about its server (pure).

Limits, the hub's metrics, the culler, the admin page and the GPU check's
progress all read the same labels and annotations (:mod:`gpuspawner.core.labels`)
from pods as the API returns them (raw JSON, camelCase). They read them here,
through :meth:`ServerPod.from_pod`, so a label is parsed one way only. Also
here: which resource names are GPUs (:func:`is_gpu_resource`) and the
scheduler's "unschedulable" condition (:func:`unschedulable_message`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from . import labels
from .options import parse_count
from .stopreasons import REASON_PREEMPTED, CullWarning, StopNotice

#: Resource name prefixes counted as accelerators besides the catalog's own
#: resources: NVIDIA full GPUs, MIG slices and time-sliced replicas
#: (``nvidia.com/gpu.shared``), AMD, Intel and Habana devices.
GPU_RESOURCE_PREFIXES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "nvidia.com/mig-",
    "amd.com/gpu",
    "gpu.intel.com/",
    "habana.ai/",
)

_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def _phase(status: Mapping[str, Any]) -> str:
    """The pod's phase; "" when missing or not a string."""
    phase = status.get("phase")
    return phase if isinstance(phase, str) else ""


def _items(value: Any) -> list[Mapping[str, Any]]:
    """The mappings of a status list (conditions, container statuses); [] when it is not a list."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def is_gpu_resource(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a Kubernetes resource name is a GPU: one of ``extra`` (the catalog's) or a known prefix."""
    return name in extra or name.startswith(GPU_RESOURCE_PREFIXES)


def _add(total: dict[str, Any], more: Mapping[str, Any]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def effective_requests(
    pod_spec: Mapping[str, Any],
    container_requests: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    overhead: Mapping[str, Any],
) -> dict[str, Any]:
    """A pod's effective request as the scheduler (and Kueue) counts it, per resource.

    The containers' sum plus the sidecars' (init containers with ``restartPolicy:
    Always`` keep running beside everything started after them), or a regular init
    container with the sidecars started before it when that is more; plus the pod's
    ``overhead``. ``container_requests`` reads one container (which resources, parsed
    how: the inventory keeps accelerators only, as whole numbers); ``overhead`` is
    the pod's, read the same way.
    """
    apps: dict[str, Any] = {}
    for container in _items(pod_spec.get("containers")):
        _add(apps, container_requests(container))
    sidecars: dict[str, Any] = {}
    init_peak: dict[str, Any] = {}
    for container in _items(pod_spec.get("initContainers")):
        requests = container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            continue
        # A regular init container runs alone with the sidecars started before it.
        for name in set(requests) | set(sidecars):
            need = requests.get(name, 0) + sidecars.get(name, 0)
            init_peak[name] = max(init_peak.get(name, 0), need)
    _add(apps, sidecars)
    total = {name: max(apps.get(name, 0), init_peak.get(name, 0)) for name in {*apps, *init_peak}}
    _add(total, overhead)
    return total


def pod_is_active(pod: Mapping[str, Any]) -> bool:
    """Whether any pod holds (or waits for) resources: not finished and not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return _phase(pod.get("status") or {}) not in _FINISHED_PHASES


def selector(user_label: str | None = None) -> str:
    """The label selector of GPUSpawner's pods, of one user (KubeSpawner's escaped name) or all."""
    terms = [f"{labels.LABEL_MANAGED}=true"]
    if user_label is not None:
        terms.append(f"{labels.KUBESPAWNER_LABEL_USER}={user_label}")
    return ",".join(terms)


def is_managed(pod: Mapping[str, Any]) -> bool:
    """Whether GPUSpawner made the pod (it carries ``gpuspawner.io/managed=true``)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(labels.LABEL_MANAGED) == "true"


def unschedulable_message(pod: Mapping[str, Any] | None) -> str | None:
    """The scheduler's message while a pending, unbound pod is unschedulable, else None."""
    if not pod:
        return None
    status = pod.get("status") or {}
    if _phase(status) not in ("", "Pending") or (pod.get("spec") or {}).get("nodeName"):
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for condition in _items(status.get("conditions")):
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return condition.get("message") or ""
    return None


def parse_timestamp(text: Any) -> float | None:
    """An RFC 3339 time as the API writes it (``2026-11-29T22:41:10Z``) in Unix seconds; else None.

    A time without an offset is read as UTC (the API never writes one; a local reading would
    shift usage by the hub's time zone).
    """
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "Zz" else text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    except (ValueError, OverflowError):
        return None


def _positive_seconds(text: Any) -> float | None:
    """A positive, finite number of seconds from a decimal string; else None."""
    if not isinstance(text, str):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < math.inf else None


def _keep_until(text: Any) -> float | None:
    """``until`` of the keep annotation (``{"until": epoch, "seconds": …, "at": …}``); else None."""
    if not isinstance(text, str):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    until = data.get("until") if isinstance(data, dict) else None
    if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
        return None
    return float(until)


def scheduled_at(pod: Mapping[str, Any]) -> float | None:
    """When the scheduler bound the pod: its ``PodScheduled`` condition's True transition."""
    for condition in _items((pod.get("status") or {}).get("conditions")):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return parse_timestamp(condition.get("lastTransitionTime"))
    return None


def _finished_times(status: Mapping[str, Any], key: str) -> tuple[list[float], bool]:
    """The ``finishedAt`` of terminated containers under ``key``, and whether all have terminated."""
    times, all_done, seen = [], True, False
    for container in _items(status.get(key)):
        seen = True
        terminated = (container.get("state") or {}).get("terminated")
        when = (
            parse_timestamp(terminated.get("finishedAt"))
            if isinstance(terminated, Mapping)
            else None
        )
        if when is None:
            all_done = False
        else:
            times.append(when)
    return times, seen and all_done


def deletion_requested_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod's deletion was asked for: ``deletionTimestamp`` less its grace period."""
    meta = pod.get("metadata") or {}
    when = parse_timestamp(meta.get("deletionTimestamp"))
    if when is None:
        return None
    grace = meta.get("deletionGracePeriodSeconds")
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < math.inf:
        grace = 0
    return when - grace


def ended_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod stopped holding its GPUs; None while it runs.

    The pod has ended when it is Succeeded/Failed or all its (main) containers have
    terminated; it ended at the latest ``finishedAt`` of its terminated containers, init
    containers included (a pod whose GPU check failed never started its notebook). A
    finished pod without any such time (evicted from a lost node) ended when its deletion
    was asked for, else at its conditions' latest transition. A pod still running while
    being deleted has not ended: its GPUs are held until its containers stop.
    """
    status = pod.get("status") or {}
    main, main_done = _finished_times(status, "containerStatuses")
    init, _ = _finished_times(status, "initContainerStatuses")
    if _phase(status) not in _FINISHED_PHASES and not main_done:
        return None
    if main or init:
        return max(main + init)
    deleted = deletion_requested_at(pod)
    if deleted is not None:
        return deleted
    transitions = [
        parse_timestamp(c.get("lastTransitionTime")) for c in _items(status.get("conditions"))
    ]
    return max((t for t in transitions if t is not None), default=None)


def pod_stop_notice(pod: Mapping[str, Any]) -> StopNotice | None:
    """Why the pod is being stopped: the notice its stopper wrote on it
    (``gpuspawner.io/stop-reason``), else Kueue's preemption (which writes none), else None.

    A readable annotation wins: whoever wrote it stopped the server first.
    """
    # core.kueue reads pods' resources with this module's is_gpu_resource: imported here,
    # when first needed, so that neither module needs the other half-loaded
    from . import kueue

    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    notice = StopNotice.from_state(annotations.get(labels.ANNOTATION_STOP_REASON))
    if notice is not None or not kueue.was_preempted(pod):
        return notice
    # when Kueue marked it (its TerminationTarget condition), else when it asked for the delete
    condition = kueue.termination(pod) or {}
    at = parse_timestamp(condition.get("lastTransitionTime"))
    at = at if at is not None else deletion_requested_at(pod)
    if at is None:
        return None
    return StopNotice(REASON_PREEMPTED, at, detail=kueue.preemption_cause(pod))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _weight(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


@dataclass(frozen=True)
class ServerPod:
    """What one of GPUSpawner's pods says about its server."""

    name: str
    namespace: str
    #: The hub's user and server names (KubeSpawner's annotations); "" when missing.
    user: str
    server: str
    profile: str | None
    #: The catalog GPU type key; None for CPU-only servers (and pods without GPUs).
    gpu_type: str | None
    gpus: int
    #: GPU units per GPU as recorded at spawn; None when not recorded.
    weight: float | None
    pool_groups: tuple[str, ...]
    #: The Kubernetes resource the GPUs were requested as.
    gpu_resource: str
    node: str
    phase: str
    deleting: bool
    created: str
    #: The scheduler's message while the pod cannot be placed, else None.
    unschedulable: str | None
    #: Why it is being stopped (``gpuspawner.io/stop-reason``, else Kueue's preemption:
    #: :func:`pod_stop_notice`); None when not recorded or unreadable.
    stop_notice: StopNotice | None = None
    #: The culler's pending warning (``gpuspawner.io/cull-warning``); None when none or unreadable.
    cull_warning: CullWarning | None = None
    #: The group its GPU-hours are charged to (``gpuspawner.io/charge-group``); "" when not recorded.
    charge_group: str = ""
    #: The user's chosen idle timeout in seconds (``gpuspawner.io/idle-timeout``); None when none.
    idle_timeout: float | None = None
    #: Kept by its user until then (``gpuspawner.io/keep-until``, Unix seconds); None when not kept.
    keep_until: float | None = None
    #: The pod as the API returned it: the times below are read from it when first asked
    #: for, as only accounting needs them and parsing them costs a few µs per pod.
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: The pod's Kubernetes uid: one per pod, so one usage interval per uid.
    uid: str = ""

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> ServerPod:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        gpu_type = pod_labels.get(labels.LABEL_GPU_TYPE)
        gpus = parse_count(pod_labels.get(labels.LABEL_GPUS, "0")) or 0
        if gpu_type in (None, "", labels.NO_GPU_TYPE) or gpus <= 0:
            gpu_type, gpus = None, 0
        pools = annotations.get(labels.ANNOTATION_POOL_GROUPS) or ""
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            user=annotations.get(labels.KUBESPAWNER_ANNOTATION_USER) or "",
            server=annotations.get(labels.KUBESPAWNER_ANNOTATION_SERVER) or "",
            profile=pod_labels.get(labels.LABEL_PROFILE) or None,
            gpu_type=gpu_type,
            gpus=gpus,
            weight=_weight(annotations.get(labels.ANNOTATION_GPU_WEIGHT)),
            pool_groups=tuple(g for g in pools.split(",") if g),
            gpu_resource=annotations.get(labels.ANNOTATION_GPU_RESOURCE)
            or labels.DEFAULT_GPU_RESOURCE,
            node=(pod.get("spec") or {}).get("nodeName") or "",
            phase=_phase(pod.get("status") or {}),
            deleting=bool(meta.get("deletionTimestamp")),
            created=meta.get("creationTimestamp") or "",
            unschedulable=unschedulable_message(pod),
            stop_notice=pod_stop_notice(pod),
            cull_warning=CullWarning.from_state(annotations.get(labels.ANNOTATION_CULL_WARNING)),
            charge_group=_text(annotations.get(labels.ANNOTATION_CHARGE_GROUP)),
            idle_timeout=_positive_seconds(annotations.get(labels.ANNOTATION_IDLE_TIMEOUT)),
            keep_until=_keep_until(annotations.get(labels.ANNOTATION_KEEP_UNTIL)),
            raw=pod,
            uid=_text(meta.get("uid")),
        )

    @cached_property
    def scheduled_at(self) -> float | None:
        """When its GPUs became its own (the scheduler bound it: ``PodScheduled`` True); None before."""
        return scheduled_at(self.raw)

    @cached_property
    def ended_at(self) -> float | None:
        """When it stopped holding them (:func:`ended_at`); None while it runs."""
        return ended_at(self.raw)

    @cached_property
    def deleted_at(self) -> float | None:
        """When its deletion was asked for (:func:`deletion_requested_at`); None when not deleted."""
        return deletion_requested_at(self.raw)

    @property
    def key(self) -> tuple[str, str]:
        """(user, server name) as the hub names the server."""
        return self.user, self.server

    @property
    def has_gpus(self) -> bool:
        return self.gpu_type is not None

    @property
    def active(self) -> bool:
        """Holds (or waits for) its GPUs: not finished and not being deleted."""
        return not self.deleting and self.phase not in _FINISHED_PHASES

    @property
    def terminated(self) -> bool:
        """Finished (Succeeded/Failed) or being deleted: it holds nothing any more."""
        return not self.active

    @property
    def pending(self) -> bool:
        """Active and in phase Pending: waiting for a node, or bound and starting (pulling, GPU check)."""
        return self.active and self.phase == "Pending"

    @property
    def bound(self) -> bool:
        """Placed on a node (``spec.nodeName``): from then on it holds its GPUs there."""
        return bool(self.node)

    @property
    def waiting_for_gpus(self) -> bool:
        """The scheduler left it pending for lack of its own GPU resource."""
        return (
            self.unschedulable is not None
            and f"Insufficient {self.gpu_resource}" in self.unschedulable
        )


def server_pods(pods: Iterable[Mapping[str, Any]]) -> list[ServerPod]:
    """:meth:`ServerPod.from_pod` of each pod."""
    return [ServerPod.from_pod(pod) for pod in pods]
