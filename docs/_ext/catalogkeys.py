"""The catalog reference's content: every catalog key, with its type, default and meaning.

The keys and their types come from the catalog's JSON Schema
(:func:`gpuspawner.core.catalogschema.catalog_schema`, itself built from the key
sets and rules :func:`gpuspawner.core.catalog.parse_catalog` reads), so a key added
to the catalog appears here without an edit. What the schema does not say (what a
key means, its default, an example) is in :data:`KEYS` below; the build fails
(a Sphinx warning, ``-W``) when a key of the schema has no entry there or an entry
names a key the schema no longer has, so the two cannot drift apart.

Pure (no Sphinx): the table's directive is in ``catalogref.py``; the tests read this.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

from gpuspawner.core import catalog
from gpuspawner.core.catalogschema import catalog_schema

Schema = dict[str, Any]


class Key(NamedTuple):
    default: str
    meaning: str
    example: str = ""


def _yaml(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


# What each key means. Paths use the schema's structure; ``<image>``, ``<type>``,
# ``<group>`` and ``<user>`` stand for the names an admin chooses.
KEYS: dict[str, Key] = {
    "images": Key(
        "(required)",
        "One profile per image, offered in this order. Keys are lower-case letters, "
        "digits and '-' (they end up in labels and form fields).",
    ),
    "images.<image>.image": Key(
        "(required)", "The image reference.", "registry.example.org/cuda-pytorch:2.15.0"
    ),
    "images.<image>.display_name": Key("the key", "The name on the spawn form.", "PyTorch"),
    "images.<image>.description": Key(
        "''", "A line under the name on the form; markup, shown as written (admins are trusted)."
    ),
    "images.<image>.cuda": Key(
        "none (no driver check)",
        "The image's CUDA version: the GPU check refuses a node whose driver does not "
        "support it. Leave it out for images that rely on NVIDIA's cuda-compat package.",
        '"13.2"',
    ),
    "images.<image>.default": Key(
        "false",
        "The profile an empty request gets; at most one image. Without one, the first open image.",
    ),
    "images.<image>.gpu_types": Key(
        "every type", "The GPU types this image may run on (keys of gpu_types).", "[a100, h100]"
    ),
    "images.<image>.allow_cpu": Key("true", "Whether the image may run with 0 GPUs."),
    "images.<image>.cpu_guarantee": Key(
        "the hub's", "CPU cores guaranteed to the image's servers.", "2"
    ),
    "images.<image>.cpu_limit": Key("the hub's", "CPU cores its servers may use at most.", "8"),
    "images.<image>.mem_guarantee": Key(
        "the hub's",
        "Memory guaranteed (8G = 8·10⁹ bytes, 8Gi = 8·2³⁰); above the image's limit it is "
        "refused, and the hub's default guarantee is lowered to the image's limit.",
        "8G",
    ),
    "images.<image>.mem_limit": Key("the hub's", "Memory its servers may use at most.", "32G"),
    "images.<image>.env": Key(
        "{}",
        "Extra environment variables; not the reserved "
        + " and ".join(sorted(catalog.RESERVED_ENV))
        + ", which gpuspawner sets from the GPUs a server gets.",
        "{HF_HOME: /data/hf}",
    ),
    "images.<image>.groups": Key(
        "everyone",
        "Only these hub groups (and the users below) see and may start the image; anyone "
        "else gets the answer an unknown profile gets.",
        "[matlab-licensed]",
    ),
    "images.<image>.users": Key("everyone", "Only these users (and the groups above).", "[alice]"),
    "images.<image>.kubespawner_override": Key(
        "{}",
        "KubeSpawner settings for this image's servers, as in a profile_list entry; "
        "names are checked against KubeSpawner's traits when the hub starts. Refused: "
        + "; ".join(f"{name} ({why})" for name, why in sorted(catalog.REFUSED_OVERRIDES.items()))
        + ". GPU resources, the reserved variables and gpuspawner's labels may not be set "
        "through the extra_* settings either: the catalog's GPU keys give GPUs.",
        "{extra_labels: {team: vision}}",
    ),
    "images.<image>.max_runtime": Key(
        "none",
        "A hard stop this long after a server started, whatever it does, warned ahead as a "
        "cull is; no keep puts it off. With the GPU type's max_runtime too, the smaller applies.",
        "8h",
    ),
    "images.<image>.max_keep": Key(
        "the culler's default_max_keep",
        "The longest 'keep' a user may choose when the culler warns that it will stop an "
        "idle server; 0: no keep for this image.",
        "4h",
    ),
    "images.<image>.idle_timeout": Key(
        "none (the culler's own idle rule)",
        "Users choose their servers' idle timeout on the form (in minutes), within these "
        "bounds; the culler uses it instead of its own idle timeout. Without it, the form "
        "offers no choice and a request that names one is refused.",
        "{min: 30m, max: 8h, default: 1h}",
    ),
    "images.<image>.idle_timeout.min": Key("(required)", "The shortest idle timeout.", "30m"),
    "images.<image>.idle_timeout.max": Key("(required)", "The longest; at least min.", "8h"),
    "images.<image>.idle_timeout.default": Key(
        "min", "What the form offers first; between min and max.", "1h"
    ),
    "gpu_types": Key("{}", "The GPU types of the cluster (none: CPU-only servers)."),
    "gpu_types.<type>.display_name": Key("the key", "The name on the spawn form.", "NVIDIA A100"),
    "gpu_types.<type>.memory": Key("''", "Shown on the form beside the name.", "80 GB"),
    "gpu_types.<type>.resource": Key(
        _yaml(catalog.DEFAULT_GPU_RESOURCE),
        "The extended resource the servers request, as many as their count.",
        "nvidia.com/mig-1g.10gb",
    ),
    "gpu_types.<type>.node_selector": Key(
        "{}",
        "Node labels the servers' nodes must have.",
        "{nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}",
    ),
    "gpu_types.<type>.node_affinity": Key(
        "[]",
        "Required node affinity expressions (key, operator, values).",
        '[{key: nvidia.com/gpu.memory, operator: Gt, values: ["40000"]}]',
    ),
    "gpu_types.<type>.tolerations": Key(
        _yaml(list(catalog.DEFAULT_GPU_TOLERATIONS)),
        "Tolerations of the servers' pods (Kubernetes' own keys).",
    ),
    "gpu_types.<type>.counts": Key(
        "gpu_counts without 0", "The counts offered for this type.", "[1, 2, 4]"
    ),
    "gpu_types.<type>.weight": Key(
        "1",
        "GPU units one device counts for against limits (a 1g.10gb MIG slice of an A100: 0.142857).",
    ),
    "gpu_types.<type>.max_runtime": Key(
        "none",
        "A hard stop for servers with this GPU type, as the image's max_runtime; "
        "the smaller of the two applies.",
        "24h",
    ),
    "gpu_counts": Key(
        _yaml(list(catalog.DEFAULT_GPU_COUNTS)),
        "The GPU counts offered; 0 is a CPU-only server (needed when there are no gpu_types).",
    ),
    "defaults": Key("{}", "The choice an empty request ({}) gets."),
    "defaults.image": Key(
        "the image marked default", "An image key; the image must be open to everyone.", "pytorch"
    ),
    "defaults.gpu_type": Key(
        "the default image's first type", "A GPU type key the default image may use.", "a100"
    ),
    "defaults.gpus": Key(
        "0 (CPU only), else the type's smallest count", "A GPU count offered for that type.", "0"
    ),
    "limits": Key("{}", "GPUs each user may hold at once, over all their servers."),
    "limits.default": Key(
        "unlimited",
        f"A user with no rule of their own: a number of GPUs, 0 (CPU only), "
        f"'{catalog.UNLIMITED}', or gpus and per_type as below.",
        "2",
    ),
    "limits.default.gpus": Key("unlimited", "The total, in GPU units (count × weight)."),
    "limits.default.per_type": Key(
        "the total", "Devices of one type at most, by type key.", "{h100: 0}"
    ),
    "limits.groups": Key(
        "{}", "Rules per hub group; a user in several gets the largest of each cap."
    ),
    "limits.groups.<group>.gpus": Key("unlimited", "The group's members' total each."),
    "limits.groups.<group>.per_type": Key("the total", "Per-type caps.", "{h100: 4}"),
    "limits.users": Key("{}", "Rules per user; they win over the groups'.", "{alice: unlimited}"),
    "limits.users.<user>.gpus": Key("unlimited", "The user's total."),
    "limits.users.<user>.per_type": Key("the total", "Per-type caps."),
    "limits.group_pools": Key(
        "{}",
        "A cap on what all members of a group hold together, whatever their own rules.",
        "{students: 6}",
    ),
    "limits.gpu_hours": Key(
        "{} (no budgets)",
        "GPU-hours each user may use per period, in weighted GPU-hours (GPUs × weight × "
        "hours); running servers count as they run.",
    ),
    "limits.gpu_hours.period": Key("week", "How long a budget lasts before it resets."),
    "limits.gpu_hours.reset": Key(
        "the start of the day, Monday, the 1st",
        "When a period starts, in UTC: 'HH:MM' for a day, '<weekday> HH:MM' for a week "
        "(weekday names in any case), '<day 1-28> HH:MM' for a month. Quote it: YAML "
        "reads an unquoted 12:30 as a number.",
        '"monday 06:00"',
    ),
    "limits.gpu_hours.min_session": Key(
        "15m",
        "A GPU request is refused when the rest of the budget, shared with what the user "
        "already runs, would run it for less than this; 0: only a spent budget refuses.",
        "30m",
    ),
    "limits.gpu_hours.default": Key(
        "unlimited",
        f"A user with no rule of their own: GPU-hours per period, 0 (no GPUs) or "
        f"'{catalog.UNLIMITED}'.",
        "40",
    ),
    "limits.gpu_hours.groups": Key(
        "{}",
        "Budgets per hub group; a user in several gets the most generous, which is also "
        "the group their usage is charged to.",
        "{ml-team: 100}",
    ),
    "limits.gpu_hours.users": Key(
        "{}", "Budgets per user; they win over the groups'.", "{alice: unlimited}"
    ),
}

#: The placeholder a mapping's own keys get in a path.
_NAMES = {"images": "<image>", "gpu_types": "<type>", "groups": "<group>", "users": "<user>"}


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every key path of ``schema`` with its schema, parents before their keys."""
    for key, sub in schema.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        yield here, sub
        yield from _children(sub, here)


