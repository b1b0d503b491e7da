"""The JupyterHub lines gpuspawner supports, and the one place that tells them apart."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from gpuspawner.core.refusals import Refusal
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


# ---------------------------------------------------------------------------
# KubeSpawner's private names: the one still used, and that no other creeps in
# ---------------------------------------------------------------------------

KUBESPAWNER = f"KubeSpawner {version('jupyterhub-kubespawner')}"


def kubespawner_private_names() -> set[str]:
    """The private names KubeSpawner's class defines itself (not traitlets' own bookkeeping)."""
    from kubespawner import KubeSpawner
    from traitlets import HasTraits

    class Probe(HasTraits):
        pass

    return {
        name
        for name in vars(KubeSpawner)
        if name.startswith("_") and not name.startswith("__") and name not in vars(Probe)
    }


#: KubeSpawner's private names gpuspawner uses, each only in gpuspawner/hub/compat.py.
PRIVATE_NAMES_USED = {"_get_initialized_profile_list"}

#: A private attribute of a spawner: ``self._x``, ``super()._x``, ``spawner._x``, ``cls._x``.
SPAWNER_ATTRIBUTE = re.compile(r"\b(?:self|super\(\)|spawner|[A-Za-z]*Spawner)\.(_[A-Za-z]\w*)\b")


async def test_kubespawner_still_initializes_a_profile_list_as_gpuspawner_reads_it(
    offline_kubeconfig,
):
    """compat.initialized_profile_list: KubeSpawner's private ``_get_initialized_profile_list``."""
    import inspect

    from kubespawner import KubeSpawner

    from gpuspawner.hub.compat import initialized_profile_list

    from .test_spawner import make_spawner

    name = f"{KUBESPAWNER}: KubeSpawner._get_initialized_profile_list"
    method = getattr(KubeSpawner, "_get_initialized_profile_list", None)
    assert callable(method), (
        f"{name} is gone: gpuspawner.hub.compat.initialized_profile_list needs another way "
        "to fill in a profile list as KubeSpawner reads it"
    )
    params = list(inspect.signature(method).parameters)
    assert params == ["self", "profile_list"], (
        f"{name} now takes {params}, not (self, profile_list)"
    )
    given = [
        {
            "display_name": "Big GPU box",
            "profile_options": {
                "gpus": {
                    "display_name": "GPUs",
                    "choices": {"1": {"display_name": "1"}, "2": {"display_name": "2"}},
                }
            },
        },
        {"display_name": "Small", "slug": "small"},
    ]
    spawner = make_spawner(cls=KubeSpawner)
    result = initialized_profile_list(spawner, given)
    option = result[0]["profile_options"]["gpus"]
    found = {
        "a copy": result is not given and "slug" not in given[0],
        "slug from display_name": result[0].get("slug") == "big-gpu-box",
        "given slug kept": result[1].get("slug") == "small",
        "first profile the default": result[0].get("default") is True,
        "first choice the default": option["choices"]["1"].get("default") is True,
        "unlisted_choice filled in": option.get("unlisted_choice") == {"enabled": False},
        "empty list stays empty": initialized_profile_list(spawner, []) == [],
    }
    assert all(found.values()), f"{name} no longer gives: " + ", ".join(
        what for what, ok in found.items() if not ok
    )


@pytest.mark.parametrize(
    "username, common_labels",
    [
        ("carol", {}),
        ("Élodie.Dupont@example.org", {}),
        ("UPPER_case-", {}),
        ("x" * 80, {}),
        ("carol", {"hub.jupyter.org/username": "team-a"}),
    ],
)
async def test_the_username_label_gpuspawner_selects_is_the_one_kubespawner_puts_on_pods(
    offline_kubeconfig, username, common_labels
):
    """compat.user_label: KubeSpawner's rule (its private ``_build_common_labels``), on a real pod."""
    from kubespawner import KubeSpawner
    from traitlets.config import Config

    from gpuspawner.core.labels import KUBESPAWNER_LABEL_USER
    from gpuspawner.hub.compat import user_label

    from .test_spawner import User, make_spawner

    c = Config()
    c.KubeSpawner.common_labels = common_labels
    spawner = make_spawner(c, user=User(username), cls=KubeSpawner)
    pod = await spawner.get_pod_manifest()
    on_the_pod = pod.metadata.labels.get(KUBESPAWNER_LABEL_USER)
    assert user_label(spawner) == on_the_pod, (
        f"{KUBESPAWNER} labels {username!r}'s pods {KUBESPAWNER_LABEL_USER}={on_the_pod!r}, "
        f"but gpuspawner.hub.compat.user_label says {user_label(spawner)!r}: GPUSpawner "
        "would not find the user's pods when it counts their GPUs"
    )


