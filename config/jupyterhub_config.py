# JupyterHub configuration for GPUSpawner, for a hub running inside the cluster
# with its own service account (see rbac.yaml). Every setting here is a plain
# KubeSpawner/JupyterHub setting except the c.GPUSpawner.* lines and, at the end,
# gpuspawner.setup(c, ...), which adds gpuspawner's services and their roles.
#
#   jupyterhub -f /etc/jupyterhub/jupyterhub_config.py
#
# The same settings through zero-to-jupyterhub's Helm chart: z2jh-values.yaml.
import os

import gpuspawner

c = get_config()  # noqa: F821 (provided by JupyterHub when it reads this file)

# --- the spawner ----------------------------------------------------------
# "gpu" is GPUSpawner's entry point name (jupyterhub.spawners).
c.JupyterHub.spawner_class = "gpu"

# The catalog: images, GPU types, allowed counts and per-user limits. The file
# is re-read when it changes (mount it from a ConfigMap), so images and limits
# change without a hub restart. config/catalog.yaml is a complete example.
c.GPUSpawner.catalog_file = os.environ.get("GPUSPAWNER_CATALOG", "/etc/gpuspawner/catalog.yaml")

# The nvidia-smi check in every GPU pod (on by default). It runs in the
# notebook's own image; set validation_image to run it from another one, which
# must have python3 on its PATH (NVIDIA's cuda:*-base images have none) and
# must not set NVIDIA_VISIBLE_DEVICES: NVIDIA's runtime mounts nvidia-smi into
# it. `gpuspawner-images build validation` builds this one (docs/validation.md).
c.GPUSpawner.validation_enabled = True
# c.GPUSpawner.validation_image = "registry.example.org/gpuspawner/validation:trixie-py3.13"

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

# --- gpuspawner's services, their roles, and its pages ------------------------
# One call, after every setting above (the services are handed the catalog, the
# pod placement, the namespace and the admin users as they stand here):
#
# - it stops the hub at start with one readable line if the catalog is invalid;
# - the home page says why a server stopped, and when the culler will stop one
#   (docs/culler.md, "Why it stopped");
# - gpuspawner-culler gives idle GPUs back (docs/culler.md): it stops servers idle
#   by both Jupyter activity and GPU utilisation (from Prometheus), with timeouts
#   per profile / GPU type / GPU count, and culls harder while GPU requests wait.
#   Its settings: culler_config.py next to the catalog
#   (config/gpuspawner_culler_config.py is a complete example). Every user may ask
#   it about their own servers (JupyterLab's cull warning, through the proxy:
#   notebook pods reach it on the hub's Service, give it the proxy's port 8000, or
#   set GPUSPAWNER_CULLER_URL);
# - gpuspawner-admin, the GPU page for admins at /services/gpuspawner-admin/
#   (docs/admin.md): the hub's admin users and the group gpu-admins see it; it
#   reads the culler's settings file for the same Prometheus names;
# - gpuspawner, the spawn form's live GPU figures and the stop notices, for every
#   user (docs/userservice.md).
#
# Each listens on the hub's loopback (ports 10101, 10102, 10103) and is reached
# through the proxy at /services/<name>/. Pods and nodes are read with the hub
# pod's service account (rbac.yaml), whose address and namespace the hub hands on.
# Their scopes (least rights, never admin) are in gpuspawner/culler/hubconfig.py,
# gpuspawner/admin/hubconfig.py and gpuspawner/userservice/hubconfig.py.
CULLER_CONFIG = os.environ.get("GPUSPAWNER_CULLER_CONFIG", "/etc/gpuspawner/culler_config.py")
gpuspawner.setup(
    c,
    culler_url="http://127.0.0.1:10101",
    admin_url="http://127.0.0.1:10102",
    user_service_url="http://127.0.0.1:10103",
    culler_args=[f"--config={CULLER_CONFIG}"],
    admin_args=[f"--config={CULLER_CONFIG}"],
    warning_url=os.environ.get(
        "GPUSPAWNER_CULLER_URL",
        f"http://{c.JupyterHub.hub_connect_ip}:8000/services/gpuspawner-culler/",
    ),
)
