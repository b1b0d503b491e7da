"""Turn a spawn request's ``user_options`` into a validated :class:`Selection`.

Requests arrive from KubeSpawner's form, from jupyterhub-fancy-profiles, from
the REST API (``{"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}``) or
from options saved by an earlier spawn. They all come here, so every path gets
the same checks and the same messages. A refusal is a
:class:`~gpuspawner.core.refusals.Refusal` built with
:func:`~gpuspawner.core.refusals.refuse`: one sentence from the table of
refusals, the HTTP status and a short reason label for metrics.

Anything the user sent that a message repeats is quoted with
:func:`~gpuspawner.core.refusals.shown`, so a refusal or a log line never carries
a raw newline, NUL or terminal escape from a request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .catalog import Catalog, GPUType, ImageSpec, parse_duration_text

# ``Refusal``, the reasons, ``shown``, ``listing`` and ``escape_unprintable`` stay
# importable from here (and from gpuspawner.options) for code written before they
# moved to gpuspawner.core.refusals; the package's own modules import them from there.
from .refusals import (
    REASON_INVALID,
    REASON_NO_PROFILE,
    REASON_UNLISTED_CHOICE,
    Refusal,
    listing,
    refuse,
    shown,
)
from .refusals import escape_unprintable as escape_unprintable

#: The keys GPUSpawner reads from ``user_options``; anything else is ignored.
OPTION_PROFILE = "profile"
OPTION_GPU_TYPE = "gpu_type"
OPTION_GPUS = "gpus"
#: The user's idle timeout: minutes (a number, or digits on the form), or a duration ("1h30m").
OPTION_IDLE_TIMEOUT = "idle_timeout"
KNOWN_OPTIONS = frozenset({OPTION_PROFILE, OPTION_GPU_TYPE, OPTION_GPUS, OPTION_IDLE_TIMEOUT})
#: What the form calls the two profile options.
OPTION_TITLES = {OPTION_GPU_TYPE: "GPU type", OPTION_GPUS: "Number of GPUs"}
#: KubeSpawner's key for a free-form value of a profile option (``gpus--unlisted-choice``).
UNLISTED_CHOICE_SUFFIX = "--unlisted-choice"

# The largest count a request may name: enough for any node, and small enough
# that a number in a message stays short.
_MAX_COUNT = 999_999
_DIGITS = re.compile(r"[0-9]{1,6}")
# Minutes as the form's number input sends them: plain ASCII digits, maybe a decimal part.
_MINUTES = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?")
# A duration string longer than this is not read (it cannot be a sensible timeout).
_MAX_DURATION_TEXT = 32
# Seconds of slack when a value is compared with the bounds: the form shows a bound in
# minutes to 3 decimals (100 s is "1.667"), which must still be accepted when sent back.
_BOUND_EPSILON = 0.1


@dataclass(frozen=True)
class Selection:
    """What a server is started with: an image, and a GPU type and count (or none)."""

    image: ImageSpec
    gpu_type: GPUType | None
    gpus: int
    #: The idle timeout the culler applies, in seconds: the user's choice or the image's
    #: default, within the image's ``idle_timeout`` bounds; None when the image has none.
    idle_timeout: float | None = None

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0

    def describe(self) -> str:
        """A short phrase for messages, e.g. "PyTorch with 2 × NVIDIA A100"."""
        if not self.is_gpu or self.gpu_type is None:
            return f"{self.image.display_name} without GPUs"
        return f"{self.image.display_name} with {self.gpus} × {self.gpu_type.display_name}"


def parse_count(value: Any) -> int | None:
    """A GPU count from a form string or JSON number, or None if it is not a whole number.

    Only plain ASCII decimal digits are accepted, as docs/users.md documents:
    ``" 1"``, ``"+1"``, ``"1.0"``, a full-width ``"\\uff11"``, ``"1e9"``, ``"-1"``,
    ``"0x2"``, ``True`` and ``2.0`` are all refused, so nothing is trimmed,
    rounded, coerced or evaluated.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= _MAX_COUNT else None
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None


