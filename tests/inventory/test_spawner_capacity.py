"""GPUSpawner with a live inventory: figures on the form, refusals, the queue, failing fast.

The inventory is the real model filled from the recorded sandbox objects; only
the watches are replaced (by :class:`FakeReflector`), so no cluster is needed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re

import pytest
from kubespawner import KubeSpawner
from traitlets.config import Config

from gpuspawner.clients import kube
from gpuspawner.hub import state as hubstate
from gpuspawner.hub.compat import SpawnException
from gpuspawner.hub.spawner import GPUUnschedulable
from gpuspawner.inventory.model import inventory_from

from ..conftest import FIXTURES
from ..hub.test_spawner import User, make_spawner

NODES = FIXTURES / "nodes"


def items(name):
    return json.loads((NODES / name).read_text())["items"]


def recorded(name):
    return next(p for p in items("recorded-pods.json") if p["metadata"]["name"] == name)


class FakeReflector:
    """The reflector's interface over a real Inventory; tests change the inventory directly."""

    def __init__(self, inventory, missing=()):
        self.inventory = inventory
        self.missing_permissions = list(missing)
        self.ready = not missing
        self.changed = asyncio.Event()

    async def wait_ready(self, timeout):
        return self.ready

    async def wait_for_change(self, timeout):
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self.changed.clear()


@pytest.fixture
def reflector():
    inventory = inventory_from(
        items("recorded-nodes.json") + items("variants-nodes.json"),
        items("recorded-pods.json") + items("variants-pods.json"),
    )
    return FakeReflector(inventory)


@pytest.fixture(autouse=True)
def _isolated(offline_kubeconfig):
    hubstate.reset()
    yield
    hubstate.reset()


def capacity_spawner(reflector, user=None, **traits):
    c = Config()
    c.GPUSpawner.catalog_file = str(NODES / "catalog.yaml")
    for name, value in traits.items():
        setattr(c.GPUSpawner, name, value)
    spawner = make_spawner(c, user=user)
    spawner.gpu_inventory = lambda: reflector
    return spawner


def a100(reflector):
    from gpuspawner.core.catalog import load_catalog_file
    from gpuspawner.inventory.model import demand_for

    catalog = load_catalog_file(NODES / "catalog.yaml")
    return reflector.inventory.availability(demand_for(catalog.gpu_types["a100"]))


async def test_form_shows_free_gpus_per_type_and_leaves_out_impossible_counts(reflector):
    spawner = capacity_spawner(reflector)
    profiles = await spawner._catalog_profile_list(spawner)
    tensorflow = next(p for p in profiles if p["slug"] == "tensorflow")  # a100 and t4 only
    types = tensorflow["profile_options"]["gpu_type"]["choices"]
    figures = a100(reflector)
    assert types["a100"]["display_name"].endswith(
        f"\u2014 {figures.free} free of {figures.allocatable} "
        f"(at most {figures.largest_free} on one node)"
    )
    assert types["t4"]["display_name"].endswith("\u2014 no node available")
    counts = tensorflow["profile_options"]["gpus"]["choices"]
    # 8: no A100 or T4 node has 8 GPUs, so it is not offered; 4 fits a node but none has 4 free.
    assert "8" not in counts
    assert counts["4"]["display_name"] == "4 GPUs (not free now)"
    assert counts["1"]["display_name"] == "1 GPU"
    pytorch = next(p for p in profiles if p["slug"] == "pytorch")  # H100 nodes have 8
    assert "8" in pytorch["profile_options"]["gpus"]["choices"]


async def test_form_without_inventory_has_no_figures(reflector):
    blind = FakeReflector(reflector.inventory, missing=["the hub may not list nodes"])
    spawner = capacity_spawner(blind)
    profiles = await spawner._catalog_profile_list(spawner)
    for profile in profiles:
        for choice in profile["profile_options"].get("gpu_type", {}).get("choices", {}).values():
            assert "free" not in choice["display_name"]
    payload = spawner.gpu_availability_payload()
    assert payload["available"] is False
    assert "may not list nodes" in payload["problem"]


