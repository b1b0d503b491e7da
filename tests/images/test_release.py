"""One version source: every name of the release follows ``gpuspawner/_version.py``.

The chart's ``version``/``appVersion``, its hub image tag, the values files that name
the hub image and the image tool's tags are all derived (gpuspawner/images/release.py);
a literal anywhere that disagrees fails here, before an install would fail with
ImagePullBackOff.
"""

from __future__ import annotations

import re

import pytest
import yaml

from gpuspawner._version import __version__
from gpuspawner.images import release
from gpuspawner.images.plan import facts_document, hub_ref, plan_builds

from .conftest import REPO

CHART = REPO / "chart" / "gpuspawner"

#: Every values file: the chart's defaults and the examples and local values in config/.
VALUES_FILES = sorted(
    [CHART / "values.yaml", *(REPO / "config").glob("*.yaml"), *(REPO / "config").glob("*/*.yaml")]
)
#: Those that must name the hub image (z2jh's `hub.image`, the chart's `jupyterhub.hub.image`).
MUST_NAME_THE_HUB = {
    REPO / path
    for path in release.VERSION_FILES
    if path.endswith(".yaml") and not path.endswith("Chart.yaml")
}


def hub_images(document) -> list[dict]:
    """Every ``hub: {image: …}`` mapping in a YAML document, at any depth."""
    found = []
    if isinstance(document, dict):
        hub = document.get("hub")
        if isinstance(hub, dict) and isinstance(hub.get("image"), dict):
            found.append(hub["image"])
        for value in document.values():
            found += hub_images(value)
    elif isinstance(document, list):
        for value in document:
            found += hub_images(value)
    return found


@pytest.mark.parametrize(
    ("pep440", "semver"),
    [
        ("0.1.0.dev0", "0.1.0-dev.0"),
        ("0.1.0", "0.1.0"),
        ("1.2.0rc1", "1.2.0-rc.1"),
        ("1.2.0a3", "1.2.0-alpha.3"),
        ("1.2.0b2", "1.2.0-beta.2"),
        ("2.0", "2.0.0"),
        ("3.1.4.dev12", "3.1.4-dev.12"),
    ],
)
def test_the_chart_version_is_the_semver_form_of_the_package_version(pep440, semver):
    assert release.chart_version(pep440) == semver
    # appVersion and the hub image's tag are the PEP 440 version itself
    assert release.app_version(pep440) == release.hub_image_tag(pep440)
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", release.hub_image_tag(pep440))


def test_semver_orders_releases_as_pep_440_does_within_a_version():
    from packaging.version import Version

    ordered = ["1.2.0.dev1", "1.2.0rc1", "1.2.0rc2", "1.2.0"]
    assert sorted(ordered, key=Version) == ordered

    def semver_key(text):
        core, _, pre = text.partition("-")
        fields = [int(f) if f.isdigit() else f for f in pre.split(".")] if pre else []
        # SemVer: a pre-release sorts before the release; numbers before words
        return (
            tuple(int(p) for p in core.split(".")),
            not pre,
            [(isinstance(f, str), f) for f in fields],
        )

    chart = [release.chart_version(v) for v in ordered]
    assert sorted(chart, key=semver_key) == chart


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("one", "'one' is not a PEP 440 version."),
        ("1!1.0", "an epoch, a post-release or a local part"),
        ("1.0.post1", "an epoch, a post-release or a local part"),
        ("1.0+local", "an epoch, a post-release or a local part"),
        ("1.0rc1.dev2", "a dev release of a pre-release"),
        ("1.0.0.1", "more than MAJOR.MINOR.PATCH"),
    ],
)
def test_a_version_no_chart_can_carry_is_one_sentence(version, message):
    with pytest.raises(release.ReleaseError, match=re.escape(message)):
        release.chart_version(version)


def test_the_version_source_is_written_normalised():
    """_version.py holds what pip, the chart's appVersion and the hub tag all print."""
    assert release.app_version() == __version__
    names = release.release()
    assert (names.package, names.app_version, names.hub_image_tag) == (__version__,) * 3


def test_the_image_tool_tags_the_hub_with_the_release(matrix):
    (step,) = plan_builds(matrix, [matrix.hub.name], context=str(REPO), package_version=__version__)
    assert step.tags == (release.hub_image_tag(),)
    assert step.buildargs["IMAGE_VERSION"] == release.hub_image_tag()
    facts = facts_document(matrix, __version__)
    assert facts["hub"]["tag"] == release.hub_image_tag()
    assert facts["hub"]["ref"] == hub_ref(matrix, __version__)


