"""GPUSpawner's use of the live GPU inventory: figures, admission before spawning, the queue, stuck pods.

A mixin of :class:`~gpuspawner.spawner.GPUSpawner`, kept apart so the
spawner's module stays glue of one concern each. The decisions themselves live
in the pure modules :mod:`gpuspawner.admission` and
:mod:`gpuspawner.inventory.figures`; this is the wiring to the hub's shared
watch of nodes and pods.
"""

from __future__ import annotations

import time

from traitlets import Bool, Float
from traitlets.config import Configurable

from . import admission
from .catalog import Catalog, CatalogError
from .inventory import figures as inventory_figures
from .inventory.model import Availability
from .options import Refusal, Selection


class GPUUnschedulable(Exception):
    """The scheduler found too few free GPUs for the pod for too long."""


class CapacityMixin(Configurable):
    """Live GPU figures, capacity admission, the optional queue and fail-fast on unschedulable pods."""

    gpu_inventory_enabled = Bool(
        True,
        help="""
        Keep a live inventory of the cluster's GPUs (one watch of nodes and one
        of pods per hub, shared by all servers) to show free GPUs per type on
        the spawn form and to refuse requests no node can hold.

        Needs cluster-wide list/watch on nodes and pods (the ClusterRole in
        config/rbac.yaml). Without them the hub logs one warning naming the
        missing permission and works without figures.
        """,
    ).tag(config=True)

    gpu_inventory_all_namespaces = Bool(
        True,
        help="""
        Count the GPUs held by pods in every namespace (other hubs, batch jobs),
        not only in the hub's own. Turn off only if GPU nodes run nothing but
        this hub's servers and the hub may not watch pods cluster-wide.
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

    gpu_queue_timeout = Float(
        300,
        help="""
        The longest a queued GPU request waits for free GPUs, in seconds
        (with ``gpu_queue_enabled``). Keep it below ``start_timeout`` minus the
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

    _wait_queue = admission.WaitQueue()
    _queue_message: str = ""
    _unschedulable: admission.Unschedulable | None = None
    _unschedulable_since: float | None = None

    # ------------------------------------------------------------------
    # cluster capacity
    # ------------------------------------------------------------------

    def gpu_inventory(self):
        """The hub's shared GPU inventory reflector, or None when it is off."""
        if self._gpu_mock or not self.gpu_inventory_enabled or not self.gpu_catalog_configured:
            return None
        from kubespawner.clients import shared_client

        from .inventory.reflectors import InventoryReflector, shared_reflector

        def create() -> InventoryReflector:
            return InventoryReflector(
                shared_client("CoreV1Api"),
                namespace=self.namespace,
                all_namespaces=self.gpu_inventory_all_namespaces,
                extra_resources=self._gpu_resource_names(),
                log=self.log,
            )

        return shared_reflector(create)

    def gpu_availability(self, catalog: Catalog) -> dict[str, Availability] | None:
        """Live figures per GPU type of the catalog; None while the inventory is unavailable."""
        reflector = self.gpu_inventory()
        if reflector is None or not reflector.ready:
            return None
        admin = self._admin_values or {}
        return inventory_figures.catalog_availability(
            reflector.inventory,
            catalog,
            admin.get("node_selector", self.node_selector),
            admin.get("tolerations", self.tolerations),
        )

    def gpu_availability_payload(self) -> dict:
        """What the availability endpoint answers (see gpuspawner.inventory.web)."""
        try:
            # Per user: the figures name only the images this user may use.
            catalog = self.visible_catalog()
        except CatalogError:
            return inventory_figures.availability_payload(None, None, "the catalog is invalid")
        reflector = self.gpu_inventory()
        figures = self.gpu_availability(catalog)
        problem = ""
        if figures is None:
            if reflector is None:
                problem = "the GPU inventory is turned off"
            elif reflector.missing_permissions:
                problem = " ".join(reflector.missing_permissions)
            else:
                problem = "the GPU inventory is still loading"
        return inventory_figures.availability_payload(catalog, figures, problem)

    async def _check_capacity(self, catalog: Catalog, selection: Selection) -> admission.Verdict:
        if not selection.is_gpu or selection.gpu_type is None:
            return admission.Verdict(wait=False)
        reflector = self.gpu_inventory()
        if reflector is None or not await reflector.wait_ready(timeout=10):
            return admission.Verdict(wait=False)
        figures = self.gpu_availability(catalog)
        if figures is None or selection.gpu_type.key not in figures:
            return admission.Verdict(wait=False)
        others = inventory_figures.alternatives(
            catalog, selection.image, selection.gpu_type.key, figures
        )
        return admission.check_capacity(
            selection.gpu_type.display_name,
            selection.gpus,
            figures[selection.gpu_type.key],
            others,
            queueing=self.gpu_queue_enabled,
        )

    async def _wait_for_gpus(self, catalog: Catalog, selection: Selection) -> None:
        """Wait in the hub's queue until a node can take the request (gpu_queue_enabled)."""
        assert selection.gpu_type is not None
        reflector = self.gpu_inventory()
        type_key, name = selection.gpu_type.key, selection.gpu_type.display_name
        queue = self._wait_queue
        queue.join(type_key, self, selection.gpus)
        deadline = time.monotonic() + self.gpu_queue_timeout
        try:
            while True:
                figures = self.gpu_availability(catalog) or {}
                availability = figures.get(type_key)
                if availability is None or queue.may_start(type_key, self, availability):
                    break
                place, waiting = queue.place(type_key, self)
                self._queue_message = admission.queue_message(
                    name, selection.gpus, availability, place, waiting
                )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._release_reservation()
                    raise Refusal(
                        f"No node had {selection.gpus} free {name} GPUs within "
                        f"{self.gpu_queue_timeout:.0f} seconds, so the server was not started. "
                        f"{admission.busy_message(name, selection.gpus, availability, {})}",
                        status=503,
                        reason=admission.REASON_NO_CAPACITY,
                    )
                await reflector.wait_for_change(timeout=min(remaining, 5))
        finally:
            queue.leave(type_key, self)
            self._queue_message = ""
        self.log.info("%s leaves the GPU queue for %s", self._log_name, name)

    def _unschedulable_progress(self) -> str:
        assert self._unschedulable is not None
        message = self._unschedulable.message
        if self._unschedulable.insufficient_gpus and self.gpu_unschedulable_timeout > 0:
            waited = time.monotonic() - (self._unschedulable_since or time.monotonic())
            left = max(self.gpu_unschedulable_timeout - waited, 0)
            message += f" Giving up in {left:.0f} s unless GPUs are freed."
        return message

    def _watch_scheduling(self, pod: dict) -> None:
        """Follow the scheduler's verdict on a Pending pod; too long without GPUs fails the spawn."""
        raw = admission.unschedulable_message(pod)
        if raw is None:
            self._unschedulable = None
            self._unschedulable_since = None
            return
        gpu_type = self._selection.gpu_type if self._selection else None
        name = f"{gpu_type.display_name} GPUs" if gpu_type else ""
        resources = {gpu_type.resource} if gpu_type else set()
        self._unschedulable = admission.explain_unschedulable(raw, resources, name)
        if not self._unschedulable.insufficient_gpus:
            self._unschedulable_since = None
            return
        now = time.monotonic()
        if self._unschedulable_since is None:
            self._unschedulable_since = now
            self.log.info("Pod of %s waits for GPUs: %s", self._log_name, raw)
        timeout = self.gpu_unschedulable_timeout
        if timeout > 0 and now - self._unschedulable_since >= timeout:
            raise GPUUnschedulable(self._unschedulable.message)