def test_gpuspawner_overrides_no_kubespawner_private_name():
    """KubeSpawner would call an override of a private name only while that name lasts."""
    from kubespawner import KubeSpawner

    from gpuspawner.hub.spawner import GPUSpawner

    private = kubespawner_private_names()
    ours = GPUSpawner.__mro__[: GPUSpawner.__mro__.index(KubeSpawner)]
    overridden = sorted(
        f"{cls.__name__}.{name}" for cls in ours for name in vars(cls) if name in private
    )
    assert not overridden, (
        f"{KUBESPAWNER}'s private names are overridden: {', '.join(overridden)}; "
        "use a public hook (docs/development.md, Compatibility)"
    )


def test_kubespawner_private_names_are_used_only_in_compat():
    """Each private name gpuspawner still needs is called in gpuspawner/hub/compat.py alone."""
    private = kubespawner_private_names()
    missing = sorted(PRIVATE_NAMES_USED - private)
    assert not missing, (
        f"{KUBESPAWNER} no longer defines {', '.join(missing)}, which "
        "gpuspawner/hub/compat.py calls"
    )
    package = REPO / "gpuspawner"
    used = {}
    for path in sorted(package.rglob("*.py")):
        if path == package / "hub" / "compat.py":
            continue
        for name in set(SPAWNER_ATTRIBUTE.findall(path.read_text())) & private:
            used.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert not used, f"{KUBESPAWNER} private names used outside gpuspawner/hub/compat.py: {used}"
    compat = (package / "hub" / "compat.py").read_text()
    in_compat = set(SPAWNER_ATTRIBUTE.findall(compat)) & private
    assert in_compat == PRIVATE_NAMES_USED, in_compat


def test_the_public_hooks_gpuspawner_builds_on_are_there():
    """start, load_user_options, get_pod_manifest, get_options_form, modify_pod_hook, options_form."""
    import inspect

    from jupyterhub.spawner import Spawner
    from kubespawner import KubeSpawner

    takes_self = {
        "start": KubeSpawner.start,
        "load_user_options": KubeSpawner.load_user_options,
        "get_pod_manifest": KubeSpawner.get_pod_manifest,
        "get_options_form": Spawner.get_options_form,
    }
    for name, method in takes_self.items():
        params = list(inspect.signature(method).parameters)
        assert params == ["self"], f"{KUBESPAWNER}: {name} now takes {params}"
    assert inspect.iscoroutinefunction(Spawner.get_options_form), "get_options_form is not async"
    traits = KubeSpawner.class_traits()
    for name in ("modify_pod_hook", "options_form", "profile_list", "pre_spawn_hook"):
        assert name in traits, f"{KUBESPAWNER} has no {name} trait"


def test_jupyterhub_still_marks_the_servers_it_checks_as_it_starts():
    """compat.hub_checks_at_start: ``init_spawners`` sets the spawner's ``_check_pending``
    before it polls the servers of its database and clears it after (GPUSpawner's poll then
    lets a server queued in Kueue keep its place)."""
    import inspect

    from jupyterhub.app import JupyterHub
    from jupyterhub.spawner import Spawner

    from gpuspawner.hub.compat import hub_checks_at_start

    name = f"JupyterHub {version('jupyterhub')}: JupyterHub.init_spawners"
    source = inspect.getsource(JupyterHub.init_spawners)
    marked = source.find("spawner._check_pending = True")
    assert marked >= 0, (
        f"{name} no longer sets spawner._check_pending: gpuspawner.hub.compat."
        "hub_checks_at_start needs another sign that the hub checks a server as it starts"
    )
    assert marked < source.find("check_spawner(user", marked), (
        f"{name} sets _check_pending only after it starts checking the server"
    )
    check = source[source.find("async def check_spawner") :]
    polled, cleared = check.find("spawner.poll()"), check.find("spawner._check_pending = False")
    assert 0 <= polled < cleared, f"{name}: _check_pending no longer holds while it polls"
    assert Spawner._check_pending is False
    spawner = Spawner()
    assert not hub_checks_at_start(spawner)
    spawner._check_pending = True
    assert hub_checks_at_start(spawner)
    assert spawner.pending == "check"