class Service:
    """What the hub keeps per configured service (its tornado settings' "services")."""

    def __init__(self, name, url="http://127.0.0.1:10103"):
        self.url = url
        self.prefix = f"/base/services/{name}/"


def with_services(*names):
    user = User()
    user.settings = {"services": {name: Service(name) for name in names}}
    return user


async def test_rendered_form_carries_the_figures_and_polls_the_service(reflector):
    spawner = capacity_spawner(reflector, user=with_services("gpuspawner-admin", "gpuspawner"))
    profiles = await spawner._catalog_profile_list(spawner)
    html = spawner.render_catalog_form(profiles)
    assert 'name="profile-option-pytorch--gpu_type"' in html  # KubeSpawner's own field names
    assert re.search(r'var url = "([^"]*)";', html).group(1) == (
        "/base/services/gpuspawner/availability"
    )
    assert html.rstrip().endswith("</script>")
    initial = re.search(r"var initial = (\{.*\});", html).group(1)
    assert json.loads(initial)["types"]["a100"]["free"] == a100(reflector).free
    assert " as of " not in html  # refreshed: no time on the labels


async def test_without_the_service_the_form_keeps_its_figures_and_says_when(reflector):
    spawner = capacity_spawner(reflector, user=with_services("gpuspawner-admin"))
    html = spawner.render_catalog_form(await spawner._catalog_profile_list(spawner))
    assert 'var url = "";' in html  # nothing to poll: the note gives the time of counting
    other = capacity_spawner(reflector, user=with_services("gpuspawner"), gpu_figures_service="")
    assert 'var url = "";' in other.render_catalog_form(await other._catalog_profile_list(other))


FANCY_LIKE_FORM = (
    "{% for p in profile_list %}{% for o in p.profile_options.values() %}"
    "{% for c in o.choices.values() %}[{{ c.display_name }}]{% endfor %}"
    "{% endfor %}{% endfor %}"
)


@pytest.mark.parametrize("how", ["template_path", "profile_form_template"])
async def test_another_form_gets_labels_with_their_time_and_no_live_script(
    reflector, tmp_path, how
):
    # jupyterhub-fancy-profiles puts its form.html on the template path; its widgets read
    # the profile list once, so our script could not relabel them
    (tmp_path / "form.html").write_text(FANCY_LIKE_FORM)
    traits = (
        {"additional_profile_form_template_paths": [str(tmp_path)]}
        if how == "template_path"
        else {"profile_form_template": FANCY_LIKE_FORM}
    )
    spawner = capacity_spawner(reflector, user=with_services("gpuspawner"), **traits)
    profiles = await spawner._catalog_profile_list(spawner)
    a100_label = profiles[0]["profile_options"]["gpu_type"]["choices"]["a100"]["display_name"]
    assert re.fullmatch(
        r"NVIDIA A100 \(80 GB per GPU\) \u2014 \d+ free of \d+ \(at most \d+ on one node\)"
        r" as of \d\d:\d\d UTC",
        a100_label,
    )
    html = spawner.render_catalog_form(profiles)
    assert f"[{a100_label}]" in html
    assert "<script" not in html and "counted live" not in html


async def test_a_template_path_without_a_form_keeps_kubespawners_form_and_the_script(
    reflector, tmp_path
):
    (tmp_path / "other.html").write_text("not the form")
    spawner = capacity_spawner(
        reflector,
        user=with_services("gpuspawner"),
        additional_profile_form_template_paths=[str(tmp_path)],
    )
    profiles = await spawner._catalog_profile_list(spawner)
    html = spawner.render_catalog_form(profiles)
    assert 'name="profile-option-pytorch--gpu_type"' in html and "var url = " in html
    assert " as of " not in html


#: A stand-in for the page the form's script runs in: the note element, no GPU fields,
#: a fetch that never answers; prints the note's text once the script ran.
PAGE_STAND_IN = """
const note = {textContent: null};
globalThis.document = {
  readyState: "complete",
  getElementById: (id) => (id === "gpuspawner-availability" ? note : null),
  querySelectorAll: () => [],
  querySelector: () => null,
  addEventListener: () => {},
};
globalThis.setTimeout = () => {};
globalThis.fetch = () => new Promise(() => {});
"""


