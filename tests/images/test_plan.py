"""The tool's plans as data: builds, smoke-test runs and catalog entries."""

from __future__ import annotations

import pytest

from gpuspawner.core import labels
from gpuspawner.core.catalog import parse_catalog
from gpuspawner.images.matrix import K8S_HUB_REBUILD, MatrixError
from gpuspawner.images.plan import (
    HUB_REQUIREMENTS_IN_CONTEXT,
    SMOKE_TEST_PATH,
    Provenance,
    catalog_document,
    catalog_entries,
    check_names,
    copied_paths,
    dockerfile_of,
    image_sources,
    plan_builds,
    plan_test,
)

from .conftest import REPO


def test_build_plan_for_every_notebook_image(matrix):
    made = Provenance(revision="abc123", created="2026-11-29T00:00:00Z")
    steps = plan_builds(
        matrix, None, context=str(REPO), provenance={name: made for name in matrix.images}
    )
    assert [s.name for s in steps] == list(matrix.images)
    for step, spec in zip(steps, matrix.images.values(), strict=True):
        assert step.dockerfile == spec.dockerfile
        assert step.context == str(REPO)
        assert step.refs == [f"{matrix.registry}/{spec.name}:{spec.tag}"]
        assert step.buildargs[spec.framework_arg] == spec.framework_version
        assert step.buildargs["CUDA_VERSION"] == spec.cuda
        assert step.buildargs["DRIVER_FLOOR"] == spec.driver_floor
        assert step.buildargs["JUPYTERHUB_VERSION"] == spec.jupyterhub
        assert step.buildargs["BASE_IMAGE"] == spec.base_image
        assert step.buildargs["BUILD_DATE"] == "2026-11-29T00:00:00Z"
        assert step.buildargs["VCS_REF"] == "abc123"
        assert step.labels["org.opencontainers.image.revision"] == "abc123"
        assert step.labels[labels.IMAGE_LABEL_CUDA] == spec.cuda
        assert step.labels[labels.IMAGE_LABEL_DRIVER_FLOOR] == spec.driver_floor
        assert (step.cuda, step.driver_floor) == (spec.cuda, spec.driver_floor)


def test_build_plan_registry_override_and_selection(matrix):
    (step,) = plan_builds(matrix, ["cuda-tensorflow"], context="/ctx", registry="ghcr.io/me/")
    spec = matrix.images["cuda-tensorflow"]
    assert step.refs == [f"ghcr.io/me/cuda-tensorflow:{spec.tag}"]
    (local,) = plan_builds(matrix, ["cuda-tensorflow"], context="/ctx", registry="")
    assert local.refs == [f"cuda-tensorflow:{spec.tag}"]


def test_build_plan_for_the_hub(matrix):
    steps = plan_builds(matrix, [matrix.hub.name], context="/ctx", package_version="1.2.0rc1")
    (hub,) = steps
    assert hub.dockerfile == matrix.hub.dockerfile
    # tagged with the release's hub tag, the chart's appVersion (release.py)
    assert hub.tags == ("1.2.0rc1",)
    assert hub.refs == [f"{matrix.registry}/hub:1.2.0rc1"]
    assert hub.buildargs["K8S_HUB_IMAGE"] == "quay.io/jupyterhub/k8s-hub:4.4.0"
    assert hub.buildargs["K8S_HUB_IMAGE"] == matrix.hub.k8s_hub_ref
    assert hub.buildargs["IMAGE_VERSION"] == "1.2.0rc1"
    assert hub.buildargs["JUPYTERHUB_VERSION"] == matrix.hub.jupyterhub
    # the admin's build: FROM quay.io's k8s-hub, which `--pull` may refresh; z2jh's
    # requirements are not sent
    assert hub.pull_base and hub.extra_files == {}
    both = plan_builds(matrix, ["cuda-pytorch", matrix.hub.name], context="/ctx")
    assert [s.name for s in both] == ["cuda-pytorch", matrix.hub.name]


