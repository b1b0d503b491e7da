"""The notebook image on every real node, without a registry.

No registry is reachable from our machines, so the image the notebooks run is
built here and handed to each node's containerd as a file:

1. a private Docker engine (:class:`gpuspawner_sandbox.dockerd.PrivateEngine`,
   Debian's ``dockerd``) with its data root in ``.cache/images/engine``,
   shared with the image tests, so either one's layers serve the other;
2. ``gpuspawner-images base``: ``debian:trixie-slim`` made from Debian's
   packages with debootstrap (its root filesystem cached in ``.cache/images``);
3. ``gpuspawner-images build --reproducible --target jupyter --network host``
   of the notebook images: the Jupyter stage of ``images/*/Dockerfile``, tagged
   ``…-jupyter`` (the catalogs the sandbox uses name those tags). Each image is
   labelled with the last commit that changed its sources and dated by it, so
   building the same sources again, after any commit elsewhere, gives the same
   image ID;
4. ``docker save`` of every tag into ``<cache>/notebook-<image id>.tar``,
   skipped when that file exists (the cache is keyed by image ID);

and :mod:`gpuspawner_sandbox.nodes` imports the archive into each node's
containerd (``ctr -n k8s.io images import``) when the node starts.

The image tool is run as a program, as a user runs it: the sandbox imports
nothing from gpuspawner. What it needs to know of the images (the stage tags,
the label a stage build carries, the images a catalog names) it asks the tool
too (:mod:`.imagefacts`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import build, suitecosts
from .dockerd import HarnessError, PrivateEngine, need
from .imagefacts import ImageFactsError, image_facts

#: The images whose Jupyter stage the sandbox's catalogs offer (names in images/matrix.yaml).
NOTEBOOK_IMAGES = ("cuda-pytorch", "cuda-tensorflow")
#: The stage the sandbox runs: JupyterHub and JupyterLab without the framework's gigabytes.
STAGE = "jupyter"

Emit = Callable[[str], None]


class NotebookImageError(Exception):
    """The notebook image could not be built or saved; the message says why and what to do."""


@dataclass(frozen=True)
class NotebookImages:
    """The built notebook images: one archive holding every tag, and the image ID behind them."""

    archive: Path
    image_id: str
    refs: tuple[str, ...]


def tool_build(*args: str) -> list[str]:
    """The image tool's ``build`` as every image of the sandbox is built: dated by its
    sources' last commit (the same sources, the same image ID: the archives and node
    image stores keyed by it are reused), its ``RUN`` steps on the host's network (the
    private engine has no bridge)."""
    return ["build", "--reproducible", "--network", "host", *args]


def build_steps(repo: Path, names: Sequence[str] = NOTEBOOK_IMAGES) -> list[tuple[str, list[str]]]:
    """What runs, in order: (what it makes, the image tool's arguments)."""
    return [
        ("the Debian base (debootstrap; cached)", ["base"]),
        (f"the {STAGE} stage of {', '.join(names)}", tool_build("--target", STAGE, *names)),
    ]


def is_progress_line(line: str) -> bool:
    """Whether a line of the image tool's output says how far a build is (the rest goes to the log)."""
    text = line.split("] ", 1)[-1] if line.startswith("[") else line
    return (
        text.startswith(("Step ", "Successfully tagged", "==>", "debootstrap", "reusing"))
        or "Successfully installed" in text
        or line.startswith(("IMAGE ", "registry", "---"))
    )


def stage_refs(images: Iterable[dict], label: str) -> dict[str, list[str]]:
    """Image ID -> tags, of the engine's images (`GET /images/json`) labelled as the Jupyter
    stage: ``label`` is the image tool's stage label (:attr:`.imagefacts.ImageFacts.stage_label`)."""
    found: dict[str, list[str]] = {}
    for image in images:
        if (image.get("Labels") or {}).get(label) != STAGE:
            continue
        tags = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
        if tags:
            found.setdefault(image["Id"], []).extend(sorted(tags))
    return found


def catalog_images(catalog: Path, repo: Path) -> list[str]:
    """The image references a catalog file names, sorted: the image tool reads the file
    as the spawner does (``gpuspawner-images facts --catalog``)."""
    try:
        return list(image_facts(repo, [catalog]).catalogs[str(catalog)])
    except (ImageFactsError, KeyError) as e:
        raise NotebookImageError(f"The catalog {catalog} cannot be read: {e}") from None


def missing_from(catalog_refs: Iterable[str], built: Iterable[str]) -> list[str]:
    """Catalog images that the build did not make (a node could never start them)."""
    have = set(built)
    return [ref for ref in catalog_refs if ref not in have]


def archive_name(image_id: str) -> str:
    return f"notebook-{image_id.split(':', 1)[-1][:16]}.tar"


# -- I/O -----------------------------------------------------------------------------


@suitecosts.recorded(suitecosts.IMAGE_BUILD, lambda repo, engine, args, *a: " ".join(args))
def run_image_tool(repo: Path, engine: PrivateEngine, args: list[str], log, emit: Emit) -> None:
    env = {**os.environ, "DOCKER_HOST": engine.host}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuspawner.images.cli", *args],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        log.write(line)
        line = line.rstrip()
        tail = [*tail[-19:], line]
        if is_progress_line(line):
            # pip's and apt's lines can be thousands of characters: the log has them whole
            emit(f"    {line[:117] + '...' if len(line) > 120 else line}")
    if proc.wait() != 0:
        raise NotebookImageError(
            f"`gpuspawner-images {' '.join(args)}` failed (exit {proc.returncode}); "
            f"the whole log is {log.name}; its last lines:\n" + "\n".join(tail)
        )


def save_archive(engine: PrivateEngine, refs: Sequence[str], archive: Path, stale: str) -> None:
    """``docker save`` the images into ``archive`` whole or not at all, and remove the
    older archives beside it that match ``stale`` (never imported again).

    Raises :class:`subprocess.CalledProcessError` when the engine cannot save them.
    """
    partial = archive.with_suffix(".partial")
    subprocess.run(
        [need("docker"), "-H", engine.host, "save", "-o", str(partial), *refs],
        check=True,
        capture_output=True,
        timeout=900,
    )
    partial.replace(archive)
    for old in archive.parent.glob(stale):
        if old != archive:
            old.unlink()


def _engine_images(engine: PrivateEngine) -> list[dict]:
    client = engine.client()
    try:
        return client.api.images()
    finally:
        client.close()


def ensure_notebook_images(
    cache_dir: Path,
    repo: Path,
    emit: Emit = print,
    names: Sequence[str] = NOTEBOOK_IMAGES,
) -> NotebookImages:
    """Build (or find cached) the notebook images' Jupyter stage and save them to one archive."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        facts = image_facts(repo)
        expected = set(facts.stage_refs(names, STAGE))
    except ImageFactsError as e:
        raise NotebookImageError(f"The notebook image cannot be built: {e}") from None
    steps = build_steps(repo, names)
    total = len(steps) + 2
    emit(f"Notebook image [1/{total}]: starting a private Docker engine (dockerd)")
    # The socket's path must stay short (unix sockets: 107 bytes): a fresh /tmp directory.
    state = Path(tempfile.mkdtemp(prefix="gs-dockerd-"))
    engine = PrivateEngine(state=state, data_root=build.image_cache_dir(repo) / "engine")
    log_path = cache_dir / "notebook-build.log"
    try:
        try:
            engine.start()
        except HarnessError as e:
            raise NotebookImageError(f"The notebook image cannot be built: {e}.") from None
        with log_path.open("w") as log:
            for number, (what, args) in enumerate(steps, start=2):
                emit(
                    f"Notebook image [{number}/{total}]: {what} "
                    f"({time.monotonic() - started:.0f}s so far)"
                )
                run_image_tool(repo, engine, args, log, emit)
        built = stage_refs(_engine_images(engine), facts.stage_label)
        wanted = {r for refs in built.values() for r in refs if r in expected}
        ids = {image_id for image_id, refs in built.items() if wanted & set(refs)}
        if len(ids) != 1 or wanted != expected:
            raise NotebookImageError(
                f"Expected the {STAGE} stage of {', '.join(names)} to be one image tagged "
                f"{', '.join(sorted(expected))}, found {len(ids)} "
                f"({', '.join(sorted(wanted)) or 'none'}); see {log_path}."
            )
        (image_id,) = ids
        refs = tuple(sorted(wanted))
        archive = cache_dir / archive_name(image_id)
        if archive.is_file():
            emit(
                f"Notebook image [{total}/{total}]: {archive.name} holds {image_id[:19]}… "
                "already (cached)"
            )
        else:
            emit(f"Notebook image [{total}/{total}]: saving {', '.join(refs)} to {archive}")
            save_archive(engine, refs, archive, stale="notebook-*.tar")
    except subprocess.CalledProcessError as e:
        raise NotebookImageError(
            f"`docker save` of the notebook image failed: {e.stderr.decode(errors='replace')}"
        ) from None
    finally:
        engine.stop()
        # Its socket, pid file and log (a failed start's tail is in the error already).
        shutil.rmtree(state, ignore_errors=True)
    emit(
        f"Notebook image ready in {time.monotonic() - started:.0f}s: {image_id[:19]}… "
        f"({archive.stat().st_size / 1e6:.0f} MB archive)"
    )
    return NotebookImages(archive=archive, image_id=image_id, refs=refs)
