"""`gpuspawner-images base`: make the Debian base image from Debian's packages.

Where no image registry is reachable, `debian:trixie-slim` cannot be pulled, so
it is made with debootstrap from Debian's archive and imported into the engine
under that exact name: the Dockerfiles then build unchanged, and production
builds pull the same name from the registry instead.

What the base must contain is decided by pure functions (suite, apt sources,
trust anchors, slimming); `make_base` is the thin layer that runs debootstrap,
tar and the engine's import. The root filesystem is cached as a tarball: making
it takes minutes, importing it seconds.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .matrix import MatrixError

Emit = Callable[[str], None]

#: The Debian releases a base can be made of, by codename (debootstrap's suite).
DEBIAN_SUITES = ("bookworm", "trixie", "forky")
_BASE_RE = re.compile(r"^debian:(?P<suite>[a-z]+)(?P<slim>-slim)?$")
_PEM_RE = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)

#: Paths the official *-slim images leave out (dpkg never unpacks them), so that
#: the base made here is as small as the one pulled in production.
SLIM_DPKG_EXCLUDES = """\
# As Docker's debian:*-slim images: no documentation, man pages or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
"""

#: Keep apt's downloaded packages out of image layers, as Docker's Debian images do.
APT_DOCKER_CLEAN = """\
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""


class BaseError(Exception):
    """The base could not be made; str() is the sentence to show the user."""


@dataclass(frozen=True)
class BasePlan:
    """How to make one base image."""

    image: str
    suite: str
    slim: bool

    @property
    def cache_name(self) -> str:
        return f"{self.suite}{'-slim' if self.slim else ''}-rootfs.tar"


def plan_base(image: str) -> BasePlan:
    """The debootstrap suite behind a `debian:<codename>[-slim]` base name."""
    m = _BASE_RE.match(image)
    if not m or m["suite"] not in DEBIAN_SUITES:
        raise MatrixError(
            f"{image!r} cannot be made here: gpuspawner-images base makes "
            f"debian:<codename>[-slim] for {', '.join(DEBIAN_SUITES)}; pull other bases instead"
        )
    return BasePlan(image=image, suite=m["suite"], slim=bool(m["slim"]))


def apt_sources(suite: str) -> str:
    """The deb822 sources of Docker's official Debian images (Debian's default mirror)."""
    return (
        "Types: deb\n"
        "URIs: http://deb.debian.org/debian\n"
        f"Suites: {suite} {suite}-updates\n"
        "Components: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        "\n"
        "Types: deb\n"
        "URIs: http://deb.debian.org/debian-security\n"
        f"Suites: {suite}-security\n"
        "Components: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )


def local_trust_anchors(bundle: str, packaged: list[str]) -> list[str]:
    """Certificates this machine trusts beyond the ca-certificates package.

    `bundle` is the machine's CA bundle, `packaged` the texts of the package's
    own certificate files. What is left are the CAs an administrator added (for
    example a TLS-inspecting proxy's): builds on this machine reach PyPI through
    the same network, so a base made here must trust them too.
    """
    known = {c for text in packaged for c in _PEM_RE.findall(text)}
    seen: set[str] = set()
    extra = []
    for cert in _PEM_RE.findall(bundle):
        if cert not in known and cert not in seen:
            seen.add(cert)
            extra.append(cert)
    return extra


def debootstrap_command(plan: BasePlan, target: Path) -> list[str]:
    """debootstrap's minimal variant, plus what every later `apt-get` needs (TLS roots)."""
    return [
        "debootstrap",
        "--variant=minbase",
        "--include=ca-certificates",
        plan.suite,
        str(target),
    ]


# ---- I/O: debootstrap, tar, the engine ----------------------------------------------


def _run(cmd: list[str], emit: Emit, what: str) -> None:
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except FileNotFoundError:
        raise BaseError(
            f"{cmd[0]} is not installed, so the base cannot be {what} "
            "(run sh scripts/install-system-packages.sh)"
        ) from None
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        emit(line)
        tail = [*tail[-4:], line]
    if proc.wait() != 0:
        raise BaseError(f"{what} failed ({cmd[0]} exited {proc.returncode}): {' / '.join(tail)}")


def host_trust_anchors(
    bundle: Path = Path("/etc/ssl/certs/ca-certificates.crt"),
    packaged_dir: Path = Path("/usr/share/ca-certificates"),
) -> list[str]:
    if not bundle.is_file():
        return []
    packaged = [p.read_text(errors="replace") for p in sorted(packaged_dir.rglob("*.crt"))]
    return local_trust_anchors(bundle.read_text(errors="replace"), packaged)


def make_rootfs(plan: BasePlan, tarball: Path, emit: Emit) -> None:
    """Run debootstrap, adjust the tree as Docker's Debian images are, and tar it."""
    tarball.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{plan.suite}-", dir=tarball.parent))
    try:
        rootfs = work / "rootfs"
        if plan.slim:
            # dpkg reads its excludes before debootstrap's second stage unpacks anything.
            (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True)
            (rootfs / "etc/dpkg/dpkg.cfg.d/docker").write_text(SLIM_DPKG_EXCLUDES)
        emit(f"debootstrap {plan.suite} from Debian's archive (takes minutes)")
        _run(debootstrap_command(plan, rootfs), emit, f"made with debootstrap {plan.suite}")
        (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(apt_sources(plan.suite))
        (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(APT_DOCKER_CLEAN)
        anchors = host_trust_anchors()
        if anchors:
            local = rootfs / "usr/local/share/ca-certificates"
            local.mkdir(parents=True, exist_ok=True)
            for i, cert in enumerate(anchors):
                (local / f"host-local-{i}.crt").write_text(cert + "\n")
            emit(f"adding {len(anchors)} CA(s) this machine trusts beyond Debian's set")
            _run(
                ["chroot", str(rootfs), "update-ca-certificates"], emit, "given this machine's CAs"
            )
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives", "var/log"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        partial = tarball.with_suffix(".partial")
        emit(f"packing {rootfs} into {tarball}")
        _run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."],
            emit,
            "packed",
        )
        partial.replace(tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def file_sha256(path: Path) -> str:
    """The layer digest `docker import` gives an uncompressed tarball: its sha256."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _image_layers(client: Any, image: str) -> list[str] | None:
    try:
        return list(client.images.get(image).attrs["RootFS"]["Layers"])
    except Exception:  # not there (or unreadable): import it
        return None


def make_base(
    client: Any, plan: BasePlan, cache_dir: Path, emit: Emit, *, refresh: bool = False
) -> str:
    """Import the base under plan.image, making (or reusing) the cached root filesystem.

    Returns the image ID.
    """
    tarball = cache_dir / plan.cache_name
    if refresh or not tarball.is_file():
        make_rootfs(plan, tarball, emit)
    else:
        emit(f"reusing {tarball} (--refresh makes it again)")
    layer = "sha256:" + file_sha256(tarball)
    present = _image_layers(client, plan.image)
    if present == [layer]:
        # Importing again would give a new image ID (it carries the import's date) and so
        # invalidate every cached layer built on it.
        emit(f"{plan.image} is already this root filesystem ({layer[:19]}…)")
        return client.images.get(plan.image).id
    repo, tag = plan.image.rsplit(":", 1)
    emit(f"importing {tarball} as {plan.image}")
    try:
        client.api.import_image_from_file(str(tarball), repository=repo, tag=tag)
        return client.images.get(plan.image).id
    except Exception as e:  # the engine's own message is the useful part
        raise BaseError(f"the engine could not import {tarball} as {plan.image}: {e}") from None
