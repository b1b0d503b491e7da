"""An admin's ``profile_list`` beside the catalog, and catalog images' ``kubespawner_override``.

Pods are built by KubeSpawner's own code (tests.hub.test_spawner's harness); the
form and the REST API are a real JupyterHub's, with its real proxy.
"""

import html
import re
import urllib.parse

import pytest
from traitlets.config import Config

from gpuspawner.hub.compat import SpawnException

from ..conftest import FIXTURES
from .conftest import OFFLINE_KUBECONFIG
from .hubprocess import start_hub
from .test_spawn_page import logged_in, post_form
from .test_spawner import (
    User,
    _isolated,  # noqa: F401  (autouse: offline kubeconfig, fresh hub state)
    build,
    env_of,
    make_spawner,
)

PROFILES = [
    {
        "display_name": "Small <script>alert(1)</script>",
        "slug": "small",
        "description": "Two CPUs",
        "kubespawner_override": {"cpu_limit": 2, "extra_labels": {"size": "small"}},
    },
    {
        "display_name": "One GPU",
        "slug": "one-gpu",
        "kubespawner_override": {
            "image": "example/cuda-lab:1",
            "extra_resource_limits": {"nvidia.com/gpu": "1"},
        },
    },
    {
        "display_name": "Special",
        "slug": "special",
        "kubespawner_override": {"image": "example/special:1"},
        "profile_options": {
            "gpus": {
                "display_name": "GPUs",
                "choices": {
                    "none": {"display_name": "None"},
                    "four": {
                        "display_name": "Four",
                        "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": 4}},
                    },
                    "slices": {
                        "display_name": "Two MIG slices",
                        "kubespawner_override": {
                            "extra_resource_limits": {"nvidia.com/mig-1g.10gb": "2"}
                        },
                    },
                },
            }
        },
    },
]


def with_profiles(profile_list=PROFILES):
    c = Config()
    c.KubeSpawner.profile_list = profile_list
    return c