def test_build_plan_for_the_hub_on_the_k8s_hub_rebuild(matrix):
    """Where no registry is reachable: k8s-hub rebuilt and tagged with quay.io's reference
    first, whatever order the names come in, then the hub FROM it, never pulled."""
    rebuild, hub = plan_builds(
        matrix,
        [matrix.hub.name, K8S_HUB_REBUILD],
        context="/ctx",
        package_version="0.1.0.dev0",
        hub_requirements="/z2jh/requirements.txt",
        provenance={K8S_HUB_REBUILD: Provenance("feed1234", "2026-12-01T00:00:00Z")},
    )
    assert rebuild.name == K8S_HUB_REBUILD
    assert rebuild.dockerfile == matrix.hub.rebuild_dockerfile == "images/k8s-hub/Dockerfile"
    assert rebuild.refs == ["quay.io/jupyterhub/k8s-hub:4.4.0"] == [matrix.hub.k8s_hub_ref]
    assert rebuild.buildargs == {"BASE_IMAGE": matrix.hub.base_image}
    assert rebuild.extra_files == {HUB_REQUIREMENTS_IN_CONTEXT: "/z2jh/requirements.txt"}
    assert rebuild.labels["org.opencontainers.image.revision"] == "feed1234"
    assert rebuild.labels["org.opencontainers.image.base.name"] == matrix.hub.base_image
    assert hub.name == matrix.hub.name and hub.buildargs["K8S_HUB_IMAGE"] == rebuild.refs[0]
    assert not hub.pull_base
    # a registry option moves the hub, never quay.io's reference
    moved = plan_builds(
        matrix, [K8S_HUB_REBUILD], context="/c", registry="r.test", hub_requirements="/r"
    )
    assert moved[0].refs == [matrix.hub.k8s_hub_ref]
    with pytest.raises(MatrixError, match="pass --hub-requirements FILE"):
        plan_builds(matrix, [K8S_HUB_REBUILD], context="/ctx")


def test_each_image_is_labelled_with_its_own_provenance(matrix):
    steps = plan_builds(
        matrix,
        ["cuda-pytorch", matrix.hub.name],
        context="/ctx",
        provenance={matrix.hub.name: Provenance("1234abcd", "2026-12-01T00:00:00Z")},
    )
    pytorch, hub = steps
    assert hub.labels["org.opencontainers.image.revision"] == "1234abcd"
    assert hub.buildargs["VCS_REF"] == "1234abcd"
    assert hub.buildargs["BUILD_DATE"] == "2026-12-01T00:00:00Z"
    # an image the caller gave nothing for says so
    assert pytorch.labels["org.opencontainers.image.revision"] == "unknown"


def test_copied_paths_reads_copy_and_add_in_both_forms_and_skips_other_stages():
    dockerfile = """
FROM debian AS build
COPY --chown=1000:100 a.txt \\
     dir/b.sh /dest/
# COPY commented.txt /nowhere
ADD ["c d.tar", "/opt/"]
COPY --from=build /tmp/wheels /tmp/wheels
RUN echo COPY not-an-instruction
copy lower.txt /x
"""
    assert copied_paths(dockerfile) == ["a.txt", "dir/b.sh", "c d.tar", "lower.txt"]
    with pytest.raises(MatrixError, match=r"cannot read the paths of `COPY \["):
        copied_paths('COPY ["a", /x\n')
    with pytest.raises(MatrixError, match="No closing quotation"):
        copied_paths("COPY 'a /x\n")


def test_an_images_sources_are_what_its_dockerfile_copies_and_the_matrix(matrix):
    for name in [*matrix.images, matrix.hub.name, K8S_HUB_REBUILD, *matrix.z2jh.images]:
        dockerfile = dockerfile_of(matrix, name)
        sources = image_sources(matrix, name, (REPO / dockerfile).read_text())
        assert dockerfile in sources and "images/matrix.yaml" in sources
    pytorch = image_sources(
        matrix, "cuda-pytorch", (REPO / "images/cuda-pytorch/Dockerfile").read_text()
    )
    assert "gpuspawner/images/smoke.py" in pytorch and "images/common/start.sh" in pytorch
    # the extension's wheel is a build output: its source stands for it
    assert "extensions/gpuspawner-jupyterlab" in pytorch
    assert "images/common/wheels" not in pytorch
    # only the hub copies the package: a change to the spawner is no notebook image's
    assert "gpuspawner" not in pytorch
    assert "gpuspawner" in image_sources(
        matrix, matrix.hub.name, (REPO / matrix.hub.dockerfile).read_text()
    )
    # the rebuild of k8s-hub copies z2jh's requirements only: a change to the package
    # is no change of the rebuild's
    assert image_sources(
        matrix, K8S_HUB_REBUILD, (REPO / matrix.hub.rebuild_dockerfile).read_text()
    ) == tuple(
        sorted({matrix.hub.rebuild_dockerfile, "images/matrix.yaml", HUB_REQUIREMENTS_IN_CONTEXT})
    )
    with pytest.raises(MatrixError, match="cuda-jax is not an image"):
        dockerfile_of(matrix, "cuda-jax")
    with pytest.raises(
        MatrixError, match=r"^images/cuda-pytorch/Dockerfile: cannot read the paths of `COPY"
    ):
        image_sources(matrix, "cuda-pytorch", "FROM scratch\nCOPY 'a /x\n")


