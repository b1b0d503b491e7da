"""What `gpuspawner-images` will do, as data: build steps, test runs, catalog entries.

Pure functions of the matrix (and a few facts the caller looked up, such as whether
the engine has the NVIDIA runtime), so the tool's behaviour is tested without Docker.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.catalog import DEFAULT_GPU_TOLERATIONS
from ..core.labels import IMAGE_LABEL_CUDA, IMAGE_LABEL_DRIVER_FLOOR, IMAGE_LABEL_FRAMEWORK
from .matrix import (
    K8S_HUB_REBUILD,
    MATRIX_RELPATH,
    PAUSE_IMAGE,
    ChartImageSpec,
    ImageSpec,
    Matrix,
    MatrixError,
)
from .release import hub_image_tag

SMOKE_TEST_PATH = "/usr/local/bin/gpu-smoke-test"

#: The notebook Dockerfiles' stages, smallest first; the last is the full image.
STAGES = ("base", "jupyter", "framework")
FULL_STAGE = STAGES[-1]
#: Where the k8s-hub rebuild's Dockerfile finds z2jh's pinned requirements in its build context.
HUB_REQUIREMENTS_IN_CONTEXT = "images/k8s-hub/z2jh-requirements.txt"
#: Which stage an image was built to (absent from full images' Dockerfile labels).
STAGE_LABEL = "io.gpuspawner.image.stage"


#: Build outputs the Dockerfiles copy (ignored by git), and the tracked sources they
#: are made from (the Makefile's wheel of the JupyterLab extension).
BUILT_FROM = {"images/common/wheels": ("extensions/gpuspawner-jupyterlab",)}


@dataclass(frozen=True)
class Provenance:
    """An image's build-time labels: ``org.opencontainers.image.revision`` and ``created``."""

    revision: str = "unknown"
    created: str = "unknown"


UNKNOWN_PROVENANCE = Provenance()


@dataclass(frozen=True)
class BuildStep:
    """One `docker build`: everything the docker SDK's images.build() needs."""

    name: str
    dockerfile: str
    context: str
    repository: str
    tags: tuple[str, ...]
    buildargs: dict[str, str]
    labels: dict[str, str]
    cuda: str | None = None
    driver_floor: str | None = None
    #: The Dockerfile stage to stop at (None: the last one).
    target: str | None = None
    #: Files sent in the build context that are not in the repository: {context path: local path}.
    extra_files: dict[str, str] = field(default_factory=dict)
    #: Whether ``build --pull`` may pull its base: not when an earlier step of the same
    #: plan builds that base locally (the hub image on the k8s-hub rebuild).
    pull_base: bool = True

    @property
    def refs(self) -> list[str]:
        return [f"{self.repository}:{t}" for t in self.tags]


@dataclass(frozen=True)
class TestRun:
    """One smoke-test container run."""

    image: str
    mode: str  # "gpu", "cpu", or "serve" (start as `docker run IMAGE` does, wait until healthy)
    command: list[str] | None
    device_requests: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    reason: str = ""


def repository(registry: str, name: str) -> str:
    return f"{registry.rstrip('/')}/{name}" if registry else name


def stage_tag(spec: ImageSpec, stage: str = FULL_STAGE) -> str:
    """The image's tag for a stage: the matrix's tag, with `-<stage>` unless it is the full image."""
    if stage not in STAGES:
        raise MatrixError(
            f"{stage!r} is not a stage of the notebook images; known: {', '.join(STAGES)}"
        )
    return spec.tag if stage == FULL_STAGE else f"{spec.tag}-{stage}"


def image_ref(
    matrix: Matrix, spec: ImageSpec, registry: str | None = None, stage: str = FULL_STAGE
) -> str:
    reg = matrix.registry if registry is None else registry
    return f"{repository(reg, spec.name)}:{stage_tag(spec, stage)}"


def hub_ref(matrix: Matrix, package_version: str, registry: str | None = None) -> str:
    """The hub image: ``<registry>/<hub.name>:<hub image tag>`` (z2jh's ``hub.image``), the
    tag derived from the package version (:func:`.release.hub_image_tag`)."""
    reg = matrix.registry if registry is None else registry
    return f"{repository(reg, matrix.hub.name)}:{hub_image_tag(package_version)}"


def validation_ref(matrix: Matrix, registry: str | None = None) -> str | None:
    """The GPU check's image, ``<registry>/<validation.name>:<validation.tag>``; None without one."""
    spec = matrix.validation
    if spec is None:
        return None
    reg = matrix.registry if registry is None else registry
    return f"{repository(reg, spec.name)}:{spec.tag}"


