"""Write chart/gpuspawner/values.schema.json: the chart's ``gpuspawner:`` values, catalog included.

    .venv/bin/python scripts/chart_schema.py          # rewrite it
    .venv/bin/python scripts/chart_schema.py --check  # exit 1 if it is out of date

The catalog's part is :func:`gpuspawner.core.catalogschema.catalog_schema`, built from
the catalog's own rules; the rest describes the chart's other ``gpuspawner:`` settings
(chart/gpuspawner/values.yaml). ``jupyterhub:`` is zero-to-jupyterhub's, which its own
values.schema.json checks. tests/chart/test_schema.py fails when the file is out of date.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpuspawner.core.catalogschema import DIALECT, catalog_schema

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "chart" / "gpuspawner" / "values.schema.json"


def _closed(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "additionalProperties": False, **more}


def _switch(**more: Any) -> dict[str, Any]:
    return _closed({"enabled": {"type": "boolean"}, **more})


def _traitlets_config(service: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": {"type": "object"},
        "description": f"The {service}'s traitlets config, by class ({{GPUCuller: {{…}}}}).",
    }


def _image(**more: Any) -> dict[str, Any]:
    return _closed(
        {
            "name": {"type": "string", "minLength": 1},
            "tag": {"type": "string", "minLength": 1},
            "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        },
        required=["name", "tag"],
        **more,
    )


def values_schema() -> dict[str, Any]:
    """The schema Helm checks the chart's values against."""
    gpuspawner = _closed(
        {
            "catalog": catalog_schema(),
            "culler": _switch(
                config=_traitlets_config("culler"),
                kueueClusterQueues={
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "description": "Kueue ClusterQueues whose head counts as demand in "
                    "pressure mode (GPUCuller.kueue_cluster_queues); naming any grants Kueue read.",
                },
            ),
            "admin": _switch(
                users={"type": ["array", "null"], "items": {"type": "string"}},
                groups={"type": "array", "items": {"type": "string"}},
                config=_traitlets_config("GPU page"),
                kueueClusterQueues={
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "description": "Kueue ClusterQueues the GPU page shows "
                    "(GPUAdmin.kueue_cluster_queues); naming any grants Kueue read.",
                },
            ),
            "userService": _switch(),
            "prometheus": _closed({"url": {"type": "string"}}),
            "inventory": _closed({"allNamespaces": {"type": "boolean"}}),
            "accounting": _switch(dbUrl={"type": "string"}),
            "kueue": _closed(
                {
                    "queue": {
                        "type": "string",
                        "description": "The Kueue LocalQueue GPU servers wait in "
                        "(GPUSpawner.kueue_queue); naming one grants Kueue read. Empty: off.",
                    },
                    "priorityClass": {
                        "type": "string",
                        "description": "Their WorkloadPriorityClass "
                        "(GPUSpawner.kueue_priority_class).",
                    },
                }
            ),
            "prePuller": _switch(
                pullPolicy={"enum": ["Always", "IfNotPresent", "Never"]},
                pause=_closed({"image": _image()}),
                nodeSelector={"type": "object", "additionalProperties": {"type": "string"}},
                resources={"type": "object"},
            ),
        },
        required=["catalog"],
    )
    return {
        "$schema": DIALECT,
        "title": "gpuspawner chart values",
        "type": "object",
        "properties": {
            "gpuspawner": gpuspawner,
            # zero-to-jupyterhub's values: its own schema checks them
            "jupyterhub": {"type": "object"},
            "global": {"type": "object"},
        },
        "additionalProperties": False,
    }


def render() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not SCHEMA.is_file() or SCHEMA.read_text() != text:
            print(
                f"{SCHEMA.relative_to(REPO)} is out of date: run "
                "`.venv/bin/python scripts/chart_schema.py`",
                file=sys.stderr,
            )
            return 1
        return 0
    SCHEMA.write_text(text)
    print(f"wrote {SCHEMA.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