def parse_idle_timeout(value: Any) -> float | None:
    """Seconds from a request's ``idle_timeout``, or None when it cannot be read.

    A number (JSON) or a string of plain digits (the form's number input) is
    minutes: ``90``, ``"90"``, ``"1.5"``. Any other string is a duration as the
    catalog writes them (``"1h30m"``, ``"45m"``, ``"2h"``). Booleans, zero,
    negative or non-finite values are not read.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        seconds = float(value) * 60
    elif isinstance(value, str) and _MINUTES.fullmatch(value):
        seconds = float(value) * 60
    elif isinstance(value, str) and 0 < len(value) <= _MAX_DURATION_TEXT and value.isascii():
        # ASCII only: a full-width or other script's digit is not read as a number
        try:
            seconds = float(parse_duration_text(value))
        except (TypeError, ValueError):
            return None
    else:
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return seconds


def minutes_text(seconds: float) -> str:
    """Seconds as the form's minutes: ``5400`` -> "90", ``90`` -> "1.5"."""
    return f"{seconds / 60:.3f}".rstrip("0").rstrip(".")


def resolve_idle_timeout(value: Any, image: ImageSpec) -> float | None:
    """The idle timeout a request chooses for ``image``, in seconds; raise :class:`Refusal` if invalid.

    Not given (or empty, as a form may send it): the image's default, or None
    when the image offers no choice. An image without ``idle_timeout`` bounds
    refuses any value, so nobody can lengthen the admin's idle rule.
    """
    bounds = image.idle_timeout
    if value in (None, ""):
        return bounds.default if bounds is not None else None
    if bounds is None:
        raise refuse(REASON_INVALID, "idle-timeout-not-offered", image=image.display_name)
    seconds = parse_idle_timeout(value)
    if seconds is None:
        raise refuse(
            REASON_INVALID,
            "idle-timeout-unreadable",
            value=value,
            minimum=minutes_text(bounds.minimum),
            maximum=minutes_text(bounds.maximum),
        )
    if not bounds.minimum - _BOUND_EPSILON <= seconds <= bounds.maximum + _BOUND_EPSILON:
        raise refuse(
            REASON_INVALID,
            "idle-timeout-bounds",
            minutes=minutes_text(seconds),
            image=image.display_name,
            minimum=minutes_text(bounds.minimum),
            maximum=minutes_text(bounds.maximum),
        )
    return min(max(seconds, bounds.minimum), bounds.maximum)


def unlisted_choices(user_options: Any) -> dict[str, Any]:
    """The ``<option>--unlisted-choice`` values a request sets, by option name.

    Empty values count as not set, as in KubeSpawner.
    """
    if not isinstance(user_options, dict):
        return {}
    return {
        key[: -len(UNLISTED_CHOICE_SUFFIX)]: value
        for key, value in user_options.items()
        if isinstance(key, str) and key.endswith(UNLISTED_CHOICE_SUFFIX) and value
    }


def unlisted_choice_refusal(option: str, title: str | None, choices: Iterable[str]) -> Refusal:
    """The refusal of ``<option>--unlisted-choice`` where no unlisted choice is enabled.

    ``title`` is the option's name on the form (None: the profile has no such
    option); ``choices`` are the values it lists, already quoted.
    """
    key = option + UNLISTED_CHOICE_SUFFIX
    choices = list(choices)
    if title is None or not choices:
        return refuse(REASON_UNLISTED_CHOICE, "no-such-option", key=key, option=option)
    return refuse(
        REASON_UNLISTED_CHOICE,
        "not-enabled",
        key=key,
        title=title,
        option=option,
        choices=listing(choices),
    )


