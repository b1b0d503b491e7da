"""GPUSpawner: KubeSpawner plus a GPU catalog, limits and a GPU check before the notebook starts.

This module is glue. The decisions live in pure modules it calls:
:mod:`~gpuspawner.core.catalog` (what exists), :mod:`~gpuspawner.core.options` (what was
asked for), :mod:`~gpuspawner.core.limits` (whether it is allowed),
:mod:`~gpuspawner.core.profiles` (what the form offers), :mod:`~gpuspawner.core.podspec`
(what the pod gets) and :mod:`~gpuspawner.validation` (whether the GPUs work).

Without a catalog, GPUSpawner behaves exactly like KubeSpawner, with two
fixes: async callables in ``kubespawner_override`` are awaited, and an
unknown profile, option choice or unlisted choice is a readable 400 instead of a
``KeyError`` or a message that repeats the request.

It extends KubeSpawner through public hooks only: ``start()``,
``load_user_options()``, ``get_pod_manifest()``, a callable ``options_form``
(with a catalog), JupyterHub's ``get_options_form()``, and an admin's
``modify_pod_hook`` composed with its own check. What KubeSpawner offers no
hook for is behind :mod:`gpuspawner.hub.compat`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import inspect
import os
import time
from typing import Any

from kubespawner import KubeSpawner
from kubespawner.utils import recursive_update
from traitlets import (
    Bool,
    Dict,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    default,
    observe,
    validate,
)

from ..clients import kube
from ..core import (
    admission,
    budgets,
    kueue,
    labels,
    limits,
    podspec,
    profiles,
    refusals,
    serverpod,
    stopreasons,
    usage,
)
from ..core.catalog import Catalog, CatalogError, parse_catalog
from ..core.endpoints import AVAILABILITY_PATH
from ..core.hubconfig import ACCOUNTING_DB_URL_ENV
from ..core.options import (
    OPTION_IDLE_TIMEOUT,
    OPTION_PROFILE,
    Selection,
    ignored_options,
    minutes_text,
    no_such_profile,
    profile_choices,
    resolve_idle_timeout,
    resolve_profile,
    resolve_selection,
)
from ..core.placement import Placement
from ..core.refusals import (
    REASON_CATALOG_INVALID,
    REASON_GPU_CHECK,
    REASON_INVALID,
    REASON_NO_CAPACITY,
    REASON_TIMEOUT,
    REASON_UNSCHEDULABLE,
    REASON_USAGE_UNKNOWN,
    Refusal,
    refuse,
    shown,
)
from ..inventory.figures import live_payload
from . import capacity, metrics, serverprobe
from . import state as hubstate
from .accounting import AccountingRecorder, hub_database_url
from .capacity import Capacity, CapacityConfig, GPUUnschedulable
from .catalogcheck import override_trait_names
from .compat import (
    SpawnException,
    hub_checks_at_start,
    initialized_profile_list,
    request_options,
    user_label,
)
from .kueue import KueueView


class RefusedSpawn(SpawnException, ValueError):
    """A refused spawn request, as JupyterHub and KubeSpawner callers expect it.

    A ``SpawnException`` (JupyterHub answers with its status and message, and
    logs no traceback; JupyterHub 5.5 has none, see :mod:`gpuspawner.hub.compat`)
    and a ``ValueError``, which is what KubeSpawner's ``load_user_options``
    raises for bad options: code that wraps it in ``try/except ValueError``
    sees GPUSpawner's refusals too.
    """


def spawn_error(
    message: str,
    *,
    reason: str,
    status: int,
    log_message: str = "",
    error_class: type[SpawnException] = SpawnException,
) -> SpawnException:
    """A spawn failure JupyterHub shows as ``message`` (no traceback), with ``reason`` for metrics."""
    error = error_class(message, reason=reason, status_code=status, log_message=log_message)
    # Read by JupyterHub's error pages and API error bodies.
    error.jupyterhub_message = message
    return error


class KueueWaitTimeout(Exception):
    """A server's pod waited in Kueue longer than ``gpu_queue_timeout``."""


class GPUCheckFailed(Exception):
    """The validation init container reported broken or missing GPUs."""

    def __init__(self, reason: str, kind: str = ""):
        super().__init__(reason)
        #: The failure's kind (``validation.podstatus.check_failure_kind``), for the stop notice.
        self.kind = kind


