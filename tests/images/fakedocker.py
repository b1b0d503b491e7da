"""A stand-in for docker.DockerClient, recording what the tool asks of the engine.

It answers the way the Engine API does (JSON event streams for build and push,
a status dict from wait) so that the tool's thin engine layer runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import docker


def build_events(image_id: str, fail: str | None = None) -> list[dict[str, Any]]:
    """The shape of a classic-builder build stream (Engine API /build, decoded)."""
    events: list[dict[str, Any]] = [
        {"stream": "Step 1/30 : ARG BASE_IMAGE=ubuntu:24.04\n"},
        {"status": "Pulling from library/ubuntu", "id": "24.04"},
        {
            "status": "Downloading",
            "progressDetail": {"current": 1, "total": 9},
            "progress": "[=>  ]",
            "id": "a1",
        },
        {"status": "Pull complete", "progressDetail": {}, "id": "a1"},
        {"stream": " ---> 1e0f3c6b1a2d\n"},
        {"stream": "\n"},
    ]
    if fail:
        events.append({"errorDetail": {"code": 1, "message": fail}, "error": fail})
        return events
    events += [
        {"aux": {"ID": image_id}},
        {"stream": f"Successfully built {image_id[7:19]}\n"},
    ]
    return events


@dataclass
class FakeContainer:
    exit_code: int
    output: bytes
    removed: bool = False

    def wait(self, timeout=None):
        return {"StatusCode": self.exit_code, "Error": None}

    def logs(self, stdout=True, stderr=True):
        return self.output

    def remove(self, force=False):
        self.removed = True


@dataclass
class FakeEngine:
    runtimes: tuple[str, ...] = ("runc",)
    fail_build: dict[str, str] = field(default_factory=dict)
    test_results: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)
    #: An image's labels, by reference (the images in `present` have none otherwise).
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    builds: list[dict[str, Any]] = field(default_factory=list)
    tags: list[tuple[str, str, str]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    pushes: list[tuple[str, str]] = field(default_factory=list)
    containers: list[FakeContainer] = field(default_factory=list)

    # docker.DockerClient surface ------------------------------------------------
    @property
    def api(self):
        return self

    @property
    def images(self):
        return self

    def info(self):
        return {
            "Runtimes": {name: {"path": name} for name in self.runtimes},
            "DefaultRuntime": "runc",
        }

    # APIClient -------------------------------------------------------------------
    def build(self, **kwargs):
        self.builds.append(kwargs)
        name = kwargs["tag"].rsplit("/", 1)[-1].split(":")[0]
        image_id = f"sha256:{len(self.builds):064x}"
        self.present.add(kwargs["tag"])
        return iter(build_events(image_id, self.fail_build.get(name)))

    def tag(self, image, repository, tag):
        self.tags.append((image, repository, tag))

    def push(self, repository, tag=None, stream=False, decode=False):
        self.pushes.append((repository, tag))
        return iter(
            [
                {"status": f"The push refers to repository [{repository}]"},
                {"status": "Pushing", "progress": "[=> ]", "id": "a1"},
                {"status": "Pushed", "id": "a1"},
                {"aux": {"Tag": tag, "Digest": "sha256:" + "d" * 64, "Size": 1}},
            ]
        )

    # images ------------------------------------------------------------------------
    def get(self, ref):
        if ref.startswith("sha256:") or ref in self.present:
            attrs = {"Size": 12_345_678_901, "Config": {"Labels": self.labels.get(ref)}}
            return type("Image", (), {"attrs": attrs})()
        raise docker.errors.ImageNotFound(f"No such image: {ref}")

    # containers ----------------------------------------------------------------
    def run(self, image, command, detach=False, **kwargs):
        self.runs.append({"image": image, "command": command, **kwargs})
        code, output = self.test_results.get(image, (0, b"RESULT: PASS (4 checks)\n"))
        container = FakeContainer(code, output)
        self.containers.append(container)
        return container


class FakeClient:
    """docker.DockerClient's shape: .api, .images, .containers, .info()."""

    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.api = engine
        self.images = engine
        self.containers = engine

    def info(self):
        return self.engine.info()
