"""The GPU catalog: which images, GPU types, counts and limits exist.

An admin writes the catalog once, as ``c.GPUSpawner.catalog = {...}`` or as a
YAML file named by ``c.GPUSpawner.catalog_file``; both go through
:func:`parse_catalog`, so the two forms accept exactly the same schema and
produce exactly the same error messages.

Every problem is reported as one :class:`CatalogError` naming the source, the
key path and what is wrong, e.g.::

    /etc/gpuspawner/catalog.yaml: gpu_types.a100.counts[1]: expected a whole number >= 1, got 'two'

This module is pure: it reads a file at most, and imports nothing from
JupyterHub or Kubernetes.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from . import labels
from .labels import DEFAULT_GPU_RESOURCE

#: Counts offered when the catalog does not list any.
DEFAULT_GPU_COUNTS = (0, 1, 2, 4, 8)
#: The taint NVIDIA's GPU operator and most managed clusters put on GPU nodes.
DEFAULT_GPU_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
#: The limit value an admin writes for "no limit".
UNLIMITED = "unlimited"

# Keys end up in label values and form field names, so they follow the
# Kubernetes label-value rules (and are lower case, like KubeSpawner slugs).
_KEY_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CUDA_RE = re.compile(r"^\d{1,2}\.\d{1,2}(\.\d{1,3})?$")
# Kubernetes extended resource names: an optional DNS prefix and a name.
_RESOURCE_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_QUANTITY_RE = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")
# Kubernetes' quantity suffixes (resource.Quantity): binary ones are powers of 1024,
# decimal ones powers of 1000.
_QUANTITY_FACTORS = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
_AFFINITY_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}

# Durations: a number of seconds, or days/hours/minutes/seconds in that order ("1h30m").
_DURATION_RE = re.compile(
    r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$",
    re.ASCII,  # full-width or Arabic-Indic digits are not a duration: \d alone reads any script's
)
_SECONDS_RE = re.compile(r"^\d+(?:\.\d+)?$", re.ASCII)
_DURATION_UNITS = (86400, 3600, 60, 1)
#: The longest duration the catalog accepts (ten years): longer is a typo, and would
#: overflow the dates computed from it.
MAX_DURATION = 3650 * 86400.0

#: Budget periods, and the weekday names a weekly reset is given with (Monday first, as
#: :meth:`datetime.date.weekday` counts).
BUDGET_PERIODS = ("day", "week", "month")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# A reset time: "HH:MM" (day), "<weekday> HH:MM" (week), "<1-28> HH:MM" (month); the day
# of a month stops at 28 so that every month has it.
_CLOCK = r"([01]?\d|2[0-3]):([0-5]\d)"
_RESET_RES = {
    "day": re.compile(rf"^{_CLOCK}$"),
    "week": re.compile(rf"^(?i:({'|'.join(WEEKDAYS)})) +{_CLOCK}$"),
    "month": re.compile(rf"^([1-9]|1\d|2[0-8]) +{_CLOCK}$"),
}
_RESET_EXAMPLES = {"day": "'06:00'", "week": "'monday 00:00'", "month": "'1 00:00'"}

#: Environment variables the spawner owns: an image's ``env`` may not set them.
RESERVED_ENV = frozenset({labels.ENV_VISIBLE_DEVICES, labels.ENV_DRIVER_CAPABILITIES})


def quantity_bytes(quantity: str) -> int:
    """A memory quantity as Kubernetes reads it, in whole bytes: ``'512Mi'`` -> 536870912.

    ``'8G'`` is 8 * 10**9 bytes as in Kubernetes (KubeSpawner's own suffixes would read
    it as GiB); fractions of a byte round up, as the API server rounds memory.
    """
    match = _QUANTITY_RE.match(quantity)
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    number = quantity[: len(quantity) - len(match.group(2) or "")]
    return math.ceil(Decimal(number) * _QUANTITY_FACTORS[match.group(2) or ""])


def parse_duration_text(text: str) -> float:
    """A duration as the catalog, the form and the CLI write it, in seconds.

    ``"90s"``, ``"30m"``, ``"8h"``, ``"2d"``, ``"1h30m"`` (units in that order, each at
    most once, no spaces), or a bare number of seconds (``"3600"``). Raises ValueError
    for anything else, for a negative or a non-finite value and for more than
    :data:`MAX_DURATION`.
    """
    if not isinstance(text, str):
        raise ValueError(f"not a duration: {text!r}")
    if _SECONDS_RE.match(text):
        seconds = float(text)
    else:
        match = _DURATION_RE.match(text)
        if not match or not text:
            raise ValueError(f"not a duration: {text!r}")
        seconds = sum(
            float(part) * unit
            for part, unit in zip(match.groups(), _DURATION_UNITS, strict=True)
            if part is not None
        )
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError(f"too long a duration: {text!r}")
    return seconds


class CatalogError(ValueError):
    """A catalog problem, as one sentence naming the source and the key."""

    def __init__(self, source: str, path: str, problem: str):
        self.source = source
        self.path = path
        self.problem = problem
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class IdleTimeoutBounds:
    """The idle timeouts (seconds) users may choose for an image's servers, and the form's default."""

    minimum: float
    maximum: float
    default: float

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` is within the bounds."""
        return self.minimum <= seconds <= self.maximum


