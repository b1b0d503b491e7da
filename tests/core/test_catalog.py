import os
import shutil

import pytest
import yaml

from gpuspawner.core.catalog import (
    DEFAULT_GPU_RESOURCE,
    BudgetRules,
    CatalogError,
    CatalogFile,
    IdleTimeoutBounds,
    load_catalog_file,
    parse_catalog,
    parse_duration_text,
)

from ..conftest import FIXTURES, REPO

CATALOGS = FIXTURES / "catalogs"


def test_example_catalog_loads_with_every_section(example_catalog):
    assert list(example_catalog.images) == ["pytorch", "tensorflow"]
    assert example_catalog.images["pytorch"].cuda == "13.2"
    assert example_catalog.images["tensorflow"].gpu_types == ("a100", "t4")
    a100 = example_catalog.gpu_types["a100"]
    assert a100.resource == DEFAULT_GPU_RESOURCE
    assert a100.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    # the common NoSchedule taint is tolerated unless a type says otherwise
    assert a100.tolerations == (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    )
    mig = example_catalog.gpu_types["a100-mig-1g"]
    assert mig.is_mig and not a100.is_mig
    assert mig.weight == pytest.approx(1 / 7, rel=1e-3)
    assert example_catalog.counts_for_type(example_catalog.gpu_types["t4"]) == (1, 2)
    assert example_catalog.counts_for_type(a100) == (1, 2, 4, 8)
    assert example_catalog.defaults.image == "pytorch"
    assert example_catalog.defaults.gpus == 0
    assert example_catalog.limits.users["alice"].total is None
    assert example_catalog.limits.groups["students"].per_type == {"h100": 0}
    assert example_catalog.limits.group_pools == {"students": 6}


def test_traitlets_dict_and_yaml_file_give_the_same_catalog():
    data = yaml.safe_load((REPO / "config" / "catalog.yaml").read_text())
    from_dict = parse_catalog(data, "c.GPUSpawner.catalog")
    from_file = load_catalog_file(REPO / "config" / "catalog.yaml")
    assert from_dict.images == from_file.images
    assert from_dict.gpu_types == from_file.gpu_types
    assert from_dict.limits == from_file.limits
    assert from_dict.defaults == from_file.defaults


def test_minimal_catalog_defaults_to_cpu_only():
    catalog = load_catalog_file(CATALOGS / "minimal.yaml")
    assert catalog.defaults.image == "base"
    assert catalog.defaults.gpu_type is None
    assert catalog.defaults.gpus == 0
    assert catalog.limits.default.total is None  # no limits section: unlimited


@pytest.mark.parametrize(
    "name, expected",
    [
        (
            "bad-unknown-key.yaml",
            "bad-unknown-key.yaml: gpu_types.a100.node_selecter: unknown key 'node_selecter'; "
            "did you mean 'node_selector'? expected one of:",
        ),
        (
            "bad-count.yaml",
            "bad-count.yaml: gpu_types.a100.counts[1]: expected a whole number >= 1, got 'two'",
        ),
        ("bad-yaml.yaml", "bad-yaml.yaml: invalid YAML at line "),
        (
            "bad-limit.yaml",
            "bad-limit.yaml: limits.groups.ml.gpus: expected a number of GPUs >= 0 or 'unlimited', got -2",
        ),
        (
            "bad-image-type.yaml",
            "bad-image-type.yaml: images.pytorch.gpu_types[1]: unknown GPU type 'v100'; defined types: a100",
        ),
        ("empty.yaml", "empty.yaml: the catalog file is empty"),
        ("does-not-exist.yaml", "does-not-exist.yaml: the catalog file does not exist"),
    ],
)
def test_bad_files_name_file_key_and_problem_in_one_line(name, expected):
    with pytest.raises(CatalogError) as info:
        load_catalog_file(CATALOGS / name)
    message = str(info.value)
    assert str(CATALOGS / name) in message
    assert expected in message
    assert "\n" not in message
    assert "Traceback" not in message


