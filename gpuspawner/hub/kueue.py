"""The hub's view of its Kueue LocalQueue: where waiting notebooks stand, what blocks them.

With ``c.GPUSpawner.kueue_queue`` set, a GPU server's pod waits in Kueue (gated)
instead of in the hub. Each waiting spawner asks :class:`KueueView` for its
place on every progress tick; the view answers from what it read last, and
reads again every ``interval`` seconds only while someone waits: one request
for the LocalQueue's pending workloads, one for the ClusterQueue's (what is
ahead, counted as notebooks and jobs; needs the hub's optional ClusterRole,
without it only the LocalQueue counts), and one list of the namespace's
Workloads (why each waits). The meaning of every object is
:mod:`gpuspawner.core.kueue`'s.

It also remembers pods Kueue preempted (from the inventory's pod watch), so a
server whose pod vanished before the hub polled it still says why it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..clients import kube
from ..clients.kueue import KueueClient
from ..core import kueue
from ..core.serverpod import pod_stop_notice
from ..core.stopreasons import REASON_PREEMPTED, StopNotice

#: How long the quotas read for the "never fits" check are reused, in seconds.
QUOTA_TTL = 30.0
#: How long a preempted pod's notice is kept for its spawner to find, in seconds.
PREEMPTED_TTL = 3600.0


@dataclass(frozen=True)
class Quotas:
    """What the "never fits" check reads: the ClusterQueues of the cohort and the flavors' labels."""

    cluster_queue: str
    queues: tuple[kueue.ClusterQueueStatus, ...]
    flavor_labels: dict[str, dict[str, str]]


