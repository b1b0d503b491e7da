"""`gpuspawner-images`, run as users run it: as a process, and in-process with a stand-in engine."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest
import yaml

from gpuspawner._version import __version__
from gpuspawner.core.catalog import load_catalog_file
from gpuspawner.images import cli, engine, release
from gpuspawner.images.plan import STAGE_LABEL, STAGES, hub_ref, image_ref

from .conftest import REPO, tool_on_engine
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
    "verb",
    [["build"], ["test"], ["push", "cuda-pytorch"], ["catalog", "--only-built"], ["describe"]],
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


# --- facts: what programs (the sandbox) ask the tool instead of parsing the matrix ----


def test_facts_json_answers_from_the_matrix_and_the_package_version(matrix, tmp_path):
    proc = run_tool("facts", "--json", docker_host=f"unix://{tmp_path}/docker.sock")
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["version"] == __version__
    assert facts["stage_label"] == STAGE_LABEL == "io.gpuspawner.image.stage"
    assert facts["stages"] == list(STAGES) and facts["full_stage"] == STAGES[-1]
    assert facts["hub"] == {
        "name": matrix.hub.name,
        "repository": f"{matrix.registry}/{matrix.hub.name}",
        "tag": __version__,
        "ref": f"{matrix.registry}/{matrix.hub.name}:{__version__}",
        "z2jh_chart": matrix.hub.z2jh_chart,
        "k8s_hub": "quay.io/jupyterhub/k8s-hub:4.4.0",
        "offline_build": ["k8s-hub", matrix.hub.name],
        "jupyterhub": matrix.hub.jupyterhub,
    }
    assert facts["hub"]["ref"] == hub_ref(matrix, __version__)
    assert [i["name"] for i in facts["notebook_images"]] == list(matrix.images)
    for image in facts["notebook_images"]:
        spec = matrix.images[image["name"]]
        assert image["refs"] == {stage: image_ref(matrix, spec, stage=stage) for stage in STAGES}
        assert image["refs"]["jupyter"].endswith(f":{spec.tag}-jupyter")
        assert (image["cuda"], image["driver_floor"]) == (spec.cuda, spec.driver_floor)
    *built, pause = facts["chart_images"]
    assert built == [
        {
            "name": spec.name,
            "ref": matrix.z2jh.ref(spec.name),
            "dockerfile": spec.dockerfile,
            "binaries": list(spec.binaries),
        }
        for spec in matrix.z2jh.images.values()
    ]
    assert pause == {
        "name": "pause",
        "ref": f"{matrix.z2jh.registry}/pause:{matrix.z2jh.pause_tag}",
        "dockerfile": None,
        "binaries": [],
    }
    assert "catalogs" not in facts


def test_facts_without_json_is_the_same_document_as_yaml():
    as_yaml = run_tool("facts")
    as_json = run_tool("facts", "--json")
    assert as_yaml.returncode == as_json.returncode == 0, as_yaml.stderr + as_json.stderr
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


def test_facts_registry_moves_the_hub_and_notebook_images_not_the_charts(matrix):
    facts = json.loads(run_tool("facts", "--json", "--registry", "registry.test/gpu").stdout)
    assert facts["hub"]["ref"] == f"registry.test/gpu/hub:{__version__}"
    assert all(
        ref.startswith("registry.test/gpu/")
        for image in facts["notebook_images"]
        for ref in image["refs"].values()
    )
    assert {i["ref"] for i in facts["chart_images"]} == {
        *(matrix.z2jh.ref(n) for n in matrix.z2jh.images),
        matrix.z2jh.pause_ref,
    }


def test_facts_catalog_lists_the_images_a_catalog_names_as_the_spawner_reads_it(tmp_path):
    sandbox_catalog = REPO / "config" / "sandbox" / "catalog.yaml"
    other = tmp_path / "catalog.yaml"
    other.write_text(
        "images:\n"
        "  a: {display_name: A, image: 'r/b:2'}\n"
        "  b: {display_name: B, image: 'r/a:1'}\n"
        "  c: {display_name: C, image: 'r/a:1'}\n"
    )
    out = io.StringIO()
    code = cli.main(
        ["facts", "--json", "--matrix", str(REPO / "images" / "matrix.yaml"),
         "--catalog", str(sandbox_catalog), "--catalog", str(other)],
        out=out,
    )  # fmt: skip
    assert code == cli.EXIT_OK
    catalogs = json.loads(out.getvalue())["catalogs"]
    expected = sorted({i.image for i in load_catalog_file(sandbox_catalog).images.values()})
    assert catalogs == {str(sandbox_catalog): expected, str(other): ["r/a:1", "r/b:2"]}


def test_facts_of_an_invalid_catalog_is_one_sentence(tmp_path):
    bad = tmp_path / "catalog.yaml"
    bad.write_text("images: [")
    proc = run_tool("facts", "--json", "--catalog", str(bad))
    assert proc.returncode == cli.EXIT_UNUSABLE
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"gpuspawner-images: {bad}: invalid YAML at line 1")


def test_facts_help_says_what_it_answers():
    proc = run_tool("facts", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for words in ("--json", "--catalog FILE", "hub.ref", "stage_label", "chart_images"):
        assert words in text
    assert "facts" in run_tool("--help").stdout


def test_version_prints_the_releases_names_without_an_engine(matrix, tmp_path):
    proc = run_tool("version", "--json", docker_host=f"unix://{tmp_path}/docker.sock")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "package": __version__,
        "chart_version": release.chart_version(__version__),
        "app_version": __version__,
        "hub_image": hub_ref(matrix, __version__),
        "k8s_hub": matrix.hub.k8s_hub_ref,
    }
    text = run_tool("version").stdout
    assert f"chart_version: {release.chart_version(__version__)}\n" in text


def test_version_set_rewrites_the_releases_files_in_that_checkout(tmp_path):
    """Run on a copy: every file that writes the release is rewritten, and says so."""
    for path in [*release.VERSION_FILES, "images/matrix.yaml"]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((REPO / path).read_text())
    matrix = str(tmp_path / "images" / "matrix.yaml")
    proc = run_tool("version", "--set", "0.2.0", "--json", "--matrix", matrix)
    assert proc.returncode == 0, proc.stderr
    written = [line for line in proc.stdout.splitlines() if line.startswith("wrote ")]
    assert written == [f"wrote {path}" for path in release.VERSION_FILES]
    assert json.loads(proc.stdout[proc.stdout.index("{") :])["chart_version"] == "0.2.0"
    assert '__version__ = "0.2.0"' in (tmp_path / "gpuspawner/_version.py").read_text()
    chart = yaml.safe_load((tmp_path / "chart/gpuspawner/Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == ("0.2.0", "0.2.0")
    # a second run finds no literal of this package's release any more: one sentence
    again = run_tool("version", "--set", "0.3.0", "--matrix", matrix)
    assert again.returncode == cli.EXIT_UNUSABLE
    assert again.stderr.strip() == (
        f'gpuspawner-images: gpuspawner/_version.py holds no line `__version__ = "{__version__}"` '
        f"(release {__version__}): set it by hand, then again."
    )


def test_the_k8s_hub_rebuild_is_never_pushed(tmp_path):
    """It carries quay.io's reference: pushing it would try to overwrite z2jh's image."""
    proc = run_tool("push", "k8s-hub", docker_host=f"unix://{tmp_path}/docker.sock")
    assert proc.returncode == cli.EXIT_UNUSABLE
    assert proc.stderr.strip() == (
        "gpuspawner-images: k8s-hub is tagged with z2jh's own reference "
        "(quay.io/jupyterhub/k8s-hub:4.4.0) for the local engine only: it is never pushed"
    )


def test_unknown_image_name_is_one_sentence():
    proc = run_tool("build", "cuda-jax")
    assert proc.returncode == cli.EXIT_UNUSABLE
    assert proc.stderr.strip().splitlines() == [
        "gpuspawner-images: cuda-jax is not an image of "
        f"{REPO / 'images' / 'matrix.yaml'}; known: cuda-pytorch, cuda-tensorflow, k8s-hub, hub, "
        "validation, configurable-http-proxy, network-tools, image-awaiter, kube-scheduler"
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


# The verbs against the real engine: a private dockerd (gpuspawner_sandbox.dockerd).


def test_build_prints_what_it_builds_progress_and_a_summary(built, matrix):
    text = built
    for spec in matrix.images.values():
        ref = image_ref(matrix, spec, stage="jupyter")
        assert f"==> building {ref} from {spec.dockerfile} (stage jupyter)" in text
    assert "[cuda-pytorch] Step 1/" in text and "[hub] Step 1/" in text
    # the k8s-hub rebuild first, under quay.io's reference, then the hub FROM it
    rebuild = f"==> building {matrix.hub.k8s_hub_ref} from {matrix.hub.rebuild_dockerfile}"
    assert text.index(rebuild) < text.index(f"==> building {hub_ref(matrix, __version__)}")
    summary = text[text.rindex("IMAGE  ") :].splitlines()
    assert summary[0].split() == ["IMAGE", "CUDA", "SIZE", "TIME", "RESULT"]
    rows = summary[2:]
    assert len(rows) == len(matrix.images) + 2
    assert all(row.endswith("ok") and (" MB" in row or " GB" in row) for row in rows)


def test_build_failure_is_summarised_and_fails(engine, built, tmp_path):
    """A Dockerfile whose RUN fails: the engine's message, a summary row, exit 1."""
    (tmp_path / "images" / "broken").mkdir(parents=True)
    (tmp_path / "images" / "broken" / "Dockerfile").write_text(
        "ARG BASE_IMAGE=debian:trixie-slim\nFROM ${BASE_IMAGE} AS base\n"
        "FROM base AS jupyter\nRUN echo about to fail && exit 3\nFROM jupyter AS framework\n"
    )
    raw = yaml.safe_load((REPO / "images" / "matrix.yaml").read_text())
    raw["images"] = {
        "broken": {
            **raw["images"]["cuda-pytorch"],
            "dockerfile": "images/broken/Dockerfile",
            "constraints": None,
        }
    }
    (tmp_path / "images" / "matrix.yaml").write_text(yaml.safe_dump(raw))
    proc = tool_on_engine(
        engine.host, "build", "--matrix", str(tmp_path / "images" / "matrix.yaml"),
        "--target", "jupyter", "--network", "none",
    )  # fmt: skip
    assert proc.returncode == cli.EXIT_FAILED
    assert "[broken] about to fail" in proc.stdout
    assert (
        "==> broken FAILED: The command '/bin/sh -c echo about to fail && exit 3' returned a non-zero code: 3"
        in proc.stdout
    )
    assert "Traceback" not in proc.stdout


