"""The notebook image's plan and bookkeeping (pure parts); the real build runs in tests/e2e/test_real_nodes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.images.matrix import load_matrix
from gpuspawner.images.plan import image_ref
from gpuspawner_sandbox import imagefacts, notebookimage

REPO = Path(__file__).resolve().parents[2]
CATALOGS = [REPO / "config" / "sandbox" / "catalog.yaml", REPO / "tests" / "fixtures" / "catalogs"]


def _catalog_files() -> list[Path]:
    files = [CATALOGS[0]]
    files += [CATALOGS[1] / "e2e.yaml"]
    return files


def test_the_catalogs_the_sandbox_uses_name_the_jupyter_stage_the_image_tool_tags():
    """Every image these catalogs name is a stage tag `gpuspawner-images build --target jupyter`
    makes (the real tool answers both)."""
    matrix = load_matrix(REPO / "images" / "matrix.yaml")
    built = {
        image_ref(matrix, matrix.images[name], stage=notebookimage.STAGE)
        for name in notebookimage.NOTEBOOK_IMAGES
    }
    facts = imagefacts.image_facts(REPO)
    assert set(facts.stage_refs(notebookimage.NOTEBOOK_IMAGES, notebookimage.STAGE)) == built
    for catalog in _catalog_files():
        refs = notebookimage.catalog_images(catalog, REPO)
        assert refs, catalog
        assert notebookimage.missing_from(refs, built) == [], catalog


def test_missing_from_names_what_the_nodes_would_not_have():
    assert notebookimage.missing_from(["a:1", "b:2"], ["a:1"]) == ["b:2"]
    assert notebookimage.missing_from([], ["a:1"]) == []


def test_stage_refs_keeps_tagged_jupyter_stage_images_only():
    label = "example.org/stage"  # the tool's stage label, passed in (imagefacts)
    images = [
        {
            "Id": "sha256:aaa",
            "RepoTags": ["r/cuda-pytorch:1-jupyter", "r/cuda-tensorflow:2-jupyter"],
            "Labels": {label: "jupyter"},
        },
        # an older build of the same stage, untagged since
        {"Id": "sha256:old", "RepoTags": ["<none>:<none>"], "Labels": {label: "jupyter"}},
        {"Id": "sha256:other", "RepoTags": ["r/x:1-jupyter"], "Labels": {"other": "jupyter"}},
        {"Id": "sha256:hub", "RepoTags": ["r/hub:0.1"], "Labels": {}},
        {"Id": "sha256:base", "RepoTags": ["debian:trixie-slim"], "Labels": None},
    ]
    assert notebookimage.stage_refs(images, label) == {
        "sha256:aaa": ["r/cuda-pytorch:1-jupyter", "r/cuda-tensorflow:2-jupyter"]
    }


def test_the_archive_is_named_by_image_id():
    assert (
        notebookimage.archive_name("sha256:3cd6e034e239d8ddf0564c3c")
        == "notebook-3cd6e034e239d8dd.tar"
    )


def test_build_steps_make_the_base_then_the_jupyter_stage_on_the_hosts_network():
    steps = notebookimage.build_steps(REPO, ["cuda-pytorch"])
    assert [args for _, args in steps] == [
        ["base"],
        ["build", "--reproducible", "--network", "host", "--target", "jupyter", "cuda-pytorch"],
    ]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("[cuda-pytorch] Step 3/28 : ARG BASE_IMAGE", True),
        ("[cuda-pytorch] Successfully tagged r/cuda-pytorch:1-jupyter", True),
        ("==> building r/cuda-pytorch:1-jupyter", True),
        ("[cuda-pytorch] Collecting jupyterlab==4.6.6", False),
        ("[cuda-pytorch]  ---> Using cache", False),
    ],
)
def test_progress_lines_say_how_far_the_build_is(line, shown):
    assert notebookimage.is_progress_line(line) is shown


def test_an_unreadable_catalog_is_one_sentence(tmp_path):
    """The real tool reads the catalog and says what is wrong with it."""
    bad = tmp_path / "catalog.yaml"
    bad.write_text("images: [")
    with pytest.raises(notebookimage.NotebookImageError) as err:
        notebookimage.catalog_images(bad, REPO)
    assert str(err.value).startswith(f"The catalog {bad} cannot be read: ")
    assert f"gpuspawner-images: {bad}: invalid YAML at line 1" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_archive_is_saved_whole_and_older_ones_go(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from gpuspawner_sandbox import notebookimage

    calls = []

    def docker_save(cmd, **kwargs):
        calls.append(cmd)
        Path(cmd[cmd.index("-o") + 1]).write_bytes(b"tar")
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(notebookimage.subprocess, "run", docker_save)
    monkeypatch.setattr(notebookimage, "need", lambda name: f"/usr/bin/{name}")
    (tmp_path / "z2jh-old.tar").write_bytes(b"old")
    (tmp_path / "notebook-keep.tar").write_bytes(b"other kind")
    archive = tmp_path / "z2jh-new.tar"
    engine = SimpleNamespace(host="unix:///tmp/d.sock")
    notebookimage.save_archive(engine, ["a:1", "b:2"], archive, stale="z2jh-*.tar")
    assert calls == [
        [
            "/usr/bin/docker",
            "-H",
            "unix:///tmp/d.sock",
            "save",
            "-o",
            str(tmp_path / "z2jh-new.partial"),
            "a:1",
            "b:2",
        ]
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notebook-keep.tar", "z2jh-new.tar"]
    assert archive.read_bytes() == b"tar"
