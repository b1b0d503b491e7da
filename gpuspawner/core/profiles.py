"""Turn the catalog (and what a user may still take) into a KubeSpawner ``profile_list``.

One profile per image, each with the profile options ``gpu_type`` and
``gpus``. KubeSpawner's form names them ``profile-option-<image>--gpu_type``
and ``profile-option-<image>--gpus`` and its ``options_from_form`` turns them
into ``{"profile": ..., "gpu_type": ..., "gpus": ...}`` — the same shape the
REST API takes — so KubeSpawner's form, jupyterhub-fancy-profiles and API
clients all work unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from .admission import figures_label
from .catalog import Catalog, GPUType, ImageSpec
from .limits import format_units
from .options import OPTION_GPU_TYPE, OPTION_GPUS, OPTION_TITLES

if TYPE_CHECKING:
    from .availability import Availability

_EPSILON = 1e-9

#: A count's mark on the form when no node can take it now, but one could once GPUs are freed.
MARK_NOT_FREE = "not free now"
#: A count's mark when no node of the type could ever hold it (the form disables it).
MARK_NEVER = "no node has that many"
# Best first: a count is marked as its best GPU type allows.
_MARK_ORDER = ("", MARK_NOT_FREE, MARK_NEVER)


def _type_label(gpu_type: GPUType) -> str:
    if gpu_type.memory and gpu_type.memory not in gpu_type.display_name:
        return f"{gpu_type.display_name} ({gpu_type.memory} per GPU)"
    return gpu_type.display_name


def _count_label(count: int) -> str:
    if count == 0:
        return "None (CPU only)"
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def offered_counts(
    image: ImageSpec, catalog: Catalog, room: Mapping[str, float | None] | None
) -> list[int]:
    """The counts the form offers for an image: allowed by the catalog and within the user's room."""
    counts: set[int] = set()
    for gpu_type in catalog.types_for_image(image):
        type_room = None if room is None else room.get(gpu_type.key)
        for n in catalog.counts_for_type(gpu_type):
            if type_room is None or n <= type_room + _EPSILON:
                counts.add(n)
    if catalog.cpu_allowed(image):
        counts.add(0)
    return sorted(counts)


def count_mark(count: int, availability: Availability | None) -> str:
    """A count's mark on the form for one GPU type: "" when it fits on a node now (or unknown).

    The one definition of the marks: the form's labels, the availability
    endpoint and the form's script all show these.
    """
    if availability is None or count <= 0 or availability.fits_now(count):
        return ""
    if not availability.fits_ever(count):
        return MARK_NEVER
    return MARK_NOT_FREE


def _best_mark(count: int, types: list[GPUType], availability: Mapping[str, Availability]) -> str:
    """The mark of ``count`` across the offered types with figures: the best any of them allows."""
    marks = [count_mark(count, availability[t.key]) for t in types if t.key in availability]
    return min(marks, key=_MARK_ORDER.index, default="")


def build_profile_list(
    catalog: Catalog,
    room: Mapping[str, float | None] | None = None,
    held_summary: str = "",
    availability: Mapping[str, Availability] | None = None,
    as_of: str = "",
) -> list[dict[str, Any]]:
    """A KubeSpawner ``profile_list`` for the catalog.

    ``room`` maps GPU type keys to how many more GPUs of that type the user
    may take (None: unlimited); types with no room left are not offered, and
    only counts that fit are. ``held_summary`` (e.g. "You are using 2 of your
    2 GPUs.") is shown on profiles whose GPU choices it removed.

    Each ``description`` is :class:`markupsafe.Markup`: the catalog's text is
    trusted markup (only admins write it), ``held_summary`` is plain text and is
    escaped into it.

    ``availability`` (GPU type key to live cluster figures) adds "N free of M
    (at most K on one node)" to each type, leaves out counts no node of any
    offered type could ever hold, and marks counts none can hold now.
    ``as_of`` (e.g. "14:05 UTC"), for a form that cannot refresh the figures,
    ends each type's figures with "as of <time>".
    """

    profiles = []
    for key, image in catalog.images.items():
        types = catalog.types_for_image(image)
        usable_types = [
            t
            for t in types
            if room is None
            or room.get(t.key) is None
            or room[t.key] + _EPSILON >= min(catalog.counts_for_type(t))
        ]
        counts = offered_counts(image, catalog, room)
        if availability is not None:
            counts = [
                n
                for n in counts
                if n == 0
                or any(
                    n in catalog.counts_for_type(t)
                    and count_mark(n, availability.get(t.key)) != MARK_NEVER
                    for t in usable_types
                )
            ]
        # The catalog's description is the admin's markup, shown as written; the
        # summary names the user's servers (text users choose), and is escaped
        # when it is joined to it. Every other string of the profile is escaped
        # by the form's template (GPUSpawner renders it with autoescape).
        description = Markup(image.description)
        if room is not None and len(usable_types) < len(types) and held_summary:
            description = (description + " " + held_summary).strip()
        if not counts:
            # Nothing fits right now: keep the image visible with its smallest
            # choice, and let the server-side check explain the limit.
            counts = [min(n for t in types for n in catalog.counts_for_type(t))] if types else [0]
            usable_types = types
        if not usable_types:
            usable_types = types

        is_default = key == catalog.defaults.image
        type_choices = {}
        for t in usable_types:
            label = _type_label(t)
            if availability is not None and t.key in availability:
                label = f"{label} \u2014 {figures_label(availability[t.key])}"
                if as_of:
                    label = f"{label} as of {as_of}"
            type_choices[t.key] = {
                "display_name": label,
                "default": is_default and t.key == catalog.defaults.gpu_type,
            }
        if type_choices and not any(c["default"] for c in type_choices.values()):
            next(iter(type_choices.values()))["default"] = True

        default_count = catalog.defaults.gpus if is_default else counts[0]
        if default_count not in counts:
            default_count = counts[0]
        count_choices = {}
        for n in counts:
            label = _count_label(n)
            mark = _best_mark(n, usable_types, availability) if availability is not None else ""
            if mark:
                label = f"{label} ({mark})"
            count_choices[str(n)] = {"display_name": label, "default": n == default_count}

        profile: dict[str, Any] = {
            "display_name": image.display_name,
            "slug": key,
            "description": description,
            "default": is_default,
            "profile_options": {},
        }
        if type_choices:
            profile["profile_options"][OPTION_GPU_TYPE] = {
                "display_name": OPTION_TITLES[OPTION_GPU_TYPE],
                "choices": type_choices,
            }
        profile["profile_options"][OPTION_GPUS] = {
            "display_name": OPTION_TITLES[OPTION_GPUS],
            "choices": count_choices,
        }
        profiles.append(profile)
    return profiles


def held_summary(used: float, limit: float | None, servers: list[str]) -> str:
    """A sentence for the form, e.g. "You are using 2 of your 2 GPUs (servers: default, exp1)."."""
    if limit is None or used <= _EPSILON:
        return ""
    listed = f" (servers: {', '.join(servers)})" if servers else ""
    return f"You are using {format_units(used)} of your {format_units(limit)} GPUs{listed}."