def test_test_verb_starts_the_jupyter_stage_and_waits_until_healthy(engine, built, matrix):
    proc = tool_on_engine(engine.host, "test", "--target", "jupyter", *matrix.images)
    assert proc.returncode == cli.EXIT_OK, proc.stdout[-3000:]
    assert "the jupyter stage has no framework: started alone, it must turn healthy" in proc.stdout
    assert "health: healthy" in proc.stdout
    table = proc.stdout[proc.stdout.rindex("IMAGE  ") :].splitlines()[2:]
    assert [row.split()[1:] for row in table] == [["serve", "pass"]] * len(matrix.images)


def test_test_verb_fails_on_an_image_that_never_turns_healthy(engine, built, docker_client, matrix):
    """The same verb on an image whose server cannot start: the test fails."""
    spec = matrix.images["cuda-pytorch"]
    ref = image_ref(matrix, spec, registry="127.0.0.1:1/broken", stage="jupyter")
    source = image_ref(matrix, spec, stage="jupyter")
    healthcheck = dict(docker_client.images.get(source).attrs["Config"]["Healthcheck"])
    # The image's own check, without its 60 s start period (the verdict would
    # otherwise wait for it): every second, unhealthy after two failures. (A
    # StartPeriod of 0 would mean "the image's" to docker commit: 1 ms is its least.)
    healthcheck.update(StartPeriod=1_000_000, Interval=1_000_000_000, Retries=2)
    container = docker_client.containers.create(source, entrypoint=["true"])
    try:
        # The healthcheck stays; the server never starts (the entry point only sleeps).
        repo, tag = ref.rsplit(":", 1)
        conf = {"Entrypoint": ["sleep", "600"], "Healthcheck": healthcheck}
        container.commit(repository=repo, tag=tag, conf=conf)
    finally:
        container.remove(force=True)
    proc = tool_on_engine(
        engine.host, "test", "--target", "jupyter", "--registry", "127.0.0.1:1/broken",
        "cuda-pytorch",
    )  # fmt: skip
    docker_client.images.remove(ref, force=True)
    assert proc.returncode == cli.EXIT_FAILED
    assert "health: unhealthy" in proc.stdout


