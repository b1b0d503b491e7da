"""``python -m gpuspawner.admin``: the GPU page, a hub-managed service for admins.

Served under the service's prefix (``/services/gpuspawner-admin/``):

- ``GET /`` — the page (HTML, refreshes itself);
- ``GET /api/status[?user=NAME]`` — the same report as JSON (``gpuspawner status``);
- ``GET /usage.csv`` and ``GET /intervals.csv`` (the page's usage query: ``period``,
  ``since``, ``until``, ``by``, ``group``) — the usage rows shown, and every
  server's interval in the period, for chargeback (docs/admin.md);
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
from typing import Any

from traitlets import Bool, Float, Integer, List, Unicode, default
from traitlets.config import Application, catch_config_error

from ..accounting.store import UsageStore
from ..clients.hubapi import HubClient, HubError
from ..clients.kube import KubeClient, KubeError, Reader
from ..clients.settings import (
    AccountingSettings,
    CatalogFileSettings,
    HubServiceSettings,
    KubernetesSettings,
    PrometheusSettings,
    ServiceConfigFile,
    ServiceEndpointSettings,
)
from ..core import labels, serverpod, stopreasons
from ..core.catalog import BudgetRules
from ..core.refusals import shown
from ..core.usage import UsageRow, intervals_csv, rows_csv
from .collect import Collector, KubeReader, KueueReader
from .page import UsageSection, render_page
from .report import PoolReport
from .usage import (
    QueryError,
    UsageQuery,
    database_problem,
    idle_holders,
    missing_sqlite_file,
    parse_query,
    usage_table,
)

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

#: Why there is no usage table when no usage database is configured.
NO_STORE = (
    "GPU usage is not shown: no usage database is configured "
    "($GPUSPAWNER_ACCOUNTING_DB_URL or --GPUAdmin.accounting_db_url)."
)
#: The page's usage query arguments (admin/usage.py).
USAGE_ARGUMENTS = ("period", "since", "until", "by", "group")


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
    AccountingSettings,
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

    kueue_cluster_queues = List(
        Unicode(),
        help="The Kueue ClusterQueues whose GPU quota, usage and pending work the page and `gpuspawner status` show beside the pool figures, per flavor (e.g. ['notebooks', 'batch'], docs/kueue.md). Empty: Kueue is not read. Needs read rights on Kueue for the service's account: config/rbac-kueue.yaml, or with the chart gpuspawner.admin.kueueClusterQueues, which sets this too (docs/security.md).",
    ).tag(config=True)

    refresh_seconds = Integer(30, help="How often the page reloads itself, in seconds.").tag(
        config=True
    )
    cache_seconds = Float(
        10,
        help="A report is reused for this many seconds, so several admins' pages cost one listing.",
    ).tag(config=True)

    usage_page_rows = Integer(
        5000,
        help="The usage table on the page shows at most this many rows, those with the most GPU-hours (its total and usage.csv count them all): 5,000 users fit; by user and image, say, a page of 100,000 rows would not render in a browser in reasonable time.",
    ).tag(config=True)

    idle_after = Float(
        600,
        help="The idle holders board lists GPU servers with no activity the hub recorded for at least this many seconds (and GPUs under idle_busy_threshold where Prometheus gives a figure).",
    ).tag(config=True)
    idle_busy_threshold = Float(
        5.0,
        help="A server's GPUs count as busy, and it is not an idle holder, at or above this utilisation in percent over the last 5 minutes (the culler's gpu_busy_threshold; give them the same).",
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
        queues = None
        if self.kueue_cluster_queues:
            # the same connection as the pods' and nodes' (None: the page says it is not read)
            queues = KueueReader(self.kueue_cluster_queues, kube=kube.client if kube else None)
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
            kueue=queues,
        )
        self.usage_store = None
        self.usage_problem = ""
        self._week: tuple[float, float, dict] | None = None
        if self.accounting_db_url:
            try:
                self.usage_store = UsageStore(self.accounting_db_url)
            except Exception as e:  # a URL SQLAlchemy cannot use: the page says so
                self.usage_problem = database_problem(self.accounting_db_url, e)
                self.log.error("%s", self.usage_problem)

    def budget_rules(self) -> BudgetRules | None:
        """The catalog's budget rules (their week and month are the page's), or the defaults."""
        catalog, _ = self.collector.catalog()
        return catalog.limits.gpu_hours if catalog is not None else None

    async def read_store(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A store method run off the event loop; a failure becomes :class:`QueryError`'s sentence."""
        missing = missing_sqlite_file(self.accounting_db_url)
        if missing:
            raise QueryError(missing)
        try:
            return await asyncio.to_thread(getattr(self.usage_store, method), *args, **kwargs)
        except Exception as e:  # any driver or SQL error: one sentence, on the page and logged
            problem = database_problem(self.accounting_db_url, e)
            self.log.warning("%s", problem)
            raise QueryError(problem) from None

    async def usage_query(self, args: dict[str, str], now: float) -> UsageQuery:
        """The admin's query, or :class:`QueryError` (also when there is no store)."""
        if self.usage_store is None:
            raise QueryError(self.usage_problem or NO_STORE)
        return parse_query(args, now, self.budget_rules())

    async def week_by_user(self, now: float) -> dict[str, UsageRow]:
        """This week's rows by user (for the idle holders), reused for ``cache_seconds``."""
        query = parse_query({"period": "week"}, now, self.budget_rules())
        if self._week and self._week[1] == query.since and now - self._week[0] < self.cache_seconds:
            return self._week[2]
        rows = await self.read_store("summary", query.since, now, now, ("user",))
        week = {row.key[0]: row for row in rows}
        self._week = (now, query.since, week)
        return week

    async def usage_section(
        self, args: dict[str, str], report: PoolReport
    ) -> tuple[UsageSection, bool]:
        """The page's usage section and idle holders board; (section, whether the query was good)."""
        now = time.time()
        catalog, _ = self.collector.catalog()
        groups = sorted({g for u in report.users for g in u.groups or ()})
        holders_problem, week = "", None
        if self.usage_store is not None:
            try:
                week = await self.week_by_user(now)
            except QueryError as e:
                holders_problem = f"GPU-hours this week are not shown: {e}"
        holders = tuple(
            idle_holders(
                report,
                week,
                idle_after=self.idle_after,
                busy_threshold=self.idle_busy_threshold / 100,
            )
        )
        common = dict(
            form=args,
            holders=holders,
            holders_problem=holders_problem,
            groups=tuple(groups),
            idle_after=self.idle_after,
        )
        if self.usage_store is None:
            note = self.usage_problem or NO_STORE
            return UsageSection(note=note, **common), True
        try:
            query = await self.usage_query(args, now)
        except QueryError as e:
            return UsageSection(problem=str(e), **common), False
        try:
            rows = await self.read_store(
                "summary", query.since, query.until, now, query.by, group=query.group
            )
        except QueryError as e:
            return UsageSection(query=query, problem=str(e), **common), True
        table = usage_table(rows, query.by, catalog, limit=self.usage_page_rows)
        return UsageSection(query=query, table=table, **common), True

    def close_store(self) -> None:
        if self.usage_store is not None:
            self.usage_store.close()

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
            args = usage_arguments(self)
            usage, good = await admin.usage_section(args, report)
            self.set_header("Cache-Control", "no-store")
            if not good:
                self.set_status(400)
            self.write(
                render_page(
                    report,
                    admin=self.admin_name(),
                    stop_url=url_path_join(prefix, "stop"),
                    xsrf_token=self.xsrf_token.decode()
                    if isinstance(self.xsrf_token, bytes)
                    else self.xsrf_token,
                    # an admin choosing a period is not interrupted by a reload
                    refresh_seconds=0 if args else admin.refresh_seconds,
                    notice=notice,
                    usage=usage,
                    page_url=prefix,
                )
            )

    class CSVHandler(Base):
        """``usage.csv`` (the rows the page shows) and ``intervals.csv`` (every interval)."""

        kind = "usage"

        async def csv(self, query: UsageQuery, now: float) -> str:
            rows = await admin.read_store(
                "summary", query.since, query.until, now, query.by, group=query.group
            )
            return rows_csv(rows, query.by)

        @web.authenticated
        async def get(self):
            now = time.time()
            self.set_header("Cache-Control", "no-store")
            try:
                query = await admin.usage_query(usage_arguments(self), now)
                body = await self.csv(query, now)
            except QueryError as e:
                self.set_status(400 if admin.usage_store is not None else 404)
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                self.finish(f"{e}\n")
                return
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            # the name holds only [a-z0-9.-] (UsageQuery.filename): nothing to quote
            self.set_header(
                "Content-Disposition", f'attachment; filename="{query.filename(self.kind)}"'
            )
            self.finish(body)

    class IntervalsCSVHandler(CSVHandler):
        kind = "intervals"

        async def csv(self, query: UsageQuery, now: float) -> str:
            intervals = await admin.read_store(
                "intervals", query.since, query.until, group=query.group
            )
            return intervals_csv(intervals, query.since, query.until, now)

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
            (url_path_join(prefix, "usage.csv"), CSVHandler),
            (url_path_join(prefix, "intervals.csv"), IntervalsCSVHandler),
            (url_path_join(prefix, "stop"), StopHandler),
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        ],
        cookie_secret=os.urandom(32),
    )


def usage_arguments(handler) -> dict[str, str]:
    """The usage query's arguments a request gave (the last of each), as typed."""
    return {
        name: handler.get_argument(name, strip=False)
        for name in USAGE_ARGUMENTS
        if handler.get_argument(name, None) is not None
    }


def main(argv: list[str] | None = None) -> None:
    app = GPUAdmin.instance()
    app.initialize(argv)
    app.start()