def _chart_file(name: str) -> dict:
    path = CHART / name
    if not path.is_file():
        pytest.fail(
            f"{path.relative_to(REPO)} is missing: the chart must carry the release's version "
            f"({release.chart_version()} / {release.app_version()})",
            pytrace=False,
        )
    return yaml.safe_load(path.read_text()) or {}


def test_the_chart_follows_the_version_source(matrix):
    chart = _chart_file("Chart.yaml")
    assert chart.get("version") == release.chart_version(), (
        f"chart/gpuspawner/Chart.yaml version should be {release.chart_version()!r} "
        f"(the SemVer form of {__version__})"
    )
    assert chart.get("appVersion") == release.app_version(), (
        f"chart/gpuspawner/Chart.yaml appVersion should be {release.app_version()!r}"
    )
    # the z2jh chart it depends on is the one whose k8s-hub the hub image is built FROM
    (jupyterhub,) = [d for d in chart.get("dependencies") or [] if d.get("name") == "jupyterhub"]
    assert jupyterhub["version"] == matrix.hub.z2jh_chart


def test_every_values_file_names_the_hub_image_the_tool_builds(matrix):
    missing = [str(p.relative_to(REPO)) for p in MUST_NAME_THE_HUB if not p.is_file()]
    assert not missing, f"values files missing: {missing}"
    named = {}
    for path in VALUES_FILES:
        for document in yaml.safe_load_all(path.read_text()):
            # a file may set only the pull policy and keep the chart's image
            for image in hub_images(document):
                if "tag" in image or "name" in image:
                    named.setdefault(path, []).append(image)
    assert set(named) >= MUST_NAME_THE_HUB, sorted(
        str(p.relative_to(REPO)) for p in MUST_NAME_THE_HUB - set(named)
    )
    repository = hub_ref(matrix, __version__).rsplit(":", 1)[0]
    for path, images in named.items():
        for image in images:
            where = path.relative_to(REPO)
            # a string, as YAML reads it: 0.1.0 is one, but 1.0 would be the number 1.0
            assert "tag" in image or path not in MUST_NAME_THE_HUB, f"{where}: no hub tag"
            if "tag" in image:
                assert image["tag"] == release.hub_image_tag(), (
                    f"{where}: hub.image.tag is {image['tag']!r}, but the image tool tags the "
                    f"hub {release.hub_image_tag()!r} (gpuspawner-images version)"
                )
            if "name" in image:
                assert image["name"] == repository, where


def test_set_version_rewrites_every_literal_of_the_release(tmp_path):
    """`gpuspawner-images version --set` on a copy of the files that hold the release:
    afterwards each holds the new release's names, and nothing else changed."""
    texts = {}
    for path in release.VERSION_FILES:
        if not (REPO / path).is_file():
            pytest.fail(f"{path} is missing", pytrace=False)
        texts[path] = (REPO / path).read_text()
    changed = release.set_version(texts, __version__, "1.2.0rc1")
    assert set(changed) == set(release.VERSION_FILES)
    assert '__version__ = "1.2.0rc1"' in changed["gpuspawner/_version.py"]
    chart = yaml.safe_load(changed["chart/gpuspawner/Chart.yaml"])
    assert (chart["version"], chart["appVersion"]) == ("1.2.0-rc.1", "1.2.0rc1")
    for path, text in changed.items():
        if path.endswith(".yaml") and path != "chart/gpuspawner/Chart.yaml":
            tags = [i.get("tag") for d in yaml.safe_load_all(text) for i in hub_images(d)]
            assert tags and set(tags) == {"1.2.0rc1"}, path
        old_lines = texts[path].splitlines()
        new_lines = text.splitlines()
        assert len(old_lines) == len(new_lines)
        differ = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
        assert differ and all(__version__ in a or "version:" in a for a, _ in differ), path
    # and back: the same texts again
    assert release.set_version(changed, "1.2.0rc1", __version__) == texts


def test_set_version_refuses_a_file_without_its_literal():
    texts = {path: "" for path in release.VERSION_FILES}
    with pytest.raises(release.ReleaseError, match=r"gpuspawner/_version\.py holds no"):
        release.set_version(texts, __version__, "0.2.0")
    with pytest.raises(release.ReleaseError, match="not a PEP 440 version"):
        release.set_version(texts, __version__, "two")
