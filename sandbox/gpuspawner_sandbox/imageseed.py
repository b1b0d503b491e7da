"""Image stores prepared once: what each real node's containerd starts with.

Every node needs the same images (pause, the check tools, the notebook image).
Importing a 600 MB archive into each node's containerd took 40 to 90 s per node
on every start (docs/benchmarks.md). Instead, the archives are imported once
into a *seed*: a containerd root of its own, built by a short-lived containerd
in the cache, keyed by what the archives hold. Each node's containerd root then
starts as a copy of the seed in which the immutable parts (content blobs and
the unpacked layers of committed snapshots) are hard links and everything a
containerd writes to (its metadata databases) is a file of its own. A seed is
reused until the images change, so a warm start imports nothing.

Why links are safe: containerd never writes into a content blob or a committed
snapshot; a container's changes go to its own new active snapshot, and removing
an image on one node only unlinks that node's names.

:func:`seed_key` and :func:`linked` are pure; the rest is the thin I/O layer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import build, nodeconfig
from .dockerd import mounts_under, stop_process

#: Bumped when the seed's layout or how it is made changes.
FORMAT = 1
SEEDS_DIR = "containerd-seeds"
NAMESPACE = "k8s.io"
SNAPSHOTTER = "overlayfs"
#: Trees whose files containerd never changes once written: linked, not copied.
LINKED_TREES = (
    ("io.containerd.content.v1.content", "blobs"),
    (f"io.containerd.snapshotter.v1.{SNAPSHOTTER}", "snapshots"),
)
#: A finished seed has this file; anything else in the seeds directory is a leftover.
COMPLETE = "complete.json"
#: Seeds kept besides the one in use: the test nodes without the notebook image, another
#: branch's images.
KEEP = 2


class SeedError(Exception):
    """The seed could not be made; str() says what failed."""


def _archive_index(path: Path) -> bytes:
    """What identifies an image archive's content: its OCI index (or docker's manifest)."""
    with tarfile.open(path) as tar:
        for name in ("index.json", "manifest.json"):
            with contextlib.suppress(KeyError):
                member = tar.extractfile(name)
                if member is not None:
                    return member.read()
    raise SeedError(f"{path} is not an image archive: it has no index.json or manifest.json.")


def seed_key(indexes: Sequence[bytes], containerd_version: str) -> str:
    """The seed's name: the archives' indexes (content digests) and the containerd that unpacks them."""
    digest = hashlib.sha256(f"{FORMAT}\0{SNAPSHOTTER}\0{containerd_version}".encode())
    for index in indexes:
        digest.update(hashlib.sha256(index).digest())
    return digest.hexdigest()[:24]


def linked(relative: Path) -> bool:
    """Whether a path inside a containerd root is in a tree shared by links (immutable files)."""
    parts = relative.parts
    return any(parts[: len(tree)] == tree for tree in LINKED_TREES)


def seed_config(root: Path, run: Path) -> str:
    """A containerd that only stores and unpacks images in ``root``: no CRI, no NRI.

    ``run`` holds its state and sockets: a short path (sockets' paths are limited to 104 bytes).
    """
    return f"""\
# Written by gpuspawner_sandbox.imageseed: imports images into a seed, then stops.
version = 3
root = {json.dumps(str(root))}
state = {json.dumps(str(run / "state"))}
imports = []
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.runtime",
  "io.containerd.cri.v1.images",
  "io.containerd.podsandbox.controller.v1.podsandbox",
  "io.containerd.sandbox.controller.v1.shim",
]

[grpc]
  address = {json.dumps(str(run / "c.sock"))}

[ttrpc]
  address = {json.dumps(str(run / "c.sock.ttrpc"))}
