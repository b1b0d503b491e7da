"""GPUSpawner keeps why a server stopped (gpuspawner.core.stopreasons) in its state.

KubeSpawner's own stop, poll and start are replaced where they would reach a
cluster; the pod the hub's watch holds is a stand-in reflector's dict.
"""

import json

import pytest
from kubespawner import KubeSpawner

from gpuspawner.core import labels, stopreasons
from gpuspawner.hub.compat import SpawnException
from gpuspawner.hub.spawner import GPUCheckFailed, GPUSpawner

from ..scriptedhttp import scripted_server
from .test_spawner import _isolated, build, make_spawner  # noqa: F401 (the fixture)

AT = 1_800_000_000.0


class Reflector:
    def __init__(self):
        self.pods = {}


@pytest.fixture
def reflector(monkeypatch):
    ref = Reflector()
    monkeypatch.setattr(GPUSpawner, "pod_reflector", property(lambda self: ref))
    return ref


@pytest.fixture
def kube_poll(monkeypatch):
    """KubeSpawner's poll: running while the watch holds the pod."""

    async def poll(self):
        return None if f"{self.namespace}/{self.pod_name}" in self.pod_reflector.pods else 1

    monkeypatch.setattr(KubeSpawner, "poll", poll)


@pytest.fixture
def kube_stop(monkeypatch):
    """KubeSpawner's stop deletes the pod (from the watch, here)."""
    calls = []

    async def stop(self, now=False):
        calls.append(self.pod_name)
        self.pod_reflector.pods.pop(f"{self.namespace}/{self.pod_name}", None)

    monkeypatch.setattr(KubeSpawner, "stop", stop)
    return calls


