"""Helm and the zero-to-jupyterhub chart, as an admin deploys gpuspawner (issue 13).

Helm is built from its own Go module (``helm.sh/helm/v3``, by the Go module
proxy like every other Go part of the sandbox) and cached with the node tools.
The chart is zero-to-jupyterhub 4.4.0 from ``../shared/third-party`` as it is
in git; at release, chartpress sets ``Chart.yaml``'s ``version`` and every
``tag: "set-by-chartpress"`` to the release, so :func:`release_chart` does the
same to a copy before Helm sees it. The release also carries ``values.schema.json``,
which z2jh's publishing generates from ``values.schema.yaml`` (a plain YAML to JSON
conversion, its ``tools/generate-json-schema.py``): Helm validates values only against
the JSON file, so the copy gets it too.

Helm runs with its own home (cache, config, data) under a directory of ours
and never contacts a repository: the chart is a local directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TextIO

import yaml

from . import build, nodebuild, suitecosts

HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.22.0"
#: The Kubernetes version Helm assumes without a cluster (`helm template`): its Makefile
#: derives it from its k8s.io/client-go (v0.37 for 3.22), and so do we. Without these flags
#: Helm says v1.20, which z2jh's `kubeVersion: >=1.28.0-0` refuses.
HELM_KUBE_VERSION = ("1", "37")

HELM = nodebuild.GoTool(
    name="helm",
    module=HELM_MODULE,
    version=HELM_VERSION,
    installs=(
        nodebuild.GoInstall(
            ("cmd/helm",),
            ldflags=(
                "-s",
                "-w",
                f"-X {HELM_MODULE}/internal/version.version={HELM_VERSION}",
                f"-X {HELM_MODULE}/internal/version.gitTreeState=clean",
                *(
                    f"-X {HELM_MODULE}/pkg/{pkg}.k8sVersion{part}={value}"
                    for pkg in ("lint/rules", "chartutil")
                    for part, value in zip(("Major", "Minor"), HELM_KUBE_VERSION, strict=True)
                ),
            ),
        ),
    ),
    cold_estimate="about 6 minutes",
)

Z2JH_VERSION = "4.4.0"
#: zero-to-jupyterhub as in git at the tag (a copy of shared/ lies beside the clone):
#: the chart and its images' sources.
Z2JH_SOURCE = build.REPO_ROOT.parent / "shared" / "third-party" / "zero-to-jupyterhub-k8s-4.4.0"
Z2JH_CHART = Z2JH_SOURCE / "jupyterhub"

CHARTPRESS_TAG = "set-by-chartpress"


class HelmError(RuntimeError):
    """Helm refused or failed; the message holds its own words."""


def release_chart_yaml(text: str, version: str) -> str:
    """``Chart.yaml`` as chartpress publishes it: ``version`` set to the release."""
    new, count = re.subn(r"^version:.*$", f"version: {version}", text, count=1, flags=re.M)
    if count != 1:
        raise HelmError("The chart's Chart.yaml has no top-level version to set.")
    return new


def release_values_yaml(text: str, version: str) -> str:
    """``values.yaml`` as chartpress publishes it: every placeholder tag set to the release."""
    placeholder = f'tag: "{CHARTPRESS_TAG}"'
    if placeholder not in text:
        raise HelmError(f"The chart's values.yaml has no {placeholder} to set.")
    return text.replace(placeholder, f'tag: "{version}"')


def release_chart(source: Path, dest: Path, version: str = Z2JH_VERSION) -> Path:
    """A copy of the chart in git at ``dest``, with what chartpress sets at release."""
    if not (source / "Chart.yaml").is_file():
        raise HelmError(f"No Helm chart at {source} (its Chart.yaml is missing).")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest)
    for name, release in (("Chart.yaml", release_chart_yaml), ("values.yaml", release_values_yaml)):
        path = dest / name
        path.write_text(release(path.read_text(), version))
    schema = dest / "values.schema.yaml"
    if schema.is_file():
        (dest / "values.schema.json").write_text(values_schema_json(schema.read_text()))
    return dest


def values_schema_json(schema_yaml: str) -> str:
    """The JSON schema Helm reads, from the chart's YAML source of it."""
    return json.dumps(yaml.safe_load(schema_yaml), indent=2) + "\n"


def set_flags(values: Mapping[str, Any]) -> list[str]:
    """``--set-json`` flags for explicit overrides, one per dotted key, in order."""
    return [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]