@pytest.mark.parametrize(
    "data, path, fragment",
    [
        ({}, "images", "at least one image"),
        ({"images": {"Bad_Key": {"image": "x"}}}, "images.Bad_Key", "is not a valid key"),
        ({"images": {"a": {}}}, "images.a.image", "needs an image reference"),
        ({"images": {"a": {"image": "x", "cuda": "twelve"}}}, "images.a.cuda", "CUDA version"),
        (
            {"images": {"a": {"image": "x", "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}}},
            "images.a.env.NVIDIA_VISIBLE_DEVICES",
            "set by gpuspawner",
        ),
        (
            {"images": {"a": {"image": "x"}}, "gpu_types": {"g": {"resource": "gpu"}}},
            "gpu_types.g.resource",
            "extended resource name",
        ),
        (
            {"images": {"a": {"image": "x"}}, "gpu_types": {"g": {"counts": [0]}}},
            "gpu_types.g.counts[0]",
            ">= 1",
        ),
        (
            {"images": {"a": {"image": "x"}}, "gpu_types": {"g": {"counts": [1, 1]}}},
            "gpu_types.g.counts",
            "must not repeat",
        ),
        (
            {"images": {"a": {"image": "x"}}, "gpu_types": {"g": {"weight": 0}}},
            "gpu_types.g.weight",
            "positive number",
        ),
        (
            {
                "images": {"a": {"image": "x"}},
                "gpu_types": {"g": {"tolerations": [{"effect": "Never"}]}},
            },
            "gpu_types.g.tolerations[0].effect",
            "expected one of",
        ),
        (
            {
                "images": {"a": {"image": "x"}},
                "gpu_types": {"g": {"node_affinity": [{"key": "k", "operator": "Like"}]}},
            },
            "gpu_types.g.node_affinity[0].operator",
            "expected one of",
        ),
        (
            {
                "images": {
                    "a": {"image": "x", "default": True},
                    "b": {"image": "y", "default": True},
                }
            },
            "images",
            "only one image may be the default",
        ),
        (
            {"images": {"a": {"image": "x"}}, "defaults": {"image": "zzz"}},
            "defaults.image",
            "unknown image 'zzz'",
        ),
        (
            {
                "images": {"a": {"image": "x", "allow_cpu": False}},
                "gpu_types": {"g": {}},
                "defaults": {"gpus": 0},
            },
            "defaults.gpus",
            "may not run without GPUs",
        ),
        ({"images": {"a": {"image": "x", "allow_cpu": False}}}, "images.a", "neither without GPUs"),
        (
            {"images": {"a": {"image": "x"}}, "limits": {"users": {"u": "lots"}}},
            "limits.users.u",
            "'unlimited'",
        ),
        (
            {"images": {"a": {"image": "x"}}, "limits": {"default": {"per_type": {"h100": 1}}}},
            "limits.default.per_type.h100",
            "unknown GPU type",
        ),
        (
            {"images": {"a": {"image": "x"}}, "limits": {"default": True}},
            "limits.default",
            "expected a number of GPUs",
        ),
        (
            {"images": {"a": {"image": "x"}}, "gpu_counts": [1, 2]},
            "gpu_counts",
            "0 must be an allowed count",
        ),
        (
            {"images": {"a": {"image": "x", "mem_guarantee": "lots"}}},
            "images.a.mem_guarantee",
            "Kubernetes quantity",
        ),
        (
            {"images": {"a": {"image": "x", "mem_guarantee": "2Gi", "mem_limit": "1Gi"}}},
            "images.a.mem_guarantee",
            "'2Gi' is above mem_limit '1Gi'; Kubernetes refuses a pod that requests more",
        ),
        (
            {"images": {"a": {"image": "x", "cpu_guarantee": 4, "cpu_limit": 2}}},
            "images.a.cpu_guarantee",
            "4 is above cpu_limit 2",
        ),
        ("not a mapping", "", "expected a mapping"),
        (
            {"images": {"a": {"image": "x"}, "b": {"image": "y", "groups": "licensed"}}},
            "images.b.groups",
            "expected a list of groups, such as ['licensed'], got 'licensed'",
        ),
        (
            {"images": {"a": {"image": "x"}, "b": {"image": "y", "users": ["ann", 7]}}},
            "images.b.users[1]",
            "expected a non-empty string, got 7",
        ),
        (
            {"images": {"a": {"image": "x"}, "b": {"image": "y", "groups": []}}},
            "images.b.groups",
            "no group or user is named, so nobody could use this image",
        ),
        (
            {"images": {"a": {"image": "x"}, "b": {"image": "y", "groups": [], "users": []}}},
            "images.b.groups",
            "nobody could use this image",
        ),
        (
            {"images": {"a": {"image": "x", "groups": ["staff"]}}},
            "images",
            "every image names groups or users, but an empty request starts the default image",
        ),
        (
            {
                "images": {
                    "a": {"image": "x"},
                    "b": {"image": "y", "users": ["ann"], "default": True},
                }
            },
            "images.b.default",
            "the default image 'b' names groups or users",
        ),
        (
            {
                "images": {"a": {"image": "x"}, "b": {"image": "y", "users": ["ann"]}},
                "defaults": {"image": "b"},
            },
            "defaults.image",
            "choose an image open to everyone as the default",
        ),
    ],
)
def test_invalid_values_are_reported_with_their_key_path(data, path, fragment):
    with pytest.raises(CatalogError) as info:
        parse_catalog(data, "c.GPUSpawner.catalog")
    assert info.value.path == path
    assert fragment in str(info.value)
    assert str(info.value).startswith("c.GPUSpawner.catalog")


def test_image_access_by_group_or_user():
    catalog = parse_catalog(
        {
            "images": {
                "restricted-first": {
                    "image": "r",
                    "groups": ["licensed", "staff"],
                    "users": ["ann"],
                },
                "open": {"image": "o"},
                "by-name": {"image": "n", "users": ["bob", "bob"]},
            }
        }
    )
    # the first image is restricted, so the default is the first one open to everyone
    assert catalog.defaults.image == "open"
    restricted = catalog.images["restricted-first"]
    assert restricted.restricted and not catalog.images["open"].restricted
    assert restricted.groups == ("licensed", "staff") and restricted.users == ("ann",)
    assert catalog.images["by-name"].users == ("bob",) and catalog.images["by-name"].groups is None
    assert restricted.allows("zed", ["staff"]) and restricted.allows("ann", [])
    assert not restricted.allows("zed", ["students"]) and not restricted.allows("bob", [])
    assert restricted.describe_access() == "groups 'licensed', 'staff'; users 'ann'"
    assert catalog.images["open"].describe_access() == "everyone"

    assert list(catalog.visible_to("zed", []).images) == ["open"]
    assert list(catalog.visible_to("zed", ["staff"]).images) == ["restricted-first", "open"]
    assert list(catalog.visible_to("bob", []).images) == ["open", "by-name"]
    # what a user sees changes nothing else
    mine = catalog.visible_to("zed", [])
    assert (mine.gpu_types, mine.limits, mine.defaults) == (
        catalog.gpu_types,
        catalog.limits,
        catalog.defaults,
    )
    assert catalog.visible_to("bob", ["staff"]) is catalog  # sees everything: the same object


def test_catalog_file_reloads_on_change_and_keeps_last_good(tmp_path):
    path = tmp_path / "catalog.yaml"
    shutil.copy(CATALOGS / "minimal.yaml", path)
    source = CatalogFile(path)
    first, loaded = source.get()
    assert loaded and list(first.images) == ["base"]
    again, loaded = source.get()
    assert again is first and not loaded

    path.write_text("images:\n  other:\n    image: example/other:1\n")
    os.utime(path, ns=(1, 10**18))  # a different mtime even on coarse clocks
    second, loaded = source.get()
    assert loaded and list(second.images) == ["other"]

    path.write_text("images:\n  broken: [\n")
    os.utime(path, ns=(1, 2 * 10**18))
    kept, loaded = source.get()
    assert kept is second and not loaded
    assert source.last_error is not None and "invalid YAML" in str(source.last_error)


def test_catalog_file_that_never_loaded_raises(tmp_path):
    source = CatalogFile(tmp_path / "missing.yaml")
    with pytest.raises(CatalogError, match="does not exist"):
        source.get()


def test_shipped_catalogs_name_the_images_the_matrix_builds():
    """config/ catalogs and the images' version matrix never disagree on tags or CUDA versions."""
    from gpuspawner.images.matrix import load_matrix
    from gpuspawner.images.plan import catalog_entries

    built = {
        e["image"].rsplit("/", 1)[1]: e["cuda"]
        for e in catalog_entries(load_matrix(REPO / "images" / "matrix.yaml")).values()
    }
    # The local cluster's catalogs name the Jupyter stage its real nodes hold
    # (`build --target jupyter` tags `<tag>-jupyter`); its CUDA is the full image's.
    for path, stage_suffix in [
        (REPO / "config" / "catalog.yaml", ""),
        (REPO / "config" / "sandbox" / "catalog.yaml", "-jupyter"),
        (CATALOGS / "e2e.yaml", "-jupyter"),
    ]:
        for key, image in load_catalog_file(path).images.items():
            name = image.image.rsplit("/", 1)[1]
            assert name.endswith(stage_suffix), (path, name)
            name = name.removesuffix(stage_suffix) if stage_suffix else name
            assert name in built, (
                f"{path}: images.{key} names {image.image}, which images/matrix.yaml does not build"
            )
            assert image.cuda == built[name], (
                f"{path}: images.{key}.cuda is {image.cuda}, the image has {built[name]}"
            )


# ---------------------------------------------------------------------------
# kubespawner_override
# ---------------------------------------------------------------------------

KNOWN_TRAITS = {
    "cpu_limit",
    "extra_labels",
    "environment",
    "extra_resource_limits",
    "node_selector",
}


def with_override(override, **image):
    return {
        "images": {"lab": {"image": "example/lab:1", **image, "kubespawner_override": override}}
    }


def test_an_images_kubespawner_override_is_kept_as_plain_data():
    catalog = parse_catalog(
        with_override(
            {
                "cpu_limit": 2,
                "extra_labels": {"team": "vision"},
                "extra_resource_limits": {"example.com/fpga": "1"},
                "node_selector": None,
            }
        ),
        known_overrides=KNOWN_TRAITS,
    )
    assert catalog.images["lab"].kubespawner_override == {
        "cpu_limit": 2,
        "extra_labels": {"team": "vision"},
        "extra_resource_limits": {"example.com/fpga": "1"},
        "node_selector": None,
    }
    # images without one have none
    assert parse_catalog({"images": {"a": {"image": "x"}}}).images["a"].kubespawner_override == {}


def test_an_unknown_trait_names_the_key_and_the_closest_trait():
    with pytest.raises(CatalogError) as e:
        parse_catalog(with_override({"cpu_limt": 2}), "catalog.yaml", known_overrides=KNOWN_TRAITS)
    assert str(e.value) == (
        "catalog.yaml: images.lab.kubespawner_override.cpu_limt: "
        "KubeSpawner has no trait 'cpu_limt': did you mean 'cpu_limit'?"
    )
    # without the known names (a pure parse), only the shape is checked
    assert parse_catalog(with_override({"cpu_limt": 2})).images["lab"].kubespawner_override


def test_a_catalog_file_checks_override_names_on_every_reload(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(with_override({"cpu_limit": 2})))
    source = CatalogFile(path, known_overrides=KNOWN_TRAITS)
    assert source.get()[0].images["lab"].kubespawner_override == {"cpu_limit": 2}
    path.write_text(yaml.safe_dump(with_override({"cpu_limitt": 2})) + "\n")
    catalog, reloaded = source.get()
    # the typo is not taken: the last good catalog stays, with the reason kept
    assert not reloaded and catalog.images["lab"].kubespawner_override == {"cpu_limit": 2}
    assert "did you mean 'cpu_limit'?" in str(source.last_error)


@pytest.mark.parametrize(
    "override, image, path, fragment",
    [
        (
            {"extra_resource_limits": {"nvidia.com/gpu": 1}},
            {},
            "extra_resource_limits.nvidia.com/gpu",
            "use the catalog's gpu_types and gpu_counts instead",
        ),
        (
            {"extra_resource_guarantees": {"nvidia.com/mig-1g.10gb": "2"}},
            {},
            "extra_resource_guarantees.nvidia.com/mig-1g.10gb",
            "is a GPU",
        ),
        (
            # a resource the catalog's own GPU types name is a GPU too
            {"extra_resource_limits": {"example.com/accel": 1}},
            {"gpu_types": ["x"]},
            "extra_resource_limits.example.com/accel",
            "is a GPU",
        ),
        ({"image": "other/image:1"}, {}, "image", "the image's own 'image' key"),
        ({"init_containers": []}, {}, "init_containers", "GPU check"),
        ({"privileged": True}, {}, "privileged", "sees every GPU of its node"),
        (
            {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}},
            {},
            "environment.NVIDIA_VISIBLE_DEVICES",
            "exactly its own GPUs",
        ),
        (
            {"environment": {"NVIDIA_DRIVER_CAPABILITIES": "all"}},
            {},
            "environment.NVIDIA_DRIVER_CAPABILITIES",
            "set by gpuspawner",
        ),
        (
            {"extra_labels": {"gpuspawner.io/gpus": "0"}},
            {},
            "extra_labels.gpuspawner.io/gpus",
            "only gpuspawner sets it",
        ),
        (
            {"extra_annotations": {"gpuspawner.io/gpu-weight": "0"}},
            {},
            "extra_annotations.gpuspawner.io/gpu-weight",
            "only gpuspawner sets it",
        ),
        (
            {"extra_container_config": {"resources": {}}},
            {},
            "extra_container_config.resources",
            "GPU request",
        ),
        (
            {"extra_pod_config": {"initContainers": []}},
            {},
            "extra_pod_config.initContainers",
            "check",
        ),
        ({"cpu_limit": 4}, {"cpu_limit": 2}, "cpu_limit", "set it once, there"),
        ({"mem_limit": "4G"}, {"mem_limit": "8G"}, "mem_limit", "set it once, there"),
        ({"cpu limit": 1}, {}, "cpu limit", "is not a KubeSpawner trait name"),
        (["cpu_limit"], {}, "", "expected a mapping"),
        ({"cpu_limit": float("nan")}, {}, "cpu_limit", "expected a finite number"),
        ({"extra_labels": {1: "x"}}, {}, "extra_labels", "keys must be strings"),
        ({"cpu_limit": {1, 2}}, {}, "cpu_limit", "expected YAML data"),
    ],
)
def test_overrides_that_would_undo_gpuspawners_guarantees_are_refused(
    override, image, path, fragment
):
    data = with_override(override, **image)
    data["gpu_types"] = {"x": {"resource": "example.com/accel"}}
    with pytest.raises(CatalogError) as e:
        parse_catalog(data, "catalog.yaml")
    where = "images.lab.kubespawner_override" + (f".{path}" if path else "")
    assert str(e.value).startswith(f"catalog.yaml: {where}: "), str(e.value)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_hostile_override_values_are_bounded(tmp_path):
    # YAML anchors: a few lines that expand to a billion items, and a list holding itself
    bomb = "\n".join(
        [
            "images:",
            "  lab:",
            "    image: x",
            "    kubespawner_override:",
            "      a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]",
        ]
        + [
            f"      a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
            for i in range(1, 9)
        ]
    )
    (tmp_path / "bomb.yaml").write_text(bomb)
    with pytest.raises(CatalogError, match="too large or too deeply nested"):
        load_catalog_file(tmp_path / "bomb.yaml")
    (tmp_path / "loop.yaml").write_text(
        "images:\n  lab:\n    image: x\n    kubespawner_override:\n      extra_pod_config: &l {x: *l}\n"
    )
    with pytest.raises(CatalogError, match="too large or too deeply nested"):
        load_catalog_file(tmp_path / "loop.yaml")


# ---------------------------------------------------------------------------
# issue 32: durations, runtime limits, keep, idle timeouts and GPU-hours budgets
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90s", 90),
        ("30m", 1800),
        ("8h", 28800),
        ("2d", 172800),
        ("1h30m", 5400),
        ("1d2h3m4s", 93784),
        ("1.5h", 5400),
        ("3600", 3600),
        ("0s", 0),
    ],
)
def test_durations_as_text(text, seconds):
    assert parse_duration_text(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "h",
        "1 h",
        "1H",
        "30m1h",
        "1h1h",
        "-5m",
        "1e3",
        "nan",
        "inf",
        "1.h",
        "5 minutes",
        "3651d",
        "\uff19\uff10m",  # full-width digits: not ASCII, not a duration
        "\u0661h",  # an Arabic-Indic one
    ],
)
def test_durations_that_are_not(text):
    with pytest.raises(ValueError):
        parse_duration_text(text)


