"""The two watches that keep the hub's GPU inventory current: accelerator nodes and GPU pods.

One :class:`InventoryReflector` per hub process, kept by the hub's
:class:`~gpuspawner.hub.state.HubState` and shared by every spawner, like
KubeSpawner's pod reflector: it lists nodes and pods
once (in pages, through :mod:`gpuspawner.clients.kube`, so a large cluster never
arrives as one huge response and every answer is checked), then
follows each with a watch, and feeds every object into a
:class:`~gpuspawner.inventory.model.Inventory`, which keeps a few hundred
bytes per GPU node or GPU pod and nothing of the others. A page view reads
the inventory; nothing is listed from the API server per page.

KubeSpawner's ``ResourceReflector`` is not reused: it keys objects by
``namespace/name`` (nodes have no namespace), keeps whole objects (far more
memory than the arithmetic needs at 20,000 pods) and retries a 403 with a
traceback until it gives up. Here a missing permission is logged once, as one
sentence naming it, and the hub carries on without figures (nodes) or with
the hub's own namespace only (pods).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..clients import kube
from .model import Inventory, NodeRecord, PodRecord, node_record, pod_record

#: Pods that finished hold nothing; the API server filters them out for us.
ACTIVE_POD_FIELDS = "status.phase!=Succeeded,status.phase!=Failed"

NODES_PERMISSION = (
    "cluster-wide 'list' and 'watch' on 'nodes' (the ClusterRole gpuspawner-hub-inventory "
    "in config/rbac.yaml)"
)
#: The back-off between two tries of a watch that failed: it never gives up.
FOREVER = kube.RetryPolicy(timeout=None, first_delay=0.5, max_delay=30)

PODS_PERMISSION = (
    "cluster-wide 'list' and 'watch' on 'pods' (the opt-in ClusterRole "
    "gpuspawner-hub-all-namespaces-pods in config/rbac-opt-in-all-namespaces.yaml), or "
    "c.GPUSpawner.gpu_inventory_all_namespaces = False"
)


async def _lines(content: Any):
    """Complete lines of a watch stream, however long (one event per line)."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer.extend(chunk)
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
    if buffer.strip():
        yield bytes(buffer)


