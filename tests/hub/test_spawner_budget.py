"""GPU-hours budgets and the user's idle timeout in GPUSpawner: admission, the form, the pod.

The usage store is the real one (:class:`gpuspawner.accounting.store.UsageStore` on a
SQLite file), filled with intervals as the recorder writes them; pods are built by
KubeSpawner's own code, and the cluster's pods are the fixture's.
"""

import asyncio
import math
import time

import pytest
import yaml
from traitlets.config import Config

from gpuspawner.accounting.store import UsageStore
from gpuspawner.core import budgets
from gpuspawner.core.catalog import parse_catalog
from gpuspawner.core.labels import ANNOTATION_CHARGE_GROUP, ANNOTATION_IDLE_TIMEOUT
from gpuspawner.core.usage import Interval
from gpuspawner.hub import state as hubstate
from gpuspawner.hub.compat import SpawnException

from ..conftest import FIXTURES
from .test_spawner import User, _isolated, as_dict, make_spawner, pods_fixture  # noqa: F401

HOUR = 3600.0


def budget_catalog(**gpu_hours) -> dict:
    """The pools catalog with a daily budget whose period began about 12 hours ago.

    The reset time follows the clock, so usage written "in the last 11 hours" is in
    this period whenever the test runs.
    """
    raw = yaml.safe_load((FIXTURES / "catalogs" / "pools.yaml").read_text())
    reset = time.gmtime(time.time() - 12 * HOUR)
    raw["limits"]["gpu_hours"] = {
        "period": "day",
        "reset": f"{reset.tm_hour:02d}:{reset.tm_min:02d}",
        "min_session": "15m",
        "default": 10,
        "groups": {"research": 20},
        "users": {"alice": "unlimited"},
        **gpu_hours,
    }
    raw["images"]["pytorch"]["idle_timeout"] = {"min": "30m", "max": "8h", "default": "1h"}
    return raw


class Recorder:
    """The accounting recorder as the spawner uses it (``call`` on a thread), over the real
    store, counting the reads (and able to fail them)."""

    def __init__(self, store):
        self.store = store
        self.reads = 0
        self.error: Exception | None = None

    async def call(self, function, *args):
        self.reads += 1
        if self.error is not None:
            raise self.error
        return await asyncio.to_thread(function, self.store, *args)


@pytest.fixture
def store(tmp_path):
    usage = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    usage.migrate()
    yield usage
    usage.close()


def used(store, user, hours):
    """``hours`` weighted GPU-hours of ``user``, ended an hour ago, within the last 11 hours."""
    gpus = math.ceil(hours / 10)
    end = time.time() - HOUR
    uid = f"{user}-{hours}"
    store.open(
        Interval(
            uid=uid,
            user=user,
            server="",
            charge_group="",
            gpu_type="a100",
            image="pytorch",
            gpus=gpus,
            units=float(gpus),
            start=end - hours * HOUR / gpus,
            end=None,
        )
    )
    assert store.close(uid, end, "pod")


def spawner_with(store, raw, user=None, name="", pods=()):
    c = Config()
    c.GPUSpawner.catalog = raw
    spawner = make_spawner(c, user=user, name=name, pods=pods)
    recorder = Recorder(store)
    spawner.gpu_accounting = lambda: recorder
    spawner.counting = recorder
    return spawner


async def refusal_of(spawner, options):
    spawner.user_options = options
    with pytest.raises(SpawnException) as info:
        await spawner.load_user_options()
    return info.value


A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}


async def test_without_a_budget_nothing_is_read(store):
    raw = budget_catalog()
    del raw["limits"]["gpu_hours"]
    spawner = spawner_with(store, raw)
    spawner.user_options = A100
    await spawner.load_user_options()
    await spawner.profile_list(spawner)
    assert spawner.counting.reads == 0
    assert "gpuspawner-budget" not in await spawner.get_options_form()


async def test_an_unlimited_user_is_not_read_either(store):
    spawner = spawner_with(store, budget_catalog(), user=User("alice"))
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}
    await spawner.load_user_options()
    assert "gpuspawner-budget" not in await spawner.get_options_form()
    assert spawner.counting.reads == 0


async def test_a_spent_budget_refuses_a_gpu_request_with_one_sentence(store):
    used(store, "carol", 10)
    spawner = spawner_with(store, budget_catalog())
    error = await refusal_of(spawner, A100)
    assert error.status_code == 403
    assert error.reason == budgets.REASON_BUDGET
    assert error.jupyterhub_message.startswith(
        "You have used all 10 of your GPU-hours today; your budget resets "
    )
    assert hubstate.current().reservations() == []
    # a server without GPUs needs no GPU-hours
    spawner.user_options = {"profile": "pytorch", "gpus": "0"}
    await spawner.load_user_options()


async def test_a_budget_too_short_for_the_request_is_refused_and_fewer_gpus_fit(store):
    # research's 20 h, 1 h left: 1 A100 would run 1 h, but beside the 4 H100 dave holds
    # in the fixture's pods only 12 min, less than min_session
    used(store, "dave", 19)
    spawner_held = spawner_with(
        store, budget_catalog(), user=User("dave", groups=["research"]), pods=pods_fixture()
    )
    error = await refusal_of(spawner_held, A100)
    assert error.status_code == 403
    assert error.reason == budgets.REASON_BUDGET
    assert "less than 15 min" in error.jupyterhub_message
    assert "choose fewer GPUs, or wait until" in error.jupyterhub_message
    # without those pods the hour covers 1 A100 (the stand-in API is shared: made after)
    spawner = spawner_with(store, budget_catalog(), user=User("dave", groups=["research"]))
    spawner.user_options = A100
    await spawner.load_user_options()
    assert spawner.counting.reads == 1