class KueueView:
    """One hub's reads of its LocalQueue, shared by its spawners (see the module's doc)."""

    def __init__(
        self,
        client: KueueClient,
        namespace: str,
        queue: str,
        log: logging.Logger | logging.LoggerAdapter,
        *,
        interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.client = client
        self.namespace = namespace
        self.queue = queue
        self.log = log
        self.interval = interval
        self.clock = clock
        self._waiters: set[str] = set()
        self._places: dict[str, kueue.Place] = {}
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._cluster_queue = ""
        self._cluster_listing_refused = False
        self._failed = False
        self._quotas: Quotas | None = None
        self._quotas_read: float | None = None
        self._quotas_refused = False
        #: ``namespace/name`` -> (the pod's preemption notice, when it was heard of)
        self._preempted: dict[str, tuple[StopNotice, float]] = {}
        #: The inventory reflector whose pod watch tells :meth:`note_pod` (set by the spawner).
        self.listening_to: object | None = None

    # -- places --------------------------------------------------------------

    def wait(self, pod_uid: str) -> None:
        """Start following a waiting pod's place (reads begin, or go on)."""
        if not pod_uid:
            return
        new = pod_uid not in self._waiters
        self._waiters.add(pod_uid)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._follow())
        elif new:
            # A new waiter is read at once; one already followed waits for the next
            # read (each spawner calls this on every progress tick).
            self._wake.set()

    def done(self, pod_uid: str) -> None:
        """Stop following a pod (admitted, cancelled or gone)."""
        self._waiters.discard(pod_uid)
        self._places.pop(pod_uid, None)

    def place(self, pod_uid: str) -> kueue.Place | None:
        """The pod's place as last read, or None (not read yet, or not listed)."""
        return self._places.get(pod_uid)

    async def _follow(self) -> None:
        while self._waiters:
            # Cleared before the read: a waiter that comes during it is read next, at once.
            self._wake.clear()
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the places are a nicety: log once, go on
                if not self._failed:
                    self._failed = True
                    self.log.warning("Could not read Kueue's queue %r: %s", self.queue, e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)

    async def refresh(self) -> None:
        """Read the LocalQueue's and ClusterQueue's pending workloads and the namespace's Workloads once."""
        if not self._cluster_queue:
            local_queue = await self.client.local_queue(self.namespace, self.queue)
            spec = local_queue.get("spec") if isinstance(local_queue, dict) else None
            self._cluster_queue = str((spec or {}).get("clusterQueue") or "")
        # Kueue v0.17 lists a LocalQueue's name across namespaces: keep this hub's own.
        local = [
            entry
            for entry in await self.client.pending_in_local_queue(self.namespace, self.queue)
            if entry.namespace == self.namespace
        ]
        cluster = None
        if self._cluster_queue and not self._cluster_listing_refused:
            try:
                cluster = await self.client.pending_in_cluster_queue(self._cluster_queue)
            except kube.Refused:
                # Without the optional ClusterRole: the LocalQueue's order only.
                self._cluster_listing_refused = True
                self.log.info(
                    "The hub may not list ClusterQueue %r's pending workloads; "
                    "progress pages count this hub's queue only",
                    self._cluster_queue,
                )
        # Only the waiting pods' Workloads (Kueue labels each with its pod's uid), not
        # every running notebook's.
        selector = kueue.workloads_selector(self._waiters)
        blocking = {
            kueue.workload_owner_uid(w): kueue.blocking_reason(w)
            for w in (await self.client.workloads(self.namespace, selector) if selector else [])
        }
        places = {}
        for uid in self._waiters:
            found = kueue.place_of(
                uid, local, cluster, self._cluster_queue, blocked_by=blocking.get(uid, "")
            )
            if found is not None:
                places[uid] = found
        self._places = places
        self._failed = False

    # -- quotas, for requests that could never be admitted ---------------------

    async def quotas(self) -> Quotas | None:
        """The LocalQueue's ClusterQueue and its cohort, and the flavors' labels (cached briefly).

        None when the hub may not read the cluster-wide objects (the optional
        ClusterRole, docs/kueue.md): no quota is known then, and Kueue alone
        decides (said once in the log). Raises
        :class:`~gpuspawner.clients.kube.NotFound` when the LocalQueue or its
        ClusterQueue does not exist, and the client's other errors (``Refused``
        for the LocalQueue itself) when the cluster does not answer.
        """
        now = self.clock()
        if self._quotas_read is not None and now - self._quotas_read < QUOTA_TTL:
            return self._quotas
        local_queue = await self.client.local_queue(self.namespace, self.queue)
        name = str(
            ((local_queue.get("spec") or {}) if isinstance(local_queue, dict) else {}).get(
                "clusterQueue"
            )
            or ""
        )
        if not name:
            raise kube.NotFound(f"LocalQueue {self.queue!r} names no ClusterQueue", 404)
        self._cluster_queue = name
        listed = True
        try:
            try:
                objects = await self.client.cluster_queues()
            except kube.Refused:
                listed = False
                objects = [await self.client.cluster_queue(name)]
            flavors = await self.client.resource_flavors()
        except kube.Refused as e:
            return self._quotas_unknown(f"it may not read ClusterQueues or ResourceFlavors ({e})")
        queues = tuple(q for q in map(kueue.cluster_queue_status, objects) if q is not None)
        own = next((q for q in queues if q.name == name), None)
        if own is None:
            raise kube.NotFound(f"ClusterQueue {name!r} does not exist", 404)
        if not listed and own.cohort:
            # What it may borrow from the cohort's other queues is unknown: its own quota
            # alone would refuse requests that Kueue admits.
            return self._quotas_unknown(
                f"it may not list the ClusterQueues of cohort {own.cohort!r}"
            )
        self._quotas = Quotas(name, queues, kueue.flavor_node_labels(flavors))
        self._quotas_read = now
        return self._quotas

    def _quotas_unknown(self, why: str) -> None:
        if not self._quotas_refused:
            self._quotas_refused = True
            self.log.info(
                "The hub does not check GPU requests against Kueue's quotas: %s; "
                "Kueue alone decides (a request no quota can hold waits until gpu_queue_timeout)",
                why,
            )
        self._quotas = None
        self._quotas_read = self.clock()
        return None

    # -- preemption -------------------------------------------------------------

    def note_pod(self, kind: str, pod: dict) -> None:
        """An inventory pod listener: remember pods Kueue preempted, by ``namespace/name``."""
        if not kueue.was_preempted(pod):
            return
        notice = pod_stop_notice(pod)  # the one reading of why a pod stops: when and why
        if notice is None:
            notice = StopNotice(REASON_PREEMPTED, time.time(), detail=kueue.preemption_cause(pod))
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        now = self.clock()
        self._preempted = {k: v for k, v in self._preempted.items() if now - v[1] < PREEMPTED_TTL}
        self._preempted[key] = (notice, now)

    def preemption_notice(self, pod_key: str) -> StopNotice | None:
        """Why and when Kueue preempted the pod ``namespace/name``, once; None if it did not."""
        found = self._preempted.pop(pod_key, None)
        return found[0] if found else None

    # -- lifecycle ----------------------------------------------------------------

    def cancel(self) -> None:
        self._waiters.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None
