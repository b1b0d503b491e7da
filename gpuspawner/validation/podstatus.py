"""Read the GPU check's outcome out of a pod, as the spawner's pod watcher sees it.

Pure functions over a Pod as a raw JSON dict (camelCase keys, exactly as the Kubernetes API
returns it and as KubeSpawner's reflector stores it). No Kubernetes client is imported. The one
input that is not in the pod is the time, for a check that runs past its deadline: the
functions that need it take ``now`` and read the clock only when it is not given.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..core.labels import VALIDATION_CONTAINER_NAME
from ..core.refusals import shown
from ..core.serverpod import ServerPod, is_gpu_resource, parse_timestamp
from ..core.stopreasons import NOT_STARTABLE_KIND
from .gpucheck import EXIT_CODES, EXIT_NVIDIA_SMI_FAILED

_NOT_STARTABLE = 127
_KILLED = 137

#: Every exit code of the GPU check container: the check's own (``gpucheck.EXIT_CODES``) and
#: the container runtime's. Code -> (kind, reason): the kind is the bounded label the hub's
#: metrics count failures by, the reason what the user sees when the check wrote no message.
CHECK_EXIT_CODES: dict[int, tuple[str, str]] = {
    **EXIT_CODES,
    126: (
        NOT_STARTABLE_KIND,
        "The GPU check could not start: python3 in the notebook image is not executable; "
        "ask an admin to check the image.",
    ),
    _NOT_STARTABLE: (
        NOT_STARTABLE_KIND,
        "The GPU check could not start because the notebook image has no python3; ask an "
        "admin to check the image or to override the GPU check command.",
    ),
    _KILLED: (
        "check-killed",
        "The GPU check was killed (out of memory or stopped) before it finished; ask an admin "
        "to check the gpu-check container's resources.",
    ),
}
#: The kind of an exit code the table does not know.
OTHER_KIND = "other"
#: Every kind a failed check can be counted as, for metrics that pre-create their labels.
CHECK_FAILURE_KINDS: tuple[str, ...] = (
    *sorted({kind for kind, _ in CHECK_EXIT_CODES.values()}),
    OTHER_KIND,
)

# What the container runtime says when the command cannot be started at all; the raw text is
# long and technical, so it is replaced by the 127 reason above.
_NOT_FOUND_MARKERS = ("executable file not found", "no such file or directory")
# ``terminated.reason`` when the runtime could not start the command (containerd, Docker).
_START_FAILURES = ("StartError", "ContainerCannotRun")


def _container_status(pod: dict[str, Any], container_name: str) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") == container_name:
            return status
    return None


def _failed_termination(status: dict[str, Any]) -> dict[str, Any] | None:
    """The terminated state of a failed run: the current one, else the previous attempt's.

    Under ``restartPolicy: OnFailure``/``Always`` a failed init container is restarted, so
    its failure sits in ``lastState`` while it waits in CrashLoopBackOff or runs again.
    """
    for key in ("state", "lastState"):
        terminated = (status.get(key) or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return terminated
    return None


def _last_line(message: str | None) -> str | None:
    if not message:
        return None
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _separate_check_image(pod: dict[str, Any], container_name: str) -> str | None:
    """The check container's image when it is not the notebook's own (``validation_image``).

    None when the check runs in the notebook's image, or either image is unknown: then the
    exit code's reason, which speaks of the notebook image, is right.
    """
    spec = pod.get("spec") or {}
    check = next(
        (c for c in spec.get("initContainers") or [] if c.get("name") == container_name), None
    )
    containers = spec.get("containers") or []
    image = (check or {}).get("image")
    notebook = (containers[0] if containers else {}).get("image")
    if not isinstance(image, str) or not image or not isinstance(notebook, str):
        return None
    return image if image != notebook else None


def _not_startable_reason(pod: dict[str, Any], container_name: str, exit_code: int) -> str:
    """Why the check could not start (no python3, or not executable), naming a separate image.

    An admin who set ``validation_image`` to an image without python3 (NVIDIA's
    ``cuda:*-base`` images have none) learns which image it was and what to set instead.
    """
    image = _separate_check_image(pod, container_name)
    if image is None:
        return CHECK_EXIT_CODES[exit_code][1]
    problem = "python3 is not executable in" if exit_code == 126 else "there is no python3 in"
    return (
        f"The GPU check could not start because {problem} its image {shown(image, 200)}; ask "
        "an admin to set validation_image to an image with python3 (docs/validation.md)."
    )


def reason_for_exit_code(exit_code: int) -> str:
    """A user-facing reason for a check that exited ``exit_code`` without leaving a message."""
    if exit_code in CHECK_EXIT_CODES:
        return CHECK_EXIT_CODES[exit_code][1]
    return (
        f"The GPU check failed with exit code {exit_code}; ask an admin to look at the "
        "gpu-check container's log."
    )


def kind_of_exit_code(exit_code: int) -> str:
    """The bounded kind of a check failure (``gpu-count``, ``check-killed``, … or ``other``)."""
    return CHECK_EXIT_CODES.get(exit_code, (OTHER_KIND, ""))[0]


#: How long past its own ``--timeout`` a GPU check may still be running before the spawner
#: fails the spawn without it. The check ends within seconds of its deadline
#: (``gpucheck.KILL_GRACE`` + ``WATCHDOG_GRACE``), but its container cannot: when a pid
#: namespace's init exits, the kernel holds it until every other process in it has exited, and
#: an nvidia-smi stuck in the GPU driver never does; the kubelet reads the termination message
#: only once the container has stopped. The margin also absorbs clock skew between the node
#: (``startedAt``) and the hub.
OVERDUE_GRACE = 15.0


def _option(argv: list[Any], name: str) -> str | None:
    """The value of ``name`` (``--timeout 30`` or ``--timeout=30``) in ``argv``; the last wins."""
    value = None
    for position, arg in enumerate(argv):
        if arg == name and position + 1 < len(argv):
            value = argv[position + 1]
        elif isinstance(arg, str) and arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value if isinstance(value, str) else None


def check_timeout(
    pod: dict[str, Any], container_name: str = VALIDATION_CONTAINER_NAME
) -> float | None:
    """The ``--timeout`` the GPU check container was started with, from the pod spec.

    None when its command and args name none (a replacement check, or one from before the
    deadline), so nobody can say when it is overdue.
    """
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") != container_name:
            continue
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        try:
            seconds = float(_option(argv, "--timeout") or "nan")
        except ValueError:
            return None
        return seconds if 0 < seconds < math.inf else None
    return None


def _seconds(seconds: float) -> str:
    return f"{seconds:g} second" + ("" if seconds == 1 else "s")


def _limit(seconds: float) -> str:
    """``30`` -> ``30-second limit``."""
    return f"{seconds:g}-second limit"


def check_overdue(
    pod: dict[str, Any], now: float, container_name: str = VALIDATION_CONTAINER_NAME
) -> str | None:
    """The reason for a GPU check still running ``OVERDUE_GRACE`` seconds past its deadline.

    None while it is within its time, when it is not running, or when its deadline or start
    time is unknown.
    """
    status = _container_status(pod, container_name)
    running = ((status or {}).get("state") or {}).get("running")
    timeout = check_timeout(pod, container_name)
    started = parse_timestamp((running or {}).get("startedAt"))
    if timeout is None or started is None or now - started <= timeout + OVERDUE_GRACE:
        return None
    return (
        f"The GPU check was still running {_seconds(OVERDUE_GRACE)} after its {_limit(timeout)}, "
        "so nvidia-smi is stuck in the GPU driver and cannot even be stopped; ask an admin to "
        "check the node, which may need a reboot."
    )


def check_failure_kind(
    pod: dict[str, Any],
    container_name: str = VALIDATION_CONTAINER_NAME,
    now: float | None = None,
) -> str | None:
    """The kind of the GPU check's failure in ``pod``, or None while it runs or after it passed.

    A command the runtime could not start counts as ``check-not-startable`` whatever its code;
    a check overdue (``check_overdue``) as nvidia-smi failing.
    """
    status = _container_status(pod, container_name)
    terminated = _failed_termination(status) if status is not None else None
    if terminated is None:
        if check_overdue(pod, time.time() if now is None else now, container_name):
            return EXIT_CODES[EXIT_NVIDIA_SMI_FAILED][0]
        return None
    if terminated.get("reason") in _START_FAILURES:
        return CHECK_EXIT_CODES[_NOT_STARTABLE][0]
    return kind_of_exit_code(int(terminated.get("exitCode", 1)))


def check_failure(
    pod: dict[str, Any],
    container_name: str = VALIDATION_CONTAINER_NAME,
    now: float | None = None,
) -> str | None:
    """The user-facing reason the GPU check failed, or None while it runs or after it passed.

    Prefers the last non-empty line of the container's termination message (the check writes
    its one-line reason there), else derives a reason from the exit code. A check still running
    well past its deadline has failed too (``check_overdue``; ``now`` defaults to the clock).
    """
    status = _container_status(pod, container_name)
    if status is None:
        return None
    terminated = _failed_termination(status)
    if terminated is None:
        return check_overdue(pod, time.time() if now is None else now, container_name)
    exit_code = int(terminated.get("exitCode", 1))
    message = _last_line(terminated.get("message"))
    if terminated.get("reason") in _START_FAILURES:
        # The runtime's own message, not the check's: the command never ran.
        if message and any(marker in message.lower() for marker in _NOT_FOUND_MARKERS):
            return _not_startable_reason(pod, container_name, _NOT_STARTABLE)
        return (
            "The GPU check container could not start; ask an admin to look at the pod's "
            f"events. The container runtime said: {message or terminated.get('reason')}"
        )
    if message:
        return message
    if exit_code in (126, _NOT_STARTABLE):
        return _not_startable_reason(pod, container_name, exit_code)
    return reason_for_exit_code(exit_code)


def _requested_units(pod: dict[str, Any], container_name: str) -> tuple[int | None, str | None]:
    """(count, resource name) of GPUs the check container requests, from the pod spec."""
    server = ServerPod.from_pod(pod)
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") != container_name:
            continue
        limits = (container.get("resources") or {}).get("limits") or {}
        names = [server.gpu_resource] if server.gpu_resource in limits else list(limits)
        for name in names:
            if not is_gpu_resource(name, (server.gpu_resource,)):
                continue
            try:
                return int(limits[name]), name
            except (TypeError, ValueError):
                continue
    return server.gpus or None, server.gpu_resource


def describe_waiting(
    pod: dict[str, Any], container_name: str = VALIDATION_CONTAINER_NAME
) -> str | None:
    """A plain-words progress message while the GPU check is about to run or running.

    None when there is no check container, once it has passed, or when it failed (then
    ``check_failure`` has the reason).
    """
    status = _container_status(pod, container_name)
    if status is None or _failed_termination(status) is not None:
        return None
    state = status.get("state") or {}
    if "terminated" in state:
        return None
    count, resource = _requested_units(pod, container_name)
    name = (resource or "").rsplit("/", 1)[-1]
    if name.startswith("mig-"):
        what = "the allocated MIG device" if count == 1 else f"the {count} allocated MIG devices"
        what += f" ({name[len('mig-') :]})"
    elif count is None:
        what = "the allocated GPUs"
    else:
        what = "the allocated GPU" if count == 1 else f"the {count} allocated GPUs"
    if "running" in state:
        return f"Checking {what} with nvidia-smi…"
    return f"Preparing to check {what} with nvidia-smi…"