async def test_an_unreadable_store_refuses_gpus_with_a_sentence_not_a_traceback(store, caplog):
    spawner = spawner_with(store, budget_catalog())
    spawner.counting.error = OSError("database is locked\n<script>")
    error = await refusal_of(spawner, A100)
    assert error.status_code == 503
    assert "Traceback" not in error.jupyterhub_message
    assert "<script>" not in error.jupyterhub_message
    assert "GPU-hours" in error.jupyterhub_message
    assert hubstate.current().reservations() == []
    # the form still shows, without the budget line
    form = await spawner.get_options_form()
    assert "profile-option-pytorch--gpu_type" in form
    assert "gpuspawner-budget" not in form


async def test_concurrent_requests_of_one_user_count_each_other(store):
    # 1.25 h left, at least 15 min each: two servers of 2 A100 run 18.75 min together, a
    # third would leave 12.5 min; each admitted request is counted by the next (its
    # reservation), so exactly two are admitted
    used(store, "erin", 8.75)
    user = User("erin")
    raw = budget_catalog(users={"erin": 10})
    raw["limits"]["users"]["erin"] = "unlimited"  # the GPU limit is not what refuses here
    spawners = [spawner_with(store, raw, user=user, name=f"s{i}") for i in range(3)]

    async def attempt(spawner):
        spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
        try:
            await spawner.load_user_options()
            return "started"
        except SpawnException as e:
            return e.reason

    results = await asyncio.gather(*(attempt(s) for s in spawners))
    assert sorted(results) == [budgets.REASON_BUDGET, "started", "started"]


async def test_the_form_shows_the_budget_and_what_the_rest_allows(store):
    used(store, "carol", 4.5)
    spawner = spawner_with(store, budget_catalog())
    form = await spawner.get_options_form()
    assert "4.5 of 10 GPU-hours used today; resets " in form
    assert "The rest allows 1 × NVIDIA A100 for 5 h 30 min" in form
    assert 'id="gpuspawner-budget"' in form


async def test_the_budget_line_is_escaped(store):
    raw = budget_catalog()
    raw["gpu_types"]["a100"]["display_name"] = "A100 <b onclick=x>"
    used(store, "carol", 1)
    spawner = spawner_with(store, raw)
    form = await spawner.get_options_form()
    assert "<b onclick=x>" not in form
    assert "A100 &lt;b onclick=x&gt;" in form


async def test_the_form_has_an_idle_timeout_field_within_the_images_bounds(store):
    raw = budget_catalog()
    del raw["limits"]["gpu_hours"]
    spawner = spawner_with(store, raw)
    form = await spawner.get_options_form()
    assert 'name="profile-option-pytorch--idle_timeout"' in form
    assert 'min="30" max="480" value="60"' in form
    # only the image with bounds has one
    assert "profile-option-tensorflow--idle_timeout" not in form
    # the user's last valid choice is shown again
    spawner.user_options = {"profile": "pytorch", "idle_timeout": "90"}
    assert 'value="90"' in await spawner.get_options_form()


async def test_the_form_field_and_rest_reach_the_pod_as_seconds(store):
    raw = budget_catalog()
    spawner = spawner_with(store, raw, user=User("dave", groups=["research", "ml"]))
    # KubeSpawner's form data, as JupyterHub hands it over
    spawner.user_options = spawner.options_from_form(
        {
            "profile": ["pytorch"],
            "profile-option-pytorch--gpu_type": ["a100"],
            "profile-option-pytorch--gpus": ["1"],
            "profile-option-pytorch--idle_timeout": ["90"],
        }
    )
    await spawner.load_user_options()
    pod = as_dict(spawner, await spawner.get_pod_manifest())
    annotations = pod["metadata"]["annotations"]
    assert annotations[ANNOTATION_IDLE_TIMEOUT] == "5400"
    # research's budget rule applies to dave: his GPU-hours are charged to it
    assert annotations[ANNOTATION_CHARGE_GROUP] == "research"

    rest = spawner_with(store, raw, user=User("dave", groups=["research"]), name="rest")
    rest.user_options = {**A100, "idle_timeout": "1h30m"}
    await rest.load_user_options()
    pod = as_dict(rest, await rest.get_pod_manifest())
    assert pod["metadata"]["annotations"][ANNOTATION_IDLE_TIMEOUT] == "5400"


async def test_an_idle_timeout_outside_the_bounds_is_refused_before_the_budget(store):
    spawner = spawner_with(store, budget_catalog())
    error = await refusal_of(spawner, {**A100, "idle_timeout": 10})
    assert error.status_code == 400
    assert "30" in error.jupyterhub_message and "480" in error.jupyterhub_message
    assert spawner.counting.reads == 0
    error = await refusal_of(spawner, {"profile": "tensorflow", "gpus": "1", "idle_timeout": 60})
    assert error.status_code == 400
    assert "TensorFlow" in error.jupyterhub_message


def test_the_catalog_used_here_is_valid():
    parse_catalog(budget_catalog())
