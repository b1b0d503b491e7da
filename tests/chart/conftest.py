"""Real Helm (built from helm.sh/helm/v3) and chart/gpuspawner with its jupyterhub 4.4.0
dependency, the released zero-to-jupyterhub chart of ../shared/third-party, packaged offline.

No cluster: ``helm template`` and ``helm lint`` only. Where the z2jh chart is missing these
tests skip loudly, and fail in CI.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuspawner_sandbox import build, helm, testing


@dataclass
class Charts:
    helm: helm.Helm
    #: a copy of chart/gpuspawner with charts/jupyterhub-4.4.0.tgz
    gpuspawner: Path
    #: zero-to-jupyterhub 4.4.0 as released (the dependency, unpacked)
    jupyterhub: Path


@pytest.fixture(scope="package")
def charts(pytestconfig, tmp_path_factory) -> Charts:
    if not (helm.Z2JH_CHART / "Chart.yaml").is_file():
        testing.third_party_missing(
            f"THE ZERO-TO-JUPYTERHUB 4.4.0 CHART IS MISSING at {helm.Z2JH_CHART} "
            "(a copy of shared/ beside the clone), so the chart's tests do not run"
        )
    with testing.capture_disabled(pytestconfig):
        try:
            binary = helm.build_helm(out=sys.stderr)
        except build.GoMissing as e:
            testing.sandbox_unavailable(str(e))
    work = tmp_path_factory.mktemp("chart")
    runner = helm.Helm(binary, work / "home")
    chart = work / "gpuspawner"
    shutil.copytree(helm.GPUSPAWNER_CHART, chart, ignore=shutil.ignore_patterns("charts"))
    helm.package_dependency(runner, chart, work / "z2jh")
    return Charts(runner, chart, work / "z2jh" / "jupyterhub")
