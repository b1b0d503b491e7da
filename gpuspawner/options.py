"""Turn a spawn request's ``user_options`` into a validated :class:`Selection`.

Requests arrive from KubeSpawner's form, from jupyterhub-fancy-profiles, from
the REST API (``{"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}``) or
from options saved by an earlier spawn. They all come here, so every path gets
the same checks and the same messages. A refusal is a :class:`Refusal`: one
sentence the user can act on, plus the HTTP status and a short reason label
for metrics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog, GPUType, ImageSpec

#: The keys GPUSpawner reads from ``user_options``; anything else is ignored.
OPTION_PROFILE = "profile"
OPTION_GPU_TYPE = "gpu_type"
OPTION_GPUS = "gpus"
KNOWN_OPTIONS = frozenset({OPTION_PROFILE, OPTION_GPU_TYPE, OPTION_GPUS})

_DIGITS = re.compile(r"^[0-9]{1,6}$")


class Refusal(Exception):
    """A spawn request that is refused, with a message for the user."""

    def __init__(self, message: str, *, status: int = 400, reason: str = "invalid-request"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Selection:
    """What a server is started with: an image, and a GPU type and count (or none)."""

    image: ImageSpec
    gpu_type: GPUType | None
    gpus: int

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0

    def describe(self) -> str:
        """A short phrase for messages, e.g. "PyTorch with 2 × NVIDIA A100"."""
        if not self.is_gpu or self.gpu_type is None:
            return f"{self.image.display_name} without GPUs"
        return f"{self.image.display_name} with {self.gpus} × {self.gpu_type.display_name}"


def _listing(values: list[str]) -> str:
    if len(values) == 1:
        return values[0]
    return ", ".join(values[:-1]) + " or " + values[-1]


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 40 else text[:37] + "..."


def parse_count(value: Any) -> int | None:
    """A GPU count from a form string or JSON number, or None if it is not a whole number.

    Only plain decimal digits are accepted: ``"1.5"``, ``"1e9"``, ``"-1"``,
    ``"0x2"``, ``True`` and ``2.0`` are all refused, so nothing is rounded,
    coerced or evaluated.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        text = value.strip()
        if _DIGITS.match(text):
            return int(text)
    return None


def resolve_selection(user_options: Any, catalog: Catalog) -> Selection:
    """Validate ``user_options`` against the catalog; raise :class:`Refusal` if invalid.

    Missing keys take the catalog's defaults; unknown keys are ignored and
    never change what is spawned.
    """
    if user_options is None:
        user_options = {}
    if not isinstance(user_options, dict):
        raise Refusal('The server options must be a JSON object such as {"profile": "..."}.')

    image = _resolve_image(user_options.get(OPTION_PROFILE), catalog)
    explicit_type = user_options.get(OPTION_GPU_TYPE)
    raw_count = user_options.get(OPTION_GPUS)
    image_is_default = user_options.get(OPTION_PROFILE) in (None, "")

    gpus = _resolve_count(raw_count, catalog) if raw_count not in (None, "") else None

    if gpus == 0:
        if not catalog.cpu_allowed(image):
            raise Refusal(
                f"{image.display_name} cannot run without GPUs: choose a number of GPUs "
                f"({_listing([str(n) for n in _positive_counts(image, catalog)])})."
            )
        # A GPU type sent along with 0 GPUs (KubeSpawner's form always sends
        # both) is still checked, so a typo is not silently accepted.
        if explicit_type not in (None, ""):
            _resolve_type(explicit_type, image, catalog)
        return Selection(image=image, gpu_type=None, gpus=0)

    if explicit_type in (None, ""):
        gpu_type = _default_type(image, catalog, image_is_default)
    else:
        gpu_type = _resolve_type(explicit_type, image, catalog)

    if gpus is None:
        if gpu_type is not None and explicit_type not in (None, ""):
            # A type was chosen without a count: the smallest count of that type.
            return Selection(
                image=image, gpu_type=gpu_type, gpus=catalog.counts_for_type(gpu_type)[0]
            )
        if image_is_default:
            default = catalog.defaults
            if default.gpus == 0:
                return Selection(image=image, gpu_type=None, gpus=0)
            return Selection(
                image=image, gpu_type=catalog.gpu_types[default.gpu_type], gpus=default.gpus
            )
        if catalog.cpu_allowed(image):
            return Selection(image=image, gpu_type=None, gpus=0)
        if gpu_type is None:
            raise Refusal(f"{image.display_name} has no GPU type configured; ask an admin.")
        return Selection(image=image, gpu_type=gpu_type, gpus=catalog.counts_for_type(gpu_type)[0])

    if gpu_type is None:
        raise Refusal(f"{image.display_name} cannot be given GPUs: choose 0 GPUs.")
    allowed = catalog.counts_for_type(gpu_type)
    if gpus not in allowed:
        raise Refusal(
            f"{gpus} is not an allowed number of {gpu_type.display_name} GPUs: "
            f"choose {_listing([str(n) for n in allowed])}."
        )
    return Selection(image=image, gpu_type=gpu_type, gpus=gpus)


