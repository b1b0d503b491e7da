"""A plain zero-to-jupyterhub 4.4.0 hub with a ``singleuser.profileList``, upgraded to the chart.

docs/migrate-profile-list.md as an admin follows it: the release was installed from z2jh's
released chart with a CPU profile and a "special" one; ``helm upgrade`` of the same
release to chart/gpuspawner, with the old values moved under ``jupyterhub:`` beside the
catalog, keeps both, offered after the catalog's profiles.

A second release in its own namespace, beside :func:`tests.z2jh.conftest.chart_release`'s,
lighter than it (its database in memory, no user scheduler or image pullers: the spawn
form is what this shows); uninstalled at the end.
"""

from __future__ import annotations

import copy

import pytest
import requests
import yaml

from gpuspawner.images.release import hub_image_tag
from gpuspawner_sandbox import testing

from .conftest import CHART_VALUES, PASSWORD, Browser, chart_copy, proxy_public

NAMESPACE = "migrate"
RELEASE = "old"
REPO_VALUES = CHART_VALUES[0].parent
#: The plain z2jh install's local images and cluster overrides (README's z2jh path).
Z2JH_LOCAL = [
    REPO_VALUES / "sandbox" / "z2jh-local-values.yaml",
    REPO_VALUES / "sandbox" / "z2jh-cluster-values.yaml",
]
SPECIAL_IMAGE = "registry.example.org/gpuspawner/cuda-pytorch:2.15.0-cuda13.2-py3.13-jupyter"
#: What the admin of the plain z2jh hub had: two profiles (and this test's lighter release).
OLD_VALUES = {
    "hub": {
        "image": {"name": "registry.example.org/gpuspawner/hub"},
        "db": {"type": "sqlite-memory"},
    },
    "singleuser": {
        "profileList": [
            {
                "display_name": "CPU only (legacy)",
                "slug": "cpu-legacy",
                "description": "The old hub's default CPU server",
                "default": True,
            },
            {
                "display_name": "Special (legacy)",
                "slug": "special",
                "kubespawner_override": {"image": SPECIAL_IMAGE, "mem_limit": "1G"},
            },
        ]
    },
    "scheduling": {"userScheduler": {"enabled": False}, "userPlaceholder": {"enabled": False}},
    "prePuller": {"hook": {"enabled": False}, "continuous": {"enabled": False}},
    "cull": {"enabled": False},
}


@pytest.fixture(scope="module")
def old_release(cluster):
    """The plain z2jh release; uninstalled (with its namespace's objects) at the end."""
    values = cluster.state_dir / "old-z2jh-values.yaml"
    values.write_text(yaml.safe_dump(OLD_VALUES))
    args = [f"--namespace={NAMESPACE}", "--wait", "--timeout=15m"]
    # helm install old jupyterhub/jupyterhub --version 4.4.0 -n migrate -f …
    cluster.helm.run(
        "install",
        RELEASE,
        str(cluster.chart),
        "--create-namespace",
        *(f"--values={v}" for v in (*Z2JH_LOCAL, values)),
        *args,
        timeout=1000,
    )
    try:
        yield proxy_public(cluster.control_plane.admin_api(), NAMESPACE)
    finally:
        cluster.helm.run("uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", timeout=600)


def offered_in_order(browser: Browser, names: list[str]) -> list[int]:
    r = browser.session.get(f"{browser.base}/hub/spawn", timeout=60)
    assert r.status_code == 200, r.text[:500]
    missing = [n for n in names if n not in r.text]
    assert not missing, f"not offered: {missing}\n{r.text[:2000]}"
    return [r.text.index(n) for n in names]


def test_a_plain_z2jh_hub_upgraded_to_the_chart_still_offers_its_profiles(cluster, old_release):
    old = ["CPU only (legacy)", "Special (legacy)"]
    offered_in_order(Browser(old_release, "admin", PASSWORD), old)

    # The migration: the old values move under jupyterhub:, the catalog comes in gpuspawner:
    # (config/chart-values.yaml and the local cluster's overrides, as the main release).
    migrated = cluster.state_dir / "migrated-values.yaml"
    moved = copy.deepcopy(OLD_VALUES)
    del moved["hub"]["image"]  # the chart's hub image (already this one)
    migrated.write_text(yaml.safe_dump({"jupyterhub": moved}))
    chart = chart_copy(cluster, "migrate-chart")
    cluster.helm.run(
        "upgrade",
        RELEASE,
        str(chart),
        f"--namespace={NAMESPACE}",
        *(f"--values={v}" for v in (*CHART_VALUES, migrated)),
        "--wait",
        "--timeout=15m",
        timeout=1000,
    )
    api = cluster.control_plane.admin_api()
    hub = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hub")
    assert hub["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{hub_image_tag()}")

    # the hub answers again (the upgrade restarted it: its configuration changed)
    browser = testing.wait_for(
        "the upgraded hub to let the admin log in",
        lambda: _login(old_release),
        timeout=300,
        interval=2,
    )
    catalog_first, *after = offered_in_order(browser, ["PyTorch", "TensorFlow", *old])
    assert after == sorted(after) and all(i > catalog_first for i in after), after


def _login(url: str) -> Browser | None:
    try:
        return Browser(url, "admin", PASSWORD)
    except (requests.RequestException, AssertionError, KeyError):
        return None  # not answering yet, or the login page not served yet
