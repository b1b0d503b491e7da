"""The thin layer between `gpuspawner-images` and a Docker engine (docker SDK).

Everything that decides *what* to do lives in plan.py; this module only talks to
the engine and turns its answers (streams of JSON events, exceptions) into
results and one-sentence errors.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .plan import BuildStep, TestRun

Emit = Callable[[str], None]


class EngineUnavailable(Exception):
    """No Docker engine answered; str() is the sentence to show the user."""


class EngineError(Exception):
    """The engine answered, but a build, run or push failed; str() says which and why."""


@dataclass(frozen=True)
class BuildResult:
    step: BuildStep
    image_id: str
    size_bytes: int
    seconds: float


@dataclass(frozen=True)
class TestResult:
    run: TestRun
    exit_code: int
    output: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def describe_host(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    return env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def connect(timeout: int = 10) -> Any:
    """A docker.DockerClient that has answered a ping, or EngineUnavailable."""
    try:
        import docker
    except ImportError:
        raise EngineUnavailable(
            "The docker Python SDK is not installed: pip install 'gpuspawner[images]'."
        ) from None
    where = describe_host()
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception:
        # Whatever the transport says (missing socket, refused, TLS), the user's
        # problem is the same one, and a traceback would hide it.
        raise EngineUnavailable(
            f"No Docker engine is reachable at {where}, so gpuspawner-images cannot build, "
            "test or push images (start the engine or set DOCKER_HOST; list and catalog "
            "work without one)."
        ) from None
    return client


def has_nvidia_runtime(info: dict[str, Any]) -> bool:
    """Whether `docker info` shows the NVIDIA runtime, i.e. `--gpus` can work."""
    runtimes = info.get("Runtimes") or {}
    return "nvidia" in runtimes or info.get("DefaultRuntime") == "nvidia"


def follow_build(events: Iterable[dict[str, Any]], emit: Emit) -> str:
    """Stream build output to `emit`; return the image ID or raise EngineError."""
    image_id = ""
    for event in events:
        if "error" in event:
            detail = (event.get("errorDetail") or {}).get("message") or event["error"]
            raise EngineError(str(detail).strip())
        if "stream" in event:
            text = str(event["stream"]).rstrip("\n")
            if text.strip():
                emit(text)
        elif "status" in event:
            status = str(event["status"])
            progress = event.get("progress")
            # Layer download progress repeats many times a second: show only its changes of state.
            if not progress:
                emit(f"{event.get('id', '')} {status}".strip())
        aux = event.get("aux")
        if isinstance(aux, dict) and aux.get("ID"):
            image_id = aux["ID"]
    if not image_id:
        raise EngineError("the engine finished the build without reporting an image ID")
    return image_id


def follow_push(events: Iterable[dict[str, Any]], emit: Emit) -> str:
    """Stream push output; return the pushed digest ('' if not reported) or raise."""
    digest = ""
    for event in events:
        if "error" in event:
            detail = (event.get("errorDetail") or {}).get("message") or event["error"]
            raise EngineError(str(detail).strip())
        if "status" in event and not event.get("progress"):
            emit(f"{event.get('id', '')} {event['status']}".strip())
        aux = event.get("aux")
        if isinstance(aux, dict) and aux.get("Digest"):
            digest = aux["Digest"]
    return digest


def build(
    client: Any,
    step: BuildStep,
    emit: Emit,
    *,
    nocache: bool = False,
    pull: bool = False,
    network_mode: str | None = None,
) -> BuildResult:
    start = time.monotonic()
    refs = step.refs
    kwargs: dict[str, Any] = {}
    if step.target:
        kwargs["target"] = step.target
    if network_mode:
        kwargs["network_mode"] = network_mode
    with build_context(step) as context:
        events = client.api.build(
            fileobj=context,
            custom_context=True,
            dockerfile=step.dockerfile,
            tag=refs[0],
            buildargs=step.buildargs,
            labels=step.labels,
            rm=True,
            forcerm=True,
            nocache=nocache,
            pull=pull,
            decode=True,
            **kwargs,
        )
        image_id = follow_build(events, emit)
    for ref in refs[1:]:
        repo, tag = ref.rsplit(":", 1)
        client.api.tag(image_id, repo, tag)
    size = int(client.images.get(image_id).attrs.get("Size", 0))
    return BuildResult(step, image_id, size, time.monotonic() - start)


@contextmanager
def build_context(step: BuildStep) -> Iterator[IO[bytes]]:
    """The build context as a tar file: the context directory less .dockerignore's
    exclusions (as `docker build` sends it), plus the step's extra files."""
    from docker.utils.build import exclude_paths

    root = Path(step.context)
    ignore = root / ".dockerignore"
    patterns = []
    if ignore.is_file():
        patterns = [
            line.strip()
            for line in ignore.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
    with tempfile.TemporaryFile() as f:
        with tarfile.open(fileobj=f, mode="w") as tar:
            for rel in sorted(exclude_paths(str(root), patterns, dockerfile=step.dockerfile)):
                if rel not in step.extra_files:
                    tar.add(root / rel, arcname=rel, recursive=False)
            for rel, local in step.extra_files.items():
                try:
                    tar.add(local, arcname=rel, recursive=False)
                except OSError as e:
                    raise EngineError(
                        f"cannot read {local} for {step.name}'s build context: {e.strerror}"
                    ) from None
        f.seek(0)
        yield f


def image_exists(client: Any, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def image_labels(client: Any, ref: str) -> dict[str, str] | None:
    """The image's labels ({} when it has none), or None when it is not built."""
    import docker

    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    return dict((image.attrs.get("Config") or {}).get("Labels") or {})


def run_python(client: Any, image: str, args: list[str], timeout: int = 300) -> tuple[int, str]:
    """``python ARGS`` in a throwaway container of `image`: (exit code, its stdout).

    The entry point is replaced (start.sh's messages and hooks have no part in a
    probe), the network is off and the container is removed whatever happens.
    """
    import docker
    import requests

    try:
        container = client.containers.run(
            image, args, entrypoint=["python"], network_mode="none", detach=True
        )
    except docker.errors.ImageNotFound:
        raise EngineError(f"{image} is not built yet (run gpuspawner-images build)") from None
    except docker.errors.APIError as e:
        raise EngineError(f"cannot start {image}: {e.explanation or e}") from None
    try:
        try:
            result = container.wait(timeout=timeout)
        except requests.exceptions.RequestException:
            raise EngineError(f"python in {image} did not finish within {timeout}s") from None
        output = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        return int(result.get("StatusCode", 1)), output
    finally:
        container.remove(force=True)


def wait_healthy(container: Any, timeout: float) -> tuple[bool, str]:
    """Poll a started container's health until it is decided: (healthy, last status)."""
    deadline = time.monotonic() + timeout
    status = "starting"
    while time.monotonic() < deadline:
        container.reload()
        state = container.attrs.get("State") or {}
        if not state.get("Running"):
            return False, f"exited with {state.get('ExitCode')}"
        health = state.get("Health")
        if health is None:
            return False, "the image has no HEALTHCHECK"
        status = health.get("Status", "starting")
        if status != "starting":
            return status == "healthy", status
        time.sleep(2)
    return False, f"still {status} after {timeout:.0f}s"


def run_test(client: Any, run: TestRun, timeout: int = 900) -> TestResult:
    import docker

    kwargs: dict[str, Any] = {"environment": run.environment}
    if run.device_requests:
        kwargs["device_requests"] = [
            docker.types.DeviceRequest(
                driver=r.get("Driver", ""),
                count=r.get("Count", -1),
                capabilities=r.get("Capabilities", [["gpu"]]),
            )
            for r in run.device_requests
        ]
    if run.mode == "serve":
        # No network: the check runs inside the container, on its loopback.
        kwargs["network_mode"] = "none"
    try:
        container = client.containers.run(run.image, run.command, detach=True, **kwargs)
    except docker.errors.ImageNotFound:
        raise EngineError(f"{run.image} is not built yet (run gpuspawner-images build)") from None
    except docker.errors.APIError as e:
        raise EngineError(f"cannot start {run.image}: {e.explanation or e}") from None
    try:
        if run.mode == "serve":
            healthy, status = wait_healthy(container, timeout)
            output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            return TestResult(run, 0 if healthy else 1, f"{output}\nhealth: {status}")
        result = container.wait(timeout=timeout)
        output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        return TestResult(run, int(result.get("StatusCode", 1)), output)
    finally:
        container.remove(force=True)


def push(client: Any, ref: str, emit: Emit) -> str:
    repo, tag = ref.rsplit(":", 1)
    return follow_push(client.api.push(repo, tag=tag, stream=True, decode=True), emit)