async def test_a_listed_gpu_profile_gets_the_gpu_check_labels_and_env():
    spawner = make_spawner(with_profiles())
    pod = await build(spawner, {"profile": "one-gpu"})
    notebook = pod["spec"]["containers"][0]
    assert notebook["image"] == "example/cuda-lab:1"
    assert notebook["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert notebook["resources"]["requests"]["nvidia.com/gpu"] == "1"
    env = env_of(notebook)
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin sets it
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    (check,) = pod["spec"]["initContainers"]
    assert check["name"] == "gpu-check"
    assert check["image"] == "example/cuda-lab:1"
    assert check["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    labels = pod["metadata"]["labels"]
    # a100 and h100 both use nvidia.com/gpu: counted by resource name
    assert labels["gpuspawner.io/profile"] == "one-gpu"
    assert labels["gpuspawner.io/gpu-type"] == "nvidia.com-gpu"
    assert labels["gpuspawner.io/gpus"] == "1"
    assert pod["metadata"]["annotations"]["gpuspawner.io/gpu-resource"] == "nvidia.com/gpu"
    # its limit was checked against the user's GPU pods
    assert spawner.listed


async def test_a_listed_mig_profile_is_the_catalogs_mig_type():
    spawner = make_spawner(with_profiles())
    pod = await build(spawner, {"profile": "special", "gpus": "slices"})
    assert pod["spec"]["containers"][0]["image"] == "example/special:1"
    assert pod["metadata"]["labels"]["gpuspawner.io/gpu-type"] == "mig"
    assert pod["metadata"]["annotations"]["gpuspawner.io/gpu-weight"] == "0.142857"
    assert pod["spec"]["initContainers"][0]["resources"]["limits"] == {
        "nvidia.com/mig-1g.10gb": "2"
    }


async def test_a_listed_cpu_profile_works_as_in_kubespawner_and_sees_no_gpu():
    spawner = make_spawner(with_profiles())
    pod = await build(spawner, {"profile": "small"})
    notebook = pod["spec"]["containers"][0]
    assert float(notebook["resources"]["limits"]["cpu"]) == 2
    assert pod["metadata"]["labels"]["size"] == "small"
    assert env_of(notebook)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not pod["spec"].get("initContainers")
    assert pod["metadata"]["labels"]["gpuspawner.io/gpu-type"] == "none"
    assert spawner.listed == []  # a CPU server needs no usage check


async def test_a_listed_gpu_profile_over_the_users_limit_is_refused_with_the_sentence():
    # carol may hold 2 GPUs (pools.yaml's default rule)
    spawner = make_spawner(with_profiles())
    spawner.user_options = {"profile": "special", "gpus": "four"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.jupyterhub_message == (
        "You asked for 4 GPUs but your limit is 2. Ask for 2 or fewer."
    )
    assert info.value.status_code == 403


async def test_a_restart_keeps_nothing_of_the_previous_profiles_overrides():
    spawner = make_spawner(with_profiles())
    await build(spawner, {"profile": "small"})
    pod = await build(spawner, {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"})
    assert "size" not in pod["metadata"]["labels"]
    assert pod["spec"]["containers"][0]["resources"].get("limits", {}).get("cpu") is None
    pod = await build(spawner, {"profile": "one-gpu"})
    # the catalog's node placement of the previous start is gone too
    assert not pod["spec"].get("nodeSelector")


async def test_a_callable_profile_list_is_offered_and_started():
    calls = []

    async def profile_list(spawner):
        calls.append(spawner.user.name)
        # 'pytorch' is a catalog image: left out, with a warning
        return [*PROFILES, {"display_name": "Torch", "slug": "pytorch"}]

    spawner = make_spawner(with_profiles(profile_list))
    offered = await spawner.profile_list(spawner)
    assert [p["slug"] for p in offered] == [
        "pytorch",
        "tensorflow",
        "small",
        "one-gpu",
        "special",
    ]
    pod = await build(spawner, {"profile": "small"})
    assert pod["metadata"]["labels"]["size"] == "small"
    assert calls == ["carol", "carol"]


async def test_an_unknown_profile_names_the_catalogs_and_the_listed_ones():
    spawner = make_spawner(with_profiles())
    answers = []
    for slug in ("jax", "licensed"):  # 'licensed' exists, but not for carol
        spawner.user_options = {"profile": slug}
        with pytest.raises(SpawnException) as info:
            await spawner.load_user_options()
        answers.append((info.value.status_code, info.value.jupyterhub_message.replace(slug, "X")))
    assert (
        answers[0]
        == answers[1]
        == (
            403,
            "There is no profile 'X' you may use: choose one of 'pytorch' (PyTorch), "
            "'tensorflow' (TensorFlow), 'small' (Small <script>alert(1)</script>), "
            "'one-gpu' (One GPU) or 'special' (Special).",
        )
    )


async def test_a_catalog_images_kubespawner_override_reaches_the_pod():
    c = Config()
    c.KubeSpawner.extra_labels = {"site": "lab"}
    c.GPUSpawner.catalog = {
        "images": {
            "lab": {
                "image": "example/lab:1",
                "kubespawner_override": {
                    "cpu_limit": 3,
                    "extra_labels": {"team": "vision"},
                    "environment": {"DATA": "/data"},
                    "node_selector": {"zone": "a"},
                },
            },
            "plain": {"image": "example/plain:1"},
        },
        "gpu_types": {
            "a100": {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
        },
        "limits": {"default": "unlimited"},
    }
    spawner = make_spawner(c, user=User("alice"))
    pod = await build(spawner, {"profile": "lab", "gpu_type": "a100", "gpus": "1"})
    notebook = pod["spec"]["containers"][0]
    assert float(notebook["resources"]["limits"]["cpu"]) == 3
    # dicts are merged into the configured value, as KubeSpawner merges a profile's
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"]["site"] == "lab"
    assert env_of(notebook)["DATA"] == "/data"
    # GPUSpawner's own values go over the override's
    assert pod["spec"]["nodeSelector"] == {
        "zone": "a",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    assert pod["metadata"]["labels"]["gpuspawner.io/gpu-type"] == "a100"
    assert pod["spec"]["initContainers"][0]["name"] == "gpu-check"
    # another image: nothing of the override stays
    pod = await build(spawner, {"profile": "plain", "gpus": "0"})
    assert "team" not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"]["site"] == "lab"
    assert "DATA" not in env_of(pod["spec"]["containers"][0])
    assert pod["spec"]["containers"][0]["resources"].get("limits", {}).get("cpu") is None


async def test_an_override_kubespawner_refuses_is_the_misconfigured_sentence():
    c = Config()
    c.GPUSpawner.catalog = {
        "images": {"lab": {"image": "x", "kubespawner_override": {"cpu_limit": "lots"}}}
    }
    spawner = make_spawner(c)
    spawner.user_options = {"profile": "lab"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.jupyterhub_message.startswith("The GPU catalog is misconfigured")


async def test_an_unknown_override_trait_is_a_catalog_error_at_spawn():
    c = Config()
    c.GPUSpawner.catalog = {
        "images": {"lab": {"image": "x", "kubespawner_override": {"validation_enabled": False}}}
    }
    spawner = make_spawner(c)
    spawner.user_options = {"profile": "lab"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.jupyterhub_message.startswith("The GPU catalog is misconfigured")


# ---------------------------------------------------------------------------
# a real hub
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profiles_hub(tmp_path_factory):
    """A real hub with the pools catalog and a profile_list beside it, against an unreachable API."""
    hub = start_hub(
        tmp_path_factory.mktemp("hub"),
        extra_config=f"""
c.GPUSpawner.catalog_file = {str(FIXTURES / "catalogs" / "pools.yaml")!r}
c.GPUSpawner.form_usage_timeout = 0.5
c.KubeSpawner.profile_list = {PROFILES!r}
from gpuspawner import check_catalog
check_catalog(c)
""",
        env={"KUBECONFIG": OFFLINE_KUBECONFIG},
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


@pytest.mark.hub
def test_the_hub_says_at_start_that_the_profile_list_is_offered(profiles_hub):
    assert "gpuspawner: 3 profiles from profile_list are offered after the catalog's." in (
        profiles_hub.log()
    )


@pytest.mark.hub
def test_the_form_offers_the_catalogs_profiles_then_the_listed_ones_escaped(profiles_hub):
    session = logged_in(profiles_hub, "petra")
    with session.open(f"{profiles_hub.public_url}/hub/spawn", timeout=60) as response:
        form = response.read().decode()
    slugs = re.findall(r'name="profile"[^>]*value="([^"]+)"', form) or re.findall(
        r'value="([^"]+)"[^>]*name="profile"', form
    )
    assert slugs == ["pytorch", "tensorflow", "small", "one-gpu", "special"], slugs
    assert "<script>alert(1)</script>" not in form
    assert "Small &lt;script&gt;alert(1)&lt;/script&gt;" in form
    assert 'name="profile-option-special--gpus"' in form
    # the listed profile's choice goes through the form as KubeSpawner's options
    action = html.unescape(re.search(r'id="spawn_form"\s+action="([^"]+)"', form).group(1))
    status, page = post_form(
        session,
        urllib.parse.urljoin(f"{profiles_hub.public_url}/hub/spawn", action),
        {"profile": "special", "profile-option-special--gpus": "four"},
    )
    assert status == 403, page[-2000:]
    assert "You asked for 4 GPUs but your limit is 2. Ask for 2 or fewer." in html.unescape(page)
    assert profiles_hub.api("GET", "/users/petra").json()["servers"] == {}


@pytest.mark.hub
def test_a_rest_spawn_of_a_listed_gpu_profile_is_refused_over_the_limit(profiles_hub):
    assert profiles_hub.api("POST", "/users/bob").status in (201, 409)
    r = profiles_hub.api("POST", "/users/bob/server", {"profile": "one-gpu"})
    assert r.status == 403, r.body
    assert r.json()["message"].startswith("Your GPU limit is 0 (user rule 'bob')")
    assert profiles_hub.api("POST", "/users/carol").status in (201, 409)
    r = profiles_hub.api("POST", "/users/carol/servers/big", {"profile": "special", "gpus": "four"})
    assert r.status == 403, r.body
    assert r.json()["message"] == "You asked for 4 GPUs but your limit is 2. Ask for 2 or fewer."
    assert profiles_hub.api("GET", "/users/carol").json()["servers"] == {}
