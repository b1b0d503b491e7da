"""What a selection changes in the pod, from plain data (KubeSpawner builds the pod: test_spawner)."""

import copy

import pytest

from gpuspawner.core import labels
from gpuspawner.core.catalog import parse_catalog
from gpuspawner.core.options import resolve_selection
from gpuspawner.core.podspec import (
    MANAGED_TRAITS,
    gpu_resource_names,
    pod_annotations,
    pod_labels,
    requests_gpu,
    trait_values,
    validation_container,
    visible_devices_env,
)

CATALOG = parse_catalog(
    {
        "images": {
            "pytorch": {
                "image": "example/pytorch:2.9",
                "cpu_guarantee": 2,
                "mem_limit": "16G",
                "env": {"HF_HOME": "/data/hf"},
            },
        },
        "gpu_types": {
            "a100": {
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            },
            "t4": {
                "node_affinity": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}
                ],
                "counts": [1, 2],
            },
            "mig": {"resource": "nvidia.com/mig-1g.10gb", "weight": 0.142857, "counts": [1, 2]},
        },
    }
)

ADMIN = {
    "image": "admin/default:1",
    "cpu_guarantee": 0.5,
    "cpu_limit": 4,
    "mem_guarantee": "1G",
    "mem_limit": "2G",
    "extra_resource_limits": {"example.com/fpga": "1", "nvidia.com/gpu": "8"},
    "extra_resource_guarantees": {"nvidia.com/gpu": "8"},
    "node_selector": {"pool": "notebooks"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "hub"}],
    "node_affinity_required": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ],
    "environment": {"A": "b", "NVIDIA_VISIBLE_DEVICES": "all"},
    "init_containers": [{"name": "block-cloud-metadata", "image": "busybox"}],
}

CHECK = {"name": labels.VALIDATION_CONTAINER_NAME, "image": "x"}


def select(gpu_type=None, gpus=0):
    options = {"profile": "pytorch", "gpus": str(gpus)}
    if gpu_type:
        options["gpu_type"] = gpu_type
    return resolve_selection(options, CATALOG)


def values_for(selection, admin=ADMIN, check=CHECK):
    return trait_values(admin, selection, CATALOG, check_container=check)


def test_every_managed_trait_is_computed():
    assert set(values_for(select("a100", 2))) == set(MANAGED_TRAITS)


def test_gpu_selection_adds_resources_placement_and_env_to_the_admins_values():
    before = copy.deepcopy(ADMIN)
    values = values_for(select("a100", 2))
    assert ADMIN == before  # the admin's values are never changed in place
    assert values["image"] == "example/pytorch:2.9"
    # the image's own cpu/mem values win; the others stay the admin's
    assert (values["cpu_guarantee"], values["cpu_limit"]) == (2, 4)
    # the catalog's Kubernetes quantity "16G" in whole bytes (10**9 each, as Kubernetes reads it)
    assert (values["mem_guarantee"], values["mem_limit"]) == ("1G", 16 * 10**9)
    # the admin's GPU resources are replaced by the selection's; requests equal limits
    assert values["extra_resource_limits"] == {"example.com/fpga": "1", "nvidia.com/gpu": "2"}
    assert values["extra_resource_guarantees"] == {"nvidia.com/gpu": "2"}
    assert values["node_selector"] == {
        "pool": "notebooks",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    assert values["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "hub"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert values["environment"] == {
        "A": "b",
        "HF_HOME": "/data/hf",
        labels.ENV_DRIVER_CAPABILITIES: labels.DRIVER_CAPABILITIES,
    }
    assert values["init_containers"] == [*ADMIN["init_containers"], CHECK]
    assert values["node_affinity_required"] == ADMIN["node_affinity_required"]


def test_cpu_only_selection_takes_every_gpu_away():
    values = values_for(select(gpus=0))
    assert values["extra_resource_limits"] == {"example.com/fpga": "1"}
    assert values["extra_resource_guarantees"] == {}
    assert values["node_selector"] == {"pool": "notebooks"}
    assert values["tolerations"] == ADMIN["tolerations"]
    assert values["init_containers"] == ADMIN["init_containers"]
    # the admin's NVIDIA_VISIBLE_DEVICES=all would expose the node's GPUs under the nvidia runtime
    assert values["environment"][labels.ENV_VISIBLE_DEVICES] == labels.VISIBLE_DEVICES_NONE
    assert labels.ENV_DRIVER_CAPABILITIES not in values["environment"]


def test_type_affinity_is_anded_into_every_admin_term():
    values = values_for(select("t4", 1))
    t4 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}
    assert [term["matchExpressions"] for term in values["node_affinity_required"]] == [
        [{"key": "zone", "operator": "In", "values": ["a"]}, t4],
        [{"key": "zone", "operator": "In", "values": ["b"]}, t4],
    ]
    alone = values_for(select("t4", 1), admin={**ADMIN, "node_affinity_required": []})
    assert alone["node_affinity_required"] == [{"matchExpressions": [t4]}]