"""


def _run(cmd: Sequence[str], timeout: float) -> None:
    try:
        result = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SeedError(
            f"`{' '.join(map(str, cmd))}` did not finish within {timeout:.0f}s."
        ) from None
    if result.returncode != 0:
        raise SeedError(f"`{' '.join(map(str, cmd))}` failed: {result.stderr.strip()[-500:]}")


def _containerd_version(containerd: Path) -> str:
    result = subprocess.run([str(containerd), "--version"], capture_output=True, text=True)
    return result.stdout.strip()


def ensure_seed(
    archives: Sequence[Path],
    containerd_dir: Path,
    *,
    cache: Path | None = None,
    preexec: Callable[[], None] | None = None,
    emit: Callable[[str], None] = print,
) -> Path:
    """The containerd root holding every archive's image, made now if no seed has them yet."""
    containerd, ctr = containerd_dir / "containerd", containerd_dir / "ctr"
    key = seed_key([_archive_index(a) for a in archives], _containerd_version(containerd))
    seeds = (cache or build.cache_dir()) / SEEDS_DIR
    seed = seeds / key
    if (seed / COMPLETE).exists():
        return seed / "root"
    _prune(seeds, keep=key)
    work = seeds / f"{key}.tmp"
    _remove(work)
    work.mkdir(parents=True)
    run = Path(tempfile.mkdtemp(prefix="gpuspawner-seed-"))
    (work / "config.toml").write_text(seed_config(work / "root", run))
    size = sum(a.stat().st_size for a in archives) / 1e6
    emit(
        f"Preparing the nodes' image store: importing {len(archives)} image archive(s) "
        f"({size:.0f} MB) once; nodes start from copies of it until the images change…"
    )
    began = time.monotonic()
    proc = None
    try:
        with (work / "containerd.log").open("ab") as log:
            proc = subprocess.Popen(
                [str(containerd), "--config", str(work / "config.toml")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
                env=nodeconfig.component_env(os.environ, containerd_dir),
            )
        client = [str(ctr), "--address", str(run / "c.sock"), "-n", NAMESPACE]
        deadline = time.monotonic() + 60
        while subprocess.run([*client, "version"], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (work / "containerd.log").read_text(errors="replace")[-800:]
                raise SeedError(f"The seed's containerd did not start; its log ends:\n{tail}")
            time.sleep(0.2)
        for archive in archives:
            _run([*client, "images", "import", str(archive)], timeout=900)
        stop_process(proc, grace=30)
        if mounts_under(work):
            raise SeedError(f"The seed's containerd left mounts under {work}.")
        _remove(run)
        (work / COMPLETE).write_text(
            json.dumps({"archives": [a.name for a in archives], "made": time.time()}) + "\n"
        )
        os.rename(work, seed)
    except BaseException:
        if proc is not None:
            stop_process(proc, grace=5)
        # An unpack cut short leaves its temporary mount (in this, the host's, namespace).
        for point in sorted(mounts_under(work), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        with contextlib.suppress(SeedError, OSError):
            _remove(run)
            _remove(work)
        raise
    emit(f"  image store ready in {time.monotonic() - began:.0f}s ({seed})")
    return seed / "root"


def populate(seed_root: Path, target: Path) -> None:
    """Make ``target`` (absent or empty) a containerd root holding the seed's images."""
    target.mkdir(parents=True, exist_ok=True)
    # cp keeps modes, owners and the overlay xattrs of the layers' directories.
    for tree in LINKED_TREES:
        source = seed_root.joinpath(*tree)
        if source.is_dir():
            destination = target.joinpath(*tree[:-1])
            destination.mkdir(parents=True, exist_ok=True)
            _run(["cp", "-a", "--link", str(source), str(destination)], timeout=600)
    for dirpath, dirnames, filenames in os.walk(seed_root):
        here = Path(dirpath)
        relative = here.relative_to(seed_root)
        dirnames[:] = [d for d in dirnames if not linked(relative / d)]
        (target / relative).mkdir(parents=True, exist_ok=True)
        shutil.copystat(here, target / relative)
        for name in filenames:
            if not linked(relative / name):
                shutil.copy2(here / name, target / relative / name)


def _prune(seeds: Path, keep: str) -> None:
    """Remove leftovers and all but the newest :data:`KEEP` other seeds."""
    if not seeds.is_dir():
        return
    finished = sorted(
        (p for p in seeds.iterdir() if p.name != keep and (p / COMPLETE).exists()),
        key=lambda p: (p / COMPLETE).stat().st_mtime,
        reverse=True,
    )
    for path in seeds.iterdir():
        if path.name != keep and path not in finished[:KEEP]:
            _remove(path)


def _remove(path: Path) -> None:
    if not path.exists():
        return
    if mounts_under(path):
        raise SeedError(f"{path} has mounts under it; unmount them and try again.")
    shutil.rmtree(path)
