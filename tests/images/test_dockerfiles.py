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
import shlex

import pytest
from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser

from gpuspawner._version import __version__
from gpuspawner.core import labels
from gpuspawner.images.plan import HUB_REQUIREMENTS_IN_CONTEXT, STAGE_LABEL, STAGES, plan_builds

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


def all_args(parser: DockerfileParser) -> dict[str, str]:
    """Every stage's ARG defaults (dockerfile-parse's .args only sees the last stage)."""
    found: dict[str, str] = {}
    for value in instructions(parser, "ARG"):
        name, _, default = value.partition("=")
        if default or name not in found:
            found[name] = default
    return found


def all_envs(parser: DockerfileParser, args: dict[str, str]) -> dict[str, str]:
    """Every stage's ENV, later stages winning: the stages here build on each other."""
    found: dict[str, str] = {}
    for value in instructions(parser, "ENV"):
        for word in shlex.split(value):
            name, _, val = word.partition("=")
            found[name] = resolve(val, {**args, **found})
    return found


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
    assert parse(spec.dockerfile, step.buildargs).parent_images[0] == spec.base_image
    # A plain `docker build` without arguments builds the same base.
    assert parse(spec.dockerfile).parent_images[0] == spec.base_image


def test_stages_are_base_jupyter_framework(spec):
    """`--target jupyter` stops before the framework; the full image is the last stage."""
    froms = instructions(parse(spec.dockerfile), "FROM")
    assert froms == ["${BASE_IMAGE} AS base", "base AS jupyter", "jupyter AS framework"]
    assert tuple(f.split()[-1] for f in froms) == STAGES


def shared_stages(path) -> str:
    text = (REPO / path).read_text()
    return text[text.index("# ---- base:") : text.index("# ---- framework:")]


def test_base_and_jupyter_stages_are_the_same_in_every_notebook_image(matrix):
    """One definition of what every notebook image shares, so one image's cache serves all."""
    first, *others = [spec.dockerfile for spec in matrix.images.values()]
    for other in others:
        assert shared_stages(other) == shared_stages(first), other


def test_arg_defaults_repeat_the_matrix(spec, step):
    declared = all_args(parse(spec.dockerfile))
    for name, value in step.buildargs.items():
        assert name in declared, f"{spec.dockerfile} does not declare ARG {name}"
        if name not in ("BUILD_DATE", "VCS_REF"):
            assert declared[name] == value, f"{spec.dockerfile}: ARG {name}"


def test_every_declared_version_arg_comes_from_the_matrix(spec, step):
    declared = set(all_args(parse(spec.dockerfile)))
    user_args = {"NB_USER", "NB_UID", "NB_GID"}
    assert declared - user_args == set(step.buildargs)


def test_runs_as_jovyan_uid_1000_gid_100(spec, step):
    df = parse(spec.dockerfile, step.buildargs)
    args = all_args(df)
    assert (args["NB_USER"], args["NB_UID"], args["NB_GID"]) == ("jovyan", "1000", "100")
    assert resolve(instructions(df, "USER")[-1], args) == "1000"
    useradd = [r for r in instructions(df, "RUN") if "useradd" in r]
    assert len(useradd) == 1
    assert '--uid "${NB_UID}"' in useradd[0] and '--gid "${NB_GID}"' in useradd[0]
    # The environment and home are group-writable for any uid in NB_GID (docker-stacks).
    assert 'fix-permissions "${VIRTUAL_ENV}" "/home/${NB_USER}"' in useradd[0]


def test_nvidia_environment(spec, step):
    df = parse(spec.dockerfile, step.buildargs)
    envs = all_envs(df, {**all_args(df), "PATH": ""})
    assert envs[labels.ENV_DRIVER_CAPABILITIES] == labels.DRIVER_CAPABILITIES
    # Where managed Kubernetes mounts the driver's nvidia-smi and libraries.
    assert "/usr/local/nvidia/bin" in envs["PATH"].split(":")
    assert "/usr/local/nvidia/lib64" in envs["LD_LIBRARY_PATH"].split(":")
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
        if key not in (
            "org.opencontainers.image.created",
            "org.opencontainers.image.revision",
            STAGE_LABEL,
        ):
            assert found[key] == value


def test_entrypoint_command_and_healthcheck(spec):
    df = parse(spec.dockerfile)
    # start.sh in the entry point, as docker-stacks: any command (z2jh's args-only
    # `jupyterhub-singleuser` too) gets the hooks and NB_UID (tests/images/test_start.py).
    assert json.loads(instructions(df, "ENTRYPOINT")[-1]) == ["tini", "-g", "--", "start.sh"]
    # docker-stacks' command: JupyterLab alone, or jupyterhub-singleuser under a hub.
    assert json.loads(instructions(df, "CMD")[-1]) == ["start-notebook.sh"]
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
    assert "notebook==${NOTEBOOK_VERSION}" in runs
    assert f"COPY {spec.constraints} /tmp/framework-constraints.txt" in [
        f"COPY {c}" for c in instructions(parse(spec.dockerfile), "COPY")
    ]
    assert "--constraint /tmp/framework-constraints.txt" in runs


