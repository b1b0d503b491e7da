"""GPUSpawner's use of the hub's GPU capacity: admission, live figures, the queue, stuck pods.

:class:`Capacity` is a collaborator of :class:`~gpuspawner.hub.spawner.GPUSpawner`
with explicit inputs: the hub's :class:`~gpuspawner.hub.state.HubState` (locks,
reservations, the queue) when it is made, and per call the inventory, the
catalog, the request and the admin's settings. It reads nothing of the
spawner. The decisions themselves live in the pure modules
:mod:`gpuspawner.core.limits`, :mod:`gpuspawner.core.admission` and
:mod:`gpuspawner.inventory.figures`; this is the wiring to the hub's shared
watch of nodes and pods.

:class:`CapacityConfig` holds the admin's settings; GPUSpawner inherits it, so
they are configured as ``c.GPUSpawner.gpu_queue_enabled`` and so on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from traitlets import Bool, Float, Unicode
from traitlets.config import Configurable

from ..core import admission, limits
from ..core.catalog import Catalog
from ..core.options import Selection
from ..core.placement import Placement
from ..core.refusals import REASON_NO_CAPACITY, REASON_USAGE_UNKNOWN, Refusal, refuse
from ..inventory import figures as inventory_figures
from ..inventory.model import Availability
from ..inventory.reflectors import ALL_NAMESPACES_DEFAULT

if TYPE_CHECKING:
    from ..inventory.reflectors import InventoryReflector
    from .state import HubState


class GPUUnschedulable(Exception):
    """The scheduler found too few free GPUs for the pod for too long."""


class CapacityConfig(Configurable):
    """The admin's settings for the live inventory, the queue and failing fast on stuck pods."""

    gpu_inventory_enabled = Bool(
        True,
        help="""
        Keep a live inventory of the cluster's GPUs (one watch of nodes and one
        of pods per hub, shared by all servers) to show free GPUs per type on
        the spawn form and to refuse requests no node can hold.

        Needs cluster-wide list/watch on nodes (the ClusterRole in
        config/rbac.yaml) and list/watch on pods in the hub's namespace (its
        Role; in every namespace with ``gpu_inventory_all_namespaces``).
        Without them the hub logs one warning naming the missing permission and
        works without figures.
        """,
    ).tag(config=True)

    gpu_inventory_all_namespaces = Bool(
        ALL_NAMESPACES_DEFAULT,
        help="""
        Count the GPUs held by pods in every namespace (other hubs, batch jobs),
        not only in the hub's own. Off by default: a pod list returns every
        container's environment, often other workloads' credentials, so the
        shipped RBAC lets the hub read pods in its own namespace only. Off, GPUs
        held by other namespaces' pods look free: the figures can overstate
        what is free and a request admitted on them may wait Pending until
        gpu_unschedulable_timeout. Turn on only together with the opt-in
        cluster-wide pod read (config/rbac-opt-in-all-namespaces.yaml, or
        config/z2jh-rbac-opt-in-all-namespaces.yaml with zero-to-jupyterhub);
        the gpuspawner service follows this setting.
        """,
    ).tag(config=True)

    gpu_figures_service = Unicode(
        "gpuspawner",
        help="""
        The hub-managed service the spawn form polls for live GPU figures
        (``python -m gpuspawner.userservice``; add it with
        ``gpuspawner.userservice.hubconfig.add_service(c)``). When no service of
        this name is configured, or the form is not KubeSpawner's own (e.g.
        jupyterhub-fancy-profiles), the figures are those of the page load and
        say the time they were counted.
        """,
    ).tag(config=True)

    gpu_queue_enabled = Bool(
        False,
        help="""
        What happens to a GPU request no node can hold right now (but one
        could, once GPUs are freed). False (the default): it is refused at once
        with the current figures. True: it waits in the hub, first come first
        served per GPU type, with a progress message naming its place, for at
        most ``gpu_queue_timeout`` seconds; no pod exists while it waits.

        A request larger than any node can ever hold is always refused.
        """,
    ).tag(config=True)

    kueue_queue = Unicode(
        "",
        help="""
        The Kueue LocalQueue (in the hub's namespace) that GPU servers wait in,
        e.g. ``"gpu-notebooks"``. Empty (the default): Kueue is not used.

        Set, each GPU server's pod carries Kueue's queue label and a
        WorkloadPriorityClass (``kueue_priority_class``) and waits, gated, until
        Kueue admits it against its ClusterQueue's quota, shared with other hubs
        and batch Jobs. The hub's own queue (``gpu_queue_enabled``) steps aside;
        per-user and per-group limits, budgets, image access and the GPU check
        stay GPUSpawner's. A request no quota could ever admit is refused at
        once. A request waits at most ``gpu_queue_timeout`` seconds; its progress
        page shows its place. Needs Kueue's pod integration and the hub's
        Kueue rights (docs/kueue.md).
        """,
    ).tag(config=True)

    kueue_priority_class = Unicode(
        "gpuspawner-interactive",
        help="""
        The Kueue WorkloadPriorityClass of GPU servers' pods (with ``kueue_queue``).
        The sandbox and docs/kueue.md create ``gpuspawner-interactive`` above
        ``gpuspawner-batch``, so notebooks go before batch work of the same
        ClusterQueue. Empty: the pods name none (Kueue's default priority).
        """,
    ).tag(config=True)

    gpu_queue_timeout = Float(
        300,
        help="""
        The longest a queued GPU request waits for free GPUs, in seconds
        (with ``gpu_queue_enabled``, or in Kueue with ``kueue_queue``). Keep it below ``start_timeout`` minus the
        time a server needs to start, or the hub's own timeout ends the wait
        with a less helpful message.
        """,
    ).tag(config=True)

    gpu_unschedulable_timeout = Float(
        60,
        help="""
        How long a GPU pod may stay unschedulable for lack of free GPUs
        (the scheduler's "Insufficient nvidia.com/gpu") before the spawn fails
        with the scheduler's reason and the pod is deleted, in seconds. Keep it
        well under ``start_timeout``. While it waits, the progress page shows
        the reason in plain words. 0 turns fast failure off.
        """,
    ).tag(config=True)

    gpu_demand_window = Float(
        600,
        help="""
        How long a GPU request refused for lack of free GPUs still counts as
        demand, in seconds. The hub publishes its demand (queued requests,
        requests refused within this window, GPU pods waiting for the
        scheduler) on its metrics, by GPU type and count and never by user;
        the culler's pressure mode reads it to free idle GPUs for the people
        waiting. A user refused several times counts once; their entry goes
        when they are admitted. 0: refusals are not counted as demand.
        """,
    ).tag(config=True)

    def queue_settings(self) -> QueueSettings:
        """The queue's settings as they are now, for :meth:`Capacity.admit`."""
        return QueueSettings(
            enabled=self.gpu_queue_enabled,
            timeout=self.gpu_queue_timeout,
            demand_window=self.gpu_demand_window,
        )