def image_with(**keys):
    return {"images": {"pytorch": {"image": "x", **keys}}}


def test_runtime_keep_and_idle_timeout_keys():
    data = image_with(
        max_runtime="8h", max_keep=0, idle_timeout={"min": "30m", "max": 28800, "default": "1h"}
    )
    data["gpu_types"] = {"a100": {"max_runtime": 86400}}
    catalog = parse_catalog(data)
    image = catalog.images["pytorch"]
    assert (image.max_runtime, image.max_keep) == (28800, 0)  # max_keep 0: no keep
    assert image.idle_timeout == IdleTimeoutBounds(minimum=1800, maximum=28800, default=3600)
    assert image.idle_timeout.allows(1800) and not image.idle_timeout.allows(28801)
    assert catalog.gpu_types["a100"].max_runtime == 86400


def test_the_new_keys_are_optional():
    catalog = parse_catalog(image_with(idle_timeout={"min": "10m", "max": "1h"}))
    image = catalog.images["pytorch"]
    assert (image.max_runtime, image.max_keep) == (None, None)
    assert image.idle_timeout.default == 600  # the shortest: GPUs back soonest
    assert catalog.limits.gpu_hours == BudgetRules()
    assert not catalog.limits.gpu_hours.enabled


def test_a_budget_section():
    data = image_with()
    data["limits"] = {
        "gpu_hours": {
            "period": "week",
            "reset": "Tuesday 06:30",
            "min_session": "30m",
            "default": 40,
            "groups": {"ml-team": 100, "staff": "unlimited"},
            "users": {"alice": "unlimited", "bob": 0},
        }
    }
    rules = parse_catalog(data).limits.gpu_hours
    assert rules == BudgetRules(
        period="week",
        reset_weekday=1,
        reset_day=1,
        reset_seconds=6 * 3600 + 1800,
        min_session=1800,
        default=40,
        groups={"ml-team": 100, "staff": None},
        users={"alice": None, "bob": 0},
    )
    assert rules.enabled


