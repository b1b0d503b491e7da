"""The nvidia-smi check that runs in each GPU pod's init container, and its pod watcher logic.

``gpucheck`` is the standalone script (stdlib only, shipped into the pod as source);
``command`` builds the init container's command; ``podstatus`` reads a failed check back
out of the pod's status.
"""
