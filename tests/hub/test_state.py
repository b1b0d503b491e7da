"""The hub's shared state: what it keeps, and that closing or resetting it stops the watches.

The inventory reflector is the real one; only the API it lists from is a
stand-in whose calls never answer, so the test sees whether they are cancelled.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from gpuspawner.core.limits import Holding
from gpuspawner.hub import metrics
from gpuspawner.hub import state as hubstate
from gpuspawner.inventory.reflectors import InventoryReflector

from ..conftest import FIXTURES


class HangingAPI:
    """A CoreV1Api whose list calls wait forever; counts the calls made and cancelled."""

    def __init__(self):
        self.started = 0
        self.cancelled = 0

    async def _hang(self):
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def list_node(self, **kwargs):
        return await self._hang()

    async def list_pod_for_all_namespaces(self, **kwargs):
        return await self._hang()


def reflector_on(api):
    return lambda: InventoryReflector(api, namespace="jupyterhub")


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_reflector_is_started_and_close_stops_it():
    state = hubstate.HubState()
    api = HangingAPI()
    reflector = state.inventory(reflector_on(api))
    assert state.inventory(reflector_on(HangingAPI())) is reflector  # created once
    await settle()
    assert api.started == 2  # the nodes' and the pods' lists
    await state.close()
    assert api.cancelled == 2
    # Closed state is empty and usable again: a new reflector is made on demand.
    again = HangingAPI()
    assert state.inventory(reflector_on(again)) is not reflector
    await state.close()


async def test_reset_cancels_the_watches_and_starts_from_empty():
    state = hubstate.reset()
    api = HangingAPI()
    state.inventory(reflector_on(api))
    state.reserve(Holding("carol", "", "a100", 1, 1.0))
    state.wait_queue.join("a100", object(), 1)
    await settle()
    fresh = hubstate.reset()
    await settle()
    assert api.cancelled == 2
    assert fresh is hubstate.current() and fresh is not state
    assert fresh.reservations() == []
    assert len(fresh.wait_queue) == 0
    hubstate.reset()


def test_a_reflector_of_an_ended_event_loop_is_replaced():
    state = hubstate.HubState()

    async def get():
        return state.inventory(reflector_on(HangingAPI()))

    first = asyncio.run(get())
    second = asyncio.run(get())
    assert second is not first
    asyncio.run(state.close())


def test_reservations_are_per_user_and_server():
    state = hubstate.HubState()
    state.reserve(Holding("carol", "", "a100", 1, 1.0))
    state.reserve(Holding("carol", "exp", "a100", 2, 2.0))
    state.reserve(Holding("dave", "", "t4", 1, 1.0))
    state.reserve(Holding("carol", "exp", "a100", 4, 4.0))  # the same server again: replaced
    assert sorted(h.gpus for h in state.reservations("carol")) == [1, 4]
    assert len(state.reservations()) == 3
    state.release("carol", "exp")
    state.release("carol", "never-reserved")
    assert [h.server for h in state.reservations("carol")] == [""]


def test_a_lock_is_shared_while_used_and_then_forgotten():
    state = hubstate.HubState()
    lock = state.lock("user:carol")
    assert state.lock("user:carol") is lock
    assert state.lock("user:dave") is not lock
    gone = weakref.ref(lock)
    del lock
    gc.collect()
    assert gone() is None  # no lock per user name piles up


def test_catalog_files_and_form_templates_are_kept_until_reset():
    state = hubstate.reset()
    path = str(FIXTURES / "catalogs" / "pools.yaml")
    source = state.catalog_file(path)
    assert state.catalog_file(path) is source
    built = []

    def build():
        built.append(1)
        return object()

    env = state.form_environment(("a",), build)
    assert state.form_environment(("a",), build) is env
    assert state.form_environment(("b",), build) is not env
    assert len(built) == 2
    fresh = hubstate.reset()
    assert fresh.catalog_file(path) is not source
    assert fresh.form_environment(("a",), build) is not env


def test_metrics_count_the_spawners_of_the_current_state_weakly():
    class Tracked:
        pass

    state = hubstate.reset()
    spawner = Tracked()
    metrics.track(spawner)
    assert list(state.spawners) == [spawner]
    assert list(hubstate.reset().spawners) == []
    metrics.track(spawner)
    del spawner
    gc.collect()
    assert list(hubstate.current().spawners) == []
    hubstate.reset()


async def test_one_usage_recorder_is_started_and_close_stops_it(tmp_path):
    from gpuspawner.accounting.store import UsageStore
    from gpuspawner.clients import kube
    from gpuspawner.hub.accounting import AccountingRecorder

    from .test_accounting import FakeApi

    store = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    state = hubstate.HubState()

    def create():
        return AccountingRecorder(lambda: store, kube.Reader(), "jupyterhub", api=FakeApi())

    recorder = state.accounting(create)
    assert state.accounting(create) is recorder  # created once
    assert state.recorder is recorder
    assert await recorder.wait_reconciled(30)  # at once, on start (the store migrated first)
    await state.close()
    assert state.recorder is None
    assert recorder._task.done()
    with pytest.raises(RuntimeError):  # its worker is shut down, the store closed
        await recorder.call(lambda s: None)
