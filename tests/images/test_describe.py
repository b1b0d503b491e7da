"""What `describe` expects in each stage, and how it reads the probe and reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuspawner.core.labels import IMAGE_LABEL_CUDA, IMAGE_LABEL_FRAMEWORK
from gpuspawner.images import describe as desc
from gpuspawner.images.matrix import read_constraints

from .conftest import REPO


def pins_of(spec):
    return read_constraints((REPO / spec.constraints).read_text())


@pytest.mark.parametrize("name", ["cuda-pytorch", "cuda-tensorflow"])
def test_the_framework_stage_expects_the_server_the_framework_and_every_library(matrix, name):
    spec = matrix.images[name]
    expected = desc.expected_packages(spec, "framework", pins_of(spec))
    assert [(e.name, e.role) for e in expected[:4]] == [
        ("jupyterhub", "server"),
        ("jupyterlab", "server"),
        ("notebook", "server"),
        (spec.framework, "framework"),
    ]
    assert expected[3].version == spec.framework_version
    libraries = expected[4:]
    assert [e.name for e in libraries] == list(spec.libraries)
    # Every library has the version its constraints file pins.
    assert all(e.role == "library" and e.version for e in libraries)
    assert {"scipy", "pandas", "matplotlib", "scikit-learn", "ipywidgets"} <= set(spec.libraries)


def test_torchvision_and_torchaudio_are_expected_only_in_the_pytorch_image(matrix):
    pt, tf = matrix.images["cuda-pytorch"], matrix.images["cuda-tensorflow"]
    assert {"torchvision", "torchaudio"} <= set(pt.libraries)
    assert not {"torchvision", "torchaudio"} & set(tf.libraries)


def test_the_jupyter_stage_expects_only_the_server_and_the_base_nothing(matrix):
    spec = matrix.images["cuda-pytorch"]
    expected = desc.expected_packages(spec, "jupyter", pins_of(spec))
    assert [(e.name, e.version) for e in expected] == [
        ("jupyterhub", spec.jupyterhub),
        ("jupyterlab", spec.jupyterlab),
        ("notebook", spec.notebook),
    ]
    assert desc.expected_packages(spec, "base") == []


def test_without_the_constraints_a_library_may_have_any_version(matrix):
    spec = matrix.images["cuda-tensorflow"]
    expected = desc.expected_packages(spec, "framework")
    assert all(e.version is None for e in expected if e.role == "library")
    package = desc.Package("scipy", "library", None, "1.0")
    assert package.status == "ok"


def test_the_probe_reports_installed_and_absent_distributions():
    """The probe is real Python: run here, against this interpreter's packages."""
    args = ["pytest", "surely-no-such-distribution"]
    proc = subprocess.run(
        [sys.executable, *desc.probe_command([desc.Expected(n, "library", None) for n in args])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answer = desc.parse_probe("a start hook said hello\n" + proc.stdout)
    assert answer["versions"]["pytest"] == pytest.__version__
    assert answer["versions"]["surely-no-such-distribution"] is None
    assert answer["python"] == ".".join(map(str, sys.version_info[:3]))


@pytest.mark.parametrize(
    "output",
    [
        "",
        "Traceback (most recent call last):\n  boom\n",
        desc.MARKER + "{not json",
        desc.MARKER + "[]",
    ],
)
def test_output_without_an_answer_is_one_sentence(output):
    with pytest.raises(desc.ProbeError) as err:
        desc.parse_probe(output)
    assert str(err.value).startswith("the probe printed no answer; its last output: ")
    assert "\n" not in str(err.value)


def test_statuses_missing_differs_ok_and_local_versions(matrix):
    spec = matrix.images["cuda-pytorch"]
    expected = [
        desc.Expected("torch", "framework", "2.15.0"),
        desc.Expected("scipy", "library", "1.18.1"),
        desc.Expected("pandas", "library", "3.1.1"),
        desc.Expected("torchvision", "library", "0.29.2"),
    ]
    answer = {
        "python": "3.13.5",
        "versions": {"torch": "2.15.0+cu132", "scipy": "1.17.0", "pandas": None},
    }
    labels = {IMAGE_LABEL_FRAMEWORK: "torch==2.15.0", IMAGE_LABEL_CUDA: "13.2"}
    d = desc.describe(spec, "reg/cuda-pytorch:t", "framework", labels, expected, answer)
    assert [p.status for p in d.packages] == ["ok", "differs", "missing", "missing"]
    assert (d.framework, d.cuda, d.python, d.ok) == ("torch==2.15.0", "13.2", "3.13.5", False)
    assert desc.problems(d) == [
        "reg/cuda-pytorch:t: scipy is 1.17.0, the matrix and constraints say 1.18.1",
        "reg/cuda-pytorch:t: pandas (library) is not installed",
        "reg/cuda-pytorch:t: torchvision (library) is not installed",
    ]
    document = json.loads(json.dumps(desc.as_json([d])))
    (image,) = document["images"]
    assert image["packages"][2] == {
        "name": "pandas",
        "role": "library",
        "version": None,
        "expected": "3.1.1",
        "status": "missing",
    }
    assert image["ok"] is False and image["labels"] == labels


def test_what_an_image_says_is_made_printable():
    assert desc.clean("1.0\x1b[2J\r\nrm -rf") == "1.0?[2J??rm -rf"


def test_an_image_that_could_not_be_described_is_not_ok(matrix):
    d = desc.failed(matrix.images["cuda-pytorch"], "r/x:t", "framework", "not built")
    assert not d.ok and desc.problems(d) == ["r/x:t: not built"]
