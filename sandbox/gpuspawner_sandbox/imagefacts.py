"""What the image tool says about the images, asked of the tool itself.

The sandbox imports nothing from gpuspawner, and parses neither ``images/matrix.yaml``
nor a catalog file on its own: it runs ``python -m gpuspawner.images.cli facts --json``
(``gpuspawner-images facts``, docs/images.md "Facts for programs") in the repository
and reads its JSON. From there come the hub image the chart runs and its tag (the
package version), the notebook images' stage tags and the label a stage build carries,
zero-to-jupyterhub's other images, and the images a catalog names.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ImageFactsError(Exception):
    """The image tool could not answer, or answered something else; the message says which."""


@dataclass(frozen=True)
class ChartImage:
    """One of zero-to-jupyterhub's images besides the hub, as the tool names it."""

    name: str
    ref: str
    #: Its Dockerfile (built by ``gpuspawner-images build NAME``); None for the pause
    #: image, which the sandbox makes from the real nodes' own (:func:`.nodes.pause_spec`).
    dockerfile: str | None = None
    #: Host-built programs the Dockerfile copies (``build --binary NAME=PATH``).
    binaries: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageFacts:
    """``gpuspawner-images facts --json``, read."""

    #: The package version: the hub image's tag.
    version: str
    #: The label whose value is the stage an image was built to (``build --target``).
    stage_label: str
    stages: tuple[str, ...]
    #: The hub image, ``<registry>/hub:<version>``.
    hub_ref: str
    #: Notebook image name -> stage -> image reference.
    notebook_refs: Mapping[str, Mapping[str, str]]
    chart_images: tuple[ChartImage, ...]
    #: Catalog file (as passed) -> the image references it names, sorted.
    catalogs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The GPU check's image (``gpuspawner-images build NAME``): (name, reference), or None
    #: when the matrix has none.
    validation: tuple[str, str] | None = None
    #: What ``gpuspawner-images build`` is given, in order, to make the hub image on an
    #: engine that reaches no registry (the k8s-hub rebuild, then the hub FROM it).
    hub_offline_build: tuple[str, ...] = ()

    def stage_refs(self, names: Iterable[str], stage: str) -> list[str]:
        """The references of these notebook images at ``stage``, in the order given."""
        if stage not in self.stages:
            raise ImageFactsError(
                f"{stage!r} is not a stage of the notebook images ({', '.join(self.stages)})."
            )
        names = list(names)
        unknown = [n for n in names if n not in self.notebook_refs]
        if unknown:
            raise ImageFactsError(
                f"The image tool knows no notebook image {', '.join(unknown)} "
                f"(it knows {', '.join(self.notebook_refs)})."
            )
        return [self.notebook_refs[n][stage] for n in names]


def tool_command(catalogs: Sequence[str | Path] = ()) -> list[str]:
    """The image tool's ``facts --json``, with the catalogs whose images are wanted."""
    return [
        sys.executable,
        "-m",
        "gpuspawner.images.cli",
        "facts",
        "--json",
        *(f"--catalog={c}" for c in catalogs),
    ]


def _get(data: Mapping[str, Any], key: str, kind: type, where: str = "") -> Any:
    value = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(value, kind):
        raise ImageFactsError(
            f"`gpuspawner-images facts --json` gave no {where}{key} ({kind.__name__}); "
            "is the image tool older than the sandbox?"
        )
    return value


def parse_facts(text: str) -> ImageFacts:
    """The tool's JSON, checked for what the sandbox reads (pure)."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ImageFactsError(f"`gpuspawner-images facts --json` printed no JSON: {e}") from None
    if not isinstance(data, dict):
        raise ImageFactsError("`gpuspawner-images facts --json` printed no JSON object.")
    hub = _get(data, "hub", dict)
    notebook_refs = {
        _get(image, "name", str, "notebook_images[]."): {
            str(stage): str(ref)
            for stage, ref in _get(image, "refs", dict, "notebook_images[].").items()
        }
        for image in _get(data, "notebook_images", list)
    }
    chart = tuple(
        ChartImage(
            name=_get(image, "name", str, "chart_images[]."),
            ref=_get(image, "ref", str, "chart_images[]."),
            dockerfile=image.get("dockerfile"),
            binaries=tuple(image.get("binaries") or ()),
        )
        for image in _get(data, "chart_images", list)
    )
    check = data.get("validation")
    validation = (
        (_get(check, "name", str, "validation."), _get(check, "ref", str, "validation."))
        if check is not None
        else None
    )
    return ImageFacts(
        version=_get(data, "version", str),
        stage_label=_get(data, "stage_label", str),
        stages=tuple(_get(data, "stages", list)),
        hub_ref=_get(hub, "ref", str, "hub."),
        notebook_refs=notebook_refs,
        chart_images=chart,
        catalogs={str(path): tuple(refs) for path, refs in (data.get("catalogs") or {}).items()},
        validation=validation,
        hub_offline_build=tuple(str(n) for n in _get(hub, "offline_build", list, "hub.")),
    )


def image_facts(repo: Path, catalogs: Sequence[str | Path] = ()) -> ImageFacts:
    """Ask the image tool, run in ``repo`` (whose ``images/matrix.yaml`` it reads).

    Raises :class:`ImageFactsError` with the tool's own words when it fails.
    """
    command = tool_command(catalogs)
    try:
        proc = subprocess.run(
            command, cwd=repo, capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImageFactsError(f"`gpuspawner-images facts` could not run: {e}") from None
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
        raise ImageFactsError(
            f"`gpuspawner-images facts` failed (exit {proc.returncode}): " + " ".join(said)
        )
    return parse_facts(proc.stdout)
