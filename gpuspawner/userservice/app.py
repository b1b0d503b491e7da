"""The gpuspawner service: its settings, its own GPU inventory and its handler list.

The hub starts it (``c.JupyterHub.services``, see
:mod:`~gpuspawner.userservice.hubconfig`) and hands it its URL, prefix and
OAuth client through the environment. It keeps its own watch of nodes and
pods (:class:`~gpuspawner.inventory.reflectors.InventoryReflector`, with the
hub's service account: nodes cluster-wide, pods of the hub's namespace only
unless the hub counts every namespace, c.GPUSpawner.gpu_inventory_all_namespaces)
and reads the hub's catalog file, re-read when it changes. It holds no hub
API scope of its own: it forwards a user's keep to the culler with its own
token, which the culler accepts from the services in its ``keep_services``
(:mod:`~gpuspawner.userservice.keep`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from traitlets import Bool, Dict, List, Unicode, default
from traitlets.config import Application, catch_config_error

from ..clients import kube
from ..clients.settings import CatalogFileSettings, KubernetesSettings, ServiceEndpointSettings
from ..core import podspec
from ..core.catalog import Catalog, CatalogError, CatalogFile, parse_catalog
from ..core.placement import Placement
from ..inventory.reflectors import ALL_NAMESPACES_DEFAULT
from . import SERVICE_NAME

#: The variable the hub configuration passes the admin's pod placement in (JSON).
PLACEMENT_ENV = "GPUSPAWNER_PLACEMENT"
#: The variable an inline catalog (c.GPUSpawner.catalog) is passed in (JSON).
CATALOG_JSON_ENV = "GPUSPAWNER_CATALOG_JSON"
#: The variable the hub configuration passes the culler's base URL in (the culler's service url).
CULLER_URL_ENV = "GPUSPAWNER_CULLER_URL"
#: The variable that says whether the hub counts pods of every namespace ("1") or of
#: its own ("0"): c.GPUSpawner.gpu_inventory_all_namespaces, which the service follows.
ALL_NAMESPACES_ENV = "GPUSPAWNER_ALL_NAMESPACES"


def all_namespaces_from_env(value: str | None) -> bool:
    """$GPUSPAWNER_ALL_NAMESPACES as a setting: "1"/"true" on, "0"/"false" off, else the hub's default."""
    text = (value or "").strip().lower()
    if text in ("1", "true"):
        return True
    if text in ("0", "false"):
        return False
    return ALL_NAMESPACES_DEFAULT


