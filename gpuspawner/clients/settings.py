"""Settings gpuspawner's hub services share (the culler, the admin page, the user service).

Each is a traitlets mixin of the service's Application, so it is set as
``c.GPUCuller.<name>`` / ``c.GPUAdmin.<name>`` (or ``--GPUAdmin.<name>=…``),
and a config file shared by both services may set it once for both as
``c.PrometheusSettings.<name>`` (likewise ``HubServiceSettings``,
``KubernetesSettings``).
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from traitlets import Float, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from ..core.hubconfig import ACCOUNTING_DB_URL_ENV, CATALOG_ENV
from . import kube
from .prometheus import GPUQueries, PrometheusClient


class ServiceConfigFile(Configurable):
    """A Python config file for a service, read before its command line (which wins)."""

    #: The file read when ``config_file`` is not set, if it exists (one per service).
    default_config_file = ""

    config_file = Unicode(
        "",
        help="A config file to load (Python). It may set this service's settings and, shared with the other gpuspawner service, `c.PrometheusSettings.*`, `c.KubernetesSettings.*` and `c.HubServiceSettings.*`. Default: the service's own file in the working directory (gpuspawner_culler_config.py, gpuspawner_admin_config.py), skipped when missing.",
    ).tag(config=True)

    def load_service_config(self) -> None:
        """Load ``config_file`` (an Application's), then let the command line win again."""
        path = self.config_file or self.default_config_file
        if path and (self.config_file or os.path.exists(path)):
            self.load_config_file(path)
            self.update_config(self.cli_config)


class ServiceEndpointSettings(Configurable):
    """Where a hub-managed service with a web endpoint listens."""

    #: The port of the default ``service_url`` when the hub passes none (one per service).
    default_port = 0

    service_url = Unicode(
        help="Where the service listens. Default: $JUPYTERHUB_SERVICE_URL (the service's 'url' in the hub config), else http://127.0.0.1 on the service's own port (gpuspawner-admin 10102, gpuspawner 10103)."
    ).tag(config=True)

    @default("service_url")
    def _default_service_url(self):
        return os.environ.get("JUPYTERHUB_SERVICE_URL", f"http://127.0.0.1:{self.default_port}")

    ip = Unicode(
        "",
        help="The address to listen on. Default: the host of service_url. Set 0.0.0.0 when the proxy runs in another pod (zero-to-jupyterhub).",
    ).tag(config=True)

    def listen_address(self) -> tuple[int, str]:
        """The port and address to listen on, from ``service_url`` and ``ip``."""
        url = urlparse(self.service_url)
        return url.port or 80, self.ip or url.hostname or "127.0.0.1"


class CatalogFileSettings(Configurable):
    """The GPU catalog file a service shares with the hub."""

    catalog_file = Unicode(
        help="The GPU catalog file the hub uses (c.GPUSpawner.catalog_file), re-read when it changes. Default: $GPUSPAWNER_CATALOG."
    ).tag(config=True)

    @default("catalog_file")
    def _default_catalog_file(self):
        return os.environ.get(CATALOG_ENV, "")


class AccountingSettings(Configurable):
    """The usage database a service reads GPU-hours from, the one the hub records them in."""

    accounting_db_url = Unicode(
        help="The usage database the hub records GPU-hours in (SQLAlchemy URL: GPUSpawner.accounting_db_url, else the hub's own db_url), read only: the GPU page's usage figures, the culler's budget stops. Default: $GPUSPAWNER_ACCOUNTING_DB_URL, which gpuspawner.setup passes on (nothing when accounting is off); empty: no usage figures, and the culler enforces no budget (the hub still refuses requests a budget cannot cover)."
    ).tag(config=True)

    @default("accounting_db_url")
    def _default_accounting_db_url(self):
        return os.environ.get(ACCOUNTING_DB_URL_ENV, "")


class HubServiceSettings(Configurable):
    """How a hub-managed service reaches the hub's API.

    The hub passes both to the services it starts (``JUPYTERHUB_API_URL``,
    ``JUPYTERHUB_API_TOKEN``); set them for a service run by hand.
    """

    hub_api_url = Unicode(
        help="The hub's API URL. Default: $JUPYTERHUB_API_URL (set by the hub for managed services), else http://127.0.0.1:8081/hub/api."
    ).tag(config=True)

    @default("hub_api_url")
    def _default_api_url(self):
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    api_token = Unicode(
        help="The service's API token. Default: $JUPYTERHUB_API_TOKEN (set by the hub for managed services)."
    ).tag(config=True)

    @default("api_token")
    def _default_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")


class KubernetesSettings(Configurable):
    """Whether and where a service reads GPUSpawner's pods (and the nodes) from Kubernetes."""

    kubernetes = Unicode(
        "auto",
        help="Read GPUSpawner's pods (and, for the admin page, the nodes) from Kubernetes: 'on', 'off', or 'auto' (on in a pod with a service account or with a kubeconfig).",
    ).tag(config=True)

    @validate("kubernetes")
    def _check_kubernetes(self, proposal):
        if proposal.value not in ("auto", "on", "off"):
            # a TraitError: the Application turns it into one line, not a traceback
            raise TraitError(
                f"{type(self).__name__}.kubernetes must be 'auto', 'on' or 'off', "
                f"not {proposal.value!r}"
            )
        return proposal.value

    namespace = Unicode(
        help="The namespace of the notebook pods. Default: $POD_NAMESPACE, else the namespace of the pod's service account (the hub's own), else jupyterhub."
    ).tag(config=True)

    @default("namespace")
    def _default_namespace(self):
        return kube.default_namespace()

    def use_kubernetes(self) -> bool:
        """``kubernetes`` resolved: 'auto' is on where a service account or kubeconfig exists."""
        return self.kubernetes == "on" or (
            self.kubernetes == "auto" and kube.kubernetes_available()
        )


class PrometheusSettings(Configurable):
    """Where GPU activity is read: Prometheus, and the DCGM exporter's metric and label names."""

    prometheus_url = Unicode(
        "",
        help="Prometheus's base URL (e.g. http://prometheus-server.monitoring), where the DCGM exporter's GPU metrics are. Empty: GPU activity is not used (the culler goes by Jupyter activity only, the admin page shows no utilisation).",
    ).tag(config=True)
    prometheus_timeout = Float(30, help="Seconds before a Prometheus query is abandoned.").tag(
        config=True
    )
    gpu_util_metric = Unicode(
        "DCGM_FI_DEV_GPU_UTIL", help="GPU utilisation metric, in percent (DCGM exporter)."
    ).tag(config=True)
    gpu_engine_metric = Unicode(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        help="Fallback activity metric as a 0..1 ratio, used for pods without gpu_util_metric (e.g. MIG devices).",
    ).tag(config=True)
    pod_label = Unicode(
        "pod",
        help="The metric label holding the pod name: 'pod', or 'exported_pod' when Prometheus scrapes the exporter without honor_labels.",
    ).tag(config=True)
    namespace_label = Unicode(
        "namespace",
        help="The metric label holding the pod's namespace: 'namespace' or 'exported_namespace'.",
    ).tag(config=True)

    def gpu_queries(self, **more) -> GPUQueries:
        """The queries with these names (``more``: the culler's threshold and window).

        Raises ValueError with one sentence for a name Prometheus would not accept.
        """
        return GPUQueries(
            util_metric=self.gpu_util_metric,
            engine_metric=self.gpu_engine_metric,
            pod_label=self.pod_label,
            namespace_label=self.namespace_label,
            **more,
        )

    def prometheus_client(self, **more) -> PrometheusClient | None:
        """A client with :meth:`gpu_queries`, or None without ``prometheus_url``."""
        if not self.prometheus_url:
            return None
        return PrometheusClient(
            self.prometheus_url, self.gpu_queries(**more), timeout=self.prometheus_timeout
        )
