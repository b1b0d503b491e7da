"""What a selection changes in the pod: resources, node selection, tolerations, env, labels, init container.

GPUSpawner does not edit KubeSpawner's pod after the fact where it can avoid
it. Instead, before each start, :func:`trait_values` computes the values of
KubeSpawner's own traits (``extra_resource_limits``, ``node_selector``,
``tolerations``, ``init_containers``, …) from the values the admin configured
plus the selection, and KubeSpawner builds the pod as usual. Because the
values are always recomputed from the admin's configuration, nothing
accumulates across restarts of a server, and whatever the admin set is merged
with, never replaced by, what GPUSpawner adds.

Two things are applied to the finished pod (:func:`pod_labels`,
:func:`pod_annotations`, :func:`visible_devices_env`) because they must hold
whatever an admin's hooks did.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from . import labels
from .catalog import Catalog, quantity_bytes
from .options import Selection
from .serverpod import is_gpu_resource

#: KubeSpawner traits GPUSpawner computes per start (from the admin's values + the selection).
MANAGED_TRAITS = (
    "image",
    "cpu_guarantee",
    "cpu_limit",
    "mem_guarantee",
    "mem_limit",
    "extra_resource_limits",
    "extra_resource_guarantees",
    "node_selector",
    "tolerations",
    "node_affinity_required",
    "environment",
    "init_containers",
)


def gpu_resource_names(catalog: Catalog) -> set[str]:
    """Every extended resource the catalog treats as a GPU."""
    return {t.resource for t in catalog.gpu_types.values()}


def _without_gpu_resources(resources: Mapping[str, Any] | None, gpu_resources: set[str]) -> dict:
    return {k: v for k, v in (resources or {}).items() if k not in gpu_resources}


def _add_to_collection(existing: Any, additions: Sequence[Mapping[str, Any]], prefix: str) -> Any:
    """Append to a KubeSpawner list-or-dict trait, keeping its shape and skipping duplicates."""
    additions = [copy.deepcopy(dict(a)) for a in additions]
    if isinstance(existing, Mapping):
        merged = dict(copy.deepcopy(existing))
        present = list(merged.values())
        for i, item in enumerate(additions):
            if item not in present:
                merged[f"{prefix}-{i}"] = item
        return merged
    merged_list = list(copy.deepcopy(existing or []))
    for item in additions:
        if item not in merged_list:
            merged_list.append(item)
    return merged_list


def _with_node_affinity(existing: Any, expressions: Sequence[Mapping[str, Any]]) -> Any:
    """AND the GPU type's match expressions into every required node selector term.

    Required terms are ORed by Kubernetes, so the type's expressions go into
    each term; without admin terms they form the only term.
    """
    if not expressions:
        return copy.deepcopy(existing)
    expressions = [dict(e) for e in expressions]
    terms = existing.values() if isinstance(existing, Mapping) else (existing or [])
    terms = [copy.deepcopy(dict(t)) for t in terms]
    if not terms:
        return [{"matchExpressions": expressions}]
    for term in terms:
        term["matchExpressions"] = list(term.get("matchExpressions") or []) + [
            e for e in expressions if e not in (term.get("matchExpressions") or [])
        ]
    return terms


def _format_escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def validation_container(
    selection: Selection,
    *,
    command: list[str],
    image: str | None = None,
    image_pull_policy: str | None = None,
) -> dict[str, Any]:
    """The init container that checks the allocated GPUs before the notebook starts.

    It asks for the same GPUs as the notebook: Kubernetes reuses init
    containers' requests for the app containers, so this costs nothing extra
    and the check sees exactly the devices the notebook will get.
    """
    assert selection.gpu_type is not None
    count = str(selection.gpus)
    container: dict[str, Any] = {
        "name": labels.VALIDATION_CONTAINER_NAME,
        "image": image or selection.image.image,
        # KubeSpawner expands {username}-style templates in every string of
        # init_containers with str.format; the check's source has braces.
        "command": [_format_escaped(part) for part in command],
        "env": [{"name": labels.ENV_DRIVER_CAPABILITIES, "value": labels.DRIVER_CAPABILITIES}],
        "resources": {
            "limits": {selection.gpu_type.resource: count},
            "requests": {selection.gpu_type.resource: count},
        },
        # The check writes its one-line reason to the termination log; when it
        # could not (read-only /dev), the last log line is used instead.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if image_pull_policy:
        container["imagePullPolicy"] = image_pull_policy
    return container


def trait_values(
    admin: Mapping[str, Any],
    selection: Selection,
    catalog: Catalog,
    *,
    check_container: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """KubeSpawner trait values for this selection, merged over the admin's ``admin`` values.

    ``admin`` holds the configured value of each name in :data:`MANAGED_TRAITS`.
    """
    gpu_resources = gpu_resource_names(catalog)
    image = selection.image
    values: dict[str, Any] = {
        "image": image.image,
        "cpu_guarantee": image.cpu_guarantee
        if image.cpu_guarantee is not None
        else admin["cpu_guarantee"],
        "cpu_limit": image.cpu_limit if image.cpu_limit is not None else admin["cpu_limit"],
        # The catalog holds Kubernetes quantities; KubeSpawner's byte traits take whole
        # bytes (its own 'M'/'G' suffixes are powers of 1024, and it refuses 'Mi').
        "mem_guarantee": quantity_bytes(image.mem_guarantee)
        if image.mem_guarantee is not None
        else admin["mem_guarantee"],
        "mem_limit": quantity_bytes(image.mem_limit)
        if image.mem_limit is not None
        else admin["mem_limit"],
    }
    # An image's limit below the admin's default guarantee (z2jh's
    # singleuser.memory.guarantee, say) would make a pod the API server refuses,
    # asking more than its limit: the guarantee follows the limit down. (The
    # catalog refuses an image whose own guarantee is above its own limit.)
    # KubeSpawner holds them as numbers (bytes, CPUs); anything else is left to it.
    for guarantee, limit in (("cpu_guarantee", "cpu_limit"), ("mem_guarantee", "mem_limit")):
        low, high = values[guarantee], values[limit]
        if _number(low) and _number(high) and high > 0 and low > high:
            values[guarantee] = high
    limits = _without_gpu_resources(admin["extra_resource_limits"], gpu_resources)
    requests = _without_gpu_resources(admin["extra_resource_guarantees"], gpu_resources)
    node_selector = dict(admin["node_selector"] or {})
    tolerations = copy.deepcopy(admin["tolerations"])
    affinity = copy.deepcopy(admin["node_affinity_required"])
    init_containers = copy.deepcopy(admin["init_containers"])

    environment = dict(admin["environment"] or {})
    environment.update(image.env)
    environment.pop(labels.ENV_VISIBLE_DEVICES, None)

    if selection.is_gpu and selection.gpu_type is not None:
        gpu_type = selection.gpu_type
        # Extended resources cannot be overcommitted: requests must equal limits.
        limits[gpu_type.resource] = str(selection.gpus)
        requests[gpu_type.resource] = str(selection.gpus)
        node_selector.update(gpu_type.node_selector)
        tolerations = _add_to_collection(tolerations, gpu_type.tolerations, "gpuspawner-toleration")
        affinity = _with_node_affinity(affinity, gpu_type.node_affinity)
        environment[labels.ENV_DRIVER_CAPABILITIES] = labels.DRIVER_CAPABILITIES
        if check_container is not None:
            init_containers = _add_to_collection(
                init_containers, [check_container], "gpuspawner-check"
            )
    else:
        environment[labels.ENV_VISIBLE_DEVICES] = labels.VISIBLE_DEVICES_NONE

    values.update(
        extra_resource_limits=limits,
        extra_resource_guarantees=requests,
        node_selector=node_selector,
        tolerations=tolerations,
        node_affinity_required=affinity,
        environment=environment,
        init_containers=init_containers,
    )
    return values


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def pod_labels(selection: Selection) -> dict[str, str]:
    """Labels that let limits, the culler and GPU metrics find the server's GPUs."""
    gpu_type = selection.gpu_type if selection.is_gpu else None
    return {
        labels.LABEL_MANAGED: "true",
        labels.LABEL_PROFILE: selection.image.key,
        labels.LABEL_GPU_TYPE: gpu_type.key if gpu_type else labels.NO_GPU_TYPE,
        labels.LABEL_GPUS: str(selection.gpus),
    }


