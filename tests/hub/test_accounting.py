"""The hub's usage recorder against recorded pods, a scripted API and a real SQLite store.

The pods are a real GPU server's watch events on the local cluster's real nodes
(tests/fixtures/accounting/, recorded by its record.py): one stopped through the
hub, one deleted while the hub was down, with that pod's Kubernetes Events. The
expected times are read from the raw JSON here, not through the code under test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from datetime import datetime

import pytest

from gpuspawner.accounting.store import UsageStore
from gpuspawner.clients import kube
from gpuspawner.hub.accounting import AccountingRecorder, hub_database_url, killing_time

from ..conftest import FIXTURES
from ..inventory.test_reflectors import Response

RECORDED = FIXTURES / "accounting"
NAMESPACE = "jupyterhub"


def watch_events(name: str) -> list[dict]:
    return json.loads((RECORDED / name).read_text())


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def scheduled(pod: dict) -> float:
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["status"] == "True"
    return epoch(condition["lastTransitionTime"])


def uid(pod: dict) -> str:
    return pod["metadata"]["uid"]


class FakeApi:
    """list_namespaced_pod / list_namespaced_event answering with what the test sets,
    the events filtered by their field selector as the API server does."""

    def __init__(self, pods=(), events=()):
        self.pods = list(pods)
        self.events = list(events)
        self.calls: list[tuple[str, str, dict]] = []
        self.failing = False
        self.events_forbidden = False

    def _answer(self, items):
        if self.failing:
            return Response(503, {"code": 503, "message": "etcdserver: request timed out"})
        return Response(200, {"items": items, "metadata": {"resourceVersion": "1"}})

    async def list_namespaced_pod(self, namespace, **kwargs):
        self.calls.append(("pods", namespace, kwargs))
        return self._answer(self.pods)

    async def list_namespaced_event(self, namespace, **kwargs):
        self.calls.append(("events", namespace, kwargs))
        if self.events_forbidden:
            return Response(403, {"code": 403, "message": "events is forbidden"})
        terms = dict(t.split("=", 1) for t in kwargs["field_selector"].split(","))
        items = [
            e
            for e in self.events
            if e["involvedObject"]["uid"] == terms["involvedObject.uid"]
            and e["reason"] == terms["reason"]
        ]
        return self._answer(items)


class ThreadCheckingStore:
    """A real store that notes the thread of every call, and can be made to fail."""

    def __init__(self, store: UsageStore):
        self.store = store
        self.threads: set[str] = set()
        self.failures = 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args, **kwargs):
            self.threads.add(threading.current_thread().name)
            if self.failures and name == "open":
                self.failures -= 1
                raise OSError("database is locked")
            return method(*args, **kwargs)

        return call


@pytest.fixture
def store(usage_store):
    return usage_store


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


async def recorder_for(store, api, clock=None, heartbeat=3600.0) -> AccountingRecorder:
    reader = kube.Reader(kube.RetryPolicy(timeout=0), timeout=5, page_size=50)
    return AccountingRecorder(
        lambda: store,
        reader,
        NAMESPACE,
        logging.getLogger("test.accounting"),
        api=api,
        heartbeat=heartbeat,
        clock=clock or Clock(2e9),
    )


async def settled(recorder: AccountingRecorder) -> None:
    """Every write queued so far is done (the worker runs them in order) and seen by the loop."""
    await recorder.call(lambda store: None)
    await asyncio.sleep(0)


async def test_an_interval_runs_from_scheduling_to_the_pods_end_whatever_the_events_repeat(store):
    events = watch_events("stopped-by-hub.json")
    pod = events[-1]["object"]
    recorder = await recorder_for(store, FakeApi())
    first_scheduled = next(
        i for i, e in enumerate(events) if "PodScheduled" in json.dumps(e["object"]["status"])
    )
    for event in events[:first_scheduled]:
        recorder.on_pod(event["type"], event["object"])
    await settled(recorder)
    assert store.get(uid(pod)) is None  # created, not scheduled: holds nothing yet

    for event in events[first_scheduled:-1]:
        recorder.on_pod(event["type"], event["object"])
    await settled(recorder)
    (opened,) = store.open_intervals()
    assert (opened.user, opened.gpu_type, opened.gpus) == ("ada", "a100", 1)
    assert opened.start == scheduled(pod)

    # The last event: the pod is gone. Its notebook never reported a finishedAt (the
    # kubelet deleted it first), so it ended when its deletion was asked for.
    assert "terminated" not in pod["status"]["containerStatuses"][0]["state"]
    deleted = epoch(pod["metadata"]["deletionTimestamp"])
    deleted -= pod["metadata"]["deletionGracePeriodSeconds"]
    for event in events[-1:] + events:  # and everything again: nothing changes
        recorder.on_pod(event["type"], event["object"])
    await settled(recorder)
    closed = store.get(uid(pod))
    assert (closed.start, closed.end, closed.end_source) == (scheduled(pod), deleted, "pod")
    assert store.open_intervals() == []
    assert store.closed_totals() == {("a100", ""): deleted - scheduled(pod)}
    await recorder.stop()


async def test_every_store_call_runs_on_the_one_worker_thread(store):
    checking = ThreadCheckingStore(store)
    events = watch_events("stopped-by-hub.json")
    recorder = await recorder_for(checking, FakeApi(pods=[events[-2]["object"]]))
    for event in events:
        recorder.on_pod(event["type"], event["object"])
    await recorder.reconcile()
    await settled(recorder)
    assert checking.threads == {"gpuspawner-accounting_0"}
    await recorder.stop()


async def test_a_pod_deleted_while_the_hub_was_down_is_closed_from_its_killing_event(store):
    events = watch_events("deleted-behind-hub.json")
    kube_events = json.loads((RECORDED / "events-deleted-behind-hub.json").read_text())["items"]
    seen = [
        e
        for e in events
        if e["type"] != "DELETED" and "deletionTimestamp" not in e["object"]["metadata"]
    ]
    pod = seen[-1]["object"]
    # The hub that saw it running (and touched its interval), then stopped.
    before = await recorder_for(store, FakeApi(pods=[pod]), Clock(scheduled(pod) + 2))
    for event in seen:
        before.on_pod(event["type"], event["object"])
    await before.reconcile()
    await before.stop()
    assert store.last_seen(uid(pod)) == scheduled(pod) + 2

    # The hub again: the pod is gone; its Events say when the kubelet stopped it.
    (killing,) = [e for e in kube_events if e["reason"] == "Killing"]
    api = FakeApi(pods=[], events=kube_events)
    after = await recorder_for(store, api)
    await after.reconcile()
    await settled(after)
    closed = store.get(uid(pod))
    assert (closed.end, closed.end_source) == (epoch(killing["lastTimestamp"]), "event")
    assert ("events", NAMESPACE) in [call[:2] for call in api.calls]
    (event_call,) = [c for c in api.calls if c[0] == "events"]
    assert event_call[2]["field_selector"] == f"involvedObject.uid={uid(pod)},reason=Killing"
    await after.stop()


@pytest.mark.parametrize("why", ["events expired", "events forbidden"])
async def test_without_its_event_a_gone_pod_is_closed_when_it_was_last_seen(store, why):
    pod = watch_events("deleted-behind-hub.json")[6]["object"]
    kube_events = json.loads((RECORDED / "events-deleted-behind-hub.json").read_text())["items"]
    clock = Clock(scheduled(pod) + 60)
    recorder = await recorder_for(store, FakeApi(pods=[pod], events=kube_events), clock)
    recorder.on_pod("ADDED", pod)
    await recorder.reconcile()  # seen running at +60
    clock.now += 600
    recorder.api.pods = []
    if why == "events expired":  # the API server keeps Events an hour by default
        recorder.api.events = []
    else:  # a hub whose role may not read Events: logged once, never stuck open
        recorder.api.events_forbidden = True
    await recorder.reconcile()
    await settled(recorder)
    closed = store.get(uid(pod))
    assert (closed.end, closed.end_source) == (scheduled(pod) + 60, "last-seen")
    await recorder.stop()


async def test_a_scheduled_pod_the_watch_missed_is_opened_by_the_reconciliation(store):
    pod = watch_events("deleted-behind-hub.json")[6]["object"]
    recorder = await recorder_for(store, FakeApi(pods=[pod]), Clock(scheduled(pod) + 5))
    await recorder.reconcile()
    (opened,) = store.open_intervals()
    assert (opened.uid, opened.start) == (uid(pod), scheduled(pod))
    assert store.last_seen(uid(pod)) == scheduled(pod) + 5
    await recorder.stop()


async def test_pods_of_other_namespaces_and_unscheduled_pods_are_not_recorded(store):
    events = watch_events("stopped-by-hub.json")
    recorder = await recorder_for(store, FakeApi())
    other = json.loads(json.dumps(events[6]["object"]))
    other["metadata"]["namespace"] = "other-hub"
    recorder.on_pod("MODIFIED", other)
    recorder.on_pod("ADDED", events[0]["object"])  # not scheduled yet
    await settled(recorder)
    assert store.open_intervals() == []
    await recorder.stop()


async def test_a_failed_write_is_logged_once_and_written_at_the_next_heartbeat(store, caplog):
    caplog.set_level(logging.INFO, "test.accounting")
    checking = ThreadCheckingStore(store)
    checking.failures = 2  # the first open, then its first retry
    events = watch_events("stopped-by-hub.json")
    running = events[6]["object"]
    api = FakeApi(pods=[running])
    recorder = await recorder_for(checking, api, Clock(scheduled(running) + 10))
    recorder.on_pod("MODIFIED", running)  # never raises: the write fails on the worker
    await settled(recorder)
    assert store.open_intervals() == []
    await recorder.reconcile()  # its retry fails again
    await settled(recorder)
    warnings = [r for r in caplog.records if "Recording GPU usage (open) failed" in r.message]
    assert len(warnings) == 1
    await recorder.reconcile()  # the next heartbeat: the store answers again
    await settled(recorder)
    assert [iv.uid for iv in store.open_intervals()] == [uid(running)]
    assert any("works again" in r.message for r in caplog.records)
    await recorder.stop()


async def test_a_reconciliation_that_cannot_list_pods_closes_nothing(store):
    events = watch_events("stopped-by-hub.json")
    running = events[6]["object"]
    api = FakeApi(pods=[running])
    recorder = await recorder_for(store, api)
    recorder.on_pod("MODIFIED", running)
    api.failing = True
    with pytest.raises(kube.Retryable):
        await recorder.reconcile()
    await settled(recorder)
    assert [iv.uid for iv in store.open_intervals()] == [uid(running)]
    await recorder.stop()


def test_the_killing_time_is_the_latest_killing_event_of_that_pod():
    kube_events = json.loads((RECORDED / "events-deleted-behind-hub.json").read_text())["items"]
    pod_uid = kube_events[0]["involvedObject"]["uid"]
    (killing,) = [e for e in kube_events if e["reason"] == "Killing"]
    assert killing_time(kube_events, pod_uid) == epoch(killing["lastTimestamp"])
    assert killing_time(kube_events, "another-pod") is None
    later = {**killing, "lastTimestamp": "2030-01-01T00:00:00Z"}
    assert killing_time([*kube_events, later], pod_uid) == epoch("2030-01-01T00:00:00Z")


async def test_the_metric_counts_closed_and_open_intervals_and_never_goes_down(store):
    events = watch_events("stopped-by-hub.json")
    pod = events[-1]["object"]
    start = scheduled(pod)
    clock = Clock(start + 100)
    recorder = await recorder_for(store, FakeApi(), clock)
    recorder.on_pod("MODIFIED", events[6]["object"])
    await settled(recorder)
    assert recorder.totals() == {("a100", ""): 100.0}  # open: counted up to now
    recorder.on_pod("DELETED", pod)  # it ended a few seconds after it started
    await settled(recorder)
    ended = store.get(uid(pod)).end - start
    assert ended < 100
    # A counter must not go down: the scrape at +100 already counted more.
    assert recorder.totals() == {("a100", ""): 100.0}
    await recorder.stop()
    # A hub started afresh counts from the store.
    again = await recorder_for(store, FakeApi(), clock)
    await again.reconcile()
    assert again.totals() == {("a100", ""): ended}
    await again.stop()


def test_the_hub_database_is_the_one_the_spawners_row_lives_in(tmp_path):
    import sqlalchemy
    from jupyterhub import orm
    from sqlalchemy.orm import Session

    url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    engine = sqlalchemy.create_engine(url)
    orm.Base.metadata.create_all(engine)  # JupyterHub's own tables
    db = Session(engine)
    user = orm.User(name="ada")
    db.add(user)
    db.commit()
    row = orm.Spawner(user=user, name="")
    db.add(row)
    db.commit()

    class Spawner:
        orm_spawner = row

    assert hub_database_url(Spawner()) == url
    assert hub_database_url(object()) == ""  # no ORM row (a mock spawner): no hub database
    db.close()
    engine.dispose()


async def test_the_usage_database_url_defaults_to_the_environment_the_services_read(
    monkeypatch, offline_kubeconfig
):
    """The chart's way for a URL with a password: $GPUSPAWNER_ACCOUNTING_DB_URL from a Secret,
    read by the hub as by the culler and the GPU page, so all three use one database."""
    from traitlets.config import Config

    from gpuspawner.core.hubconfig import ACCOUNTING_DB_URL_ENV

    from .test_spawner import make_spawner

    url = "postgresql://gpuspawner@db.example.org/usage"
    monkeypatch.setenv(ACCOUNTING_DB_URL_ENV, url)
    assert make_spawner(Config()).accounting_db_url == url
    monkeypatch.delenv(ACCOUNTING_DB_URL_ENV)
    assert make_spawner(Config()).accounting_db_url == ""
