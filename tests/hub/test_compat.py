"""The JupyterHub lines gpuspawner supports, and the one place that tells them apart."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from gpuspawner.core.options import Refusal
from gpuspawner.hub.compat import HTTPSpawnException, SpawnException, request_options
from gpuspawner.hub.spawner import RefusedSpawn, spawn_error
from gpuspawner.images.matrix import load_matrix, read_constraints

from ..conftest import REPO

LINES = {"5.5": REPO / ".ci" / "jupyterhub-5.5.txt", "6.1": REPO / ".ci" / "jupyterhub-6.1.txt"}


def line_pins(line: str) -> dict[str, str]:
    return read_constraints(LINES[line].read_text())


def package_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {r.name: r for r in reqs}


def test_this_run_uses_one_of_the_tested_lines_exactly():
    installed = {
        "jupyterhub": version("jupyterhub"),
        "jupyterhub-kubespawner": version("jupyterhub-kubespawner"),
    }
    assert installed in [line_pins(line) for line in LINES], installed


@pytest.mark.parametrize("line", sorted(LINES))
def test_each_tested_line_satisfies_the_package_requirements(line):
    requirements = package_requirements()
    for name, pinned in line_pins(line).items():
        assert Version(pinned) in requirements[name].specifier, (line, name, pinned)


def test_the_oldest_line_is_the_hub_image_s_and_z2jh_s():
    pins = line_pins("5.5")
    matrix = load_matrix(REPO / "images" / "matrix.yaml")
    assert pins["jupyterhub"] == matrix.hub.jupyterhub
    z2jh = REPO / matrix.hub.requirements
    if not z2jh.is_file():
        pytest.skip(f"z2jh's hub requirements are not beside this checkout ({z2jh})")
    z2jh_pins = read_constraints(z2jh.read_text())
    assert {name: z2jh_pins[name] for name in pins} == pins


def test_the_oldest_allowed_release_is_the_one_tested():
    """The package allows nothing older than what `make test` runs against."""
    requirements = package_requirements()
    for name, pinned in line_pins("5.5").items():
        floor = next(s.version for s in requirements[name].specifier if s.operator == ">=")
        assert Version(floor).release[:2] == Version(pinned).release[:2], (name, floor)


def test_spawn_exception_is_jupyterhub_s_own_where_it_has_one():
    try:
        from jupyterhub.spawner import SpawnException as hubs
    except ImportError:  # JupyterHub 5.5: the stand-in
        assert SpawnException is HTTPSpawnException
    else:
        assert SpawnException is hubs
    assert issubclass(RefusedSpawn, (SpawnException, ValueError))


@pytest.mark.parametrize("cls", [HTTPSpawnException, SpawnException])
def test_a_spawn_error_carries_the_sentence_and_keeps_the_detail_for_the_log(cls):
    error = spawn_error(
        "You may use 100% of 2 GPUs.",
        reason="limit",
        status=403,
        log_message="rule 'bob' in /etc/catalog.yaml",
        error_class=cls,
    )
    assert (error.status_code, error.reason) == (403, "limit")
    assert error.jupyterhub_message == "You may use 100% of 2 GPUs."
    assert str(error) == f"403 {cls.__name__}(reason=limit): rule 'bob' in /etc/catalog.yaml"


def test_the_stand_in_answers_jupyterhub_5_5_s_rest_api_with_the_sentence():
    """JupyterHub 5.5's API error body is ``log_message % args``; a "%" must survive it."""
    error = HTTPSpawnException("Use 100%d less.", reason="limit", log_message="detail")
    assert error.log_message % error.args == "Use 100%d less."
    assert error.get_message() == "Use 100%d less."
    assert "detail" not in error.log_message % error.args


@pytest.mark.parametrize(
    "body, options",
    [
        ({"user_options": {"profile": "pytorch"}}, {"profile": "pytorch"}),
        ({"user_options": {"profile": "pytorch"}, "display_name": "big"}, {"profile": "pytorch"}),
        ({"user_options": None}, {}),
        ({"display_name": "big"}, {}),
        ({"profile": "pytorch", "gpus": "2"}, {"profile": "pytorch", "gpus": "2"}),
        ({}, {}),
    ],
)
def test_request_options_read_a_rest_body_as_jupyterhub_6_does(body, options):
    assert request_options(body, hub_reads_key=False) == options
    # JupyterHub 6 has unwrapped the body already: what arrives is the options
    assert request_options(body, hub_reads_key=True) is body


def test_request_options_that_are_not_an_object_are_one_sentence():
    with pytest.raises(Refusal) as info:
        request_options({"user_options": ["pytorch"]}, hub_reads_key=False)
    assert (info.value.status, info.value.message) == (
        400,
        "'user_options' must be an object (or null) of server options.",
    )