def _placement_from_env() -> dict[str, Any]:
    try:
        value = json.loads(os.environ.get(PLACEMENT_ENV) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class UserService(ServiceEndpointSettings, CatalogFileSettings, KubernetesSettings, Application):
    name = SERVICE_NAME
    default_port = 10103
    description = "The user-facing gpuspawner service (live GPU figures for the spawn form, keeping a server)."

    @default("log_level")
    def _default_log_level(self):
        return logging.INFO

    catalog = Dict(
        help="The catalog itself, when the hub has it inline (c.GPUSpawner.catalog) rather than in a file. Default: $GPUSPAWNER_CATALOG_JSON."
    ).tag(config=True)

    @default("catalog")
    def _default_catalog(self):
        try:
            value = json.loads(os.environ.get(CATALOG_JSON_ENV) or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    node_selector = Dict(
        help="The node selector every server pod gets (c.KubeSpawner.node_selector), which the figures count with. Default: from $GPUSPAWNER_PLACEMENT, which the hub configuration sets."
    ).tag(config=True)

    @default("node_selector")
    def _default_node_selector(self):
        return dict(_placement_from_env().get("node_selector") or {})

    tolerations = List(
        help="The tolerations every server pod gets (c.KubeSpawner.tolerations), which the figures count with. Default: from $GPUSPAWNER_PLACEMENT."
    ).tag(config=True)

    @default("tolerations")
    def _default_tolerations(self):
        return list(_placement_from_env().get("tolerations") or [])

    all_namespaces = Bool(
        help="Count GPUs held by pods in every namespace, which needs the opt-in cluster-wide pod read (config/rbac-opt-in-all-namespaces.yaml). Default: $GPUSPAWNER_ALL_NAMESPACES, which the hub configuration sets from c.GPUSpawner.gpu_inventory_all_namespaces, else off (the hub's namespace only)."
    ).tag(config=True)

    @default("all_namespaces")
    def _default_all_namespaces(self):
        return all_namespaces_from_env(os.environ.get(ALL_NAMESPACES_ENV))

    culler_url = Unicode(
        help="The culler's base URL as this service reaches it, where a user's keep is forwarded (POST api/keep). Default: $GPUSPAWNER_CULLER_URL, which the hub configuration sets from the culler's service url. Empty: servers cannot be kept from the home page."
    ).tag(config=True)

    @default("culler_url")
    def _default_culler_url(self):
        return os.environ.get(CULLER_URL_ENV, "")

    aliases = {
        "ip": "UserService.ip",
        "catalog": "UserService.catalog_file",
        "namespace": "UserService.namespace",
        "kubernetes": "UserService.kubernetes",
        "log-level": "Application.log_level",
    }
    flags = {
        "own-namespace": (
            {"UserService": {"all_namespaces": False}},
            "Count only the pods of the hub's namespace.",
        ),
        "all-namespaces": (
            {"UserService": {"all_namespaces": True}},
            "Count the pods of every namespace (needs the opt-in cluster-wide pod read).",
        ),
    }

    @catch_config_error
    def initialize(self, argv=None):
        super().initialize(argv)
        #: The watches of nodes and pods, once started (None without Kubernetes).
        self.inventory: Any = None
        self._catalog_file = CatalogFile(self.catalog_file) if self.catalog_file else None
        self._inline_catalog: Catalog | None = None
        self._last_catalog_error = ""
        if self.catalog and not self.catalog_file:
            try:
                self._inline_catalog = parse_catalog(self.catalog)
            except CatalogError as e:
                self._catalog_problem(str(e))
        if self._catalog_file is None and self._inline_catalog is None and not self.catalog:
            self.log.warning(
                "No GPU catalog is configured ($GPUSPAWNER_CATALOG): no figures are shown."
            )

    def _catalog_problem(self, message: str) -> None:
        if message != self._last_catalog_error:
            self.log.error("The GPU catalog is invalid, no figures are shown: %s", message)
            self._last_catalog_error = message

    def current_catalog(self) -> Catalog | None:
        """The catalog in effect (re-read when its file changed); None when there is none."""
        if self._catalog_file is None:
            return self._inline_catalog
        try:
            catalog, reloaded = self._catalog_file.get()
        except CatalogError as e:
            self._catalog_problem(str(e))
            return None
        if reloaded:
            self.log.info("Loaded GPU catalog from %s", self.catalog_file)
        elif self._catalog_file.last_error is not None:
            self._catalog_problem(str(self._catalog_file.last_error))
        return catalog

    def placement(self) -> Placement:
        return Placement(self.node_selector, self.tolerations)

    async def start_inventory(self) -> None:
        """Start the watches of nodes and pods (only with Kubernetes and a catalog)."""
        from ..inventory.reflectors import InventoryReflector

        catalog = self.current_catalog()
        if catalog is None:
            return
        if not self.use_kubernetes():
            self.log.warning("No Kubernetes configuration found: no GPU figures are shown.")
            return
        try:
            api = await kube.core_api()
        except Exception as e:  # kubeconfig missing or broken, service account unreadable
            self.log.error("No GPU figures are shown: the Kubernetes client failed: %s", e)
            return
        self.inventory = InventoryReflector(
            api,
            namespace=self.namespace,
            all_namespaces=self.all_namespaces,
            extra_resources=podspec.gpu_resource_names(catalog),
            log=self.log,
        )
        self.inventory.start()

    async def run(self) -> None:
        port, address = self.listen_address()
        # listen first: the hub waits for the service to answer before it starts
        make_app(self).listen(port, address=address)
        self.log.info("%s serving on %s", self.name, self.service_url)
        await self.start_inventory()
        try:
            await asyncio.Event().wait()
        finally:
            if self.inventory is not None:
                await self.inventory.stop()
                await self.inventory.api.api_client.close()

    def start(self) -> None:
        try:
            asyncio.run(self.run())
        except KeyboardInterrupt:
            # the hub stops its services with SIGINT; the watches were stopped on the way out
            self.log.info("%s stopped", self.name)


def handlers(service: UserService, prefix: str) -> list[tuple]:
    """The service's routes under its ``prefix`` (``/services/gpuspawner/``)."""
    from jupyterhub.services.auth import HubOAuthCallbackHandler
    from jupyterhub.utils import url_path_join

    from .availability import AVAILABILITY_PATH, AvailabilityHandler
    from .keep import KEEP_PATH, KeepHandler
    from .stopnotices import STOP_NOTICES_PATH, StopNoticesHandler

    return [
        (url_path_join(prefix, AVAILABILITY_PATH), AvailabilityHandler, {"service": service}),
        (url_path_join(prefix, STOP_NOTICES_PATH), StopNoticesHandler),
        (url_path_join(prefix, KEEP_PATH), KeepHandler, {"service": service}),
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
    ]


def make_app(service: UserService):
    from tornado import web

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{SERVICE_NAME}/")
    return web.Application(handlers(service, prefix), cookie_secret=os.urandom(32))


def main(argv: list[str] | None = None) -> None:
    service = UserService.instance()
    service.initialize(argv)
    service.start()
