"""The hub's usage recorder: each GPU server's allocation interval, written to the usage store.

One :class:`AccountingRecorder` per hub process, kept by
:class:`~gpuspawner.hub.state.HubState` like the inventory. It is fed the pods
the inventory's watch sees (:meth:`~gpuspawner.inventory.reflectors.InventoryReflector.add_pod_listener`):
an interval is opened when a GPU server's pod is scheduled, and closed from the
pod's own end (:func:`gpuspawner.core.usage.interval_from_pod`). At its start
and every ``heartbeat`` seconds it reconciles the store with the cluster, so
that nothing the watch missed (the hub was down, the watch was broken) stays
open:

- the hub's server pods are listed once (:mod:`gpuspawner.clients.kube`): a
  scheduled pod without an interval gets one, an ended one is closed from its
  own times, and the open intervals of running pods are *touched* (their
  last-seen time);
- an open interval whose pod is gone is closed from the pod's Kubernetes
  Events (reason ``Killing``, the kubelet stopping its containers: when the
  pod was deleted while the hub was down), else at its last-seen time.

Every store call runs on one worker thread, in order, so the hub's event loop
never waits for the database and a close queued after an open is written after
it. A failed write is logged once per kind (open, close, touch, reconcile) and
tried again at the next heartbeat; nothing here raises into a spawn.

The metric ``gpuspawner_gpu_seconds_total{gpu_type,group}`` reads
:meth:`AccountingRecorder.totals`: the closed intervals' totals, cached from
the store after each close, plus the open intervals up to the scrape.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..clients import kube
from ..core import serverpod, usage
from ..core.usage import Interval

if TYPE_CHECKING:
    from ..accounting.store import UsageStore
    from ..inventory.reflectors import InventoryReflector

T = TypeVar("T")

#: The kubelet's Event when it stops a pod's containers; its time is the pod's end
#: for an interval whose pod was deleted while the hub was not watching.
KILLING_REASON = "Killing"


def hub_database_url(spawner: Any) -> str:
    """The URL of the database JupyterHub itself uses ("" when it cannot be told).

    Read from the session that holds the spawner's own ORM row (SQLAlchemy's
    public ``inspect``), so it is the database the hub really connected to,
    ``JupyterHub.db_url`` as configured or by default (``Spawner.db``, the
    shared session, is deprecated). With a password: the store connects with it.
    """
    try:
        from sqlalchemy import inspect

        session = inspect(spawner.orm_spawner).session
        if session is None:
            return ""
        return session.get_bind().url.render_as_string(hide_password=False)
    except Exception:  # no ORM row (a mock spawner, a test): no hub database to share
        return ""


def _event_time(event: Mapping[str, Any]) -> float | None:
    """When a core/v1 Event last happened (events.k8s.io's eventTime, else the legacy times)."""
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        when = serverpod.parse_timestamp(event.get(key))
        if when is not None:
            return when
    return serverpod.parse_timestamp((event.get("metadata") or {}).get("creationTimestamp"))


def killing_time(events: Iterable[Mapping[str, Any]], uid: str) -> float | None:
    """The latest ``Killing`` Event's time of the pod ``uid``, or None."""
    times = [
        _event_time(e)
        for e in events
        if e.get("reason") == KILLING_REASON and (e.get("involvedObject") or {}).get("uid") == uid
    ]
    return max((t for t in times if t is not None), default=None)


class AccountingRecorder:
    """Records GPU servers' allocation intervals in a :class:`~gpuspawner.accounting.store.UsageStore`.

    ``store`` makes the store: called on the worker thread, so importing the
    database driver and connecting never hold up the hub's loop, and again at
    each heartbeat until it works; the store is migrated before its first use.
    ``reader`` and ``api`` list the hub's pods and events in ``namespace``
    (the ``kubernetes_asyncio`` ``CoreV1Api`` the hub already uses).
    """

    def __init__(
        self,
        store: Callable[[], UsageStore],
        reader: kube.Reader,
        namespace: str,
        log: logging.Logger | None = None,
        *,
        api: Any,
        heartbeat: float = 60.0,
        clock: Callable[[], float] = time.time,
    ):
        self._make_store = store
        self.store: UsageStore | None = None
        self._migrated = False
        self.reader = reader
        self.api = api
        self.namespace = namespace
        self.log = log or logging.getLogger("gpuspawner.accounting")
        self.heartbeat = heartbeat
        self.clock = clock
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gpuspawner-accounting"
        )
        self._task: asyncio.Future | None = None
        self._inventory: InventoryReflector | None = None
        #: Open intervals as the hub knows them (for the metric), by pod uid.
        self._open: dict[str, Interval] = {}
        #: Uids whose close has been queued: later events of the same pod write nothing.
        self._closed: set[str] = set()
        #: Writes that failed, tried again at the next heartbeat: uid -> (interval, end, source).
        self._retry: dict[str, tuple[Interval, float | None, str]] = {}
        #: GPU-seconds of closed intervals per (gpu_type, group), read from the store after each close.
        self._closed_totals: dict[tuple[str, str], float] = {}
        #: The last totals the metric reported: a counter never goes down (see totals()).
        self._reported: dict[tuple[str, str], float] = {}
        #: The kinds of write that are failing now, each logged once until it works again.
        self._failing: set[str] = set()
        #: Reconciliations done (tests wait for one).
        self.reconciled = 0
        self._reconciled = asyncio.Event()

    # -- the worker thread ------------------------------------------------

    def _ready_store(self) -> UsageStore:
        """The migrated store (on the worker thread); raises while it cannot be opened."""
        if self.store is None:
            self.store = self._make_store()
        if not self._migrated:
            self.store.migrate()
            self._migrated = True
        return self.store

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(store, *args)`` on the worker thread, after the writes queued before it."""
        return await asyncio.wrap_future(
            self._executor.submit(lambda: function(self._ready_store(), *args))
        )

    def _worked(self, kind: str) -> None:
        if kind in self._failing:
            self._failing.discard(kind)
            self.log.info("Recording GPU usage (%s) works again", kind)

    def _failed(self, kind: str, error: BaseException) -> None:
        if kind not in self._failing:
            self._failing.add(kind)
            self.log.warning(
                "Recording GPU usage (%s) failed; trying again every %.0f s: %s",
                kind,
                self.heartbeat,
                error,
            )

    def _write(self, iv: Interval, end: float | None, source: str) -> None:
        """Queue the interval's open (and close, with ``end``), retried at the heartbeat if it fails."""
        kind = "open" if end is None else "close"

        def work() -> dict[tuple[str, str], float] | None:
            store = self._ready_store()
            store.open(iv)
            if end is None:
                return None
            store.close(iv.uid, end, source)
            return store.closed_totals()

        def done(future: concurrent.futures.Future) -> None:
            error = future.exception()
            if error is not None:
                self._retry[iv.uid] = (iv, end, source)
                self._failed(kind, error)
                return
            self._worked(kind)
            # A written close also settles an open still waiting to be tried again.
            if end is not None or self._retry.get(iv.uid) == (iv, end, source):
                self._retry.pop(iv.uid, None)
            totals = future.result()
            if totals is not None:
                self._closed_totals = totals

        def back_on_loop(future: concurrent.futures.Future) -> None:
            # A loop that has ended (the hub stopped) has no state left to update.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done, future)

        # The callback runs on the loop: the recorder's state is only changed there.
        loop = asyncio.get_running_loop()
        self._executor.submit(work).add_done_callback(back_on_loop)

    # -- pods -------------------------------------------------------------

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return (
            serverpod.is_managed(pod)
            and (pod.get("metadata") or {}).get("namespace", self.namespace) == self.namespace
        )

    def on_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        """A pod the inventory's watch saw (``LISTED``, ``ADDED``, ``MODIFIED`` or ``DELETED``)."""
        if not self._ours(pod):
            return
        iv = usage.interval_from_pod(pod, vanished=kind == "DELETED")
        if iv is not None:
            self._record(iv)

    def _record(self, iv: Interval) -> None:
        if iv.uid in self._closed:
            return
        if iv.end is None:
            if iv.uid not in self._open:
                self._open[iv.uid] = iv
                self._write(iv, None, "")
            return
        self._close(iv, iv.end, iv.end_source or "pod")

    def _close(self, iv: Interval, end: float, source: str) -> None:
        self._closed.add(iv.uid)
        self._open.pop(iv.uid, None)
        self._write(iv, end, source)

    def listen_to(self, inventory: InventoryReflector) -> None:
        """Follow the pods ``inventory``'s watch sees (once per inventory)."""
        if self._inventory is not inventory:
            self._inventory = inventory
            inventory.add_pod_listener(self.on_pod)

    # -- reconciling ------------------------------------------------------

    async def _pods(self) -> list[dict]:
        return await self.reader.pods(
            self.api, namespace=self.namespace, selector=serverpod.selector()
        )

    async def _killing_time(self, uid: str) -> float | None:
        """When the kubelet began to stop pod ``uid``; None when its Events are gone (they are
        kept an hour by default) or may not be read. Other errors raise: tried again later."""
        try:
            listing = await self.reader.list_all(
                self.api.list_namespaced_event,
                self.namespace,
                what=f"Listing the Events of pod {uid} in namespace {self.namespace}",
                field_selector=f"involvedObject.uid={uid},reason={KILLING_REASON}",
            )
        except kube.Refused as e:
            self._failed("events", e)
            return None
        return killing_time(listing.items, uid)

    async def reconcile(self) -> None:
        """Bring the store in line with the cluster's pods (see the module's docstring)."""
        for iv, end, source in list(self._retry.values()):
            self._write(iv, end, source)
        stored = await self.call(lambda store: store.open_intervals())
        # Known before the pods are listed, so listed with them if they still exist: a pod
        # the watch reports while the list is under way is not taken for one that is gone.
        known = {iv.uid: iv for iv in stored}
        known.update((uid, iv) for uid, iv in self._open.items() if uid not in known)
        pods = await self._pods()
        now = self.clock()
        present: set[str] = set()
        running: list[str] = []
        for pod in pods:
            uid = (pod.get("metadata") or {}).get("uid") or ""
            present.add(uid)
            iv = usage.interval_from_pod(pod)
            if iv is None:
                continue
            self._record(iv)
            if iv.end is None:
                running.append(iv.uid)
        for iv in known.values():
            if iv.uid in present:
                continue
            self._open.pop(iv.uid, None)
            if iv.uid in self._closed:
                continue  # the watch's last event of the pod closed it meanwhile
            end, source = await self._killing_time(iv.uid), "event"
            if end is None:
                end, source = await self.call(lambda s, uid=iv.uid: s.last_seen(uid)), "last-seen"
            if iv.uid in self._closed:
                continue
            self._close(iv, max(iv.start, end if end is not None else iv.start), source)
        for iv in stored:
            if iv.uid in present and iv.uid not in self._closed:
                self._open.setdefault(iv.uid, iv)
        if running:
            await self.call(lambda store: store.touch(running, now))
        # Forget closed pods the API no longer has: no event of theirs can come again.
        self._closed &= present
        totals = await self.call(lambda store: store.closed_totals())
        self._closed_totals = totals
        self.reconciled += 1
        self._reconciled.set()

    async def wait_reconciled(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first reconciliation."""
        try:
            await asyncio.wait_for(self._reconciled.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self.reconcile()
                self._worked("reconcile")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed("reconcile", e)
            await asyncio.sleep(self.heartbeat)

    # -- the metric -------------------------------------------------------

    def totals(self, now: float | None = None) -> dict[tuple[str, str], float]:
        """GPU-seconds per (gpu_type, charge group): closed intervals, and open ones until ``now``.

        Never less than the last answer: a pod's end (its containers'
        ``finishedAt``) is known only after the fact, so an interval counted up
        to a scrape may close a little earlier than that scrape, and a
        Prometheus counter that goes down reads as a reset.
        """
        now = self.clock() if now is None else now
        totals = dict(self._closed_totals)
        for iv in list(self._open.values()):
            key = (iv.gpu_type, iv.charge_group)
            totals[key] = totals.get(key, 0.0) + usage.gpu_seconds(iv, iv.start, now, now)
        for key, value in totals.items():
            self._reported[key] = max(value, self._reported.get(key, 0.0))
        return dict(self._reported)

    # -- lifecycle --------------------------------------------------------

    def start(self) -> None:
        """Start reconciling (at once, then every heartbeat); on the hub's event loop."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def cancel(self) -> None:
        """Stop without waiting (the loop may not run again): queued writes still finish."""
        if self._task is not None:
            # A loop that has ended (or is shutting down) cannot schedule the cancellation;
            # its task ended with it.
            with contextlib.suppress(RuntimeError):
                self._task.cancel()
        self._executor.submit(self._dispose)
        self._executor.shutdown(wait=False)

    async def stop(self) -> None:
        """Stop reconciling, let the queued writes finish and close the store."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._executor.submit(self._dispose)
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    def _dispose(self) -> None:
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