def build_labels(provenance: Provenance) -> dict[str, str]:
    """Labels only known at build time; the rest are in the Dockerfiles."""
    return {
        "org.opencontainers.image.created": provenance.created,
        "org.opencontainers.image.revision": provenance.revision,
    }


def dockerfile_of(matrix: Matrix, name: str) -> str:
    """The Dockerfile (relative to the repository root) of any image the matrix names."""
    if name in matrix.images:
        return matrix.images[name].dockerfile
    if name == matrix.hub.name:
        return matrix.hub.dockerfile
    if name == K8S_HUB_REBUILD:
        return matrix.hub.rebuild_dockerfile
    if matrix.validation is not None and name == matrix.validation.name:
        return matrix.validation.dockerfile
    if name in matrix.z2jh.images:
        return matrix.z2jh.images[name].dockerfile
    raise MatrixError(f"{name} is not an image of {matrix.source}")


def copied_paths(dockerfile_text: str) -> list[str]:
    """The build-context paths a Dockerfile's COPY and ADD instructions read.

    Copies from another stage or image (``--from``) read no context; flags such as
    ``--chown`` are dropped; both the shell form and the JSON form are read. An
    instruction whose paths cannot be read is a :class:`MatrixError`.
    """
    logical: list[str] = []
    pending = ""
    for line in dockerfile_text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    if pending:
        logical.append(pending)
    paths: list[str] = []
    for instruction in logical:
        keyword, _, rest = instruction.partition(" ")
        if keyword.upper() not in ("COPY", "ADD"):
            continue
        flags: list[str] = []
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
        if any(f.startswith("--from") for f in flags):
            continue
        try:
            args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        except ValueError as e:
            raise MatrixError(f"cannot read the paths of `{instruction}`: {e}") from None
        paths += [str(arg) for arg in args[:-1]]
    return paths


def image_sources(matrix: Matrix, name: str, dockerfile_text: str) -> tuple[str, ...]:
    """What an image is built from, as paths in the repository: its Dockerfile, the
    matrix (its build arguments) and what the Dockerfile copies, built outputs replaced
    by the sources they are made from (:data:`BUILT_FROM`).

    The last commit that changed one of them is the image's revision, as chartpress
    labels zero-to-jupyterhub's images: a commit elsewhere changes no image.
    """
    dockerfile = dockerfile_of(matrix, name)
    try:
        copied = copied_paths(dockerfile_text)
    except MatrixError as e:
        raise MatrixError(f"{dockerfile}: {e}") from None
    paths = {dockerfile, MATRIX_RELPATH.as_posix()}
    for path in copied:
        paths.update(BUILT_FROM.get(path.rstrip("/"), (path,)))
    return tuple(sorted(paths))


