"""Structural checks of images/*/Dockerfile, parsed with dockerfile-parse.

What a reviewer would check by eye, checked on every change: the base image
comes from the matrix, the defaults repeat the matrix, the user is jovyan, the
NVIDIA variables are right (and NVIDIA_VISIBLE_DEVICES is absent), the labels
carry the CUDA version and driver floor, and every COPY source reaches the
daemon through .dockerignore.
"""

from __future__ import annotations

import json
import re

import pytest
from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser

from gpuspawner import labels
from gpuspawner.images.plan import plan_builds

from .conftest import REPO

OCI_LABELS = (
    "title",
    "description",
    "version",
    "created",
    "revision",
    "source",
    "licenses",
    "base.name",
)
# Accepted only by BuildKit; the docker SDK may drive the classic builder.
BUILDKIT_ONLY = (
    re.compile(r"^#\s*syntax\s*=", re.M),
    re.compile(r"^\s*RUN\s+--mount", re.M),
    re.compile(r"^\s*(COPY|ADD)\s+.*--(chmod|link|parents|exclude)\b", re.M),
    re.compile(r"<<-?\s*['\"]?[A-Z]+['\"]?\s*$", re.M),
)


def parse(path, build_args=None) -> DockerfileParser:
    return DockerfileParser(path=str(REPO / path), build_args=build_args or {}, env_replace=True)


def instructions(parser: DockerfileParser, name: str) -> list[str]:
    return [i["value"] for i in parser.structure if i["instruction"] == name]


def resolve(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), value)


def notebook_specs():
    from gpuspawner.images.matrix import load_matrix

    return list(load_matrix(REPO / "images" / "matrix.yaml").images.values())


@pytest.fixture(params=notebook_specs(), ids=lambda s: s.name)
def spec(request):
    return request.param


@pytest.fixture
def step(matrix, spec):
    (step,) = plan_builds(matrix, [spec.name], context=str(REPO))
    return step


def test_base_image_resolves_from_the_matrix(spec, step):
    assert parse(spec.dockerfile, step.buildargs).baseimage == spec.base_image
    # A plain `docker build` without arguments builds the same base.
    assert parse(spec.dockerfile).baseimage == spec.base_image


def test_arg_defaults_repeat_the_matrix(spec, step):
    declared = parse(spec.dockerfile).args
    for name, value in step.buildargs.items():
        assert name in declared, f"{spec.dockerfile} does not declare ARG {name}"
        if name not in ("BUILD_DATE", "VCS_REF"):
            assert declared[name] == value, f"{spec.dockerfile}: ARG {name}"


def test_every_declared_version_arg_comes_from_the_matrix(spec, step):
    declared = set(parse(spec.dockerfile).args) | {"BASE_IMAGE"}
    user_args = {"NB_USER", "NB_UID", "NB_GID"}
    assert declared - user_args == set(step.buildargs)


def test_runs_as_jovyan_uid_1000_gid_100(spec, step):
    df = parse(spec.dockerfile, step.buildargs)
    args = df.args
    assert (args["NB_USER"], args["NB_UID"], args["NB_GID"]) == ("jovyan", "1000", "100")
    assert resolve(instructions(df, "USER")[-1], args) == "1000"
    useradd = [r for r in instructions(df, "RUN") if "useradd" in r]
    assert len(useradd) == 1
    assert '--uid "${NB_UID}"' in useradd[0] and '--gid "${NB_GID}"' in useradd[0]
    # Ubuntu's own uid-1000 user would otherwise take jovyan's uid.
    assert "userdel --remove ubuntu" in useradd[0]


def test_nvidia_environment(spec, step):
    df = parse(spec.dockerfile, step.buildargs)
    envs = df.envs
    assert envs[labels.ENV_DRIVER_CAPABILITIES] == labels.DRIVER_CAPABILITIES
    assert envs["NVIDIA_REQUIRE_CUDA"] == spec.require_cuda
    assert labels.ENV_VISIBLE_DEVICES not in envs
    assert not any(labels.ENV_VISIBLE_DEVICES in e for e in instructions(df, "ENV"))
    # nvidia/cuda bases set NVIDIA_VISIBLE_DEVICES=all; such a base would need an override.
    assert not spec.base_image.startswith(("nvidia/cuda", "docker.io/nvidia/cuda"))


