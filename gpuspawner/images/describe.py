"""What `gpuspawner-images describe` expects in an image, and how it reports what it found.

Pure: the engine layer runs :data:`PROBE` in a throwaway container of the image and
hands its output and the image's labels here. Which packages a stage must carry
comes from the matrix (the server's own packages; in the framework stage also the
framework and the image's ``libraries``), and the version each must have from the
matrix or, for a library, from the image's constraints file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from ..core.labels import IMAGE_LABEL_CUDA, IMAGE_LABEL_FRAMEWORK
from .matrix import ImageSpec, canonical_name
from .plan import FULL_STAGE

#: The line of the probe's output that carries its answer (anything else is ignored:
#: a start hook or a warning may print too).
MARKER = "GPUSPAWNER-DESCRIBE "

#: Run as ``python -c PROBE NAME...`` in the image: each distribution's installed
#: version (None when absent), read from the metadata pip wrote, without importing
#: anything (importing torch or tensorflow takes seconds and wants a GPU).
PROBE = (
    "import json, platform, sys\n"
    "from importlib import metadata\n"
    "found = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        found[name] = metadata.version(name)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        found[name] = None\n"
    f"print({MARKER!r} + json.dumps("
    "{'python': platform.python_version(), 'versions': found}), flush=True)\n"
)

#: Package roles, in the order they are listed.
ROLES = ("server", "framework", "library")


class ProbeError(ValueError):
    """The probe's output holds no answer; str() says what came back instead."""


@dataclass(frozen=True)
class Expected:
    """One package a stage must carry: its role and the version it must have (None: any)."""

    name: str
    role: str
    version: str | None


@dataclass(frozen=True)
class Package:
    name: str
    role: str
    expected: str | None
    installed: str | None

    @property
    def status(self) -> str:
        """One of "ok", "missing" or "differs" (installed, but not the expected version)."""
        if self.installed is None:
            return "missing"
        if self.expected is None or same_version(self.installed, self.expected):
            return "ok"
        return "differs"


@dataclass(frozen=True)
class Description:
    """What `describe` found in one built image."""

    name: str
    image: str
    stage: str
    framework: str | None
    cuda: str | None
    python: str | None
    labels: dict[str, str] = field(default_factory=dict)
    packages: tuple[Package, ...] = ()
    #: Why the image could not be described (not built, the probe failed), or None.
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(p.status == "ok" for p in self.packages)


def same_version(installed: str, expected: str) -> bool:
    """Equal releases, ignoring a local tag (torch's ``2.15.0+cu132`` is 2.15.0)."""
    try:
        return Version(installed).public == Version(expected).public
    except InvalidVersion:
        return installed == expected


def expected_packages(
    spec: ImageSpec, stage: str, pins: dict[str, str] | None = None
) -> list[Expected]:
    """What `stage` of `spec`'s image must carry. `pins`: the constraints file's
    (:func:`~gpuspawner.images.matrix.read_constraints`); without them a library
    may have any version."""
    if stage == "base":
        return []
    expected = [
        Expected("jupyterhub", "server", spec.jupyterhub),
        Expected("jupyterlab", "server", spec.jupyterlab),
        Expected("notebook", "server", spec.notebook),
    ]
    if stage != FULL_STAGE:
        return expected
    expected.append(Expected(spec.framework, "framework", spec.framework_version))
    pins = pins or {}
    expected += [Expected(lib, "library", pins.get(canonical_name(lib))) for lib in spec.libraries]
    return expected


def probe_command(expected: list[Expected]) -> list[str]:
    """The probe's arguments after ``python``."""
    return ["-c", PROBE, *(e.name for e in expected)]


def parse_probe(output: str) -> dict[str, Any]:
    """The probe's answer: {"python": "3.13.5", "versions": {name: version or None}}."""
    for line in reversed(output.splitlines()):
        if line.startswith(MARKER):
            try:
                answer = json.loads(line[len(MARKER) :])
            except ValueError:
                break
            if isinstance(answer, dict) and isinstance(answer.get("versions"), dict):
                return answer
            break
    tail = " | ".join(output.strip().splitlines()[-3:]) or "nothing"
    raise ProbeError(f"the probe printed no answer; its last output: {clean(tail)[:300]!r}")


def describe(
    spec: ImageSpec,
    image: str,
    stage: str,
    labels: dict[str, str] | None,
    expected: list[Expected],
    answer: dict[str, Any],
) -> Description:
    """Put the image's labels and the probe's answer beside what the matrix expects."""
    labels = dict(labels or {})
    versions = answer.get("versions") or {}
    packages = tuple(
        Package(
            e.name,
            e.role,
            e.version,
            versions.get(e.name) if isinstance(versions.get(e.name), str) else None,
        )
        for e in expected
    )
    python = answer.get("python")
    return Description(
        name=spec.name,
        image=image,
        stage=stage,
        framework=labels.get(IMAGE_LABEL_FRAMEWORK),
        cuda=labels.get(IMAGE_LABEL_CUDA),
        python=python if isinstance(python, str) else None,
        labels=labels,
        packages=packages,
    )


def failed(spec: ImageSpec, image: str, stage: str, why: str) -> Description:
    """An image that could not be described (not built, or its probe failed)."""
    return Description(spec.name, image, stage, None, None, None, error=why)


def clean(text: str) -> str:
    """Printable text: what an image says is data, and a terminal must not act on it."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def as_json(descriptions: list[Description]) -> dict[str, Any]:
    """The document `describe --json` prints."""
    return {
        "images": [
            {
                "name": d.name,
                "image": d.image,
                "stage": d.stage,
                "ok": d.ok,
                "error": d.error,
                "framework": d.framework,
                "cuda": d.cuda,
                "python": d.python,
                "labels": d.labels,
                "packages": [
                    {
                        "name": p.name,
                        "role": p.role,
                        "version": p.installed,
                        "expected": p.expected,
                        "status": p.status,
                    }
                    for p in d.packages
                ],
            }
            for d in descriptions
        ]
    }


def problems(description: Description) -> list[str]:
    """One sentence per thing wrong with the image, for people."""
    if description.error:
        return [f"{description.image}: {description.error}"]
    found = []
    for p in description.packages:
        if p.status == "missing":
            found.append(f"{description.image}: {p.name} ({p.role}) is not installed")
        elif p.status == "differs":
            found.append(
                f"{description.image}: {p.name} is {clean(p.installed or '')}, "
                f"the matrix and constraints say {p.expected}"
            )
    return found
