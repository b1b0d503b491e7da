"""The catalog (+ the user's room, + live figures) as KubeSpawner's profile_list, with plain data."""

import pytest
from markupsafe import Markup

from gpuspawner.core.profiles import (
    MARK_NEVER,
    MARK_NOT_FREE,
    GPUDemand,
    build_profile_list,
    chosen_overrides,
    count_mark,
    gpu_demand,
    held_summary,
    listed_choices,
    listed_selection,
    merge_profile_lists,
    offered_counts,
    resource_type_key,
    slug_collisions,
)
from gpuspawner.inventory.model import Availability, NodeFigures


def figures(key, *nodes):
    """A type's figures: one (allocatable, requested) pair per ready node."""
    return Availability(
        key=key,
        resource="nvidia.com/gpu",
        display_name=key,
        nodes=tuple(NodeFigures(f"{key}-{i}", a, r) for i, (a, r) in enumerate(nodes)),
    )


def by_slug(profiles):
    return {p["slug"]: p for p in profiles}


def choices(profile, option):
    return profile["profile_options"][option]["choices"]


def labels(profile, option):
    return {k: c["display_name"] for k, c in choices(profile, option).items()}


def defaults(profile, option):
    return [k for k, c in choices(profile, option).items() if c["default"]]


def test_one_profile_per_image_with_its_types_and_counts(pools_catalog):
    profiles = build_profile_list(pools_catalog)
    assert [p["slug"] for p in profiles] == ["pytorch", "tensorflow", "licensed"]
    pytorch, tensorflow, _ = profiles
    assert pytorch["display_name"] == "PyTorch" and pytorch["default"] is True
    assert tensorflow["default"] is False
    assert labels(pytorch, "gpu_type") == {
        "a100": "NVIDIA A100 (80 GB per GPU)",
        "h100": "NVIDIA H100",
        "mig": "A100 MIG 1g.10gb",
    }
    assert pytorch["profile_options"]["gpu_type"]["display_name"] == "GPU type"
    assert pytorch["profile_options"]["gpus"]["display_name"] == "Number of GPUs"
    # the union of the types' counts, and 0 where the image may run without GPUs
    assert labels(pytorch, "gpus") == {
        "0": "None (CPU only)",
        "1": "1 GPU",
        "2": "2 GPUs",
        "4": "4 GPUs",
        "8": "8 GPUs",
    }
    assert list(choices(tensorflow, "gpus")) == ["1", "2", "4"]  # allow_cpu: false, A100 only
    assert list(choices(tensorflow, "gpu_type")) == ["a100"]
    # the catalog's defaults are pre-selected; other images start at their smallest choice
    assert defaults(pytorch, "gpus") == ["0"] and defaults(pytorch, "gpu_type") == ["a100"]
    assert defaults(tensorflow, "gpus") == ["1"] and defaults(tensorflow, "gpu_type") == ["a100"]


def test_what_a_user_may_not_see_is_not_built(pools_catalog):
    profiles = build_profile_list(pools_catalog.visible_to("carol", ["research"]))
    assert [p["slug"] for p in profiles] == ["pytorch", "tensorflow"]
    assert "MATLAB" not in repr(profiles)


def test_room_leaves_out_types_and_counts_over_the_limit(pools_catalog):
    room = {"a100": 1, "h100": 0, "mig": None}
    profiles = by_slug(
        build_profile_list(pools_catalog, room, "You are using 1 of your 2 GPUs (servers: x).")
    )
    pytorch = profiles["pytorch"]
    assert list(choices(pytorch, "gpu_type")) == ["a100", "mig"]
    assert list(choices(pytorch, "gpus")) == ["0", "1", "2"]  # 2: MIG slices have room
    # a type was taken away, so the form says why
    assert pytorch["description"] == "You are using 1 of your 2 GPUs (servers: x)."
    assert list(choices(profiles["tensorflow"], "gpus")) == ["1"]


def test_no_room_at_all_keeps_the_smallest_choice_for_the_server_to_explain(pools_catalog):
    room = {"a100": 0, "h100": 0, "mig": 0}
    tensorflow = by_slug(
        build_profile_list(pools_catalog, room, "You are using 2 of your 2 GPUs.")
    )["tensorflow"]
    # TensorFlow needs a GPU: it stays visible with 1 A100, and a request is refused with why
    assert list(choices(tensorflow, "gpus")) == ["1"]
    assert list(choices(tensorflow, "gpu_type")) == ["a100"]
    pytorch = by_slug(build_profile_list(pools_catalog, room))["pytorch"]
    assert list(choices(pytorch, "gpus")) == ["0"]


def test_offered_counts(pools_catalog):
    pytorch = pools_catalog.images["pytorch"]
    assert offered_counts(pytorch, pools_catalog, None) == [0, 1, 2, 4, 8]
    assert offered_counts(pytorch, pools_catalog, {"a100": 2, "h100": 0, "mig": 0}) == [0, 1, 2]
    tensorflow = pools_catalog.images["tensorflow"]
    assert offered_counts(tensorflow, pools_catalog, {"a100": 0}) == []