@dataclass(frozen=True)
class ImageSpec:
    """A framework image users can pick (one KubeSpawner profile)."""

    key: str
    display_name: str
    image: str
    description: str = ""
    cuda: str | None = None
    default: bool = False
    gpu_types: tuple[str, ...] | None = None
    allow_cpu: bool = True
    cpu_guarantee: float | None = None
    cpu_limit: float | None = None
    mem_guarantee: str | None = None
    mem_limit: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: Who may use the image: hub groups and user names. None for both: everyone.
    groups: tuple[str, ...] | None = None
    users: tuple[str, ...] | None = None
    #: KubeSpawner trait values applied when the image is chosen, as a profile's
    #: ``kubespawner_override`` is (dicts merged into the configured value).
    kubespawner_override: Mapping[str, Any] = field(default_factory=dict)
    #: Seconds after its start when a server is stopped, whatever it does; None: no limit.
    max_runtime: float | None = None
    #: The longest "keep" (seconds) a user may choose (0: none); None: the culler's default.
    max_keep: float | None = None
    #: The bounds of the idle timeout users choose on the form; None: they choose none.
    idle_timeout: IdleTimeoutBounds | None = None

    @property
    def restricted(self) -> bool:
        """Whether only the named groups and users may use the image."""
        return self.groups is not None or self.users is not None

    def allows(self, user: str, groups: Iterable[str]) -> bool:
        """Whether ``user``, a member of ``groups``, may see and start the image."""
        if not self.restricted:
            return True
        if user in (self.users or ()):
            return True
        return any(group in (self.groups or ()) for group in groups)

    def describe_access(self) -> str:
        """Who may use the image, e.g. "groups 'licensed'; users 'alice'"."""
        if not self.restricted:
            return "everyone"
        parts = []
        if self.groups:
            parts.append("groups " + ", ".join(f"'{g}'" for g in self.groups))
        if self.users:
            parts.append("users " + ", ".join(f"'{u}'" for u in self.users))
        return "; ".join(parts)


@dataclass(frozen=True)
class GPUType:
    """A kind of GPU, as the cluster exposes it (a resource name plus node selection)."""

    key: str
    display_name: str
    resource: str = DEFAULT_GPU_RESOURCE
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = DEFAULT_GPU_TOLERATIONS
    memory: str = ""
    counts: tuple[int, ...] | None = None
    weight: float = 1.0
    #: Seconds after its start when a server of this type is stopped; None: no limit.
    #: Where the image has one too, the smaller applies.
    max_runtime: float | None = None

    @property
    def is_mig(self) -> bool:
        """True when the type is a MIG slice resource (``nvidia.com/mig-…``)."""
        return self.resource.startswith("nvidia.com/mig-")


@dataclass(frozen=True)
class Allowance:
    """How many GPUs one rule allows: ``None`` means unlimited."""

    total: float | None = None
    per_type: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class BudgetRules:
    """GPU-hour budgets (weighted GPU-hours per period): a default, per-group and per-user rules.

    A value of None is unlimited. The period starts at its reset time in UTC: each day at
    ``reset_seconds`` after midnight; each week on ``reset_weekday`` (0 is Monday); each
    month on day ``reset_day`` (1-28). :mod:`gpuspawner.core.budgets` does the arithmetic.
    """

    period: str = "week"
    reset_weekday: int = 0
    reset_day: int = 1
    reset_seconds: int = 0
    #: A request is refused when the rest of the budget cannot run it this long (seconds).
    min_session: float = 900.0
    default: float | None = None
    groups: Mapping[str, float | None] = field(default_factory=dict)
    users: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        """Whether any rule sets a budget (otherwise everyone is unlimited)."""
        return any(
            value is not None
            for value in (self.default, *self.groups.values(), *self.users.values())
        )


@dataclass(frozen=True)
class LimitRules:
    """Per-user GPU limits: a default, per-group and per-user rules, group pools; budgets."""

    default: Allowance = Allowance()
    groups: Mapping[str, Allowance] = field(default_factory=dict)
    users: Mapping[str, Allowance] = field(default_factory=dict)
    group_pools: Mapping[str, float] = field(default_factory=dict)
    gpu_hours: BudgetRules = BudgetRules()


@dataclass(frozen=True)
class Defaults:
    """The choice an empty request (``{}``) gets."""

    image: str
    gpu_type: str | None
    gpus: int


@dataclass(frozen=True)
class Catalog:
    """A validated catalog. Build it with :func:`parse_catalog`."""

    images: Mapping[str, ImageSpec]
    gpu_types: Mapping[str, GPUType]
    gpu_counts: tuple[int, ...]
    defaults: Defaults
    limits: LimitRules
    source: str = "c.GPUSpawner.catalog"

    def types_for_image(self, image: ImageSpec) -> list[GPUType]:
        """The GPU types an image may run on, in catalog order."""
        if image.gpu_types is None:
            return list(self.gpu_types.values())
        return [self.gpu_types[key] for key in image.gpu_types]

    def counts_for_type(self, gpu_type: GPUType) -> tuple[int, ...]:
        """The positive GPU counts allowed for a type."""
        if gpu_type.counts is not None:
            return gpu_type.counts
        return tuple(n for n in self.gpu_counts if n > 0)

    def cpu_allowed(self, image: ImageSpec) -> bool:
        """Whether the image may be started with no GPU."""
        return image.allow_cpu and 0 in self.gpu_counts

    def visible_to(self, user: str, groups: Iterable[str]) -> Catalog:
        """The catalog as ``user`` (a member of ``groups``) sees it: only the images they may use.

        The form, fancy-profiles, the availability figures and request checks
        all work on this, so an image a user may not use is, for them, an
        image that does not exist. The default image is open to everyone
        (:func:`parse_catalog` checks it), so the defaults still hold.
        """
        groups = list(groups)
        images = {key: image for key, image in self.images.items() if image.allows(user, groups)}
        if len(images) == len(self.images):
            return self
        return dataclasses.replace(self, images=images)


