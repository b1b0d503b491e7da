# Settings of gpuspawner-culler, the GPU-aware idle culler (docs/culler.md lists
# every setting). Mount it at /etc/gpuspawner/culler_config.py (the hub config's
# service entry passes --config=$GPUSPAWNER_CULLER_CONFIG, default that path).
c = get_config()  # noqa: F821 (provided by traitlets when it reads this file)

c.GPUCuller.cull_every = 300  # seconds between passes

# Idle timeouts, first matching rule wins; "idle" = no Jupyter activity AND GPUs
# below the threshold. gpu_timeout also stops a server whose GPUs sat idle that
# long while a browser tab kept Jupyter "active".
c.GPUCuller.timeouts = [
    {"min_gpus": 8, "timeout": 30 * 60, "gpu_timeout": 60 * 60},
    {"min_gpus": 2, "timeout": 60 * 60, "gpu_timeout": 2 * 60 * 60},
    {"min_gpus": 1, "timeout": 2 * 60 * 60, "gpu_timeout": 4 * 60 * 60},
    {"gpu_type": "none", "timeout": 8 * 60 * 60},
]
c.GPUCuller.timeout = 8 * 60 * 60  # anything no rule matches
c.GPUCuller.max_age = 7 * 24 * 60 * 60  # backstop: a week, active or not
c.GPUCuller.min_running = 10 * 60
c.GPUCuller.warning_period = 15 * 60  # warn one pass, cull 15 min later if still idle

# GPU utilisation from the DCGM exporter, through Prometheus. PrometheusSettings
# apply to the culler and to the admin page (which is started with this file
# too), so both find the same metrics. Use pod_label = "exported_pod" /
# namespace_label = "exported_namespace" when Prometheus scrapes the exporter
# without honor_labels.
c.PrometheusSettings.prometheus_url = "http://prometheus-server.monitoring.svc"
c.GPUCuller.gpu_busy_threshold = 5.0  # percent

# Pressure: while GPU pods wait for a type, its idle servers go sooner.
c.GPUCuller.pressure_timeout = 15 * 60
c.GPUCuller.pressure_timeouts = {"h100": 10 * 60}
# With Kueue as the cluster's GPU queue (docs/kueue.md): the head of each of these
# ClusterQueues (a notebook or a Job) counts as waiting demand too. Needs
# config/rbac-kueue.yaml and the catalog (catalog_file) for the GPU types.
# c.GPUCuller.kueue_cluster_queues = ["notebooks", "batch"]

# "Keep it": the choices a warning offers (each up to the image's max_keep in the
# catalog, else default_max_keep). max_runtime and budgets come from the catalog.
# c.GPUCuller.keep_choices = [60 * 60, 4 * 60 * 60]
# c.GPUCuller.default_max_keep = 4 * 60 * 60
# c.GPUCuller.keep_overrides_pressure = True   # a kept server is not freed for waiting users

# c.GPUCuller.exempt_users = ["alice"]
# c.GPUCuller.exempt_groups = ["long-jobs"]
# c.GPUCuller.cull_admin_users = False
# c.GPUCuller.dry_run = True                   # report only
