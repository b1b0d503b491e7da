"""The catalog's GPU types against the inventory: figures per type, for the form and its endpoint.

Pure: a :class:`~gpuspawner.core.catalog.Catalog` and an
:class:`~gpuspawner.inventory.model.Inventory` in, plain data out. The
``live_`` functions read a watch's current snapshot (no I/O), for the hub's form
and the gpuspawner service's endpoint alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core.admission import figures_label
from ..core.catalog import Catalog, ImageSpec
from ..core.placement import Placement
from ..core.profiles import count_mark
from .model import Availability, Inventory, demand_for

if TYPE_CHECKING:
    from .reflectors import InventoryReflector


def catalog_availability(
    inventory: Inventory,
    catalog: Catalog,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Availability]:
    """Figures for every GPU type of the catalog, keyed by type key.

    ``node_selector`` and ``tolerations`` are the admin's KubeSpawner settings
    that every pod gets on top of the type's own.
    """
    return {
        key: inventory.availability(demand_for(gpu_type, node_selector, tolerations))
        for key, gpu_type in catalog.gpu_types.items()
    }


def alternatives(
    catalog: Catalog,
    image: ImageSpec,
    type_key: str,
    gpus: int,
    figures: Mapping[str, Availability],
) -> dict[str, Availability]:
    """The other types the image may use with the same count, by display name (to suggest
    in a refusal): a type whose catalog counts do not include ``gpus`` is no way out."""
    return {
        t.display_name: figures[t.key]
        for t in catalog.types_for_image(image)
        if t.key != type_key and t.key in figures and gpus in catalog.counts_for_type(t)
    }


def availability_payload(
    catalog: Catalog, figures: Mapping[str, Availability] | None, problem: str = ""
) -> dict[str, Any]:
    """The JSON the form polls: per type its label and figures, per image its types.

    ``catalog`` is what the user sees (:meth:`~gpuspawner.core.catalog.Catalog.visible_to`):
    only their images, and only the GPU types those images may use.
    ``figures`` is None when the inventory is not available; ``problem`` then
    says why (shown to nobody but the form's console and admins).
    Its ``pods_namespace`` is the one namespace whose pods were counted ("":
    every namespace), so that the form can say GPUs held elsewhere look free.
    """
    if figures is None:
        return {
            "available": False,
            "problem": problem,
            "pods_namespace": "",
            "types": {},
            "images": {},
        }
    images = {
        key: [t.key for t in catalog.types_for_image(image)]
        for key, image in catalog.images.items()
    }
    used = {type_key for type_keys in images.values() for type_key in type_keys}
    types = {}
    for key, gpu_type in catalog.gpu_types.items():
        availability = figures.get(key)
        if availability is None or key not in used:
            continue
        types[key] = {
            **availability.as_dict(),
            "display_name": gpu_type.display_name,
            "label": figures_label(availability),
            "counts": {
                str(n): count_mark(n, availability) for n in catalog.counts_for_type(gpu_type)
            },
        }
    return {
        "available": True,
        "problem": "",
        "pods_namespace": pods_namespace(figures),
        "types": types,
        "images": images,
    }


def pods_namespace(figures: Mapping[str, Availability]) -> str:
    """The one namespace whose pods the figures counted; "" when they counted every namespace."""
    # One inventory makes every type's figures, so they agree; a mix (never seen) is
    # reported as the narrower view, which is the one that may overstate free GPUs.
    return next((a.pods_namespace for a in figures.values() if a.pods_namespace), "")


def live_figures(
    inventory: InventoryReflector | None, catalog: Catalog, placement: Placement
) -> dict[str, Availability] | None:
    """The catalog's figures from a watch's current snapshot; None while it is unavailable."""
    if inventory is None or not inventory.ready:
        return None
    return catalog_availability(
        inventory.inventory, catalog, placement.node_selector, placement.tolerations
    )


def live_payload(
    inventory: InventoryReflector | None, catalog: Catalog | None, placement: Placement
) -> dict[str, Any]:
    """What the gpuspawner service answers the form (see gpuspawner.userservice.availability).

    ``catalog`` is None when the catalog is invalid; ``inventory`` None when the
    GPU inventory is turned off.
    """
    if catalog is None:
        return availability_payload(None, None, "the catalog is invalid")
    found = live_figures(inventory, catalog, placement)
    problem = ""
    if found is None:
        if inventory is None:
            problem = "the GPU inventory is turned off"
        elif inventory.missing_permissions:
            problem = " ".join(inventory.missing_permissions)
        else:
            problem = "the GPU inventory is still loading"
    return availability_payload(catalog, found, problem)
