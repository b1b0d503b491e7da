# gpuspawner-culler settings for the local GPU cluster demo: the shipped policy
# (config/gpuspawner_culler_config.py). The emulated GPUs' DCGM exporters are scraped
# by the local cluster's Prometheus, whose URL the hub config passes on, so GPU
# activity counts as on a real cluster (docs/culler.md).
c = get_config()  # noqa: F821

c.GPUCuller.cull_every = 60
c.GPUCuller.timeouts = [
    {"min_gpus": 8, "timeout": 30 * 60},
    {"min_gpus": 2, "timeout": 60 * 60},
    {"min_gpus": 1, "timeout": 2 * 60 * 60},
    {"gpu_type": "none", "timeout": 8 * 60 * 60},
]
c.GPUCuller.timeout = 8 * 60 * 60
c.GPUCuller.pressure_timeout = 15 * 60
# The hub's kubeconfig (its service account) lets the culler see GPU pods
# waiting for a type, which turns on pressure mode for that type.
c.GPUCuller.kubernetes = "auto"