# ---------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------


class _Reader:
    """Walks the raw data, keeping the key path for error messages."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, problem: str) -> CatalogError:
        return CatalogError(self.source, path, problem)

    def mapping(self, value: Any, path: str, known: set[str] | None = None) -> Mapping:
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected a mapping of keys to values, got {_show(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(path, f"keys must be strings, got {_show(key)}")
        if known is not None:
            unknown = sorted(set(value) - known)
            if unknown:
                close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise self.fail(
                    _join(path, unknown[0]),
                    f"unknown key '{unknown[0]}'; {hint}expected one of: {', '.join(sorted(known))}",
                )
        return value

    def string(self, value: Any, path: str, allow_empty: bool = False) -> str:
        if not isinstance(value, str) or (not allow_empty and not value.strip()):
            raise self.fail(path, f"expected a non-empty string, got {_show(value)}")
        return value

    def key(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not _KEY_RE.match(value):
            raise self.fail(
                path,
                f"{_show(value)} is not a valid key: use 1-63 lower-case letters, digits and "
                "'-', starting and ending with a letter or digit",
            )
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, got {_show(value)}")
        return value

    def count(self, value: Any, path: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(path, f"expected a whole number >= {minimum}, got {_show(value)}")
        return value

    def number(self, value: Any, path: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise self.fail(path, f"expected a positive number, got {_show(value)}")
        return float(value)

    def quantity(self, value: Any, path: str) -> str:
        text = (
            str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        )
        if not isinstance(text, str) or not _QUANTITY_RE.match(text):
            raise self.fail(
                path, f"expected a Kubernetes quantity such as '8G' or '512Mi', got {_show(value)}"
            )
        return text

    def limit(self, value: Any, path: str, unit: str = "GPUs") -> float | None:
        """A number of ``unit`` >= 0 (GPUs, or GPU-hours for budgets), or 'unlimited' (None)."""
        if value == UNLIMITED:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise self.fail(
                path, f"expected a number of {unit} >= 0 or '{UNLIMITED}', got {_show(value)}"
            )
        return float(value)

    def parse_duration(self, value: Any, path: str, *, allow_zero: bool = False) -> float:
        """A duration (:func:`parse_duration_text`, or a number of seconds) > 0 (or >= 0)."""
        seconds = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value) if 0 <= value <= MAX_DURATION else None
        elif isinstance(value, str):
            try:
                seconds = parse_duration_text(value)
            except ValueError:
                seconds = None
        if seconds is None or (seconds == 0 and not allow_zero):
            at_least = "0 or more" if allow_zero else "more than 0"
            raise self.fail(
                path,
                f"expected a duration of {at_least} seconds, such as 3600, '30m', '8h' or "
                f"'1h30m' (at most {MAX_DURATION / 86400:g} days), got {_show(value)}",
            )
        return seconds

    def string_map(self, value: Any, path: str) -> dict[str, str]:
        mapping = self.mapping(value, path)
        out = {}
        for key, item in mapping.items():
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise self.fail(_join(path, key), f"expected a string value, got {_show(item)}")
            out[key] = str(item)
        return out

    def sequence(self, value: Any, path: str) -> list:
        if not isinstance(value, (list, tuple)):
            raise self.fail(path, f"expected a list, got {_show(value)}")
        return list(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


_TOP_KEYS = {"images", "gpu_types", "gpu_counts", "defaults", "limits"}
_IMAGE_KEYS = {
    "display_name",
    "description",
    "image",
    "cuda",
    "default",
    "gpu_types",
    "allow_cpu",
    "cpu_guarantee",
    "cpu_limit",
    "mem_guarantee",
    "mem_limit",
    "env",
    "groups",
    "users",
    "kubespawner_override",
    "max_runtime",
    "max_keep",
    "idle_timeout",
}
_IDLE_TIMEOUT_KEYS = {"min", "max", "default"}
_TYPE_KEYS = {
    "display_name",
    "resource",
    "node_selector",
    "node_affinity",
    "tolerations",
    "memory",
    "counts",
    "weight",
    "max_runtime",
}
_LIMIT_KEYS = {"default", "groups", "users", "group_pools", "gpu_hours"}
_BUDGET_KEYS = {"period", "reset", "min_session", "default", "groups", "users"}
_ALLOWANCE_KEYS = {"gpus", "per_type"}
_DEFAULT_KEYS = {"image", "gpu_type", "gpus"}


def parse_catalog(
    data: Any,
    source: str = "c.GPUSpawner.catalog",
    *,
    known_overrides: Collection[str] | None = None,
) -> Catalog:
    """Validate raw catalog data (from YAML or traitlets) and build a :class:`Catalog`.

    ``known_overrides``: the trait names an image's ``kubespawner_override``
    may set (KubeSpawner's, from the hub); None checks their shape only.
    Raises :class:`CatalogError` for the first problem found.
    """
    r = _Reader(source)
    top = r.mapping(data, "", _TOP_KEYS)
    if "images" not in top:
        raise r.fail("images", "the catalog must list at least one image")

    gpu_types = _parse_gpu_types(r, top.get("gpu_types", {}))
    gpu_counts = _parse_counts(r, top.get("gpu_counts", list(DEFAULT_GPU_COUNTS)), "gpu_counts", 0)
    if not gpu_types and 0 not in gpu_counts:
        raise r.fail("gpu_counts", "without gpu_types, 0 must be an allowed count")
    images = _parse_images(r, top["images"], gpu_types)

    for key, image in images.items():
        if not image.allow_cpu or 0 not in gpu_counts:
            if not gpu_types or (image.gpu_types is not None and not image.gpu_types):
                raise r.fail(
                    f"images.{key}",
                    "this image can be started neither without GPUs (CPU-only is off) "
                    "nor with any GPU type",
                )

    catalog = Catalog(
        images=images,
        gpu_types=gpu_types,
        gpu_counts=gpu_counts,
        defaults=Defaults(image="", gpu_type=None, gpus=0),
        limits=LimitRules(),
        source=source,
    )
    defaults = _parse_defaults(r, top.get("defaults", {}), catalog)
    limits = _parse_limits(r, top.get("limits", {}), gpu_types)
    catalog = Catalog(
        images=images,
        gpu_types=gpu_types,
        gpu_counts=gpu_counts,
        defaults=defaults,
        limits=limits,
        source=source,
    )
    if known_overrides is not None:
        check_override_names(catalog, known_overrides)
    return catalog


def _parse_counts(r: _Reader, value: Any, path: str, minimum: int) -> tuple[int, ...]:
    items = r.sequence(value, path)
    if not items:
        raise r.fail(path, "expected at least one GPU count")
    counts = [r.count(item, _join(path, i), minimum) for i, item in enumerate(items)]
    if len(set(counts)) != len(counts):
        raise r.fail(path, f"counts must not repeat, got {counts}")
    return tuple(sorted(counts))


def _parse_gpu_types(r: _Reader, value: Any) -> dict[str, GPUType]:
    raw = r.mapping(value, "gpu_types")
    types = {}
    for key, spec in raw.items():
        path = _join("gpu_types", key)
        r.key(key, path)
        spec = r.mapping(spec, path, _TYPE_KEYS)
        resource = spec.get("resource", DEFAULT_GPU_RESOURCE)
        if not isinstance(resource, str) or not _RESOURCE_RE.match(resource) or "/" not in resource:
            raise r.fail(
                _join(path, "resource"),
                "expected an extended resource name such as 'nvidia.com/gpu' or "
                f"'nvidia.com/mig-1g.10gb', got {_show(resource)}",
            )
        tolerations = spec.get("tolerations", list(DEFAULT_GPU_TOLERATIONS))
        types[key] = GPUType(
            key=key,
            display_name=r.string(spec.get("display_name", key), _join(path, "display_name")),
            resource=resource,
            node_selector=r.string_map(spec.get("node_selector", {}), _join(path, "node_selector")),
            node_affinity=_parse_affinity(
                r, spec.get("node_affinity", []), _join(path, "node_affinity")
            ),
            tolerations=_parse_tolerations(r, tolerations, _join(path, "tolerations")),
            memory=r.string(spec.get("memory", ""), _join(path, "memory"), allow_empty=True),
            counts=(
                _parse_counts(r, spec["counts"], _join(path, "counts"), 1)
                if "counts" in spec
                else None
            ),
            weight=r.number(spec.get("weight", 1), _join(path, "weight")),
            max_runtime=_optional(r.parse_duration, spec, "max_runtime", path),
        )
    return types


def _parse_tolerations(r: _Reader, value: Any, path: str) -> tuple[dict, ...]:
    out = []
    for i, item in enumerate(r.sequence(value, path)):
        item_path = _join(path, i)
        item = dict(r.mapping(item, item_path, _TOLERATION_KEYS))
        if item.get("operator", "Equal") not in ("Equal", "Exists"):
            raise r.fail(_join(item_path, "operator"), "expected 'Equal' or 'Exists'")
        if "effect" in item and item["effect"] not in _TOLERATION_EFFECTS:
            raise r.fail(
                _join(item_path, "effect"),
                f"expected one of {', '.join(sorted(_TOLERATION_EFFECTS))}, got {_show(item['effect'])}",
            )
        out.append(item)
    return tuple(out)


def _parse_affinity(r: _Reader, value: Any, path: str) -> tuple[dict, ...]:
    out = []
    for i, item in enumerate(r.sequence(value, path)):
        item_path = _join(path, i)
        item = dict(r.mapping(item, item_path, {"key", "operator", "values"}))
        r.string(item.get("key"), _join(item_path, "key"))
        if item.get("operator") not in _AFFINITY_OPERATORS:
            raise r.fail(
                _join(item_path, "operator"),
                f"expected one of {', '.join(sorted(_AFFINITY_OPERATORS))}, got {_show(item.get('operator'))}",
            )
        if "values" in item:
            item["values"] = [
                r.string(v, _join(_join(item_path, "values"), j))
                for j, v in enumerate(r.sequence(item["values"], _join(item_path, "values")))
            ]
        out.append(item)
    return tuple(out)


def _parse_images(r: _Reader, value: Any, gpu_types: Mapping[str, GPUType]) -> dict[str, ImageSpec]:
    raw = r.mapping(value, "images")
    if not raw:
        raise r.fail("images", "the catalog must list at least one image")
    images = {}
    for key, spec in raw.items():
        path = _join("images", key)
        r.key(key, path)
        spec = r.mapping(spec, path, _IMAGE_KEYS)
        if "image" not in spec:
            raise r.fail(_join(path, "image"), "every image needs an image reference")
        cuda = spec.get("cuda")
        if cuda is not None:
            cuda = (
                str(cuda) if isinstance(cuda, (int, float)) and not isinstance(cuda, bool) else cuda
            )
            if not isinstance(cuda, str) or not _CUDA_RE.match(cuda):
                raise r.fail(
                    _join(path, "cuda"),
                    f"expected a CUDA version such as '12.4', got {_show(spec.get('cuda'))}",
                )
        allowed_types = None
        if "gpu_types" in spec:
            allowed_types = []
            for i, type_key in enumerate(r.sequence(spec["gpu_types"], _join(path, "gpu_types"))):
                if not isinstance(type_key, str) or type_key not in gpu_types:
                    raise r.fail(
                        _join(_join(path, "gpu_types"), i),
                        f"unknown GPU type {_show(type_key)}; defined types: "
                        f"{', '.join(gpu_types) or '(none)'}",
                    )
                allowed_types.append(type_key)
            allowed_types = tuple(allowed_types)
        env = r.string_map(spec.get("env", {}), _join(path, "env"))
        for name in env:
            if not _ENV_NAME_RE.match(name):
                raise r.fail(
                    _join(_join(path, "env"), name), "not a valid environment variable name"
                )
            if name in RESERVED_ENV:
                raise r.fail(
                    _join(_join(path, "env"), name),
                    "is set by gpuspawner from the GPUs a server gets and cannot be set per image",
                )
        groups = _parse_names(r, spec, "groups", path)
        users = _parse_names(r, spec, "users", path)
        override = _parse_override(
            r,
            spec.get("kubespawner_override", {}),
            _join(path, "kubespawner_override"),
            spec,
            {t.resource for t in gpu_types.values()},
        )
        if (groups is not None or users is not None) and not (groups or users):
            raise r.fail(
                _join(path, "groups" if groups is not None else "users"),
                "no group or user is named, so nobody could use this image: name who may use "
                "it, or remove groups and users to open it to everyone",
            )
        cpu_guarantee = _optional(r.number, spec, "cpu_guarantee", path)
        cpu_limit = _optional(r.number, spec, "cpu_limit", path)
        mem_guarantee = _optional(r.quantity, spec, "mem_guarantee", path)
        mem_limit = _optional(r.quantity, spec, "mem_limit", path)
        if cpu_guarantee is not None and cpu_limit is not None and cpu_guarantee > cpu_limit:
            raise r.fail(
                _join(path, "cpu_guarantee"),
                f"{_show(spec['cpu_guarantee'])} is above cpu_limit {_show(spec['cpu_limit'])}; "
                "Kubernetes refuses a pod that requests more than its limit",
            )
        if (
            mem_guarantee is not None
            and mem_limit is not None
            and quantity_bytes(mem_guarantee) > quantity_bytes(mem_limit)
        ):
            raise r.fail(
                _join(path, "mem_guarantee"),
                f"{_show(mem_guarantee)} is above mem_limit {_show(mem_limit)}; Kubernetes "
                "refuses a pod that requests more than its limit",
            )
        images[key] = ImageSpec(
            key=key,
            display_name=r.string(spec.get("display_name", key), _join(path, "display_name")),
            image=r.string(spec["image"], _join(path, "image")),
            description=r.string(
                spec.get("description", ""), _join(path, "description"), allow_empty=True
            ),
            cuda=cuda,
            default=r.boolean(spec.get("default", False), _join(path, "default")),
            gpu_types=allowed_types,
            allow_cpu=r.boolean(spec.get("allow_cpu", True), _join(path, "allow_cpu")),
            cpu_guarantee=cpu_guarantee,
            cpu_limit=cpu_limit,
            mem_guarantee=mem_guarantee,
            mem_limit=mem_limit,
            env=env,
            groups=groups,
            users=users,
            kubespawner_override=override,
            max_runtime=_optional(r.parse_duration, spec, "max_runtime", path),
            max_keep=_optional(
                lambda v, p: r.parse_duration(v, p, allow_zero=True), spec, "max_keep", path
            ),
            idle_timeout=_optional(
                lambda v, p: _parse_idle_timeout(r, v, p), spec, "idle_timeout", path
            ),
        )
    marked = [key for key, image in images.items() if image.default]
    if len(marked) > 1:
        raise r.fail("images", f"only one image may be the default, got {', '.join(marked)}")
    return images


def _parse_idle_timeout(r: _Reader, value: Any, path: str) -> IdleTimeoutBounds:
    """An image's ``idle_timeout``: ``min`` and ``max`` (required), ``default`` (the ``min``)."""
    raw = r.mapping(value, path, _IDLE_TIMEOUT_KEYS)
    for name in ("min", "max"):
        if name not in raw:
            raise r.fail(
                _join(path, name),
                f"the idle timeout needs '{name}', such as min: 30m and max: 8h",
            )
    minimum = r.parse_duration(raw["min"], _join(path, "min"))
    maximum = r.parse_duration(raw["max"], _join(path, "max"))
    if minimum > maximum:
        raise r.fail(_join(path, "min"), f"{_show(raw['min'])} is above max {_show(raw['max'])}")
    default = minimum
    if "default" in raw:
        default = r.parse_duration(raw["default"], _join(path, "default"))
        if not minimum <= default <= maximum:
            raise r.fail(
                _join(path, "default"),
                f"{_show(raw['default'])} is not between min {_show(raw['min'])} "
                f"and max {_show(raw['max'])}",
            )
    return IdleTimeoutBounds(minimum=minimum, maximum=maximum, default=default)


# A KubeSpawner trait name (``kubespawner_override``'s keys).
_TRAIT_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
# How deep and how large an override value may be: YAML anchors can make a
# small file expand into a huge (or self-referencing) structure.
_OVERRIDE_MAX_DEPTH = 16
_OVERRIDE_MAX_ITEMS = 5000

#: Override names an image may not set at all, and the catalog key (or setting) to use.
REFUSED_OVERRIDES: Mapping[str, str] = {
    "image": "the image's own 'image' key names the image",
    "init_containers": (
        "gpuspawner adds the GPU check as an init container; set other init containers "
        "in c.KubeSpawner.init_containers, which it keeps"
    ),
    "privileged": (
        "a privileged container sees every GPU of its node, whatever it asked for; "
        "give GPUs with the catalog's gpu_types and gpu_counts"
    ),
}
#: Override names whose mapping may not hold some keys: what is refused, and why.
_GUARDED_OVERRIDE_KEYS = {
    "extra_resource_limits": "gpus",
    "extra_resource_guarantees": "gpus",
    "environment": "env",
    "extra_labels": "labels",
    "extra_annotations": "labels",
    "extra_container_config": "container",
    "extra_pod_config": "pod",
}
#: Catalog image keys that set a KubeSpawner trait of the same name.
_IMAGE_TRAIT_KEYS = ("cpu_guarantee", "cpu_limit", "mem_guarantee", "mem_limit")


def _guarded_key_problem(kind: str, key: str, gpu_resources: set[str]) -> str | None:
    """Why an override may not set ``key`` in a guarded mapping (None: it may)."""
    # serverpod imports this module (through options): imported here, not at the top.
    from .serverpod import is_gpu_resource

    if kind == "gpus" and is_gpu_resource(key, gpu_resources):
        return (
            f"'{key}' is a GPU, which gpuspawner requests from the GPU type and count a user "
            "chooses: use the catalog's gpu_types and gpu_counts instead"
        )
    if kind == "env" and key in RESERVED_ENV:
        return (
            f"'{key}' is set by gpuspawner from the GPUs a server gets, so that a server sees "
            "exactly its own GPUs: use the catalog's gpu_types and gpu_counts instead"
        )
    if kind == "labels" and key.startswith(labels.LABEL_PREFIX + "/"):
        return (
            f"'{key}' records the server's GPUs for limits, the culler and metrics, and only "
            "gpuspawner sets it: use the catalog's own keys instead"
        )
    if kind == "container" and key in ("resources", "env"):
        return (
            f"'{key}' would replace the GPU request and NVIDIA_VISIBLE_DEVICES gpuspawner sets: "
            "use the catalog's gpu_types, gpu_counts, env and cpu/mem keys instead"
        )
    if kind == "pod" and key in ("initContainers", "init_containers"):
        return (
            f"'{key}' would replace the GPU check gpuspawner adds as an init container: set "
            "other init containers in c.KubeSpawner.init_containers, which it keeps"
        )
    return None


def _plain_data(r: _Reader, value: Any, path: str, budget: list[int], depth: int = 0) -> Any:
    """A copy of ``value`` if it is YAML data (mappings with string keys, lists, scalars)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > _OVERRIDE_MAX_DEPTH:
        raise r.fail(
            path,
            f"the value is too large or too deeply nested (at most {_OVERRIDE_MAX_ITEMS} items, "
            f"{_OVERRIDE_MAX_DEPTH} levels)",
        )
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise r.fail(path, f"expected a finite number, got {_show(value)}")
        return value
    if isinstance(value, Mapping):
        return {
            key: _plain_data(r, item, _join(path, key), budget, depth + 1)
            for key, item in r.mapping(value, path).items()
        }
    if isinstance(value, (list, tuple)):
        return [
            _plain_data(r, item, _join(path, i), budget, depth + 1) for i, item in enumerate(value)
        ]
    raise r.fail(
        path,
        f"expected YAML data (a string, number, true/false, null, list or mapping), "
        f"got {_show(value)}",
    )


def _parse_override(
    r: _Reader, value: Any, path: str, spec: Mapping, gpu_resources: set[str]
) -> dict[str, Any]:
    """An image's ``kubespawner_override``: trait names to plain values, none of them guarded.

    Whether each name is a KubeSpawner trait is checked where KubeSpawner is
    known (:func:`check_override_names`); this module imports no KubeSpawner.
    """
    raw = r.mapping(value, path)
    budget = [_OVERRIDE_MAX_ITEMS]
    out: dict[str, Any] = {}
    for name, item in raw.items():
        item_path = _join(path, name)
        if not _TRAIT_NAME_RE.match(name):
            raise r.fail(item_path, f"{_show(name)} is not a KubeSpawner trait name")
        if name in REFUSED_OVERRIDES:
            raise r.fail(item_path, f"may not be overridden: {REFUSED_OVERRIDES[name]}")
        if name in _IMAGE_TRAIT_KEYS and spec.get(name) is not None:
            raise r.fail(
                item_path,
                f"the image sets '{name}' with its own key already: set it once, there",
            )
        item = _plain_data(r, item, item_path, budget)
        kind = _GUARDED_OVERRIDE_KEYS.get(name)
        if kind is not None and isinstance(item, Mapping):
            for key in item:
                problem = _guarded_key_problem(kind, key, gpu_resources)
                if problem:
                    raise r.fail(_join(item_path, key), f"may not be overridden: {problem}")
        out[name] = item
    return out


def check_override_names(catalog: Catalog, known: Collection[str]) -> None:
    """Raise :class:`CatalogError` for an override name that is not one of ``known`` (the trait names).

    The error names the closest known name, so a typo (``cpu_limt``) reads as one.
    """
    for key, image in catalog.images.items():
        for name in image.kubespawner_override:
            if name in known:
                continue
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see KubeSpawner's configuration"
            raise CatalogError(
                catalog.source,
                _join(_join(_join("images", key), "kubespawner_override"), name),
                f"KubeSpawner has no trait '{name}': {hint}",
            )


def _parse_names(r: _Reader, spec: Mapping, name: str, path: str) -> tuple[str, ...] | None:
    """An image's ``groups`` or ``users``: a list of names, or None when not given."""
    if name not in spec:
        return None
    names_path = _join(path, name)
    value = spec[name]
    if isinstance(value, str):
        raise r.fail(
            names_path, f"expected a list of {name}, such as [{_show(value)}], got {_show(value)}"
        )
    names = [
        r.string(item, _join(names_path, i)) for i, item in enumerate(r.sequence(value, names_path))
    ]
    return tuple(dict.fromkeys(names))


def _optional(parse, spec: Mapping, name: str, path: str):
    if spec.get(name) is None:
        return None
    return parse(spec[name], _join(path, name))


def _parse_defaults(r: _Reader, value: Any, catalog: Catalog) -> Defaults:
    raw = r.mapping(value, "defaults", _DEFAULT_KEYS)
    if "image" in raw:
        image_key = raw["image"]
        if image_key not in catalog.images:
            raise r.fail(
                "defaults.image",
                f"unknown image {_show(image_key)}; defined images: {', '.join(catalog.images)}",
            )
    else:
        marked = [key for key, image in catalog.images.items() if image.default]
        open_to_all = [key for key, image in catalog.images.items() if not image.restricted]
        if not marked and not open_to_all:
            raise r.fail(
                "images",
                "every image names groups or users, but an empty request starts the default "
                "image, which must be open to everyone: remove groups and users from one image",
            )
        image_key = marked[0] if marked else open_to_all[0]
    image = catalog.images[image_key]
    if image.restricted:
        where = "defaults.image" if "image" in raw else _join(_join("images", image_key), "default")
        raise r.fail(
            where,
            f"the default image '{image_key}' names groups or users, but an empty request "
            "starts it for anyone: choose an image open to everyone as the default",
        )
    types = catalog.types_for_image(image)

    if "gpu_type" in raw:
        type_key = raw["gpu_type"]
        if type_key not in {t.key for t in types}:
            raise r.fail(
                "defaults.gpu_type",
                f"{_show(type_key)} is not a GPU type the default image '{image_key}' may use",
            )
    else:
        type_key = types[0].key if types else None

    if "gpus" in raw:
        gpus = r.count(raw["gpus"], "defaults.gpus", 0)
        if gpus == 0 and not catalog.cpu_allowed(image):
            raise r.fail(
                "defaults.gpus", f"the default image '{image_key}' may not run without GPUs"
            )
        if gpus > 0 and (
            type_key is None or gpus not in catalog.counts_for_type(catalog.gpu_types[type_key])
        ):
            raise r.fail(
                "defaults.gpus", f"{gpus} is not an allowed GPU count for the default GPU type"
            )
    elif catalog.cpu_allowed(image):
        gpus = 0
    else:
        gpus = catalog.counts_for_type(catalog.gpu_types[type_key])[0]
    return Defaults(image=image_key, gpu_type=type_key, gpus=gpus)


def _parse_allowance(
    r: _Reader, value: Any, path: str, gpu_types: Mapping[str, GPUType]
) -> Allowance:
    if not isinstance(value, Mapping):
        return Allowance(total=r.limit(value, path))
    raw = r.mapping(value, path, _ALLOWANCE_KEYS)
    per_type = {}
    for type_key, limit in r.mapping(raw.get("per_type", {}), _join(path, "per_type")).items():
        if type_key not in gpu_types:
            raise r.fail(
                _join(_join(path, "per_type"), type_key),
                f"unknown GPU type; defined types: {', '.join(gpu_types) or '(none)'}",
            )
        per_type[type_key] = r.limit(limit, _join(_join(path, "per_type"), type_key))
    total = r.limit(raw.get("gpus", UNLIMITED), _join(path, "gpus"))
    return Allowance(total=total, per_type=per_type)


def _parse_limits(r: _Reader, value: Any, gpu_types: Mapping[str, GPUType]) -> LimitRules:
    raw = r.mapping(value, "limits", _LIMIT_KEYS)
    default = _parse_allowance(r, raw.get("default", UNLIMITED), "limits.default", gpu_types)
    groups = {
        name: _parse_allowance(r, rule, _join("limits.groups", name), gpu_types)
        for name, rule in r.mapping(raw.get("groups", {}), "limits.groups").items()
    }
    users = {
        name: _parse_allowance(r, rule, _join("limits.users", name), gpu_types)
        for name, rule in r.mapping(raw.get("users", {}), "limits.users").items()
    }
    pools = {}
    for name, cap in r.mapping(raw.get("group_pools", {}), "limits.group_pools").items():
        limit = r.limit(cap, _join("limits.group_pools", name))
        if limit is not None:
            pools[name] = limit
    gpu_hours = _parse_budgets(r, raw["gpu_hours"]) if "gpu_hours" in raw else BudgetRules()
    return LimitRules(
        default=default, groups=groups, users=users, group_pools=pools, gpu_hours=gpu_hours
    )


def _parse_reset(r: _Reader, value: Any, path: str, period: str) -> tuple[int, int, int]:
    """A reset time for ``period`` -> (weekday, day of month, seconds after midnight)."""
    example = _RESET_EXAMPLES[period]
    if isinstance(value, int) and not isinstance(value, bool) and period == "day":
        # YAML 1.1 reads an unquoted 12:30 as the base-60 number 750
        raise r.fail(
            path,
            f"expected a time such as {example} in quotes, got {_show(value)} "
            "(YAML reads an unquoted time such as 12:30 as a number)",
        )
    match = _RESET_RES[period].match(value) if isinstance(value, str) else None
    if not match:
        what = {
            "day": "a UTC time (HH:MM) for a daily budget",
            "week": "a weekday and a UTC time for a weekly budget",
            "month": "a day of the month (1-28) and a UTC time for a monthly budget",
        }[period]
        raise r.fail(path, f"expected {what}, such as {example}, got {_show(value)}")
    *day, hour, minute = match.groups()
    seconds = int(hour) * 3600 + int(minute) * 60
    if period == "week":
        return WEEKDAYS.index(day[0].lower()), 1, seconds
    if period == "month":
        return 0, int(day[0]), seconds
    return 0, 1, seconds


def _parse_budgets(r: _Reader, value: Any) -> BudgetRules:
    path = "limits.gpu_hours"
    raw = r.mapping(value, path, _BUDGET_KEYS)
    period = raw.get("period", "week")
    if period not in BUDGET_PERIODS:
        raise r.fail(
            _join(path, "period"),
            f"expected one of {', '.join(BUDGET_PERIODS)}, got {_show(period)}",
        )
    weekday, day, seconds = (
        _parse_reset(r, raw["reset"], _join(path, "reset"), period) if "reset" in raw else (0, 1, 0)
    )
    min_session = (
        r.parse_duration(raw["min_session"], _join(path, "min_session"), allow_zero=True)
        if "min_session" in raw
        else BudgetRules.min_session
    )
    return BudgetRules(
        period=period,
        reset_weekday=weekday,
        reset_day=day,
        reset_seconds=seconds,
        min_session=min_session,
        default=r.limit(raw.get("default", UNLIMITED), _join(path, "default"), "GPU-hours"),
        groups={
            name: r.limit(rule, _join(_join(path, "groups"), name), "GPU-hours")
            for name, rule in r.mapping(raw.get("groups", {}), _join(path, "groups")).items()
        },
        users={
            name: r.limit(rule, _join(_join(path, "users"), name), "GPU-hours")
            for name, rule in r.mapping(raw.get("users", {}), _join(path, "users")).items()
        },
    )


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------


def load_catalog_file(
    path: str | os.PathLike, *, known_overrides: Collection[str] | None = None
) -> Catalog:
    """Read and validate a YAML catalog file (``known_overrides``: see :func:`parse_catalog`)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(source, "", "the catalog file does not exist") from None
    except OSError as e:
        raise CatalogError(source, "", f"the catalog file cannot be read ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise CatalogError(source, "", f"invalid YAML at {where}: {problem}") from None
    if data is None:
        raise CatalogError(source, "", "the catalog file is empty")
    return parse_catalog(data, source, known_overrides=known_overrides)


class CatalogFile:
    """A catalog file that is re-read when it changes.

    ``get()`` stats the file (cheap) and re-parses it only when its
    modification time, size or inode changed. A change that does not validate
    keeps the last good catalog in service and records the error in
    ``last_error``, so a typo made while the hub runs never breaks spawning.
    """

    def __init__(self, path: str | os.PathLike, *, known_overrides: Collection[str] | None = None):
        self.path = Path(path)
        #: The trait names an image's ``kubespawner_override`` may set (see :func:`parse_catalog`).
        self.known_overrides = known_overrides
        self._stamp: tuple[int, int, int] | None = None
        self._catalog: Catalog | None = None
        self.last_error: CatalogError | None = None

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def get(self) -> tuple[Catalog, bool]:
        """Return the catalog in effect and whether it was (re)loaded by this call.

        Raises :class:`CatalogError` only when no valid catalog was ever loaded.
        """
        stamp = self._current_stamp()
        if self._catalog is not None and stamp == self._stamp:
            return self._catalog, False
        try:
            catalog = load_catalog_file(self.path, known_overrides=self.known_overrides)
        except CatalogError as e:
            self._stamp = stamp
            self.last_error = e
            if self._catalog is None:
                raise
            return self._catalog, False
        self._stamp = stamp
        self._catalog = catalog
        self.last_error = None
        return catalog, True