def plan_builds(
    matrix: Matrix,
    names: list[str] | None,
    *,
    context: str,
    registry: str | None = None,
    provenance: Mapping[str, Provenance] | None = None,
    package_version: str = "0",
    stage: str = FULL_STAGE,
    hub_requirements: str | None = None,
    binaries: Mapping[str, str] | None = None,
) -> list[BuildStep]:
    """The builds for `names` (notebook images, the hub, the GPU check's image and/or z2jh's
    other images; all notebook images if empty).

    `provenance` gives each image's revision and build date by name (unknown where
    missing); `stage` stops the notebook images at that Dockerfile stage; `hub_requirements`
    is the local path of z2jh's pinned hub requirements, sent with the k8s-hub rebuild's
    context; `binaries` are the local paths of the host-built programs z2jh's images copy.

    ``k8s-hub`` (:data:`.matrix.K8S_HUB_REBUILD`) rebuilds z2jh's hub image and tags it
    with quay.io's reference, before the hub image whose FROM names that reference.
    """
    reg = matrix.registry if registry is None else registry
    provenance = provenance or {}
    wanted = list(names or [])
    steps: list[BuildStep] = []
    chart = [n for n in wanted if n in matrix.z2jh.images]
    wanted = [n for n in wanted if n not in chart]
    include_hub = matrix.hub.name in wanted
    if include_hub:
        wanted.remove(matrix.hub.name)
    include_rebuild = K8S_HUB_REBUILD in wanted
    if include_rebuild:
        wanted.remove(K8S_HUB_REBUILD)
    check = matrix.validation
    include_check = check is not None and check.name in wanted
    if check is not None and include_check:
        wanted.remove(check.name)
    others = include_hub or include_rebuild or chart or include_check
    specs = matrix.select(wanted) if wanted or not others else []
    for spec in specs:
        made = provenance.get(spec.name, UNKNOWN_PROVENANCE)
        args = {**spec.build_args(), "BUILD_DATE": made.created, "VCS_REF": made.revision}
        full = stage == FULL_STAGE
        labels = {**build_labels(made), STAGE_LABEL: stage}
        if full:
            # Repeated from the Dockerfile's LABELs so that a Dockerfile edited by hand
            # cannot build an image whose labels disagree with the matrix. A smaller
            # stage has no framework, so it must not claim one (or its CUDA).
            labels.update(
                {
                    IMAGE_LABEL_CUDA: spec.cuda,
                    IMAGE_LABEL_DRIVER_FLOOR: spec.driver_floor,
                    IMAGE_LABEL_FRAMEWORK: f"{spec.framework}=={spec.framework_version}",
                }
            )
        steps.append(
            BuildStep(
                name=spec.name,
                dockerfile=spec.dockerfile,
                context=context,
                repository=repository(reg, spec.name),
                tags=(stage_tag(spec, stage),),
                buildargs=args,
                labels=labels,
                cuda=spec.cuda if full else None,
                driver_floor=spec.driver_floor if full else None,
                target=stage,
            )
        )
    if include_rebuild:
        steps.append(
            k8s_hub_rebuild_step(
                matrix,
                context,
                provenance.get(K8S_HUB_REBUILD, UNKNOWN_PROVENANCE),
                hub_requirements,
            )
        )
    if include_hub:
        hub = matrix.hub
        made = provenance.get(hub.name, UNKNOWN_PROVENANCE)
        tag = hub_image_tag(package_version)
        steps.append(
            BuildStep(
                name=hub.name,
                dockerfile=hub.dockerfile,
                context=context,
                repository=repository(reg, hub.name),
                # The package version, as the chart's appVersion and hub.image.tag.
                tags=(tag,),
                buildargs={
                    **hub.build_args(tag),
                    "BUILD_DATE": made.created,
                    "VCS_REF": made.revision,
                },
                labels=build_labels(made),
                pull_base=not include_rebuild,
            )
        )
    if check is not None and include_check:
        made = provenance.get(check.name, UNKNOWN_PROVENANCE)
        steps.append(
            BuildStep(
                name=check.name,
                dockerfile=check.dockerfile,
                context=context,
                repository=repository(reg, check.name),
                tags=(check.tag,),
                buildargs={
                    **check.build_args(),
                    "BUILD_DATE": made.created,
                    "VCS_REF": made.revision,
                },
                labels=build_labels(made),
            )
        )
    steps.extend(
        chart_build_step(
            matrix, name, context, provenance.get(name, UNKNOWN_PROVENANCE), binaries or {}
        )
        for name in chart
    )
    return steps


def k8s_hub_rebuild_step(
    matrix: Matrix, context: str, provenance: Provenance, hub_requirements: str | None
) -> BuildStep:
    """The offline rebuild of z2jh's hub image, tagged with quay.io's reference
    (``quay.io/jupyterhub/k8s-hub:4.4.0``) in the local engine, where the hub image's
    FROM finds it; it is never pushed. z2jh's requirements must be given."""
    hub = matrix.hub
    if not hub_requirements:
        raise MatrixError(
            f"{K8S_HUB_REBUILD} installs z2jh's pinned hub requirements: pass "
            "--hub-requirements FILE (z2jh's images/hub/requirements.txt at the chart's tag)"
        )
    repo, tag = hub.k8s_hub_ref.rsplit(":", 1)
    return BuildStep(
        name=K8S_HUB_REBUILD,
        dockerfile=hub.rebuild_dockerfile,
        context=context,
        repository=repo,
        tags=(tag,),
        buildargs=hub.rebuild_args(),
        labels={
            **build_labels(provenance),
            "org.opencontainers.image.title": "k8s-hub, rebuilt",
            "org.opencontainers.image.description": (
                f"zero-to-jupyterhub's {hub.k8s_hub_ref}, rebuilt by gpuspawner from its "
                f"recipe and pinned requirements ({hub.rebuild_dockerfile})"
            ),
            "org.opencontainers.image.version": hub.z2jh_chart,
            "org.opencontainers.image.source": "https://github.com/gpuspawner/gpuspawner",
            "org.opencontainers.image.licenses": "BSD-3-Clause",
            "org.opencontainers.image.base.name": hub.base_image,
        },
        extra_files={HUB_REQUIREMENTS_IN_CONTEXT: hub_requirements},
    )