@dataclass(frozen=True)
class QueueSettings:
    """The admin's queue settings (``gpu_queue_enabled``, ``gpu_queue_timeout``)."""

    enabled: bool = False
    timeout: float = 300
    #: How long a refusal for lack of GPUs counts as demand (``gpu_demand_window``).
    demand_window: float = 600


@dataclass(frozen=True)
class Requester:
    """Who asks: the user, their groups and the server's name ("" for the default server)."""

    user: str
    groups: tuple[str, ...]
    server: str
    #: The server's pod (``namespace/name``), to tell when its GPUs show on a node.
    pod: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.server)


def figures(
    inventory: InventoryReflector | None,
    catalog: Catalog,
    placement: Placement,
    *,
    promised: HubState | None = None,
    besides: tuple[str, str] | None = None,
) -> dict[str, Availability] | None:
    """Live figures per GPU type of the catalog; None while the inventory is unavailable.

    With ``promised`` (the hub's state), GPUs promised to admitted requests
    whose pods are not on a node yet count as taken (see
    :func:`~gpuspawner.core.admission.after_claims`); ``besides`` leaves out one
    request's own promise.
    """
    found = inventory_figures.live_figures(inventory, catalog, placement)
    if found is None or promised is None:
        return found

    def placed(pod_key: str) -> bool:
        record = inventory.inventory.pods.get(pod_key) if pod_key else None
        return record is not None and bool(record.node)

    return {
        key: admission.after_claims(
            availability, promised.claims(key, placed=placed, besides=besides)
        )
        for key, availability in found.items()
    }