def _children(sub: Schema, path: str) -> Iterator[tuple[str, Schema]]:
    if "properties" in sub:  # a mapping of fixed keys (defaults, limits)
        yield from walk(sub, path)
    # a mapping of chosen names (images, gpu_types, groups, users) to one kind of value
    value = sub.get("additionalProperties")
    if isinstance(value, dict) and sub.get("type") == "object":
        name = _NAMES.get(path.rsplit(".", 1)[-1], "<name>")
        for member in [value, *value.get("anyOf", [])]:
            if "properties" in member:
                yield from walk(member, f"{path}.{name}")
    # a value that is either a plain one or a mapping of keys (a limit)
    for member in sub.get("anyOf", []):
        if "properties" in member:
            yield from walk(member, path)


def kind(schema: Schema) -> str:
    """A schema as a reader says it: "list of whole numbers ≥ 1, no repeats"."""
    if not schema:
        return "any (the hub checks it)"
    if "description" in schema and "properties" not in schema:
        return schema["description"]
    if "anyOf" in schema:
        return " or ".join(kind(member) for member in schema["anyOf"])
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    types = schema.get("type")
    if isinstance(types, list):
        return " or ".join(kind({"type": t}) for t in types)
    if types == "string":
        return (
            "text"
            if schema.get("pattern") in (None, r"\S")
            else "text matching " + schema["pattern"]
        )
    if types in ("integer", "number"):
        word = "whole number" if types == "integer" else "number"
        if "minimum" in schema:
            return f"{word} ≥ {schema['minimum']}"
        if "exclusiveMinimum" in schema:
            return f"{word} > {schema['exclusiveMinimum']}"
        return word
    if types == "boolean":
        return "true or false"
    if types == "null":
        return "null"
    if types == "array":
        text = "list of " + kind(schema.get("items", {}))
        return text + (", no repeats" if schema.get("uniqueItems") else "")
    if types == "object":
        if "properties" in schema:
            return "mapping of " + ", ".join(schema["properties"])
        value = schema.get("additionalProperties")
        if isinstance(value, dict) and "properties" in value:
            return "mapping of names to the keys below"
        return "mapping of names to " + (kind(value) if isinstance(value, dict) else "values")
    return str(types)


def rows() -> list[tuple[str, str, Key]]:
    """(path, type, what KEYS says) for every key of the catalog's schema."""
    found = [(path, kind(sub), KEYS.get(path)) for path, sub in walk(catalog_schema())]
    order = {path: i for i, path in enumerate(KEYS)}  # KEYS is in the catalog's own order
    return sorted(found, key=lambda row: order.get(row[0], len(order)))


def problems() -> list[str]:
    """Keys of the schema KEYS does not describe, and KEYS entries the schema lacks."""
    paths = [path for path, _ in walk(catalog_schema())]
    missing = [
        f"{path} has no entry in docs/_ext/catalogkeys.py KEYS"
        for path in paths
        if path not in KEYS
    ]
    stale = [
        f"KEYS has {path}, which the catalog no longer has" for path in KEYS if path not in paths
    ]
    return missing + stale
