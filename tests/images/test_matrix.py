"""images/matrix.yaml: valid, consistent with itself, the package and the repository."""

from __future__ import annotations

import ast
import copy

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from gpuspawner.images.matrix import (
    MatrixError,
    consistency_problems,
    constraints_cuda,
    find_repo_root,
    load_matrix,
    min_driver_for_cuda,
    parse_matrix,
    read_constraints,
)
from gpuspawner.validation import gpucheck

from .conftest import REPO, package_jupyterhub_requirement


@pytest.fixture
def raw() -> dict:
    return yaml.safe_load((REPO / "images" / "matrix.yaml").read_text())


def test_the_real_matrix_has_no_problems(matrix):
    assert consistency_problems(matrix, package_jupyterhub_requirement(), REPO) == []


def test_single_user_and_hub_jupyterhub_satisfy_the_package_requirement(matrix):
    req = Requirement(package_jupyterhub_requirement())
    assert req.name == "jupyterhub"
    assert Version(matrix.hub.jupyterhub) in req.specifier
    for spec in matrix.images.values():
        assert Version(spec.jupyterhub) in req.specifier, spec.name


def test_both_frameworks_and_cuda_majors_are_covered(matrix):
    frameworks = {s.framework: s for s in matrix.images.values()}
    assert set(frameworks) == {"torch", "tensorflow"}
    # tensorflow[and-cuda] needs CUDA 12 >= 12.5; current torch wheels are CUDA 13.
    tf_cuda = Version(frameworks["tensorflow"].cuda)
    assert tf_cuda.major == 12 and tf_cuda >= Version("12.5")
    assert Version(frameworks["torch"].cuda).major == 13


def test_tags_carry_framework_cuda_and_python(matrix):
    for spec in matrix.images.values():
        assert spec.framework_version in spec.tag
        assert f"cuda{spec.cuda}" in spec.tag
        assert f"py{spec.python}" in spec.tag


def test_requirement_outside_the_matrix_is_reported(matrix):
    problems = consistency_problems(matrix, "jupyterhub>=7,<8")
    assert any("hub.jupyterhub" in p and "jupyterhub<8,>=7" in p for p in problems)
    assert sum("images." in p for p in problems) == len(matrix.images)


def test_driver_floor_below_the_cuda_major_is_reported(raw):
    raw["images"]["cuda-pytorch"]["driver_floor"] = "575.51.03"
    problems = consistency_problems(parse_matrix(raw), package_jupyterhub_requirement())
    assert problems == [
        "images.cuda-pytorch.driver_floor 575.51.03 is below "
        f"{min_driver_for_cuda('13.2')}, the oldest driver for CUDA 13.2 (the GPU check's table)"
    ]


def test_the_matrix_reads_the_gpu_checks_driver_table():
    """One table of driver floors: what the in-pod check enforces is what the images claim."""
    table = gpucheck.DRIVER_FLOOR_BY_CUDA
    assert min_driver_for_cuda("13.2") == gpucheck.format_version(table["13"]) == "580.65.06"
    assert min_driver_for_cuda("12.9") == gpucheck.format_version(table["12"]) == "525.60.13"
    assert min_driver_for_cuda("11.0") == "450.36.06"
    assert min_driver_for_cuda("9.2") is None
    # the check refuses a driver just below CUDA 13's floor, as the matrix would
    assert gpucheck.parse_version("580.65.05") < gpucheck.driver_floor((13, 2))


def test_the_real_images_driver_floors_are_what_the_gpu_check_enforces(matrix):
    """The check enforces the table by the image's CUDA: a floor above it would not be
    enforced, one below it is a consistency problem."""
    for spec in matrix.images.values():
        assert spec.driver_floor == min_driver_for_cuda(spec.cuda), spec.name


def test_an_image_of_a_cuda_the_gpu_check_does_not_know_is_reported(raw):
    raw["images"]["cuda-pytorch"].update(cuda="14.0", require_cuda="cuda>=14.0")
    problems = consistency_problems(parse_matrix(raw), package_jupyterhub_requirement())
    assert problems == [
        "images.cuda-pytorch.cuda 14.0: the GPU check knows no driver floor for CUDA 14.0"
    ]


def _driver_table_literals() -> set[str]:
    """The driver floors of the GPU check's table, written as versions ("580.65.06")."""
    return {gpucheck.format_version(v) for v in gpucheck.DRIVER_FLOOR_BY_CUDA.values()}


def test_no_second_copy_of_the_driver_table_in_the_sources():
    """Only gpucheck.py holds driver floors: no other module of the package or the sandbox
    writes one as a string (docstrings and error messages that quote one as an example
    excepted: they are text, not a table)."""
    floors = _driver_table_literals()
    check = REPO / "gpuspawner" / "validation" / "gpucheck.py"
    sources = [*(REPO / "gpuspawner").rglob("*.py"), *(REPO / "sandbox").rglob("*.py")]
    found = []
    for path in sources:
        if path == check or "build" in path.relative_to(REPO).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in floors:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_require_cuda_must_match_the_floor(raw):
    raw["images"]["cuda-tensorflow"]["require_cuda"] = "cuda>=12.9"
    problems = consistency_problems(parse_matrix(raw), package_jupyterhub_requirement())
    assert len(problems) == 1 and "should be 'cuda>=12.0'" in problems[0]