def test_push_sends_the_images_to_a_local_registry(engine, built, registry, docker_client, matrix):
    target = f"{registry.address}/gpuspawner"
    pushed = [image_ref(matrix, spec, target, stage="jupyter") for spec in matrix.images.values()]
    for spec, ref in zip(matrix.images.values(), pushed, strict=True):
        image = docker_client.images.get(image_ref(matrix, spec, stage="jupyter"))
        image.tag(*ref.rsplit(":", 1))
    try:
        proc = tool_on_engine(engine.host, "push", "--registry", target, "--target", "jupyter")
    finally:
        # The engine's data root is kept across runs: leave no tags for a registry that is gone.
        for ref in pushed:
            docker_client.images.remove(ref)
    assert proc.returncode == cli.EXIT_OK, proc.stdout[-3000:]
    for spec in matrix.images.values():
        ref = image_ref(matrix, spec, target, stage="jupyter")
        assert re.search(rf"==> pushed {re.escape(ref)} sha256:[0-9a-f]{{64}}", proc.stdout)
        url = f"http://{registry.address}/v2/gpuspawner/{spec.name}/tags/list"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert json.load(resp)["tags"] == [ref.rsplit(":", 1)[1]]


def test_push_of_an_unbuilt_image_fails_with_the_engines_reason(engine, built, registry):
    proc = tool_on_engine(engine.host, "push", "--registry", f"{registry.address}/never-built")
    assert proc.returncode == cli.EXIT_FAILED
    assert "FAILED: " in proc.stdout and "Traceback" not in proc.stdout


