"""An admin's own KubeSpawner/JupyterHub hooks keep working beside GPUSpawner's.

GPUSpawner extends KubeSpawner through its public hooks; where an admin can set
the same hook (``modify_pod_hook``, ``pre_spawn_hook``, a callable
``profile_list``, ``options_form``), both run, or the admin's wins as it did
with KubeSpawner. Each test here fails if that composition is dropped.
"""

import asyncio
import inspect

from traitlets.config import Config

from gpuspawner.core import stopreasons
from gpuspawner.hub.spawner import GPUSpawner

from .test_spawner import User, _isolated, as_dict, env_of, make_spawner  # noqa: F401 (the fixture)

AT = 1_800_000_000.0


def cpu_pod_hook(calls):
    """An admin's hook that gives every container the node's GPUs (and labels the pod)."""

    def hook(spawner, pod):
        calls.append(spawner.user.name)
        pod.metadata.labels = {**(pod.metadata.labels or {}), "team": "ml"}
        pod.spec.containers[0].env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
        return pod

    return hook


async def created_pod(spawner, options):
    """The pod as KubeSpawner's start() creates it: the manifest, then modify_pod_hook."""
    spawner.user_options = options
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    result = spawner.modify_pod_hook(spawner, pod)
    if inspect.isawaitable(result):
        result = await result
    return as_dict(spawner, result)


async def test_the_admins_modify_pod_hook_runs_and_cannot_give_a_cpu_pod_gpus():
    calls = []
    hook = cpu_pod_hook(calls)
    c = Config()
    c.KubeSpawner.modify_pod_hook = hook
    spawner = make_spawner(c)
    assert spawner.modify_pod_hook.__wrapped__ is hook
    pod = await created_pod(spawner, {"profile": "pytorch", "gpus": "0"})
    assert calls == ["carol"]  # the admin's hook ran, once
    assert pod["metadata"]["labels"]["team"] == "ml"  # and what it did is kept
    assert env_of(pod["spec"]["containers"][0])["NVIDIA_VISIBLE_DEVICES"] == "void"


async def test_an_async_modify_pod_hook_is_awaited_and_then_checked():
    calls = []

    async def hook(spawner, pod):
        await asyncio.sleep(0)
        return cpu_pod_hook(calls)(spawner, pod)

    spawner = make_spawner()
    spawner.modify_pod_hook = hook  # set after the config, as a profile's override would
    assert inspect.iscoroutinefunction(spawner.modify_pod_hook.__wrapped__)
    pod = await created_pod(spawner, {"profile": "pytorch", "gpus": "0"})
    assert calls == ["carol"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert env_of(pod["spec"]["containers"][0])["NVIDIA_VISIBLE_DEVICES"] == "void"


async def test_a_gpu_pod_keeps_the_device_plugins_devices_after_the_admins_hook():
    spawner = make_spawner(user=User("zed"))
    spawner.modify_pod_hook = cpu_pod_hook([])
    pod = await created_pod(spawner, {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"})
    notebook = pod["spec"]["containers"][0]
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(notebook)  # the device plugin sets it
    assert notebook["resources"]["limits"]["nvidia.com/gpu"] == "1"


async def test_composing_twice_or_no_hook_changes_nothing():
    spawner = make_spawner()
    assert spawner.modify_pod_hook is None
    spawner.modify_pod_hook = cpu_pod_hook([])
    composed = spawner.modify_pod_hook
    spawner.modify_pod_hook = composed
    assert spawner.modify_pod_hook is composed


async def test_the_admins_pre_spawn_hook_still_runs():
    calls = []

    def hook(spawner):
        calls.append((spawner.user.name, spawner.name))

    c = Config()
    c.Spawner.pre_spawn_hook = hook
    spawner = make_spawner(c, name="exp")
    assert spawner.pre_spawn_hook is hook
    result = spawner.run_pre_spawn_hook()  # what JupyterHub calls before start()
    if inspect.isawaitable(result):
        await result
    assert calls == [("carol", "exp")]


PROFILES = [
    {"display_name": "Small", "slug": "small", "kubespawner_override": {"cpu_limit": 1}},
    {
        "display_name": "Big",
        "slug": "big",
        "kubespawner_override": {"cpu_limit": 8, "image": lambda spawner: "example/big:1"},
    },
]


async def test_the_admins_callable_profile_list_is_called_once_and_applied():
    calls = []

    async def profiles(spawner):
        calls.append(spawner.user.name)
        await asyncio.sleep(0)
        return [dict(p) for p in PROFILES]

    c = Config()
    c.KubeSpawner.profile_list = profiles
    spawner = make_spawner(c, catalog=False)
    spawner.user_options = {"profile": "big"}
    await spawner.load_user_options()
    assert (spawner.cpu_limit, spawner.image) == (8, "example/big:1")
    assert calls == ["carol"]  # KubeSpawner did not call it a second time
    assert spawner.profile_list is profiles  # still the admin's, for the next form and start
    form = await spawner.get_options_form()
    assert 'value="big"' in form and calls == ["carol", "carol"]


async def test_a_plain_profile_list_form_gets_the_stop_notice_each_time():
    c = Config()
    c.KubeSpawner.profile_list = PROFILES
    spawner = make_spawner(c, catalog=False)
    assert "gpuspawner-stopped" not in await spawner.get_options_form()
    spawner.load_state({stopreasons.STATE_KEY: {"reason": "admin", "at": AT}})
    form = await spawner.get_options_form()
    assert "an admin stopped it from the GPU page" in form and 'value="big"' in form
    # no profile_list, no form: JupyterHub spawns at once, and no notice makes one
    assert await make_spawner(Config(), catalog=False).get_options_form() == ""


async def test_the_catalog_form_is_ours_unless_the_admin_set_options_form():
    spawner = make_spawner()
    assert spawner.options_form == spawner._catalog_options_form
    assert "profile-option-pytorch--gpus" in await spawner.get_options_form()

    c = Config()
    c.Spawner.options_form = "<p>the admin's own form</p>"
    own = make_spawner(c)
    own.load_state({stopreasons.STATE_KEY: {"reason": "admin", "at": AT}})
    assert await own.get_options_form() == "<p>the admin's own form</p>"
    # the catalog still decides what a request starts
    assert own.profile_list == own._catalog_profile_list


async def test_an_admins_callable_options_form_is_called_as_jupyterhub_calls_it():
    async def form(spawner):
        return f"<p>form for {spawner.user.name}</p>"

    for catalog in (True, False):
        c = Config()
        c.Spawner.options_form = form
        spawner = make_spawner(c, catalog=catalog)
        assert isinstance(spawner, GPUSpawner)
        assert await spawner.get_options_form() == "<p>form for carol</p>"