def test_single_user_on_another_release_line_than_the_hub_is_reported(raw):
    raw["hub"]["jupyterhub"] = "6.0.1"
    raw["defaults"]["jupyterhub"] = "6.1.1"
    problems = consistency_problems(parse_matrix(raw), "jupyterhub>=6.0,<7")
    assert len(problems) == 2
    assert all("not the hub's release line 6.0" in p for p in problems)


def test_notebook_release_for_another_jupyterlab_is_reported(raw):
    """notebook 7.5.x requires jupyterlab 4.5.x: pip would refuse it beside JupyterLab 4.6."""
    raw["images"]["cuda-tensorflow"]["notebook"] = "7.5.0"
    problems = consistency_problems(parse_matrix(raw), package_jupyterhub_requirement())
    assert problems == [
        "images.cuda-tensorflow.notebook 7.5.0 is not the release for jupyterlab 4.6.6: "
        "Notebook 7.6.x goes with JupyterLab 4.6"
    ]


def test_python_that_the_base_image_lacks_is_reported(raw):
    raw["images"]["cuda-pytorch"]["python"] = "3.12"
    raw["images"]["cuda-pytorch"]["tag_template"] = "{framework_version}-py{python}"
    problems = consistency_problems(parse_matrix(raw), package_jupyterhub_requirement())
    assert problems == ["images.cuda-pytorch.python 3.12: debian:trixie-slim provides Python 3.13"]


def test_constraints_disagreeing_with_the_matrix_are_reported(raw, tmp_path):
    tree = tmp_path / "repo"
    (tree / "images" / "cuda-tensorflow").mkdir(parents=True)
    (tree / "images" / "cuda-pytorch").mkdir(parents=True)
    for name in ("cuda-tensorflow", "cuda-pytorch"):
        (tree / "images" / name / "Dockerfile").write_text("FROM scratch\n")
    for entry in [*raw["z2jh"]["images"].values(), raw["validation"]]:
        (tree / entry["dockerfile"]).parent.mkdir(parents=True)
        (tree / entry["dockerfile"]).write_text("FROM scratch\n")
    for dockerfile in (raw["hub"]["dockerfile"], raw["hub"]["rebuild_dockerfile"]):
        (tree / dockerfile).parent.mkdir(parents=True)
        (tree / dockerfile).write_text("FROM scratch\n")
    (tree / "images" / "cuda-pytorch" / "constraints.txt").write_text(
        (REPO / "images" / "cuda-pytorch" / "constraints.txt").read_text()
    )
    (tree / "images" / "cuda-tensorflow" / "constraints.txt").write_text(
        "tensorflow==2.20.0\nnvidia-cuda-runtime-cu12==12.5.82\n"
    )
    raw["images"]["cuda-tensorflow"]["libraries"] = ["scipy", "Scikit_Learn", "pandas"]
    problems = consistency_problems(parse_matrix(raw), package_jupyterhub_requirement(), tree)
    assert problems == [
        "images/cuda-tensorflow/constraints.txt pins tensorflow==2.20.0, the matrix says 2.21.0",
        "images/cuda-tensorflow/constraints.txt pins CUDA runtime 12.5, the matrix says 12.9",
        "images/cuda-tensorflow/constraints.txt does not pin scipy, Scikit_Learn, pandas "
        "(images.cuda-tensorflow.libraries): resolve them with the framework as its header says",
    ]


def test_every_library_is_pinned_whatever_the_spelling(raw, tmp_path):
    """pip compares names by PEP 503; so does the check (SQLAlchemy pinned, sqlalchemy listed)."""
    spec = parse_matrix(raw).images["cuda-pytorch"]
    pins = read_constraints((REPO / spec.constraints).read_text())
    assert "sqlalchemy" in spec.libraries and "sqlalchemy" in pins
    assert consistency_problems(parse_matrix(raw), package_jupyterhub_requirement(), REPO) == []


@pytest.mark.parametrize("value", ["scipy pandas", ["scipy==1.18.1"], ["scipy", 3]])
def test_libraries_must_be_a_list_of_distribution_names(raw, value):
    raw["images"]["cuda-pytorch"]["libraries"] = value
    with pytest.raises(MatrixError) as err:
        parse_matrix(raw, "m.yaml")
    assert str(err.value) == (
        "m.yaml: images.cuda-pytorch.libraries must be a list of pip distribution names"
    )


