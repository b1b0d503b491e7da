"""The one place for every label, annotation and environment variable name.

Limits, the culler, the inventory, the admin page and the DCGM exporter's pod
matching all find GPU servers by these names, so they are defined once here
and imported everywhere else.
"""

LABEL_PREFIX = "gpuspawner.io"

#: Pod label: the catalog image (profile) key the server was started with.
LABEL_PROFILE = f"{LABEL_PREFIX}/profile"
#: Pod label: the catalog GPU type key, or "none" for CPU-only servers.
LABEL_GPU_TYPE = f"{LABEL_PREFIX}/gpu-type"
#: Pod label: the number of GPU units requested, as a decimal string ("0" for CPU-only).
LABEL_GPUS = f"{LABEL_PREFIX}/gpus"
#: Pod label present (value "true") on every pod GPUSpawner manages.
LABEL_MANAGED = f"{LABEL_PREFIX}/managed"

#: Pod annotation: the Kubernetes resource name the GPUs were requested as.
ANNOTATION_GPU_RESOURCE = f"{LABEL_PREFIX}/gpu-resource"
#: Pod annotation (JSON, gpuspawner.core.stopreasons.StopNotice): why the server is being stopped,
#: written by whoever stops it for a reason other than its user's own action (the culler, the
#: admin GPU page) just before the stop; the hub keeps it in the spawner's state for the user.
ANNOTATION_STOP_REASON = f"{LABEL_PREFIX}/stop-reason"
#: Pod annotation (JSON, gpuspawner.core.stopreasons.CullWarning): the culler's pending warning that
#: it will stop the server, and when; removed when the warning is withdrawn.
ANNOTATION_CULL_WARNING = f"{LABEL_PREFIX}/cull-warning"
#: Pod annotation: the group the server's GPU-hours are charged to (one per server, so group
#: totals never count a server twice), chosen by :func:`gpuspawner.core.usage.charge_group`
#: and written by GPUSpawner when it creates the pod.
ANNOTATION_CHARGE_GROUP = f"{LABEL_PREFIX}/charge-group"
#: Pod annotation: the idle timeout the user chose on the form, in seconds (a decimal string),
#: within the image's catalog bounds; written by GPUSpawner, used by the culler.
ANNOTATION_IDLE_TIMEOUT = f"{LABEL_PREFIX}/idle-timeout"
#: Pod annotation (JSON ``{"until": epoch, "seconds": 3600, "at": epoch}``): the user chose to
#: keep the server until then; written by the culler, which honours it.
ANNOTATION_KEEP_UNTIL = f"{LABEL_PREFIX}/keep-until"
#: KubeSpawner's pod label with a label-safe form of the user name, for selecting a user's pods.
KUBESPAWNER_LABEL_USER = "hub.jupyter.org/username"
#: KubeSpawner's own annotations carry the unescaped user and server names (labels must be
#: escaped), so limits and the culler read these rather than adding copies of their own.
KUBESPAWNER_ANNOTATION_USER = "hub.jupyter.org/username"
KUBESPAWNER_ANNOTATION_SERVER = "hub.jupyter.org/servername"

#: The extended resource most NVIDIA device plugins advertise: the one a GPU type is
#: requested as unless the catalog names another
#: (and the one a pod without ANNOTATION_GPU_RESOURCE is taken to hold).
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"

#: The value of LABEL_GPU_TYPE on CPU-only servers.
NO_GPU_TYPE = "none"

#: Name of the validation init container.
VALIDATION_CONTAINER_NAME = "gpu-check"

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
#: Forced on every container of a CPU-only pod so that no GPU is injected by the runtime.
VISIBLE_DEVICES_NONE = "void"
DRIVER_CAPABILITIES = "compute,utility"

#: Pod annotation: the weight of one GPU of the type in GPU units (e.g. 0.142857 for mig-1g.10gb),
#: kept so that limits still count a pod whose type was later removed from the catalog.
ANNOTATION_GPU_WEIGHT = f"{LABEL_PREFIX}/gpu-weight"
#: Pod annotation: the user's groups that have a shared GPU pool cap, comma-separated.
ANNOTATION_POOL_GROUPS = f"{LABEL_PREFIX}/pool-groups"

#: Image labels on gpuspawner's notebook images (set in images/*/Dockerfile from
#: images/matrix.yaml): the CUDA version the framework was built for, the oldest
#: NVIDIA driver that runs it, and the framework pin ("torch==2.15.0").
IMAGE_LABEL_CUDA = "io.gpuspawner.image.cuda"
IMAGE_LABEL_DRIVER_FLOOR = "io.gpuspawner.image.driver-floor"
IMAGE_LABEL_FRAMEWORK = "io.gpuspawner.image.framework"
