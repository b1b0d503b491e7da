"""The docs site's generated references: the configuration reference (docs/_ext/configref.py)
for every configurable class, showing gpuspawner's own settings with their flags, and the
catalog reference (docs/_ext/catalogkeys.py) for every catalog key. `make docs` builds the
site with warnings as errors."""

from __future__ import annotations

import importlib
import re
import sys

import jsonschema
import pytest
import yaml
from jupyterhub.spawner import Spawner
from traitlets.config import Application

from gpuspawner.admin.service import GPUAdmin
from gpuspawner.core.catalogschema import catalog_schema
from gpuspawner.culler.app import GPUCuller
from gpuspawner.hub.spawner import GPUSpawner

from .conftest import REPO

sys.path.insert(0, str(REPO / "docs" / "_ext"))
configref = importlib.import_module("configref")
catalogkeys = importlib.import_module("catalogkeys")

# the modules holding gpuspawner's spawner and services (their classes register as
# subclasses once imported)
_ENTRY_MODULES = (
    "gpuspawner.hub.spawner",
    "gpuspawner.culler.app",
    "gpuspawner.admin.service",
    "gpuspawner.userservice.app",
)


def _subclasses(base: type) -> set[type]:
    found = set()
    for cls in base.__subclasses__():
        found |= {cls} | _subclasses(cls)
    return found


def test_every_spawner_and_service_has_a_reference_page():
    for module in _ENTRY_MODULES:
        importlib.import_module(module)
    ours = {
        f"{cls.__module__}.{cls.__name__}"
        for cls in _subclasses(Application) | _subclasses(Spawner)
        if cls.__module__.startswith("gpuspawner.")
    }
    pages = "\n".join(page.read_text() for page in (REPO / "docs").glob("*.md"))
    documented = set(re.findall(r"^\.\. autoconfigurable:: (\S+)$", pages, re.M))
    assert ours >= {"gpuspawner.hub.spawner.GPUSpawner", "gpuspawner.culler.app.GPUCuller"}
    assert ours <= documented, f"no autoconfigurable for: {sorted(ours - documented)}"


def test_the_reference_shows_gpuspawner_settings_not_inherited_ones():
    traits = GPUSpawner.class_traits(config=True)
    assert configref.defined_by_gpuspawner(traits["catalog_file"])
    assert configref.defined_by_gpuspawner(traits["gpu_queue_timeout"])  # from a mixin
    assert not configref.defined_by_gpuspawner(traits["profile_list"])  # KubeSpawner's
    assert not configref.defined_by_gpuspawner(traits["start_timeout"])  # Spawner's
    culler = GPUCuller.class_traits(config=True)
    assert not configref.defined_by_gpuspawner(culler["log_level"])  # Application's
    # the Prometheus settings the culler and the admin page share are shown for both
    admin = GPUAdmin.class_traits(config=True)
    for name in ("gpu_util_metric", "gpu_engine_metric", "pod_label", "namespace_label"):
        assert configref.defined_by_gpuspawner(culler[name])
        assert configref.defined_by_gpuspawner(admin[name])


@pytest.mark.parametrize(
    ("cls", "name", "expected"),
    [
        (GPUCuller, "dry_run", ["", "Command line: ``--dry-run``"]),
        (GPUCuller, "prometheus_url", ["", "Command line: ``--prometheus-url``"]),
        (GPUCuller, "gpu_timeout", []),
        (
            GPUCuller,
            "api_token",
            ["", "The default is computed at start, as the help above says."],
        ),
    ],
)
def test_each_setting_says_its_flags_and_a_computed_default(cls, name, expected):
    assert configref.notes(cls, name) == expected


def test_the_catalog_reference_describes_every_key_of_the_catalog():
    assert catalogkeys.problems() == []
    paths = [path for path, _, _ in catalogkeys.rows()]
    # the catalog's own order: images first, then GPU types, counts, defaults, limits
    assert [path for path in paths if "." not in path] == [
        "images",
        "gpu_types",
        "gpu_counts",
        "defaults",
        "limits",
    ]
    assert "images.<image>.kubespawner_override" in paths
    assert "limits.groups.<group>.per_type" in paths


def test_a_key_the_schema_gains_or_loses_is_reported(monkeypatch):
    monkeypatch.setitem(catalogkeys.KEYS, "images.<image>.gone", catalogkeys.Key("", ""))
    monkeypatch.delitem(catalogkeys.KEYS, "gpu_types.<type>.weight")
    assert catalogkeys.problems() == [
        "gpu_types.<type>.weight has no entry in docs/_ext/catalogkeys.py KEYS",
        "KEYS has images.<image>.gone, which the catalog no longer has",
    ]


def test_each_example_in_the_catalog_reference_is_valid_for_its_key():
    schemas = dict(catalogkeys.walk(catalog_schema()))
    examples = {path: key.example for path, key in catalogkeys.KEYS.items() if key.example}
    assert len(examples) > 20
    for path, example in examples.items():
        jsonschema.validate(yaml.safe_load(example), schemas[path])


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"type": "integer", "minimum": 1}, "whole number ≥ 1"),
        (
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "uniqueItems": True},
            "list of whole number ≥ 0, no repeats",
        ),
        (
            {"anyOf": [{"const": "unlimited"}, {"type": "number", "minimum": 0}]},
            "'unlimited' or number ≥ 0",
        ),
        ({"enum": ["Exists", "Equal"]}, "one of Exists, Equal"),
        ({}, "any (the hub checks it)"),
    ],
)
def test_a_key_type_is_said_in_words(schema, said):
    assert catalogkeys.kind(schema) == said


def _readme_section(title: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return section.strip("\n").splitlines()


def test_the_readme_installs_the_chart_in_at_most_15_lines():
    lines = _readme_section("Install on Kubernetes (Helm)")
    assert len(lines) <= 15, "\n".join(lines)
    body = "\n".join(lines)
    assert "helm upgrade --install" in body and "chart/gpuspawner" in body
    assert "config/chart-values.yaml" in body  # the documented example values


def test_the_readme_links_to_files_that_exist():
    # the README is not part of the Sphinx site, so its links are checked here
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(((?!https?:|#)[^)#\s]+)(?:#[^)]*)?\)", text)
    assert "docs/install-chart.md" in targets
    missing = [target for target in targets if not (REPO / target).exists()]
    assert not missing, missing
