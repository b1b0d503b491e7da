# JupyterHub configuration for GPUSpawner, for a hub running inside the cluster
# with its own service account (see rbac.yaml). Every setting here is a plain
# KubeSpawner/JupyterHub setting except the c.GPUSpawner.* lines.
#
#   jupyterhub -f /etc/jupyterhub/jupyterhub_config.py
#
# The same settings through zero-to-jupyterhub's Helm chart: z2jh-values.yaml.
import os

from gpuspawner import check_catalog

c = get_config()  # noqa: F821 (provided by JupyterHub when it reads this file)

# --- the spawner ----------------------------------------------------------
# "gpu" is GPUSpawner's entry point name (jupyterhub.spawners).
c.JupyterHub.spawner_class = "gpu"

# The catalog: images, GPU types, allowed counts and per-user limits. The file
# is re-read when it changes (mount it from a ConfigMap), so images and limits
# change without a hub restart. config/catalog.yaml is a complete example.
c.GPUSpawner.catalog_file = os.environ.get("GPUSPAWNER_CATALOG", "/etc/gpuspawner/catalog.yaml")

# The nvidia-smi check in every GPU pod (on by default). It runs in the
# notebook's own image; set validation_image to run it from another one.
c.GPUSpawner.validation_enabled = True
# c.GPUSpawner.validation_image = "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04"

# --- the cluster ------------------------------------------------------------
# In the cluster the hub uses its service account (rbac.yaml); KubeSpawner
# picks the in-cluster configuration up by itself.
c.KubeSpawner.namespace = os.environ.get("POD_NAMESPACE", "jupyterhub")
# Notebook pods reach the hub through its Service.
c.JupyterHub.hub_connect_ip = os.environ.get("HUB_SERVICE_HOST", "hub")
c.JupyterHub.hub_ip = "0.0.0.0"  # inside the hub pod: its own pod address
c.KubeSpawner.start_timeout = 600  # image pulls of CUDA images take minutes
c.KubeSpawner.http_timeout = 120
# Everything an admin already sets for KubeSpawner still applies and is
# merged with what GPUSpawner adds, e.g.:
c.KubeSpawner.cpu_guarantee = 0.5
c.KubeSpawner.mem_guarantee = "2G"
c.KubeSpawner.storage_pvc_ensure = False

# Notebook pods outlive hub restarts (as in zero-to-jupyterhub); the hub finds
# them again from its database and the pod reflector.
c.JupyterHub.cleanup_servers = False

# --- users ------------------------------------------------------------------
# Limits are per user and per group (catalog "limits:" section). Groups come
# from the authenticator (e.g. OAuth groups claims) or from load_groups.
c.JupyterHub.load_groups = {
    "ml-research": {"users": []},
    "students": {"users": []},
}
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 5

# --- gpuspawner-culler: give idle GPUs back (docs/culler.md) ------------------
# A hub-managed service: the hub starts it and hands it its API URL and token.
# It stops servers idle by both Jupyter activity and GPU utilisation (from
# Prometheus), with timeouts per profile / GPU type / GPU count, and culls
# harder while GPU requests wait. Its settings: culler_config.py (next to the
# catalog; config/gpuspawner_culler_config.py is a complete example).
import sys  # noqa: E402