def test_labels(spec, step):
    found = parse(spec.dockerfile, step.buildargs).labels
    for key in OCI_LABELS:
        assert found.get(f"org.opencontainers.image.{key}"), key
    assert found["org.opencontainers.image.base.name"] == spec.base_image
    assert found["org.opencontainers.image.version"] == spec.tag
    assert found[labels.IMAGE_LABEL_CUDA] == spec.cuda
    assert found[labels.IMAGE_LABEL_DRIVER_FLOOR] == spec.driver_floor
    assert found[labels.IMAGE_LABEL_FRAMEWORK] == f"{spec.framework}=={spec.framework_version}"
    # The tool sets the same labels at build time; they must agree with the Dockerfile's.
    for key, value in step.labels.items():
        if key not in ("org.opencontainers.image.created", "org.opencontainers.image.revision"):
            assert found[key] == value


def test_entrypoint_command_and_healthcheck(spec):
    df = parse(spec.dockerfile)
    assert json.loads(instructions(df, "ENTRYPOINT")[-1]) == ["tini", "-g", "--"]
    assert json.loads(instructions(df, "CMD")[-1]) == ["jupyterhub-singleuser"]
    (health,) = instructions(df, "HEALTHCHECK")
    assert "CMD" in health and "/usr/local/bin/notebook-healthcheck" in health
    copies = instructions(df, "COPY")
    assert "gpuspawner/images/smoke.py /usr/local/bin/gpu-smoke-test" in copies
    assert "gpuspawner/images/healthcheck.py /usr/local/bin/notebook-healthcheck" in copies


def test_pins_come_from_build_args(spec):
    runs = " ".join(instructions(parse(spec.dockerfile), "RUN"))
    assert f"=={'${'}{spec.framework_arg}}}" in runs
    assert "jupyterhub==${JUPYTERHUB_VERSION}" in runs
    assert "jupyterlab==${JUPYTERLAB_VERSION}" in runs
    assert f"COPY {spec.constraints} /tmp/framework-constraints.txt" in [
        f"COPY {c}" for c in instructions(parse(spec.dockerfile), "COPY")
    ]
    assert "--constraint /tmp/framework-constraints.txt" in runs


def test_framework_layer_comes_before_jupyter_layer(spec):
    runs = instructions(parse(spec.dockerfile), "RUN")
    framework = next(i for i, r in enumerate(runs) if f"${{{spec.framework_arg}}}" in r)
    jupyter = next(i for i, r in enumerate(runs) if "JUPYTERLAB_VERSION" in r)
    assert framework < jupyter


ALL_DOCKERFILES = sorted(p.relative_to(REPO) for p in (REPO / "images").glob("*/Dockerfile"))


@pytest.mark.parametrize("path", ALL_DOCKERFILES, ids=str)
def test_no_buildkit_only_syntax(path):
    text = (REPO / path).read_text()
    for pattern in BUILDKIT_ONLY:
        assert not pattern.search(text), f"{path}: {pattern.pattern}"


@pytest.mark.parametrize("path", ALL_DOCKERFILES, ids=str)
def test_copy_sources_reach_the_daemon(path):
    """COPY sources exist and .dockerignore (applied by the docker SDK) lets them through."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sent = exclude_paths(str(REPO), patterns)
    for value in instructions(parse(path), "COPY"):
        *sources, _dest = value.split()
        for source in sources:
            assert (REPO / source).exists(), f"{path}: COPY {source} does not exist"
            if (REPO / source).is_file():
                assert source in sent, f"{path}: .dockerignore excludes {source}"
            else:
                assert any(s.startswith(source + "/") for s in sent), source
    assert not any(s.startswith((".venv/", ".git/")) for s in sent)


def test_hub_image(matrix):
    hub = matrix.hub
    args = hub.build_args("0.1.0")
    df = parse(hub.dockerfile, args)
    assert df.baseimage == hub.base_image
    assert parse(hub.dockerfile).baseimage == hub.base_image
    declared = df.args
    assert declared["JUPYTERHUB_VERSION"] == hub.jupyterhub
    assert parse(hub.dockerfile).args["JUPYTERHUB_VERSION"] == hub.jupyterhub
    assert hub.base_image.startswith("quay.io/jupyterhub/k8s-hub:")
    assert hub.base_image.endswith(":" + hub.z2jh_chart)
    runs = " ".join(instructions(df, "RUN"))
    assert "pip install --no-cache-dir /tmp/gpuspawner" in runs
    assert "jupyterhub==${JUPYTERHUB_VERSION}" in runs
    assert resolve(instructions(df, "USER")[-1], declared) == "1000"
    for key in OCI_LABELS:
        assert df.labels.get(f"org.opencontainers.image.{key}"), key
