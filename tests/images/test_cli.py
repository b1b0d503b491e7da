"""`gpuspawner-images`, run as users run it: as a process, and in-process with a stand-in engine."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import yaml

from gpuspawner.catalog import load_catalog_file
from gpuspawner.images import cli, engine

from .conftest import REPO
from .fakedocker import FakeClient, FakeEngine


def run_tool(*args: str, cwd=REPO, docker_host: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if docker_host is not None:
        env["DOCKER_HOST"] = docker_host
    return subprocess.run(
        [sys.executable, "-m", "gpuspawner.images.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    "verb", [["build"], ["test"], ["push", "cuda-pytorch"], ["catalog", "--only-built"]]
)
def test_engine_verbs_fail_at_once_without_an_engine(verb, tmp_path):
    host = f"unix://{tmp_path}/docker.sock"  # a socket path that does not exist
    proc = run_tool(*verb, docker_host=host)
    assert proc.returncode == cli.EXIT_UNUSABLE
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"gpuspawner-images: No Docker engine is reachable at {host}")


def test_list_needs_no_engine(matrix, tmp_path):
    proc = run_tool("list", docker_host=f"unix://{tmp_path}/docker.sock")
    assert proc.returncode == 0, proc.stderr
    header, _rule, *rows = proc.stdout.splitlines()
    assert header.split() == [
        "IMAGE:TAG",
        "PROFILE",
        "CUDA",
        "FRAMEWORK",
        "PYTHON",
        "HUB",
        "DRIVER",
    ]
    for spec in matrix.images.values():
        (row,) = [r for r in rows if r.startswith(f"{matrix.registry}/{spec.name}:")]
        assert spec.tag in row and f" {spec.cuda} " in row
        assert f"{spec.framework} {spec.framework_version}" in row
        assert f">= {spec.driver_floor}" in row
    assert any(matrix.hub.name in r and matrix.hub.z2jh_chart in r for r in rows)


def test_catalog_is_accepted_by_the_spawner_catalog_loader(matrix, tmp_path):
    proc = run_tool("catalog", "--registry", "registry.test/gpu")
    assert proc.returncode == 0, proc.stderr
    document = yaml.safe_load(proc.stdout)
    assert list(document) == ["images"]
    document["gpu_types"] = {"h100": {"display_name": "NVIDIA H100"}}
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(document))
    catalog = load_catalog_file(path)
    for spec in matrix.images.values():
        assert catalog.images[spec.profile].image == f"registry.test/gpu/{spec.name}:{spec.tag}"
        assert catalog.images[spec.profile].cuda == spec.cuda


def test_catalog_output_file_and_selection(matrix, tmp_path):
    out = tmp_path / "entries.yaml"
    proc = run_tool("catalog", "cuda-tensorflow", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote 1 catalog entries to {out}"
    assert list(yaml.safe_load(out.read_text())["images"]) == ["tensorflow"]


def test_unknown_image_name_is_one_sentence():
    proc = run_tool("build", "cuda-jax")
    assert proc.returncode == cli.EXIT_UNUSABLE
    assert proc.stderr.strip().splitlines() == [
        "gpuspawner-images: cuda-jax is not an image of "
        f"{REPO / 'images' / 'matrix.yaml'}; known: cuda-pytorch, cuda-tensorflow, hub"
    ]


def test_outside_the_repository_without_matrix(tmp_path):
    proc = run_tool("list", cwd=tmp_path)
    assert proc.returncode == cli.EXIT_UNUSABLE
    assert "no images/matrix.yaml here or in any parent directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_invalid_matrix_is_one_sentence(tmp_path):
    bad = tmp_path / "images" / "matrix.yaml"
    bad.parent.mkdir()
    bad.write_text("registry: r\nimages:\n  x:\n    profile: x\n")
    proc = run_tool("list", "--matrix", str(bad))
    assert proc.returncode == cli.EXIT_UNUSABLE
    assert proc.stderr.strip() == (
        f"gpuspawner-images: {bad}: images.x.display_name is missing or not a string"
    )


# --- in-process, with a stand-in engine ---------------------------------------------


@pytest.fixture
def fake(monkeypatch):
    state = FakeEngine()
    monkeypatch.setattr(engine, "connect", lambda timeout=10: FakeClient(state))
    monkeypatch.chdir(REPO)
    return state


def test_build_prints_progress_and_a_summary(fake, matrix, tmp_path):
    out = io.StringIO()
    catalog = tmp_path / "built.yaml"
    assert cli.main(["build", "--catalog-out", str(catalog)], out) == cli.EXIT_OK
    text = out.getvalue()
    assert [b["dockerfile"] for b in fake.builds] == [s.dockerfile for s in matrix.images.values()]
    assert "[cuda-pytorch] Step 1/30 : ARG BASE_IMAGE=ubuntu:24.04" in text
    summary = text[text.index("IMAGE  ") :].splitlines()
    assert summary[0].split() == ["IMAGE", "CUDA", "SIZE", "TIME", "RESULT"]
    rows = summary[2 : 2 + len(matrix.images)]
    assert all("12.3 GB" in row and row.endswith("ok") for row in rows)
    assert summary[2 + len(matrix.images)] == f"wrote 2 catalog entries to {catalog}"
    assert list(yaml.safe_load(catalog.read_text())["images"]) == ["pytorch", "tensorflow"]


def test_build_failure_is_summarised_and_fails(monkeypatch, matrix, tmp_path):
    state = FakeEngine(
        fail_build={"cuda-tensorflow": "The command 'pip install' returned a non-zero code: 1"}
    )
    monkeypatch.setattr(engine, "connect", lambda timeout=10: FakeClient(state))
    monkeypatch.chdir(REPO)
    out = io.StringIO()
    catalog = tmp_path / "built.yaml"
    assert cli.main(["build", "--catalog-out", str(catalog)], out) == cli.EXIT_FAILED
    text = out.getvalue()
    assert (
        "==> cuda-tensorflow FAILED: The command 'pip install' returned a non-zero code: 1" in text
    )
    # Only what was built goes into the catalog.
    assert list(yaml.safe_load(catalog.read_text())["images"]) == ["pytorch"]


def test_test_verb_says_which_mode(fake, matrix):
    out = io.StringIO()
    assert cli.main(["test", "cuda-pytorch"], out) == cli.EXIT_OK
    assert "CPU-only mode (asserts no GPU is visible)" in out.getvalue()
    assert fake.runs[0]["command"] == ["/usr/local/bin/gpu-smoke-test", "--cpu"]


def test_test_verb_uses_gpus_with_the_nvidia_runtime(monkeypatch, matrix):
    state = FakeEngine(runtimes=("runc", "nvidia"))
    ref = f"{matrix.registry}/cuda-tensorflow:{matrix.images['cuda-tensorflow'].tag}"
    state.test_results[ref] = (1, b"RESULT: FAIL (1 of 3 checks failed)\n")
    monkeypatch.setattr(engine, "connect", lambda timeout=10: FakeClient(state))
    monkeypatch.chdir(REPO)
    out = io.StringIO()
    assert cli.main(["test"], out) == cli.EXIT_FAILED
    text = out.getvalue()
    assert "all GPUs requested" in text
    assert all(r["command"] == ["/usr/local/bin/gpu-smoke-test"] for r in state.runs)
    assert "FAIL (exit 1)" in text


def test_push_pushes_every_tag(fake, matrix):
    out = io.StringIO()
    assert cli.main(["push", "--registry", "registry.test/x"], out) == cli.EXIT_OK
    assert fake.pushes == [(f"registry.test/x/{s.name}", s.tag) for s in matrix.images.values()]


def test_catalog_only_built(fake, matrix):
    spec = matrix.images["cuda-pytorch"]
    fake.present.add(f"{matrix.registry}/{spec.name}:{spec.tag}")
    out = io.StringIO()
    assert cli.main(["catalog", "--only-built"], out) == cli.EXIT_OK
    assert list(yaml.safe_load(out.getvalue())["images"]) == ["pytorch"]


def test_format_helpers():
    assert cli.format_size(999) == "999 B"
    assert cli.format_size(1_500_000) == "1.5 MB"
    assert cli.format_size(12_345_678_901) == "12.3 GB"
    assert cli.format_seconds(59.6) == "1m00s"
    assert cli.format_seconds(5) == "5s"
    table = cli.format_table(["A", "BB"], [["xxx", "y"]]).splitlines()
    assert table == ["A    BB", "---  --", "xxx  y"]
