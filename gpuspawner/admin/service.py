"""``python -m gpuspawner.admin``: the GPU page, a hub-managed service for admins.

Served under the service's prefix (``/services/gpuspawner-admin/``):

- ``GET /`` — the page (HTML, refreshes itself);
- ``GET /api/status[?user=NAME]`` — the same report as JSON (``gpuspawner status``);
- ``POST /stop`` (``user``, ``server``) — stops a server through the hub's API
  with the service's token (scope ``delete:servers``); the hub logs the DELETE
  and this service logs which admin asked. The outcome is shown once on the
  page that follows, passed in a signed cookie (never in the URL, where anyone
  could write a "notice" into a link to the page).

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

from traitlets import Bool, Float, Integer, default
from traitlets.config import Application, catch_config_error

from ..clients.hubapi import HubClient, HubError
from ..clients.kube import KubeClient, KubeError, Reader
from ..clients.settings import (
    CatalogFileSettings,
    HubServiceSettings,
    KubernetesSettings,
    PrometheusSettings,
    ServiceConfigFile,
    ServiceEndpointSettings,
)
from ..core import labels, serverpod, stopreasons
from ..core.refusals import shown
from .collect import Collector, KubeReader
from .page import render_page

#: The custom scope that lets a user see the page and stop servers from it.
ADMIN_SCOPE = "custom:gpuspawner:admin"
#: The service's name in the hub config (its URL prefix is /services/<name>/).
SERVICE_NAME = "gpuspawner-admin"
#: The signed cookie that carries a stop's outcome to the next page view.
NOTICE_COOKIE = "gpuspawner-admin-notice"
#: A notice older than this (days) is not shown: it belongs to an earlier visit.
NOTICE_MAX_AGE_DAYS = 1 / 24 / 12
#: Longest notice kept: a browser drops a cookie over 4 kB, and the notice with it.
NOTICE_LENGTH = 1000

#: Characters of a user or server name an audit line keeps (quoted and escaped, see ``shown``).
LOGGED_NAME_LENGTH = 300

#: The page runs no script, loads nothing from elsewhere and is never framed; saying so
#: means an escaping mistake cannot run code and no other site can frame the stop buttons.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

#: The hub stopped the server (202: stopping, 204: stopped); anything else, it did not.
STOPPED_STATUSES = (202, 204)


def stop_outcome(label: str, status: int) -> str:
    """The sentence shown after the hub answered ``status`` to a stop of ``label``."""
    if status == 202:
        return f"Stopping {label}."
    if status == 204:
        return f"Stopped {label}."
    return f"{label} was not running."


def short_notice(text: str, limit: int = NOTICE_LENGTH) -> str:
    """``text`` cut to ``limit`` characters, so that it fits in a cookie."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        False,
        help="Count GPUs held by pods in every namespace in the figures per type, not only the hub's own (as GPUSpawner.gpu_inventory_all_namespaces, off by default for the same reason: a cluster-wide pod list holds other workloads' credentials). Turn on only with the opt-in cluster-wide pod read, config/rbac-opt-in-all-namespaces.yaml.",
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

    async def annotate_stop(self, user: str, server: str) -> list[tuple[str, str]]:
        """Mark the server's pod "stopped by an admin" before the stop, for its user to read.

        GPUSpawner keeps the annotation when the hub stops the server and shows
        it to the user (docs/culler.md, "Why it stopped"). A failure is logged
        and does not prevent the stop. Returns the (name, namespace) of each pod
        marked, for :meth:`unmark_stop` should the stop fail.
        """
        kube = getattr(self, "kube", None)
        if kube is None:
            return []
        notice = stopreasons.StopNotice(stopreasons.REASON_ADMIN, time.time())
        value = json.dumps(notice.to_state())
        marked: list[tuple[str, str]] = []
        try:
            for pod in serverpod.server_pods(await kube.client.list_pods(serverpod.selector())):
                if pod.key == (user, server) and pod.active:
                    await kube.client.annotate_pod(
                        pod.name, pod.namespace, {labels.ANNOTATION_STOP_REASON: value}
                    )
                    marked.append((pod.name, pod.namespace))
        except KubeError as e:
            self.log.warning(
                "Could not mark %s as stopped by an admin, so its user is not told why: %s",
                shown(f"{user}/{server or 'default'}", LOGGED_NAME_LENGTH),
                e,
            )
        return marked

    async def unmark_stop(self, user: str, server: str, pods: list[tuple[str, str]]) -> None:
        """Take the "stopped by an admin" mark off ``pods`` again: the hub did not stop the server.

        Left on, it would tell the user, when they stop the server themselves
        later, that an admin stopped it.
        """
        kube = getattr(self, "kube", None)
        if kube is None:
            return
        for name, namespace in pods:
            try:
                await kube.client.annotate_pod(
                    name, namespace, {labels.ANNOTATION_STOP_REASON: None}
                )
            except KubeError as e:
                self.log.warning(
                    "Could not take the admin's stop mark off pod %s/%s of %s, whose stop "
                    "failed, so its user may later read that an admin stopped it: %s",
                    namespace,
                    name,
                    shown(f"{user}/{server or 'default'}", LOGGED_NAME_LENGTH),
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

        def set_default_headers(self) -> None:
            super().set_default_headers()
            self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            # a browser that guessed the JSON was HTML would render names in it
            self.set_header("X-Content-Type-Options", "nosniff")

        def admin_name(self) -> str:
            return self.current_user.get("name", "?")

    class PageHandler(Base):
        def take_notice(self) -> str:
            """The outcome of this admin's last stop, once (set by StopHandler)."""
            value = self.get_secure_cookie(NOTICE_COOKIE, max_age_days=NOTICE_MAX_AGE_DAYS)
            if self.get_cookie(NOTICE_COOKIE) is not None:
                self.clear_cookie(NOTICE_COOKIE, path=prefix)
            return value.decode("utf-8", "replace") if value else ""

        @web.authenticated
        async def get(self):
            report = await admin.collector.report()
            notice = self.take_notice()
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
                    notice=notice,
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
            admin.log.info(
                "Admin %s asked to stop %s",
                shown(self.admin_name(), LOGGED_NAME_LENGTH),
                shown(label, LOGGED_NAME_LENGTH),
            )
            marked = await admin.annotate_stop(user, server)
            stopped = False
            try:
                status = await admin.hub.stop_server(user, server)
                stopped = status in STOPPED_STATUSES
                notice = stop_outcome(label, status)
            except HubError as e:
                admin.log.error(
                    "Stopping %s for %s failed: %s",
                    shown(label, LOGGED_NAME_LENGTH),
                    shown(self.admin_name(), LOGGED_NAME_LENGTH),
                    e,
                )
                notice = f"{label} could not be stopped: {e}"
            finally:
                # the mark says "an admin stopped it": true only if the hub did stop it
                if not stopped and marked:
                    await admin.unmark_stop(user, server, marked)
            admin.collector.invalidate()
            self.set_secure_cookie(
                NOTICE_COOKIE,
                short_notice(notice),
                expires_days=None,
                path=prefix,
                httponly=True,
                samesite="Lax",
            )
            self.redirect(prefix)

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