class _Watch:
    """List then watch one kind of object, forever, feeding an :class:`Inventory`."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        to_record: Callable[[dict], Any],
        on_list: Callable[[list[Any]], None],
        on_event: Callable[[str, dict], None],
        log: logging.Logger,
        *,
        field_selector: str = "",
        page_size: int = 500,
        watch_timeout: int = 300,
        request_timeout: float = 60,
        retry: kube.RetryPolicy | None = None,
    ):
        self.kind = kind
        self.list_call = list_call
        self.to_record = to_record
        self.on_list = on_list
        self.on_event = on_event
        self.log = log
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        self.retry = retry or kube.RetryPolicy(timeout=request_timeout)
        self.synced = asyncio.Event()
        self.events = 0

    async def list_all(self) -> str:
        """List every object in pages; returns the list's resourceVersion.

        Each page is reduced to compact records and dropped before the next is
        fetched, so a large cluster's full list is never in memory.
        """
        kwargs: dict[str, Any] = {}
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        reader = kube.Reader(self.retry, self.request_timeout, self.page_size, self.log)
        listing = await reader.list_all(
            self.list_call, what=f"Listing {self.kind}", reduce=self.to_record, **kwargs
        )
        self.on_list(listing.items)
        return listing.resource_version

    async def watch(self, resource_version: str) -> str | None:
        """Follow changes until the server ends the watch; None when a full list is needed."""
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": self.watch_timeout,
        }
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        what = f"Watching {self.kind}"
        response = await self.list_call(
            _preload_content=False, _request_timeout=self.watch_timeout + 30, **kwargs
        )
        try:
            kube.check_status(response, what)
            async for line in _lines(response.content):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    # A Status object: 410 when resource_version is too old.
                    raise kube.error_for(obj.get("code"), obj, what)
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion", resource_version
                )
                if kind != "BOOKMARK":
                    self.on_event(kind, obj)
                    self.events += 1
            return resource_version
        finally:
            response.release()

    async def run(self) -> None:
        """List, then watch, for ever: list again when the watch expires, and after errors
        with the back-off of :data:`FOREVER`. Raises :class:`~gpuspawner.clients.kube.Refused`."""
        delays = FOREVER.delays()
        resource_version: str | None = None
        failing = False
        while True:
            try:
                if resource_version is None:
                    resource_version = await self.list_all()
                    self.synced.set()
                resource_version = await self.watch(resource_version)
                delays = FOREVER.delays()
                if failing:
                    self.log.info("Watching %s for the GPU inventory again", self.kind)
                    failing = False
            except kube.Expired:
                resource_version = None  # too old: list again, at once
            except (kube.Refused, asyncio.CancelledError):
                raise
            except Exception as e:
                # Not only Retryable: a reflector has no caller to give up to, so even an
                # unexpected answer is retried (slowly), logged once until it works again.
                if not failing:
                    self.log.warning(
                        "Watching %s for the GPU inventory failed, retrying: %s", self.kind, e
                    )
                    failing = True
                resource_version = None
                await asyncio.sleep(next(delays))


#: Whether pods of every namespace are counted unless the admin says otherwise
#: (``c.GPUSpawner.gpu_inventory_all_namespaces``; the gpuspawner service follows
#: the hub). Off: the shipped RBAC lets the hub read pods in its own namespace only.
ALL_NAMESPACES_DEFAULT = False


class InventoryReflector:
    """The hub's GPU inventory, kept current by a watch of nodes and one of pods.

    ``core_api`` is a ``kubernetes_asyncio`` ``CoreV1Api``. ``namespace`` is
    the hub's namespace, watched alone if the hub may not watch pods in every
    namespace (``all_namespaces=False`` asks for that from the start).
    """

    def __init__(
        self,
        core_api: Any,
        *,
        namespace: str,
        all_namespaces: bool = True,
        extra_resources: Iterable[str] = (),
        log: logging.Logger | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
    ):
        self.api = core_api
        self.namespace = namespace
        self.all_namespaces = all_namespaces
        self.log = log or logging.getLogger("gpuspawner.inventory")
        self.inventory = Inventory(extra_resources)
        self.inventory.count_pods_of("" if all_namespaces else namespace)
        #: One sentence per permission the hub lacks, logged once each.
        self.missing_permissions: list[str] = []
        self.pods_scope = "all namespaces" if all_namespaces else f"namespace {namespace}"
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task] = []
        self._pod_listeners: list[Callable[[str, dict], None]] = []
        self._failed_listeners: set[int] = set()
        self.nodes_watch = _Watch(
            "nodes",
            core_api.list_node,
            lambda raw: node_record(raw, self.inventory.extra_resources),
            self._nodes_listed,
            self._node_event,
            self.log,
            page_size=page_size,
            watch_timeout=watch_timeout,
        )
        self.pods_watch = self._pods_watch(all_namespaces, page_size, watch_timeout)

    def _pods_watch(self, all_namespaces: bool, page_size: int, watch_timeout: int) -> _Watch:
        if all_namespaces:
            call = self.api.list_pod_for_all_namespaces
        else:

            def call(**kwargs: Any) -> Any:
                return self.api.list_namespaced_pod(self.namespace, **kwargs)

        return _Watch(
            "pods",
            call,
            self._listed_pod,
            self._pods_listed,
            self._pod_event,
            self.log,
            field_selector=ACTIVE_POD_FIELDS,
            page_size=page_size,
            watch_timeout=watch_timeout,
        )

    # -- feeding the model ----------------------------------------------

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        task = asyncio.ensure_future(notify())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _nodes_listed(self, records: list[NodeRecord]) -> None:
        self.inventory.replace_node_records(records)
        self._notify()

    def _pods_listed(self, records: list[PodRecord | None]) -> None:
        self.inventory.replace_pod_records(records)
        self._notify()

    def _node_event(self, kind: str, node: dict) -> None:
        if kind == "DELETED":
            self.inventory.remove_node((node.get("metadata") or {}).get("name", ""))
        else:
            self.inventory.set_node(node)
        self._notify()

    def add_pod_listener(self, listener: Callable[[str, dict], None]) -> None:
        """Call ``listener(kind, pod)`` with each pod (raw JSON) the pods watch sees.

        ``kind`` is ``LISTED`` for each pod of a (re)list, then ``ADDED``,
        ``MODIFIED`` or ``DELETED`` as the watch reports them. Finished pods
        are filtered out (:data:`ACTIVE_POD_FIELDS`), so a pod's last event is
        ``DELETED`` with its last state, whether it finished or was deleted.
        Called on the hub's loop: it must not block. An error it raises is
        logged once and never stops the watch.
        """
        self._pod_listeners.append(listener)

    def _tell_listeners(self, kind: str, pod: dict) -> None:
        for listener in self._pod_listeners:
            try:
                listener(kind, pod)
            except Exception as e:
                if id(listener) not in self._failed_listeners:
                    self._failed_listeners.add(id(listener))
                    self.log.warning("A listener of the pods watch failed: %s", e, exc_info=True)

    def _listed_pod(self, raw: dict) -> PodRecord | None:
        self._tell_listeners("LISTED", raw)
        return pod_record(raw, self.inventory.extra_resources)

    def _pod_event(self, kind: str, pod: dict) -> None:
        self._tell_listeners(kind, pod)
        meta = pod.get("metadata") or {}
        if kind == "DELETED":
            self.inventory.remove_pod(meta.get("namespace", ""), meta.get("name", ""))
        else:
            self.inventory.set_pod(pod)
        self._notify()

    # -- running ----------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether both watches have their first full list (figures can be trusted)."""
        return self.nodes_watch.synced.is_set() and self.pods_watch.synced.is_set()

    @property
    def nodes_forbidden(self) -> bool:
        return any("'nodes'" in m for m in self.missing_permissions)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.ensure_future(self._run_nodes()),
                asyncio.ensure_future(self._run_pods()),
            ]

    def cancel(self) -> None:
        """Cancel the watches without waiting for them to end (their loop may not run again)."""
        for task in self._tasks:
            task.cancel()

    async def stop(self) -> None:
        self.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first lists; False if they are not there."""
        if self.ready:
            return True
        if self.nodes_forbidden:
            return False
        try:
            await asyncio.wait_for(
                asyncio.gather(self.nodes_watch.synced.wait(), self.pods_watch.synced.wait()),
                timeout,
            )
        except asyncio.TimeoutError:
            return False
        return True

    async def wait_for_change(self, timeout: float) -> None:
        """Return after the next change to the inventory, or after ``timeout`` seconds."""
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _run_nodes(self) -> None:
        try:
            await self.nodes_watch.run()
        except kube.Refused:
            self._missing(
                f"GPU availability is not shown and requests are not checked against it: "
                f"the hub may not list nodes. It needs {NODES_PERMISSION}."
            )

    async def _run_pods(self) -> None:
        try:
            await self.pods_watch.run()
        except kube.Refused:
            if not self.all_namespaces:
                self._missing(
                    f"GPU availability is not shown: the hub may not list pods in namespace "
                    f"{self.namespace}. It needs 'list' and 'watch' on 'pods' there "
                    f"(the Role gpuspawner-hub in config/rbac.yaml)."
                )
                return
            self._missing(
                f"GPU availability counts only the pods of namespace {self.namespace}, so GPUs "
                f"used by other namespaces look free: the hub may not list pods in all "
                f"namespaces. It needs {PODS_PERMISSION}."
            )
            self.all_namespaces = False
            self.pods_scope = f"namespace {self.namespace}"
            self.inventory.count_pods_of(self.namespace)
            self.pods_watch = self._pods_watch(
                False, self.pods_watch.page_size, self.pods_watch.watch_timeout
            )
            await self._run_pods()

    def _missing(self, sentence: str) -> None:
        if sentence not in self.missing_permissions:
            self.missing_permissions.append(sentence)
            self.log.warning("%s", sentence)
        self._notify()
