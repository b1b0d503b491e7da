"""What the spawners of one hub process share: admission locks, reservations, the GPU queue,
the GPU demand it publishes, catalog files, compiled form templates, the GPU inventory's watches, the GPU usage
recorder and the spawners the metrics count.

All of it lives in one :class:`HubState`, found with :func:`current`.

Why a module-level accessor and not an object handed to each spawner:
JupyterHub has no start-up or shutdown hook for a spawner class, and it builds
each spawner itself, with nothing to pass a shared object along. The state is
therefore created on first use, by the first spawner that needs it, and lives as
long as the hub process, as KubeSpawner's own pod reflector does. Keeping it in
one object rather than in class attributes and module globals gives it one
lifecycle: :meth:`HubState.close` stops the watches and the recorder it started, and
:func:`reset` (for tests, and for programs that embed several hubs' worth of
spawners in one process) closes it and starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from ..core.admission import RefusedDemand, WaitQueue, person_demand
from ..core.catalog import CatalogFile
from ..core.limits import Holding
from .startturns import StartGate

if TYPE_CHECKING:
    from ..inventory.reflectors import InventoryReflector
    from .accounting import AccountingRecorder
    from .kueue import KueueView


class HubState:
    """Everything one hub's spawners share, with an explicit end (:meth:`close`)."""

    def __init__(self) -> None:
        # One lock per user name (and per pooled group), so that admission
        # (count, check, reserve) of concurrent requests runs one at a time.
        # Weak: a lock no request holds or waits for is forgotten.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # Admitted requests whose pods the API server may not show yet, by (user, server).
        self._reservations: dict[tuple[str, str], Holding] = {}
        self.wait_queue = WaitQueue()
        # Requests refused for lack of free GPUs, counted as demand for a while.
        self._refused: dict[tuple[str, str], RefusedDemand] = {}
        self._catalog_files: dict[str, CatalogFile] = {}
        # One Jinja environment per template search path: compiling form.html
        # again on every page view costs ~20 ms.
        self._form_environments: dict[tuple[str, ...], Any] = {}
        # The inventory's watches run as tasks of one event loop: the hub's.
        self._inventory: InventoryReflector | None = None
        self._inventory_loop: asyncio.AbstractEventLoop | None = None
        # The usage recorder's reconciliation runs on the hub's loop too.
        self._accounting: AccountingRecorder | None = None
        self._accounting_loop: asyncio.AbstractEventLoop | None = None
        # The hub's reads of its Kueue LocalQueue (with GPUSpawner.kueue_queue).
        self._kueue: KueueView | None = None
        self._kueue_loop: asyncio.AbstractEventLoop | None = None
        #: Whether the recorder could not be created (said once in the hub's log).
        self.accounting_failed = False
        #: The spawners whose servers' GPUs the metrics count at scrape time (weakly held).
        self.spawners: weakref.WeakSet = weakref.WeakSet()
        #: Turns to start (GPUSpawner.concurrent_starts).
        self.start_gate = StartGate()

    # -- admission ---------------------------------------------------------

    def lock(self, name: str) -> asyncio.Lock:
        """The admission lock called ``name`` (``user:NAME`` or ``pool:GROUP``)."""
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def reserve(self, holding: Holding) -> None:
        """Count an admitted request until its pod is visible (or the spawn ends)."""
        self._reservations[(holding.user, holding.server)] = holding

    def release(self, user: str, server: str) -> None:
        self._reservations.pop((user, server), None)

    def reservations(self, user: str | None = None) -> list[Holding]:
        """The reservations of ``user``, or of everyone when ``user`` is None."""
        return [h for h in self._reservations.values() if user is None or h.user == user]

    def claims(
        self,
        gpu_type: str,
        *,
        placed: Callable[[str], bool],
        besides: tuple[str, str] | None = None,
    ) -> list[int]:
        """GPU counts of ``gpu_type`` promised to admitted requests and not on a node yet.

        ``placed(pod_key)`` says whether the inventory already counts a pod on
        its node. Requests still waiting in the queue have been promised
        nothing; ``besides`` is the asking server, left out.
        """
        waiting = self.wait_queue.owners(gpu_type)
        return [
            h.gpus
            for key, h in self._reservations.items()
            if h.gpu_type == gpu_type
            and key != besides
            and key not in waiting
            and not placed(h.pod)
        ]

    # -- demand ------------------------------------------------------------

    def record_refusal(
        self,
        user: str,
        server: str,
        gpu_type: str,
        gpus: int,
        until: float,
        allowance: float | None = None,
    ) -> None:
        """Count a request refused for lack of free GPUs as demand until ``until`` (monotonic).

        Kept per server, so a user who tries again and again counts once;
        published per person (:func:`~gpuspawner.core.admission.person_demand`),
        capped at ``allowance``, what the user could still take of the type.
        """
        self._refused[(user, server)] = RefusedDemand(user, gpu_type, gpus, until, allowance)

    def forget_refusals(self, user: str) -> None:
        """Forget every refusal of ``user``: one of their requests was admitted."""
        for key in [k for k in self._refused if k[0] == user]:
            del self._refused[key]

    def demand(self, now: float) -> list[tuple[str, str, int]]:
        """``(source, type, GPUs)`` of what waits for GPUs: queued, or refused until ``now``.

        One entry per person and type. Anonymous on purpose: what is published
        must never show who asked.
        """
        for key in [k for k, r in self._refused.items() if r.until <= now]:
            del self._refused[key]
        return person_demand(self._refused.values(), self.wait_queue.waiting())

    # -- caches -----------------------------------------------------------

    def catalog_file(
        self, path: str, known_overrides: Collection[str] | None = None
    ) -> CatalogFile:
        """The catalog file at ``path``, read again only when it changes.

        ``known_overrides``: the trait names its images' ``kubespawner_override`` may set.
        """
        source = self._catalog_files.get(path)
        if source is None:
            source = self._catalog_files[path] = CatalogFile(path, known_overrides=known_overrides)
        return source

    def form_environment(self, paths: tuple[str, ...], build: Callable[[], Any]) -> Any:
        """The Jinja environment for the template search path ``paths``, built once."""
        env = self._form_environments.get(paths)
        if env is None:
            env = self._form_environments[paths] = build()
        return env

    # -- the inventory -----------------------------------------------------

    def inventory(self, create: Callable[[], InventoryReflector]) -> InventoryReflector:
        """The hub's one inventory reflector, created and started on first use.

        A reflector started on another event loop (one that has ended: tests
        run one loop each) is replaced, since its watches can no longer run.
        """
        loop = asyncio.get_running_loop()
        if self._inventory is not None and self._inventory_loop is not loop:
            _cancel(self._inventory, self._inventory_loop)
            self._inventory = None
        if self._inventory is None:
            self._inventory = create()
            self._inventory_loop = loop
            self._inventory.start()
        return self._inventory

    @property
    def started_inventory(self) -> InventoryReflector | None:
        """The inventory reflector if one was started, else None (starts nothing)."""
        return self._inventory

    # -- the usage recorder --------------------------------------------------

    def accounting(self, create: Callable[[], AccountingRecorder]) -> AccountingRecorder:
        """The hub's one GPU usage recorder, created and started on first use.

        Like :meth:`inventory`: one started on an event loop that has ended is replaced.
        """
        loop = asyncio.get_running_loop()
        if self._accounting is not None and self._accounting_loop is not loop:
            self._accounting.cancel()
            self._accounting = None
        if self._accounting is None:
            self._accounting = create()
            self._accounting_loop = loop
            self._accounting.start()
        return self._accounting

    @property
    def recorder(self) -> AccountingRecorder | None:
        """The usage recorder if one was started (the metrics read it), else None."""
        return self._accounting

    # -- Kueue ----------------------------------------------------------------

    def kueue(self, create: Callable[[], KueueView]) -> KueueView:
        """The hub's one view of its Kueue LocalQueue, created on first use (per event loop)."""
        loop = asyncio.get_running_loop()
        if self._kueue is not None and self._kueue_loop is not loop:
            self._kueue.cancel()
            self._kueue = None
        if self._kueue is None:
            self._kueue = create()
            self._kueue_loop = loop
        return self._kueue

    # -- lifecycle ---------------------------------------------------------

    def _forget(self) -> InventoryReflector | None:
        reflector, self._inventory, self._inventory_loop = self._inventory, None, None
        if (
            self._kueue is not None
            and self._kueue_loop is not None
            and not self._kueue_loop.is_closed()
        ):
            with contextlib.suppress(RuntimeError):
                self._kueue.cancel()
        self._kueue, self._kueue_loop = None, None
        self._locks = weakref.WeakValueDictionary()
        self._reservations.clear()
        self._refused.clear()
        self.wait_queue = WaitQueue()
        self._catalog_files.clear()
        self._form_environments.clear()
        self.spawners = weakref.WeakSet()
        self.accounting_failed = False
        return reflector

    def _forget_accounting(self) -> tuple[AccountingRecorder | None, Any]:
        taken = self._accounting, self._accounting_loop
        self._accounting, self._accounting_loop = None, None
        return taken

    async def close(self) -> None:
        """Stop the inventory's watches and the usage recorder, and forget everything;
        the state can be used again."""
        recorder, recorder_loop = self._forget_accounting()
        if recorder is not None:
            if recorder_loop is asyncio.get_running_loop():
                await recorder.stop()
            else:
                recorder.cancel()
        loop = self._inventory_loop
        reflector = self._forget()
        if reflector is None:
            return
        if loop is asyncio.get_running_loop():
            await reflector.stop()
        else:
            _cancel(reflector, loop)

    def close_soon(self) -> None:
        """:meth:`close` without waiting: the watches and the recorder are cancelled, not awaited."""
        recorder, _ = self._forget_accounting()
        if recorder is not None:
            recorder.cancel()
        loop = self._inventory_loop
        reflector = self._forget()
        if reflector is not None:
            _cancel(reflector, loop)


def _cancel(reflector: InventoryReflector, loop: asyncio.AbstractEventLoop | None) -> None:
    """Cancel a reflector's watches without awaiting them (its loop may have ended)."""
    if loop is None or loop.is_closed():
        return  # its tasks ended with their loop
    # A loop that is shutting down may refuse to schedule the cancellation.
    with contextlib.suppress(RuntimeError):
        reflector.cancel()


_current: HubState | None = None


def current() -> HubState:
    """The hub process's state, created on first use."""
    global _current
    if _current is None:
        _current = HubState()
    return _current


def reset() -> HubState:
    """Close the current state (without waiting for its watches) and start a fresh one.

    For tests: each starts from an empty hub, with no reservation, queue,
    lock, catalog or watch left by the one before.
    """
    global _current
    if _current is not None:
        _current.close_soon()
    _current = HubState()
    return _current
