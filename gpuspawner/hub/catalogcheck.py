"""Checks run while the hub reads its configuration, so a bad catalog stops the hub at once.

JupyterHub creates spawners only when servers start, so nothing would notice
a broken catalog until the first user tried. ``check_catalog(c)``, called at
the end of ``jupyterhub_config.py``, validates it while the hub starts and
stops the hub with one line naming the file, the key and the problem.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from ..core.catalog import Catalog, CatalogError, load_catalog_file, parse_catalog
from ..core.profiles import slug_collisions


@functools.cache
def override_trait_names() -> frozenset[str]:
    """The names a catalog image's ``kubespawner_override`` may set: KubeSpawner's configurable traits.

    GPUSpawner's own traits are not among them: an image may not switch off its GPU check.
    """
    from kubespawner import KubeSpawner

    return frozenset(KubeSpawner.class_trait_names(config=True))


def load_configured_catalog(config: Any) -> Catalog | None:
    """The catalog named by a traitlets Config (``c.GPUSpawner.catalog_file`` or ``.catalog``)."""
    section = config.GPUSpawner if "GPUSpawner" in config else {}
    known = override_trait_names()
    if section.get("catalog_file"):
        return load_catalog_file(section["catalog_file"], known_overrides=known)
    if section.get("catalog"):
        return parse_catalog(section["catalog"], "c.GPUSpawner.catalog", known_overrides=known)
    return None


def configured_profile_list(config: Any) -> Any:
    """The admin's ``profile_list`` (GPUSpawner's section over KubeSpawner's), None if unset."""
    for section in ("GPUSpawner", "KubeSpawner"):
        if section in config and config[section].get("profile_list"):
            return config[section]["profile_list"]
    return None


def check_profile_list(catalog: Catalog, profile_list: Any) -> str:
    """What the hub says at start of a ``profile_list`` beside the catalog.

    Raises :class:`CatalogError` when a profile's slug is also a catalog image
    key: a request naming it could not say which it meant.
    """
    from .compat import initialized_profiles

    if callable(profile_list):
        return "the profiles of the callable profile_list are offered after the catalog's"
    if isinstance(profile_list, dict):
        # KubeSpawner 7.1 reads a dict's profiles ordered by key
        profile_list = [profile_list[key] for key in sorted(profile_list)]
    profiles = initialized_profiles(list(profile_list))
    for slug in slug_collisions(catalog.images, profiles):
        raise CatalogError(
            catalog.source,
            f"images.{slug}",
            f"the profile_list profile with slug '{slug}' has the same name as the catalog "
            f"image '{slug}': rename one of them",
        )
    count = len(profiles)
    if count == 1:
        return "1 profile from profile_list is offered after the catalog's"
    return f"{count} profiles from profile_list are offered after the catalog's"


def check_budgets_are_accounted(catalog: Catalog, config: Any) -> None:
    """Raises :class:`CatalogError` when the catalog sets GPU-hours budgets that nothing counts:
    every GPU request of a user with a budget would be refused."""
    section = config.GPUSpawner if "GPUSpawner" in config else {}
    if catalog.limits.gpu_hours.enabled and section.get("accounting_enabled", True) is False:
        raise CatalogError(
            catalog.source,
            "limits.gpu_hours",
            "GPU-hours budgets need GPU-hours accounting, which is off "
            "(c.GPUSpawner.accounting_enabled = False): turn it on, or remove the budgets",
        )


def check_catalog(config: Any) -> Catalog | None:
    """Validate the configured catalog; on a problem print it on one line and exit with status 1.

    A ``profile_list`` configured beside the catalog is checked too, and the
    hub says how many of its profiles it offers.
    """
    try:
        catalog = load_configured_catalog(config)
        profile_list = configured_profile_list(config)
        said = check_profile_list(catalog, profile_list) if catalog and profile_list else ""
        if catalog is not None:
            check_budgets_are_accounted(catalog, config)
    except CatalogError as e:
        print(
            f"gpuspawner: the GPU catalog is invalid, so the hub will not start: {e}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    if said:
        print(f"gpuspawner: {said}.", file=sys.stderr)
    return catalog


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuspawner.hub.catalogcheck CATALOG.yaml``: check a catalog file before deploying it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m gpuspawner.hub.catalogcheck CATALOG.yaml", file=sys.stderr)
        return 2
    try:
        catalog = load_catalog_file(args[0], known_overrides=override_trait_names())
    except CatalogError as e:
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    print(
        f"ok: {len(catalog.images)} images, {len(catalog.gpu_types)} GPU types, "
        f"counts {', '.join(map(str, catalog.gpu_counts))}; an empty request starts "
        f"'{catalog.defaults.image}' with {catalog.defaults.gpus} GPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
