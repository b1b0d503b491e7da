"""The init container command that runs the GPU check inside the notebook's own image."""

from __future__ import annotations

import functools
from importlib import resources

#: The interpreter the check runs with; every JupyterHub notebook image has it.
DEFAULT_PYTHON = "python3"


@functools.lru_cache(maxsize=1)
def check_source() -> str:
    """The source of ``gpucheck.py``, read once: it is passed to ``python3 -c``.

    Shipping the source in the command (instead of installing gpuspawner in every image)
    is what lets the check run in any image an admin adds.
    """
    return resources.files(__package__).joinpath("gpucheck.py").read_text(encoding="utf-8")


def check_command(
    expected: int,
    resource: str,
    cuda_version: str | None,
    *,
    python: str = DEFAULT_PYTHON,
    termination_log: str | None = None,
    timeout: float | None = None,
) -> list[str]:
    """The init container command: ``[python3, -c, <gpucheck source>, --expect, N, ...]``.

    ``expected`` is the number of units of ``resource`` (``nvidia.com/gpu``,
    ``nvidia.com/mig-1g.10gb``, ...) the pod requests; ``cuda_version`` ("12.4") enables the
    driver check, None skips it. ``timeout`` is the seconds the whole check may take (None: the
    check's default). ``termination_log`` only needs setting when the container's
    ``terminationMessagePath`` is not the default ``/dev/termination-log``.
    """
    if expected < 1:
        raise ValueError(f"expected must be at least 1, got {expected}")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a number of seconds above 0, got {timeout}")
    command = [python, "-c", check_source(), "--expect", str(expected), "--resource", resource]
    if cuda_version:
        command += ["--cuda", cuda_version]
    if timeout is not None:
        # repr, not :g, so that no precision is lost (0.1234567 stays 0.1234567)
        command += ["--timeout", repr(float(timeout))]
    if termination_log:
        command += ["--termination-log", termination_log]
    return command
