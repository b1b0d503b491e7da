"""Checks run while the hub reads its configuration, so a bad catalog stops the hub at once.

JupyterHub creates spawners only when servers start, so nothing would notice
a broken catalog until the first user tried. ``check_catalog(c)``, called at
the end of ``jupyterhub_config.py``, validates it while the hub starts and
stops the hub with one line naming the file, the key and the problem.
"""

from __future__ import annotations

import sys
from typing import Any

from ..core.catalog import Catalog, CatalogError, load_catalog_file, parse_catalog


def load_configured_catalog(config: Any) -> Catalog | None:
    """The catalog named by a traitlets Config (``c.GPUSpawner.catalog_file`` or ``.catalog``)."""
    section = config.GPUSpawner if "GPUSpawner" in config else {}
    if section.get("catalog_file"):
        return load_catalog_file(section["catalog_file"])
    if section.get("catalog"):
        return parse_catalog(section["catalog"], "c.GPUSpawner.catalog")
    return None


def check_catalog(config: Any) -> Catalog | None:
    """Validate the configured catalog; on a problem print it on one line and exit with status 1."""
    try:
        return load_configured_catalog(config)
    except CatalogError as e:
        print(
            f"gpuspawner: the GPU catalog is invalid, so the hub will not start: {e}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuspawner.hub.catalogcheck CATALOG.yaml``: check a catalog file before deploying it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m gpuspawner.hub.catalogcheck CATALOG.yaml", file=sys.stderr)
        return 2
    try:
        catalog = load_catalog_file(args[0])
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
