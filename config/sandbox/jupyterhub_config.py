# JupyterHub configuration for the local GPU cluster (gpuspawner-sandbox demo
# and the end-to-end tests). It is loaded after a generated preamble that sets
# the loopback addresses, ports, proxy, database and the demo login; see
# sandbox/gpuspawner_sandbox/hubprocess.py and sandbox/gpuspawner_sandbox/demo.py.
import os
import sys
from pathlib import Path

from gpuspawner import check_catalog

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
# A real Prometheus scrapes every GPU node's DCGM exporter: the culler and the
# admin page read GPU activity from it, as on a real cluster.
_prometheus = os.environ.get("GPUSPAWNER_SANDBOX_PROMETHEUS_URL")
_prometheus_args = [f"--prometheus-url={_prometheus}"] if _prometheus else []
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

# The GPU-aware idle culler, as in config/jupyterhub_config.py, with the
# hub's service-account kubeconfig handed on (services get few variables).
# Reached through the proxy at /services/gpuspawner-culler/ on a free loopback
# port (several sandbox hubs may run at once), for JupyterLab's cull warning.
import socket  # noqa: E402

with socket.socket() as _s:
    _s.bind(("127.0.0.1", 0))
    _culler_port = _s.getsockname()[1]
c.JupyterHub.services.append(
    {
        "name": "gpuspawner-culler",
        # notebooks ask it themselves: on the hub's pod-range address
        "url": f"http://{_hub_address}:{_culler_port}",
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.culler",
            "--config="
            + os.environ.get("GPUSPAWNER_CULLER_CONFIG", str(here / "culler_config.py")),
            *_prometheus_args,
        ],
        "environment": {
            k: os.environ[k]
            for k in ("KUBECONFIG", "GPUSPAWNER_DEMO_PRESSURE_TIMEOUT")
            if k in os.environ
        },
    }
)
c.JupyterHub.load_roles.append(
    {
        "name": "gpuspawner-culler",
        "scopes": [
            "list:users",
            "read:users:activity",
            "read:servers",
            "delete:servers",
            "read:metrics",
        ],
        "services": ["gpuspawner-culler"],
    }
)
# JupyterLab's cull warning (gpuspawner-jupyterlab), as in config/jupyterhub_config.py:
# every user may reach the culler, server tokens carry that access, and servers
# ask it directly, on the hub's address.
CULLER_ACCESS = "access:services!service=gpuspawner-culler"
c.JupyterHub.load_roles.append({"name": "user", "scopes": ["self", CULLER_ACCESS]})
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", CULLER_ACCESS]
c.Spawner.environment.update({"GPUSPAWNER_CULLER_URL": f"http://{_hub_address}:{_culler_port}/"})

# --- gpuspawner-admin: the GPU page for admins (docs/admin.md) ----------------
# A hub-managed service at /services/gpuspawner-admin/, on a free loopback port
# (several sandbox hubs may run at once). Users need the custom scope
# custom:gpuspawner:admin (granted to 'admin' below); others get 403.
with socket.socket() as _s:
    _s.bind(("127.0.0.1", 0))
    _admin_port = _s.getsockname()[1]
c.JupyterHub.custom_scopes = {
    "custom:gpuspawner:admin": {
        "description": "See the GPU pool page and stop servers from it (gpuspawner-admin)."
    }
}
c.JupyterHub.services.append(
    {
        "name": "gpuspawner-admin",
        "url": f"http://127.0.0.1:{_admin_port}",
        "command": [sys.executable, "-m", "gpuspawner.admin", *_prometheus_args],
        "oauth_client_allowed_scopes": ["custom:gpuspawner:admin"],
        "oauth_no_confirm": True,
        # its cluster access is the hub's service account; limits come from the hub's catalog
        "environment": {k: os.environ[k] for k in ("KUBECONFIG",) if k in os.environ}
        | {"GPUSPAWNER_CATALOG": c.GPUSpawner.catalog_file},
    }
)
c.JupyterHub.load_roles.append(
    {
        "name": "gpuspawner-admin-service",
        "scopes": ["list:users", "read:users", "read:servers", "delete:servers"],
        "services": ["gpuspawner-admin"],
    }
)
c.JupyterHub.load_roles.append(
    {
        "name": "gpuspawner-admins",
        "description": "See and steer the GPU pool",
        "scopes": ["custom:gpuspawner:admin", "access:services!service=gpuspawner-admin"],
        "users": sorted(c.Authenticator.admin_users),
    }
)
# --- end of gpuspawner-admin --------------------------------------------------

# --- the gpuspawner service: live GPU figures on the spawn form (docs/capacity.md) ---
# A hub-managed service at /services/gpuspawner/ on a free loopback port, with
# its own watch of nodes and pods (the hub's service account, KUBECONFIG) and
# the hub's catalog and pod placement. Every user reaches it: add_service adds
# access:services!service=gpuspawner to the 'user' role. The service counts pods of
# every namespace only when the hub does: the admin's opt-in, with the RBAC of
# config/rbac-opt-in-all-namespaces.yaml (gpuspawner_sandbox's opt_in_all_namespaces
# sets both), is set here, before add_service passes it on.
if os.environ.get("GPUSPAWNER_SANDBOX_ALL_NAMESPACES") == "1":
    c.GPUSpawner.gpu_inventory_all_namespaces = True
from gpuspawner.userservice.hubconfig import add_service  # noqa: E402

with socket.socket() as _s:
    _s.bind(("127.0.0.1", 0))
    _service_port = _s.getsockname()[1]
add_service(c, url=f"http://127.0.0.1:{_service_port}")
# --- end of the gpuspawner service ------------------------------------------

# Why a server stopped, and pending cull warnings, on the home page (docs/culler.md).
from gpuspawner.hub.pages import configure as show_stop_notices  # noqa: E402

show_stop_notices(c)

check_catalog(c)
