"""config/z2jh-values.yaml against zero-to-jupyterhub 4.4.0's own schema, and its
prePuller block against what `gpuspawner-images catalog --z2jh` prints."""

from __future__ import annotations

import subprocess
import sys

import jsonschema
import pytest
import yaml

from gpuspawner.core.catalog import DEFAULT_GPU_TOLERATIONS
from gpuspawner.images.plan import image_ref, prepuller_values

from ..hubconfigs import helm_merged as merged
from .conftest import REPO

CHART = REPO.parent / "shared" / "third-party" / "zero-to-jupyterhub-k8s-4.4.0" / "jupyterhub"
VALUES = REPO / "config" / "z2jh-values.yaml"


@pytest.fixture(scope="module")
def schema() -> dict:
    if not CHART.is_dir():
        pytest.fail(
            f"the z2jh 4.4.0 chart is expected at {CHART} (a copy of shared/ beside the clone)"
        )
    return yaml.safe_load((CHART / "values.schema.yaml").read_text())


@pytest.fixture(scope="module")
def chart_defaults() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def test_values_file_passes_the_charts_schema(schema, chart_defaults):
    values = yaml.safe_load(VALUES.read_text())
    jsonschema.validate(merged(chart_defaults, values), schema)


def test_schema_catches_a_misplaced_prepuller_key(schema, chart_defaults):
    """The schema check can fail: a typo under prePuller is refused."""
    values = yaml.safe_load(VALUES.read_text())
    values["prePuller"]["extraImage"] = values["prePuller"].pop("extraImages")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged(chart_defaults, values), schema)


def test_prepuller_block_is_what_the_tool_prints(matrix):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuspawner.images.cli", "catalog", "--z2jh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed == prepuller_values(matrix)
    assert yaml.safe_load(VALUES.read_text())["prePuller"] == printed["prePuller"]


def test_prepuller_names_every_catalog_image_and_tolerates_gpu_nodes(matrix):
    values = prepuller_values(matrix, registry="127.0.0.1:5000/x")["prePuller"]
    refs = {f"{e['name']}:{e['tag']}" for e in values["extraImages"].values()}
    assert refs == {image_ref(matrix, s, "127.0.0.1:5000/x") for s in matrix.images.values()}
    assert values["extraTolerations"] == [dict(t) for t in DEFAULT_GPU_TOLERATIONS]


def test_catalog_output_carries_the_prepuller_block_as_comments(matrix, tmp_path):
    out = tmp_path / "catalog.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "gpuspawner.images.cli", "catalog", "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert set(yaml.safe_load(text)) == {"images"}  # still a catalog file
    commented = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "prePuller:" in commented and "extraTolerations:" in commented


def test_hub_image_is_the_one_the_image_tool_builds(matrix):
    from gpuspawner import __version__
    from gpuspawner.images.plan import hub_ref

    image = yaml.safe_load(VALUES.read_text())["hub"]["image"]
    # `gpuspawner-images build hub` tags the package's version (gpuspawner.images.release)
    assert f"{image['name']}:{image['tag']}" == hub_ref(matrix, __version__)


def chart_config(chart_defaults, values: dict):
    """z2jh's jupyterhub_config.py turns hub.services/hub.loadRoles into lists, then runs extraConfig."""
    from unittest import mock

    from traitlets.config import Config

    from gpuspawner import hubsetup

    hub = merged(chart_defaults, values)["hub"]
    c = Config()
    tolerations = chart_defaults["scheduling"]["userPods"]["tolerations"]
    c.KubeSpawner.tolerations = tolerations  # as the chart sets them
    c.JupyterHub.services = [{"name": k, **v} for k, v in hub["services"].items()]
    c.JupyterHub.load_roles = [{"name": k, **v} for k, v in hub["loadRoles"].items()]
    for section, settings in hub["config"].items():
        for name, value in settings.items():
            c[section][name] = value
    # the catalog file is in the cluster's ConfigMap: its check is left out
    with mock.patch.object(hubsetup, "check_catalog"):
        for _, snippet in sorted(hub["extraConfig"].items()):
            exec(snippet, {"c": c})
    return hub, c, tolerations


def test_services_as_the_chart_configures_them(chart_defaults):
    import json

    from gpuspawner.userservice.app import ALL_NAMESPACES_ENV, PLACEMENT_ENV

    hub, c, tolerations = chart_config(chart_defaults, yaml.safe_load(VALUES.read_text()))
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert set(services) == {"gpuspawner-culler", "gpuspawner-admin", "gpuspawner"}
    service = services["gpuspawner"]
    assert service["url"] == "http://hub:10103"
    assert "--ip=0.0.0.0" in service["command"]
    env = service["environment"]
    assert env["GPUSPAWNER_CATALOG"] == hub["config"]["GPUSpawner"]["catalog_file"]
    assert json.loads(env[PLACEMENT_ENV])["tolerations"] == tolerations
    # pods of the release's namespace only (config/z2jh-inventory-rbac.yaml grants no more)
    assert env[ALL_NAMESPACES_ENV] == "0"
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    # users' tokens may let the service read their own servers with their state
    # (stop notices), and users may ask the culler about their own servers
    assert roles["user"]["scopes"] == [
        "self",
        "access:services!service=gpuspawner-culler",
        "access:services!service=gpuspawner",
        "read:servers!user",
        "admin:server_state!user",
    ]
    assert service["oauth_client_allowed_scopes"] == [
        "read:servers!user",
        "admin:server_state!user",
    ]
    # the service itself holds no scope on users: no role names it
    assert not [r for r in roles.values() if "gpuspawner" in r.get("services", [])]
    # the proxy (its own pod) reaches the service on the hub Service, through the policy
    assert {"name": "gpuspawner", "port": 10103, "targetPort": 10103} in hub["service"][
        "extraPorts"
    ]
    # ...from the proxy and the hub only (the rendered policy: tests/chart/test_network_policy.py)
    assert not hub["networkPolicy"]["allowedIngressPorts"]
    (rule,) = [r for r in hub["networkPolicy"]["ingress"] if {"port": 10103} in r["ports"]]
    assert [peer["podSelector"]["matchLabels"]["component"] for peer in rule["from"]] == [
        "proxy",
        "hub",
    ]
    assert "extra_handlers" not in VALUES.read_text()


def test_the_service_follows_the_admins_opt_in_to_every_namespace(chart_defaults):
    """The opt-in the values' comment gives reaches the service, whose command is fixed here."""
    from gpuspawner.userservice.app import ALL_NAMESPACES_ENV

    values = yaml.safe_load(VALUES.read_text())
    values["hub"]["config"]["GPUSpawner"]["gpu_inventory_all_namespaces"] = True
    assert "hub.config.GPUSpawner.gpu_inventory_all_namespaces: true" in VALUES.read_text()
    _, c, _ = chart_config(chart_defaults, values)
    (service,) = [s for s in c.JupyterHub.services if s["name"] == "gpuspawner"]
    assert service["environment"][ALL_NAMESPACES_ENV] == "1"
    assert "config/z2jh-rbac-opt-in-all-namespaces.yaml" in VALUES.read_text()
