"""Kueue's objects and its visibility API, read through the one Kubernetes request path.

Every read goes through :func:`gpuspawner.clients.kube.request_json` with the
:class:`~gpuspawner.clients.kube.Reader`'s retry policy, so errors are the same
``KubeError`` family as for pods and nodes (``Refused`` for a missing right,
``NotFound`` for a queue that does not exist). What the objects mean is
:mod:`gpuspawner.core.kueue`'s.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..core import kueue
from . import kube

#: The most pending workloads read from one queue when all are asked for: a bound on a
#: reader's work however long the queue (Kueue's own default answer is 1000).
MAX_PENDING = 10_000


def _checked(name: str, what: str) -> str:
    """``name``, unless no object can have it and asking would read another path.

    The client sends a path segment ``..`` or ``.`` as it is, and the URL library
    resolves it (``clusterqueues/..`` asks for the group's discovery document); an
    empty name asks for the whole list. Kubernetes names are never these
    (apimachinery's IsValidPathSegmentName), so nothing is asked.
    """
    if not isinstance(name, str) or name in ("", ".", ".."):
        raise kube.NotFound(f"{what}: {name!r} cannot name a Kubernetes object")
    return name


def _segment(name: str, what: str) -> str:
    """A name as one path segment: a hostile ``a/../b`` cannot reach another path."""
    return quote(_checked(name, what), safe="")


class KueueClient:
    """Reads ClusterQueues, LocalQueues, ResourceFlavors, Workloads and pending workloads."""

    def __init__(self, api_client: Any, reader: kube.Reader | None = None):
        from kubernetes_asyncio import client

        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.reader = reader or kube.Reader(logger=kube.log)

    @classmethod
    async def from_kube(cls, kube_client: kube.KubeClient) -> KueueClient:
        """A client sharing a :class:`~gpuspawner.clients.kube.KubeClient`'s connection and reader."""
        core = await kube_client.api()
        return cls(core.api_client, kube_client.reader)

    async def _one(self, call: Any, *args: Any, what: str, **kwargs: Any) -> dict:
        async def attempt() -> dict:
            return await kube.request_json(
                call, *args, what=what, timeout=self.reader.timeout, **kwargs
            )

        return await self.reader.retry.run(attempt, self.reader.logger)

    async def _get_path(
        self, path: str, what: str, query: list[tuple[str, str]] | None = None
    ) -> dict:
        return await self._one(
            self.api_client.call_api,
            path,
            "GET",
            what=what,
            query_params=query or [],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )

    async def _pending(self, path: str, what: str, limit: int | None) -> list[kueue.PendingEntry]:
        """The pending workloads at ``path``, the first ``limit`` (None: up to :data:`MAX_PENDING`).

        Read in pages of the reader's page size with Kueue's ``offset``/``limit``
        options. Each page is the queue as it is when asked: a workload admitted
        between two pages shifts the rest, so one may be seen twice (kept once) or
        not at all; the positions are Kueue's of that moment.
        """
        wanted = MAX_PENDING if limit is None else max(0, limit)
        found: dict[tuple[str, str], kueue.PendingEntry] = {}
        offset = 0
        while offset < wanted:
            page = min(self.reader.page_size, wanted - offset)
            query = [("limit", str(page)), ("offset", str(offset))]
            summary = await self._get_path(path, what, query)
            for entry in kueue.pending_entries(summary):
                found.setdefault((entry.namespace, entry.name), entry)
            if kueue.pending_page_length(summary) < page:
                break
            offset += page
        return sorted(found.values(), key=lambda e: e.position_in_cluster_queue)[:wanted]

    # -- Kueue's own objects ---------------------------------------------------

    async def cluster_queue(self, name: str) -> dict:
        what = f"Reading ClusterQueue {name!r}"
        return await self._one(
            self.custom.get_cluster_custom_object,
            kueue.GROUP,
            kueue.VERSION,
            "clusterqueues",
            _checked(name, what),
            what=what,
        )

    async def cluster_queues(self) -> list[dict]:
        listing = await self.reader.list_all(
            self.custom.list_cluster_custom_object,
            kueue.GROUP,
            kueue.VERSION,
            "clusterqueues",
            what="Listing ClusterQueues",
        )
        return listing.items

    async def resource_flavors(self) -> list[dict]:
        listing = await self.reader.list_all(
            self.custom.list_cluster_custom_object,
            kueue.GROUP,
            kueue.VERSION,
            "resourceflavors",
            what="Listing ResourceFlavors",
        )
        return listing.items

    async def local_queue(self, namespace: str, name: str) -> dict:
        what = f"Reading LocalQueue {namespace!r}/{name!r}"
        return await self._one(
            self.custom.get_namespaced_custom_object,
            kueue.GROUP,
            kueue.VERSION,
            _checked(namespace, what),
            "localqueues",
            _checked(name, what),
            what=what,
        )

    async def workloads(self, namespace: str | None, selector: str = "") -> list[dict]:
        """The Workloads of ``namespace`` (None: every namespace), matching a label selector."""
        extra = {"label_selector": selector} if selector else {}
        if namespace:
            what = f"Listing Workloads in namespace {namespace!r}"
            listing = await self.reader.list_all(
                self.custom.list_namespaced_custom_object,
                kueue.GROUP,
                kueue.VERSION,
                _checked(namespace, what),
                "workloads",
                what=what,
                **extra,
            )
        else:
            listing = await self.reader.list_all(
                self.custom.list_cluster_custom_object,
                kueue.GROUP,
                kueue.VERSION,
                "workloads",
                what="Listing Workloads in all namespaces",
                **extra,
            )
        return listing.items

    async def workload(self, namespace: str, name: str) -> dict:
        what = f"Reading Workload {namespace!r}/{name!r}"
        return await self._one(
            self.custom.get_namespaced_custom_object,
            kueue.GROUP,
            kueue.VERSION,
            _checked(namespace, what),
            "workloads",
            _checked(name, what),
            what=what,
        )

    # -- the visibility API (an aggregated API) ---------------------------------

    async def pending_in_cluster_queue(
        self, name: str, limit: int | None = None
    ) -> list[kueue.PendingEntry]:
        """The ClusterQueue's pending workloads in order (every namespace's); the first ``limit``."""
        what = f"Reading the pending workloads of ClusterQueue {name!r}"
        path = (
            f"/apis/{kueue.VISIBILITY_GROUP}/{kueue.VISIBILITY_VERSION}"
            f"/clusterqueues/{_segment(name, what)}/pendingworkloads"
        )
        return await self._pending(path, what, limit)

    async def pending_in_local_queue(
        self, namespace: str, name: str, limit: int | None = None
    ) -> list[kueue.PendingEntry]:
        """The LocalQueue's pending workloads in order; the first ``limit``."""
        what = f"Reading the pending workloads of LocalQueue {namespace!r}/{name!r}"
        path = (
            f"/apis/{kueue.VISIBILITY_GROUP}/{kueue.VISIBILITY_VERSION}"
            f"/namespaces/{_segment(namespace, what)}"
            f"/localqueues/{_segment(name, what)}/pendingworkloads"
        )
        return await self._pending(path, what, limit)