@pytest.mark.parametrize(
    "count, nodes, mark",
    [
        (0, [(4, 4)], ""),  # CPU only is never marked
        (1, [(4, 3)], ""),
        (4, [(4, 0), (4, 4)], ""),
        (2, [(4, 3), (4, 3)], MARK_NOT_FREE),  # 2 free in all, but not on one node
        (8, [(4, 0)], MARK_NEVER),
        (1, [], MARK_NEVER),  # no node serves the type at all
    ],
)
def test_count_mark(count, nodes, mark):
    assert count_mark(count, figures("a100", *nodes)) == mark


def test_unknown_figures_mark_nothing():
    assert count_mark(8, None) == ""


def test_figures_a_form_cannot_refresh_say_when_they_were_counted(pools_catalog):
    availability = {"a100": figures("a100", (4, 4), (4, 3)), "h100": figures("h100", (8, 0))}
    live = by_slug(build_profile_list(pools_catalog, availability=availability))
    dated = by_slug(build_profile_list(pools_catalog, availability=availability, as_of="14:05 UTC"))
    assert labels(dated["pytorch"], "gpu_type")["a100"] == (
        "NVIDIA A100 (80 GB per GPU) \u2014 1 free of 8 (at most 1 on one node) as of 14:05 UTC"
    )
    # a type without figures has no time; counts and their marks are the same
    assert labels(dated["pytorch"], "gpu_type")["mig"] == labels(live["pytorch"], "gpu_type")["mig"]
    assert labels(dated["pytorch"], "gpus") == labels(live["pytorch"], "gpus")


def test_live_figures_label_the_types_and_mark_or_drop_counts(pools_catalog):
    availability = {
        "a100": figures("a100", (4, 4), (4, 3)),  # 1 free, nodes of 4
        "h100": figures("h100", (8, 0)),  # 8 free on one node
        "mig": figures("mig", (7, 7)),
    }
    profiles = by_slug(build_profile_list(pools_catalog, availability=availability))
    pytorch, tensorflow = profiles["pytorch"], profiles["tensorflow"]
    assert labels(pytorch, "gpu_type") == {
        "a100": "NVIDIA A100 (80 GB per GPU) \u2014 1 free of 8 (at most 1 on one node)",
        "h100": "NVIDIA H100 \u2014 8 free of 8",
        "mig": "A100 MIG 1g.10gb \u2014 0 free of 7",
    }
    # PyTorch may use the H100: every count fits it now, so nothing is marked
    assert labels(pytorch, "gpus") == {
        "0": "None (CPU only)",
        "1": "1 GPU",
        "2": "2 GPUs",
        "4": "4 GPUs",
        "8": "8 GPUs",
    }
    # TensorFlow only has the A100: 8 is no A100 count, 4 fits a node but not now
    assert labels(tensorflow, "gpus") == {
        "1": "1 GPU",
        "2": "2 GPUs (not free now)",
        "4": "4 GPUs (not free now)",
    }


def test_counts_no_node_could_ever_hold_are_not_offered(pools_catalog):
    availability = {"a100": figures("a100", (2, 0)), "h100": figures("h100", (2, 0))}
    tensorflow = by_slug(build_profile_list(pools_catalog, availability=availability))["tensorflow"]
    assert list(choices(tensorflow, "gpus")) == ["1", "2"]
    pytorch = by_slug(build_profile_list(pools_catalog, availability=availability))["pytorch"]
    # the MIG type has no figures, so its counts are not judged
    assert list(choices(pytorch, "gpus")) == ["0", "1", "2"]


@pytest.mark.parametrize(
    "used, limit, servers, text",
    [
        (2, 2, ["default", "exp1"], "You are using 2 of your 2 GPUs (servers: default, exp1)."),
        (2 / 7, 1, [], "You are using 0.29 of your 1 GPUs."),
        (0, 2, ["default"], ""),  # nothing held: nothing to say
        (3, None, ["a"], ""),  # unlimited
    ],
)
def test_held_summary(used, limit, servers, text):
    assert held_summary(used, limit, servers) == text


# ---------------------------------------------------------------------------
# an admin's profile_list beside the catalog
# ---------------------------------------------------------------------------

LISTED = [
    {
        "display_name": "Small <b>CPU</b>",
        "slug": "small",
        "description": "<i>2 CPUs</i>",
        "default": True,
        "kubespawner_override": {"cpu_limit": 2},
    },
    {
        "display_name": "Special",
        "slug": "special",
        "profile_options": {
            "size": {
                "display_name": "Size",
                "choices": {
                    "s": {"display_name": "S", "kubespawner_override": {"mem_limit": "2G"}},
                    "l": {
                        "display_name": "L",
                        "default": True,
                        "kubespawner_override": {"mem_limit": "8G"},
                    },
                },
                "unlisted_choice": {
                    "enabled": True,
                    "kubespawner_override": {"image": "example/{value}"},
                },
            }
        },
        "kubespawner_override": {"image": "example/special:1"},
    },
]