def no_such_profile(value: Any, choices: Iterable[str], *, status: int = 400) -> Refusal:
    """The refusal of a profile that does not exist (or that the user may not see).

    ``choices`` names the profiles the user may choose. The sentence and the
    status are the same whether the profile does not exist or is not for this
    user, so a refusal reveals nothing about images the user may not see.
    """
    return refuse(
        REASON_NO_PROFILE, "no-such-profile", status=status, value=value, choices=listing(choices)
    )


def resolve_selection(user_options: Any, catalog: Catalog) -> Selection:
    """Validate ``user_options`` against the catalog; raise :class:`Refusal` if invalid.

    ``catalog`` is what the user may see (:meth:`Catalog.visible_to`), so an
    image they may not use is refused exactly like one that does not exist.
    Missing keys take the catalog's defaults; unknown keys are ignored and
    never change what is spawned. Unlisted choices (``gpus--unlisted-choice``)
    are refused: the catalog's options have none. The idle timeout is checked
    against the chosen image's bounds (:func:`resolve_idle_timeout`).
    """
    if user_options is None:
        user_options = {}
    if not isinstance(user_options, dict):
        raise refuse(REASON_INVALID, "options-not-object")
    selection = _resolve_gpus(user_options, catalog)
    idle_timeout = resolve_idle_timeout(user_options.get(OPTION_IDLE_TIMEOUT), selection.image)
    if idle_timeout is None:
        return selection
    return replace(selection, idle_timeout=idle_timeout)


