"""What one release is called everywhere, derived from the one version source.

``gpuspawner/_version.py`` holds the package's PEP 440 version; everything else that
names the release is computed here, so that no second literal can drift from it:

- the wheel's version: the PEP 440 string itself (pyproject reads ``_version.py``);
- the Helm chart's ``appVersion``: the same string (what the chart runs);
- the Helm chart's ``version``: its SemVer 2 form, as Helm requires
  (``0.1.0.dev0`` -> ``0.1.0-dev.0``, ``1.2.0rc1`` -> ``1.2.0-rc.1``, ``0.1.0`` -> ``0.1.0``);
- the hub image's tag: the PEP 440 string (a valid Docker tag), which is the chart's
  ``appVersion`` and ``hub.image.tag``.

The notebook images are versioned by what they carry (``images/matrix.yaml``:
framework, CUDA, Python), not by the package: one notebook image serves several
gpuspawner releases.

Where a file must hold one of these names as a literal (Helm and Docker read their
files as they are), :data:`VERSION_LITERALS` lists it, and :func:`set_version`
rewrites them all for a new release (``gpuspawner-images version --set X``).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from packaging.version import InvalidVersion, Version

from .._version import __version__

#: PEP 440's pre-release letters and the SemVer identifiers they become.
_PRE = {"a": "alpha", "b": "beta", "rc": "rc"}


class ReleaseError(ValueError):
    """A version that cannot name a release; str() is the sentence to show."""


def _parse(version: str) -> Version:
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ReleaseError(f"{version!r} is not a PEP 440 version.") from None
    # SemVer has no epoch, no post-release and no local part, and orders a
    # pre-release of a dev release differently from PEP 440: refuse what would
    # name two releases alike or sort them wrongly.
    if parsed.epoch or parsed.post is not None or parsed.local is not None:
        raise ReleaseError(
            f"{version!r} has an epoch, a post-release or a local part, which a Helm chart "
            "version cannot carry: use MAJOR.MINOR.PATCH with at most one of aN, bN, rcN, .devN."
        )
    if parsed.pre is not None and parsed.dev is not None:
        raise ReleaseError(
            f"{version!r} is a dev release of a pre-release, which SemVer would sort after "
            "the pre-release: use one of aN, bN, rcN or .devN."
        )
    if len(parsed.release) > 3:
        raise ReleaseError(f"{version!r} has more than MAJOR.MINOR.PATCH.")
    return parsed


def app_version(version: str = __version__) -> str:
    """The chart's ``appVersion`` and the hub image's tag: the normalised PEP 440 version."""
    return str(_parse(version))


def chart_version(version: str = __version__) -> str:
    """The chart's ``version``: the SemVer 2 form of the PEP 440 version."""
    parsed = _parse(version)
    major, minor, patch = (*parsed.release, 0, 0)[:3]
    core = f"{major}.{minor}.{patch}"
    if parsed.pre is not None:
        letter, number = parsed.pre
        return f"{core}-{_PRE[letter]}.{number}"
    if parsed.dev is not None:
        return f"{core}-dev.{parsed.dev}"
    return core


def hub_image_tag(version: str = __version__) -> str:
    """The hub image's tag (``gpuspawner-images build hub``, the chart's ``hub.image.tag``)."""
    return app_version(version)


@dataclass(frozen=True)
class Release:
    """Every name of one release, for `gpuspawner-images version` and the tests."""

    package: str
    chart_version: str
    app_version: str
    hub_image_tag: str


def release(version: str = __version__) -> Release:
    return Release(
        package=version,
        chart_version=chart_version(version),
        app_version=app_version(version),
        hub_image_tag=hub_image_tag(version),
    )


#: Each file (relative to the repository root) that writes a release's name as a
#: literal, and its lines that do, as templates of :class:`Release`'s fields: a line
#: whose text (indentation aside) is a template filled with one release's names.
_HUB_TAG_LINE = 'tag: "{hub_image_tag}"'
VERSION_LITERALS: dict[str, tuple[str, ...]] = {
    "gpuspawner/_version.py": ('__version__ = "{package}"',),
    "images/hub/Dockerfile": ("ARG IMAGE_VERSION={hub_image_tag}",),
    "chart/gpuspawner/Chart.yaml": ("version: {chart_version}", 'appVersion: "{app_version}"'),
    # the hub image's tag in the chart's defaults (which the chart's example and local
    # values keep) and in the values for zero-to-jupyterhub's own chart
    "chart/gpuspawner/values.yaml": (_HUB_TAG_LINE,),
    "config/z2jh-values.yaml": (_HUB_TAG_LINE,),
    "config/sandbox/z2jh-local-values.yaml": (_HUB_TAG_LINE,),
}
VERSION_FILES = tuple(VERSION_LITERALS)


def set_version(texts: Mapping[str, str], old: str, new: str) -> dict[str, str]:
    """The files of :data:`VERSION_LITERALS` (``{path: text}``, all of them) with every
    literal of release `old` replaced by release `new`'s.

    A file that holds none of a literal it should is a :class:`ReleaseError`: it was
    edited by hand, and a rewrite would leave it behind.
    """
    before, after = asdict(release(old)), asdict(release(new))
    changed = {}
    for path, templates in VERSION_LITERALS.items():
        lines = texts[path].splitlines(keepends=True)
        for template in templates:
            was, becomes = template.format(**before), template.format(**after)
            hits = [i for i, line in enumerate(lines) if line.strip() == was]
            if not hits:
                raise ReleaseError(
                    f"{path} holds no line `{was}` (release {old}): set it by hand, then again."
                )
            for i in hits:
                lines[i] = lines[i].replace(was, becomes)
        changed[path] = "".join(lines)
    return changed