def test_catalog_only_built_asks_the_engine(engine, built, matrix):
    """No image is built under this registry (the engine's data root may keep the full
    images of a `make full-images`): a one-sentence refusal."""
    proc = tool_on_engine(
        engine.host, "catalog", "--only-built", "--registry", "127.0.0.1:1/never-built"
    )
    assert proc.returncode == cli.EXIT_FAILED
    assert "none of these images is built yet" in proc.stdout


def test_test_verb_uses_gpus_with_the_nvidia_runtime(monkeypatch, matrix):
    """An engine with the NVIDIA runtime cannot run here (no GPU): its answers are stood in."""
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


def test_format_helpers():
    assert cli.format_size(999) == "999 B"
    assert cli.format_size(1_500_000) == "1.5 MB"
    assert cli.format_size(12_345_678_901) == "12.3 GB"
    assert cli.format_seconds(59.6) == "1m00s"
    assert cli.format_seconds(5) == "5s"
    table = cli.format_table(["A", "BB"], [["xxx", "y"]]).splitlines()
    assert table == ["A    BB", "---  --", "xxx  y"]


def test_build_date_is_source_date_epoch_when_set_so_rebuilds_keep_the_image_id():
    from gpuspawner.images.cli import build_date

    assert build_date({"SOURCE_DATE_EPOCH": "1764571200"}) == "2025-12-01T06:40:00Z"
    now = build_date({})
    assert now != "2025-12-01T06:40:00Z" and now.endswith("Z") and len(now) == 20
    # not a number: the current time, as without it
    assert build_date({"SOURCE_DATE_EPOCH": "yesterday"})[:4] == now[:4]
    # --reproducible: the revision's commit time, unless SOURCE_DATE_EPOCH says otherwise
    assert build_date({}, 1764571200) == "2025-12-01T06:40:00Z"
    assert build_date({"SOURCE_DATE_EPOCH": "0"}, 1764571200) == "1970-01-01T00:00:00Z"


def test_an_images_revision_is_the_last_commit_that_changed_its_sources(tmp_path):
    from gpuspawner.images.cli import image_provenance

    def git(*args, when="1764571200"):
        env = {
            **os.environ,
            "GIT_AUTHOR_DATE": f"@{when} +0000",
            "GIT_COMMITTER_DATE": f"@{when} +0000",
        }
        out = subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True, capture_output=True, text=True, env=env,
        )  # fmt: skip
        return out.stdout.strip()

    git("init", "-q")
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "Dockerfile").write_text("FROM scratch\n")
    git("add", ".")
    git("commit", "-q", "-m", "image")
    image_commit = git("rev-parse", "--short=12", "HEAD")
    (tmp_path / "README").write_text("elsewhere\n")
    git("add", ".")
    git("commit", "-q", "-m", "elsewhere", when="1764657600")

    made = image_provenance(tmp_path, ("image",), {}, reproducible=True)
    # a commit elsewhere changes neither the revision nor the date
    assert made.revision == image_commit != git("rev-parse", "--short=12", "HEAD")
    assert made.created == "2025-12-01T06:40:00Z"
    assert image_provenance(tmp_path, ("image",), {}, reproducible=False).created != made.created

    (tmp_path / "image" / "Dockerfile").write_text("FROM scratch\nLABEL x=y\n")
    assert image_provenance(tmp_path, ("image",), {}, True).revision == f"{image_commit}-dirty"
    # sources no commit has touched: said, not guessed
    outside = image_provenance(tmp_path / "image", ("nothing",), {}, True)
    assert outside.revision == "unknown"


