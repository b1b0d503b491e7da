"""List GPUSpawner's pods from the Kubernetes API (one call per pass), as plain JSON dicts."""

from __future__ import annotations

import json
import os
from typing import Any

from ..labels import LABEL_MANAGED

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeError(Exception):
    """The Kubernetes API could not be read."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or os.path.exists(
        os.path.join(SERVICE_ACCOUNT, "token")
    )


def service_account_namespace() -> str | None:
    """The pod's own namespace, from its service account (None outside a pod)."""
    try:
        with open(os.path.join(SERVICE_ACCOUNT, "namespace")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def kubernetes_available() -> bool:
    """True in a pod with a service account, or when KUBECONFIG or ~/.kube/config exists."""
    if in_cluster():
        return True
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return any(os.path.exists(p) for p in path.split(os.pathsep) if p)


class PodLister:
    """Lists the pods labelled ``gpuspawner.io/managed=true`` in one namespace."""

    def __init__(self, namespace: str, *, timeout: float = 30):
        self.namespace = namespace
        self.timeout = timeout
        self._api = None
        self.requests = 0

    async def _client(self):
        if self._api is None:
            from kubernetes_asyncio import client, config

            if in_cluster():
                # The hub passes managed services only a few environment variables,
                # so the API server's address may be missing: use its cluster DNS name.
                os.environ.setdefault("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
                os.environ.setdefault("KUBERNETES_SERVICE_PORT", "443")
                config.load_incluster_config()
                api_client = client.ApiClient()
            else:
                api_client = await config.new_client_from_config(
                    config_file=os.environ.get("KUBECONFIG")
                )
            self._api = client.CoreV1Api(api_client)
        return self._api

    async def list_pods(self) -> list[dict[str, Any]]:
        try:
            api = await self._client()
            self.requests += 1
            response = await api.list_namespaced_pod(
                self.namespace,
                label_selector=f"{LABEL_MANAGED}=true",
                _preload_content=False,
                _request_timeout=self.timeout,
            )
            body = await response.read()
            return json.loads(body).get("items") or []
        except Exception as e:  # any API or transport failure means "no pod data"
            raise KubeError(
                f"The pods in namespace {self.namespace!r} could not be listed: {e}"
            ) from e

    async def close(self) -> None:
        if self._api is not None:
            await self._api.api_client.close()
            self._api = None