def chart_image_labels(spec: ChartImageSpec, provenance: Provenance) -> dict[str, str]:
    """The OCI labels of one of z2jh's other images, all given at build time: their
    Dockerfiles carry none, so that no build date or revision invalidates a cached layer."""
    return {
        **build_labels(provenance),
        "org.opencontainers.image.title": f"{spec.name} for zero-to-jupyterhub",
        "org.opencontainers.image.description": (
            f"zero-to-jupyterhub's {spec.name} image, rebuilt by gpuspawner ({spec.dockerfile})"
        ),
        "org.opencontainers.image.version": spec.tag,
        "org.opencontainers.image.source": "https://github.com/gpuspawner/gpuspawner",
        "org.opencontainers.image.licenses": "BSD-3-Clause",
        "org.opencontainers.image.base.name": spec.base_image or "scratch",
    }


def chart_build_step(
    matrix: Matrix,
    name: str,
    context: str,
    provenance: Provenance,
    binaries: Mapping[str, str],
) -> BuildStep:
    """The build of one of z2jh's other images; its host-built programs must be given."""
    spec = matrix.z2jh.images[name]
    missing = [b for b in spec.binaries if b not in binaries]
    if missing:
        raise MatrixError(
            f"{name} copies the host-built {', '.join(missing)}: pass --binary NAME=PATH "
            "(python -m gpuspawner_sandbox.chartimages builds them and this image)"
        )
    return BuildStep(
        name=name,
        dockerfile=spec.dockerfile,
        context=context,
        repository=repository(matrix.z2jh.registry, name),
        tags=(spec.tag,),
        buildargs={
            **({"BASE_IMAGE": spec.base_image} if spec.base_image else {}),
        },
        labels=chart_image_labels(spec, provenance),
        extra_files={spec.context_path(b): binaries[b] for b in spec.binaries},
    )


def plan_test(
    image: str, nvidia_runtime: bool, cpu_only: bool = False, stage: str = FULL_STAGE
) -> TestRun:
    """How to test an image: the full image runs the smoke test, with every GPU when the
    engine can give them; a smaller stage has no framework to test, so it is started
    as `docker run IMAGE` would and must turn healthy (JupyterLab answers)."""
    if stage != FULL_STAGE:
        return TestRun(
            image=image,
            mode="serve",
            command=None,
            # Never inherit GPUs from a runtime that injects them by default.
            environment={"NVIDIA_VISIBLE_DEVICES": "void"},
            reason=f"the {stage} stage has no framework: started alone, it must turn healthy",
        )
    if nvidia_runtime and not cpu_only:
        return TestRun(
            image=image,
            mode="gpu",
            command=[SMOKE_TEST_PATH],
            # The docker SDK's DeviceRequest(count=-1, capabilities=[["gpu"]]): "--gpus all".
            device_requests=[{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}],
            reason="the engine has the NVIDIA runtime: all GPUs requested",
        )
    reason = (
        "CPU-only mode requested"
        if cpu_only
        else "the engine has no NVIDIA runtime: CPU-only mode (asserts no GPU is visible)"
    )
    return TestRun(
        image=image,
        mode="cpu",
        command=[SMOKE_TEST_PATH, "--cpu"],
        # What gpuspawner sets on CPU pods, so that a runtime that injects GPUs by
        # default is caught here too.
        environment={"NVIDIA_VISIBLE_DEVICES": "void"},
        reason=reason,
    )


def catalog_entries(
    matrix: Matrix, names: list[str] | None = None, registry: str | None = None
) -> dict[str, dict[str, Any]]:
    """The catalog's `images:` mapping for these images, keyed by profile slug.

    Only what the images know: GPU types, limits and defaults are the admin's.
    """
    entries: dict[str, dict[str, Any]] = {}
    for spec in matrix.select(names):
        entries[spec.profile] = {
            "display_name": spec.display_name,
            "description": (
                f"{spec.display_name} ({spec.framework} {spec.framework_version}) with CUDA "
                f"{spec.cuda}, JupyterLab {spec.jupyterlab}; needs NVIDIA driver "
                f">= {spec.driver_floor}"
            ),
            "image": image_ref(matrix, spec, registry),
            "cuda": spec.cuda,
        }
    return entries


