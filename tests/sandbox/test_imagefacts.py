"""The sandbox asks the image tool (`gpuspawner-images facts --json`) what it knows of the
images: read as JSON, the program run as a process, and no second copy in the sandbox."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuspawner._version import __version__
from gpuspawner.images.matrix import K8S_HUB_REBUILD, load_matrix
from gpuspawner.images.plan import STAGE_LABEL, STAGES, hub_ref, image_ref
from gpuspawner_sandbox import chartimages, imagefacts, notebookimage

REPO = Path(__file__).resolve().parents[2]
SANDBOX = REPO / "sandbox" / "gpuspawner_sandbox"

#: What the tool printed, trimmed: one notebook image, one chart image, the pause image.
ANSWER = {
    "version": "1.2.3",
    "stage_label": "example.org/stage",
    "stages": ["base", "jupyter", "framework"],
    "full_stage": "framework",
    "hub": {
        "name": "hub",
        "tag": "1.2.3",
        "ref": "r.test/hub:1.2.3",
        "offline_build": ["rebuilt-base", "hub"],
    },
    "notebook_images": [
        {
            "name": "cuda-pytorch",
            "refs": {
                "base": "r.test/cuda-pytorch:2-base",
                "jupyter": "r.test/cuda-pytorch:2-jupyter",
                "framework": "r.test/cuda-pytorch:2",
            },
        }
    ],
    "chart_images": [
        {
            "name": "kube-scheduler",
            "ref": "z.invalid/kube-scheduler:v1",
            "dockerfile": "images/z2jh/kube-scheduler/Dockerfile",
            "binaries": ["k8s"],
        },
        {"name": "pause", "ref": "z.invalid/pause:3", "dockerfile": None, "binaries": []},
    ],
    "catalogs": {"/c/catalog.yaml": ["r.test/cuda-pytorch:2-jupyter"]},
}


def answering(monkeypatch, stdout: str = "", returncode: int = 0, stderr: str = ""):
    """Stand in for the tool's process; the calls it got."""
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        return SimpleNamespace(returncode=returncode, stdout=stdout, stderr=stderr)

    monkeypatch.setattr(imagefacts.subprocess, "run", run)
    return calls


# --- reading the answer (the tool stood in for) --------------------------------------


def test_the_tools_json_is_read_into_facts():
    facts = imagefacts.parse_facts(json.dumps(ANSWER))
    assert facts.version == "1.2.3"
    assert facts.stage_label == "example.org/stage"
    assert facts.hub_ref == "r.test/hub:1.2.3"
    assert facts.hub_offline_build == ("rebuilt-base", "hub")
    assert facts.stage_refs(["cuda-pytorch"], "jupyter") == ["r.test/cuda-pytorch:2-jupyter"]
    assert facts.chart_images == (
        imagefacts.ChartImage(
            "kube-scheduler",
            "z.invalid/kube-scheduler:v1",
            "images/z2jh/kube-scheduler/Dockerfile",
            ("k8s",),
        ),
        imagefacts.ChartImage("pause", "z.invalid/pause:3", None, ()),
    )
    assert facts.catalogs == {"/c/catalog.yaml": ("r.test/cuda-pytorch:2-jupyter",)}


def test_unknown_images_and_stages_are_one_sentence():
    facts = imagefacts.parse_facts(json.dumps(ANSWER))
    with pytest.raises(imagefacts.ImageFactsError, match="knows no notebook image cuda-jax"):
        facts.stage_refs(["cuda-jax"], "jupyter")
    with pytest.raises(imagefacts.ImageFactsError, match="'gpu' is not a stage"):
        facts.stage_refs(["cuda-pytorch"], "gpu")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("==> building", "printed no JSON"),
        ("[]", "printed no JSON object"),
        (json.dumps({**ANSWER, "stage_label": None}), "gave no stage_label"),
        (json.dumps({**ANSWER, "hub": {"name": "hub"}}), "gave no hub.ref"),
        (
            json.dumps({**ANSWER, "hub": {"name": "hub", "ref": "r.test/hub:1"}}),
            r"gave no hub\.offline_build",
        ),
        (
            json.dumps({**ANSWER, "chart_images": [{"name": "x"}]}),
            r"gave no chart_images\[\]\.ref",
        ),
    ],
)
def test_an_answer_the_sandbox_cannot_read_is_one_sentence(text, message):
    with pytest.raises(imagefacts.ImageFactsError, match=message):
        imagefacts.parse_facts(text)


def test_the_tool_is_run_as_a_program_in_the_repository(monkeypatch, tmp_path):
    calls = answering(monkeypatch, json.dumps(ANSWER))
    facts = imagefacts.image_facts(tmp_path, ["/c/catalog.yaml"])
    assert facts.hub_ref == "r.test/hub:1.2.3"
    ((command, kwargs),) = calls
    assert command == [
        sys.executable, "-m", "gpuspawner.images.cli", "facts", "--json",
        "--catalog=/c/catalog.yaml",
    ]  # fmt: skip
    assert kwargs["cwd"] == tmp_path


