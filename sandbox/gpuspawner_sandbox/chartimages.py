"""zero-to-jupyterhub's own images, built here for a cluster that reaches no registry.

The chart (4.4.0, :mod:`gpuspawner_sandbox.helm`) runs, besides the hub, the
configurable-http-proxy, network-tools, image-awaiter, kube-scheduler and pause
images. ``images/matrix.yaml``'s ``z2jh:`` section names each as
``gpuspawner.invalid/z2jh/<name>:<tag>``, which the sandbox asks the image tool for
(``gpuspawner-images facts --json``, :mod:`.imagefacts`), and
``config/sandbox/z2jh-local-values.yaml`` points the chart at them. They are built
with the notebook images' machinery, on the same private Docker engine
(:class:`gpuspawner_sandbox.dockerd.PrivateEngine`):

1. the programs they copy, built on the host and cached: z2jh's image-awaiter
   from its own Go source at the chart's tag (static, go-retryablehttp from the Go
   module proxy), and the control plane's ``k8s`` binary (:mod:`.build`), whose
   ``k8s kube-scheduler`` the kube-scheduler image runs;
2. ``gpuspawner-images build --reproducible --binary NAME=PATH …`` of ``images/z2jh/*/Dockerfile``
   (the Debian base must exist: ``gpuspawner-images base``); Docker's layer cache
   makes a rebuild of unchanged sources a matter of seconds;
3. the chart's pause image: the real nodes' own (:func:`.nodes.pause_spec`), under
   the chart's name, loaded with ``docker load``, skipped when the engine has it.

``python -m gpuspawner_sandbox.chartimages`` does it all on its own engine.

For real nodes, :func:`ensure_deploy_images` builds these and the hub image
(``gpuspawner-images build k8s-hub hub``, the tool's ``hub.offline_build``: z2jh's
k8s-hub rebuilt and tagged ``quay.io/jupyterhub/k8s-hub:4.4.0`` in the engine, then
the hub image FROM it; its reference, tagged with the package version, is the tool's
answer too, and the values files must name it) on the notebook images'
engine and saves them all to one archive, ``<cache>/z2jh-<key>.tar``, keyed by the
images' IDs: passed as ``RealNodes(images=[...])`` beside the notebook archive, the
image store imports it once (:mod:`.imageseed`). A warm run rebuilds nothing and saves
nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from . import build, helm, nodebuild, nodes, ociimage
from .dockerd import HarnessError, PrivateEngine
from .imagefacts import ChartImage, ImageFactsError, image_facts
from .notebookimage import NotebookImageError, run_image_tool, save_archive, tool_build

Emit = Callable[[str], None]

#: :func:`host_binaries`' key for the directory of the pause program (the chart's pause
#: image is the one the image tool names without a Dockerfile).
PAUSE = "pause"

#: z2jh's image-awaiter, from its own go.mod at the chart's tag (standard library and
#: go-retryablehttp), static as upstream's Dockerfile builds it.
IMAGE_AWAITER = nodebuild.LocalProgram(
    name="image-awaiter",
    module_dir=helm.Z2JH_SOURCE / "images" / "image-awaiter",
    describe="Building z2jh's image-awaiter (its own Go module; seconds)…",
    sources=("go.mod", "go.sum", "main.go", "daemonset.go"),
)


#: The values files that name the hub image: the admin's (its name), the local one (its tag,
#: which must be the image tool's: Helm reads the file as it is).
HUB_VALUES = (
    build.REPO_ROOT / "config" / "z2jh-values.yaml",
    build.REPO_ROOT / "config" / "sandbox" / "z2jh-local-values.yaml",
)


class ChartImageError(Exception):
    """The chart's images could not be built; the message says why and what to do."""


def load_chart_images(repo: Path = build.REPO_ROOT) -> list[ChartImage]:
    """The chart's images as the image tool names them (the pause image last)."""
    try:
        images = list(image_facts(repo).chart_images)
    except ImageFactsError as e:
        raise ChartImageError(str(e)) from None
    if not images or [i for i in images if i.dockerfile is None] != images[-1:]:
        raise ChartImageError(
            "The image tool names no chart images, or not one pause image last (no Dockerfile)."
        )
    return images


def pause_image(images: list[ChartImage]) -> ChartImage:
    """The chart's pause image: the one the image tool builds from no Dockerfile."""
    (pause,) = [i for i in images if i.dockerfile is None]
    return pause