def form_note(payload, url):
    """The note the form's script writes for ``payload``, run by Node.js over a stand-in page."""
    import subprocess

    from gpuspawner.hub.formscript import form_script

    script = re.search(r"<script>(.*)</script>", form_script(payload, url), re.S).group(1)
    program = PAGE_STAND_IN + script + "\nconsole.log(JSON.stringify(note.textContent));\n"
    done = subprocess.run(
        ["node", "-e", program], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize("namespace", ["jupyterhub", ""])
async def test_the_form_says_when_gpus_used_outside_the_hub_are_not_seen(reflector, namespace):
    from gpuspawner.hub.formscript import AS_OF_NOTE, LIVE_NOTE, OWN_NAMESPACE_NOTE

    reflector.inventory.count_pods_of(namespace)
    spawner = capacity_spawner(reflector, user=with_services("gpuspawner"))
    payload = spawner.gpu_availability_payload()
    assert payload["pods_namespace"] == namespace
    live = form_note(payload, "/base/services/gpuspawner/availability")
    as_of = form_note(payload, "")
    assert live.startswith(LIVE_NOTE) and as_of.startswith(AS_OF_NOTE)
    for note in (live, as_of):
        assert note.endswith(OWN_NAMESPACE_NOTE) is bool(namespace), note


def test_form_script_cannot_be_closed_by_the_data():
    from gpuspawner.hub.formscript import form_script

    html = form_script({"problem": "</script><script>alert(1)</script>"}, "/hub/x")
    assert html.count("</script>") == 1
    # nor by the service's URL, nor can either open a comment that hides the end
    html = form_script({"problem": "<!--<script>"}, "/services/x</script><!--")
    assert html.count("</script>") == 1 and "<!--" not in html


async def test_payload_marks_counts_per_type(reflector):
    spawner = capacity_spawner(reflector)
    payload = spawner.gpu_availability_payload()
    figures = a100(reflector)
    assert payload["available"]
    assert payload["types"]["a100"]["free"] == figures.free
    assert payload["types"]["a100"]["counts"]["8"] == "no node has that many"
    assert payload["types"]["a100"]["counts"]["4"] == "not free now"
    assert payload["types"]["a100"]["counts"]["1"] == ""
    assert payload["images"]["tensorflow"] == ["a100", "t4"]


async def test_never_schedulable_request_is_refused_before_any_pod(reflector):
    spawner = capacity_spawner(reflector)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "8"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.reason == "never-schedulable"
    assert info.value.status_code == 400
    assert info.value.jupyterhub_message.startswith(
        "No node has 8 NVIDIA A100 GPUs; the largest has 4."
    )
    assert "choose NVIDIA H100" in info.value.jupyterhub_message
    assert await spawner.poll() == 1
    assert hubstate.current().reservations() == []


async def test_request_without_free_gpus_now_is_refused_with_figures(reflector):
    spawner = capacity_spawner(reflector)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    figures = a100(reflector)
    assert info.value.reason == "no-capacity"
    assert info.value.status_code == 503
    assert f"{figures.free} of {figures.allocatable} are free" in info.value.jupyterhub_message


async def test_request_that_fits_is_admitted(reflector):
    spawner = capacity_spawner(reflector)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    await spawner.load_user_options()
    assert spawner._selection.gpus == 2


async def test_queued_request_waits_with_its_place_and_starts_when_gpus_free(reflector):
    spawner = capacity_spawner(reflector, gpu_queue_enabled=True)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}
    waiting = asyncio.ensure_future(spawner.load_user_options())
    for _ in range(50):
        await asyncio.sleep(0.01)
        if spawner.capacity.queue_message:
            break
    assert not waiting.done()
    assert spawner._gpu_check_progress().startswith("1st in line for 4 × NVIDIA A100 (1 waiting): ")
    # The 2-GPU pod on gpu-a100-0 ends: that node has 4 free.
    reflector.inventory.remove_pod("default", "bound-2xa100")
    reflector.changed.set()
    await asyncio.wait_for(waiting, 5)
    assert spawner._selection.gpus == 4
    assert spawner.capacity.queue_message == ""
    assert len(hubstate.current().wait_queue) == 0