def catalog_document(
    matrix: Matrix, names: list[str] | None = None, registry: str | None = None
) -> dict[str, Any]:
    return {"images": catalog_entries(matrix, names, registry)}


def prepuller_values(
    matrix: Matrix, names: list[str] | None = None, registry: str | None = None
) -> dict[str, Any]:
    """zero-to-jupyterhub values that make its image puller pull these images on GPU nodes.

    z2jh pre-pulls only `singleuser.image`, `profileList[].kubespawner_override.image` and
    `prePuller.extraImages`, on nodes its tolerations allow: GPUSpawner's catalog images
    are none of the first two, and GPU nodes are tainted, so both entries are needed.
    """
    images: dict[str, Any] = {}
    for spec in matrix.select(names):
        name, tag = image_ref(matrix, spec, registry).rsplit(":", 1)
        images[f"gpuspawner-{spec.profile}"] = {"name": name, "tag": tag}
    return {
        "prePuller": {
            "extraImages": images,
            "extraTolerations": [dict(t) for t in DEFAULT_GPU_TOLERATIONS],
        }
    }


def facts_document(
    matrix: Matrix, package_version: str, registry: str | None = None
) -> dict[str, Any]:
    """What `gpuspawner-images facts` prints: the facts other programs (the sandbox) need
    about the images, computed here so that none of them parses the matrix again."""
    hub = matrix.hub
    reg = matrix.registry if registry is None else registry
    return {
        "matrix": matrix.source,
        "version": package_version,
        "stage_label": STAGE_LABEL,
        "stages": list(STAGES),
        "full_stage": FULL_STAGE,
        "hub": {
            "name": hub.name,
            "repository": repository(reg, hub.name),
            "tag": hub_image_tag(package_version),
            "ref": hub_ref(matrix, package_version, registry),
            "z2jh_chart": hub.z2jh_chart,
            # what the hub image is built FROM (z2jh's hub image)
            "k8s_hub": hub.k8s_hub_ref,
            # `build` of these, in this order, makes the hub image where no registry is
            # reachable: k8s-hub rebuilt under k8s_hub's reference, then the hub on it
            "offline_build": [K8S_HUB_REBUILD, hub.name],
            "jupyterhub": hub.jupyterhub,
        },
        # The GPU check's image (c.GPUSpawner.validation_image); null without one.
        "validation": (
            {
                "name": matrix.validation.name,
                "ref": validation_ref(matrix, registry),
                "python": matrix.validation.python,
            }
            if matrix.validation is not None
            else None
        ),
        "notebook_images": [
            {
                "name": spec.name,
                "profile": spec.profile,
                "cuda": spec.cuda,
                "driver_floor": spec.driver_floor,
                "refs": {stage: image_ref(matrix, spec, registry, stage) for stage in STAGES},
            }
            for spec in matrix.images.values()
        ],
        "chart_images": [
            *(
                {
                    "name": spec.name,
                    "ref": matrix.z2jh.ref(spec.name),
                    "dockerfile": spec.dockerfile,
                    "binaries": list(spec.binaries),
                }
                for spec in matrix.z2jh.images.values()
            ),
            *(
                [
                    {
                        "name": PAUSE_IMAGE,
                        "ref": matrix.z2jh.pause_ref,
                        "dockerfile": None,
                        "binaries": [],
                    }
                ]
                if matrix.z2jh.pause_tag
                else []
            ),
        ],
    }


def base_images(matrix: Matrix) -> list[str]:
    """Every base image the matrix builds on, each once, in matrix order."""
    seen = [spec.base_image for spec in matrix.images.values()] + [matrix.hub.base_image]
    seen += [spec.base_image for spec in matrix.z2jh.images.values() if spec.base_image]
    if matrix.validation is not None:
        seen.append(matrix.validation.base_image)
    return list(dict.fromkeys(seen))


def known_names(matrix: Matrix) -> list[str]:
    check = [matrix.validation.name] if matrix.validation is not None else []
    return [*matrix.images, K8S_HUB_REBUILD, matrix.hub.name, *check, *matrix.z2jh.images]


def notebook_names(matrix: Matrix, names: list[str]) -> list[str]:
    """The notebook images among `names` (the verbs that test or catalog only those)."""
    return [n for n in names if n in matrix.images]


def check_names(matrix: Matrix, names: list[str]) -> None:
    unknown = [n for n in names if n not in known_names(matrix)]
    if unknown:
        raise MatrixError(
            f"{', '.join(unknown)} is not an image of {matrix.source}; "
            f"known: {', '.join(known_names(matrix))}"
        )