# --- describe ------------------------------------------------------------------------


def probe_answer(versions: dict[str, str | None], python: str = "3.13.5") -> bytes:
    from gpuspawner.images.describe import MARKER

    return f"{MARKER}{json.dumps({'python': python, 'versions': versions})}\n".encode()


def installed_as_pinned(spec) -> dict[str, str]:
    from gpuspawner.images.describe import expected_packages
    from gpuspawner.images.matrix import read_constraints

    pins = read_constraints((REPO / spec.constraints).read_text())
    return {e.name: e.version for e in expected_packages(spec, "framework", pins)}


def test_describe_lists_every_library_with_its_installed_version(fake, matrix):
    for spec in matrix.images.values():
        ref = image_ref(matrix, spec)
        fake.present.add(ref)
        fake.labels[ref] = {
            "io.gpuspawner.image.framework": f"{spec.framework}=={spec.framework_version}",
            "io.gpuspawner.image.cuda": spec.cuda,
        }
        fake.test_results[ref] = (0, probe_answer(installed_as_pinned(spec)))
    out = io.StringIO()
    assert cli.main(["describe"], out) == cli.EXIT_OK
    text = out.getvalue()
    for spec in matrix.images.values():
        assert f"==> {image_ref(matrix, spec)} ({spec.name}, stage framework)" in text
        assert f"framework {spec.framework}=={spec.framework_version}  CUDA {spec.cuda}" in text
        for name, version in installed_as_pinned(spec).items():
            assert re.search(rf"^\s+{re.escape(name)}\s+\w+\s+{re.escape(version)}\s", text, re.M)
    # The probe ran python in a throwaway container: no start.sh, no network.
    assert len(fake.runs) == len(matrix.images)
    for run in fake.runs:
        assert run["entrypoint"] == ["python"] and run["network_mode"] == "none"
        assert run["command"][0] == "-c"
    assert all(c.removed for c in fake.containers)


def test_describe_reports_a_missing_library_and_fails(fake, matrix, capsys):
    spec = matrix.images["cuda-pytorch"]
    ref = image_ref(matrix, spec)
    fake.present.add(ref)
    versions = installed_as_pinned(spec)
    versions["torchvision"] = None
    fake.test_results[ref] = (0, probe_answer(versions))
    out = io.StringIO()
    assert cli.main(["describe", "--json", "cuda-pytorch"], out) == cli.EXIT_FAILED
    (image,) = json.loads(out.getvalue())["images"]
    assert image["ok"] is False
    (tv,) = [p for p in image["packages"] if p["name"] == "torchvision"]
    assert (tv["status"], tv["version"], tv["role"]) == ("missing", None, "library")
    assert capsys.readouterr().err == (
        f"gpuspawner-images: {ref}: torchvision (library) is not installed\n"
    )


def test_build_k8s_hub_hub_tags_the_rebuild_as_quay_s_then_builds_the_hub_on_it(fake, matrix):
    """Offline: the rebuild first, under z2jh's reference, with z2jh's requirements in its
    context; then the hub, whose FROM is that reference, never pulled even with --pull."""
    out = io.StringIO()
    assert cli.main(["build", "k8s-hub", "hub", "--pull"], out) == cli.EXIT_OK
    rebuild, hub = fake.builds
    assert (rebuild["tag"], rebuild["dockerfile"]) == (
        "quay.io/jupyterhub/k8s-hub:4.4.0",
        "images/k8s-hub/Dockerfile",
    )
    assert rebuild["pull"] is True and hub["pull"] is False
    assert hub["tag"] == hub_ref(matrix, __version__)
    assert hub["buildargs"]["K8S_HUB_IMAGE"] == rebuild["tag"]
    assert "is not in the engine" not in out.getvalue()


