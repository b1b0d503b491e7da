"""The local cluster the zero-to-jupyterhub chart is installed on, with the real Helm.

Started once for the package (tests/z2jh): the control plane with the API server on
the pods' side (the ``kubernetes`` Service's endpoint), and real nodes with the
cluster network (kube-proxy, CoreDNS) holding every image the chart runs: the hub
image and z2jh's images (:func:`gpuspawner_sandbox.chartimages.ensure_deploy_images`)
and the notebook images' Jupyter stage. Nothing of the hub runs on the host: the
tests deploy it as an admin does (test_helm_install.py).

Where real nodes cannot run (no Go, no runc, not root) or the chart is missing,
these tests skip loudly, and fail in CI. The host is compared with its state before
the nodes started when they stop.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuspawner_sandbox import build, chartimages, helm, hoststate, nodeconfig, testing
from gpuspawner_sandbox.controlplane import ControlPlane
from gpuspawner_sandbox.nodes import RealNodes
from gpuspawner_sandbox.notebookimage import ensure_notebook_images
from gpuspawner_sandbox.topology import load_topology

TOPOLOGY = Path(__file__).parent / "topology.yaml"
IMAGE_CACHE = build.REPO_ROOT / ".cache" / "images"
#: config/sandbox/z2jh-hub-db-pv.yaml's directory, which an admin makes before installing.
HUB_DB_DIR = Path("/var/lib/gpuspawner-sandbox/hub-db")


def emit(line: str) -> None:
    """Progress of the cluster's start, past pytest's capture."""
    sys.__stderr__.write(line + "\n")


@dataclass
class Cluster:
    control_plane: ControlPlane
    nodes: RealNodes
    helm: helm.Helm
    #: the chart as released (version and image tags 4.4.0, values.schema.json)
    chart: Path
    state_dir: Path


@pytest.fixture(scope="package")
def cluster(tmp_path_factory, pytestconfig):
    binaries = testing.node_binaries(pytestconfig)  # skip (fail in CI) where nodes cannot run
    if not (helm.Z2JH_CHART / "Chart.yaml").is_file():
        testing.third_party_missing(
            f"THE ZERO-TO-JUPYTERHUB 4.4.0 CHART IS MISSING at {helm.Z2JH_CHART} "
            "(a copy of shared/ beside the clone), so the Helm install test does not run"
        )
    state_dir = tmp_path_factory.mktemp("z2jh")
    with testing.capture_disabled(pytestconfig):
        helm_binary = helm.build_helm(out=sys.stderr)
        notebook = ensure_notebook_images(IMAGE_CACHE, build.REPO_ROOT, emit)
        deploy = chartimages.ensure_deploy_images(
            IMAGE_CACHE, build.REPO_ROOT, emit, build_out=sys.stderr
        )
    chart = helm.release_chart(helm.Z2JH_CHART, state_dir / "chart" / "jupyterhub")
    topology = load_topology(TOPOLOGY)
    names = [n.name for n in topology.nodes]
    roots = [nodeconfig.cgroup_root(n) for n in names]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    cp = ControlPlane(state_dir, binaries.k8s, api_address=nodeconfig.API_ADDRESS)
    nodes = RealNodes(
        state_dir,
        cp,
        binaries,
        names,
        specs={n.name: n for n in topology.nodes},
        images=[notebook.archive, deploy.archive],
        cluster_network=True,
        machine_wait=testing.MACHINE_WAIT,
        emit=emit,
    )
    # A stale database of an earlier run would be this release's: start from none.
    shutil.rmtree(HUB_DB_DIR, ignore_errors=True)
    try:
        with testing.capture_disabled(pytestconfig):
            nodes.prepare()  # the host's link first: the API server listens on it
            cp.start()
            emit(f"Starting real nodes: {', '.join(names)}…")
            nodes.start()
        yield Cluster(
            cp,
            nodes,
            helm.Helm(helm_binary, state_dir / "helm-home", cp.admin_kubeconfig),
            chart,
            state_dir,
        )
    finally:
        nodes.stop()
        cp.stop()
        shutil.rmtree(HUB_DB_DIR, ignore_errors=True)
        with contextlib.suppress(OSError):
            HUB_DB_DIR.parent.rmdir()  # only if nothing else is there
    assert hoststate.differences(before, hoststate.snapshot(state_dir / "nodes", roots)) == []