class GPUSpawner(CapacityConfig, KubeSpawner):
    """A KubeSpawner for a shared pool of GPUs."""

    catalog = Dict(
        help="""
        The GPU catalog: images, GPU types, allowed counts and per-user limits.

        The same schema as ``catalog_file`` (docs/catalog.md, the catalog reference).
        Ignored when ``catalog_file`` is set. When neither is set, GPUSpawner
        behaves like KubeSpawner and uses ``profile_list`` as configured.
        """,
    ).tag(config=True)

    catalog_file = Unicode(
        "",
        help="""
        Path to a YAML file holding the GPU catalog.

        The file is re-read when it changes, so images and limits can change
        without restarting the hub. A change that does not validate is logged
        and the last valid catalog stays in effect.
        """,
    ).tag(config=True)

    validation_enabled = Bool(
        True,
        help="""
        Run the nvidia-smi check as an init container in every GPU pod.

        The check requests the same GPUs as the notebook, verifies that they
        are all visible and healthy and that the driver supports the image's
        CUDA version, and fails the spawn within seconds with the reason when
        they are not.
        """,
    ).tag(config=True)

    validation_image = Unicode(
        "",
        help="""
        Image for the GPU check init container. Empty (the default) uses the
        notebook's own image, so nothing extra is pulled; the check needs only
        ``nvidia-smi`` (injected by the NVIDIA runtime) and ``python3``.

        The image must have ``python3`` on its ``PATH`` (NVIDIA's ``cuda:*-base``
        images have none) and must not set ``NVIDIA_VISIBLE_DEVICES``.
        ``gpuspawner-images build validation`` builds one
        (``images/validation/Dockerfile``, docs/validation.md).
        """,
    ).tag(config=True)

    validation_command = List(
        Unicode(),
        default_value=[],
        help="""
        Command for the GPU check init container, replacing the built-in one.

        ``{gpus}``, ``{resource}``, ``{cuda}`` and ``{timeout}`` are replaced by
        the requested count, the Kubernetes resource name, the image's CUDA
        version (empty when unknown) and ``validation_timeout``. The command
        must exit non-zero on failure and should write a one-line reason to
        ``/dev/termination-log``.
        """,
    ).tag(config=True)

    validation_timeout = Float(
        30.0,
        min=1.0,
        help="""
        Seconds the GPU check may take, every ``nvidia-smi`` run together.

        A hung GPU makes ``nvidia-smi`` hang; when the time is up the check
        stops it and fails the spawn with that reason. Keep it well under
        ``start_timeout`` (60 s by default), which also covers scheduling and
        the image pull: otherwise a hung GPU ends the spawn with the hub's
        timeout instead of the reason. A check that still runs 15 s past this
        (its ``nvidia-smi`` stuck in the driver, so even its container cannot
        stop) fails the spawn too.
        """,
    ).tag(config=True)

    concurrent_starts = Integer(
        0,
        min=0,
        help="""
        At most this many of the hub's servers starting at once; the others wait
        their turn, in the order they were admitted, and see how many starts are
        ahead of them. 0 (the default) starts every server at once.

        A start holds its turn from its admission (limits and the GPU queue come
        first, so refusals stay instant) until its server answers HTTP. Set it
        where many users start together on nodes that share few CPUs: each start
        then gets the CPU it needs and the first users are served early, instead
        of every user waiting for the last one. Unlike JupyterHub's
        ``concurrent_spawn_limit``, nobody is refused.

        With ``kueue_queue``, GPU servers take no turn: they wait in Kueue,
        which admits them, and a turn held while a pod waits there would keep
        the requests behind it out of Kueue's queue (and the culler's sight).
        """,
    ).tag(config=True)

    form_usage_timeout = Float(
        5.0,
        min=0,
        help="""
        How long, in seconds, the spawn form waits for the user's current GPU
        usage when the Kubernetes API does not answer, before showing every
        choice instead of only what the user's limits still allow.

        The form is a page someone is waiting for, so it does not wait the
        whole ``k8s_api_request_retry_timeout`` (30 s by default) that starting
        a server may. Nothing is lost by showing more: the request is checked
        against the limits again on the server when the form is sent.
        """,
    ).tag(config=True)

    accounting_enabled = Bool(
        True,
        help="""
        Record each GPU server's GPU-seconds (from its pod being scheduled to
        the pod's end) in the usage database (``accounting_db_url``): the admin
        page's usage table, ``gpuspawner usage``, GPU-hours budgets and the
        ``gpuspawner_gpu_seconds_total`` metric read it. Only with a catalog.
        GPU-hours budgets (``limits.gpu_hours``) need it on.
        """,
    ).tag(config=True)

    accounting_db_url = Unicode(
        "",
        help="""
        SQLAlchemy URL of the usage database, e.g.
        ``postgresql://gpuspawner@db.example.org/usage``. Empty (the default)
        uses the hub's own database (``JupyterHub.db_url``: SQLite or
        PostgreSQL), in tables of gpuspawner's own (``gpuspawner_*``, with
        their own migrations), so usage survives hub restarts with no extra
        setup. Defaults to ``$GPUSPAWNER_ACCOUNTING_DB_URL`` when that is set
        (a URL with a password, from a Secret), as the services read it too.
        """,
    ).tag(config=True)

    @default("accounting_db_url")
    def _accounting_db_url_from_environment(self) -> str:
        return os.environ.get(ACCOUNTING_DB_URL_ENV, "")

    accounting_heartbeat = Float(
        60.0,
        min=1.0,
        help="""
        Seconds between two reconciliations of the usage database with the
        cluster: running servers are marked as seen, and an interval whose pod
        is gone (deleted while the hub was down) is closed from the pod's
        Kubernetes Events, else at the last time it was seen. A failed database
        write is tried again at the next one.
        """,
    ).tag(config=True)

    _selection: Selection | None = None
    # True while the last start was refused before any pod was requested, so
    # poll() can answer "not running" without asking the cluster.
    _refused_before_pod: bool = False
    #: Whether this start got as far as asking the API server for its pod.
    _pod_requested: bool = False
    _parsed_catalog: Catalog | None = None
    #: The configured value of every trait GPUSpawner or an override changes per start.
    _admin_values: dict[str, Any] | None = None
    #: The admin's profile_list beside a catalog (a list, dict or callable), offered after it.
    _admin_profile_list: Any = None

    _gpu_mock: bool = False
    #: The budget line of the form being built ("" when no budget applies), from the
    #: profile list's reading of the user's holdings to the form's rendering.
    _form_budget: str = ""
    #: Why this server was last stopped by someone other than its user; kept in the
    #: state (across clear_state) until the user starts it again.
    _stop_notice: stopreasons.StopNotice | None = None
    #: While running: what it holds ("2 × NVIDIA A100") and its node, kept in the
    #: state so that a pod that vanished with its node reads as "node lost".
    _running: dict[str, str] | None = None
    #: The uid of this server's pod while its place in Kueue is followed ("" otherwise).
    _kueue_uid: str = ""

    def __init__(self, *args: Any, **kwargs: Any):
        self._gpu_mock = bool(kwargs.get("_mock", False))
        super().__init__(*args, **kwargs)
        #: What every spawner of this hub process shares (locks, reservations, queue, watches).
        self.hub_state = hubstate.current()
        self.capacity = Capacity(self.hub_state, self.log)
        metrics.track(self)
        if self.gpu_catalog_configured:
            # The admin's profile_list is offered after the catalog's profiles
            # (the hub's start check says how many, gpuspawner.hub.catalogcheck).
            if self.trait_has_value("profile_list") and self.profile_list not in ([], {}, None):
                self._admin_profile_list = self.profile_list
            self.profile_list = self._catalog_profile_list
            if not self._admin_options_form:
                # An admin's own options_form stays theirs (as with KubeSpawner's
                # profile_list form): it is shown as configured, without our additions.
                self.options_form = self._catalog_options_form

    # ------------------------------------------------------------------
    # the admin's hooks, composed with ours
    # ------------------------------------------------------------------

    #: Whether options_form was set by someone else than GPUSpawner (the admin's config,
    #: a profile's override): their form is shown as is, without the stop notice or figures.
    _admin_options_form: bool = False

    @observe("options_form")
    def _options_form_set(self, change: dict) -> None:
        self._admin_options_form = change["new"] != self._catalog_options_form

    @validate("modify_pod_hook")
    def _compose_modify_pod_hook(self, proposal: dict) -> Any:
        """Run the admin's ``modify_pod_hook``, then enforce ``NVIDIA_VISIBLE_DEVICES`` again.

        KubeSpawner calls the hook between ``get_pod_manifest`` (which enforces it
        first) and creating the pod, so a hook could otherwise give a CPU pod the
        node's GPUs. The admin's hook keeps its own signature, sync or async, and
        stays reachable as ``__wrapped__``.
        """
        hook = proposal["value"]
        if hook is None or getattr(hook, "_gpuspawner_composed", False):
            return hook
        enforce = self._enforce_visible_devices

        def enforced(pod: Any) -> Any:
            if pod is not None:
                enforce(pod)
            return pod

        @functools.wraps(hook)
        def modify_pod_hook(spawner: Any, pod: Any) -> Any:
            result = hook(spawner, pod)
            if inspect.isawaitable(result):

                async def modified() -> Any:
                    return enforced(await result)

                return modified()
            return enforced(result)

        modify_pod_hook._gpuspawner_composed = True  # type: ignore[attr-defined]
        return modify_pod_hook

    # ------------------------------------------------------------------
    # catalog
    # ------------------------------------------------------------------

    @property
    def gpu_catalog_configured(self) -> bool:
        return bool(self.catalog_file or self.catalog)

    @observe("catalog")
    def _catalog_changed(self, change: dict) -> None:
        self._parsed_catalog = None

    def load_catalog(self) -> Catalog:
        """The catalog in effect; raises CatalogError if there is no valid one."""
        if self.catalog_file:
            source = self.hub_state.catalog_file(self.catalog_file, override_trait_names())
            previous_error = source.last_error
            catalog, reloaded = source.get()
            if reloaded:
                self.log.info("Loaded GPU catalog from %s", self.catalog_file)
            elif source.last_error is not None and source.last_error is not previous_error:
                self.log.error(
                    "The changed GPU catalog was not loaded, the previous one stays in effect: %s",
                    source.last_error,
                )
            return catalog
        if self._parsed_catalog is None:
            self._parsed_catalog = parse_catalog(
                self.catalog, "c.GPUSpawner.catalog", known_overrides=override_trait_names()
            )
        return self._parsed_catalog

    def _catalog_or_refuse(self) -> Catalog:
        try:
            return self.load_catalog()
        except CatalogError as e:
            self.log.error("GPU catalog is invalid: %s", e)
            self._refused_before_pod = True
            raise spawn_error(
                refusals.sentence(REASON_CATALOG_INVALID, "misconfigured"),
                reason=REASON_CATALOG_INVALID,
                status=refusals.SENTENCES[REASON_CATALOG_INVALID].status,
                log_message=f"GPU catalog is invalid: {e}",
            ) from None

    # ------------------------------------------------------------------
    # usage and limits
    # ------------------------------------------------------------------

    def _group_names(self) -> list[str]:
        return sorted(g.name for g in getattr(self.user, "groups", []) or [])

    def visible_catalog(self) -> Catalog:
        """The catalog with only the images this user may use (their groups from the hub)."""
        return self.load_catalog().visible_to(self.user.name, self._group_names())

    async def _list_gpu_pods(
        self, every_user: bool, retry_timeout: float | None = None
    ) -> list[dict]:
        """GPUSpawner pods read from the API server (not the hub's memory).

        Only this user's pods (by KubeSpawner's username label; the exact name
        is checked on the annotation) unless ``every_user``: group pools need
        all of them. Timeouts, connection errors and 5xx/429 answers are retried
        with back-off for up to ``retry_timeout`` (by default
        ``k8s_api_request_retry_timeout``, as KubeSpawner does for its own
        calls); a refusal (403 and other 4xx) is not.
        """
        if retry_timeout is None:
            retry_timeout = self.k8s_api_request_retry_timeout
        # KubeSpawner's username label, on every pod it makes for this user
        label = None if every_user else user_label(self)
        reader = kube.Reader(
            retry=kube.RetryPolicy(timeout=retry_timeout),
            timeout=self.k8s_api_request_timeout,
            logger=self.log,
        )
        return await reader.pods(
            self.api,
            namespace=None if self.enable_user_namespaces and every_user else self.namespace,
            selector=serverpod.selector(label),
        )

    async def current_holdings(
        self, catalog: Catalog, every_user: bool, retry_timeout: float | None = None
    ) -> list[limits.Holding]:
        """GPU holdings from pods in the cluster plus admitted, not yet visible spawns."""
        pods = await self._list_gpu_pods(every_user, retry_timeout)
        reservations = self.hub_state.reservations(None if every_user else self.user.name)
        return limits.merge_reservations(limits.holdings_from_pods(pods, catalog), reservations)

    async def _admit(self, catalog: Catalog, selection: Selection) -> None:
        """Admit the request (limits, then free GPUs, maybe after the queue) or raise Refusal."""
        requester = capacity.Requester(
            self.user.name,
            tuple(self._group_names()),
            self.name,
            pod=f"{self.namespace}/{self.pod_name}",
        )

        async def holdings(every_user: bool) -> list[limits.Holding]:
            return await self.current_holdings(catalog, every_user=every_user)

        await self.capacity.admit(
            catalog,
            selection,
            requester,
            holdings=holdings,
            # A CPU server neither needs nor starts the GPU inventory's watches.
            inventory=self.gpu_inventory() if selection.is_gpu else None,
            placement=self._placement(),
            queue=self.queue_settings(),
            who=self._log_name,
            budget=functools.partial(self._check_budget, catalog, selection),
            kueue=(
                functools.partial(self._check_kueue_quota, catalog, selection)
                if self.kueue_queue
                else None
            ),
        )

    async def _check_kueue_quota(self, catalog: Catalog, selection: Selection) -> None:
        """Refuse at once a request no quota of the cluster's queue could ever admit."""
        view = self.kueue_view()
        if view is None or selection.gpu_type is None:
            return
        try:
            quotas = await view.quotas()
        except kube.NotFound as e:
            self.log.error("Kueue's queue for GPU servers is missing: %s", e)
            raise refusals.refuse(
                REASON_CATALOG_INVALID, "queue-missing", queue=self.kueue_queue
            ) from None
        except kube.KubeError as e:
            self.log.error("Could not read Kueue's queue %s: %s", shown(self.kueue_queue), e)
            raise refusals.refuse(REASON_CATALOG_INVALID, "queue-unreadable", status=503) from None
        if quotas is None:  # the hub may not read the quotas (said once): Kueue decides
            return
        resource = selection.gpu_type.resource
        key = selection.gpu_type.key
        wanted = kueue.catalog_type_selectors(catalog).get(key) or {}
        flavor_labels = quotas.flavor_labels

        def may_serve(flavor: str) -> bool:
            # As Kueue assigns flavors: the flavor's node labels must not contradict the
            # pod's node selector and affinity; labels the pod does not name do not count.
            labels = flavor_labels.get(flavor, {})
            named = {k: v for k, v in wanted.items() if k in labels}
            return not named or bool(kueue.flavor_gpu_types({flavor: labels}, {key: named}))

        own = next((q for q in quotas.queues if q.name == quotas.cluster_queue), None)
        # The type's own flavors and those without GPU labels; another GPU type's, never.
        flavors = [
            f for f in (own.flavors_for(resource) if own is not None else []) if may_serve(f)
        ]
        refusal = kueue.quota_refusal(
            local_queue=self.kueue_queue,
            cluster_queue=quotas.cluster_queue,
            queues=quotas.queues,
            flavors=flavors,
            resource=resource,
            gpus=selection.gpus,
            gpu_name=selection.gpu_type.display_name,
        )
        if refusal is not None:
            raise refusal

    # ------------------------------------------------------------------
    # GPU-hours budgets (gpuspawner.core.budgets)
    # ------------------------------------------------------------------

    def _budget_for_user(self, catalog: Catalog) -> budgets.Budget | None:
        """The user's GPU-hours budget, or None when none applies (unlimited, or no budgets)."""
        rules = catalog.limits.gpu_hours
        if not rules.enabled:
            return None
        budget = budgets.effective_budget(rules, self.user.name, self._group_names())
        return budget if budget.hours is not None else None

    async def budget_status(
        self, catalog: Catalog, budget: budgets.Budget, held: list[limits.Holding]
    ) -> budgets.BudgetStatus:
        """The user's budget this period: weighted GPU-hours used (the usage store) and held now.

        ``held`` is what the cluster's pods and the hub's reservations say the
        user holds (this server's own holding left out: it is the one asking).
        Raises when the usage store cannot be read.
        """
        recorder = self.gpu_accounting()
        if recorder is None:
            raise RuntimeError(
                "GPU-hours budgets are configured but accounting is off "
                "(GPUSpawner.accounting_enabled, or no database)"
            )
        now = time.time()
        period = budgets.current_period(catalog.limits.gpu_hours, now)
        user = self.user.name
        # On the recorder's thread (SQLAlchemy is synchronous), after the writes queued
        # before it, so a server that just ended is counted.
        used = await recorder.call(_used_unit_seconds, [user], period.start, period.end, now)
        mine = [h for h in held if h.user == user and h.server != self.name]
        return budgets.BudgetStatus(
            budget=budget,
            period=period,
            used_hours=used.get(user, 0.0) / 3600,
            held_units=sum(h.units for h in mine),
        )

    async def _check_budget(
        self, catalog: Catalog, selection: Selection, held: list[limits.Holding]
    ) -> None:
        """Refuse a GPU request the user's budget cannot cover (called by admission, after limits).

        No budget for this user: nothing is read. The usage store not answering
        refuses the request, as limits do when the cluster does not answer: a
        budget that could be overrun while the database is down is no budget.
        """
        budget = self._budget_for_user(catalog)
        if budget is None or not selection.is_gpu or selection.gpu_type is None:
            return
        try:
            status = await self.budget_status(catalog, budget, held)
        except Exception as e:
            self.log.error(
                "Could not read %s's GPU-hours to check their budget: %s", self._log_name, e
            )
            raise refuse(REASON_USAGE_UNKNOWN, "budget-unknown") from None
        units = limits.holding_for(self.user.name, self.name, selection, ()).units
        refusal = budgets.check_budget(
            status,
            units,
            catalog.limits.gpu_hours.min_session,
            stopreasons.held_text(selection.gpus, selection.gpu_type.display_name),
        )
        if refusal is not None:
            raise refusal

    def _budget_choices(
        self, catalog: Catalog, room: dict[str, float | None] | None
    ) -> list[tuple[str, float]]:
        """The GPU choices of the user's images that their limits still allow: (label, units)."""
        choices: list[tuple[str, float]] = []
        types = {
            t.key: t for image in catalog.images.values() for t in catalog.types_for_image(image)
        }
        for gpu_type in types.values():
            left = None if room is None else room.get(gpu_type.key)
            for count in catalog.counts_for_type(gpu_type):
                if count > 0 and (left is None or count <= left + 1e-9):
                    label = stopreasons.held_text(count, gpu_type.display_name)
                    choices.append((label, count * gpu_type.weight))
        return choices

    async def _form_budget_line(
        self, catalog: Catalog, held: list[limits.Holding], room: dict[str, float | None] | None
    ) -> str:
        """The form's budget line and what the rest allows; "" when no budget applies or it cannot be read."""
        budget = self._budget_for_user(catalog)
        if budget is None:
            return ""
        try:
            status = await asyncio.wait_for(
                self.budget_status(catalog, budget, held), timeout=self.form_usage_timeout or None
            )
        except Exception as e:
            # The request is checked again when the form is sent.
            self.log.warning("Not showing %s's GPU-hours budget: %s", self._log_name, e)
            return ""
        choices = self._budget_choices(catalog, room)
        allowed = "" if status.spent else status.choices_text(choices, now=time.time())
        return f"{status.text()}. {allowed}".strip()

    def _release_reservation(self) -> None:
        self.hub_state.release(self.user.name, self.name)

    # ------------------------------------------------------------------
    # the live GPU inventory
    # ------------------------------------------------------------------

    def gpu_inventory(self):
        """The hub's shared GPU inventory reflector, or None when it is off."""
        if self._gpu_mock or not self.gpu_inventory_enabled or not self.gpu_catalog_configured:
            return None
        from kubespawner.clients import shared_client

        from ..inventory.reflectors import InventoryReflector

        def create() -> InventoryReflector:
            return InventoryReflector(
                shared_client("CoreV1Api"),
                namespace=self.namespace,
                all_namespaces=self.gpu_inventory_all_namespaces,
                extra_resources=self._gpu_resource_names(),
                log=self.log,
            )

        inventory = self.hub_state.inventory(create)
        # Where the inventory starts, so does the usage recorder: it follows the same watch.
        self.gpu_accounting()
        return inventory

    def gpu_accounting(self) -> AccountingRecorder | None:
        """The hub's GPU usage recorder, started on first use; None when accounting is off.

        Off without a catalog, with ``accounting_enabled = False``, or when no
        database is known (no ``accounting_db_url`` and no hub database, as
        with a spawner made outside a hub). Needs a running event loop.
        """
        if self._gpu_mock or not self.accounting_enabled or not self.gpu_catalog_configured:
            return None
        url = self.accounting_db_url or hub_database_url(self)
        if not url:
            return None
        from kubespawner.clients import shared_client

        def create() -> AccountingRecorder:
            def open_store() -> Any:
                # On the recorder's thread: the store's imports never hold up the hub.
                from ..accounting.store import UsageStore

                return UsageStore(url)

            reader = kube.Reader(
                retry=kube.RetryPolicy(timeout=self.k8s_api_request_retry_timeout),
                timeout=self.k8s_api_request_timeout,
                logger=self.log,
            )
            return AccountingRecorder(
                open_store,
                reader,
                self.namespace,
                self.log,
                api=shared_client("CoreV1Api"),
                heartbeat=self.accounting_heartbeat,
            )

        try:
            recorder = self.hub_state.accounting(create)
        except Exception as e:  # no Kubernetes client: usage is not recorded, spawns go on
            if not self.hub_state.accounting_failed:
                self.hub_state.accounting_failed = True
                self.log.warning("GPU usage is not recorded: %s", e)
            return None
        if self.hub_state.started_inventory is not None:
            recorder.listen_to(self.hub_state.started_inventory)
        return recorder

    def kueue_view(self) -> KueueView | None:
        """The hub's view of its Kueue LocalQueue (``kueue_queue``), or None when Kueue is off."""
        if self._gpu_mock or not self.kueue_queue or not self.gpu_catalog_configured:
            return None
        from kubespawner.clients import shared_client

        from ..clients.kueue import KueueClient

        def create() -> KueueView:
            reader = kube.Reader(
                retry=kube.RetryPolicy(timeout=self.k8s_api_request_retry_timeout),
                timeout=self.k8s_api_request_timeout,
                logger=self.log,
            )
            client = KueueClient(shared_client("CoreV1Api").api_client, reader)
            return KueueView(client, self.namespace, self.kueue_queue, self.log)

        view = self.hub_state.kueue(create)
        inventory = self.hub_state.started_inventory
        if inventory is not None and view.listening_to is not inventory:
            # Preempted pods may vanish before this hub polls them: the watch remembers why.
            inventory.add_pod_listener(view.note_pod)
            view.listening_to = inventory
        return view

    def _placement(self) -> Placement:
        """The admin's node placement (before any selection changed the traits)."""
        admin = self._admin_values or {}
        return Placement(
            admin.get("node_selector", self.node_selector),
            admin.get("tolerations", self.tolerations),
        )

    def gpu_availability(self, catalog: Catalog) -> dict | None:
        """Live figures per GPU type of the catalog; None while the inventory is unavailable."""
        return capacity.figures(
            self.gpu_inventory(), catalog, self._placement(), promised=self.hub_state
        )

    def gpu_availability_payload(self) -> dict:
        """The figures for this user, as the form gets them with the page (and then from the service)."""
        try:
            # Per user: the figures name only the images this user may use.
            catalog: Catalog | None = self.visible_catalog()
        except CatalogError:
            catalog = None
        return live_payload(self.gpu_inventory(), catalog, self._placement())

    async def _catalog_profile_list(self, spawner: GPUSpawner) -> list[dict]:
        """``profile_list`` when a catalog is configured: the catalog's, then the admin's profile_list.

        Of the catalog, only what the user may use and still take.
        """
        catalog_profiles = await self._catalog_profiles()
        listed = await self._listed_profiles(self.load_catalog())
        return profiles.merge_profile_lists(catalog_profiles, listed)

    async def _listed_profiles(self, catalog: Catalog) -> list[dict]:
        """The admin's ``profile_list`` beside the catalog, initialized, callables called.

        A profile whose slug is also a catalog image key is left out with a
        warning (the hub's start check refuses that for a static list; a
        callable can only be checked here).
        """
        listed = _profiles_in_order(self._admin_profile_list)
        if callable(listed):
            listed = listed(self)
            if inspect.isawaitable(listed):
                listed = await listed
        if not listed:
            return []
        listed = initialized_profile_list(self, listed)
        colliding = set(profiles.slug_collisions(catalog.images, listed))
        for slug in sorted(colliding):
            self.log.warning(
                "The profile_list profile %s is not offered: the catalog has an image of that name",
                shown(slug),
            )
        return [p for p in listed if p["slug"] not in colliding]

    async def _catalog_profiles(self) -> list[dict]:
        """The catalog's profiles: only what the user may use and still take."""
        groups = self._group_names()
        catalog = self.load_catalog().visible_to(self.user.name, groups)
        pools = limits.pool_groups_for(catalog.limits, groups)
        reflector = self.gpu_inventory()
        if reflector is not None:
            # Only the hub's first form waits: the watches start with it.
            await reflector.wait_ready(timeout=3)
        # Figures another form (fancy-profiles) cannot refresh say when they were counted.
        as_of = "" if self._own_form() else time.strftime("%H:%M UTC", time.gmtime())
        self._form_budget = ""
        try:
            holdings = await self.current_holdings(
                catalog, every_user=bool(pools), retry_timeout=self.form_usage_timeout
            )
        except Exception as e:
            self.log.warning("Showing all GPU choices: could not read current GPU usage: %s", e)
            return profiles.build_profile_list(
                catalog, availability=self.gpu_availability(catalog), as_of=as_of
            )
        room = limits.remaining(catalog, self.user.name, groups, self.name, holdings)
        self._form_budget = await self._form_budget_line(catalog, holdings, room)
        limit = limits.effective_limit(catalog.limits, self.user.name, groups)
        mine = [h for h in holdings if h.user == self.user.name and h.server != self.name]
        summary = profiles.held_summary(
            sum(h.units for h in mine), limit.total, sorted({h.server_label for h in mine})
        )
        return profiles.build_profile_list(
            catalog, room, summary, availability=self.gpu_availability(catalog), as_of=as_of
        )

    def _kubespawner_form(self, profile_list: list[dict]) -> str:
        """KubeSpawner's form (same template, same variables), rendered with autoescape.

        KubeSpawner renders its form without autoescape, and the profiles carry
        text users control (their server names, in the "You are using ..." line).
        Here every value is escaped unless it is marked as markup: only the
        catalog's descriptions are (:func:`gpuspawner.core.profiles.build_profile_list`).
        An admin's ``profile_form_template`` is rendered the same way.
        """
        from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader

        profile_list = initialized_profile_list(self, profile_list)
        if self.user_options:
            # The form pre-selects the saved options where they still match (KubeSpawner
            # 7.1's template); say when they do not, as KubeSpawner 7.1 does.
            try:
                resolve_profile(self.user_options, profile_list)
            except Refusal as refusal:
                self.log.warning(
                    "Not pre-selecting saved user_options on the spawn form "
                    "because they failed validation: %s",
                    shown(refusal.message, 200),
                )
        paths = tuple(self.additional_profile_form_template_paths)

        # KubeSpawner builds a new environment, and so compiles form.html
        # again, on every page view (~20 ms); the hub keeps one per path.
        def build() -> Environment:
            loader = ChoiceLoader(
                [FileSystemLoader(list(paths)), PackageLoader("kubespawner", "templates")]
            )
            env = Environment(loader=loader, autoescape=True)
            env.policies["json.dumps_kwargs"] = {"sort_keys": False}
            return env

        env = self.hub_state.form_environment(paths, build)
        if self.profile_form_template:
            template = env.from_string(self.profile_form_template)
        else:
            template = env.get_template("form.html")
        return template.render(profile_list=profile_list, user_options=self.user_options)

    async def _catalog_options_form(self, spawner: GPUSpawner) -> str:
        """``options_form`` when a catalog is configured: its profiles for this user, in KubeSpawner's form."""
        return self.render_catalog_form(await self._catalog_profile_list(spawner))

    async def get_options_form(self) -> str:
        """The spawn form, after why this server last stopped.

        JupyterHub asks this for the form of every spawn page, whatever
        ``options_form`` is: KubeSpawner's form of a ``profile_list`` (static or
        callable), or the catalog's. An admin's own ``options_form`` is shown as
        they wrote it, and no form stays no form (JupyterHub then spawns at once).
        """
        form = await super().get_options_form()
        if not form or self._admin_options_form:
            return form
        return self._stop_notice_html() + form

    def _stop_notice_html(self) -> str:
        notice = self.stop_notice()
        if notice is None:
            return ""
        from .pages import notice_paragraph

        html = notice_paragraph(stopreasons.notice_html(notice))
        # a plain str: Markup + the form's str would escape the whole form
        return str(html + stopreasons.LOCAL_TIME_SCRIPT)

    def render_catalog_form(self, profile_list: list[dict]) -> str:
        """The form of a catalog's ``profile_list``: KubeSpawner's template, escaped, plus the live figures.

        Around it, GPUSpawner's own part (``templates/gpuspawner-form.html``): the
        user's GPU-hours budget, and an idle-timeout field for each offered image
        with ``idle_timeout`` bounds.
        """
        budget_html, idle_html = self._form_extras(profile_list)
        form = budget_html + self._kubespawner_form(profile_list) + idle_html
        if self.gpu_inventory() is None or not self._own_form():
            # another form's labels say when they were counted (see _catalog_profile_list)
            return form
        from .formscript import form_script

        return form + form_script(self.gpu_availability_payload(), self._figures_url())

    def _form_extras(self, profile_list: list[dict]) -> tuple[str, str]:
        """The budget line (before the form) and the idle-timeout fields (after it), escaped."""
        try:
            catalog = self.visible_catalog()
        except CatalogError:
            return "", ""
        offered = {p.get("slug") for p in profile_list}
        saved = self.user_options if isinstance(self.user_options, dict) else {}
        fields = []
        for key, image in catalog.images.items():
            bounds = image.idle_timeout
            if bounds is None or key not in offered:
                continue
            value = bounds.default
            if saved.get(OPTION_PROFILE) == key:
                # the user's last choice, where it is still within the bounds
                with contextlib.suppress(Refusal):
                    value = resolve_idle_timeout(saved.get(OPTION_IDLE_TIMEOUT), image) or value
            fields.append(
                {
                    "slug": key,
                    "image": image.display_name,
                    "value": minutes_text(value),
                    "min": minutes_text(bounds.minimum),
                    "max": minutes_text(bounds.maximum),
                }
            )
        if not fields and not self._form_budget:
            return "", ""
        template = _form_templates().get_template(FORM_TEMPLATE)
        module = template.make_module({"budget": self._form_budget, "idle_fields": fields})
        return str(module.budget_html()), str(module.idle_html())

    def _own_form(self) -> bool:
        """Whether the form is KubeSpawner's own template, which the figures' script relabels.

        Not when another form replaces it: a profile_form_template, or a form.html
        on the template path (jupyterhub-fancy-profiles, whose widgets read the
        profile list once and offer no way to relabel them).
        """
        if self.profile_form_template:
            return False
        return not any(
            os.path.isfile(os.path.join(path, "form.html"))
            for path in self.additional_profile_form_template_paths
        )

    def _figures_url(self) -> str:
        """The gpuspawner service's figures URL, or "" when the hub runs no such service."""
        settings = getattr(self.user, "settings", None) or {}
        service = (settings.get("services") or {}).get(self.gpu_figures_service)
        if service is None or not getattr(service, "url", None):
            return ""
        return f"{service.prefix.rstrip('/')}/{AVAILABILITY_PATH}"

    # ------------------------------------------------------------------
    # user options
    # ------------------------------------------------------------------

    def _refusal(self, refusal: Refusal) -> SpawnException:
        self._refused_before_pod = True
        metrics.count_refusal(refusal.reason)
        return spawn_error(
            refusal.message, reason=refusal.reason, status=refusal.status, error_class=RefusedSpawn
        )

    async def load_user_options(self) -> None:
        """Read, validate and admit the request; then wait for this start's turn."""
        await self._load_and_admit()
        await self._take_start_turn()

    def _start_key(self) -> str:
        return f"{self.user.name}/{self.name}"

    async def _take_start_turn(self) -> None:
        if self.kueue_queue and self._selection is not None and self._selection.is_gpu:
            return  # Kueue admits it (concurrent_starts' help says why)
        await self.hub_state.start_gate.enter(self._start_key(), self.concurrent_starts)

    def _start_turn_message(self) -> str | None:
        ahead = self.hub_state.start_gate.ahead_of(self._start_key())
        if ahead is None:
            return None
        starts = "start" if ahead == 1 else "starts"
        return (
            f"Waiting for its turn to start: {ahead} {starts} ahead of it, "
            f"at most {self.concurrent_starts} at once."
            if ahead
            else f"Next to start (at most {self.concurrent_starts} at once)."
        )

    async def _load_and_admit(self) -> None:
        self._selection = None  # this start's own, once admitted
        try:
            self.user_options = request_options(self.user_options)
        except Refusal as refusal:
            raise self._refusal(refusal) from None
        if not self.gpu_catalog_configured:
            return await self._load_kubespawner_profile()
        catalog = self._catalog_or_refuse()
        groups = self._group_names()
        visible = catalog.visible_to(self.user.name, groups)
        listed = await self._listed_profiles(catalog) if self._admin_profile_list else []
        slug = (
            self.user_options.get(OPTION_PROFILE) if isinstance(self.user_options, dict) else None
        )
        if listed and isinstance(slug, str) and slug and slug not in visible.images:
            if any(p["slug"] == slug for p in listed):
                return await self._load_listed_profile(catalog, listed)
            # Unknown, or an image this user may not use: the same answer (options._resolve_image).
            refusal = no_such_profile(
                slug, profile_choices(visible) + profiles.listed_choices(listed), status=403
            )
            self.log.info("Refused spawn of %s: %s", self._log_name, refusal.message)
            self._log_restricted_image(catalog, groups)
            raise self._refusal(refusal)
        try:
            selection = resolve_selection(self.user_options, visible)
            ignored = ignored_options(self.user_options)
            if ignored:
                self.log.info(
                    "Ignoring unknown server options for %s: %s",
                    self._log_name,
                    ", ".join(shown(key) for key in ignored),
                )
            await self._admit(catalog, selection)
        except Refusal as refusal:
            self.log.info("Refused spawn of %s: %s", self._log_name, refusal.message)
            self._log_restricted_image(catalog, groups)
            raise self._refusal(refusal) from None
        self.log.info("Starting %s: %s", self._log_name, selection.describe())
        self._selection = selection
        self._apply_selection(catalog, selection)

    def _log_restricted_image(self, catalog: Catalog, groups: list[str]) -> None:
        """Tell the admin (never the user) when the refused profile exists but is not theirs."""
        key = self.user_options.get(OPTION_PROFILE)
        image = catalog.images.get(key) if isinstance(key, str) else None
        if image is not None and not image.allows(self.user.name, groups):
            self.log.info(
                "%s asked for the image '%s', which is only for %s",
                self._log_name,
                image.key,
                image.describe_access(),
            )

    def _restore_admin_values(self, names: Any = ()) -> dict[str, Any]:
        """Put back the configured value of every trait a start changes; those values.

        The values are read once, before any start changed them: GPUSpawner's
        own (:data:`podspec.MANAGED_TRAITS`) and each trait an override (``names``)
        sets, so nothing of a previous start's selection or override stays.
        """
        if self._admin_values is None:
            self._admin_values = {
                name: copy.deepcopy(getattr(self, name)) for name in podspec.MANAGED_TRAITS
            }
        for name in names:
            if name not in self._admin_values:
                self._admin_values[name] = copy.deepcopy(getattr(self, name))
        for name, value in self._admin_values.items():
            setattr(self, name, copy.deepcopy(value))
        return self._admin_values

    def _apply_selection(self, catalog: Catalog, selection: Selection) -> None:
        """Set the traits of a catalog choice: the image's ``kubespawner_override``, then ours.

        The override is applied as KubeSpawner applies a profile's (a dict is
        merged into the configured value) and is the base GPUSpawner's own
        values go over, so the GPU request, the check, the placement and the
        reserved environment variables always hold.
        """
        override = selection.image.kubespawner_override
        admin = self._restore_admin_values(override)
        base = {name: admin[name] for name in podspec.MANAGED_TRAITS}
        try:
            for name, value in override.items():
                merged = _overridden(admin[name], value)
                if name in base:
                    base[name] = merged
                else:
                    setattr(self, name, merged)
            self._set_selection_traits(base, catalog, selection)
        except TraitError as e:
            self.log.error(
                "The catalog image '%s' has a kubespawner_override KubeSpawner refuses: %s",
                selection.image.key,
                e,
            )
            raise spawn_error(
                refusals.sentence(REASON_CATALOG_INVALID, "misconfigured"),
                reason=REASON_CATALOG_INVALID,
                status=refusals.SENTENCES[REASON_CATALOG_INVALID].status,
            ) from None

    def _set_selection_traits(
        self, base: dict[str, Any], catalog: Catalog, selection: Selection
    ) -> None:
        """Set :data:`podspec.MANAGED_TRAITS` from ``base`` plus the selection (GPUs, check, env)."""
        check = None
        if selection.is_gpu and self.validation_enabled:
            check = podspec.validation_container(
                selection,
                command=self._validation_command(selection),
                image=self.validation_image or None,
                image_pull_policy=self.image_pull_policy,
            )
        for name, value in podspec.trait_values(
            base, selection, catalog, check_container=check
        ).items():
            setattr(self, name, value)

    def _validation_command(self, selection: Selection) -> list[str]:
        assert selection.gpu_type is not None
        if self.validation_command:
            values = {
                "gpus": str(selection.gpus),
                "resource": selection.gpu_type.resource,
                "cuda": selection.image.cuda or "",
                "timeout": repr(float(self.validation_timeout)),
            }
            return [part.format(**values) for part in self.validation_command]
        from ..validation.command import check_command

        return check_command(
            selection.gpus,
            selection.gpu_type.resource,
            selection.image.cuda,
            timeout=self.validation_timeout,
        )

    async def _load_kubespawner_profile(self) -> None:
        """KubeSpawner's ``load_user_options``, with readable errors and awaited overrides.

        The admin's ``profile_list`` (a list, a dict, or a callable, called once)
        is checked here first, and the chosen profile's override callables are
        called, awaiting async ones. KubeSpawner then checks and applies that
        resolved list, as its own ``load_user_options`` does with ``profile_list``.
        """
        configured = self.profile_list
        profile_list = _profiles_in_order(configured)
        if callable(profile_list):
            profile_list = profile_list(self)
            if inspect.isawaitable(profile_list):
                profile_list = await profile_list
        profile_list = initialized_profile_list(self, profile_list)
        if not profile_list:
            return await super().load_user_options()
        await self._resolved_profile(profile_list)
        await self._kubespawner_load(profile_list)

    async def _resolved_profile(self, profile_list: list[dict]) -> dict:
        """The requested profile of an initialized list, checked, its override callables called."""
        try:
            profile = resolve_profile(self.user_options, profile_list)
        except Refusal as refusal:
            self.log.info("Refused spawn of %s: %s", self._log_name, refusal.message)
            raise self._refusal(refusal) from None
        await self._resolve_async_overrides(profile)
        return profile

    async def _kubespawner_load(self, profile_list: list[dict]) -> None:
        """KubeSpawner's ``load_user_options`` on ``profile_list``; the admin's stays configured.

        Given the resolved list, KubeSpawner neither calls a callable profile_list
        a second time nor an override callable at all (it would not await one).
        """
        configured, self.profile_list = self.profile_list, profile_list
        try:
            await super().load_user_options()
        except ValueError as e:
            # Anything else KubeSpawner refuses; its message may repeat the request.
            refusal = refuse(REASON_INVALID, "options-not-accepted", error=str(e))
            raise self._refusal(refusal) from None
        finally:
            self.profile_list = configured

    async def _load_listed_profile(self, catalog: Catalog, listed: list[dict]) -> None:
        """Start a profile of the admin's ``profile_list`` beside the catalog.

        KubeSpawner applies the profile's overrides, as it would without a
        catalog. A GPU they ask for (:func:`gpuspawner.core.profiles.gpu_demand`)
        is then admitted like a catalog choice (limits, the queue) and gets the
        GPU check, the labels limits count and ``NVIDIA_VISIBLE_DEVICES``; a
        CPU-only profile gets ``NVIDIA_VISIBLE_DEVICES=void``.
        """
        profile = await self._resolved_profile(listed)
        overrides = profiles.chosen_overrides(profile, self.user_options)
        self._restore_admin_values({name for override in overrides for name in override})
        await self._kubespawner_load(listed)
        try:
            demand = profiles.gpu_demand(
                self.extra_resource_limits,
                self.extra_resource_guarantees,
                podspec.gpu_resource_names(catalog),
            )
        except ValueError as e:
            self.log.error(
                "The profile_list profile %s cannot start: %s", shown(profile["slug"]), e
            )
            self._refused_before_pod = True
            raise spawn_error(
                refusals.sentence(REASON_CATALOG_INVALID, "misconfigured"),
                reason=REASON_CATALOG_INVALID,
                status=refusals.SENTENCES[REASON_CATALOG_INVALID].status,
            ) from None
        selection = profiles.listed_selection(profile, self.image, demand, catalog)
        try:
            await self._admit(catalog, selection)
        except Refusal as refusal:
            self.log.info("Refused spawn of %s: %s", self._log_name, refusal.message)
            raise self._refusal(refusal) from None
        self.log.info("Starting %s: %s", self._log_name, selection.describe())
        self._selection = selection
        current = {name: copy.deepcopy(getattr(self, name)) for name in podspec.MANAGED_TRAITS}
        self._set_selection_traits(current, catalog, selection)

    async def _resolve_async_overrides(self, profile: dict) -> None:
        """Call the selected overrides' callables once, awaiting async ones.

        KubeSpawner calls override callables without awaiting them, so an
        ``async def`` override would set a coroutine object as the trait
        value. Each callable of the chosen profile and choices is called here,
        exactly once, and replaced by its result; KubeSpawner then applies the
        values as usual.
        """
        for override in profiles.chosen_overrides(profile, self.user_options):
            for key, value in list(override.items()):
                if callable(value):
                    result = value(self)
                    if inspect.isawaitable(result):
                        result = await result
                    override[key] = result

    # ------------------------------------------------------------------
    # the pod
    # ------------------------------------------------------------------

    async def get_pod_manifest(self):
        pod = await super().get_pod_manifest()
        # KubeSpawner asks for the manifest right before it creates the pod.
        self._pod_requested = True
        if self._selection is not None and self.gpu_catalog_configured:
            catalog = self.load_catalog()
            pod.metadata.labels = {
                **(pod.metadata.labels or {}),
                **podspec.pod_labels(self._selection),
            }
            if self.kueue_queue and self._selection.is_gpu:
                pod.metadata.labels.update(
                    kueue.pod_labels(self.kueue_queue, self.kueue_priority_class)
                )
            groups = self._group_names()
            pools = limits.pool_groups_for(catalog.limits, groups)
            # The group this server's GPU-hours are charged to, fixed for its whole life.
            charge = usage.charge_group(catalog.limits, groups)
            pod.metadata.annotations = {
                **(pod.metadata.annotations or {}),
                **podspec.pod_annotations(self._selection, pools, charge),
            }
        self._enforce_visible_devices(pod)
        return pod

    def _gpu_resource_names(self) -> set[str]:
        if not self.gpu_catalog_configured:
            return set()
        try:
            return podspec.gpu_resource_names(self.load_catalog())
        except CatalogError:
            return set()

    def _enforce_visible_devices(self, pod: Any) -> None:
        """Containers that did not ask for a GPU get NVIDIA_VISIBLE_DEVICES=void; others get none from us."""
        if not self.gpu_catalog_configured:
            return
        from kubernetes_asyncio.client import V1EnvVar

        gpu_resources = self._gpu_resource_names()
        containers = list(pod.spec.containers or []) + list(pod.spec.init_containers or [])
        for container in containers:
            # make_pod turns admin-given containers into models only at the
            # top level, so nested fields may still be plain dicts.
            resources = container.resources
            if resources is not None and not isinstance(resources, dict):
                resources = {"limits": resources.limits, "requests": resources.requests}
            value = podspec.visible_devices_env(podspec.requests_gpu(resources, gpu_resources))
            env = [e for e in (container.env or []) if _env_name(e) != labels.ENV_VISIBLE_DEVICES]
            if value is not None:
                env.append(V1EnvVar(name=labels.ENV_VISIBLE_DEVICES, value=value))
            container.env = env

    # ------------------------------------------------------------------
    # start: fail fast on a failed GPU check
    # ------------------------------------------------------------------

    def _gpu_check_progress(self) -> str | None:
        if self.capacity.queue_message:
            return self.capacity.queue_message
        turn = self._start_turn_message()
        if turn:
            return turn
        reflector = self.pod_reflector
        if reflector is None or self._selection is None or not self._selection.is_gpu:
            return None
        pod = reflector.pods.get(f"{self.namespace}/{self.pod_name}")
        if pod is None:
            return None
        if self.kueue_queue and kueue.is_gated(pod):
            return self._kueue_progress(pod)
        if self.capacity.unschedulable is not None and admission.unschedulable_message(pod):
            return self.capacity.scheduling_progress(self.gpu_unschedulable_timeout)
        from ..validation.podstatus import describe_waiting

        return describe_waiting(pod)

    def _kueue_progress(self, pod: dict) -> str:
        """Where the pod waits in Kueue, as its progress line; following its place from now on."""
        selection = self._selection
        assert selection is not None and selection.gpu_type is not None
        view = self.kueue_view()
        uid = (pod.get("metadata") or {}).get("uid") or ""
        place = None
        if view is not None and uid:
            self._kueue_uid = uid
            view.wait(uid)
            place = view.place(uid)
        return kueue.progress_message(place, selection.gpus, selection.gpu_type.display_name)

    def _kueue_done(self) -> None:
        uid, self._kueue_uid = self._kueue_uid, ""
        if uid and self.kueue_queue:
            found = self.kueue_view()
            if found is not None:
                found.done(uid)

    def _kueue_overdue(self, pod: dict) -> float | None:
        """How long a gated pod has waited in Kueue when that is past ``gpu_queue_timeout``."""
        if not self.kueue_queue or not kueue.is_gated(pod) or self.gpu_queue_timeout <= 0:
            return None
        created = serverpod.parse_timestamp((pod.get("metadata") or {}).get("creationTimestamp"))
        if created is None:
            return None
        waited = time.time() - created
        return waited if waited >= self.gpu_queue_timeout else None

    async def progress(self):
        """KubeSpawner's progress events, plus the queue, the scheduler's reason and the GPU check.

        KubeSpawner yields only when a Kubernetes event arrives; the queue and
        a pod the scheduler cannot place produce none, so our messages are
        checked every second as well.
        """
        last = None
        percent = 0
        events = super().progress().__aiter__()
        next_event = asyncio.ensure_future(events.__anext__())
        try:
            while True:
                done, _ = await asyncio.wait({next_event}, timeout=1)
                if next_event in done:
                    try:
                        event = next_event.result()
                    except StopAsyncIteration:
                        break
                    percent = event.get("progress", percent)
                    yield event
                    next_event = asyncio.ensure_future(events.__anext__())
                message = self._gpu_check_progress()
                if message and message != last:
                    last = message
                    yield {"progress": percent or 10, "message": message}
        finally:
            next_event.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await next_event
            with contextlib.suppress(RuntimeError):
                await events.aclose()

    def is_pod_running(self, pod: dict | None) -> bool:
        if pod is not None and self._selection is not None and self._selection.is_gpu:
            from ..validation.podstatus import check_failure

            reason = check_failure(pod)
            if reason:
                from ..validation.podstatus import check_failure_kind

                metrics.count_validation_failure(pod)
                raise GPUCheckFailed(reason, check_failure_kind(pod) or "")
            waited = self._kueue_overdue(pod)
            if waited is not None:
                raise KueueWaitTimeout(waited)
            if self._kueue_uid and not kueue.is_gated(pod):
                self._kueue_done()
            self.capacity.watch_scheduling(
                pod, self._selection, timeout=self.gpu_unschedulable_timeout, who=self._log_name
            )
        return super().is_pod_running(pod)

    async def poll(self):
        # A hub restarted with running servers polls them first: its usage recorder
        # starts then, and closes what ended while the hub was down.
        self.gpu_accounting()
        if self._refused_before_pod:
            return 1
        if self.kueue_queue:
            # Its view hears of preempted pods from the pods watch once it listens to it: a
            # server polled after the hub's restart may be preempted before any spawn asks.
            self.kueue_view()
        status = await super().poll()
        if status is None and self.kueue_queue and hub_checks_at_start(self):
            # After KubeSpawner's poll: it starts the pods watch, which a hub that has
            # just started has not yet.
            if not await self._wait_in_kueue_at_hub_start():
                return 1
            status = await super().poll()
        pod = self._reflected_pod()
        if status is None:
            if pod is not None and self._running is not None:
                self._running["node"] = (pod.get("spec") or {}).get("nodeName") or ""
        elif self._running is not None:
            # Stopped without the hub's stop(): by its own annotation, or with its node.
            running, self._running = self._running, None
            notice = serverpod.ServerPod.from_pod(pod).stop_notice if pod else None
            if notice is None and pod is None:
                view = self.kueue_view()
                if view is not None:
                    notice = view.preemption_notice(f"{self.namespace}/{self.pod_name}")
            if notice is None and running.get("node") and await self._node_lost(running["node"]):
                notice = stopreasons.StopNotice(
                    stopreasons.REASON_NODE_LOST, time.time(), detail=running["node"]
                )
            if notice is not None:
                self._keep_stop_notice(notice, running.get("held", ""))
        return status

    async def _wait_in_kueue_at_hub_start(self) -> bool:
        """At the hub's start, let a server still queued in Kueue keep its place and start.

        The hub polls the servers of its database as it starts and stops those
        that do not run. A pod that waits in Kueue is not running yet, but it has
        its place in the cluster's queue: this waits (within ``gpu_queue_timeout``
        of the pod's creation, then ``start_timeout``) until it runs, so the hub
        keeps it. Meanwhile the hub serves, past ``init_spawners_timeout``.

        False when it waited past ``gpu_queue_timeout``: the hub then stops it.
        """
        self.kueue_view()
        reflector = self.pod_reflector
        if reflector is None:
            return True
        key = f"{self.namespace}/{self.pod_name}"
        pod = reflector.pods.get(key)
        if pod is None or not kueue.queue_of(pod):
            return True
        if kueue.is_gated(pod):
            self.log.info("%s waits in Kueue's queue across the hub's restart", self._log_name)
        admitted_by = None
        while True:
            pod = reflector.pods.get(key)
            if pod is None or not serverpod.pod_is_active(pod):
                return True
            waited = self._kueue_overdue(pod)
            if waited is not None:
                self.log.warning(
                    "%s waited longer than %.0f s in Kueue; the hub stops it",
                    self._log_name,
                    self.gpu_queue_timeout,
                )
                # as a wait that ends during a spawn: its user's page says why it stopped
                notice = stopreasons.StopNotice(
                    stopreasons.REASON_STUCK_PENDING, time.time(), seconds=waited
                )
                self._keep_stop_notice(notice, self._held_by_pod(pod))
                return False
            if not kueue.is_gated(pod):
                admitted_by = admitted_by or time.monotonic() + self.start_timeout
                try:
                    if super().is_pod_running(pod) or time.monotonic() > admitted_by:
                        return True
                except Exception:
                    return True
            await asyncio.sleep(1)

    # ------------------------------------------------------------------
    # why it stopped (gpuspawner.core.stopreasons)
    # ------------------------------------------------------------------

    def _reflected_pod(self) -> dict | None:
        if self.pod_reflector is None:
            return None
        return self.pod_reflector.pods.get(f"{self.namespace}/{self.pod_name}")

    def _keep_stop_notice(self, notice: stopreasons.StopNotice, held: str) -> None:
        self._stop_notice = notice.for_server(self.name, held)
        self.log.info("%s stopped: %s", self._log_name, self._stop_notice.sentence())

    async def _pod_stop_notice(self) -> stopreasons.StopNotice | None:
        """The pod's stop-reason annotation: the reflector's copy, else the API's.

        Who stops a server annotates the pod just before asking the hub to stop
        it, so the watch may not have brought the annotation yet: one read then.
        """
        pod = self._reflected_pod()
        notice = serverpod.ServerPod.from_pod(pod).stop_notice if pod else None
        if notice is not None or self._gpu_mock:
            return notice
        try:
            pod = await kube.request_json(
                self.api.read_namespaced_pod,
                self.pod_name,
                self.namespace,
                what=f"reading pod {self.pod_name}",
                timeout=self.k8s_api_request_timeout,
            )
        except Exception as e:
            if not isinstance(e, kube.NotFound):
                self.log.warning("Could not read why %s is stopped: %s", self._log_name, e)
            return None
        return serverpod.ServerPod.from_pod(pod).stop_notice

    async def _node_lost(self, node: str) -> bool:
        """Whether ``node`` is gone or not Ready (False when the nodes cannot be read)."""
        if self._gpu_mock:
            return False
        try:
            listing = await kube.request_json(
                self.api.list_node,
                field_selector=f"metadata.name={node}",
                what=f"reading node {node}",
                timeout=self.k8s_api_request_timeout,
            )
        except Exception as e:
            self.log.warning("Could not tell whether the node of %s is lost: %s", self._log_name, e)
            return False
        return stopreasons.node_is_lost(listing.get("items") or [], node)

    async def stop(self, now=False):
        running, self._running = self._running, None
        notice = await self._pod_stop_notice()
        if notice is not None:
            self._keep_stop_notice(notice, (running or {}).get("held", ""))
        return await super().stop(now=now)

    def stop_notice(self) -> stopreasons.StopNotice | None:
        """Why this server last stopped, until its user starts it again; None when they stopped it."""
        if self._stop_notice is None:
            return None
        return self._stop_notice.for_server(self.name, "")

    def cull_warning(self) -> stopreasons.CullWarning | None:
        """The culler's pending warning on the running pod, else None."""
        pod = self._reflected_pod()
        warning = serverpod.ServerPod.from_pod(pod).cull_warning if pod else None
        if warning is None:
            return None
        return warning.for_server(self.name, (self._running or {}).get("held", ""))

    def get_state(self):
        state = super().get_state()
        if self._stop_notice is not None:
            state[stopreasons.STATE_KEY] = self._stop_notice.to_state()
        if self._running is not None:
            state[stopreasons.RUNNING_STATE_KEY] = dict(self._running)
        return state

    def load_state(self, state):
        super().load_state(state)
        self._stop_notice = stopreasons.StopNotice.from_state(state.get(stopreasons.STATE_KEY))
        running = state.get(stopreasons.RUNNING_STATE_KEY)
        self._running = None
        if isinstance(running, dict):
            self._running = {k: v for k, v in running.items() if isinstance(v, str)}

    def clear_state(self):
        # The stop notice survives: JupyterHub saves get_state() right after this.
        super().clear_state()
        self._running = None

    def _held(self) -> str:
        selection = self._selection
        if selection is None or not selection.is_gpu or selection.gpu_type is None:
            return ""
        return stopreasons.held_text(selection.gpus, selection.gpu_type.display_name)

    def _held_by_pod(self, pod: dict) -> str:
        """What a pod of this server asks for (``2 × NVIDIA A100``), before a start chose it.

        The catalog names the type; "" for a pod without GPUs or a catalog that cannot be read.
        """
        server_pod = serverpod.ServerPod.from_pod(pod)
        if server_pod.gpu_type is None:
            return ""
        try:
            gpu_type = self.load_catalog().gpu_types.get(server_pod.gpu_type)
        except CatalogError:
            gpu_type = None
        name = gpu_type.display_name if gpu_type is not None else server_pod.gpu_type
        return stopreasons.held_text(server_pod.gpus, name)

    def _failed_start(self, reason: str, **fields: Any) -> None:
        """Keep the notice of a start GPUSpawner itself gave up on."""
        notice = stopreasons.StopNotice(reason, time.time(), **fields)
        self._keep_stop_notice(notice, self._held())

    async def start(self):
        """KubeSpawner's start, then the wait for Jupyter to answer; a failed start is cleaned up.

        KubeSpawner's ``start()`` reads the options (our ``load_user_options``:
        admission, the queue, the start's turn), creates the pod and waits for it
        to run; its ``progress()`` follows that part. Around it: a failed GPU
        check or a pod no node can take ends the spawn with its reason and
        deletes the pod, and the reservation and the start's turn are given back
        however the start ends (cancelled too).
        """
        self._refused_before_pod = False
        self._pod_requested = False
        self._stop_notice = None
        self._running = None
        self.capacity.start_over()
        started = time.monotonic()
        try:
            result = await super().start()
            if not self.internal_ssl:
                # A turn lasts until Jupyter itself is up (its start is the costly part),
                # and the hub's own backoff would see the server up to a second late
                # (serverprobe). With internal SSL only the hub holds the client
                # certificate to ask, so then the hub alone waits.
                try:
                    await serverprobe.wait_until_answering(result, timeout=self.http_timeout)
                except TimeoutError:
                    # Raised as JupyterHub's own TimeoutError, the hub would log it as a
                    # start_timeout and show the pod's address to the user.
                    raise spawn_error(
                        refusals.sentence(
                            REASON_TIMEOUT,
                            "no-answer",
                            seconds=self.http_timeout,
                            unit="second" if self.http_timeout == 1 else "seconds",
                            pod=self.pod_name,
                        ),
                        reason=REASON_TIMEOUT,
                        status=refusals.SENTENCES[REASON_TIMEOUT].status,
                    ) from None
            pod = self._reflected_pod() or {}
            self._running = {
                "held": self._held(),
                "node": (pod.get("spec") or {}).get("nodeName") or "",
            }
            if self._selection is not None and self._selection.is_gpu and self._selection.gpu_type:
                metrics.observe_spawn_duration(
                    self._selection.gpu_type.key, time.monotonic() - started
                )
            return result
        except GPUUnschedulable as e:
            metrics.count_refusal(REASON_UNSCHEDULABLE)
            waited = self.gpu_unschedulable_timeout
            self.log.warning(
                "Giving up on %s after %.0f s without free GPUs: %s", self._log_name, waited, e
            )
            self._failed_start(stopreasons.REASON_STUCK_PENDING, seconds=float(waited))
            await self._delete_failed_pod("it could not be scheduled")
            raise spawn_error(
                refusals.sentence(REASON_UNSCHEDULABLE, "not-scheduled", seconds=waited, detail=e),
                reason=REASON_UNSCHEDULABLE,
                status=refusals.SENTENCES[REASON_UNSCHEDULABLE].status,
            ) from None
        except KueueWaitTimeout as e:
            metrics.count_refusal(REASON_NO_CAPACITY)
            waited = float(e.args[0]) if e.args else self.gpu_queue_timeout
            self.log.warning(
                "Giving up on %s after %.0f s in Kueue's queue", self._log_name, waited
            )
            self._failed_start(stopreasons.REASON_STUCK_PENDING, seconds=waited)
            await self._delete_failed_pod("it waited too long in Kueue's queue")
            selection = self._selection
            request = (
                f"{selection.gpus} {selection.gpu_type.display_name} "
                f"GPU{'' if selection.gpus == 1 else 's'}"
                if selection is not None and selection.gpu_type is not None
                else "its GPUs"
            )
            raise spawn_error(
                refusals.sentence(
                    REASON_NO_CAPACITY, "kueue-timeout", seconds=waited, request=request
                )
                + " "
                + refusals.sentence(REASON_NO_CAPACITY, "later"),
                reason=REASON_NO_CAPACITY,
                status=refusals.SENTENCES[REASON_NO_CAPACITY].status,
            ) from None
        except GPUCheckFailed as e:
            metrics.count_refusal(REASON_GPU_CHECK)
            reason = str(e)
            self.log.warning("GPU check failed for %s: %s", self._log_name, reason)
            self._failed_start(stopreasons.REASON_GPU_CHECK, kind=e.kind, detail=reason)
            await self._delete_failed_pod("its GPU check failed")
            # A check that never started says nothing of the GPUs: not "failed their check".
            message = (
                refusals.sentence(REASON_GPU_CHECK, "not-run", detail=reason)
                if e.kind == stopreasons.NOT_STARTABLE_KIND
                else refusals.sentence(REASON_GPU_CHECK, "failed", detail=reason)
            )
            raise spawn_error(
                message,
                reason=REASON_GPU_CHECK,
                status=refusals.SENTENCES[REASON_GPU_CHECK].status,
            ) from None
        except Exception:
            # Any other failure once the pod was asked for (KubeSpawner's create timing out
            # under a slow API server, its retries running out): the pod may exist although
            # the hub never saw it, and KubeSpawner's stop() deletes only pods its reflector
            # has seen.
            if self._pod_requested:
                await self._delete_pod_by_name()
            raise
        finally:
            self._release_reservation()
            self._kueue_done()
            self.hub_state.start_gate.leave(self._start_key())

    async def _delete_pod_by_name(self) -> None:
        """Delete this server's pod by name, asking the API server, not the reflector's cache.

        A create whose answer timed out may still have made the pod: without this it
        would run on, holding its GPUs, with a token the hub no longer accepts.
        """
        retry = kube.RetryPolicy(timeout=self.k8s_api_request_retry_timeout)
        try:
            await retry.run(
                lambda: kube.request_json(
                    self.api.delete_namespaced_pod,
                    self.pod_name,
                    self.namespace,
                    what=f"deleting pod {self.pod_name}",
                    timeout=self.k8s_api_request_timeout,
                    grace_period_seconds=0,
                ),
                self.log,
            )
        except kube.NotFound:
            return
        except Exception as e:
            self.log.error(
                "Could not delete the pod %s of %s's failed start: %s",
                self.pod_name,
                self._log_name,
                e,
            )
            return
        self.log.info("Deleted the pod %s of %s's failed start", self.pod_name, self._log_name)

    async def _delete_failed_pod(self, why: str) -> None:
        """Delete the pod of a failed spawn so it holds no GPUs (and no place in the queue)."""
        try:
            await self.stop(now=True)
        except Exception as stop_error:
            self.log.error(
                "Could not delete the pod of %s after %s: %s", self._log_name, why, stop_error
            )


