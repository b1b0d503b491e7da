"""A watch of GPUSpawner's pods in the hub's namespace, as the hub's inventory keeps it.

For the tests (and tests/fixtures/accounting/record.py) that need what the API
server says about pods as it happens: each pod's last state before it is gone
is seen only in the watch's DELETED event.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request

from gpuspawner.inventory.reflectors import ACTIVE_POD_FIELDS

NAMESPACE = "jupyterhub"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SELECTOR = "gpuspawner.io/managed=true"


class PodWatch(threading.Thread):
    """The hub inventory's pod watch (finished pods filtered out), recorded from now on.

    ``kube`` is the sandbox's :class:`~gpuspawner_sandbox.kubeapi.KubeApi`. The
    thread ends with the API server (a daemon: never waited for).
    """

    def __init__(self, kube):
        super().__init__(daemon=True)
        self.kube = kube
        self.events: list[dict] = []
        self.lock = threading.Lock()
        listing = kube.get(PODS, query={"labelSelector": SELECTOR})
        self.resource_version = listing["metadata"]["resourceVersion"]

    def run(self) -> None:
        while True:
            query = {
                "watch": "1",
                "labelSelector": SELECTOR,
                "fieldSelector": ACTIVE_POD_FIELDS,
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "300",
            }
            request = urllib.request.Request(
                self.kube.server + PODS + "?" + urllib.parse.urlencode(query)
            )
            request.add_header("Authorization", f"Bearer {self.kube.token}")
            try:
                response = self.kube._opener.open(request, timeout=330)
            except OSError:
                return  # the API server has stopped
            with response:
                for line in response:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    meta = event["object"].get("metadata") or {}
                    self.resource_version = meta.get("resourceVersion", self.resource_version)
                    if event["type"] != "BOOKMARK":
                        with self.lock:
                            self.events.append(event)

    def take(self) -> list[dict]:
        """The events recorded since the last take."""
        with self.lock:
            events, self.events = self.events, []
        return events

    def seen(self) -> list[dict]:
        """Every event recorded and not taken."""
        with self.lock:
            return list(self.events)
