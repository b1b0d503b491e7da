"""The catalog's JSON Schema, built from :mod:`gpuspawner.core.catalog`'s own rules.

Helm checks the chart's values against ``chart/gpuspawner/values.schema.json`` at
``helm install``/``upgrade``/``lint``/``template``, and editors (YAML language servers)
offer the same schema for a catalog file. It is generated (``scripts/chart_schema.py``)
from what :func:`~gpuspawner.core.catalog.parse_catalog` reads: its key sets (so a key
added there, such as an image's ``kubespawner_override``, appears here without an edit)
and its value rules (key, CUDA, resource, quantity and variable-name patterns, enums).

The schema catches the structural mistakes (an unknown key, a wrong type, a bad
pattern) before anything is installed; what needs the whole catalog (a default image
that exists, a GPU type an image names) stays the hub's check, which stops the hub
with one readable sentence.

This module is pure: it builds dictionaries.
"""

from __future__ import annotations

from typing import Any

from . import catalog as rules

Schema = dict[str, Any]

#: The JSON Schema dialect Helm's validator reads.
DIALECT = "http://json-schema.org/draft-07/schema#"


def _pattern(regex: Any) -> str:
    """A compiled rule's pattern, which RE2 (Helm's Go validator) reads as Python does."""
    return regex.pattern


def _string() -> Schema:
    # _Reader.string: a non-empty string, not only blanks
    return {"type": "string", "pattern": r"\S"}


def _text() -> Schema:
    # _Reader.string(allow_empty=True)
    return {"type": "string"}


def _boolean() -> Schema:
    return {"type": "boolean"}


def _count(minimum: int) -> Schema:
    return {"type": "integer", "minimum": minimum}


def _number() -> Schema:
    # _Reader.number: a positive number
    return {"type": "number", "exclusiveMinimum": 0}


def _quantity() -> Schema:
    # _Reader.quantity: a Kubernetes quantity; a bare number is read as its text
    return {
        "anyOf": [
            {"type": "string", "pattern": _pattern(rules._QUANTITY_RE)},
            {"type": "number", "minimum": 0},
        ],
        "description": "a Kubernetes quantity such as '8G' or '512Mi'",
    }


def _limit() -> Schema:
    # _Reader.limit: GPUs >= 0, or 'unlimited'
    return {
        "anyOf": [{"const": rules.UNLIMITED}, {"type": "number", "minimum": 0}],
        "description": f"a number of GPUs >= 0 or '{rules.UNLIMITED}'",
    }


def _duration(allow_zero: bool = False) -> Schema:
    # _Reader.parse_duration: seconds, or '90s', '30m', '8h', '2d', '1h30m' (a zero given
    # as text, '0s', is the hub's to refuse)
    bound = {"minimum": 0} if allow_zero else {"exclusiveMinimum": 0}
    return {
        "anyOf": [
            {"type": "number", **bound, "maximum": rules.MAX_DURATION},
            {
                "type": "string",
                "minLength": 1,
                "pattern": f"{_pattern(rules._SECONDS_RE)}|{_pattern(rules._DURATION_RE)}",
            },
        ],
        "description": "a duration: seconds, or a string such as '30m', '8h' or '1h30m'",
    }


def _hours() -> Schema:
    # _Reader.hours: GPU-hours >= 0, or 'unlimited'
    return {
        "anyOf": [{"const": rules.UNLIMITED}, {"type": "number", "minimum": 0}],
        "description": f"a number of GPU-hours >= 0 or '{rules.UNLIMITED}'",
    }


def _string_map(names: Schema | None = None) -> Schema:
    # _Reader.string_map: string keys, string (or number) values, never booleans
    schema: Schema = {
        "type": "object",
        "additionalProperties": {"type": ["string", "number"]},
    }
    if names:
        schema["propertyNames"] = names
    return schema


def _list(items: Schema, **more: Any) -> Schema:
    return {"type": "array", "items": items, **more}


def _closed(properties: dict[str, Schema], known: set[str], **more: Any) -> Schema:
    """A mapping of the keys ``known`` only (the catalog's key sets); unknown keys refused.

    A known key without a rule here takes any value: the hub checks it.
    """
    return {
        "type": "object",
        "properties": {key: properties.get(key, {}) for key in sorted(known)},
        "additionalProperties": False,
        **more,
    }


def _keyed(value: Schema, **more: Any) -> Schema:
    """A mapping from catalog keys (label-value rules, lower case) to ``value``."""
    return {
        "type": "object",
        "propertyNames": {"pattern": _pattern(rules._KEY_RE)},
        "additionalProperties": value,
        **more,
    }


def _counts(minimum: int) -> Schema:
    return _list(_count(minimum), minItems=1, uniqueItems=True)