def _resolve_gpus(user_options: dict, catalog: Catalog) -> Selection:
    """The image, GPU type and count of a request (no idle timeout yet)."""
    image = _resolve_image(user_options.get(OPTION_PROFILE), catalog)
    _refuse_unlisted_choices(user_options, image, catalog)
    explicit_type = user_options.get(OPTION_GPU_TYPE)
    raw_count = user_options.get(OPTION_GPUS)
    image_is_default = user_options.get(OPTION_PROFILE) in (None, "")

    gpus = _resolve_count(raw_count, catalog) if raw_count not in (None, "") else None

    if gpus == 0:
        if not catalog.cpu_allowed(image):
            raise refuse(
                REASON_INVALID,
                "cpu-not-allowed",
                image=image.display_name,
                counts=listing([str(n) for n in _positive_counts(image, catalog)]),
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
            raise refuse(REASON_INVALID, "no-gpu-type", image=image.display_name)
        return Selection(image=image, gpu_type=gpu_type, gpus=catalog.counts_for_type(gpu_type)[0])

    if gpu_type is None:
        raise refuse(REASON_INVALID, "image-without-gpus", image=image.display_name)
    allowed = catalog.counts_for_type(gpu_type)
    if gpus not in allowed:
        raise refuse(
            REASON_INVALID,
            "count-not-for-type",
            gpus=gpus,
            gpu_type=gpu_type.display_name,
            counts=listing([str(n) for n in allowed]),
        )
    return Selection(image=image, gpu_type=gpu_type, gpus=gpus)


def profile_choices(catalog: Catalog) -> list[str]:
    """The catalog's profiles as a refusal names them: "'pytorch' (PyTorch)"."""
    return [f"{shown(key)} ({image.display_name})" for key, image in catalog.images.items()]


def _resolve_image(value: Any, catalog: Catalog) -> ImageSpec:
    if value in (None, ""):
        return catalog.images[catalog.defaults.image]
    if isinstance(value, str) and value in catalog.images:
        return catalog.images[value]
    names = profile_choices(catalog)
    # 403 for a profile that does not exist too: the answer must not tell the
    # two apart, and "you may not use this" is true of both.
    raise no_such_profile(value, names, status=403)


def _refuse_unlisted_choices(user_options: dict, image: ImageSpec, catalog: Catalog) -> None:
    for option in sorted(unlisted_choices(user_options)):
        if option == OPTION_GPU_TYPE and catalog.types_for_image(image):
            choices = [shown(t.key) for t in catalog.types_for_image(image)]
            raise unlisted_choice_refusal(option, OPTION_TITLES[option], choices)
        if option == OPTION_GPUS:
            counts = ([0] if catalog.cpu_allowed(image) else []) + _positive_counts(image, catalog)
            raise unlisted_choice_refusal(option, OPTION_TITLES[option], [str(n) for n in counts])
        raise unlisted_choice_refusal(option, None, [])


def _resolve_type(value: Any, image: ImageSpec, catalog: Catalog) -> GPUType:
    if not isinstance(value, str) or value not in catalog.gpu_types:
        names = [f"'{t.key}'" for t in catalog.types_for_image(image)]
        if not names:
            raise refuse(
                REASON_INVALID, "no-such-type-cpu-only", value=value, image=image.display_name
            )
        raise refuse(REASON_INVALID, "no-such-type", value=value, types=listing(names))
    gpu_type = catalog.gpu_types[value]
    if gpu_type not in catalog.types_for_image(image):
        names = [t.display_name for t in catalog.types_for_image(image)]
        if not names:
            raise refuse(
                REASON_INVALID,
                "type-not-for-cpu-image",
                image=image.display_name,
                gpu_type=gpu_type.display_name,
            )
        raise refuse(
            REASON_INVALID,
            "type-not-for-image",
            image=image.display_name,
            gpu_type=gpu_type.display_name,
            types=listing(names),
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
        raise refuse(
            REASON_INVALID,
            "count-invalid",
            value=value,
            counts=listing([str(n) for n in _all_counts(catalog)]),
        )
    if count not in _all_counts(catalog):
        raise refuse(
            REASON_INVALID,
            "count-not-allowed",
            gpus=count,
            counts=listing([str(n) for n in _all_counts(catalog)]),
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


def resolve_profile(user_options: Mapping[str, Any], profile_list: list[dict]) -> dict:
    """Check a request against a plain KubeSpawner ``profile_list``; the chosen profile.

    Without a catalog GPUSpawner applies profiles as KubeSpawner does; this
    checks first what KubeSpawner would turn into a ``KeyError`` or a
    message that repeats the raw request: an unknown profile or choice, and an
    unlisted choice that the option does not enable (or whose value does not
    match the option's ``validation_regex``). ``profile_list`` is initialized
    (KubeSpawner's ``_get_initialized_profile_list``).
    """
    slug = user_options.get(OPTION_PROFILE)
    if not slug:
        profile = next((p for p in profile_list if p.get("default")), profile_list[0])
    else:
        profile = next((p for p in profile_list if p.get("slug") == slug), None)
        if profile is None:
            raise no_such_profile(slug, [shown(p.get("slug")) for p in profile_list])
    options = profile.get("profile_options") or {}
    unlisted = unlisted_choices(user_options)
    for name in sorted(unlisted):
        option = options.get(name)
        if option is None:
            raise unlisted_choice_refusal(name, None, [])
        title = option.get("display_name", name)
        settings = option.get("unlisted_choice") or {}
        if not settings.get("enabled"):
            raise unlisted_choice_refusal(
                name, title, [shown(c) for c in option.get("choices") or {}]
            )
        value = unlisted[name]
        regex = settings.get("validation_regex")
        if not isinstance(value, str) or (regex and not re.match(regex, value)):
            hint = str(settings.get("validation_message") or "enter a value it accepts")
            raise refuse(
                REASON_UNLISTED_CHOICE,
                "value-refused",
                value=value,
                title=title,
                hint=hint.rstrip("."),
            )
    for name, option in options.items():
        choice = user_options.get(name)
        if not choice or name in unlisted:
            continue
        choices = option.get("choices") or {}
        if not isinstance(choice, str) or choice not in choices:
            title = option.get("display_name", name)
            raise refuse(
                REASON_INVALID,
                "not-a-choice",
                value=choice,
                title=title,
                choices=", ".join(shown(c) for c in choices),
            )
    return profile
