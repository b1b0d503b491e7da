"""The GPU check's own image on every real node, for ``c.GPUSpawner.validation_image``.

``images/validation/Dockerfile`` (python3 and nothing else) is built as the notebook
image is (:mod:`.notebookimage`): on the private Docker engine whose data root is
``.cache/images/engine``, by the image tool (``gpuspawner-images build validation``,
reproducible, so the same sources give the same image ID), then saved with ``docker
save`` into ``<cache>/validation-<image id>.tar``, skipped when that file exists. The
nodes' image store imports the archive beside the notebook image's (:mod:`.imageseed`).

Its reference is the image tool's answer (``gpuspawner-images facts``,
:mod:`.imagefacts`): the sandbox parses no matrix.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import build
from .dockerd import HarnessError, PrivateEngine
from .imagefacts import ImageFactsError, image_facts
from .notebookimage import Emit, NotebookImageError, run_image_tool, save_archive, tool_build


class ValidationImageError(Exception):
    """The GPU check's image could not be built or saved; the message says why."""


@dataclass(frozen=True)
class ValidationImage:
    """The built GPU check image: its archive and the reference it is tagged with."""

    archive: Path
    ref: str


def archive_name(image_id: str) -> str:
    """The archive's name, keyed by the image ID: a rebuild of the same sources reuses it."""
    return f"validation-{image_id.split(':', 1)[-1][:16]}.tar"


def ensure_validation_image(cache_dir: Path, repo: Path, emit: Emit = print) -> ValidationImage:
    """Build (or find cached) the GPU check's image and save it to an archive for the nodes."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        check = image_facts(repo).validation
    except ImageFactsError as e:
        raise ValidationImageError(f"The GPU check's image cannot be built: {e}") from None
    if check is None:
        raise ValidationImageError(
            "The image tool names no GPU check image (images/matrix.yaml has no validation:)."
        )
    name, ref = check
    # A short socket path (unix sockets: 107 bytes): a fresh /tmp directory.
    state = Path(tempfile.mkdtemp(prefix="gs-dockerd-"))
    engine = PrivateEngine(state=state, data_root=build.image_cache_dir(repo) / "engine")
    log_path = cache_dir / "validation-build.log"
    try:
        emit(f"GPU check image: {ref} (images/validation/Dockerfile; cached after the first)")
        engine.start()
        with log_path.open("w") as log:
            run_image_tool(repo, engine, ["base"], log, emit)
            run_image_tool(repo, engine, tool_build(name), log, emit)
        client = engine.client()
        try:
            image_id = client.images.get(ref).id
        finally:
            client.close()
        archive = cache_dir / archive_name(image_id)
        if archive.is_file():
            emit(f"GPU check image: {archive.name} holds it already (cached)")
        else:
            save_archive(engine, [ref], archive, stale="validation-*.tar")
    except HarnessError as e:
        raise ValidationImageError(f"The GPU check's image cannot be built: {e}.") from None
    except NotebookImageError as e:
        raise ValidationImageError(str(e)) from None
    except subprocess.CalledProcessError as e:
        raise ValidationImageError(
            f"`docker save` of {ref} failed: {e.stderr.decode(errors='replace')}"
        ) from None
    finally:
        engine.stop()
        shutil.rmtree(state, ignore_errors=True)
    emit(f"GPU check image ready in {time.monotonic() - started:.0f}s ({archive.name})")
    return ValidationImage(archive=archive, ref=ref)