def _tolerations() -> Schema:
    return _list(
        _closed(
            {
                "key": _text(),
                "operator": {"enum": ["Equal", "Exists"]},
                "value": _text(),
                "effect": {"enum": sorted(rules._TOLERATION_EFFECTS)},
                "tolerationSeconds": {"type": "integer"},
            },
            rules._TOLERATION_KEYS,
        )
    )


def _affinity() -> Schema:
    return _list(
        _closed(
            {
                "key": _string(),
                "operator": {"enum": sorted(rules._AFFINITY_OPERATORS)},
                "values": _list(_string()),
            },
            {"key", "operator", "values"},
            required=["key", "operator"],
        )
    )


def _names() -> Schema:
    return _list(_string())


#: Each image key's rule; keys of catalog._IMAGE_KEYS not named here take any value.
IMAGE_RULES: dict[str, Schema] = {
    "display_name": _string(),
    "description": _text(),
    "image": _string(),
    "cuda": {
        "anyOf": [
            {"type": "string", "pattern": _pattern(rules._CUDA_RE)},
            {"type": "number"},
        ],
        "description": "a CUDA version such as '12.4'",
    },
    "default": _boolean(),
    "gpu_types": _list(_string()),
    "allow_cpu": _boolean(),
    "cpu_guarantee": {"anyOf": [_number(), {"type": "null"}]},
    "cpu_limit": {"anyOf": [_number(), {"type": "null"}]},
    "mem_guarantee": {"anyOf": [_quantity(), {"type": "null"}]},
    "mem_limit": {"anyOf": [_quantity(), {"type": "null"}]},
    "env": _string_map(
        {
            "pattern": _pattern(rules._ENV_NAME_RE),
            "not": {"enum": sorted(rules.RESERVED_ENV)},
        }
    ),
    "groups": _names(),
    "users": _names(),
    # KubeSpawner's own settings for the image's servers (their names are checked by the hub)
    "kubespawner_override": {"type": "object"},
    "max_runtime": _duration(),
    "max_keep": _duration(allow_zero=True),
    # min <= default <= max is the hub's check
    "idle_timeout": _closed(
        {"min": _duration(), "max": _duration(), "default": _duration()},
        rules._IDLE_TIMEOUT_KEYS,
        required=["min", "max"],
    ),
}

#: Each GPU type key's rule.
TYPE_RULES: dict[str, Schema] = {
    "display_name": _string(),
    "resource": {"type": "string", "pattern": _pattern(rules._RESOURCE_RE)},
    "node_selector": _string_map(),
    "node_affinity": _affinity(),
    "tolerations": _tolerations(),
    "memory": _text(),
    "counts": _counts(1),
    "weight": _number(),
    "max_runtime": _duration(),
}


def _budgets() -> Schema:
    # the reset's form depends on the period: any of them here, the period's own in the hub
    by_name = {"type": "object", "additionalProperties": _hours()}
    return _closed(
        {
            "period": {"enum": list(rules.BUDGET_PERIODS)},
            "reset": {
                "type": "string",
                "pattern": "|".join(_pattern(regex) for regex in rules._RESET_RES.values()),
                "description": "UTC: 'HH:MM' (day), '<weekday> HH:MM' (week), '<1-28> HH:MM' (month)",
            },
            "min_session": _duration(allow_zero=True),
            "default": _hours(),
            "groups": by_name,
            "users": by_name,
        },
        rules._BUDGET_KEYS,
    )


def _allowance() -> Schema:
    return {
        "anyOf": [
            _limit(),
            _closed(
                {
                    "gpus": _limit(),
                    "per_type": {"type": "object", "additionalProperties": _limit()},
                },
                rules._ALLOWANCE_KEYS,
            ),
        ]
    }


def catalog_schema() -> Schema:
    """The catalog (a catalog file, or ``c.GPUSpawner.catalog``) as a JSON Schema."""
    by_name = {"type": "object", "additionalProperties": _allowance()}
    top = {
        "images": _keyed(
            _closed(IMAGE_RULES, rules._IMAGE_KEYS, required=["image"]), minProperties=1
        ),
        "gpu_types": _keyed(_closed(TYPE_RULES, rules._TYPE_KEYS)),
        "gpu_counts": _counts(0),
        "defaults": _closed(
            {"image": _string(), "gpu_type": _string(), "gpus": _count(0)}, rules._DEFAULT_KEYS
        ),
        "limits": _closed(
            {
                "default": _allowance(),
                "groups": by_name,
                "users": by_name,
                "group_pools": {"type": "object", "additionalProperties": _limit()},
                "gpu_hours": _budgets(),
            },
            rules._LIMIT_KEYS,
        ),
    }
    return _closed(
        top,
        rules._TOP_KEYS,
        required=["images"],
        title="gpuspawner GPU catalog",
        description="docs/catalog.md; checked in full by the hub at start and on every change.",
    )
