"""GPUSpawner against KubeSpawner's real pod building, without a cluster.

The Kubernetes API is replaced only where these tests read pods (a recorder
that returns a PodList); pods are built by KubeSpawner's own code.
"""

import asyncio
import json
import socket

import pytest
from kubespawner import KubeSpawner
from traitlets.config import Config

from gpuspawner.hub import state as hubstate
from gpuspawner.hub.compat import SpawnException
from gpuspawner.hub.spawner import GPUCheckFailed, GPUSpawner

from ..conftest import FIXTURES, REPO
from ..kubeapi import StandInApi, core_api_for


class Group:
    def __init__(self, name):
        self.name = name


class User:
    def __init__(self, name="carol", groups=()):
        self.name = name
        self.id = 7
        self.url = f"/user/{name}/"
        self.groups = [Group(g) for g in groups]


class OrmSpawner:
    """The ORM record JupyterHub gives a spawner; tests need its server name only."""

    def __init__(self, name):
        self.name = name
        self.display_name = ""
        self.server = None
        self.state = {}
        self.user_options = {}


class FakeListResponse:
    """What kubernetes_asyncio returns with _preload_content=False: status and raw body."""

    def __init__(self, items, status=200, body=None):
        self.status = status
        self._body = body or json.dumps({"kind": "PodList", "items": items}).encode()

    async def read(self):
        return self._body


@pytest.fixture(autouse=True)
def _isolated(offline_kubeconfig):
    hubstate.reset()
    yield
    hubstate.reset()


def make_spawner(config=None, user=None, name="", pods=(), cls=GPUSpawner, catalog=True):
    c = config or Config()
    if (
        catalog
        and cls is GPUSpawner
        and "catalog" not in c.GPUSpawner
        and "catalog_file" not in c.GPUSpawner
    ):
        c.GPUSpawner.catalog_file = str(FIXTURES / "catalogs" / "pools.yaml")
    spawner = cls(_mock=True, config=c, user=user or User(), orm_spawner=OrmSpawner(name))
    spawner.listed = []

    async def list_pods(namespace, **kwargs):
        selector = kwargs.get("label_selector") or ""
        spawner.listed.append((namespace, selector))
        return FakeListResponse([p for p in pods if matches(p, selector)])

    spawner.api.list_namespaced_pod = list_pods
    return spawner