def test_dict_shaped_admin_collections_keep_their_shape_and_nothing_repeats():
    admin = {
        **ADMIN,
        "tolerations": {
            "gpu": {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        },
        "init_containers": {"check": CHECK},
    }
    values = values_for(select("a100", 1), admin=admin)
    assert values["tolerations"] == admin["tolerations"]  # already tolerated: not added again
    assert values["init_containers"] == {"check": CHECK}


def test_mig_selection_requests_its_own_resource_and_no_whole_gpu():
    values = values_for(select("mig", 2))
    assert values["extra_resource_limits"] == {
        "example.com/fpga": "1",
        "nvidia.com/mig-1g.10gb": "2",
    }
    assert "nvidia.com/gpu" not in values["extra_resource_guarantees"]


def test_without_the_check_no_init_container_is_added():
    assert values_for(select("a100", 1), check=None)["init_containers"] == ADMIN["init_containers"]


def test_validation_container_asks_for_the_same_gpus_and_escapes_braces():
    container = validation_container(
        select("a100", 2),
        command=["python3", "-c", "print({'ok': 1})"],
        image_pull_policy="IfNotPresent",
    )
    assert container["name"] == labels.VALIDATION_CONTAINER_NAME
    assert container["image"] == "example/pytorch:2.9"  # the notebook's own image
    # KubeSpawner formats every init container string with str.format
    assert container["command"][2] == "print({{'ok': 1}})"
    assert container["command"][2].format() == "print({'ok': 1})"
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2"},
    }
    assert container["env"] == [
        {"name": labels.ENV_DRIVER_CAPABILITIES, "value": labels.DRIVER_CAPABILITIES}
    ]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["imagePullPolicy"] == "IfNotPresent"
    other = validation_container(select("a100", 1), command=["true"], image="example/check:1")
    assert other["image"] == "example/check:1" and "imagePullPolicy" not in other


def test_labels_and_annotations():
    assert pod_labels(select("mig", 2)) == {
        labels.LABEL_MANAGED: "true",
        labels.LABEL_PROFILE: "pytorch",
        labels.LABEL_GPU_TYPE: "mig",
        labels.LABEL_GPUS: "2",
    }
    assert pod_labels(select(gpus=0))[labels.LABEL_GPU_TYPE] == labels.NO_GPU_TYPE
    assert pod_labels(select(gpus=0))[labels.LABEL_GPUS] == "0"
    assert pod_annotations(select("mig", 2), ["students"]) == {
        labels.ANNOTATION_GPU_RESOURCE: "nvidia.com/mig-1g.10gb",
        labels.ANNOTATION_GPU_WEIGHT: "0.142857",
        labels.ANNOTATION_POOL_GROUPS: "students",
    }
    assert pod_annotations(select(gpus=0), []) == {}


