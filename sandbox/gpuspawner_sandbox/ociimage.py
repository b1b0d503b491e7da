"""Pack files into an OCI image archive that ``ctr images import`` loads.

No registry is reachable from our machines, so the real nodes' images (the
pod sandbox's pause image, the test tool) are made here from static binaries:
one uncompressed layer, an image config, a manifest and an index, in the OCI
image layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md),
written as one tar. Everything is deterministic: the same files give the same
digests, so re-importing an unchanged image is a no-op for containerd.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"

#: The annotations containerd's importer reads the image's name from.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"

#: Directories every image has, so runtimes can mount /proc, /sys, /dev and /tmp.
BASE_DIRS = ("dev", "etc", "proc", "sys", "tmp")


@dataclass(frozen=True)
class ImageSpec:
    """What goes into an image: files (path -> (content, mode)) and how it runs."""

    ref: str
    files: Mapping[str, tuple[bytes, int]]
    entrypoint: Sequence[str]
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/",)
    architecture: str = "amd64"
    labels: Mapping[str, str] = field(default_factory=dict)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = mode
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def layer_tar(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    """One filesystem layer: the base directories, the files' parents, the files."""
    dirs = set(BASE_DIRS)
    for path in files:
        parts = path.strip("/").split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            _add(tar, d + "/", None, 0o1777 if d == "tmp" else 0o755)
        for path in sorted(files):
            data, mode = files[path]
            _add(tar, path.strip("/"), data, mode)
    return buf.getvalue()


def image_config(spec: ImageSpec, diff_id: str) -> dict[str, Any]:
    """The OCI image config for a one-layer image."""
    config: dict[str, Any] = {
        "Entrypoint": list(spec.entrypoint),
        "Env": list(spec.env),
        "WorkingDir": "/",
    }
    if spec.cmd:
        config["Cmd"] = list(spec.cmd)
    if spec.labels:
        config["Labels"] = dict(spec.labels)
    return {
        "architecture": spec.architecture,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }


def config_blob(spec: ImageSpec, layer: bytes) -> bytes:
    """The image config's bytes; their digest is the image's ID (Docker's too)."""
    return _json(image_config(spec, _digest(layer)))  # uncompressed: digest == diff_id


def image_id(spec: ImageSpec) -> str:
    """The image's ID (``sha256:…``), as containerd and Docker report it once loaded."""
    return _digest(config_blob(spec, layer_tar(spec.files)))


def docker_archive(spec: ImageSpec) -> bytes:
    """The same image as a ``docker save`` tar (manifest.json), which ``docker load`` of
    Docker 20.10 reads (it reads no OCI layout): same layer, same config, same ID."""
    layer = layer_tar(spec.files)
    config = config_blob(spec, layer)
    config_name = _digest(config).split(":", 1)[1] + ".json"
    layer_name = _digest(layer).split(":", 1)[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [spec.ref], "Layers": [layer_name]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "manifest.json", _json(manifest), 0o644)
        _add(tar, config_name, config, 0o644)
        _add(tar, layer_name.split("/", 1)[0] + "/", None, 0o755)
        _add(tar, layer_name, layer, 0o644)
    return buf.getvalue()


def image_archive(spec: ImageSpec) -> bytes:
    """The image as an OCI image-layout tar, named ``spec.ref`` for containerd."""
    layer = layer_tar(spec.files)
    layer_digest = _digest(layer)  # uncompressed: digest == diff_id
    config = config_blob(spec, layer)
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": len(layer)}],
        }
    )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": spec.architecture, "os": "linux"},
                    "annotations": {
                        ANNOTATION_CONTAINERD_NAME: spec.ref,
                        ANNOTATION_REF_NAME: spec.ref.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}), 0o644)
        _add(tar, "index.json", index, 0o644)
        _add(tar, "blobs/", None, 0o755)
        _add(tar, "blobs/sha256/", None, 0o755)
        for blob in sorted((layer, config, manifest), key=_digest):
            _add(tar, "blobs/sha256/" + _digest(blob).split(":", 1)[1], blob, 0o644)
    return buf.getvalue()


def cached_archive(spec: ImageSpec, cache: Path, stem: str) -> Path:
    """The image's archive in ``cache`` (``<stem>-<id>.tar``), written when missing.

    An older archive of the same stem is removed: one image of a name is kept. The
    write goes through a temporary file, so a crash never leaves half an archive.
    """
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"{stem}-{image_id(spec).split(':', 1)[1][:16]}.tar"
    if not archive.is_file():
        for stale in cache.glob(f"{stem}-*.tar"):
            stale.unlink()
        tmp = archive.with_suffix(".tmp")
        tmp.write_bytes(image_archive(spec))
        tmp.replace(archive)
    return archive