def test_build_hub_alone_says_it_will_pull_k8s_hub_when_the_engine_lacks_it(fake, matrix):
    out = io.StringIO()
    assert cli.main(["build", "hub"], out) == cli.EXIT_OK
    assert out.getvalue().splitlines()[0] == (
        "==> quay.io/jupyterhub/k8s-hub:4.4.0 is not in the engine: the hub's build pulls it "
        "(where no registry is reachable, build k8s-hub hub instead)"
    )
    (hub,) = fake.builds
    assert "z2jh-requirements" not in str(hub)
    fake.present.add(matrix.hub.k8s_hub_ref)
    again = io.StringIO()
    assert cli.main(["build", "hub"], again) == cli.EXIT_OK
    assert "is not in the engine" not in again.getvalue()


def test_describe_of_an_image_not_built_says_so(fake, matrix, capsys):
    out = io.StringIO()
    assert cli.main(["describe", "cuda-tensorflow"], out) == cli.EXIT_FAILED
    ref = image_ref(matrix, matrix.images["cuda-tensorflow"])
    assert "not built (run gpuspawner-images build)" in out.getvalue()
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpuspawner-images: {ref}: not built (run gpuspawner-images build)"
    ]
    assert fake.runs == []


def test_describe_escapes_what_the_image_says(fake, matrix):
    spec = matrix.images["cuda-tensorflow"]
    ref = image_ref(matrix, spec)
    fake.present.add(ref)
    fake.labels[ref] = {"io.gpuspawner.image.cuda": "12.9\x1b[31m"}
    fake.test_results[ref] = (0, probe_answer({"tensorflow": "2.21.0\x1b[2J"}))
    out = io.StringIO()
    assert cli.main(["describe", "cuda-tensorflow"], out) == cli.EXIT_FAILED
    assert "\x1b" not in out.getvalue()
    assert "CUDA 12.9?[31m" in out.getvalue()


def test_describe_when_python_fails_in_the_image_is_one_sentence(fake, matrix, capsys):
    spec = matrix.images["cuda-pytorch"]
    ref = image_ref(matrix, spec)
    fake.present.add(ref)
    fake.test_results[ref] = (127, b"exec: python: not found\n")
    out = io.StringIO()
    assert cli.main(["describe", "cuda-pytorch"], out) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"gpuspawner-images: {ref}: python exited with 127: the probe printed")
    assert "Traceback" not in err + out.getvalue()


def test_describe_the_jupyter_stage_on_the_real_engine(engine, built, matrix):
    """The CI-built jupyter stages: the server's packages at the matrix's versions, and
    no framework or library expected (they come with the framework stage)."""
    proc = tool_on_engine(engine.host, "describe", "--target", "jupyter", "--json")
    assert proc.returncode == cli.EXIT_OK, proc.stdout[-3000:]
    document = json.loads(proc.stdout)
    assert [i["name"] for i in document["images"]] == list(matrix.images)
    for image, spec in zip(document["images"], matrix.images.values(), strict=True):
        assert image["image"] == image_ref(matrix, spec, stage="jupyter")
        assert image["python"].startswith(spec.python + ".")
        assert {p["name"]: (p["version"], p["status"]) for p in image["packages"]} == {
            "jupyterhub": (spec.jupyterhub, "ok"),
            "jupyterlab": (spec.jupyterlab, "ok"),
            "notebook": (spec.notebook, "ok"),
        }
        assert image["framework"] is None  # the framework's labels come with its stage
        assert image["labels"]["io.gpuspawner.image.jupyterlab"] == spec.jupyterlab


def test_describe_an_image_the_real_engine_lacks(engine, built, matrix):
    """Describing an image never built is a refusal per image, not a crash."""
    registry = "127.0.0.1:1/never-built"
    proc = tool_on_engine(engine.host, "describe", "--registry", registry, "cuda-pytorch")
    assert proc.returncode == cli.EXIT_FAILED
    ref = image_ref(matrix, matrix.images["cuda-pytorch"], registry)
    assert f"gpuspawner-images: {ref}: not built (run gpuspawner-images build)" in proc.stdout
    assert "Traceback" not in proc.stdout
