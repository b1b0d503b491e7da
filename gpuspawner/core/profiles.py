"""Turn the catalog (and what a user may still take) into a KubeSpawner ``profile_list``.

One profile per image, each with the profile options ``gpu_type`` and
``gpus``. KubeSpawner's form names them ``profile-option-<image>--gpu_type``
and ``profile-option-<image>--gpus`` and its ``options_from_form`` turns them
into ``{"profile": ..., "gpu_type": ..., "gpus": ...}`` — the same shape the
REST API takes — so KubeSpawner's form, jupyterhub-fancy-profiles and API
clients all work unchanged.

An admin's own ``profile_list`` beside the catalog is offered after the
catalog's profiles (:func:`merge_profile_lists`). A GPU such a profile asks
for through its ``kubespawner_override`` (:func:`gpu_demand`) becomes a
:class:`~gpuspawner.core.options.Selection` (:func:`listed_selection`), so it
is limited, admitted and checked like a catalog choice.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from .admission import figures_label
from .catalog import Catalog, GPUType, ImageSpec
from .limits import format_units
from .options import (
    OPTION_GPU_TYPE,
    OPTION_GPUS,
    OPTION_TITLES,
    UNLISTED_CHOICE_SUFFIX,
    Selection,
    parse_count,
)
from .refusals import escape_unprintable, shown
from .serverpod import is_gpu_resource

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


# ---------------------------------------------------------------------------
# an admin's profile_list beside the catalog
# ---------------------------------------------------------------------------

#: The KubeSpawner traits through which a profile asks for GPUs.
GPU_REQUEST_TRAITS = ("extra_resource_limits", "extra_resource_guarantees")
# A label value: what a GPU type key becomes on the pod (gpuspawner.io/gpu-type).
_LABEL_VALUE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def slug_collisions(catalog_keys: Collection[str], profile_list: Iterable[Mapping]) -> list[str]:
    """The slugs of an (initialized) ``profile_list`` that are also catalog image keys."""
    return [p["slug"] for p in profile_list if p.get("slug") in catalog_keys]


def merge_profile_lists(
    catalog_profiles: list[dict[str, Any]], listed: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The catalog's profiles, then an admin's (initialized) ``profile_list`` ones.

    The catalog's default stays the default (an empty request starts it), so
    the listed profiles lose theirs when the catalog offers any. Their
    descriptions are the admin's markup, shown as KubeSpawner shows them;
    every other string is escaped by the form's template.
    """
    merged = list(catalog_profiles)
    for profile in listed:
        profile = dict(profile)
        if catalog_profiles:
            profile["default"] = False
        if "description" in profile and isinstance(profile["description"], str):
            profile["description"] = Markup(profile["description"])
        merged.append(profile)
    return merged


def listed_choices(listed: Iterable[Mapping[str, Any]]) -> list[str]:
    """A ``profile_list``'s profiles as a refusal names them: "'cpu' (CPU only)"."""
    return [
        f"{shown(p.get('slug'))} ({escape_unprintable(str(p.get('display_name') or p.get('slug')))})"
        for p in listed
    ]


def chosen_overrides(profile: Mapping[str, Any], user_options: Mapping[str, Any]) -> list[dict]:
    """The ``kubespawner_override`` mappings KubeSpawner applies for a profile, in its order.

    The profile's own, then for each of its ``profile_options`` the chosen
    choice's (an unlisted choice's when one is sent, else the default
    choice's). The mappings are the profile's own objects, not copies, so a
    caller may resolve callables in them in place. ``profile`` is initialized
    (KubeSpawner's ``_get_initialized_profile_list``).
    """
    overrides = [profile.get("kubespawner_override") or {}]
    for option_name, option in (profile.get("profile_options") or {}).items():
        if user_options.get(option_name + UNLISTED_CHOICE_SUFFIX):
            overrides.append(
                (option.get("unlisted_choice") or {}).get("kubespawner_override") or {}
            )
            continue
        choices = option.get("choices") or {}
        chosen = user_options.get(option_name)
        if not chosen:
            chosen = next((k for k, c in choices.items() if c.get("default")), None)
        if chosen in choices:
            overrides.append(choices[chosen].get("kubespawner_override") or {})
    return overrides


@dataclass(frozen=True)
class GPUDemand:
    """GPUs a profile asks for outside the catalog: a resource and a count."""

    resource: str
    count: int


def gpu_demand(
    limits: Mapping[str, Any] | None,
    guarantees: Mapping[str, Any] | None,
    gpu_resources: Collection[str] = (),
) -> GPUDemand | None:
    """The GPUs a server asks for through ``extra_resource_limits``/``_guarantees`` (None: none).

    ``gpu_resources`` are the catalog's GPU resource names; any other resource
    with a GPU prefix (``nvidia.com/gpu``, ``nvidia.com/mig-…``) is a GPU too
    (:func:`gpuspawner.core.serverpod.is_gpu_resource`). The count is the
    larger of the limit and the guarantee. Raises ``ValueError`` with a
    sentence for the admin when the count is not a whole number or more than
    one GPU resource is asked for: neither could be counted against limits.
    """
    counts: dict[str, int] = {}
    for section in (limits or {}, guarantees or {}):
        for name, value in section.items():
            if not is_gpu_resource(name, gpu_resources):
                continue
            count = parse_count(value if isinstance(value, (int, str)) else None)
            if count is None:
                raise ValueError(
                    f"the GPU resource {shown(name)} is asked for with {shown(value)}, "
                    "which is not a whole number of GPUs"
                )
            counts[name] = max(counts.get(name, 0), count)
    asked = {name: count for name, count in counts.items() if count > 0}
    if len(asked) > 1:
        raise ValueError(
            f"more than one GPU resource is asked for ({', '.join(map(shown, sorted(asked)))}), "
            "so the server's GPUs cannot be counted against its user's limit"
        )
    if not asked:
        return None
    ((resource, count),) = asked.items()
    return GPUDemand(resource, count)


def resource_type_key(resource: str) -> str:
    """The GPU type key of a resource no catalog type names: the resource, as a label value.

    It has a '.' (every GPU resource has a DNS prefix), which catalog keys
    never have, so it never stands for a catalog type in limits.
    """
    return _LABEL_VALUE_UNSAFE.sub("-", resource)[:63].strip("-_.") or "gpu"


def gpu_type_for_resource(resource: str, catalog: Catalog) -> GPUType:
    """The catalog's GPU type of ``resource`` when exactly one has it, else one named by it.

    With one catalog type the GPUs are that type's: its per-type limits,
    weight, placement and live figures apply. Otherwise the type cannot be
    known, and the GPUs count against the user's total by resource name.
    """
    matching = [t for t in catalog.gpu_types.values() if t.resource == resource]
    if len(matching) == 1:
        return matching[0]
    return GPUType(key=resource_type_key(resource), display_name=resource, resource=resource)


def listed_selection(
    profile: Mapping[str, Any], image: str, demand: GPUDemand | None, catalog: Catalog
) -> Selection:
    """What a ``profile_list`` profile starts, as the catalog's machinery reads a choice.

    ``image`` is the image the profile's overrides leave the server with.
    """
    spec = ImageSpec(
        key=str(profile["slug"]),
        display_name=str(profile.get("display_name") or profile["slug"]),
        image=image,
    )
    if demand is None:
        return Selection(image=spec, gpu_type=None, gpus=0)
    return Selection(
        image=spec, gpu_type=gpu_type_for_resource(demand.resource, catalog), gpus=demand.count
    )
