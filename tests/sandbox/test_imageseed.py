"""The nodes' image store, made once: its key, what is linked, and a real containerd on a copy."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuspawner_sandbox import imageseed, ociimage, testing
from gpuspawner_sandbox.dockerd import mounts_under, stop_process

CONTENT = ("io.containerd.content.v1.content", "blobs")
SNAPSHOTS = ("io.containerd.snapshotter.v1.overlayfs", "snapshots")


def _archive(path: Path, ref: str, text: bytes) -> Path:
    spec = ociimage.ImageSpec(ref=ref, files={"hello": (text, 0o644)}, entrypoint=["/hello"])
    path.write_bytes(ociimage.image_archive(spec))
    return path


def test_the_key_follows_the_images_and_the_containerd_not_the_file_names(tmp_path):
    one = _archive(tmp_path / "a.tar", "gpuspawner.invalid/a:v1", b"one")
    renamed = tmp_path / "b.tar"
    renamed.write_bytes(one.read_bytes())
    other = _archive(tmp_path / "c.tar", "gpuspawner.invalid/a:v1", b"two")
    index = imageseed._archive_index
    key = imageseed.seed_key([index(one)], "containerd v2.4.2")
    assert key == imageseed.seed_key([index(renamed)], "containerd v2.4.2")
    assert key != imageseed.seed_key([index(other)], "containerd v2.4.2")
    assert key != imageseed.seed_key([index(one)], "containerd v2.5.0")
    assert key != imageseed.seed_key([index(one), index(other)], "containerd v2.4.2")


def test_a_file_that_is_no_image_archive_is_named(tmp_path):
    import tarfile

    bogus = tmp_path / "bogus.tar"
    with tarfile.open(bogus, "w"):
        pass
    with pytest.raises(imageseed.SeedError, match=r"bogus\.tar is not an image archive"):
        imageseed._archive_index(bogus)


@pytest.mark.parametrize(
    ("relative", "shared"),
    [
        ("io.containerd.content.v1.content/blobs/sha256/ab12", True),
        ("io.containerd.snapshotter.v1.overlayfs/snapshots/3/fs/usr/bin/python3", True),
        # written by every containerd: each node has its own
        ("io.containerd.metadata.v1.bolt/meta.db", False),
        ("io.containerd.snapshotter.v1.overlayfs/metadata.db", False),
        ("io.containerd.content.v1.content/ingest", False),
        ("io.containerd.grpc.v1.introspection/uuid", False),
    ],
)
def test_only_immutable_trees_are_linked(relative, shared):
    assert imageseed.linked(Path(relative)) is shared


def _ctr(containerd_dir: Path, socket: Path, *args: str) -> str:
    result = subprocess.run(
        [str(containerd_dir / "ctr"), "--address", str(socket), "-n", "k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_seed_is_made_once_and_a_containerd_on_a_copy_has_its_images(pytestconfig, tmp_path):
    binaries = testing.node_binaries(
        pytestconfig
    )  # root, Go, runc: skipped (failed in CI) otherwise
    archives = [
        _archive(tmp_path / "a.tar", "gpuspawner.invalid/seed-a:v1", b"a"),
        _archive(tmp_path / "b.tar", "gpuspawner.invalid/seed-b:v1", b"b"),
    ]
    cache = tmp_path / "cache"
    said: list[str] = []
    root = imageseed.ensure_seed(archives, binaries.containerd_dir, cache=cache, emit=said.append)
    assert said[0].startswith("Preparing the nodes' image store: importing 2 image archive(s)")
    assert [p.name for p in (cache / imageseed.SEEDS_DIR).iterdir()] == [root.parent.name]
    assert mounts_under(cache) == []
    # again: nothing imported, the same seed
    said.clear()
    assert (
        imageseed.ensure_seed(archives, binaries.containerd_dir, cache=cache, emit=said.append)
        == root
    )
    assert said == []

    target = tmp_path / "node" / "containerd-root"
    imageseed.populate(root, target)
    blobs = [p for p in root.joinpath(*CONTENT).rglob("*") if p.is_file()]
    assert blobs, "the seed holds the archives' blobs"
    for blob in blobs:
        copy = target / blob.relative_to(root)
        assert copy.stat().st_ino == blob.stat().st_ino  # linked
    unpacked = [p for p in root.joinpath(*SNAPSHOTS).rglob("hello")]
    assert len(unpacked) == 2, "each image's layer is unpacked in the seed"
    meta = Path("io.containerd.metadata.v1.bolt/meta.db")
    assert (target / meta).stat().st_ino != (root / meta).stat().st_ino  # its own
    assert (target / meta).read_bytes() == (root / meta).read_bytes()

    # a containerd on the copy has both images, unpacked, and writes only its own files
    run = Path(tempfile.mkdtemp(prefix="gs-node-"))  # sockets need a short path
    config = run / "config.toml"
    config.write_text(imageseed.seed_config(target, run))
    socket = run / "c.sock"
    proc = subprocess.Popen(
        [str(binaries.containerd), "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(0.5)
        listed = _ctr(binaries.containerd_dir, socket, "images", "ls", "-q")
        assert "gpuspawner.invalid/seed-a:v1" in listed and "gpuspawner.invalid/seed-b:v1" in listed
        _ctr(
            binaries.containerd_dir,
            socket,
            "images",
            "rm",
            "--sync",
            "gpuspawner.invalid/seed-a:v1",
        )
    finally:
        stop_process(proc, grace=10)
        shutil.rmtree(run)
    # removing an image on the copy leaves the seed whole
    assert all(blob.exists() for blob in blobs)
    assert len(list(root.joinpath(*SNAPSHOTS).rglob("hello"))) == 2


def test_a_containerd_that_cannot_start_leaves_nothing_behind(tmp_path):
    """The failure is one sentence with containerd's log; no half-made seed, no socket dir."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in {
        "containerd": '[ "$1" = --version ] && echo "containerd v0"; echo "no cgroups here" >&2; exit 1',
        "ctr": "exit 1",
    }.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    archive = _archive(tmp_path / "a.tar", "gpuspawner.invalid/a:v1", b"a")
    before = set(Path(tempfile.gettempdir()).glob("gpuspawner-seed-*"))
    cache = tmp_path / "cache"
    with pytest.raises(imageseed.SeedError, match="did not start; its log ends") as failed:
        imageseed.ensure_seed([archive], bin_dir, cache=cache, emit=lambda line: None)
    assert "no cgroups here" in str(failed.value)
    assert list((cache / imageseed.SEEDS_DIR).iterdir()) == []
    assert set(Path(tempfile.gettempdir()).glob("gpuspawner-seed-*")) == before
