"""``gpuspawner-culler``: the GPU-aware idle culler, run as a JupyterHub service.

Every ``cull_every`` seconds one pass: list the hub's users with servers
(paginated), optionally list GPUSpawner's pods (pod names, GPU labels, pending
GPU requests), ask Prometheus two queries for the GPU activity of all pods,
give each server its deadline (:mod:`gpuspawner.culler.deadlines`: the
catalog's ``max_runtime``, the user's GPU-hours budget from the usage store),
decide with :mod:`gpuspawner.culler.policy`, and stop what should be stopped
(a bounded number at a time). ``/api/keep`` records a user's "keep it".
``/metrics`` serves Prometheus metrics to hub tokens with the ``read:metrics``
scope, as the hub's own ``/hub/metrics`` does.

Configured like the hub: ``c.GPUCuller.*`` in a config file
(``--config``, default ``gpuspawner_culler_config.py``) or on the command line
(``--GPUCuller.dry_run=True``, or the short flags shown by ``--help``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import replace
from urllib.parse import urlparse

from traitlets import Bool, Dict, Float, Integer, List, Unicode, default
from traitlets.config import Application, catch_config_error

from .._version import __version__
from ..clients.hubapi import HubClient, HubError
from ..clients.kube import Expired, KubeClient, KubeError, NotFound, Reader, Refused
from ..clients.kueue import KueueClient
from ..clients.prometheus import PrometheusClient, PrometheusError
from ..clients.settings import (
    AccountingSettings,
    CatalogFileSettings,
    HubServiceSettings,
    KubernetesSettings,
    PrometheusSettings,
    ServiceConfigFile,
)
from ..core import kueue
from ..core.budgets import current_period
from ..core.catalog import Catalog, CatalogError, CatalogFile
from ..core.endpoints import CULLER_KEEP_API
from ..core.refusals import shown
from ..core.serverpod import selector
from ..core.stopreasons import CullWarning
from . import annotations, deadlines, gpustatus, policy
from .demand import HubDemand, parse_hub_metrics, total_by_type
from .hub import list_servers
from .kueuedemand import KueueDemand, head_keys, kueue_demand
from .pods import pods_by_server, waiting_requests, warnings_on_pods, with_pods
from .prometheus import GPUStatusReader, gpu_view
from .warningapi import KeepAnswer, keep_request, warning_answer

#: The hub scope a token needs to read the culler's /metrics (the hub's /hub/metrics needs it too).
METRICS_SCOPE = "read:metrics"


class CullerMetrics:
    """The culler's Prometheus metrics, in their own registry."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        prefix = "gpuspawner_culler"
        self.culls = Counter(
            f"{prefix}_culls", "Servers stopped", ["reason", "profile"], registry=r
        )
        self.would_culls = Counter(
            f"{prefix}_would_culls",
            "Servers that would have been stopped (dry run)",
            ["reason", "profile"],
            registry=r,
        )
        self.warnings = Counter(
            f"{prefix}_warnings", "Cull warnings given", ["reason", "profile"], registry=r
        )
        self.would_warnings = Counter(
            f"{prefix}_would_warnings",
            "Cull warnings that would have been given (dry run)",
            ["reason", "profile"],
            registry=r,
        )
        self.gpus_reclaimed = Counter(
            f"{prefix}_gpus_reclaimed",
            "GPUs given back by stopping servers",
            ["gpu_type"],
            registry=r,
        )
        self.idle_servers = Gauge(
            f"{prefix}_idle_servers",
            "Servers considered idle (over their timeout) in the last pass",
            ["gpu_type"],
            registry=r,
        )
        self.warned_servers = Gauge(
            f"{prefix}_warned_servers", "Servers warned and not yet culled", registry=r
        )
        self.gpu_missing = Gauge(
            f"{prefix}_gpu_metrics_missing_servers",
            "GPU servers counted as busy because their GPU metrics are missing or Prometheus did not answer",
            registry=r,
        )
        self.pressure = Gauge(
            f"{prefix}_pressure_waiting_gpus",
            "GPUs requested by requests waiting for GPUs of the type (all sources)",
            ["gpu_type"],
            registry=r,
        )
        self.demand = Gauge(
            f"{prefix}_demand_gpus",
            "GPUs requested by requests waiting for GPUs in the last pass, by source "
            "(queued or refused in the hub, pending pods, kueue: the heads of Kueue's "
            "ClusterQueues)",
            ["gpu_type", "source"],
            registry=r,
        )
        self.freed_for_demand = Counter(
            f"{prefix}_gpus_freed_for_demand",
            "GPUs given back by pressure culls so that a waiting request fits on a node",
            ["gpu_type"],
            registry=r,
        )
        self.unserved_demand = Gauge(
            f"{prefix}_unserved_demand_gpus",
            "GPUs of waiting requests that no cull could make fit on one node in the last pass",
            ["gpu_type"],
            registry=r,
        )
        self.errors = Counter(f"{prefix}_errors", "Errors by source", ["source"], registry=r)
        self.pass_duration = Histogram(
            f"{prefix}_pass_duration_seconds",
            "Duration of a culling pass",
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.last_success = Gauge(
            f"{prefix}_last_success_timestamp_seconds",
            "When the last pass completed",
            registry=r,
        )
        for source in (
            "hub",
            "hub-metrics",
            "prometheus",
            "kubernetes",
            "internal",
            "catalog",
            "accounting",
            "kueue",
        ):
            self.errors.labels(source=source)


class GPUCuller(
    ServiceConfigFile,
    CatalogFileSettings,
    AccountingSettings,
    HubServiceSettings,
    KubernetesSettings,
    PrometheusSettings,
    Application,
):
    name = "gpuspawner-culler"
    # `gpuspawner-culler --version` (traitlets' Application prints it)
    version = __version__
    description = "Stop idle JupyterHub servers, GPU-aware: per-profile timeouts, GPU utilisation from Prometheus and pool pressure."

    default_config_file = "gpuspawner_culler_config.py"

    # --- the hub ----------------------------------------------------------

    hub_timeout = Float(
        30, help="Seconds before one hub API request is abandoned (and retried)."
    ).tag(config=True)
    max_retries = Integer(
        4, help="Retries of a hub API request after a connection error, timeout, 429 or 5xx answer."
    ).tag(config=True)
    backoff_base = Float(
        0.5,
        help="Seconds before the first retry; each further retry waits twice as long (with jitter), at most backoff_max.",
    ).tag(config=True)
    backoff_max = Float(30, help="The longest wait between two retries, in seconds.").tag(
        config=True
    )
    page_size = Integer(200, help="Users per page when listing /users.").tag(config=True)
    concurrency = Integer(10, help="At most this many servers are stopped at the same time.").tag(
        config=True
    )

    # --- when to cull -------------------------------------------------------
    cull_every = Integer(300, help="Seconds between two passes.").tag(config=True)
    once = Bool(False, help="Run one pass and exit (for cron jobs and benchmarks).").tag(
        config=True
    )
    dry_run = Bool(
        False,
        help="Only log and count what would be culled and warned (would_culls, would_warnings metrics): stop nothing and tell no user (no /api/warning answer, no pod annotation).",
    ).tag(config=True)
    timeout = Integer(
        3600,
        help="Idle timeout in seconds for servers no rule in `timeouts` matches; 0: never cull those for idleness.",
    ).tag(config=True)
    gpu_timeout = Integer(
        0,
        help="Stop a GPU server whose GPUs (with fresh metrics) have been idle this many seconds even if Jupyter reports activity (an open browser tab keeps it 'active'), for servers no rule in `timeouts` matches; 0: off. Needs prometheus_url.",
    ).tag(config=True)
    timeouts = List(
        Dict(),
        help="""Idle timeouts per kind of server, first match wins. Each rule is a dict with
        `timeout` (seconds; idle by both Jupyter and GPU activity) and/or `gpu_timeout`
        (seconds of idle GPUs, whatever Jupyter says) and any of `profile`, `gpu_type`
        ("none" for CPU-only), `gpus` (exact count), `min_gpus`, `max_gpus`. Example:
        [{"min_gpus": 8, "timeout": 1800}, {"gpu_type": "h100", "timeout": 3600},
        {"min_gpus": 1, "timeout": 7200}, {"gpu_type": "none", "timeout": 28800}]""",
    ).tag(config=True)
    max_age = Integer(
        0,
        help="Stop any server running longer than this many seconds, active or not (a backstop); 0: off.",
    ).tag(config=True)
    min_running = Integer(
        300, help="Never cull a server that has been running for less than this many seconds."
    ).tag(config=True)
    exempt_users = List(Unicode(), help="Users whose servers are never culled.").tag(config=True)
    exempt_groups = List(
        Unicode(),
        help="Groups whose members' servers are never culled (needs the read:users:groups scope).",
    ).tag(config=True)
    cull_admin_users = Bool(
        True, help="Cull admins' servers like everyone's; False exempts admins."
    ).tag(config=True)
    warning_period = Integer(
        0,
        help="Seconds between the warning and the cull: an eligible server is first warned (logged, /warnings, warned_servers metric) and culled only on a later pass, this long after, if it is still idle on fresh data; 0: cull at once.",
    ).tag(config=True)

    # --- deadlines and keeps (the catalog: `catalog_file`) ----------------------
    default_max_keep = Float(
        14400,
        help="The longest keep (seconds) a user may choose for a server whose catalog image sets no max_keep; 0: no keep.",
    ).tag(config=True)
    keep_choices = List(
        Float(),
        [3600, 14400],
        help="The keeps (seconds) a cull warning offers ('Keep for 1 h', 'Keep for 4 h'); those above a server's max_keep are left out.",
    ).tag(config=True)
    keep_overrides_pressure = Bool(
        False,
        help="A kept server is not stopped for waiting requests either (pressure mode); False: pressure takes kept servers' GPUs, and a keep is refused while requests wait for them.",
    ).tag(config=True)
    keep_services = List(
        Unicode(),
        ["gpuspawner"],
        help="Services that may ask /api/keep on behalf of a user they name (the user service behind the home page's buttons).",
    ).tag(config=True)

    # --- GPU activity (Prometheus: `prometheus_url`, metric and label names) ---
    gpu_busy_threshold = Float(5.0, help="A GPU is busy above this utilisation, in percent.").tag(
        config=True
    )
    gpu_window = Integer(
        0,
        help="Seconds of GPU history looked at; a GPU idle for the whole window counts as idle since its start. 0: the longest idle timeout configured.",
    ).tag(config=True)
    gpu_query_step = Integer(
        60, help="Resolution in seconds of the last-busy lookup (the subquery step)."
    ).tag(config=True)
    gpu_freshness = Integer(
        300,
        help="A GPU server without GPU samples in this many seconds has missing metrics and counts as busy.",
    ).tag(config=True)
    gpu_status_poll = Integer(
        15,
        help="How often, in seconds, clients of /api/gpu-status (JupyterLab's GPU item) are told to ask, and how long the culler reuses one reading of Prometheus for them all: set it to Prometheus's scrape interval of the DCGM exporter. Kept within 5..60.",
    ).tag(config=True)

    # --- pressure (Kubernetes: `kubernetes`, `namespace`) ---------------------
    pressure_timeout = Integer(
        900,
        help="While GPU requests of a type wait for GPUs, servers of that type idle longer than this (seconds) are culled, longest-idle first, as many as the waiting requests need; 0: no pressure culling.",
    ).tag(config=True)
    pressure_timeouts = Dict(
        help="Pressure timeouts per GPU type, e.g. {'h100': 600}; types not listed use pressure_timeout."
    ).tag(config=True)
    kueue_cluster_queues = List(
        Unicode(),
        help="""Kueue ClusterQueues whose queue counts as demand in pressure mode: each pass
        reads their pending workloads (Kueue's visibility API), the Workload at the head of
        each (a notebook or a Job: its pod sets' GPUs, per pod), the ClusterQueues and the
        ResourceFlavors, and frees idle servers so that the head fits. The flavor's node
        labels name the catalog GPU type (needs catalog_file). Needs, for the hub's service
        account, cluster-wide: get on clusterqueues and workloads and list on
        resourceflavors (kueue.x-k8s.io), get on clusterqueues/pendingworkloads
        (visibility.kueue.x-k8s.io): config/rbac-kueue.yaml, or the chart's
        gpuspawner.culler.kueueClusterQueues. Empty (the default): Kueue is not read.""",
    ).tag(config=True)
    hub_demand = Bool(
        True,
        help="Read the GPU requests the hub holds back (queued, or refused for lack of free GPUs lately) and the free GPUs per node from the hub's /hub/metrics (needs the read:metrics scope), so pressure mode also frees GPUs for requests that never became a Pending pod. False: only Pending pods count.",
    ).tag(config=True)

    # --- metrics endpoint ---------------------------------------------------
    metrics_url = Unicode(
        help="Where /metrics (a hub token with read:metrics), /warnings (every warned server; a hub token with read:servers), /api/warning (the caller's own warned servers; a hub token) and /api/gpu-status (the GPU load of the caller's own servers; a hub token) are served, also under the service's prefix. Default: $JUPYTERHUB_SERVICE_URL (the service's url in the hub config), else http://127.0.0.1:10101. Empty string: no endpoint."
    ).tag(config=True)

    @default("metrics_url")
    def _default_metrics_url(self):
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")

    aliases = {
        "config": "GPUCuller.config_file",
        "url": "GPUCuller.hub_api_url",
        "cull-every": "GPUCuller.cull_every",
        "timeout": "GPUCuller.timeout",
        "max-age": "GPUCuller.max_age",
        "min-running": "GPUCuller.min_running",
        "warning-period": "GPUCuller.warning_period",
        "concurrency": "GPUCuller.concurrency",
        "prometheus-url": "GPUCuller.prometheus_url",
        "pressure-timeout": "GPUCuller.pressure_timeout",
        "kubernetes": "GPUCuller.kubernetes",
        "namespace": "GPUCuller.namespace",
        "metrics-url": "GPUCuller.metrics_url",
        "log-level": "Application.log_level",
    }
    flags = {
        "dry-run": ({"GPUCuller": {"dry_run": True}}, "Only report what would be culled."),
        "once": ({"GPUCuller": {"once": True}}, "Run one pass and exit."),
    }

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.metrics = CullerMetrics()
        #: The warnings standing (in a dry run: that would stand), carried to the next pass.
        self.warned: dict[tuple[str, str], policy.WarningMark] = {}
        #: Servers whose pod carries a cull warning, and its cull time (None: unreadable),
        #: as the last pod list showed and this culler's writes since changed it.
        self.annotated: dict[tuple[str, str], float | None] = {}
        #: The servers of the last pass: a warning on their pods is not taken up again.
        self._seen: set[tuple[str, str]] = set()
        self.last_decisions: list[policy.Decision] = []
        #: Held by a pass from its reads to its acts, and by a keep: a pass that read the
        #: pods before a keep would otherwise warn or stop the kept server after it, and
        #: put back its decisions without the keep.
        self._pass_lock = asyncio.Lock()
        #: When the last pass began (None: none yet); passes follow every cull_every seconds.
        self.last_pass_at: float | None = None
        self.gpu_status: GPUStatusReader | None = None
        self.hub: HubClient | None = None
        self.prometheus: PrometheusClient | None = None
        self.pods: KubeClient | None = None
        self.last_pressure: list[policy.PressureOutcome] = []
        self._hub_demand_warned = False
        self.kueue: KueueClient | None = None
        #: Whether the Kueue read's failure was logged; the parts of its demand left out
        #: last pass (logged when they first were).
        self._kueue_warned = False
        self._kueue_skips_logged: set[str] = set()
        self._groups_warned = False
        self.catalog_source: CatalogFile | None = None
        #: The usage store (gpuspawner.accounting.store.UsageStore); None: no budgets enforced
        self.store = None

    @catch_config_error
    def initialize(self, argv=None):
        super().initialize(argv)
        self.load_service_config()
        self.policy = self.build_policy()
        self._setup_clients()
        self._setup_deadlines()

    # --- set-up ---------------------------------------------------------------
    def build_policy(self) -> policy.Policy:
        """The pure policy from the traits; a malformed rule stops the service with one sentence."""
        try:
            rules = tuple(policy.parse_rule(r) for r in self.timeouts)
        except ValueError as e:
            self.exit_with(f"GPUCuller.timeouts: {e}")
        return policy.Policy(
            rules=rules,
            default_timeout=float(self.timeout) if self.timeout > 0 else None,
            default_gpu_timeout=float(self.gpu_timeout) if self.gpu_timeout > 0 else None,
            max_age=float(self.max_age) if self.max_age > 0 else None,
            min_running=float(self.min_running),
            exempt_users=frozenset(self.exempt_users),
            exempt_groups=frozenset(self.exempt_groups),
            cull_admin_users=self.cull_admin_users,
            pressure_timeouts={k: float(v) for k, v in self.pressure_timeouts.items()},
            default_pressure_timeout=float(self.pressure_timeout)
            if self.pressure_timeout > 0
            else None,
            warning_period=float(self.warning_period),
            keep_choices=tuple(float(c) for c in self.keep_choices),
            keep_overrides_pressure=self.keep_overrides_pressure,
        )

    def exit_with(self, message: str):
        self.log.critical("gpuspawner-culler cannot start: %s", message)
        self.exit(1)

    def gpu_window_seconds(self) -> int:
        if self.gpu_window > 0:
            return self.gpu_window
        p = self.policy
        timeouts = [t for r in p.rules for t in (r.timeout, r.gpu_timeout) if t]
        timeouts += [
            t for t in (p.default_timeout, p.default_gpu_timeout, p.default_pressure_timeout) if t
        ]
        timeouts += list(self.policy.pressure_timeouts.values())
        return int(max(timeouts or [3600]))

    def _setup_clients(self) -> None:
        if not self.api_token:
            self.exit_with("no API token: set $JUPYTERHUB_API_TOKEN or c.GPUCuller.api_token.")
        self.hub = HubClient(
            self.hub_api_url,
            self.api_token,
            timeout=self.hub_timeout,
            max_retries=self.max_retries,
            backoff_base=self.backoff_base,
            backoff_max=self.backoff_max,
            page_size=self.page_size,
            log=self.log,
        )
        try:
            self.prometheus = self.prometheus_client(
                threshold=self.gpu_busy_threshold / 100,
                window=self.gpu_window_seconds(),
                step=self.gpu_query_step,
                freshness=self.gpu_freshness,
            )
        except ValueError as e:
            self.exit_with(str(e))
        if self.prometheus is None:
            self.log.info("No prometheus_url: only Jupyter activity decides idleness.")
        self.gpu_status = GPUStatusReader(
            self.prometheus, ttl=gpustatus.poll_seconds(self.gpu_status_poll)
        )
        if self.use_kubernetes():
            self.pods = KubeClient(self.namespace, Reader(logger=self.log))
        else:
            self.log.info(
                "Kubernetes not configured: no pressure mode; pods known from server state."
            )

    def _setup_deadlines(self) -> None:
        """The catalog (max_runtime, max_keep, budgets) and the usage store (budgets' use)."""
        if self.catalog_file:
            self.catalog_source = CatalogFile(self.catalog_file)
        else:
            self.log.info("No catalog_file: no max_runtime, budgets or per-image max_keep.")
        if not self.accounting_db_url:
            self.log.info(
                "No accounting_db_url: the culler does not stop servers at their users' "
                "GPU-hours budgets."
            )
            return
        from ..accounting.store import StoreError, UsageStore

        try:
            self.store = UsageStore(self.accounting_db_url)
        except StoreError as e:
            self.exit_with(f"GPUCuller.accounting_db_url: {e}")

    def catalog(self) -> Catalog | None:
        """The catalog in effect; None (logged, counted) when there is none or it is unreadable."""
        if self.catalog_source is None:
            return None
        try:
            catalog, _ = self.catalog_source.get()
        except CatalogError as e:
            self.metrics.errors.labels(source="catalog").inc()
            self.log.warning("The catalog could not be read (%s); no deadlines this pass.", e)
            return None
        return catalog

    async def _with_deadlines(
        self, servers: list[policy.Server], now: float, catalog: Catalog | None
    ) -> list:
        """The servers with their deadlines and max_keep; without budgets if the store fails."""
        budgets: dict = {}
        rules = catalog.limits.gpu_hours if catalog is not None else None
        users = deadlines.budget_users(rules, servers) if rules and self.store else []
        if users:
            period = current_period(rules, now)
            try:
                used = await asyncio.to_thread(
                    self.store.used_unit_seconds, users, period.start, now, now
                )
            except Exception as e:  # any database error: the pass goes on without budgets
                self.metrics.errors.labels(source="accounting").inc()
                self.log.warning(
                    "The usage store could not be read (%s); no budget deadlines this pass.",
                    str(e).splitlines()[0] if str(e) else type(e).__name__,
                )
            else:
                budgets = deadlines.budget_deadlines(rules, servers, used, catalog, now)
        return deadlines.with_deadlines(servers, catalog, budgets, float(self.default_max_keep))

    # --- one pass --------------------------------------------------------------
    async def _gpu_view(self, now: float) -> policy.GPUView:
        if self.prometheus is None:
            return policy.GPUView()
        try:
            return await gpu_view(self.prometheus, now)
        except PrometheusError as e:
            self.metrics.errors.labels(source="prometheus").inc()
            self.log.warning("%s; every GPU server counts as busy this pass.", e)
            return policy.GPUView(enabled=True, ok=False)

    async def cull_pass(self) -> list[policy.Decision] | None:
        """One pass; returns the decisions, or None if the hub could not be read."""
        async with self._pass_lock:
            return await self._cull_pass()

    async def _cull_pass(self) -> list[policy.Decision] | None:
        started = time.monotonic()
        now = time.time()
        try:
            servers = await list_servers(self.hub)
        except HubError as e:
            self.metrics.errors.labels(source="hub").inc()
            self.log.error("Pass abandoned, the hub's users could not be listed: %s", e)
            return None
        pending: list[policy.Request] | None = None
        on_pods: dict[tuple[str, str], CullWarning | None] = {}
        if self.pods is not None:
            try:
                pods = await self._list_pods()
            except KubeError as e:
                self.metrics.errors.labels(source="kubernetes").inc()
                self.log.warning("%s; no pressure mode this pass.", e)
            else:
                servers = with_pods(servers, pods_by_server(pods))
                pending = waiting_requests(pods)
                on_pods = warnings_on_pods(pods)
                self.annotated = {
                    key: None if w is None else w.cull_after for key, w in on_pods.items()
                }
        pressure = None
        catalog = self.catalog()
        # Without the pods there are no nodes to free GPUs on: no pressure mode.
        if pending is not None:
            hub_demand = await self._hub_demand()
            queued = await self._kueue_demand(catalog)
            pressure = policy.Pressure(
                requests=hub_demand.requests + tuple(pending) + queued, free=hub_demand.free
            )
        if (
            self.policy.exempt_groups
            and not self._groups_warned
            and any(s.groups is None for s in servers)
        ):
            self._groups_warned = True
            self.log.error(
                "exempt_groups is set but the hub does not show users' groups: give the "
                "service the read:users:groups scope; until then no server is culled."
            )
        servers = await self._with_deadlines(servers, now, catalog)
        gpu = await self._gpu_view(now)
        # Warnings on the pods of servers this culler has not decided on yet (all of
        # them after a restart) are taken up; its own, in memory, win.
        fresh = {key: w for key, w in on_pods.items() if key not in self._seen}
        marks = {
            **annotations.adopt(fresh, now, self.policy.warning_period, grace=self.cull_every),
            **self.warned,
        }
        result = policy.decide_pass(
            servers, now, self.policy, gpu=gpu, pressure=pressure, warned=marks
        )
        decisions, self.warned = result.decisions, result.warned
        self.last_decisions = decisions
        self.last_pass_at = now
        self.last_pressure = result.pressure
        self._seen = {d.server.key for d in decisions}
        await self._act(decisions, marks)
        self._record(decisions, pressure, result.pressure)
        self.metrics.pass_duration.observe(time.monotonic() - started)
        self.metrics.last_success.set(time.time())
        return decisions

    async def _list_pods(self) -> list[dict]:
        """GPUSpawner's pods; raises KubeError."""
        try:
            return await self.pods.list_pods(selector())
        except Expired as e:
            # the list outlived its continue token (410 Gone): it starts again, once
            self.log.info("%s; listing the pods again from the start.", e)
            return await self.pods.list_pods(selector())

    async def _hub_demand(self) -> HubDemand:
        """The requests the hub holds back and the free GPUs per node; empty if unreadable."""
        if not self.hub_demand:
            return HubDemand()
        try:
            return parse_hub_metrics(await self.hub.metrics())
        except (HubError, ValueError) as e:
            self.metrics.errors.labels(source="hub-metrics").inc()
            if not self._hub_demand_warned:
                self._hub_demand_warned = True
                self.log.warning(
                    "The hub's GPU demand could not be read (%s); pressure mode counts only "
                    "Pending pods. Give the service the read:metrics scope, or set "
                    "c.GPUCuller.hub_demand = False.",
                    e,
                )
            return HubDemand()

    async def _kueue_demand(self, catalog: Catalog | None) -> tuple[policy.Request, ...]:
        """The requests of the heads of ``kueue_cluster_queues``; none when Kueue is not
        read, the catalog is missing, or the read fails (logged once, counted)."""
        if not self.kueue_cluster_queues or self.pods is None:
            return ()
        if catalog is None:
            if not self._kueue_warned:
                self._kueue_warned = True
                self.log.warning(
                    "kueue_cluster_queues is set but the catalog cannot be read (catalog_file): "
                    "without its GPU types Kueue's flavors name no GPU type, so pressure mode "
                    "does not count Kueue's queue."
                )
            return ()
        try:
            if self.kueue is None:
                self.kueue = await KueueClient.from_kube(self.pods)
            demand = await self._read_kueue(self.kueue, catalog)
        except KubeError as e:
            self.metrics.errors.labels(source="kueue").inc()
            if not self._kueue_warned:
                self._kueue_warned = True
                self.log.warning(
                    "Kueue's queue could not be read (%s); pressure mode goes on without it "
                    "(the culler needs get on clusterqueues and workloads and list on "
                    "resourceflavors of kueue.x-k8s.io, and get on "
                    "clusterqueues/pendingworkloads of visibility.kueue.x-k8s.io: "
                    "config/rbac-kueue.yaml).",
                    e,
                )
            return ()
        if self._kueue_warned:
            self._kueue_warned = False
            self.log.info("Kueue's queue is read again.")
        # the same head stays at the head for many passes: said once while it stays
        for line in demand.skipped:
            if line not in self._kueue_skips_logged:
                self.log.info("Kueue demand: %s.", line[:1].upper() + line[1:])
        self._kueue_skips_logged = set(demand.skipped)
        return demand.requests

    async def _read_kueue(self, client: KueueClient, catalog: Catalog) -> KueueDemand:
        """Read the ClusterQueues, their pending workloads, their heads and the flavors;
        raises KubeError. A head gone since the list (admitted, deleted), or one in a
        namespace whose Workloads the culler may not read, is left out."""
        flavors = kueue.flavor_node_labels(await client.resource_flavors())
        queues: dict[str, kueue.ClusterQueueStatus] = {}
        pending: dict[str, list[kueue.PendingEntry]] = {}
        for name in dict.fromkeys(self.kueue_cluster_queues):
            status = kueue.cluster_queue_status(await client.cluster_queue(name))
            if status is None:
                continue
            queues[name] = status
            # only the head counts (kueuedemand): one entry, however long the queue
            pending[name] = await client.pending_in_cluster_queue(name, limit=1)
        workloads = {}
        refused: list[str] = []
        for namespace, name in head_keys(pending):
            try:
                workloads[(namespace, name)] = await client.workload(namespace, name)
            except NotFound:
                continue  # admitted and done, or deleted, since the list
            except Refused:
                # Workloads readable in some namespaces only: the other heads still count
                self.metrics.errors.labels(source="kueue").inc()
                refused.append(
                    f"the Workload {shown(namespace + '/' + name)} at a queue's head may not be "
                    f"read (the culler may not get Workloads in {shown(namespace)}): not counted"
                )
        demand = kueue_demand(pending, workloads, queues, flavors, catalog.gpu_types)
        return replace(demand, skipped=(*refused, *demand.skipped))

    async def _act(
        self, decisions: list[policy.Decision], marks: dict[tuple[str, str], policy.WarningMark]
    ) -> None:
        """Stop, warn and annotate as decided; ``marks``: the warnings the pass started from."""
        semaphore = asyncio.Semaphore(max(1, self.concurrency))

        async def stop(d: policy.Decision) -> None:
            profile = d.server.profile or "none"
            if self.dry_run:
                self.log.info(policy.log_line(d, dry_run=True))
                self.metrics.would_culls.labels(reason=d.reason, profile=profile).inc()
                return
            async with semaphore:
                self.log.info(policy.log_line(d))
                # Before the stop: GPUSpawner reads it when the hub stops the server.
                noted = await self._annotate(d.server, annotations.stop_annotations(d, time.time()))
                try:
                    await self.hub.stop_server(d.server.user, d.server.name)
                except HubError as e:
                    self.metrics.errors.labels(source="hub").inc()
                    self.log.error("Could not stop %r: %s", d.server.display, e)
                    await self._stop_failed(d, marks.get(d.server.key), noted)
                    return
            self.annotated.pop(d.server.key, None)
            self.metrics.culls.labels(reason=d.reason, profile=profile).inc()
            if d.server.gpus > 0:
                gpu_type = d.server.gpu_type or "unknown"
                self.metrics.gpus_reclaimed.labels(gpu_type=gpu_type).inc(d.server.gpus)
                if d.reason == policy.REASON_PRESSURE:
                    self.metrics.freed_for_demand.labels(gpu_type=gpu_type).inc(d.server.gpus)

        for d in decisions:
            if d.action == policy.WARN:
                self.log.warning(policy.log_line(d, dry_run=self.dry_run))
                counter = self.metrics.would_warnings if self.dry_run else self.metrics.warnings
                counter.labels(reason=d.reason, profile=d.server.profile or "none").inc()
        await asyncio.gather(
            *(stop(d) for d in decisions if d.action == policy.CULL),
            self._annotate_warnings(decisions),
        )

    async def _stop_failed(
        self, d: policy.Decision, mark: policy.WarningMark | None, noted: bool
    ) -> None:
        """The hub did not stop ``d``'s server: its user must not read that the culler did.

        The stop reason comes off the pod again; a warned server keeps its
        warning (on the pod too), so the next pass tries again if it is still idle.
        """
        key = d.server.key
        cull_after = None
        if mark is not None:
            self.warned[key] = mark
            cull_after = mark.warned_at + self.policy.warning_period
        if not noted:
            return
        if await self._annotate(
            d.server, annotations.stop_failed_annotations(d, cull_after, self.policy)
        ):
            if cull_after is None:
                self.annotated.pop(key, None)
            else:
                self.annotated[key] = cull_after
        else:
            self.log.error(
                "The pod of %r still says the culler stopped it, which it did not: its "
                "user may later read so.",
                d.server.display,
            )

    async def _annotate(self, server: policy.Server, changes: annotations.Annotations) -> bool:
        """Write ``changes`` on the server's pod; True when done or there is no pod any
        more, False (logged where it is an error) when they could not be written."""
        if self.pods is None or not server.pod:
            return False
        try:
            await self.pods.annotate_pod(
                server.pod, server.namespace or self.pods.namespace, changes
            )
        except NotFound:
            return True  # no pod (any more): nobody to tell, nothing left on it
        except KubeError as e:
            self.metrics.errors.labels(source="kubernetes").inc()
            self.log.warning(
                "Could not annotate the pod of %r, so its user is not told why or when: %s "
                "(the culler needs 'patch' on pods)",
                server.display,
                e,
            )
            return False
        return True

    async def _annotate_warnings(self, decisions: list[policy.Decision]) -> None:
        """Make the pods' warnings match the decisions: new ones on, withdrawn and stale ones off.

        A dry run writes nothing: it warns nobody, and another culler's warnings are not its own.
        """
        if self.dry_run or self.pods is None:
            return
        writes = annotations.warning_writes(
            decisions, self.warned, self.annotated, self.policy.warning_period, self.policy
        )
        done = await asyncio.gather(
            *(self._annotate(w.server, w.annotations) for w in writes.values())
        )
        for (key, write), ok in zip(writes.items(), done, strict=True):
            if not ok:
                continue
            if write.cull_after is None:
                self.annotated.pop(key, None)
            else:
                self.annotated[key] = write.cull_after

    def _record(
        self,
        decisions: list[policy.Decision],
        pressure: policy.Pressure | None,
        outcomes: list[policy.PressureOutcome],
    ) -> None:
        idle = Counter(
            (d.server.gpu_type or "none")
            for d in decisions
            if d.action in (policy.CULL, policy.WARN)
        )
        self.metrics.idle_servers.clear()
        for gpu_type, count in idle.items():
            self.metrics.idle_servers.labels(gpu_type=gpu_type).set(count)
        self.metrics.warned_servers.set(len(self.standing_warnings()))
        missing = [
            d
            for d in decisions
            if d.reason in (policy.REASON_GPU_MISSING, policy.REASON_GPU_UNAVAILABLE)
        ]
        self.metrics.gpu_missing.set(len(missing))
        for d in missing:
            self.log.info("Not culling %r: %s", d.server.display, d.detail)
        self._record_pressure(decisions, pressure, outcomes)

    def _record_pressure(
        self,
        decisions: list[policy.Decision],
        pressure: policy.Pressure | None,
        outcomes: list[policy.PressureOutcome],
    ) -> None:
        self.metrics.pressure.clear()
        self.metrics.demand.clear()
        self.metrics.unserved_demand.clear()
        if pressure is None:
            return
        waiting: Counter[str] = Counter()
        for (gpu_type, source), gpus in total_by_type(pressure.requests).items():
            self.metrics.demand.labels(gpu_type=gpu_type, source=source).set(gpus)
            waiting[gpu_type] += gpus
        for gpu_type, gpus in waiting.items():
            self.metrics.pressure.labels(gpu_type=gpu_type).set(gpus)
        if waiting:
            self.log.info("GPU demand: %s", ", ".join(r.describe for r in pressure.requests))
        unserved: Counter[str] = Counter()
        for outcome in outcomes:
            if outcome.served:
                continue
            unserved[outcome.request.gpu_type] += outcome.request.gpus
            self.log.warning(
                "Cannot free GPUs for a waiting request of %d %s GPUs (%s): %s.",
                outcome.request.gpus,
                outcome.request.gpu_type,
                outcome.request.source,
                outcome.why,
            )
        for gpu_type, gpus in unserved.items():
            self.metrics.unserved_demand.labels(gpu_type=gpu_type).set(gpus)

    def standing_warnings(self) -> dict[tuple[str, str], policy.WarningMark]:
        """The warnings users are told about: none in a dry run, which will stop nothing."""
        return {} if self.dry_run else self.warned

    def keep_offers(self) -> dict[tuple[str, str], tuple[tuple[float, ...], str]]:
        """Each warned server's keep choices and why none, as its pod's warning says."""
        warned = self.standing_warnings()
        return {
            d.server.key: annotations.keep_offer(d, self.policy)
            for d in self.last_decisions
            if d.server.key in warned
        }

    async def keep(self, model: dict, body) -> KeepAnswer:
        """``POST /api/keep``: check the request, record the keep on the pod, withdraw the
        standing idle warning. A pass under way is waited for (it read the pods before
        the keep); the next one reads the keep from the pod."""
        async with self._pass_lock:
            return await self._keep(model, body)

    async def _keep(self, model: dict, body) -> KeepAnswer:
        now = time.time()
        answer = keep_request(
            model,
            body,
            {d.server.key: d.server for d in self.last_decisions},
            self.standing_warnings(),
            self.policy,
            self.keep_services,
            now,
            freed={key for outcome in self.last_pressure for key in outcome.freed},
        )
        if answer.status != 200:
            return answer
        server = answer.server
        if self.dry_run:
            return KeepAnswer(409, "The culler runs dry and stops nothing: no keep is needed.")
        if self.pods is None:
            return KeepAnswer(503, "The culler cannot record a keep: it does not read Kubernetes.")
        changes = annotations.keep_annotations(answer.until, answer.seconds, now)
        if not await self._annotate(server, changes):
            return KeepAnswer(503, "The keep could not be recorded; try again in a minute.")
        self.warned.pop(server.key, None)
        self.annotated.pop(server.key, None)
        kept = replace(server, keep_until=answer.until)
        self.last_decisions = [
            replace(d, server=kept) if d.server.key == server.key else d
            for d in self.last_decisions
        ]
        self.log.info(
            "%r kept by its user for %ds, until %s (asked by %s %r)",
            server.display,
            answer.seconds,
            answer.until,
            model.get("kind", "user"),
            model.get("name"),
        )
        return answer

    def warnings_json(self) -> list[dict]:
        by_key = {d.server.key: d for d in self.last_decisions}
        result = []
        for key, mark in sorted(self.standing_warnings().items()):
            d = by_key.get(key)
            result.append(
                {
                    "user": key[0],
                    "server": key[1],
                    "reason": mark.reason,
                    "warned_at": mark.warned_at,
                    "cull_after": mark.warned_at + self.policy.warning_period,
                    "detail": d.detail if d else "",
                }
            )
        return result

    async def gpu_status_answer(self, model: dict) -> dict:
        """The ``/api/gpu-status`` answer: the last pass's servers, figures read at most once
        per poll interval for all callers, and the caller's servers' last hour."""
        servers = [d.server for d in self.last_decisions]
        figures = await self.gpu_status.figures(
            frozenset((s.namespace, s.pod) for s in servers if s.gpus > 0 and s.pod and s.namespace)
        )
        mine = gpustatus.gpu_servers(model, servers)
        # the last hour only of servers with figures now: no query for a pod without series
        shown = [s for s in mine if (s.namespace, s.pod) in figures.pods]
        points = await asyncio.gather(*(self.gpu_status.history(s.namespace, s.pod) for s in shown))
        histories = {s.key: p for s, p in zip(shown, points, strict=True)}
        rules = gpustatus.Rules(
            self.policy,
            self.last_pass_at or time.time(),
            self.cull_every,
            self.standing_warnings(),
            self.dry_run,
        )
        return gpustatus.status_answer(
            model,
            servers,
            figures,
            histories,
            rules,
            self.gpu_busy_threshold / 100,
            gpustatus.poll_seconds(self.gpu_status_poll),
        )

    # --- serving --------------------------------------------------------------
    def hub_auth(self):
        """Identifies the tokens of requests to /api/warning, /api/gpu-status and /warnings through the hub."""
        from jupyterhub.services.auth import HubAuth

        service = os.environ.get("JUPYTERHUB_SERVICE_NAME", self.name)
        return HubAuth(
            api_token=self.api_token,
            api_url=self.hub_api_url,
            access_scopes={f"access:services!service={service}"},
            # a whoami answer is reused this long: one hub request per minute per
            # polling server, not one per poll
            cache_max_age=60,
            log=self.log,
        )

    def _web_app(self):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from tornado import web

        culler = self
        auth = self.hub_auth()

        class TokenHandler(web.RequestHandler):
            """A request authenticated by a hub token (Authorization: token ..., or Bearer)."""

            async def caller(self, need: str = "a valid JupyterHub token is needed") -> dict:
                token = auth.get_token(self, in_cookie=False)
                model = await auth.user_for_token(token, sync=False) if token else None
                if model is None:
                    raise web.HTTPError(403, need)
                return model

            async def user_caller(self) -> dict:
                """A caller whose token may use the culler (its own servers' answers)."""
                model = await self.caller()
                if not auth.check_scopes(auth.access_scopes, model):
                    raise web.HTTPError(
                        403,
                        "this token may not use the culler: grant "
                        f"{', '.join(sorted(auth.access_scopes))} (c.Spawner.server_token_scopes)",
                    )
                return model

            def write_error(self, status_code, **kwargs):
                self.set_header("Content-Type", "application/json")
                reason = kwargs.get("exc_info", (None, None))[1]
                message = getattr(reason, "log_message", None) or self._reason
                self.finish(json.dumps({"status": status_code, "message": message}))

        class MetricsHandler(TokenHandler):
            """The metrics, for tokens with read:metrics: once the service has a url, the
            hub's proxy forwards anyone's request here."""

            async def get(self):
                need = f"a JupyterHub token with the {METRICS_SCOPE} scope is needed"
                model = await self.caller(need)
                if not auth.check_scopes({METRICS_SCOPE}, model):
                    raise web.HTTPError(403, need)
                self.set_header("Content-Type", CONTENT_TYPE_LATEST)
                self.write(generate_latest(culler.metrics.registry))

        class WarningHandler(TokenHandler):
            """The caller's own warned servers: what a single-user server asks about itself."""

            async def get(self):
                model = await self.user_caller()
                self.set_header("Content-Type", "application/json")
                self.set_header("Cache-Control", "no-store")
                self.write(
                    json.dumps(
                        warning_answer(
                            model,
                            culler.standing_warnings(),
                            culler.policy.warning_period,
                            culler.cull_every,
                            culler.keep_offers(),
                        )
                    )
                )

        class GPUStatusHandler(TokenHandler):
            """The GPU load of the caller's own servers, and when the culler would stop them."""

            async def get(self):
                model = await self.user_caller()
                answer = await culler.gpu_status_answer(model)
                self.set_header("Content-Type", "application/json")
                self.set_header("Cache-Control", "no-store")
                self.write(json.dumps(answer))

        class KeepHandler(TokenHandler):
            """A user's "keep it": a server's token for itself, a user's for the user's
            servers, a service of keep_services for the user it names. Token auth, no
            cookie: no cross-site request can carry one, so no xsrf check is needed."""

            def check_xsrf_cookie(self):
                return None

            async def post(self):
                model = await self.caller()
                if model.get("kind", "user") != "service":
                    model = await self.user_caller()
                try:
                    body = json.loads(self.request.body or b"null")
                except ValueError:
                    body = None
                answer = await culler.keep(model, body)
                self.set_status(answer.status)
                self.set_header("Content-Type", "application/json")
                self.set_header("Cache-Control", "no-store")
                self.finish(
                    json.dumps(
                        {
                            "status": answer.status,
                            "message": answer.message,
                            "keep_until": answer.until,
                        }
                    )
                )

        class WarningsHandler(TokenHandler):
            """Every warned server: only for tokens that may read every server anyway."""

            async def get(self):
                model = await self.caller()
                # expanded scopes: an admin's token holds it too; a filtered one is not enough
                if "read:servers" not in model.get("scopes", ()):
                    raise web.HTTPError(403, "the read:servers scope (for all users) is needed")
                self.set_header("Content-Type", "application/json")
                self.write(json.dumps(culler.warnings_json()))

        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/").rstrip("/")
        routes = [
            (r"/metrics", MetricsHandler),
            (r"/warnings", WarningsHandler),
            (r"/api/warning", WarningHandler),
            (r"/api/gpu-status", GPUStatusHandler),
            (r"/" + CULLER_KEEP_API, KeepHandler),
        ]
        if prefix:
            routes += [(prefix + path, handler) for path, handler in list(routes)]
        return web.Application(routes)

    def _listen(self) -> None:
        if not self.metrics_url:
            return
        url = urlparse(self.metrics_url)
        host = url.hostname or "127.0.0.1"
        port = url.port or (443 if url.scheme == "https" else 80)
        self._web_app().listen(port, address=host)
        self.log.info(
            "Serving /metrics, /warnings, /api/warning, /api/gpu-status and /api/keep on %s:%d",
            host,
            port,
        )

    async def run(self) -> None:
        self._listen()
        self.log.info(
            "gpuspawner-culler: every %ds%s, hub %s, Prometheus %s",
            self.cull_every,
            " (dry run)" if self.dry_run else "",
            self.hub_api_url,
            self.prometheus_url or "not used",
        )
        while True:
            try:
                await self.cull_pass()
            except Exception:  # a pass must never end the service
                self.metrics.errors.labels(source="internal").inc()
                self.log.exception("Unexpected error in a culling pass; the next pass will run.")
            if self.once:
                return
            await asyncio.sleep(self.cull_every)

    def start(self) -> None:
        asyncio.run(self.run())


def main(argv: list[str] | None = None) -> None:
    app = GPUCuller.instance()
    app.initialize(argv)
    app.start()


if __name__ == "__main__":
    main()