def test_constraints_cuda_reads_the_runtime_wheel():
    torch = read_constraints((REPO / "images" / "cuda-pytorch" / "constraints.txt").read_text())
    tf = read_constraints((REPO / "images" / "cuda-tensorflow" / "constraints.txt").read_text())
    assert constraints_cuda(torch) == "13.2"
    assert constraints_cuda(tf) == "12.9"
    assert constraints_cuda({"numpy": "2.0"}) is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["images"]["cuda-pytorch"].pop("cuda"), "images.cuda-pytorch.cuda is missing"),
        (
            lambda d: d["images"]["cuda-pytorch"].update(cuda=13.2),
            "images.cuda-pytorch.cuda must be a quoted string, not the number 13.2",
        ),
        (
            lambda d: d["images"]["cuda-pytorch"].update(cuda="13"),
            "images.cuda-pytorch.cuda = '13': write MAJOR.MINOR",
        ),
        (
            lambda d: d["images"]["cuda-tensorflow"].update(profile="pytorch"),
            "images.cuda-tensorflow.profile 'pytorch' is also used by images.cuda-pytorch",
        ),
        (
            lambda d: d["images"]["cuda-pytorch"].update(profile="PyTorch"),
            "a catalog key is lowercase",
        ),
        (
            lambda d: d["images"]["cuda-pytorch"].update(framework_version="latest"),
            "framework_version = 'latest' is not a version number",
        ),
        (
            lambda d: d["images"]["cuda-pytorch"].update(tag_template="{torch}"),
            "tag_template: unknown field 'torch'",
        ),
        (lambda d: d.pop("hub"), "hub must be a mapping"),
        (lambda d: d.update(images={}), "images must be a non-empty mapping"),
    ],
)
def test_invalid_matrix_gives_a_precise_message(raw, mutate, message):
    data = copy.deepcopy(raw)
    mutate(data)
    with pytest.raises(MatrixError) as err:
        parse_matrix(data, "m.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("m.yaml")


def test_load_matrix_reports_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(MatrixError, match="cannot read the image matrix"):
        load_matrix(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("images: [unclosed\n")
    with pytest.raises(MatrixError, match="is not valid YAML"):
        load_matrix(bad)


def test_find_repo_root_walks_up(tmp_path):
    assert find_repo_root(REPO / "gpuspawner" / "images") == REPO
    assert find_repo_root(tmp_path) is None


def test_select_unknown_image(matrix):
    with pytest.raises(MatrixError, match="cuda-jax is not an image of"):
        matrix.select(["cuda-jax"])
    assert [s.name for s in matrix.select(None)] == list(matrix.images)


def test_hub_jupyterhub_other_than_z2jh_s_pin_is_reported(raw, tmp_path):
    """The hub image keeps z2jh's JupyterHub: the matrix may not name another one."""
    tree = tmp_path / "repo"
    for dockerfile in (raw["hub"]["dockerfile"], raw["hub"]["rebuild_dockerfile"]):
        (tree / dockerfile).parent.mkdir(parents=True)
        (tree / dockerfile).write_text("FROM scratch\n")
    raw["hub"]["requirements"] = "z2jh/requirements.txt"
    (tree / "z2jh").mkdir()
    (tree / "z2jh" / "requirements.txt").write_text(
        "jupyterhub==5.4.0\n    # via -r unfrozen/requirements.txt\n"
    )
    matrix = parse_matrix(raw)
    problems = [
        p
        for p in consistency_problems(matrix, package_jupyterhub_requirement(), tree)
        if p.startswith("hub.")
    ]
    assert problems == [
        f"hub.jupyterhub {matrix.hub.jupyterhub} is not the JupyterHub z2jh's hub "
        "requirements pin (5.4.0), which the hub image keeps"
    ]
    (tree / "z2jh" / "requirements.txt").write_text(f"jupyterhub=={matrix.hub.jupyterhub}\n")
    assert not [
        p
        for p in consistency_problems(matrix, package_jupyterhub_requirement(), tree)
        if p.startswith("hub.")
    ]


def test_the_gpu_check_image_is_read_and_checked(raw):
    check = parse_matrix(raw).validation
    assert (check.name, check.dockerfile, check.tag) == (
        "validation",
        "images/validation/Dockerfile",
        "trixie-py3.13",
    )
    raw["validation"]["python"] = "3.12"
    problems = consistency_problems(parse_matrix(raw), package_jupyterhub_requirement())
    assert problems == ["validation.python 3.12: debian:trixie-slim provides Python 3.13"]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"name": "hub"}, "validation.name 'hub' is also another image's name"),
        ({"tag": "bad tag"}, "validation.tag 'bad tag' is not a valid Docker tag"),
        ({"python": 3.13}, "validation.python must be a quoted string"),
        ({"dockerfile": None}, "validation.dockerfile is missing"),
    ],
)
def test_a_bad_gpu_check_image_entry_says_where(raw, change, said):
    raw["validation"].update(change)
    with pytest.raises(MatrixError, match=said):  # no regex metacharacters but "."
        parse_matrix(raw)


def test_a_matrix_without_a_gpu_check_image_has_none(raw):
    del raw["validation"]
    assert parse_matrix(raw).validation is None
