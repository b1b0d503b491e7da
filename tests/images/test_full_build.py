"""The full images (framework stage): built from PyPI's wheels and checked inside:
the framework, every library of the matrix (it imports, at the constraints' pin, and
`gpuspawner-images describe` lists it), the labels and the smoke test.

Not in default CI: the wheels are about 3.2 GB (PyTorch) and 3.6 GB (TensorFlow) and
the build takes far longer than the jupyter stages. Collected only when
GPUSPAWNER_FULL_IMAGE_BUILD=1 (conftest.py), e.g. `make full-images`.
The recorded run is in docs/measurements.md.
"""

from __future__ import annotations

import json

import pytest

from gpuspawner.core.labels import IMAGE_LABEL_CUDA, IMAGE_LABEL_DRIVER_FLOOR, IMAGE_LABEL_FRAMEWORK
from gpuspawner.images.matrix import canonical_name, read_constraints
from gpuspawner.images.plan import image_ref

from .conftest import CACHE, REPO, tool_on_engine
from .test_built_images import run

PROBES = {
    "torch": (
        "import json, torch; print(json.dumps({'version': torch.__version__, "
        "'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version(), "
        "'gpus': torch.cuda.device_count()}))"
    ),
    "tensorflow": (
        "import json, tensorflow as tf; info = dict(tf.sysconfig.get_build_info()); "
        "print(json.dumps({'version': tf.__version__, 'build_info': info, "
        "'gpus': len(tf.config.list_physical_devices('GPU'))}))"
    ),
}


# Distributions whose module has another name; the others import as their name with '_'.
IMPORT_NAMES = {"beautifulsoup4": "bs4", "scikit-image": "skimage", "scikit-learn": "sklearn"}

# Imports each (distribution, module) pair given as arguments; one JSON line:
# {distribution: [installed version or None, error or None]}.
IMPORT_PROBE = """
import importlib, json, sys
from importlib import metadata
found = {}
for dist, module in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        importlib.import_module(module)
        found[dist] = [metadata.version(dist), None]
    except Exception as e:
        found[dist] = [None, f"{type(e).__name__}: {e}"]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def full(engine, built, matrix):
    proc = tool_on_engine(engine.host, "build", "--network", "host", *matrix.images)
    # pytest keeps a passing test's output to itself: the build's log (its summary table
    # of sizes and times is what docs/measurements.md records) stays readable here.
    (CACHE / "last-full-build.log").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return proc.stdout


@pytest.fixture(params=["cuda-pytorch", "cuda-tensorflow"])
def spec(request, full, matrix):
    return matrix.images[request.param]


def test_framework_reports_the_matrix_versions(docker_client, matrix, spec):
    image = image_ref(matrix, spec)
    rc, out = run(docker_client, image, ["python", "-c", PROBES[spec.framework]], stdout_only=True)
    assert rc == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["version"].split("+")[0] == spec.framework_version
    assert report["gpus"] == 0
    if spec.framework == "torch":
        assert report["cuda"] == spec.cuda
        assert report["cudnn"] > 0
    else:
        assert report["build_info"]["cuda_version"].split(".")[0] == spec.cuda.split(".")[0]


def pins(spec) -> dict[str, str]:
    return read_constraints((REPO / spec.constraints).read_text())


def test_every_library_imports_at_its_pinned_version(docker_client, matrix, spec):
    pairs = [
        x for lib in spec.libraries for x in (lib, IMPORT_NAMES.get(lib, lib.replace("-", "_")))
    ]
    rc, out = run(
        docker_client, image_ref(matrix, spec), ["python", "-c", IMPORT_PROBE, *pairs],
        stdout_only=True,
    )  # fmt: skip
    assert rc == 0, out
    found = json.loads(out.strip().splitlines()[-1])
    pinned = pins(spec)
    assert {lib: found[lib] for lib in spec.libraries} == {
        lib: [pinned[canonical_name(lib)], None] for lib in spec.libraries
    }


def test_describe_lists_every_library_at_its_pinned_version(engine, matrix, spec):
    proc = tool_on_engine(engine.host, "describe", "--json", spec.name)
    assert proc.returncode == 0, proc.stdout[-3000:]
    (image,) = json.loads(proc.stdout[proc.stdout.index("{") :])["images"]
    listed = {p["name"]: (p["role"], p["version"], p["status"]) for p in image["packages"]}
    pinned = pins(spec)
    for lib in spec.libraries:
        assert listed[lib] == ("library", pinned[canonical_name(lib)], "ok"), lib
    role, version, status = listed[spec.framework]
    assert (role, version.split("+")[0], status) == ("framework", spec.framework_version, "ok")
    assert image["framework"] == f"{spec.framework}=={spec.framework_version}"
    assert image["cuda"] == spec.cuda


def test_labels_name_the_framework_cuda_and_driver_floor(docker_client, matrix, spec):
    labels = docker_client.images.get(image_ref(matrix, spec)).labels
    assert labels[IMAGE_LABEL_CUDA] == spec.cuda
    assert labels[IMAGE_LABEL_DRIVER_FLOOR] == spec.driver_floor
    assert labels[IMAGE_LABEL_FRAMEWORK] == f"{spec.framework}=={spec.framework_version}"


def test_tensorflow_cuda_wheels_are_found_by_the_loader(docker_client, matrix, full):
    """tensorflow#63362: the wheels' libraries must load by name, for any process
    (torch needs no such help: it finds its CUDA wheels by path when imported)."""
    spec = matrix.images["cuda-tensorflow"]
    names = ["libcudart.so.12", "libcudnn.so.9", "libcublas.so.12"]
    probe = "import ctypes, sys; [ctypes.CDLL(n) for n in sys.argv[1:]]; print('loaded')"
    rc, out = run(
        docker_client, image_ref(matrix, spec), ["python", "-c", probe, *names], stdout_only=True
    )
    assert (rc, out.strip().splitlines()[-1]) == (0, "loaded"), out


def test_smoke_test_without_a_gpu_fails_with_its_message(docker_client, matrix, spec):
    rc, out = run(docker_client, image_ref(matrix, spec), ["gpu-smoke-test"])
    assert rc == 1, out
    assert "RESULT: FAIL" in out
    assert "Traceback" not in out


def test_smoke_test_cpu_mode_passes(docker_client, matrix, spec):
    rc, out = run(
        docker_client,
        image_ref(matrix, spec),
        ["gpu-smoke-test", "--cpu"],
        environment={"NVIDIA_VISIBLE_DEVICES": "void"},
    )
    assert rc == 0, out
    assert "RESULT: PASS" in out
