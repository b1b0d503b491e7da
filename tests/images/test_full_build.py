"""The full images (framework stage): built from PyPI's wheels and checked inside.

Not in default CI: the wheels are about 3 GB (PyTorch) and 1.5 GB (TensorFlow) and
the build takes far longer than the jupyter stages. Collected only when
GPUSPAWNER_FULL_IMAGE_BUILD=1 (conftest.py), e.g. `make full-images`.
The recorded run is in docs/images.md.
"""

from __future__ import annotations

import json

import pytest

from gpuspawner.core.labels import IMAGE_LABEL_CUDA, IMAGE_LABEL_DRIVER_FLOOR, IMAGE_LABEL_FRAMEWORK
from gpuspawner.images.plan import image_ref

from .conftest import tool_on_engine
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


@pytest.fixture(scope="module")
def full(engine, built, matrix):
    proc = tool_on_engine(engine.host, "build", "--network", "host", *matrix.images)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return proc.stdout


@pytest.fixture(params=["cuda-pytorch", "cuda-tensorflow"])
def spec(request, full, matrix):
    return matrix.images[request.param]


def test_framework_reports_the_matrix_versions(docker_client, matrix, spec):
    image = image_ref(matrix, spec)
    rc, out = run(docker_client, image, ["python", "-c", PROBES[spec.framework]])
    assert rc == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["version"].split("+")[0] == spec.framework_version
    assert report["gpus"] == 0
    if spec.framework == "torch":
        assert report["cuda"] == spec.cuda
        assert report["cudnn"] > 0
    else:
        assert report["build_info"]["cuda_version"].split(".")[0] == spec.cuda.split(".")[0]


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
    rc, out = run(docker_client, image_ref(matrix, spec), ["python", "-c", probe, *names])
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