def pod_of(spawner, node="gpu-a-1", **annotations):
    return {
        "metadata": {
            "name": spawner.pod_name,
            "namespace": spawner.namespace,
            "labels": {labels.LABEL_MANAGED: "true"},
            "annotations": annotations,
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


async def started(spawner, reflector, monkeypatch, options=None):
    """A spawner whose start succeeded, its pod in the watch.

    Its "Jupyter" is a server on loopback that answers, as GPUSpawner asks the
    started server itself before its start returns (serverprobe).
    """
    with scripted_server(r"/.*") as jupyter:

        async def kube_start(self):
            await self.load_user_options()
            reflector.pods[f"{self.namespace}/{self.pod_name}"] = pod_of(self)
            return jupyter["url"]

        monkeypatch.setattr(KubeSpawner, "_start", kube_start)
        spawner.user_options = options or {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
        await spawner.start()
    return spawner


def saved_and_restored(spawner, name=""):
    """What JupyterHub does on stop (clear_state, save get_state) and then after a restart."""
    spawner.clear_state()
    state = json.loads(json.dumps(spawner.get_state()))
    restored = make_spawner(name=name)
    restored.load_state(state)
    return restored


async def test_the_culler_reason_on_the_pod_survives_clear_state_and_a_restart(
    reflector, kube_stop, monkeypatch
):
    spawner = await started(make_spawner(name="train"), reflector, monkeypatch)
    reason = stopreasons.StopNotice(stopreasons.REASON_GPU_IDLE, AT, seconds=7200)
    pod = reflector.pods[f"{spawner.namespace}/{spawner.pod_name}"]
    pod["metadata"]["annotations"][labels.ANNOTATION_STOP_REASON] = json.dumps(reason.to_state())
    await spawner.stop()
    assert kube_stop == [spawner.pod_name]
    restored = saved_and_restored(spawner, "train")
    notice = restored.stop_notice()
    assert notice is not None
    assert notice.server == "train"
    assert notice.held.startswith("2 × ")
    assert notice.sentence().endswith("because its GPUs were idle for 2 hours.")


async def test_a_stop_by_the_user_leaves_no_notice(reflector, kube_stop, monkeypatch):
    spawner = await started(make_spawner(), reflector, monkeypatch)
    await spawner.stop()
    assert saved_and_restored(spawner).stop_notice() is None


async def test_starting_the_server_again_clears_the_notice(reflector, kube_stop, monkeypatch):
    spawner = make_spawner()
    spawner.load_state(
        {stopreasons.STATE_KEY: {"reason": "admin", "at": AT}, "pod_name": "jupyter-carol"}
    )
    assert spawner.stop_notice().reason == "admin"
    await started(spawner, reflector, monkeypatch)
    assert spawner.stop_notice() is None
    assert stopreasons.STATE_KEY not in spawner.get_state()


@pytest.mark.parametrize(
    "junk", [None, "x", 5, [], {"reason": "admin"}, {"reason": "nope", "at": AT}]
)
async def test_a_junk_saved_notice_reads_as_none(junk):
    spawner = make_spawner()
    spawner.load_state({stopreasons.STATE_KEY: junk, stopreasons.RUNNING_STATE_KEY: junk})
    assert spawner.stop_notice() is None
    assert stopreasons.STATE_KEY not in spawner.get_state()


async def test_a_pod_gone_with_its_node_is_node_lost_even_after_a_restart(
    reflector, kube_poll, monkeypatch
):
    spawner = await started(make_spawner(name="exp"), reflector, monkeypatch)
    # the hub saves the state after a start; it restarts; the node goes away with the pod
    restored = make_spawner(name="exp")
    restored.load_state(json.loads(json.dumps(spawner.get_state())))
    reflector.pods.clear()
    asked = []

    async def node_lost(node):
        asked.append(node)
        return True

    restored._node_lost = node_lost
    assert await restored.poll() == 1
    assert asked == ["gpu-a-1"]
    notice = saved_and_restored(restored, "exp").stop_notice()
    assert notice.reason == stopreasons.REASON_NODE_LOST
    assert "the node it ran on (gpu-a-1) was lost" in notice.sentence()
    assert await restored.poll() == 1 and asked == ["gpu-a-1"]  # asked once


async def test_a_pod_gone_while_its_node_is_fine_leaves_no_notice(
    reflector, kube_poll, monkeypatch
):
    spawner = await started(make_spawner(), reflector, monkeypatch)
    reflector.pods.clear()

    async def node_lost(node):
        return False

    spawner._node_lost = node_lost
    assert await spawner.poll() == 1
    assert spawner.stop_notice() is None


async def test_a_failed_gpu_check_keeps_its_kind_and_reason(monkeypatch):
    spawner = make_spawner(name="t")

    async def failing_start(self):
        await self.load_user_options()
        raise GPUCheckFailed("Only 1 of the 2 requested GPUs is visible.", "gpus-missing")

    async def stop(now=False):
        pass

    monkeypatch.setattr(KubeSpawner, "_start", failing_start)
    spawner.stop = stop
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    with pytest.raises(SpawnException):
        await spawner.start()
    notice = saved_and_restored(spawner, "t").stop_notice()
    assert notice.reason == stopreasons.REASON_GPU_CHECK
    assert notice.kind == "gpus-missing"
    assert "failed their check (gpus-missing): Only 1 of the 2 requested GPUs is visible" in (
        notice.sentence()
    )


async def test_the_spawn_form_shows_the_notice_escaped():
    spawner = make_spawner(name="<i>x</i>")
    spawner.load_state({stopreasons.STATE_KEY: {"reason": "admin", "at": AT}})
    form = await spawner.get_options_form()
    assert "an admin stopped it from the GPU page" in form
    assert "&lt;i&gt;x&lt;/i&gt;" in form and "<i>x</i>" not in form
    # the notice is markup of its own: the form after it is not escaped with it
    assert '<p class="alert alert-info gpuspawner-stopped"' in form
    assert '<input type="radio"' in form and "<time datetime=" in form
    plain = make_spawner()
    assert "gpuspawner-stopped" not in await plain.get_options_form()


async def test_the_culler_warning_on_the_running_pod(reflector, monkeypatch):
    spawner = await started(make_spawner(name="w"), reflector, monkeypatch)
    assert spawner.cull_warning() is None
    pod = reflector.pods[f"{spawner.namespace}/{spawner.pod_name}"]
    warning = stopreasons.CullWarning(stopreasons.REASON_GPU_IDLE, AT, seconds=3600)
    pod["metadata"]["annotations"][labels.ANNOTATION_CULL_WARNING] = json.dumps(warning.to_state())
    assert spawner.cull_warning().sentence().startswith("Your server 'w' (2 × ")


async def test_a_start_given_up_for_lack_of_gpus_is_stuck_pending(monkeypatch):
    from gpuspawner.hub.capacity import GPUUnschedulable

    spawner = make_spawner(name="p")
    spawner.gpu_unschedulable_timeout = 300

    async def stuck_start(self):
        await self.load_user_options()
        raise GPUUnschedulable("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")

    async def stop(now=False):
        pass

    monkeypatch.setattr(KubeSpawner, "_start", stuck_start)
    spawner.stop = stop
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    with pytest.raises(SpawnException):
        await spawner.start()
    notice = saved_and_restored(spawner, "p").stop_notice()
    assert notice.reason == stopreasons.REASON_STUCK_PENDING
    assert notice.sentence().endswith("because no node had free GPUs for it for 5 minutes.")


@pytest.mark.parametrize("field", ["at", "seconds"])
@pytest.mark.parametrize("value", [1e20, 1e300, 253402300800])
async def test_a_far_future_time_on_the_pod_neither_blocks_the_stop_nor_breaks_the_form(
    reflector, kube_stop, monkeypatch, field, value
):
    # Anyone who may edit the pod writes its annotations: a time past year 9999
    # (or an absurd duration) reads as no notice, or as a notice without it.
    spawner = await started(make_spawner(name="train"), reflector, monkeypatch)
    pod = reflector.pods[f"{spawner.namespace}/{spawner.pod_name}"]
    record = {"reason": "gpu-idle", "at": AT, "seconds": 7200, field: value}
    pod["metadata"]["annotations"][labels.ANNOTATION_STOP_REASON] = json.dumps(record)
    warning = {"reason": "gpu-idle", "cull_after": value}
    pod["metadata"]["annotations"][labels.ANNOTATION_CULL_WARNING] = json.dumps(warning)
    assert spawner.cull_warning() is None
    await spawner.stop()
    assert kube_stop == [spawner.pod_name]
    restored = saved_and_restored(spawner, "train")
    form = await restored.get_options_form()
    assert "profile-option-pytorch--gpus" in form
    notice = restored.stop_notice()
    if field == "at":
        assert notice is None or notice.at <= stopreasons.MAX_EPOCH
    else:
        assert notice is not None and notice.seconds is None
        assert notice.sentence().endswith("because its GPUs were idle too long.")