class Capacity:
    """One spawner's share of the hub's GPUs: admission, its place in the queue, its pod's scheduling.

    ``clock`` (monotonic seconds) is injectable so tests can move time.
    """

    def __init__(
        self,
        state: HubState,
        log: logging.Logger | logging.LoggerAdapter,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.state = state
        self.log = log
        self.clock = clock
        #: The progress message while the request waits in the queue ("" otherwise).
        self.queue_message = ""
        #: The scheduler's verdict while the pod is unschedulable (None otherwise).
        self.unschedulable: admission.Unschedulable | None = None
        self._unschedulable_since: float | None = None

    # ------------------------------------------------------------------
    # admission
    # ------------------------------------------------------------------

    async def admit(
        self,
        catalog: Catalog,
        selection: Selection,
        requester: Requester,
        *,
        holdings: Callable[[bool], Awaitable[list[limits.Holding]]],
        inventory: InventoryReflector | None,
        placement: Placement,
        queue: QueueSettings,
        who: str,
        budget: Callable[[list[limits.Holding]], Awaitable[None]] | None = None,
        kueue: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Admit a request or raise :class:`Refusal`; an admitted GPU request is reserved.

        ``holdings(every_user)`` reads the GPUs held now (every user's when a
        group pool applies). ``budget(held)``, after the limits and before the
        free GPUs and the queue, raises :class:`Refusal` when the user's GPU-hours
        budget cannot cover the request; it runs under the user's lock, so two
        requests of one user count each other (the first one's reservation).
        The reservation is the caller's to release when the spawn ends; it is
        released here when admission fails while waiting.

        ``kueue()`` (with ``kueue_queue``) raises :class:`Refusal` when no quota of
        the cluster's queue could ever admit the request; then the hub's own queue
        steps aside: a request that fits a node's capacity is admitted to wait in
        Kueue, and only one no node could ever hold is refused here.
        """
        if not selection.is_gpu:
            return
        user, groups, server = requester.user, list(requester.groups), requester.server
        pools = limits.pool_groups_for(catalog.limits, groups)

        def check_limits(held: list[limits.Holding]) -> None:
            limits.check_request(
                catalog=catalog,
                user=user,
                groups=groups,
                server=server,
                selection=selection,
                holdings=held,
            )

        # A request over the user's limit even with nothing held is refused
        # without asking the cluster (and before taking any lock).
        check_limits([])
        # Locks are always taken in the same order (pools sorted, then the
        # user) so two users sharing a pool cannot deadlock.
        held_locks = [self.state.lock(f"pool:{g}") for g in pools] + [
            self.state.lock(f"user:{user}")
        ]
        for lock in held_locks:
            await lock.acquire()
        try:
            try:
                held = await holdings(bool(pools))
            except Exception as e:
                self.log.error("Could not list GPU pods to check %s's limit: %s", user, e)
                raise refuse(REASON_USAGE_UNKNOWN, "cluster-silent") from None
            check_limits(held)
            if budget is not None:
                await budget(held)
            if kueue is not None:
                await kueue()
            # What the user may still take of the type: their demand, if refused, is capped at it.
            allowance = (
                limits.remaining(catalog, user, groups, server, held).get(selection.gpu_type.key)
                if selection.gpu_type is not None
                else None
            )
            try:
                verdict = await self.check(
                    inventory,
                    catalog,
                    selection,
                    placement,
                    queueing=queue.enabled or kueue is not None,
                    besides=requester.key,
                )
                if kueue is not None:
                    # Kueue holds the request from here: the hub neither waits nor counts it.
                    verdict = admission.Verdict(wait=False)
            except Refusal as refusal:
                self._count_demand(refusal, requester, selection, queue, allowance)
                raise
            self.state.forget_refusals(user)
            self.state.reserve(
                replace(limits.holding_for(user, server, selection, pools), pod=requester.pod)
            )
        finally:
            for lock in reversed(held_locks):
                lock.release()
        if verdict.wait:
            try:
                await self.wait_for_gpus(
                    inventory,
                    catalog,
                    selection,
                    placement,
                    timeout=queue.timeout,
                    who=who,
                    requester=requester,
                )
            except Refusal as refusal:
                self.state.release(user, server)
                self._count_demand(refusal, requester, selection, queue, allowance)
                raise
            except BaseException:
                # Cancelled (the user gave up): the GPUs are not held, and nobody waits.
                self.state.release(user, server)
                raise

    def _count_demand(
        self,
        refusal: Refusal,
        requester: Requester,
        selection: Selection,
        queue: QueueSettings,
        allowance: float | None,
    ) -> None:
        """Remember a request refused for lack of free GPUs as demand, for ``demand_window``.

        ``allowance``: how many GPUs of the type the user may still take, the
        most their demand counts for however many servers they ask from.
        """
        if refusal.reason != REASON_NO_CAPACITY or selection.gpu_type is None:
            return
        if queue.demand_window > 0:
            self.state.record_refusal(
                requester.user,
                requester.server,
                selection.gpu_type.key,
                selection.gpus,
                until=self.clock() + queue.demand_window,
                allowance=allowance,
            )

    async def check(
        self,
        inventory: InventoryReflector | None,
        catalog: Catalog,
        selection: Selection,
        placement: Placement,
        *,
        queueing: bool,
        besides: tuple[str, str] | None = None,
    ) -> admission.Verdict:
        """Whether a node can hold the request now (or ever); raises :class:`Refusal` if not.

        GPUs promised to other admitted requests count as taken (``besides``:
        the asking server, whose own promise does not count against it).
        """
        if not selection.is_gpu or selection.gpu_type is None:
            return admission.Verdict(wait=False)
        if inventory is None or not await inventory.wait_ready(timeout=10):
            return admission.Verdict(wait=False)
        found = figures(inventory, catalog, placement, promised=self.state, besides=besides)
        if found is None or selection.gpu_type.key not in found:
            return admission.Verdict(wait=False)
        others = inventory_figures.alternatives(
            catalog, selection.image, selection.gpu_type.key, selection.gpus, found
        )
        return admission.check_capacity(
            selection.gpu_type.display_name,
            selection.gpus,
            found[selection.gpu_type.key],
            others,
            queueing=queueing,
        )

    async def wait_for_gpus(
        self,
        inventory: InventoryReflector,
        catalog: Catalog,
        selection: Selection,
        placement: Placement,
        *,
        timeout: float,
        who: str,
        requester: Requester | None = None,
    ) -> None:
        """Wait in the hub's queue until a node can take the request, at most ``timeout`` seconds.

        It wakes on every change of the inventory, so it starts as soon as
        freed GPUs (a culled server's pod going away) show; GPUs promised to
        requests that left the queue before it, and are not on a node yet,
        count as taken.
        """
        assert selection.gpu_type is not None
        type_key, name = selection.gpu_type.key, selection.gpu_type.display_name
        queue = self.state.wait_queue
        besides = requester.key if requester else None
        queue.join(type_key, self, selection.gpus, owner=besides)
        deadline = self.clock() + timeout
        try:
            while True:
                found = figures(inventory, catalog, placement, promised=self.state, besides=besides)
                availability = (found or {}).get(type_key)
                if availability is None or queue.may_start(type_key, self, availability):
                    break
                place, waiting = queue.place(type_key, self)
                self.queue_message = admission.queue_message(
                    name, selection.gpus, availability, place, waiting
                )
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise admission.busy_refusal(
                        name, selection.gpus, availability, {}, waited=timeout
                    )
                await inventory.wait_for_change(timeout=min(remaining, 5))
        finally:
            queue.leave(type_key, self)
            self.queue_message = ""
        self.log.info("%s leaves the GPU queue for %s", who, name)

    # ------------------------------------------------------------------
    # the pod's scheduling
    # ------------------------------------------------------------------

    def start_over(self) -> None:
        """Forget the previous spawn's scheduling (a new spawn starts)."""
        self.unschedulable = None
        self._unschedulable_since = None

    def scheduling_progress(self, timeout: float) -> str:
        """The progress message while the pod is unschedulable (see :meth:`watch_scheduling`)."""
        assert self.unschedulable is not None
        message = self.unschedulable.message
        if self.unschedulable.insufficient_gpus and timeout > 0:
            now = self.clock()
            waited = now - (self._unschedulable_since or now)
            left = max(timeout - waited, 0)
            message += f" Giving up in {left:.0f} s unless GPUs are freed."
        return message

    def watch_scheduling(
        self, pod: dict, selection: Selection | None, *, timeout: float, who: str
    ) -> None:
        """Follow the scheduler's verdict on a Pending pod; raise :class:`GPUUnschedulable`
        when it has waited ``timeout`` seconds (0: forever) for GPUs."""
        raw = admission.unschedulable_message(pod)
        if raw is None:
            self.start_over()
            return
        gpu_type = selection.gpu_type if selection else None
        name = f"{gpu_type.display_name} GPUs" if gpu_type else ""
        resources: Iterable[str] = {gpu_type.resource} if gpu_type else set()
        self.unschedulable = admission.explain_unschedulable(raw, resources, name)
        if not self.unschedulable.insufficient_gpus:
            self._unschedulable_since = None
            return
        now = self.clock()
        if self._unschedulable_since is None:
            self._unschedulable_since = now
            self.log.info("Pod of %s waits for GPUs: %s", who, raw)
        if timeout > 0 and now - self._unschedulable_since >= timeout:
            raise GPUUnschedulable(self.unschedulable.message)
