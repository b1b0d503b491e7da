"""``python -m gpuspawner.admin``: the GPU page, a hub-managed service for admins.

Served under the service's prefix (``/services/gpuspawner-admin/``):

- ``GET /`` — the page (HTML, refreshes itself);
- ``GET /api/status[?user=NAME]`` — the same report as JSON (``gpuspawner status``);
- ``POST /stop`` (``user``, ``server``) — stops a server through the hub's API
  with the service's token (scope ``delete:servers``); the hub logs the DELETE
  and this service logs which admin asked.

Every handler is a JupyterHub ``HubOAuthenticated`` handler requiring the
custom scope ``custom:gpuspawner:admin`` (:data:`ADMIN_SCOPE`): a user or
token without it gets 403.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from urllib.parse import urlencode

from traitlets import Bool, Float, Integer, default
from traitlets.config import Application, catch_config_error

from .. import labels, serverpod, stopnotice
from ..kube import KubeClient, KubeError, Reader
from ..services.hub import HubClient, HubError
from ..services.settings import (
    CatalogFileSettings,
    HubServiceSettings,
    KubernetesSettings,
    PrometheusSettings,
    ServiceConfigFile,
    ServiceEndpointSettings,
)
from .collect import Collector, KubeReader
from .page import render_page

#: The custom scope that lets a user see the page and stop servers from it.
ADMIN_SCOPE = "custom:gpuspawner:admin"
#: The service's name in the hub config (its URL prefix is /services/<name>/).
SERVICE_NAME = "gpuspawner-admin"


class GPUAdmin(
    ServiceConfigFile,
    ServiceEndpointSettings,
    CatalogFileSettings,
    HubServiceSettings,
    KubernetesSettings,
    PrometheusSettings,
    Application,
):
    name = "gpuspawner-admin"
    default_port = 10102
    description = "The GPU pool page for JupyterHub admins (a hub-managed service)."
    default_config_file = "gpuspawner_admin_config.py"

    @default("log_level")
    def _default_log_level(self):
        # stop requests are audited at INFO
        return logging.INFO

    all_namespaces = Bool(
        True,
        help="Count GPUs held by pods in every namespace in the figures per type (as GPUSpawner.gpu_inventory_all_namespaces).",
    ).tag(config=True)

    refresh_seconds = Integer(30, help="How often the page reloads itself, in seconds.").tag(
        config=True
    )
    cache_seconds = Float(
        10,
        help="A report is reused for this many seconds, so several admins' pages cost one listing.",
    ).tag(config=True)

    aliases = {
        "config": "GPUAdmin.config_file",
        "catalog": "GPUAdmin.catalog_file",
        "ip": "GPUAdmin.ip",
        "prometheus-url": "GPUAdmin.prometheus_url",
        "namespace": "GPUAdmin.namespace",
        "kubernetes": "GPUAdmin.kubernetes",
        "log-level": "Application.log_level",
    }

    @catch_config_error
    def initialize(self, argv=None):
        super().initialize(argv)
        self.load_service_config()
        if not self.api_token:
            self.log.critical(
                "gpuspawner-admin cannot start: no API token ($JUPYTERHUB_API_TOKEN)."
            )
            self.exit(1)
        self.hub = HubClient(self.hub_api_url, self.api_token, log=self.log)
        kube = None
        if self.use_kubernetes():
            client = KubeClient(self.namespace, Reader(logger=self.log))
            kube = KubeReader(client, all_namespaces=self.all_namespaces)
        self.kube = kube
        try:
            prometheus = self.prometheus_client()
        except ValueError as e:
            self.log.critical("gpuspawner-admin cannot start: %s", e)
            self.exit(1)
        self.collector = Collector(
            self.hub,
            kube,
            self.catalog_file,
            prometheus,
            cache_seconds=self.cache_seconds,
            log=self.log,
        )

    def web_app(self):
        return make_app(self)

    async def annotate_stop(self, user: str, server: str) -> None:
        """Mark the server's pod "stopped by an admin" before the stop, for its user to read.

        GPUSpawner keeps the annotation when the hub stops the server and shows
        it to the user (docs/culler.md, "Why it stopped"). A failure is logged
        and does not prevent the stop.
        """
        kube = getattr(self, "kube", None)
        if kube is None:
            return
        notice = stopnotice.StopNotice(stopnotice.REASON_ADMIN, time.time())
        value = json.dumps(notice.to_state())
        try:
            for pod in serverpod.server_pods(await kube.client.list_pods(serverpod.selector())):
                if pod.key == (user, server) and pod.active:
                    await kube.client.annotate_pod(
                        pod.name, pod.namespace, {labels.ANNOTATION_STOP_REASON: value}
                    )
        except KubeError as e:
            self.log.warning(
                "Could not mark %s/%s as stopped by an admin, so its user is not told why: %s",
                user,
                server or "default",
                e,
            )

    async def run(self) -> None:
        port, address = self.listen_address()
        self.web_app().listen(port, address=address)
        self.log.info("gpuspawner-admin serving on %s", self.service_url)
        await asyncio.Event().wait()

    def start(self) -> None:
        asyncio.run(self.run())


def make_app(admin: GPUAdmin):
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import web

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{SERVICE_NAME}/")

    class Base(HubOAuthenticated, web.RequestHandler):
        hub_scopes = {ADMIN_SCOPE}

        def admin_name(self) -> str:
            return self.current_user.get("name", "?")

    class PageHandler(Base):
        @web.authenticated
        async def get(self):
            report = await admin.collector.report()
            self.set_header("Cache-Control", "no-store")
            self.write(
                render_page(
                    report,
                    admin=self.admin_name(),
                    stop_url=url_path_join(prefix, "stop"),
                    xsrf_token=self.xsrf_token.decode()
                    if isinstance(self.xsrf_token, bytes)
                    else self.xsrf_token,
                    refresh_seconds=admin.refresh_seconds,
                    notice=self.get_argument("notice", ""),
                )
            )

    class StatusHandler(Base):
        @web.authenticated
        async def get(self):
            user = self.get_argument("user", "")
            # scripts act on what they read: always fresh
            report = await admin.collector.report((user,) if user else (), fresh=True)
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.write(json.dumps(report.as_dict()))

    class StopHandler(Base):
        @web.authenticated
        async def post(self):
            user = self.get_argument("user")
            server = self.get_argument("server", "")
            label = f"{user}/{server or 'default'}"
            admin.log.info("Admin %s asked to stop %s", self.admin_name(), label)
            await admin.annotate_stop(user, server)
            try:
                status = await admin.hub.stop_server(user, server)
                notice = (
                    f"Stopping {label}."
                    if status == 202
                    else f"Stopped {label}."
                    if status == 204
                    else f"{label} was not running."
                )
            except HubError as e:
                admin.log.error("Stopping %s for %s failed: %s", label, self.admin_name(), e)
                notice = f"{label} could not be stopped: {e}"
            admin.collector.invalidate()
            self.redirect(f"{prefix}?{urlencode({'notice': notice})}")

    return web.Application(
        [
            (prefix, PageHandler),
            (url_path_join(prefix, "api/status"), StatusHandler),
            (url_path_join(prefix, "stop"), StopHandler),
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        ],
        cookie_secret=os.urandom(32),
    )


def main(argv: list[str] | None = None) -> None:
    app = GPUAdmin.instance()
    app.initialize(argv)
    app.start()