@pytest.mark.parametrize(
    "period, reset, expected",
    [
        ("day", "00:00", (0, 1, 0)),
        ("day", "23:59", (0, 1, 86340)),
        ("day", "6:05", (0, 1, 21900)),
        ("week", "monday 00:00", (0, 1, 0)),
        ("week", "SUNDAY 12:00", (6, 1, 43200)),
        ("month", "1 00:00", (0, 1, 0)),
        ("month", "28 23:30", (0, 28, 84600)),
    ],
)
def test_reset_times_per_period(period, reset, expected):
    data = image_with()
    data["limits"] = {"gpu_hours": {"period": period, "reset": reset, "default": 1}}
    rules = parse_catalog(data).limits.gpu_hours
    assert (rules.reset_weekday, rules.reset_day, rules.reset_seconds) == expected


def test_the_default_reset_is_the_start_of_the_period():
    for period in ("day", "week", "month"):
        data = image_with()
        data["limits"] = {"gpu_hours": {"period": period}}
        rules = parse_catalog(data).limits.gpu_hours
        assert (rules.period, rules.reset_weekday, rules.reset_day, rules.reset_seconds) == (
            period,
            0,
            1,
            0,
        )
        assert rules.default is None and not rules.enabled


def test_an_unquoted_yaml_time_is_explained():
    data = yaml.safe_load(
        "images: {p: {image: x}}\nlimits: {gpu_hours: {period: day, reset: 12:30}}"
    )
    assert data["limits"]["gpu_hours"]["reset"] == 750  # what YAML 1.1 makes of it
    with pytest.raises(CatalogError, match=r"in quotes, got 750 \(YAML reads an unquoted time"):
        parse_catalog(data)