def test_unknown_names_are_refused(matrix):
    with pytest.raises(MatrixError, match="cuda-jax is not an image"):
        check_names(matrix, ["cuda-pytorch", "cuda-jax"])
    with pytest.raises(MatrixError):
        plan_builds(matrix, ["cuda-jax"], context="/ctx")


def test_smoke_test_uses_every_gpu_with_the_nvidia_runtime():
    run = plan_test("img:1", nvidia_runtime=True)
    assert run.mode == "gpu"
    assert run.command == [SMOKE_TEST_PATH]
    assert run.device_requests == [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
    assert "NVIDIA_VISIBLE_DEVICES" not in run.environment
    assert "NVIDIA runtime" in run.reason


def test_smoke_test_without_the_nvidia_runtime_is_cpu_only_and_says_so():
    run = plan_test("img:1", nvidia_runtime=False)
    assert run.mode == "cpu"
    assert run.command == [SMOKE_TEST_PATH, "--cpu"]
    assert run.device_requests == []
    assert run.environment == {"NVIDIA_VISIBLE_DEVICES": labels.VISIBLE_DEVICES_NONE}
    assert "no NVIDIA runtime" in run.reason


def test_cpu_only_can_be_forced():
    run = plan_test("img:1", nvidia_runtime=True, cpu_only=True)
    assert run.mode == "cpu" and run.device_requests == []


def test_catalog_entries_follow_the_matrix(matrix):
    entries = catalog_entries(matrix, registry="registry.test/team")
    assert list(entries) == [s.profile for s in matrix.images.values()]
    for spec in matrix.images.values():
        entry = entries[spec.profile]
        assert entry["image"] == f"registry.test/team/{spec.name}:{spec.tag}"
        assert entry["cuda"] == spec.cuda
        assert entry["display_name"] == spec.display_name
        assert spec.cuda in entry["description"] and spec.driver_floor in entry["description"]
        # Only what the image knows: GPU types and limits are the admin's.
        assert set(entry) == {"display_name", "description", "image", "cuda"}


def test_catalog_entries_pass_the_core_catalog_parser(matrix):
    document = catalog_document(matrix)
    document["gpu_types"] = {"a100": {"display_name": "NVIDIA A100"}}
    catalog = parse_catalog(document, "generated")
    for spec in matrix.images.values():
        image = catalog.images[spec.profile]
        assert image.cuda == spec.cuda
        assert image.image.endswith(f"/{spec.name}:{spec.tag}")


def test_build_plan_for_the_gpu_check_image(matrix):
    """`gpuspawner-images build validation`: its own tag and labels, no notebook image with it."""
    from gpuspawner.images.plan import Provenance, base_images, facts_document, validation_ref

    check = matrix.validation
    made = Provenance(revision="abc123", created="2026-12-04T00:00:00Z")
    (step,) = plan_builds(
        matrix,
        [check.name],
        context="/repo",
        registry="r.test/team",
        provenance={"validation": made},
    )
    assert step.refs == [f"r.test/team/validation:{check.tag}"]
    assert step.refs[0] == validation_ref(matrix, "r.test/team")
    assert step.dockerfile == "images/validation/Dockerfile"
    assert step.buildargs["BASE_IMAGE"] == check.base_image
    assert step.buildargs["PYTHON_VERSION"] == check.python
    assert step.buildargs["IMAGE_VERSION"] == check.tag
    assert step.buildargs["VCS_REF"] == "abc123"
    assert step.labels["org.opencontainers.image.revision"] == "abc123"
    assert step.target is None and step.cuda is None
    # with the hub, in one call; its base is made by `gpuspawner-images base`
    assert [s.name for s in plan_builds(matrix, ["hub", "validation"], context="/r")] == [
        "hub",
        "validation",
    ]
    assert check.base_image in base_images(matrix)
    facts = facts_document(matrix, "1.0", "r.test/team")
    assert facts["validation"] == {
        "name": "validation",
        "ref": f"r.test/team/validation:{check.tag}",
        "python": check.python,
    }