def _resolve_image(value: Any, catalog: Catalog) -> ImageSpec:
    if value in (None, ""):
        return catalog.images[catalog.defaults.image]
    if isinstance(value, str) and value in catalog.images:
        return catalog.images[value]
    names = [f"'{key}' ({image.display_name})" for key, image in catalog.images.items()]
    raise Refusal(f"There is no profile {_shown(value)}: choose one of {_listing(names)}.")


def _resolve_type(value: Any, image: ImageSpec, catalog: Catalog) -> GPUType:
    if not isinstance(value, str) or value not in catalog.gpu_types:
        names = [f"'{t.key}'" for t in catalog.types_for_image(image)]
        if not names:
            raise Refusal(
                f"There is no GPU type {_shown(value)}, and {image.display_name} runs without GPUs."
            )
        raise Refusal(f"There is no GPU type {_shown(value)}: choose {_listing(names)}.")
    gpu_type = catalog.gpu_types[value]
    if gpu_type not in catalog.types_for_image(image):
        names = [t.display_name for t in catalog.types_for_image(image)]
        alternatives = f"choose {_listing(names)}" if names else "choose 0 GPUs"
        raise Refusal(
            f"{image.display_name} cannot run on {gpu_type.display_name} GPUs: {alternatives}."
        )
    return gpu_type


def _default_type(image: ImageSpec, catalog: Catalog, image_is_default: bool) -> GPUType | None:
    types = catalog.types_for_image(image)
    if image_is_default and catalog.defaults.gpu_type is not None:
        return catalog.gpu_types[catalog.defaults.gpu_type]
    return types[0] if types else None


def _resolve_count(value: Any, catalog: Catalog) -> int:
    count = parse_count(value)
    if count is None:
        raise Refusal(
            f"{_shown(value)} is not a valid number of GPUs: choose one of "
            f"{_listing([str(n) for n in _all_counts(catalog)])}."
        )
    if count not in _all_counts(catalog):
        raise Refusal(
            f"{count} is not an allowed number of GPUs: choose one of "
            f"{_listing([str(n) for n in _all_counts(catalog)])}."
        )
    return count


def _all_counts(catalog: Catalog) -> list[int]:
    counts = set(catalog.gpu_counts)
    for gpu_type in catalog.gpu_types.values():
        counts.update(catalog.counts_for_type(gpu_type))
    return sorted(counts)


def _positive_counts(image: ImageSpec, catalog: Catalog) -> list[int]:
    counts: set[int] = set()
    for gpu_type in catalog.types_for_image(image):
        counts.update(catalog.counts_for_type(gpu_type))
    return sorted(counts)


def ignored_options(user_options: Any) -> list[str]:
    """The keys of a request that GPUSpawner does not read (to log them once)."""
    if not isinstance(user_options, dict):
        return []
    return sorted(str(k) for k in user_options if k not in KNOWN_OPTIONS)
