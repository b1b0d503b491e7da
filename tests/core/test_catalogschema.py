"""The catalog's JSON Schema agrees with parse_catalog: built from its key sets and rules.

Every catalog the repository has that parse_catalog accepts is valid under the schema;
the structural mistakes parse_catalog refuses (an unknown key, a wrong type, a bad
pattern) are refused by the schema too. What needs the whole catalog (a GPU type an
image names that does not exist) is the hub's check only: the schema says nothing of it.
Checked with the jsonschema library here; tests/chart checks the same through Helm.
"""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpuspawner.core import catalog as rules
from gpuspawner.core.catalog import CatalogError, parse_catalog
from gpuspawner.core.catalogschema import DIALECT, catalog_schema

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "catalogs"
#: Every catalog file in the repository parse_catalog accepts (examples, the sandbox's, the
#: tests'); the fixtures it refuses are named, and each is checked below.
REFUSED = {"bad-count", "bad-image-type", "bad-limit", "bad-unknown-key", "bad-yaml", "empty"}
CATALOG_FILES = sorted(
    {
        *(p for p in FIXTURES.glob("*.yaml") if p.stem not in REFUSED),
        REPO / "config" / "catalog.yaml",
        REPO / "config" / "sandbox" / "catalog.yaml",
    }
)


def errors(data) -> list[str]:
    validator = jsonschema.Draft7Validator(catalog_schema())
    return [e.message for e in validator.iter_errors(data)]


