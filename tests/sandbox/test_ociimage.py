"""Packing files into an OCI image archive that containerd imports."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

from gpuspawner_sandbox import ociimage


def _members(archive: bytes) -> dict[str, bytes | None]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {
            m.name: (tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()
        }


def _blob(members: dict, digest: str) -> bytes:
    return members["blobs/sha256/" + digest.split(":", 1)[1]]


SPEC = ociimage.ImageSpec(
    ref="gpuspawner.invalid/tool:v1",
    files={"tool": (b"\x7fELF binary", 0o755), "etc/motd": (b"hi\n", 0o644)},
    entrypoint=["/tool"],
    cmd=["sleep", "infinity"],
    architecture="arm64",
)


def test_layer_holds_files_with_modes_and_base_dirs():
    layer = ociimage.layer_tar(SPEC.files)
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(members["tool"]).read() == b"\x7fELF binary"
        assert members["tool"].mode == 0o755
        assert members["etc/motd"].mode == 0o644
    for d in ("dev", "proc", "sys", "tmp", "etc"):
        assert members[d].isdir(), d
    assert members["tmp"].mode == 0o1777
    assert all(m.uid == 0 and m.mtime == 0 for m in members.values())


def test_nested_paths_get_their_parent_directories():
    layer = ociimage.layer_tar({"usr/local/bin/x": (b"x", 0o755)})
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        names = {m.name for m in tar.getmembers() if m.isdir()}
    assert {"usr", "usr/local", "usr/local/bin"} <= names


def test_archive_is_a_consistent_oci_layout():
    archive = ociimage.image_archive(SPEC)
    members = _members(archive)
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(members["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"][ociimage.ANNOTATION_CONTAINERD_NAME] == SPEC.ref
    assert entry["annotations"][ociimage.ANNOTATION_REF_NAME] == "v1"
    assert entry["platform"] == {"architecture": "arm64", "os": "linux"}

    # Every descriptor's digest and size match the blob it names.
    manifest_raw = _blob(members, entry["digest"])
    assert entry["size"] == len(manifest_raw)
    assert entry["digest"] == "sha256:" + hashlib.sha256(manifest_raw).hexdigest()
    manifest = json.loads(manifest_raw)
    config_raw = _blob(members, manifest["config"]["digest"])
    assert manifest["config"]["size"] == len(config_raw)
    (layer_desc,) = manifest["layers"]
    layer = _blob(members, layer_desc["digest"])
    assert layer_desc["size"] == len(layer)
    assert layer_desc["mediaType"] == ociimage.MEDIA_LAYER

    config = json.loads(config_raw)
    # Uncompressed layer: its diff_id is its digest.
    assert config["rootfs"] == {"type": "layers", "diff_ids": [layer_desc["digest"]]}
    assert config["config"]["Entrypoint"] == ["/tool"]
    assert config["config"]["Cmd"] == ["sleep", "infinity"]
    assert config["architecture"] == "arm64" and config["os"] == "linux"
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert tar.extractfile("tool").read() == b"\x7fELF binary"


def test_archive_is_deterministic_and_content_addressed():
    assert ociimage.image_archive(SPEC) == ociimage.image_archive(SPEC)
    other = ociimage.ImageSpec(
        ref=SPEC.ref, files={"tool": (b"another", 0o755)}, entrypoint=["/tool"]
    )
    first = json.loads(_members(ociimage.image_archive(SPEC))["index.json"])
    second = json.loads(_members(ociimage.image_archive(other))["index.json"])
    assert first["manifests"][0]["digest"] != second["manifests"][0]["digest"]


def test_no_cmd_means_no_cmd_key():
    spec = ociimage.ImageSpec(ref="x.invalid/pause:v1", files={}, entrypoint=["/pause"])
    config = ociimage.image_config(spec, "sha256:" + "0" * 64)
    assert "Cmd" not in config["config"]
    assert config["config"]["Entrypoint"] == ["/pause"]


def test_docker_archive_is_the_same_image_for_docker_load():
    """`docker save`'s layout (what Docker 20.10 loads): same layer and config as the OCI
    archive, so the image's ID is the same wherever it is loaded."""
    oci = _members(ociimage.image_archive(SPEC))
    docker = _members(ociimage.docker_archive(SPEC))
    (manifest,) = json.loads(docker["manifest.json"])
    assert manifest["RepoTags"] == ["gpuspawner.invalid/tool:v1"]
    config = docker[manifest["Config"]]
    assert "sha256:" + hashlib.sha256(config).hexdigest() == ociimage.image_id(SPEC)
    (index,) = json.loads(oci["index.json"])["manifests"]
    oci_manifest = json.loads(_blob(oci, index["digest"]))
    assert _blob(oci, oci_manifest["config"]["digest"]) == config
    (layer,) = manifest["Layers"]
    assert docker[layer] == _blob(oci, oci_manifest["layers"][0]["digest"])
    assert ociimage.docker_archive(SPEC) == ociimage.docker_archive(SPEC)  # deterministic


def test_cached_archive_is_written_once_and_replaces_an_older_one(tmp_path):
    first = ociimage.ImageSpec(
        ref="gpuspawner.invalid/x:1", files={"a": (b"one", 0o644)}, entrypoint=["/a"]
    )
    archive = ociimage.cached_archive(first, tmp_path / "images", "x")
    assert archive.read_bytes() == ociimage.image_archive(first)
    stamp = archive.stat().st_mtime_ns
    assert ociimage.cached_archive(first, tmp_path / "images", "x") == archive
    assert archive.stat().st_mtime_ns == stamp  # not written again
    other = ociimage.cached_archive(
        ociimage.ImageSpec(
            ref="gpuspawner.invalid/y:1", files={"b": (b"", 0o644)}, entrypoint=["/b"]
        ),
        tmp_path / "images",
        "y",
    )
    second = ociimage.ImageSpec(
        ref="gpuspawner.invalid/x:2", files={"a": (b"two", 0o644)}, entrypoint=["/a"]
    )
    newer = ociimage.cached_archive(second, tmp_path / "images", "x")
    assert newer != archive and not archive.exists() and newer.is_file()
    assert other.is_file()  # another stem's archive is left alone
    assert not list((tmp_path / "images").glob("*.tmp"))
