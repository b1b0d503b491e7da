"""`gpuspawner-images base`: what the Debian base must be (pure), and the verb on a real engine."""

from __future__ import annotations

import pytest

from gpuspawner.images.base import apt_sources, debootstrap_command, local_trust_anchors, plan_base
from gpuspawner.images.matrix import MatrixError
from gpuspawner.images.plan import base_images

from .conftest import tool_on_engine


def pem(body: str) -> str:
    return f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----"


def test_every_matrix_base_can_be_made_here(matrix):
    plans = [plan_base(image) for image in base_images(matrix)]
    assert [(p.image, p.suite, p.slim) for p in plans] == [("debian:trixie-slim", "trixie", True)]


@pytest.mark.parametrize("image", ["ubuntu:24.04", "debian:latest", "quay.io/x/debian:trixie"])
def test_a_base_debootstrap_cannot_make_is_one_sentence(image):
    with pytest.raises(MatrixError, match=r"cannot be made here: .* pull other bases instead"):
        plan_base(image)


def test_apt_sources_are_debians_defaults_for_the_suite():
    text = apt_sources("trixie")
    assert "URIs: http://deb.debian.org/debian\n" in text
    assert "Suites: trixie trixie-updates\n" in text
    assert "Suites: trixie-security\n" in text
    assert text.count("Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg") == 2


def test_debootstrap_makes_a_minimal_tree_with_tls_roots(tmp_path):
    cmd = debootstrap_command(plan_base("debian:trixie-slim"), tmp_path / "rootfs")
    assert cmd[:3] == ["debootstrap", "--variant=minbase", "--include=ca-certificates"]
    assert cmd[3:] == ["trixie", str(tmp_path / "rootfs")]


def test_local_trust_anchors_are_the_bundle_less_the_packaged_certificates():
    packaged = [pem("AAA"), pem("BBB") + "\n" + pem("CCC")]
    bundle = "\n".join([pem("AAA"), pem("LOCAL1"), pem("CCC"), pem("LOCAL2"), pem("LOCAL1")])
    assert local_trust_anchors(bundle, packaged) == [pem("LOCAL1"), pem("LOCAL2")]
    assert local_trust_anchors(pem("AAA"), packaged) == []


def test_base_verb_reuses_the_cached_root_filesystem_and_image(engine, built, docker_client):
    """A second `base` changes nothing: a new import would invalidate every cached layer."""
    before = docker_client.images.get("debian:trixie-slim").id
    proc = tool_on_engine(engine.host, "base")
    assert proc.returncode == 0, proc.stdout
    assert "[debian:trixie-slim] reusing " in proc.stdout
    assert "[debian:trixie-slim] debian:trixie-slim is already this root filesystem" in proc.stdout
    assert "debootstrap trixie" not in proc.stdout
    assert docker_client.images.get("debian:trixie-slim").id == before
