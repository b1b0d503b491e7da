# gpuspawner-culler settings for `gpuspawner-sandbox demo`: the local cluster's
# (culler_config.py) with pressure mode quick enough to watch. The demo starts
# two idle servers holding every A100; when someone asks for A100s they wait in
# the hub's queue, and within a couple of minutes the culler stops the idle
# holder whose GPUs let the request start (docs/culler.md, "Pressure").
import os

c = get_config()  # noqa: F821
load_subconfig(os.path.join(os.path.dirname(__file__), "culler_config.py"))  # noqa: F821

c.GPUCuller.cull_every = 15
c.GPUCuller.min_running = 0
c.GPUCuller.pressure_timeout = int(os.environ.get("GPUSPAWNER_DEMO_PRESSURE_TIMEOUT", "120"))