def test_pod_annotations_carry_the_charge_group_and_the_idle_timeout():
    import dataclasses

    chosen = dataclasses.replace(select("a100", 1), idle_timeout=31_536_000.0)
    annotations = pod_annotations(chosen, [], "ml-team")
    assert annotations[labels.ANNOTATION_CHARGE_GROUP] == "ml-team"
    # a plain decimal of seconds, never "3.1536e+07"
    assert annotations[labels.ANNOTATION_IDLE_TIMEOUT] == "31536000"
    assert (
        pod_annotations(dataclasses.replace(chosen, idle_timeout=90.5), [])[
            labels.ANNOTATION_IDLE_TIMEOUT
        ]
        == "90.5"
    )
    # no group to charge, no idle timeout chosen: neither annotation
    assert not {labels.ANNOTATION_CHARGE_GROUP, labels.ANNOTATION_IDLE_TIMEOUT} & set(
        pod_annotations(select("a100", 1), [], "")
    )
    # a CPU server's hours are not counted: no charge group
    assert labels.ANNOTATION_CHARGE_GROUP not in pod_annotations(select(gpus=0), [], "ml-team")


def test_gpu_resource_names():
    assert gpu_resource_names(CATALOG) == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}


@pytest.mark.parametrize(
    "resources, expected",
    [
        (None, False),
        ({}, False),
        ({"limits": {"cpu": "2"}}, False),
        ({"limits": {"nvidia.com/gpu": "1"}}, True),
        ({"requests": {"nvidia.com/mig-1g.10gb": 2}}, True),
        ({"limits": {"nvidia.com/gpu": "0"}}, False),
        ({"limits": {"example.com/tpu": "1"}}, True),  # a catalog resource
        # an NVIDIA resource the catalog does not name is still a GPU
        ({"limits": {"nvidia.com/gpu.shared": "1"}}, True),
    ],
)
def test_requests_gpu(resources, expected):
    assert requests_gpu(resources, {"nvidia.com/gpu", "example.com/tpu"}) is expected


def test_visible_devices_env():
    assert visible_devices_env(False) == labels.VISIBLE_DEVICES_NONE
    assert visible_devices_env(True) is None  # the device plugin sets it


def test_catalog_memory_reaches_kubespawner_as_bytes_it_accepts():
    from kubespawner import KubeSpawner
    from traitlets import TraitError

    from gpuspawner.core.catalog import quantity_bytes

    assert quantity_bytes("768Mi") == 768 * 2**20
    assert quantity_bytes("1.5Gi") == 3 * 2**29
    assert quantity_bytes("8G") == 8 * 10**9
    assert quantity_bytes("2k") == 2000
    assert quantity_bytes("1000m") == 1
    assert quantity_bytes("1500m") == 2  # a fraction of a byte rounds up
    with pytest.raises(ValueError):
        quantity_bytes("8GB")
    # KubeSpawner's own trait refuses "768Mi" (the 500 a user got); the bytes pass it unchanged
    trait = KubeSpawner.class_traits()["mem_limit"]
    with pytest.raises(TraitError):
        trait.validate(None, "768Mi")
    assert trait.validate(None, quantity_bytes("768Mi")) == 768 * 2**20


def test_an_images_limit_below_the_admins_guarantee_brings_the_guarantee_down():
    """z2jh's singleuser.memory.guarantee (2G) with a catalog image limited to 768Mi
    would make a pod the API server refuses (a request above its limit)."""
    catalog = parse_catalog(
        {"images": {"small": {"image": "x", "mem_limit": "768Mi", "cpu_limit": 1}}}
    )
    admin = {**ADMIN, "mem_guarantee": 2 * 10**9, "mem_limit": None, "cpu_guarantee": 2.0}
    selection = resolve_selection({"profile": "small", "gpus": "0"}, catalog)
    values = trait_values(admin, selection, catalog, check_container=None)
    assert values["mem_limit"] == values["mem_guarantee"] == 768 * 2**20
    assert values["cpu_limit"] == values["cpu_guarantee"] == 1
    # A guarantee at or below the limit is left as it is.
    roomy = {**admin, "mem_guarantee": 512 * 2**20, "cpu_guarantee": 0.5}
    values = trait_values(roomy, selection, catalog, check_container=None)
    assert values["mem_guarantee"] == 512 * 2**20 and values["cpu_guarantee"] == 0.5