def matches(pod, selector):
    """Equality-based label selectors, as the API server applies them."""
    pod_labels = pod["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if pod_labels.get(key) != value:
            return False
    return True


def as_dict(spawner, pod):
    return spawner.api.api_client.sanitize_for_serialization(pod)


async def build(spawner, options):
    spawner.user_options = options
    await spawner.load_user_options()
    return as_dict(spawner, await spawner.get_pod_manifest())


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def pods_fixture():
    return json.loads((FIXTURES / "gpu-pods" / "podlist.json").read_text())["items"]


async def test_gpu_pod_gets_resources_placement_env_labels_and_check():
    spawner = make_spawner()
    pod = await build(spawner, {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"})
    notebook = pod["spec"]["containers"][0]
    assert notebook["image"] == "example/pytorch:2.9"
    assert notebook["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert notebook["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    env = env_of(notebook)
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin sets it
    labels = pod["metadata"]["labels"]
    assert labels["gpuspawner.io/profile"] == "pytorch"
    assert labels["gpuspawner.io/gpu-type"] == "a100"
    assert labels["gpuspawner.io/gpus"] == "2"
    assert labels["gpuspawner.io/managed"] == "true"
    assert pod["metadata"]["annotations"]["gpuspawner.io/gpu-resource"] == "nvidia.com/gpu"
    assert pod["metadata"]["annotations"]["hub.jupyter.org/username"] == "carol"
    (check,) = pod["spec"]["initContainers"]
    assert check["name"] == "gpu-check"
    assert check["image"] == "example/pytorch:2.9"
    assert check["resources"] == {
        "limits": {"nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2"},
    }
    assert check["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert check["command"][:2] == ["python3", "-c"]
    assert "--expect" in check["command"] and "2" in check["command"]
    assert "13.0" in check["command"]  # the image's CUDA version reaches the driver check
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    # the usage check read this user's GPU pods from the API server
    assert spawner.listed == [
        (spawner.namespace, "gpuspawner.io/managed=true,hub.jupyter.org/username=carol")
    ]


async def test_mig_type_requests_its_own_resource():
    spawner = make_spawner()
    pod = await build(spawner, {"profile": "pytorch", "gpu_type": "mig", "gpus": "2"})
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": "2"}
    assert pod["metadata"]["annotations"]["gpuspawner.io/gpu-weight"] == "0.142857"
    command = pod["spec"]["initContainers"][0]["command"]
    assert "nvidia.com/mig-1g.10gb" in command


async def test_cpu_only_pod_cannot_see_gpus_whatever_the_config_says():
    c = Config()
    c.KubeSpawner.environment = {"NVIDIA_VISIBLE_DEVICES": "all", "KEEP": "me"}
    c.KubeSpawner.init_containers = [
        {
            "name": "block-cloud-metadata",
            "image": "quay.io/jupyterhub/k8s-network-tools:4.2.0",
            "command": ["iptables", "-A", "OUTPUT", "-d", "169.254.169.254", "-j", "DROP"],
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        }
    ]
    c.KubeSpawner.extra_containers = [{"name": "sidecar", "image": "busybox"}]
    c.KubeSpawner.extra_resource_limits = {
        "nvidia.com/gpu": "1"
    }  # a leftover hand-written GPU limit
    spawner = make_spawner(c)
    pod = await build(spawner, {"profile": "pytorch", "gpus": "0", "NVIDIA_VISIBLE_DEVICES": "all"})
    containers = pod["spec"]["containers"] + pod["spec"]["initContainers"]
    assert {c["name"] for c in containers} == {"notebook", "sidecar", "block-cloud-metadata"}
    for container in containers:
        assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == "void", container["name"]
        assert "nvidia.com/gpu" not in (container.get("resources") or {}).get("limits", {})
    assert env_of(pod["spec"]["containers"][0])["KEEP"] == "me"
    assert "nodeSelector" not in pod["spec"] or not pod["spec"]["nodeSelector"]
    assert pod["metadata"]["labels"]["gpuspawner.io/gpu-type"] == "none"
    assert pod["metadata"]["labels"]["gpuspawner.io/gpus"] == "0"
    # CPU-only requests never need the usage check
    assert spawner.listed == []


async def test_modify_pod_hook_cannot_give_a_cpu_pod_gpus():
    def hook(spawner, pod):
        pod.spec.containers[0].env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
        return pod

    c = Config()
    c.KubeSpawner.modify_pod_hook = hook
    spawner = make_spawner(c)
    spawner.user_options = {"profile": "pytorch", "gpus": "0"}
    await spawner.load_user_options()
    # what KubeSpawner's start does with the manifest before it creates the pod
    pod = await spawner.get_pod_manifest()
    pod = spawner.modify_pod_hook(spawner, pod)
    env = env_of(as_dict(spawner, pod)["spec"]["containers"][0])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


async def test_admin_settings_are_merged_not_clobbered():
    c = Config()
    c.KubeSpawner.extra_resource_limits = {"example.com/fpga": "1"}
    c.KubeSpawner.node_selector = {"topology.kubernetes.io/zone": "zone-a"}
    c.KubeSpawner.tolerations = [
        {"key": "dedicated", "operator": "Equal", "value": "jupyter", "effect": "NoSchedule"}
    ]
    c.KubeSpawner.node_affinity_required = [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
    ]
    c.KubeSpawner.init_containers = [
        {"name": "block-cloud-metadata", "image": "quay.io/jupyterhub/k8s-network-tools:4.2.0"}
    ]
    c.KubeSpawner.environment = {"TEAM": "ml"}
    c.GPUSpawner.catalog = {
        "images": {
            "pytorch": {
                "image": "example/pytorch:2.9",
                "cuda": "13.0",
                "env": {"HF_HOME": "/data/hf"},
            }
        },
        "gpu_types": {
            "t4": {
                "display_name": "T4",
                "node_affinity": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}
                ],
            }
        },
    }
    spawner = make_spawner(c)
    pod = await build(spawner, {"profile": "pytorch", "gpu_type": "t4", "gpus": "1"})
    spec = pod["spec"]
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits == {"example.com/fpga": "1", "nvidia.com/gpu": "1"}
    assert spec["nodeSelector"] == {"topology.kubernetes.io/zone": "zone-a"}
    assert spec["tolerations"][0]["key"] == "dedicated"
    assert spec["tolerations"][1]["key"] == "nvidia.com/gpu"
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [e["key"] for e in term["matchExpressions"]] == [
        "kubernetes.io/arch",
        "nvidia.com/gpu.product",
    ]
    assert [ic["name"] for ic in spec["initContainers"]] == ["block-cloud-metadata", "gpu-check"]
    env = env_of(spec["containers"][0])
    assert env["TEAM"] == "ml" and env["HF_HOME"] == "/data/hf"


async def test_a_new_selection_does_not_inherit_the_previous_one():
    spawner = make_spawner()
    await build(spawner, {"profile": "pytorch", "gpu_type": "h100", "gpus": "2"})
    spawner.hub_state.release(spawner.user.name, spawner.name)  # as the end of the first spawn does
    pod = await build(spawner, {"profile": "pytorch", "gpus": "0"})
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"].get("limits", {})
    assert not pod["spec"].get("initContainers")
    assert not pod["spec"].get("nodeSelector")
    assert [t["key"] for t in pod["spec"].get("tolerations") or []] == []


async def test_without_a_catalog_the_pod_is_exactly_kubespawners():
    def configure():
        c = Config()
        c.KubeSpawner.image = "quay.io/jupyter/pytorch-notebook:cuda12-2025-01-06"
        c.KubeSpawner.extra_resource_limits = {"nvidia.com/gpu": "1"}
        c.KubeSpawner.cpu_guarantee = 1.5
        c.KubeSpawner.mem_limit = "4G"
        c.KubeSpawner.environment = {"A": "b"}
        c.KubeSpawner.tolerations = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        c.KubeSpawner.init_containers = [{"name": "init", "image": "busybox", "command": ["true"]}]
        c.KubeSpawner.profile_list = [
            {"display_name": "Small", "slug": "small", "kubespawner_override": {"cpu_limit": 2}},
            {
                "display_name": "GPU",
                "slug": "gpu",
                "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "2"}},
            },
        ]
        return c

    gpu = make_spawner(configure(), cls=GPUSpawner, catalog=False)
    kube = make_spawner(configure(), cls=KubeSpawner)
    for spawner in (gpu, kube):
        spawner.user_options = {"profile": "gpu"}
        await spawner.load_user_options()
    gpu_pod = as_dict(gpu, await gpu.get_pod_manifest())
    kube_pod = as_dict(kube, await kube.get_pod_manifest())
    assert gpu_pod == kube_pod
    assert gpu_pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


async def test_async_override_callables_are_awaited():
    async def pick_image(spawner):
        await asyncio.sleep(0)
        return f"example/notebook:{spawner.user.name}"

    calls = []

    def sync_override(spawner):
        calls.append(spawner.user.name)
        return 3

    c = Config()
    c.KubeSpawner.profile_list = [
        {
            "display_name": "Dynamic",
            "slug": "dynamic",
            "kubespawner_override": {"image": pick_image, "cpu_limit": sync_override},
        }
    ]
    spawner = make_spawner(c, catalog=False)
    spawner.user_options = {"profile": "dynamic"}
    await spawner.load_user_options()
    assert spawner.image == "example/notebook:carol"
    assert spawner.cpu_limit == 3
    assert calls == ["carol"]  # called exactly once


async def test_unknown_profile_option_choice_is_a_400_not_a_keyerror():
    c = Config()
    c.KubeSpawner.profile_list = [
        {
            "display_name": "Choose",
            "slug": "choose",
            "profile_options": {
                "image": {
                    "display_name": "Image",
                    "choices": {"a": {"display_name": "A"}, "b": {"display_name": "B"}},
                }
            },
        }
    ]
    spawner = make_spawner(c, catalog=False)
    spawner.user_options = {"profile": "choose", "image": "zzz"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 400
    assert (
        info.value.jupyterhub_message == "'zzz' is not a choice for Image: choose one of 'a', 'b'."
    )
    spawner.user_options = {"profile": "nope\n"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 400
    assert info.value.jupyterhub_message == (
        "There is no profile 'nope\\n' you may use: choose one of 'choose'."
    )


PLAIN_PROFILES = [
    {
        "display_name": "Choose",
        "slug": "choose",
        "profile_options": {
            "image": {
                "display_name": "Image",
                "choices": {
                    "a": {"display_name": "A", "kubespawner_override": {"image": "example/a"}},
                },
            },
            "tag": {
                "display_name": "Tag",
                "choices": {"v1": {"display_name": "v1"}},
                "unlisted_choice": {
                    "enabled": True,
                    "validation_regex": "^[a-z0-9.]+$",
                    "kubespawner_override": {"image": "example/b:{value}"},
                },
            },
        },
    }
]


async def test_plain_profile_unlisted_choice_is_refused_unless_enabled():
    c = Config()
    c.KubeSpawner.profile_list = PLAIN_PROFILES
    spawner = make_spawner(c, catalog=False)
    spawner.user_options = {"profile": "choose", "image--unlisted-choice": "evil/image"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 400
    assert info.value.jupyterhub_message == (
        "'image--unlisted-choice' is not accepted: Image has no unlisted choice, "
        "so send 'image' with 'a'."
    )
    assert spawner.image != "evil/image"
    # where the admin enabled it, it is applied as KubeSpawner applies it
    spawner.user_options = {"profile": "choose", "tag--unlisted-choice": "2.1"}
    await spawner.load_user_options()
    assert spawner.image == "example/b:2.1"


async def test_a_kubespawner_style_caller_catching_value_error_sees_refusals():
    """Code written for KubeSpawner wraps load_user_options in try/except ValueError."""
    c = Config()
    c.KubeSpawner.profile_list = PLAIN_PROFILES
    plain = make_spawner(c, catalog=False)
    catalog = make_spawner(user=User("zed"))
    cases = [
        (plain, {"profile": "choose", "image": "zzz"}, 400),
        (plain, {"profile": "nope"}, 400),
        (catalog, {"profile": "pytorch", "gpus": "1e9"}, 400),
        (catalog, {"profile": "pytorch", "gpus--unlisted-choice": "64"}, 400),
        (catalog, {"profile": "licensed"}, 403),
        (catalog, {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}, 403),  # over the limit
    ]
    for spawner, options, status in cases:
        spawner.user_options = options
        try:
            await spawner.load_user_options()
        except ValueError as e:
            caught = e
        else:
            raise AssertionError(f"{options} was not refused")
        # still what JupyterHub needs: a SpawnException with the status and the sentence
        assert isinstance(caught, SpawnException), options
        assert caught.status_code == status, options
        assert caught.jupyterhub_message and caught.jupyterhub_message.endswith("."), options


@pytest.mark.parametrize(
    "options, status, fragment",
    [
        ({"profile": "nope"}, 403, "There is no profile 'nope' you may use"),
        ({"profile": "pytorch", "gpus--unlisted-choice": "64"}, 400, "is not accepted"),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1e9"},
            400,
            "'1e9' is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": None, "profile-option-x": 1},
            400,
            None,
        ),
    ],
)
async def test_refusals_are_spawn_exceptions_with_a_user_message(options, status, fragment):
    spawner = make_spawner()
    spawner.user_options = options
    if fragment is None:
        await spawner.load_user_options()  # gpus: null means "not given": a type's smallest count
        assert spawner.extra_resource_limits == {"nvidia.com/gpu": "1"}
        return
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.status_code == status
    assert fragment in info.value.jupyterhub_message


async def test_limit_refusal_is_403_and_names_the_servers():
    spawner = make_spawner(pods=pods_fixture(), name="exp2")
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 403
    assert info.value.reason == "limit"
    assert info.value.jupyterhub_message == (
        "You are using 2 of your 2 GPUs (servers: default, exp1). Stop one of them or ask for fewer GPUs."
    )
    assert hubstate.current().reservations() == []


async def test_a_refusal_leaves_no_lock_behind():
    # a request over the limit even with nothing held, then a valid one from the same user:
    # the second must be admitted, not wait forever for the first one's lock
    spawner = make_spawner(user=User("zed"))
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}
    with pytest.raises(SpawnException) as refused:
        await spawner.load_user_options()
    assert refused.value.status_code == 403
    other = make_spawner(user=User("zed"), name="second")
    other.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    await asyncio.wait_for(other.load_user_options(), timeout=30)
    assert other.extra_resource_limits == {"nvidia.com/gpu": "2"}
    assert not hubstate.current().lock("user:zed").locked()


async def test_ten_concurrent_requests_against_a_limit_of_two_admit_exactly_two():
    user = User("zoe")
    spawners = [make_spawner(user=user, name=f"s{i}") for i in range(10)]

    async def attempt(spawner):
        spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        try:
            await spawner.load_user_options()
            return "started"
        except SpawnException as e:
            return e.status_code

    # every listing yields the event loop, so without the lock all ten would see zero usage
    results = await asyncio.gather(*(attempt(s) for s in spawners))
    assert results.count("started") == 2
    assert results.count(403) == 8
    assert len(hubstate.current().reservations()) == 2


async def test_group_pool_member_is_checked_against_every_members_pods():
    # ivan (1 A100) and heidi (2 MIG slices) are students in the fixture; the pool is 3
    spawner = make_spawner(user=User("judy", groups=["students"]), pods=pods_fixture())
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
    await spawner.load_user_options()
    assert spawner.listed == [(spawner.namespace, "gpuspawner.io/managed=true")]
    other = make_spawner(user=User("ken", groups=["students"]), pods=pods_fixture())
    other.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
    with pytest.raises(SpawnException) as info:
        await other.load_user_options()  # judy's admitted spawn counts before its pod exists
    assert info.value.jupyterhub_message.startswith(
        "The group 'students' is using 2.29 of its 3 shared GPUs."
    )


@pytest.fixture
async def kubeapi():
    """A stand-in API server on 127.0.0.1 holding the fixture's pods."""
    server = await StandInApi(pods=pods_fixture()).start()
    yield server
    await server.stop()


async def test_forbidden_pod_list_is_not_mistaken_for_no_usage(kubeapi):
    """The real client, a stand-in API server answering 403: refused with 503, never admitted."""
    config = Config()
    config.KubeSpawner.namespace = "jupyterhub"  # the fixture pods' namespace
    spawner = make_spawner(config, name="exp2")
    spawner.api = await core_api_for(kubeapi)
    try:
        # read from the stand-in: carol's two servers hold both her GPUs
        spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        with pytest.raises(SpawnException) as over:
            await spawner.load_user_options()
        assert over.value.status_code == 403
        assert over.value.jupyterhub_message.startswith("You are using 2 of your 2 GPUs")
        assert kubeapi.requests[-1] == (
            "/api/v1/namespaces/jupyterhub/pods",
            {
                "labelSelector": "gpuspawner.io/managed=true,hub.jupyter.org/username=carol",
                "limit": "500",
            },
        )
        kubeapi.forbidden = {"pods"}
        before = len(kubeapi.requests)
        with pytest.raises(SpawnException) as info:
            await spawner.load_user_options()
    finally:
        await spawner.api.api_client.close()
    assert info.value.status_code == 503
    assert "could not be checked" in info.value.jupyterhub_message
    assert len(kubeapi.requests) == before + 1  # a refusal is not retried
    assert hubstate.current().reservations() == []


async def test_transient_api_errors_are_retried(kubeapi):
    spawner = make_spawner()
    spawner.k8s_api_request_timeout = 1
    spawner.api = await core_api_for(kubeapi)
    # an overloaded API server, a request that gets no answer, then throttling
    kubeapi.fail = [(503, "etcdserver: request timed out"), "hang", 429]
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
    try:
        await spawner.load_user_options()
    finally:
        await spawner.api.api_client.close()
    assert kubeapi.fail == [] and len(kubeapi.requests) == 4  # three failures, then the answer
    assert spawner.extra_resource_limits == {"nvidia.com/gpu": "1"}


async def test_an_api_server_answering_500_refuses_gpus_with_a_sentence_and_the_form_still_shows(
    kubeapi,
):
    spawner = make_spawner()
    spawner.k8s_api_request_retry_timeout = 1
    spawner.form_usage_timeout = 1
    spawner.api = await core_api_for(kubeapi)
    kubeapi.always = 500
    try:
        spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        with pytest.raises(SpawnException) as info:
            await spawner.load_user_options()
        assert info.value.status_code == 503
        assert info.value.jupyterhub_message == (
            "Your GPU usage could not be checked because the cluster did not answer. "
            "Please try again in a minute."
        )
        assert hubstate.current().reservations() == []
        # the form does not fail: it shows every choice (checked again when sent)
        form = await spawner.get_options_form()
        assert 'name="profile-option-pytorch--gpus"' in form
        # a CPU-only server needs no usage: it is admitted
        spawner.user_options = {"profile": "pytorch", "gpus": "0"}
        await spawner.load_user_options()
    finally:
        await spawner.api.api_client.close()


async def test_cluster_unreachable_refuses_gpu_requests_but_not_cpu_ones():
    spawner = make_spawner()

    async def broken(namespace, **kwargs):
        raise ConnectionRefusedError("connect call failed ('127.0.0.1', 9)")

    spawner.api.list_namespaced_pod = broken
    spawner.k8s_api_request_retry_timeout = 1
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 503
    assert "could not be checked" in info.value.jupyterhub_message
    spawner.user_options = {"profile": "pytorch", "gpus": "0"}
    await spawner.load_user_options()


async def test_invalid_catalog_gives_users_a_plain_message(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("images: {}\n")
    c = Config()
    c.GPUSpawner.catalog_file = str(path)
    spawner = make_spawner(c)
    spawner.user_options = {}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 500
    assert "misconfigured" in info.value.jupyterhub_message
    # the admin's detail is in what the hub logs (str), never in the sentence users see
    assert "catalog.yaml: images" in str(info.value)
    assert "catalog.yaml" not in info.value.jupyterhub_message


async def test_form_offers_only_what_the_user_may_still_take():
    spawner = make_spawner(user=User("dave", groups=["research"]), pods=pods_fixture(), name="new")
    profiles = await spawner.profile_list(spawner)
    pytorch = next(p for p in profiles if p["slug"] == "pytorch")
    # dave holds 4 of his 4 H100: H100 is not offered, A100 counts up to his remaining 4
    assert list(pytorch["profile_options"]["gpu_type"]["choices"]) == ["a100", "mig"]
    assert list(pytorch["profile_options"]["gpus"]["choices"]) == ["0", "1", "2", "4"]
    html = await spawner.get_options_form()
    assert "profile-option-pytorch--gpu_type" in html
    assert "NVIDIA H100" not in html


async def test_form_for_a_user_at_the_limit_says_so():
    spawner = make_spawner(user=User("carol"), pods=pods_fixture(), name="exp2")
    profiles = await spawner.profile_list(spawner)
    pytorch = next(p for p in profiles if p["slug"] == "pytorch")
    assert list(pytorch["profile_options"]["gpus"]["choices"]) == ["0"]
    assert "You are using 2 of your 2 GPUs (servers: default, exp1)." in pytorch["description"]


async def test_a_restricted_image_exists_only_for_its_groups_and_users(caplog):
    caplog.set_level("INFO")
    others = make_spawner(user=User("carol", groups=["research"]))
    member = make_spawner(user=User("lin", groups=["licensed"]))
    named = make_spawner(user=User("alice"))
    slugs = {}
    for who, spawner in (("carol", others), ("lin", member), ("alice", named)):
        slugs[who] = [p["slug"] for p in await spawner.profile_list(spawner)]
    assert slugs == {
        "carol": ["pytorch", "tensorflow"],
        "lin": ["pytorch", "tensorflow", "licensed"],
        "alice": ["pytorch", "tensorflow", "licensed"],
    }
    assert "MATLAB" not in await others.get_options_form()
    assert "MATLAB" in await member.get_options_form()

    # asked for anyway (REST, saved options): the same 403 as for an image that does not exist
    answers = []
    for profile in ("licensed", "jax"):
        others.user_options = {"profile": profile, "gpu_type": "a100", "gpus": "1"}
        with pytest.raises(SpawnException) as info:
            await others.load_user_options()
        answers.append(
            (info.value.status_code, info.value.jupyterhub_message.replace(profile, "X"))
        )
    assert answers[0] == answers[1]
    assert answers[0] == (
        403,
        "There is no profile 'X' you may use: "
        "choose one of 'pytorch' (PyTorch) or 'tensorflow' (TensorFlow).",
    )
    assert others.listed == []  # refused before asking the cluster
    # the admin's log says why; the user's answer does not
    assert "asked for the image 'licensed', which is only for groups 'licensed'; users 'alice'" in (
        caplog.text
    )

    member.user_options = {"profile": "licensed", "gpu_type": "a100", "gpus": "1"}
    await member.load_user_options()
    assert member.image == "example/matlab:r2025b"
    assert member.extra_resource_limits == {"nvidia.com/gpu": "1"}


async def test_user_input_reaches_the_log_escaped(caplog):
    caplog.set_level("INFO")
    spawner = make_spawner()
    spawner.user_options = {"profile": "pytorch", "gpus": "0", "evil\nINFO forged line\x1b[31m": 1}
    await spawner.load_user_options()
    spawner.user_options = {"profile": "py\ntorch\x00"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.jupyterhub_message.isprintable()
    messages = [r.getMessage() for r in caplog.records]
    assert any("'evil\\nINFO forged line\\x1b[31m'" in m for m in messages), messages
    assert any("'py\\ntorch\\x00'" in m for m in messages), messages
    assert all(m.isprintable() for m in messages), messages


async def test_entry_point_resolves_gpu_to_gpuspawner():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="jupyterhub.spawners") if e.name == "gpu"]
    assert ep.load() is GPUSpawner


def test_every_trait_has_help():
    own = {
        name: trait
        for name, trait in GPUSpawner.class_traits(config=True).items()
        if any(
            name in cls.__dict__
            for cls in GPUSpawner.__mro__
            if cls.__module__.startswith("gpuspawner.")
        )
    }
    assert {"catalog_file", "validation_enabled", "gpu_queue_enabled"} <= set(own)
    for name, trait in own.items():
        assert trait.help and len(trait.help.strip()) > 20, name


def test_config_file_catalog_is_the_example(example_catalog):
    assert (REPO / "config" / "catalog.yaml").exists()


def pod_fixture(name):
    return json.loads((FIXTURES / "pods" / name).read_text())


@pytest.mark.parametrize(
    "name, failed",
    [
        ("gpu-check-running.json", False),
        ("gpu-check-waiting-first.json", False),
        ("gpu-check-succeeded.json", False),
        ("gpu-check-terminated-message.json", True),
        ("gpu-check-crashloop.json", True),
        ("gpu-check-start-error.json", True),
    ],
)
async def test_a_failed_gpu_check_stops_waiting_for_the_pod(name, failed):
    spawner = make_spawner()
    await build(spawner, {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"})
    pod = pod_fixture(name)
    if failed:
        with pytest.raises(GPUCheckFailed) as info:
            spawner.is_pod_running(pod)
        assert str(info.value) and "Traceback" not in str(info.value)
    else:
        assert spawner.is_pod_running(pod) in (True, False)


async def test_cpu_only_server_ignores_gpu_check_status():
    spawner = make_spawner()
    await build(spawner, {"profile": "pytorch", "gpus": "0"})
    assert spawner.is_pod_running(pod_fixture("gpu-check-crashloop.json")) is False


async def test_failed_check_deletes_the_pod_and_fails_the_spawn_with_the_reason(monkeypatch):
    spawner = make_spawner()
    reason = "Only 1 of the 2 requested GPUs is visible."
    stopped = []

    async def failing_start(self):
        await self.load_user_options()
        raise GPUCheckFailed(reason)

    async def stop(now=False):
        stopped.append(now)

    monkeypatch.setattr(KubeSpawner, "_start", failing_start)
    spawner.stop = stop
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    with pytest.raises(SpawnException) as info:
        await spawner.start()
    assert stopped == [True]
    assert info.value.status_code == 503
    assert info.value.reason == "gpu-check"
    assert info.value.jupyterhub_message == (
        f"The GPUs given to this server failed their check, so it was not started: {reason}"
    )
    assert hubstate.current().reservations() == []  # the GPUs are no longer counted for this server


async def test_a_check_image_without_python3_is_named_and_not_called_a_gpu_failure(monkeypatch):
    """validation_image set to an image without python3 (nvidia/cuda's -base images): the
    user reads one sentence that names that image and what the admin must set."""
    config = Config()
    config.GPUSpawner.validation_image = "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04"
    spawner = make_spawner(config)
    await build(spawner, {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"})
    (check,) = [c for c in spawner.init_containers if c["name"] == "gpu-check"]
    assert check["image"] == "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04"
    pod = pod_fixture("gpu-check-start-error.json")  # exec: "python3": executable file not found
    pod["spec"]["initContainers"][0]["image"] = check["image"]
    with pytest.raises(GPUCheckFailed) as failed:
        spawner.is_pod_running(pod)

    async def failing_start(self):
        await self.load_user_options()
        raise failed.value

    async def stop(now=False):
        pass

    monkeypatch.setattr(KubeSpawner, "_start", failing_start)
    spawner.stop = stop
    with pytest.raises(SpawnException) as info:
        await spawner.start()
    assert info.value.reason == "gpu-check"
    assert info.value.jupyterhub_message == (
        "The GPUs given to this server could not be checked, so it was not started: The GPU "
        "check could not start because there is no python3 in its image "
        "'nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04'; ask an admin to set validation_image "
        "to an image with python3 (docs/validation.md)."
    )


@pytest.mark.parametrize("pod_was_made", [True, False])
async def test_a_failed_start_deletes_its_pod_by_name_even_if_the_hub_never_saw_it(
    kubeapi, monkeypatch, pod_was_made
):
    """KubeSpawner's create timed out under a slow API server, yet the pod may exist: it must go."""

    config = Config()
    config.KubeSpawner.namespace = "jupyterhub"
    spawner = make_spawner(config, name="slow")
    spawner.api = await core_api_for(kubeapi)
    if pod_was_made:
        kubeapi.objects["pods"].append(
            {"metadata": {"name": spawner.pod_name, "namespace": "jupyterhub", "labels": {}}}
        )

    async def create_timed_out(self):
        await self.get_pod_manifest()  # as KubeSpawner does right before its create request
        raise asyncio.TimeoutError("create pod: no answer within 3 s")

    monkeypatch.setattr(KubeSpawner, "_start", create_timed_out)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await spawner.start()
    finally:
        await spawner.api.api_client.close()
    deletes = [r for r in kubeapi.requests if r[0] == "DELETE"]
    assert [r[1] for r in deletes] == [f"/api/v1/namespaces/jupyterhub/pods/{spawner.pod_name}"]
    assert not [p for p in kubeapi.objects["pods"] if p["metadata"]["name"] == spawner.pod_name]


async def test_a_server_that_never_answers_fails_its_start_and_its_pod_is_deleted(
    kubeapi, monkeypatch
):
    """GPUSpawner waits for the server itself (serverprobe), without turns too: a pod whose
    Jupyter never answers fails the start after http_timeout in one sentence, and the pod goes."""
    config = Config()
    config.KubeSpawner.namespace = "jupyterhub"
    config.KubeSpawner.http_timeout = 1
    assert config.GPUSpawner.get("concurrent_starts") is None  # the default: no turns
    spawner = make_spawner(config, name="mute")
    spawner.api = await core_api_for(kubeapi)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"

    async def pod_running(self):
        await self.load_user_options()
        await self.get_pod_manifest()  # as KubeSpawner does right before its create request
        kubeapi.objects["pods"].append(
            {"metadata": {"name": self.pod_name, "namespace": "jupyterhub", "labels": {}}}
        )
        return url

    monkeypatch.setattr(KubeSpawner, "_start", pod_running)
    spawner.user_options = {"profile": "pytorch", "gpus": "0"}
    try:
        with pytest.raises(SpawnException) as info:
            await asyncio.wait_for(spawner.start(), 20)
    finally:
        await spawner.api.api_client.close()
    assert (info.value.status_code, info.value.reason) == (503, "timeout")
    assert info.value.jupyterhub_message == (
        "Jupyter did not answer within 1 second of its pod starting, so the server was "
        "stopped: try again, and if it happens again ask an admin to read the log of pod "
        f"{spawner.pod_name}."
    )
    deletes = [r[1] for r in kubeapi.requests if r[0] == "DELETE"]
    assert deletes == [f"/api/v1/namespaces/jupyterhub/pods/{spawner.pod_name}"]
    assert hubstate.current().start_gate.starting == 0


async def test_with_concurrent_starts_the_next_start_waits_until_the_first_server_answers(
    monkeypatch,
):
    """A turn lasts from admission until the server answers HTTP; the next one then goes."""
    from tornado.httpserver import HTTPServer
    from tornado.web import Application, RequestHandler

    config = Config()
    config.GPUSpawner.concurrent_starts = 1
    config.KubeSpawner.http_timeout = 30
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    created: list[str] = []

    async def kubespawner_start(self):
        await self.load_user_options()  # admission, then the turn
        created.append(self.user.name)
        return f"http://127.0.0.1:{port}"

    monkeypatch.setattr(KubeSpawner, "_start", kubespawner_start)
    first = make_spawner(config, user=User("ann"))
    second = make_spawner(config, user=User("bob"))
    for spawner in (first, second):
        spawner.user_options = {"profile": "pytorch", "gpus": "0"}
    starting = [asyncio.ensure_future(first.start()), asyncio.ensure_future(second.start())]
    await asyncio.sleep(1)
    # The first pod is made; its server does not answer yet, so the second waits.
    assert created == ["ann"]
    assert second._start_turn_message() == "Next to start (at most 1 at once)."
    assert first._start_turn_message() is None

    class Hello(RequestHandler):
        def get(self):
            self.write("up")

    server = HTTPServer(Application([(r"/.*", Hello)]))
    server.listen(port, "127.0.0.1")
    try:
        results = await asyncio.wait_for(asyncio.gather(*starting), 30)
    finally:
        server.stop()
    assert created == ["ann", "bob"]
    assert results == [f"http://127.0.0.1:{port}"] * 2
    assert hubstate.current().start_gate.starting == 0


async def test_a_refused_start_never_waits_for_a_turn():
    config = Config()
    config.GPUSpawner.concurrent_starts = 1
    gate = hubstate.current().start_gate
    await gate.enter("someone/else", 1)  # every turn is taken
    spawner = make_spawner(config, user=User("cal"))
    spawner.user_options = {"profile": "pytorch", "gpus": "3"}  # not an allowed count
    with pytest.raises(SpawnException):
        await asyncio.wait_for(spawner.start(), 5)
    assert gate.starting == 1 and gate.ahead_of("cal/") is None


async def test_a_notebook_pod_gets_no_kubernetes_token():
    # The user's code runs in it: without a token it can neither read other pods
    # nor edit its own labels and annotations, which the hub counts GPUs from.
    spawner = make_spawner()
    pod = await build(spawner, {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"})
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod["spec"]