def tool_build_args(images: list[ChartImage], binaries: Mapping[str, Path]) -> list[str]:
    """``gpuspawner-images build`` of every image with a Dockerfile, with its programs."""
    built = [i for i in images if i.dockerfile is not None]
    wanted = sorted({b for i in built for b in i.binaries})
    missing = [b for b in wanted if b not in binaries]
    if missing:
        raise ChartImageError(f"No host-built program for {', '.join(missing)}.")
    return tool_build(
        *(i.name for i in built), *(f"--binary={name}={binaries[name]}" for name in wanted)
    )


def hub_ref(values: list[Mapping[str, Any]]) -> str:
    """The hub image the chart runs with these values files (later files win, as Helm's ``-f``)."""
    image: dict[str, Any] = {}
    for doc in values:
        image.update(((doc.get("hub") or {}).get("image")) or {})
    if not image.get("name") or not image.get("tag"):
        raise ChartImageError("The values files name no hub image (hub.image.name and .tag).")
    return f"{image['name']}:{image['tag']}"


def check_hub_values(built: str, values: list[Mapping[str, Any]]) -> None:
    """Refuse values files whose hub image is not ``built``, the one the image tool makes:
    the chart would run an image no node has (``ErrImageNeverPull``)."""
    named = hub_ref(values)
    if named != built:
        raise ChartImageError(
            f"The values files ({', '.join(str(p) for p in HUB_VALUES)}) name the hub image "
            f"{named}, but `gpuspawner-images build hub` makes {built} (`gpuspawner-images "
            f"facts`): set hub.image.tag in {HUB_VALUES[-1]} to {built.rsplit(':', 1)[1]!r}."
        )


def deploy_archive_name(ids: Mapping[str, str]) -> str:
    """The archive's name, keyed by every reference and the image ID behind it."""
    digest = hashlib.sha256("".join(f"{r}={i}\n" for r, i in sorted(ids.items())).encode())
    return f"z2jh-{digest.hexdigest()[:16]}.tar"


@dataclass(frozen=True)
class DeployImages:
    """The hub and chart images saved for real nodes: one archive, and the references it holds."""

    archive: Path
    refs: tuple[str, ...]


# -- I/O -----------------------------------------------------------------------------


def host_binaries(cache: Path | None = None, *, out: TextIO | None = None) -> dict[str, Path]:
    """Build (or find cached) the programs the images copy, and the pause program's directory."""
    out = out if out is not None else sys.stderr
    if not (IMAGE_AWAITER.module_dir / "go.mod").is_file():
        raise ChartImageError(
            f"z2jh's image-awaiter source is missing at {IMAGE_AWAITER.module_dir} "
            "(a copy of shared/ beside the clone)."
        )
    return {
        IMAGE_AWAITER.name: nodebuild.build_local(IMAGE_AWAITER, cache, out=out),
        "k8s": build.build(cache=cache, out=out),
        PAUSE: nodebuild.build_image_programs(cache=cache, out=out),
    }


def _load_pause(engine: PrivateEngine, ref: str, programs: Path, emit: Emit) -> str:
    spec = nodes.pause_spec(ref, programs, nodebuild.go_arch())
    wanted = ociimage.image_id(spec)
    client = engine.client()
    try:
        have = {
            t: image["Id"] for image in client.api.images() for t in image.get("RepoTags") or []
        }
        if have.get(ref) == wanted:
            emit(f"    {ref} is {wanted[:19]}… already (cached)")
            return wanted
        client.images.load(ociimage.docker_archive(spec))
    finally:
        client.close()
    emit(f"    loaded {ref} ({wanted[:19]}…)")
    return wanted


def build_chart_images(
    engine: PrivateEngine,
    repo: Path = build.REPO_ROOT,
    emit: Emit = print,
    *,
    cache: Path | None = None,
    log_path: Path | None = None,
    build_out: TextIO | None = None,
) -> list[ChartImage]:
    """Build (or find cached) every image of the chart on a started engine.

    Raises :class:`ChartImageError`, or :class:`.build.BuildError` for the host's programs
    (:class:`.build.GoMissing` where Go is missing).
    """
    started = time.monotonic()
    images = load_chart_images(repo)
    log_path = log_path or build.cache_dir() / "chart-images-build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    emit("Chart images [1/3]: the programs they copy (image-awaiter, k8s, pause; cached)")
    # Go's progress (minutes for a cold `k8s`) to build_out; build.BuildError as it is.
    binaries = host_binaries(cache, out=build_out if build_out is not None else sys.stderr)
    args = tool_build_args(images, binaries)
    emit(
        f"Chart images [2/3]: {', '.join(i.name for i in images if i.dockerfile is not None)} "
        f"({time.monotonic() - started:.0f}s so far)"
    )
    try:
        with log_path.open("w") as log:
            run_image_tool(repo, engine, args, log, emit)
    except NotebookImageError as e:
        raise ChartImageError(str(e)) from None
    pause = pause_image(images)
    emit(f"Chart images [3/3]: {pause.ref} ({time.monotonic() - started:.0f}s so far)")
    _load_pause(engine, pause.ref, binaries[PAUSE], emit)
    emit(f"Chart images ready in {time.monotonic() - started:.0f}s")
    return images