def load(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return None


def test_the_schema_is_a_valid_draft_7_schema():
    jsonschema.Draft7Validator.check_schema(catalog_schema())
    assert DIALECT.startswith("http://json-schema.org/draft-07/")


def test_the_key_sets_are_the_catalogs_own():
    schema = catalog_schema()
    props = schema["properties"]
    assert set(props) == rules._TOP_KEYS
    image = props["images"]["additionalProperties"]
    assert set(image["properties"]) == rules._IMAGE_KEYS  # kubespawner_override too, once added
    assert set(props["gpu_types"]["additionalProperties"]["properties"]) == rules._TYPE_KEYS
    assert set(props["limits"]["properties"]) == rules._LIMIT_KEYS
    assert set(props["defaults"]["properties"]) == rules._DEFAULT_KEYS
    assert image["required"] == ["image"]


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_catalog_parse_catalog_accepts_is_valid(path):
    data = load(path)
    parse_catalog(data, str(path))
    assert errors(data) == []


@pytest.mark.parametrize("name", ["bad-count", "bad-limit", "bad-unknown-key", "empty"])
def test_the_structurally_bad_fixtures_are_refused_by_both(name):
    data = load(FIXTURES / f"{name}.yaml")
    with pytest.raises(CatalogError):
        parse_catalog(data)
    assert errors(data)


VALID = {
    "images": {"pytorch": {"image": "example/pytorch:1", "mem_limit": "8G", "cuda": "12.4"}},
    "gpu_types": {"a100": {"node_selector": {"a": "b"}, "counts": [1, 2]}},
    "limits": {"default": 2, "groups": {"ml": {"gpus": "unlimited", "per_type": {"a100": 1}}}},
}


def changed(path: str, value, base=VALID):
    """``base`` with the value at a dotted path set (or added)."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


@pytest.mark.parametrize(
    "path,value",
    [
        ("images.pytorch.imagee", "x"),  # unknown key
        ("gpu_types.a100.node_selecter", {}),  # unknown key (bad-unknown-key.yaml)
        ("surprise", 1),  # unknown top-level key
        ("gpu_types.a100.counts", [1, "two"]),  # wrong type (bad-count.yaml)
        ("gpu_types.a100.counts", [1, 1]),  # repeated
        ("limits.groups.ml.gpus", -2),  # below zero (bad-limit.yaml)
        ("limits.default", "lots"),  # neither a number nor 'unlimited'
        ("images.pytorch.mem_limit", "8 gigs"),  # not a quantity
        ("images.pytorch.cuda", "twelve"),  # not a CUDA version
        ("images.pytorch.default", "yes"),  # not a boolean
        ("images.pytorch.env", {"NVIDIA_VISIBLE_DEVICES": "all"}),  # reserved
        ("images.pytorch.env", {"1BAD": "x"}),  # not a variable name
        ("images.Bad_Key", {"image": "x"}),  # not a catalog key
        ("gpu_types.a100.resource", "not a resource"),
        ("gpu_types.a100.tolerations", [{"key": "k", "operator": "Maybe"}]),
        ("images.pytorch.display_name", "   "),  # blank
        ("images.other", {"display_name": "no image"}),  # image required
    ],
)
def test_structural_mistakes_are_refused_by_both(path, value):
    data = changed(path, value)
    with pytest.raises(CatalogError):
        parse_catalog(data)
    assert errors(data), f"the schema accepts {path}={value!r}"


def test_the_valid_base_is_valid_by_both():
    parse_catalog(VALID)
    assert errors(VALID) == []


def test_what_needs_the_whole_catalog_is_left_to_the_hub():
    """An image naming an undefined GPU type (bad-image-type.yaml): structurally fine."""
    data = load(FIXTURES / "bad-image-type.yaml")
    with pytest.raises(CatalogError, match="unknown GPU type"):
        parse_catalog(data)
    assert errors(data) == []


#: Every issue 32 key, valid (runtime limits, keep, idle timeouts, GPU-hours budgets).
WITH_TIME = changed(
    "images.pytorch",
    {
        "image": "example/pytorch:1",
        "max_runtime": "8h",
        "max_keep": 0,
        "idle_timeout": {"min": "30m", "max": 28800, "default": "1h30m"},
    },
)
WITH_TIME["gpu_types"]["a100"]["max_runtime"] = 86400
WITH_TIME["limits"]["gpu_hours"] = {
    "period": "month",
    "reset": "28 23:59",
    "min_session": "15m",
    "default": 40.5,
    "groups": {"ml-team": 100},
    "users": {"alice": "unlimited"},
}


def time_changed(path: str, value):
    return changed(path, value, WITH_TIME)


def test_the_issue_32_keys_are_valid_by_both():
    parse_catalog(WITH_TIME)
    assert errors(WITH_TIME) == []
    schema = catalog_schema()["properties"]
    assert set(schema["limits"]["properties"]["gpu_hours"]["properties"]) == rules._BUDGET_KEYS
    image = schema["images"]["additionalProperties"]["properties"]
    assert set(image["idle_timeout"]["properties"]) == rules._IDLE_TIMEOUT_KEYS


@pytest.mark.parametrize("reset", ["06:00", "monday 00:00", "Sunday 23:59", "1 00:00", "28 12:30"])
def test_every_periods_reset_form_is_valid_to_the_schema(reset):
    assert errors(time_changed("limits.gpu_hours.reset", reset)) == []


@pytest.mark.parametrize(
    "path,value",
    [
        ("images.pytorch.max_runtime", "8 hours"),
        ("images.pytorch.max_runtime", 0),
        ("images.pytorch.max_runtime", ""),
        ("images.pytorch.max_runtime", "30m1h"),
        ("images.pytorch.max_keep", -1),
        ("images.pytorch.idle_timeout", 3600),
        ("images.pytorch.idle_timeout", {"max": "1h"}),
        ("images.pytorch.idle_timeout.defualt", "1h"),
        ("gpu_types.a100.max_runtime", True),
        ("limits.gpu_hours.period", "year"),
        ("limits.gpu_hours.reset", "someday"),
        ("limits.gpu_hours.reset", "29 00:00"),
        ("limits.gpu_hours.reset", "monday 24:00"),
        ("limits.gpu_hours.reset", 750),
        ("limits.gpu_hours.default", -1),
        ("limits.gpu_hours.groups.ml-team", "lots"),
        ("limits.gpu_hours.perod", "week"),
        ("limits.gpu_hours.min_session", "soon"),
    ],
)
def test_bad_issue_32_keys_are_refused_by_both(path, value):
    data = time_changed(path, value)
    with pytest.raises(CatalogError):
        parse_catalog(data)
    assert errors(data), f"the schema accepts {path}={value!r}"
