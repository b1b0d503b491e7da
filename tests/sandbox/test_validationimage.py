"""The GPU check's image for the real nodes: named by the image tool, archived by image ID."""

from __future__ import annotations

import pytest

from gpuspawner_sandbox import validationimage
from gpuspawner_sandbox.imagefacts import ImageFactsError


def test_the_archive_is_keyed_by_the_image_id():
    assert validationimage.archive_name("sha256:0123456789abcdef0123") == (
        "validation-0123456789abcdef.tar"
    )


def test_a_tool_that_names_no_check_image_is_one_sentence(monkeypatch, tmp_path):
    class Facts:
        validation = None

    monkeypatch.setattr(validationimage, "image_facts", lambda repo: Facts())
    with pytest.raises(validationimage.ValidationImageError) as info:
        validationimage.ensure_validation_image(tmp_path / "cache", tmp_path)
    assert str(info.value) == (
        "The image tool names no GPU check image (images/matrix.yaml has no validation:)."
    )


def test_a_failing_tool_is_reported_in_its_own_words(monkeypatch, tmp_path):
    def failing(repo):
        raise ImageFactsError("`gpuspawner-images facts` failed (exit 2): bad matrix")

    monkeypatch.setattr(validationimage, "image_facts", failing)
    with pytest.raises(validationimage.ValidationImageError, match="bad matrix"):
        validationimage.ensure_validation_image(tmp_path / "cache", tmp_path)