def pod_annotations(
    selection: Selection, pool_groups: Sequence[str], charge_group: str = ""
) -> dict[str, str]:
    """Annotations recording how the GPUs are counted against limits and budgets.

    ``charge_group`` (:func:`gpuspawner.core.usage.charge_group`) is the group the
    server's GPU-hours are charged to; the selection's idle timeout is what the
    culler applies to this server.
    """
    out = {}
    if selection.is_gpu and selection.gpu_type is not None:
        out[labels.ANNOTATION_GPU_RESOURCE] = selection.gpu_type.resource
        out[labels.ANNOTATION_GPU_WEIGHT] = f"{selection.gpu_type.weight:g}"
        if charge_group:
            out[labels.ANNOTATION_CHARGE_GROUP] = charge_group
    if pool_groups:
        out[labels.ANNOTATION_POOL_GROUPS] = ",".join(pool_groups)
    if selection.idle_timeout is not None:
        # a plain decimal (never "1e+06"), as ServerPod reads it
        out[labels.ANNOTATION_IDLE_TIMEOUT] = f"{selection.idle_timeout:.3f}".rstrip("0").rstrip(
            "."
        )
    return out


def requests_gpu(resources: Mapping[str, Any] | None, gpu_resources: set[str]) -> bool:
    """Whether a container's ``resources`` (limits or requests) ask for any GPU resource."""
    resources = resources or {}
    for section in ("limits", "requests"):
        for name, value in (resources.get(section) or {}).items():
            if is_gpu_resource(name, gpu_resources) and str(value) not in ("0", ""):
                return True
    return False


def visible_devices_env(container_requests_gpu: bool) -> str | None:
    """The ``NVIDIA_VISIBLE_DEVICES`` a container must run with.

    A container that did not ask for a GPU gets ``void``, whatever its image or
    any configuration says, so that an image built with
    ``NVIDIA_VISIBLE_DEVICES=all`` cannot see the node's GPUs under the nvidia
    runtime. A container that asked for GPUs gets no value from us (None):
    the device plugin sets it to exactly the devices it allocated.
    """
    return None if container_requests_gpu else labels.VISIBLE_DEVICES_NONE