def test_a_failing_tool_is_reported_in_its_own_words(monkeypatch, tmp_path):
    answering(monkeypatch, returncode=2, stderr="gpuspawner-images: no images/matrix.yaml here\n")
    with pytest.raises(imagefacts.ImageFactsError) as err:
        imagefacts.image_facts(tmp_path)
    assert str(err.value) == (
        "`gpuspawner-images facts` failed (exit 2): gpuspawner-images: no images/matrix.yaml here"
    )


def test_the_chart_images_and_the_catalog_come_from_the_tools_answer(monkeypatch):
    answering(monkeypatch, json.dumps(ANSWER))
    images = chartimages.load_chart_images(REPO)
    assert [i.ref for i in images] == ["z.invalid/kube-scheduler:v1", "z.invalid/pause:3"]
    assert chartimages.pause_image(images).name == "pause"
    args = chartimages.tool_build_args(images, {"k8s": Path("/c/k8s")})
    assert args[-2:] == ["kube-scheduler", "--binary=k8s=/c/k8s"]
    assert notebookimage.catalog_images(Path("/c/catalog.yaml"), REPO) == [
        "r.test/cuda-pytorch:2-jupyter"
    ]


def test_chart_images_without_one_pause_image_last_are_refused(monkeypatch):
    swapped = {**ANSWER, "chart_images": ANSWER["chart_images"][::-1]}
    answering(monkeypatch, json.dumps(swapped))
    with pytest.raises(chartimages.ChartImageError, match="not one pause image last"):
        chartimages.load_chart_images(REPO)


# --- the real program ------------------------------------------------------------------


def test_the_real_tool_answers_what_the_package_computes():
    facts = imagefacts.image_facts(REPO)
    matrix = load_matrix(REPO / "images" / "matrix.yaml")
    assert facts.version == __version__
    assert facts.stage_label == STAGE_LABEL
    assert facts.stages == STAGES
    assert facts.hub_ref == hub_ref(matrix, __version__)
    assert facts.hub_offline_build == (K8S_HUB_REBUILD, matrix.hub.name)
    assert facts.notebook_refs == {
        name: {stage: image_ref(matrix, spec, stage=stage) for stage in STAGES}
        for name, spec in matrix.images.items()
    }
    assert [i.ref for i in facts.chart_images] == [
        *(matrix.z2jh.ref(n) for n in matrix.z2jh.images),
        matrix.z2jh.pause_ref,
    ]


def test_the_sandbox_imports_no_gpuspawner():
    """The modules that ask the tool do not import the package (they run it)."""
    probe = (
        "import sys\n"
        "import gpuspawner_sandbox.imagefacts, gpuspawner_sandbox.chartimages\n"
        "import gpuspawner_sandbox.notebookimage, gpuspawner_sandbox.demo\n"
        "print([m for m in sys.modules if m == 'gpuspawner' or m.startswith('gpuspawner.')])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- one place for each fact ------------------------------------------------------------


def _string_constants(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_the_sandbox_writes_none_of_the_tools_facts_itself():
    """No second copy in the sandbox's code: the stage label, the package version (the hub
    tag), the matrix's z2jh keys and its path, which only the image tool reads."""
    matrix = load_matrix(REPO / "images" / "matrix.yaml")
    facts = {
        STAGE_LABEL,
        __version__,
        hub_ref(matrix, __version__),
        matrix.hub.k8s_hub_ref,
        K8S_HUB_REBUILD,
        "pause_tag",
        "matrix.yaml",
        "images/matrix.yaml",
        *(matrix.z2jh.ref(n) for n in matrix.z2jh.images),
    }
    found = {
        f"{path.relative_to(REPO)}: {value!r}"
        for path in SANDBOX.rglob("*.py")
        for value in _string_constants(path)
        if value in facts or any(fact in value for fact in (STAGE_LABEL, __version__))
    }
    assert found == set()


def test_the_gpu_check_image_comes_from_the_tools_answer():
    """`validation` names the GPU check's image; an older tool's answer without it reads as None."""
    assert imagefacts.parse_facts(json.dumps(ANSWER)).validation is None
    answer = {**ANSWER, "validation": {"name": "check", "ref": "r.test/check:1", "python": "3"}}
    assert imagefacts.parse_facts(json.dumps(answer)).validation == ("check", "r.test/check:1")
    with pytest.raises(imagefacts.ImageFactsError, match=r"validation\.ref"):
        imagefacts.parse_facts(json.dumps({**ANSWER, "validation": {"name": "check"}}))
    from gpuspawner.images.plan import validation_ref

    matrix = load_matrix(REPO / "images" / "matrix.yaml")
    assert imagefacts.image_facts(REPO).validation == (
        matrix.validation.name,
        validation_ref(matrix),
    )
    # The sandbox's module that builds it asks the tool too: no reference of its own.
    source = (SANDBOX / "validationimage.py").read_text()
    assert validation_ref(matrix) not in source and matrix.validation.tag not in source