async def test_queued_request_gives_up_after_the_queue_timeout(reflector):
    spawner = capacity_spawner(reflector, gpu_queue_enabled=True, gpu_queue_timeout=0.05)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.reason == "no-capacity"
    assert info.value.jupyterhub_message.startswith(
        "No node had 4 free NVIDIA A100 GPUs within 0 seconds"
    )
    assert hubstate.current().reservations() == []
    assert len(hubstate.current().wait_queue) == 0


async def test_never_schedulable_is_refused_even_when_queueing(reflector):
    spawner = capacity_spawner(reflector, gpu_queue_enabled=True)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "8"}
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    assert info.value.reason == "never-schedulable"


def unschedulable_pod(spawner):
    pod = copy.deepcopy(recorded("pending-8xa100"))
    pod["metadata"]["name"] = spawner.pod_name
    pod["metadata"]["namespace"] = spawner.namespace
    return pod


async def test_pending_pod_shows_the_scheduler_reason_then_fails_fast(reflector):
    spawner = capacity_spawner(reflector, gpu_unschedulable_timeout=60)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    await spawner.load_user_options()
    pod = unschedulable_pod(spawner)
    clock = [1000.0]
    spawner.capacity.clock = lambda: clock[0]
    assert spawner.is_pod_running(pod) is False
    assert spawner.capacity.scheduling_progress(spawner.gpu_unschedulable_timeout) == (
        "No node can take this server yet: 2 nodes have too few free NVIDIA A100 GPUs, "
        "3 nodes are not of this GPU type. Giving up in 60 s unless GPUs are freed."
    )
    clock[0] += 59
    assert spawner.is_pod_running(pod) is False
    clock[0] += 1
    with pytest.raises(GPUUnschedulable) as info:
        spawner.is_pod_running(pod)
    assert str(info.value).startswith("No node can take this server yet")


async def test_pod_unschedulable_for_other_reasons_does_not_fail_fast(reflector):
    spawner = capacity_spawner(reflector, gpu_unschedulable_timeout=1)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    await spawner.load_user_options()
    pod = unschedulable_pod(spawner)
    condition = pod["status"]["conditions"][0]
    condition["message"] = "0/5 nodes are available: 5 Insufficient cpu."
    clock = [1000.0]
    spawner.capacity.clock = lambda: clock[0]
    spawner.is_pod_running(pod)
    clock[0] += 3600
    assert spawner.is_pod_running(pod) is False
    assert spawner.capacity.scheduling_progress(spawner.gpu_unschedulable_timeout) == (
        "No node can take this server yet: 5 nodes have too little free CPU."
    )


async def test_pod_bound_after_waiting_resets_the_clock(reflector):
    spawner = capacity_spawner(reflector, gpu_unschedulable_timeout=10)
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    await spawner.load_user_options()
    pod = unschedulable_pod(spawner)
    clock = [1000.0]
    spawner.capacity.clock = lambda: clock[0]
    spawner.is_pod_running(pod)
    clock[0] += 9
    spawner.is_pod_running(recorded("bound-2xa100"))
    clock[0] += 9
    assert spawner.is_pod_running(pod) is False  # a new wait starts from here


async def test_stuck_pod_is_deleted_and_the_spawn_fails_with_the_reason(reflector, monkeypatch):
    spawner = capacity_spawner(reflector)
    stopped = []
    reason = "No node can take this server yet: 2 nodes have too few free NVIDIA A100 GPUs."

    async def stuck_start(self):
        await self.load_user_options()
        raise GPUUnschedulable(reason)

    async def stop(now=False):
        stopped.append(now)

    monkeypatch.setattr(KubeSpawner, "_start", stuck_start)
    spawner.stop = stop
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    with pytest.raises(SpawnException) as info:
        await spawner.start()
    assert stopped == [True]
    assert info.value.reason == "unschedulable"
    assert info.value.status_code == 503
    assert info.value.jupyterhub_message == (
        "The server was not started because no node had the GPUs for it for 60 seconds. "
        f"{reason} Ask for fewer GPUs or another GPU type, or try again later."
    )
    assert hubstate.current().reservations() == []