def _used_unit_seconds(store: Any, users: list[str], since: float, until: float, now: float) -> Any:
    """The store's weighted GPU-seconds per user (run on the recorder's thread)."""
    return store.used_unit_seconds(users, since, until, now)


#: GPUSpawner's part of the spawn form: the budget line and the idle-timeout fields.
FORM_TEMPLATE = "gpuspawner-form.html"


@functools.cache
def _form_templates() -> Any:
    """The autoescaped environment of GPUSpawner's form template (compiled once per hub)."""
    from jinja2 import Environment, FileSystemLoader

    from .pages import TEMPLATE_PATH

    return Environment(loader=FileSystemLoader(TEMPLATE_PATH), autoescape=True)


def _profiles_in_order(profile_list: Any) -> Any:
    """A ``profile_list`` dict's profiles ordered by key, as KubeSpawner 7.1 reads one.

    Lists and callables are returned as they are (KubeSpawner 7.0 takes no dict).
    """
    if isinstance(profile_list, dict):
        return [profile_list[key] for key in sorted(profile_list)]
    return profile_list


def _overridden(configured: Any, value: Any) -> Any:
    """A trait's value after an override, as KubeSpawner's ``_apply_overrides`` makes it.

    A dict is merged into a configured dict (a None value removes its key);
    anything else replaces the configured value. Neither is changed in place.
    """
    if isinstance(value, dict) and isinstance(configured, dict):
        merged = copy.deepcopy(configured)
        recursive_update(merged, copy.deepcopy(value))
        return merged
    return copy.deepcopy(value)


def _env_name(env_var: Any) -> str | None:
    if isinstance(env_var, dict):
        return env_var.get("name")
    return getattr(env_var, "name", None)