def framework_install(spec) -> list[str]:
    """The words of the framework stage's `pip install` (the RUN that installs the framework)."""
    runs = instructions(parse(spec.dockerfile), "RUN")
    (run,) = [r for r in runs if f"${{{spec.framework_arg}}}" in r]
    words = shlex.split(run.split("&&")[0].replace("\\\n", " "))
    assert words[:4] == ["pip", "install", "--constraint", "/tmp/framework-constraints.txt"]
    return words[4:]


def test_the_framework_stage_installs_the_matrix_libraries(spec):
    """images/matrix.yaml's `libraries` and the Dockerfile's install line are one list:
    what `describe` and the full-build tests expect is what the image gets."""
    framework, *rest = framework_install(spec)
    assert framework.startswith(f"{spec.framework}")
    # numpy is the PyTorch image's own (torch does not require it), not a library of the matrix.
    assert [w for w in rest if w != "numpy"] == list(spec.libraries)
    assert spec.libraries


def test_jupyter_layer_comes_before_the_framework_layer(spec):
    """The jupyter stage is the small image, so the framework must come after it."""
    runs = instructions(parse(spec.dockerfile), "RUN")
    framework = next(i for i, r in enumerate(runs) if f"${{{spec.framework_arg}}}" in r)
    jupyter = next(i for i, r in enumerate(runs) if "JUPYTERLAB_VERSION" in r)
    assert jupyter < framework


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
        if sources[0].startswith("--from="):
            continue  # from an earlier stage, not the context
        for source in sources:
            if source == HUB_REQUIREMENTS_IN_CONTEXT:
                continue  # sent by gpuspawner-images from z2jh's sources (BuildStep.extra_files)
            assert (REPO / source).exists(), f"{path}: COPY {source} does not exist"
            if (REPO / source).is_file():
                assert source in sent, f"{path}: .dockerignore excludes {source}"
            else:
                assert any(s.startswith(source + "/") for s in sent), source
    assert not any(s.startswith((".venv/", ".git/")) for s in sent)


def test_hub_image_is_built_from_k8s_hub_as_a_z2jh_admin_builds_it(matrix):
    """The default (and only) target: FROM z2jh's own hub image, named exactly as quay.io
    names it, plus gpuspawner; no z2jh requirements file, no rebuild."""
    hub = matrix.hub
    plain = parse(hub.dockerfile)
    # `docker build -f images/hub/Dockerfile .` with no build argument
    assert plain.parent_images == ["quay.io/jupyterhub/k8s-hub:4.4.0"]
    assert plain.parent_images == [hub.k8s_hub_ref]
    assert instructions(plain, "FROM")[-1].split()[-1] == "hub"
    (step,) = plan_builds(matrix, [hub.name], context=str(REPO), package_version=__version__)
    df = parse(hub.dockerfile, step.buildargs)
    assert df.parent_images == [hub.k8s_hub_ref]
    declared = plain.args
    assert declared["JUPYTERHUB_VERSION"] == hub.jupyterhub
    # the build passes the package version; a plain `docker build` gets the same default
    assert declared["IMAGE_VERSION"] == __version__ == step.buildargs["IMAGE_VERSION"]
    copies = instructions(df, "COPY")
    assert copies == ["pyproject.toml /tmp/gpuspawner/", "gpuspawner /tmp/gpuspawner/gpuspawner"]
    assert not [c for c in copies if HUB_REQUIREMENTS_IN_CONTEXT in c or "requirements" in c]
    runs = " ".join(instructions(df, "RUN"))
    # gpuspawner under k8s-hub's own installed versions, and nothing names another JupyterHub
    assert "pip list --format=freeze > /tmp/k8s-hub-pins.txt" in runs
    assert "pip install --no-cache-dir --constraint /tmp/k8s-hub-pins.txt /tmp/gpuspawner" in runs
    assert "jupyterhub==" not in runs
    assert resolve(instructions(df, "USER")[-1], declared) == "1000"
    for key in OCI_LABELS:
        assert df.labels.get(f"org.opencontainers.image.{key}"), key
    assert df.labels["org.opencontainers.image.base.name"] == hub.k8s_hub_ref


def test_k8s_hub_rebuild_follows_z2jh_s_recipe(matrix):
    """The offline rebuild (a separate Dockerfile, so that the hub's build never needs
    z2jh's requirements): z2jh's build and default stages on the Debian base."""
    hub = matrix.hub
    df = parse(hub.rebuild_dockerfile, hub.rebuild_args())
    assert df.parent_images[0] == hub.base_image
    assert parse(hub.rebuild_dockerfile).parent_images[0] == hub.base_image
    assert [f.split()[-1] for f in instructions(df, "FROM")] == ["wheels", "k8s-hub"]
    copies = instructions(df, "COPY")
    assert f"{HUB_REQUIREMENTS_IN_CONTEXT} /tmp/requirements.txt" in copies
    runs = " ".join(instructions(df, "RUN"))
    assert "--no-binary pycurl" in runs
    assert "pip install --no-index --find-links=/tmp/wheels/ -r /tmp/requirements.txt" in runs
    # z2jh's hub image's user, command and port, which the hub image inherits
    assert resolve(instructions(df, "USER")[-1], all_args(df)) == "jovyan"
    assert instructions(df, "EXPOSE") == ["8081"]
    assert json.loads(instructions(df, "ENTRYPOINT")[-1]) == ["tini", "--"]