async def test_progress_reports_our_messages_between_kubernetes_events(reflector, monkeypatch):
    spawner = capacity_spawner(reflector)
    spawner.capacity.queue_message = "1st in line for 4 × NVIDIA A100 (1 waiting): …"

    async def quiet_progress(self):
        await asyncio.sleep(1.5)
        yield {"progress": 30, "message": "Pod scheduled"}

    monkeypatch.setattr(KubeSpawner, "progress", quiet_progress)
    events = [e async for e in spawner.progress()]
    assert (
        events[0]["message"] == spawner.capacity.queue_message
    )  # before the first Kubernetes event
    assert events[-1]["message"] == "Pod scheduled"


async def test_one_shared_inventory_per_hub_and_none_when_off():
    assert make_spawner().gpu_inventory() is None  # KubeSpawner's test mode starts no watches
    first, second = make_spawner(user=User("a")), make_spawner(user=User("b"))
    first._gpu_mock = second._gpu_mock = False
    try:
        shared = first.gpu_inventory()
        assert shared is not None and second.gpu_inventory() is shared
        assert not shared.ready  # nothing listens at the offline kubeconfig's address
        first.gpu_inventory_enabled = False
        assert first.gpu_inventory() is None
    finally:
        await hubstate.current().close()


async def test_figures_and_the_endpoint_payload_are_per_user(reflector, tmp_path):
    import yaml

    data = yaml.safe_load((NODES / "catalog.yaml").read_text())
    data["images"]["pytorch"]["gpu_types"] = ["a100", "h100"]
    data["images"]["tensorflow"]["gpu_types"] = ["a100"]
    data["images"]["rocm"] = {
        "display_name": "ROCm PyTorch",
        "image": "example/rocm:6",
        "gpu_types": ["mi300x"],
        "groups": ["amd-testers"],
    }
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data))
    seen = {}
    for name, groups in (("carol", []), ("rosa", ["amd-testers"])):
        c = Config()
        c.GPUSpawner.catalog_file = str(path)
        spawner = make_spawner(c, user=User(name, groups=groups))
        spawner.gpu_inventory = lambda: reflector
        payload = spawner.gpu_availability_payload()
        profiles = await spawner._catalog_profile_list(spawner)
        html = spawner.render_catalog_form(profiles)
        seen[name] = (sorted(payload["images"]), sorted(payload["types"]), html)
    assert seen["carol"][:2] == (["pytorch", "tensorflow"], ["a100", "h100"])
    assert seen["rosa"][:2] == (["pytorch", "rocm", "tensorflow"], ["a100", "h100", "mi300x"])
    assert "ROCm" not in seen["carol"][2] and "mi300x" not in seen["carol"][2]
    assert "ROCm PyTorch" in seen["rosa"][2]
    # the form's script disables the counts marked with the one "never" mark
    assert 'var never = "no node has that many";' in seen["carol"][2]


async def test_the_form_gives_up_on_an_unanswering_api_sooner_than_a_start(reflector):
    """The form waits ``form_usage_timeout`` for the usage, then shows every choice."""
    spawner = capacity_spawner(reflector, form_usage_timeout=0.0, k8s_api_request_retry_timeout=1)
    attempts = []

    async def no_answer(namespace, **kwargs):
        attempts.append(namespace)
        raise asyncio.TimeoutError()

    spawner.api.list_namespaced_pod = no_answer
    profiles = await spawner._catalog_profile_list(spawner)
    assert len(attempts) == 1  # no retry within a deadline of 0 s
    pytorch = next(p for p in profiles if p["slug"] == "pytorch")
    assert "8" in pytorch["profile_options"]["gpus"]["choices"]  # every count the nodes allow
    # a start's own reading of the usage still retries for k8s_api_request_retry_timeout
    with pytest.raises(kube.Retryable):
        await spawner.current_holdings(spawner.load_catalog(), every_user=False)
    # at 0 s, 0.2 s and 0.6 s; waiting 0.8 s more would pass the 1 s deadline
    assert len(attempts) == 4
