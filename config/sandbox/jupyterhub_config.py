# JupyterHub configuration for the local GPU cluster (gpuspawner-sandbox demo
# and the end-to-end tests). It is loaded after a generated preamble that sets
# the loopback addresses, ports, proxy, database and the demo login; see
# sandbox/gpuspawner_sandbox/hubprocess.py and sandbox/gpuspawner_sandbox/demo.py.
import os
import socket
from pathlib import Path

import gpuspawner

c = get_config()  # noqa: F821

here = Path(__file__).resolve().parent

c.JupyterHub.spawner_class = "gpu"
c.GPUSpawner.catalog_file = os.environ.get("GPUSPAWNER_CATALOG", str(here / "catalog.yaml"))

# The hub runs outside the cluster with the kubeconfig of its service account
# (KUBECONFIG, bound only to config/rbac.yaml). Pods are real containers of the
# notebook image built here on real nodes (docs/sandbox.md): the image's own
# start script and user (jovyan) run, and notebooks reach the hub on the host's
# own address in the pod range (their only routes are the pod range), which the
# sandbox puts on an interface of its own and names here.
c.KubeSpawner.namespace = "jupyterhub"
_hub_address = os.environ.get("GPUSPAWNER_SANDBOX_HUB_ADDRESS", "127.0.0.1")
c.JupyterHub.hub_ip = _hub_address
c.JupyterHub.hub_connect_ip = _hub_address
c.KubeSpawner.cmd = ["start-singleuser.sh"]
c.KubeSpawner.args = [
    "--ServerApp.default_url=/lab",
    # language-server autodetection runs npm on every start; nothing here needs it
    "--LanguageServerManager.autodetect=False",
]
c.KubeSpawner.storage_pvc_ensure = False
c.KubeSpawner.start_timeout = 180
c.KubeSpawner.http_timeout = 60
# Every node of the local cluster runs on this machine's few cores: four starts at a
# time, the rest in turn, so the first users are served early when many start
# together (a turn's wait counts toward start_timeout).
c.GPUSpawner.concurrent_starts = 4
# The hub reaches pod IPs directly (KubeSpawner's default), as it runs on the host.
c.KubeSpawner.services_enabled = False

# Notebook pods outlive hub restarts (as in zero-to-jupyterhub); the hub finds
# them again from its database and the pod reflector.
c.JupyterHub.cleanup_servers = False

c.JupyterHub.load_groups = {"students": {"users": ["student"]}}
c.Authenticator.admin_users = {"admin"}  # (JupyterHub.admin_users is deprecated)

# The counting of every namespace's pods is the admin's opt-in, with the RBAC of
# config/rbac-opt-in-all-namespaces.yaml (gpuspawner_sandbox's opt_in_all_namespaces
# sets both); it is set before setup, which passes it on to the gpuspawner service.
if os.environ.get("GPUSPAWNER_SANDBOX_ALL_NAMESPACES") == "1":
    c.GPUSpawner.gpu_inventory_all_namespaces = True

# gpuspawner's services and their roles, as in config/jupyterhub_config.py (the catalog
# check, the pages' stop notices, the culler, the GPU page, the gpuspawner service),
# each on a free loopback port: several sandbox hubs may run at once. They are handed
# the hub's service-account kubeconfig (KUBECONFIG). Notebooks ask the culler for
# JupyterLab's cull warning directly, on the hub's pod-range address. A real
# Prometheus scrapes every GPU node's DCGM exporter: the culler and the GPU page read
# GPU activity from it, as on a real cluster. The GPU page is for 'admin' (the hub's
# admin user; no group).


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# With Kueue (gpuspawner-sandbox demo --kueue): the culler's demand and the GPU page's
# table read these ClusterQueues.
_kueue_queues = [
    q for q in os.environ.get("GPUSPAWNER_SANDBOX_KUEUE_CLUSTER_QUEUES", "").split(",") if q
]
_culler_url = f"http://{_hub_address}:{_free_port()}"
gpuspawner.setup(
    c,
    culler_url=_culler_url,
    admin_url=f"http://127.0.0.1:{_free_port()}",
    user_service_url=f"http://127.0.0.1:{_free_port()}",
    culler_args=[
        "--config=" + os.environ.get("GPUSPAWNER_CULLER_CONFIG", str(here / "culler_config.py")),
        *(f"--GPUCuller.kueue_cluster_queues={q}" for q in _kueue_queues),
    ],
    admin_args=[f"--GPUAdmin.kueue_cluster_queues={q}" for q in _kueue_queues],
    prometheus_url=os.environ.get("GPUSPAWNER_SANDBOX_PROMETHEUS_URL", ""),
    environment={
        k: os.environ[k] for k in ("GPUSPAWNER_DEMO_PRESSURE_TIMEOUT",) if k in os.environ
    },
    warning_url=f"{_culler_url}/",
    admin_groups=(),
)