def test_listed_profiles_come_after_the_catalogs_and_its_default_stays(pools_catalog):
    catalog_profiles = build_profile_list(pools_catalog)
    merged = merge_profile_lists(catalog_profiles, LISTED)
    assert [p["slug"] for p in merged] == ["pytorch", "tensorflow", "licensed", "small", "special"]
    assert [p["slug"] for p in merged if p.get("default")] == ["pytorch"]
    # the admin's description is markup, as KubeSpawner shows it; the name is escaped by the form
    assert isinstance(merged[3]["description"], Markup)
    assert not isinstance(merged[3]["display_name"], Markup)
    # the given list is not changed
    assert LISTED[0]["default"] is True and not isinstance(LISTED[0]["description"], Markup)
    # with no catalog profile, the listed default stays
    assert merge_profile_lists([], LISTED)[0]["default"] is True


def test_slug_collisions_and_refusal_names(pools_catalog):
    listed = [*LISTED, {"display_name": "Torch", "slug": "pytorch"}]
    assert slug_collisions(pools_catalog.images, listed) == ["pytorch"]
    assert slug_collisions(pools_catalog.images, LISTED) == []
    assert listed_choices([{"slug": "x\n", "display_name": "A\x1b[31m"}]) == ["'x\\n' (A\\x1b[31m)"]


def test_chosen_overrides_follow_kubespawners_order():
    special = LISTED[1]
    assert chosen_overrides(special, {}) == [{"image": "example/special:1"}, {"mem_limit": "8G"}]
    assert chosen_overrides(special, {"size": "s"})[1] == {"mem_limit": "2G"}
    assert chosen_overrides(special, {"size--unlisted-choice": "x:1"})[1] == {
        "image": "example/{value}"
    }
    assert chosen_overrides({"slug": "bare"}, {}) == [{}]
    # the profile's own mappings, so callables can be resolved in place
    assert chosen_overrides(special, {})[0] is special["kubespawner_override"]


@pytest.mark.parametrize(
    "limits, guarantees, expected",
    [
        ({"nvidia.com/gpu": 1}, None, GPUDemand("nvidia.com/gpu", 1)),
        ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "2"}, GPUDemand("nvidia.com/gpu", 2)),
        (None, {"nvidia.com/mig-1g.10gb": "3"}, GPUDemand("nvidia.com/mig-1g.10gb", 3)),
        # the catalog's own GPU resources count too
        ({"example.com/accel": 4}, None, GPUDemand("example.com/accel", 4)),
        ({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}, GPUDemand("nvidia.com/gpu", 2)),
        ({"cpu-ish.example.com/thing": 3, "nvidia.com/gpu": 0}, None, None),
        (None, None, None),
    ],
)
def test_gpu_demand_from_a_profiles_resources(limits, guarantees, expected):
    assert gpu_demand(limits, guarantees, {"example.com/accel"}) == expected


@pytest.mark.parametrize(
    "limits, fragment",
    [
        ({"nvidia.com/gpu": "1.5"}, "'1.5', which is not a whole number of GPUs"),
        ({"nvidia.com/gpu": "{value}"}, "not a whole number"),
        ({"nvidia.com/gpu": True}, "not a whole number"),
        ({"nvidia.com/gpu": "1\n"}, "'1\\n'"),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1},
            "more than one GPU resource is asked for ('nvidia.com/gpu', 'nvidia.com/mig-1g.10gb')",
        ),
    ],
)
def test_gpu_demand_that_cannot_be_counted_is_an_error(limits, fragment):
    with pytest.raises(ValueError) as e:
        gpu_demand(limits, None)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_a_listed_gpu_is_the_catalogs_type_when_only_one_has_its_resource(pools_catalog):
    profile = {"slug": "gpu-box", "display_name": "GPU box"}
    mig = listed_selection(profile, "img:1", GPUDemand("nvidia.com/mig-1g.10gb", 2), pools_catalog)
    assert mig.gpu_type == pools_catalog.gpu_types["mig"] and mig.gpus == 2 and mig.is_gpu
    assert (mig.image.key, mig.image.display_name, mig.image.image) == (
        "gpu-box",
        "GPU box",
        "img:1",
    )
    # a100 and h100 both use nvidia.com/gpu: which one is not known, so it counts by resource name
    whole = listed_selection(profile, "img:1", GPUDemand("nvidia.com/gpu", 1), pools_catalog)
    assert whole.gpu_type.key == "nvidia.com-gpu" and whole.gpu_type.resource == "nvidia.com/gpu"
    assert whole.gpu_type.key not in pools_catalog.gpu_types and whole.gpu_type.weight == 1
    assert listed_selection(profile, "img:1", None, pools_catalog).is_gpu is False
    assert resource_type_key("x" * 80 + "/gpu") == "x" * 63