def budget(**keys):
    data = image_with()
    data["limits"] = {"gpu_hours": keys}
    return data


@pytest.mark.parametrize(
    "data, path, fragment",
    [
        (image_with(max_runtime=0), "images.pytorch.max_runtime", "more than 0 seconds"),
        (image_with(max_runtime="0s"), "images.pytorch.max_runtime", "more than 0 seconds"),
        (image_with(max_runtime="8 hours"), "images.pytorch.max_runtime", "got '8 hours'"),
        (image_with(max_runtime=True), "images.pytorch.max_runtime", "got True"),
        (image_with(max_runtime=-1), "images.pytorch.max_runtime", "got -1"),
        (image_with(max_runtime=float("inf")), "images.pytorch.max_runtime", "at most 3650 days"),
        (image_with(max_keep=-60), "images.pytorch.max_keep", "0 or more seconds"),
        (image_with(idle_timeout=3600), "images.pytorch.idle_timeout", "expected a mapping"),
        (image_with(idle_timeout={"max": "1h"}), "images.pytorch.idle_timeout.min", "needs 'min'"),
        (image_with(idle_timeout={"min": "1h"}), "images.pytorch.idle_timeout.max", "needs 'max'"),
        (
            image_with(idle_timeout={"min": "2h", "max": "1h"}),
            "images.pytorch.idle_timeout.min",
            "'2h' is above max '1h'",
        ),
        (
            image_with(idle_timeout={"min": "1h", "max": "2h", "default": "3h"}),
            "images.pytorch.idle_timeout.default",
            "not between min '1h' and max '2h'",
        ),
        (
            image_with(idle_timeout={"min": 0, "max": "2h"}),
            "images.pytorch.idle_timeout.min",
            "more than 0 seconds",
        ),
        (
            image_with(idle_timeout={"min": "1m", "max": "2h", "defualt": "1h"}),
            "images.pytorch.idle_timeout.defualt",
            "did you mean 'default'?",
        ),
        (image_with(max_runtme="8h"), "images.pytorch.max_runtme", "did you mean 'max_runtime'?"),
        (budget(period="year"), "limits.gpu_hours.period", "expected one of day, week, month"),
        (budget(perod="week"), "limits.gpu_hours.perod", "did you mean 'period'?"),
        (budget(default=-1), "limits.gpu_hours.default", "GPU-hours >= 0 or 'unlimited'"),
        (budget(default="lots"), "limits.gpu_hours.default", "got 'lots'"),
        (budget(groups={"ml": float("nan")}), "limits.gpu_hours.groups.ml", "GPU-hours"),
        (budget(users=["alice"]), "limits.gpu_hours.users", "expected a mapping"),
        (budget(min_session="soon"), "limits.gpu_hours.min_session", "got 'soon'"),
        (budget(reset="00:00"), "limits.gpu_hours.reset", "for a weekly budget"),
        (budget(reset="monday"), "limits.gpu_hours.reset", "such as 'monday 00:00'"),
        (budget(reset="mon 00:00"), "limits.gpu_hours.reset", "got 'mon 00:00'"),
        (budget(reset="monday 24:00"), "limits.gpu_hours.reset", "got 'monday 24:00'"),
        (budget(reset="monday 12:60"), "limits.gpu_hours.reset", "got 'monday 12:60'"),
        (budget(period="day", reset="monday 00:00"), "limits.gpu_hours.reset", "HH:MM"),
        (budget(period="day", reset="7"), "limits.gpu_hours.reset", "daily budget"),
        (budget(period="month", reset="29 00:00"), "limits.gpu_hours.reset", "(1-28)"),
        (budget(period="month", reset="0 00:00"), "limits.gpu_hours.reset", "monthly budget"),
        (budget(period="month", reset="1st 00:00"), "limits.gpu_hours.reset", "such as '1 00:00'"),
        (budget(period="week", reset=["monday"]), "limits.gpu_hours.reset", "got ['monday']"),
    ],
)
def test_bad_issue_32_keys_name_the_path_in_one_sentence(data, path, fragment):
    with pytest.raises(CatalogError) as info:
        parse_catalog(data)
    assert info.value.path == path
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)