def _image_ids(engine: PrivateEngine, refs: list[str]) -> dict[str, str]:
    client = engine.client()
    try:
        have = {
            t: image["Id"] for image in client.api.images() for t in image.get("RepoTags") or []
        }
    finally:
        client.close()
    missing = [r for r in refs if r not in have]
    if missing:
        raise ChartImageError(f"The build made no {', '.join(missing)}; see the build log.")
    return {r: have[r] for r in refs}


def ensure_deploy_images(
    cache_dir: Path,
    repo: Path = build.REPO_ROOT,
    emit: Emit = print,
    *,
    build_out: TextIO | None = None,
) -> DeployImages:
    """Build (or find cached) the hub image and the chart's images; save them to one archive.

    The engine is the notebook images' (``<repo>/.cache/images/engine``): the Debian
    base and its layers serve both. Raises :class:`ChartImageError` (or
    :class:`.build.BuildError` for the host's programs).
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        facts = image_facts(repo)
        hub = facts.hub_ref
        values = [yaml.safe_load(p.read_text()) or {} for p in HUB_VALUES]
    except ImageFactsError as e:
        raise ChartImageError(str(e)) from None
    except (OSError, yaml.YAMLError) as e:
        raise ChartImageError(f"The values files cannot be read: {e}") from None
    check_hub_values(hub, values)
    state = Path(tempfile.mkdtemp(prefix="gs-dockerd-"))  # a short socket path
    engine = PrivateEngine(state=state, data_root=build.image_cache_dir(repo) / "engine")
    log_path = cache_dir / "z2jh-build.log"
    try:
        emit("Hub and chart images: starting a private Docker engine (dockerd)")
        engine.start()
        with log_path.open("w") as log:
            run_image_tool(repo, engine, ["base"], log, emit)
            # No registry: k8s-hub is rebuilt under quay.io's reference first, and the
            # hub image's FROM finds it in this engine.
            emit(
                f"Hub image: {hub} (images/hub/Dockerfile FROM k8s-hub rebuilt offline; "
                "the first build takes minutes)"
            )
            run_image_tool(repo, engine, tool_build(*facts.hub_offline_build), log, emit)
        images = build_chart_images(
            engine, repo, emit, log_path=cache_dir / "chart-images-build.log", build_out=build_out
        )
        refs = [hub, *(i.ref for i in images)]
        archive = cache_dir / deploy_archive_name(_image_ids(engine, refs))
        if archive.is_file():
            emit(f"Hub and chart images: {archive.name} holds them already (cached)")
        else:
            emit(f"Hub and chart images: saving {len(refs)} images to {archive}")
            save_archive(engine, refs, archive, stale="z2jh-*.tar")
    except HarnessError as e:
        raise ChartImageError(f"The hub and chart images cannot be built: {e}.") from None
    except NotebookImageError as e:
        raise ChartImageError(str(e)) from None
    except subprocess.CalledProcessError as e:
        raise ChartImageError(
            f"`docker save` of the hub and chart images failed: {e.stderr.decode(errors='replace')}"
        ) from None
    finally:
        engine.stop()
        shutil.rmtree(state, ignore_errors=True)
    emit(f"Hub and chart images ready in {time.monotonic() - started:.0f}s ({archive.name})")
    return DeployImages(archive=archive, refs=tuple(refs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner_sandbox.chartimages",
        description="Build zero-to-jupyterhub's images (images/z2jh) on a private Docker engine.",
    )
    parser.parse_args(argv)
    repo = build.REPO_ROOT
    # A short socket path (unix sockets: 107 bytes): a fresh /tmp directory.
    state = Path(tempfile.mkdtemp(prefix="gs-dockerd-"))
    engine = PrivateEngine(state=state, data_root=build.image_cache_dir(repo) / "engine")
    try:
        engine.start()
        run_image_tool(repo, engine, ["base"], io.StringIO(), print)
        for image in build_chart_images(engine, repo):
            print(image.ref)
    except (HarnessError, ChartImageError, NotebookImageError, build.BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