class Helm:
    """The ``helm`` command with a private home, optionally against a cluster."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None):
        self.binary = Path(binary)
        self.home = Path(home)
        self.kubeconfig = kubeconfig

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("HELM_") and k not in ("KUBECONFIG",)
        }
        for kind in ("CACHE", "CONFIG", "DATA"):
            env[f"HELM_{kind}_HOME"] = str(self.home / kind.lower())
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run(self, *args: str, timeout: float = 600) -> str:
        """Run ``helm ARGS``; its standard output, or HelmError with its own error lines."""
        self.home.mkdir(parents=True, exist_ok=True)
        costly = args[0] in ("install", "upgrade")
        with (
            suitecosts.step(suitecosts.HELM_INSTALL, " ".join(args[:2]))
            if costly
            else nullcontext()
        ):
            proc = subprocess.run(
                [str(self.binary), *args],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        if proc.returncode != 0:
            # (`helm lint` writes what it found to stdout, and only a summary to stderr)
            detail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise HelmError(f"`helm {args[0]}` failed:\n" + "\n".join(detail))
        return proc.stdout

    def template(
        self,
        release: str,
        chart: Path,
        *,
        namespace: str,
        values_files: Sequence[Path] = (),
        overrides: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """The manifests ``helm template`` renders (the chart's values schema applies)."""
        args = ["template", release, str(chart), f"--namespace={namespace}"]
        args += [f"--values={f}" for f in values_files]
        args += set_flags(overrides or {})
        return [doc for doc in yaml.safe_load_all(self.run(*args)) if doc]


def build_helm(cache: Path | None = None, *, out: TextIO | None = None) -> Path:
    """Build (or find cached) Helm; the path of the ``helm`` binary."""
    return nodebuild.build_tool(HELM, cache, out=out if out is not None else sys.stderr) / "helm"


# --- gpuspawner's own chart (chart/gpuspawner) -------------------------------------------

#: gpuspawner's chart, which depends on the jupyterhub chart (its Chart.yaml).
GPUSPAWNER_CHART = build.REPO_ROOT / "chart" / "gpuspawner"
#: The values an admin copies (docs/install-chart.md).
EXAMPLE_VALUES = build.REPO_ROOT / "config" / "chart-values.yaml"


def package_dependency(
    helm_: Helm, chart: Path = GPUSPAWNER_CHART, work: Path | None = None
) -> Path:
    """``charts/jupyterhub-<version>.tgz`` of ``chart`` from the released z2jh chart, offline.

    What ``helm dependency build`` fetches from https://hub.jupyter.org/helm-chart/ for an
    admin; here the release is made from ``../shared/third-party`` (:func:`release_chart`)
    and packaged by Helm itself, so the archive is the chart Helm would have downloaded.
    """
    if not (Z2JH_CHART / "Chart.yaml").is_file():
        raise HelmError(f"The zero-to-jupyterhub {Z2JH_VERSION} chart is missing at {Z2JH_CHART}.")
    work = work or helm_.home / "z2jh-release"
    released = release_chart(Z2JH_CHART, work / "jupyterhub")
    charts = chart / "charts"
    charts.mkdir(exist_ok=True)
    for stale in charts.glob("jupyterhub-*.tgz"):
        stale.unlink()
    archive = charts / f"jupyterhub-{Z2JH_VERSION}.tgz"
    shutil.copyfile(packaged_release(helm_, released), archive)
    return archive


def tree_digest(root: Path) -> str:
    """A digest of every file's relative path and bytes under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def packaged_release(helm_: Helm, released: Path, cache: Path | None = None) -> Path:
    """``helm package`` of a released chart, made once per content and Helm binary and
    kept in the build cache: `make chart`, the chart's tests and each chart install of
    a run copy the same archive (the suite's time table counts the packagings)."""
    cache = (cache or build.cache_dir()) / "helm-packages"
    key = f"{tree_digest(released)}-{helm_.binary.parent.name}"
    target = cache / key / f"{released.name}-{Z2JH_VERSION}.tgz"
    with build.exclusive(cache / key):
        if not target.is_file():
            tmp = cache / f"{key}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            with suitecosts.step(suitecosts.HELM_PACKAGE, released.name):
                out = helm_.run("package", str(released), f"--destination={tmp}")
            made = Path(out.strip().rsplit(": ", 1)[-1])
            target.parent.mkdir(parents=True, exist_ok=True)
            made.replace(target)
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def package_chart(helm_: Helm, destination: Path, chart: Path = GPUSPAWNER_CHART) -> Path:
    """The chart's dependency packaged, ``helm lint``, then ``helm package`` into ``destination``."""
    package_dependency(helm_, chart)
    # the chart requires a catalog: lint it with the documented example's
    helm_.run("lint", str(chart), "--strict", f"--values={EXAMPLE_VALUES}")
    destination.mkdir(parents=True, exist_ok=True)
    out = helm_.run("package", str(chart), f"--destination={destination}")
    return Path(out.strip().rsplit(": ", 1)[-1])


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner_sandbox.helm",
        description="Package chart/gpuspawner offline: its jupyterhub dependency from "
        "../shared/third-party, helm lint, helm package (make chart).",
    )
    parser.add_argument("command", choices=["chart", "dependency"])
    parser.add_argument("--destination", type=Path, default=build.REPO_ROOT / "build" / "chart")
    args = parser.parse_args(argv)
    helm_ = Helm(build_helm(), build.REPO_ROOT / ".cache" / "helm-home")
    try:
        if args.command == "dependency":
            print(package_dependency(helm_))
        else:
            print(package_chart(helm_, args.destination))
    except HelmError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