c.JupyterHub.services.append(
    {
        "name": "gpuspawner-culler",
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.culler",
            "--config="
            + os.environ.get("GPUSPAWNER_CULLER_CONFIG", "/etc/gpuspawner/culler_config.py"),
        ],
        # reached through the proxy at /services/gpuspawner-culler/ (its /api/warning)
        "url": "http://127.0.0.1:10101",
        # the hub passes services only a few variables: hand on the API server's address
        "environment": {
            key: os.environ[key]
            for key in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAMESPACE")
            if key in os.environ
        },
    }
)
# The least the culler needs (never access:servers or admin):
#   list:users + read:servers     find users' servers, their user_options and state
#   read:users:activity           the hub's last_activity of users and servers
#   delete:servers                stop a server
#   read:metrics                  the GPU demand the hub holds back (queued and
#                                 lately refused requests) and free GPUs per node
# Add "read:users:groups" if the culler's exempt_groups is set. Pod names, GPU
# labels and waiting GPU requests are read from Kubernetes with the hub pod's
# service account (rbac.yaml already lets it list pods).
c.JupyterHub.load_roles.append(
    {
        "name": "gpuspawner-culler",
        "description": "Stop idle servers (gpuspawner-culler)",
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
# The cull warning inside JupyterLab (gpuspawner-jupyterlab, in our images): a
# server asks the culler's /api/warning about itself with its own token, through
# the proxy. Every user may reach the culler (it only ever answers about the
# caller's own servers), and server tokens carry that access besides the
# defaults of JupyterHub's "server" role. Notebook pods reach the proxy through
# the hub's Service (give it the proxy's port 8000) or set GPUSPAWNER_CULLER_URL.
CULLER_ACCESS = "access:services!service=gpuspawner-culler"
c.JupyterHub.load_roles.append({"name": "user", "scopes": ["self", CULLER_ACCESS]})
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", CULLER_ACCESS]
c.Spawner.environment.update(
    {
        "GPUSPAWNER_CULLER_URL": os.environ.get(
            "GPUSPAWNER_CULLER_URL",
            f"http://{c.JupyterHub.hub_connect_ip}:8000/services/gpuspawner-culler/",
        )
    }
)
# --- end of gpuspawner-culler ---------------------------------------------------

# --- gpuspawner-admin: the GPU page for admins (docs/admin.md) ----------------
# A hub-managed service at /services/gpuspawner-admin/: GPUs per type, every
# server with its GPUs, node, age, idle time and the owner's limit and rule, and
# a stop button. Only users with the custom scope custom:gpuspawner:admin see it
# (the role below: the hub's admin users and the group gpu-admins); `gpuspawner
# status` reads the same figures with such a user's token.
c.JupyterHub.custom_scopes = {
    "custom:gpuspawner:admin": {
        "description": "See the GPU pool page and stop servers from it (gpuspawner-admin)."
    }
}
c.JupyterHub.services.append(
    {
        "name": "gpuspawner-admin",
        "url": "http://127.0.0.1:10102",
        # the culler's settings file: the same Prometheus metric and label names
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.admin",
            "--config="
            + os.environ.get("GPUSPAWNER_CULLER_CONFIG", "/etc/gpuspawner/culler_config.py"),
        ],
        "oauth_client_allowed_scopes": ["custom:gpuspawner:admin"],
        "oauth_no_confirm": True,
        # the catalog for limits; the cluster through the hub pod's service account
        "environment": {
            "GPUSPAWNER_CATALOG": c.GPUSpawner.catalog_file,
            **{
                key: os.environ[key]
                for key in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAMESPACE")
                if key in os.environ
            },
        },
        # GPU utilisation per server: c.PrometheusSettings in that file (DCGM exporter metrics)
    }
)
# The service reads users (with groups) and servers, and stops servers; never admin.
c.JupyterHub.load_roles.append(
    {
        "name": "gpuspawner-admin-service",
        "description": "The GPU page: read users and servers, stop servers",
        "scopes": ["list:users", "read:users", "read:servers", "delete:servers"],
        "services": ["gpuspawner-admin"],
    }
)
c.JupyterHub.load_roles.append(
    {
        "name": "gpuspawner-admins",
        "description": "See and steer the GPU pool",
        "scopes": ["custom:gpuspawner:admin", "access:services!service=gpuspawner-admin"],
        "users": sorted(c.Authenticator.admin_users) if "admin_users" in c.Authenticator else [],
        "groups": ["gpu-admins"],
    }
)
c.JupyterHub.load_groups.setdefault("gpu-admins", {"users": []})
# --- end of gpuspawner-admin --------------------------------------------------

# --- the gpuspawner service: live GPU figures on the spawn form (docs/capacity.md) ---
# A hub-managed service at /services/gpuspawner/ that the form polls
# (GET /services/gpuspawner/availability) and that tells a user why their servers
# stopped (GET /services/gpuspawner/stop-notices). It keeps its own watch of nodes
# and pods with the hub pod's service account (nodes cluster-wide, pods of this
# namespace: config/rbac.yaml) and is handed the catalog, the pod placement and
# c.GPUSpawner.gpu_inventory_all_namespaces set above, so it counts as the
# spawner does. It gets no hub scope of its own: it reads a user's servers with
# that user's token. add_service grants, through the hub's 'user' role, its
# access scope (access:services!service=gpuspawner) and the user's own
# read:servers!user and admin:server_state!user, which its OAuth tokens carry.
from gpuspawner.userservice.hubconfig import add_service  # noqa: E402

add_service(c, url="http://127.0.0.1:10103")
# --- end of the gpuspawner service ------------------------------------------

# --- why a server stopped (docs/culler.md, "Why it stopped") -------------------
# One line on the home page for each server stopped by someone other than its
# user (the culler, an admin, a failed GPU check, a lost node) and for each
# server the culler will stop soon; the spawn form shows its server's own line.
from gpuspawner.hub.pages import configure as show_stop_notices  # noqa: E402

show_stop_notices(c)
# --- end of why a server stopped ------------------------------------------------

# Stop the hub at start with one readable line if the catalog is invalid.
check_catalog(c)
