"""zero-to-jupyterhub's other images (images/z2jh): what the matrix says, and the real
images, built on the private engine (gpuspawner_sandbox.chartimages) and run there."""

from __future__ import annotations

import json
import sys
import time

import pytest
import yaml

import gpuspawner
from gpuspawner.images.matrix import MatrixError, parse_matrix
from gpuspawner.images.plan import Provenance, base_images, plan_builds
from gpuspawner_sandbox import (
    build,
    chartimages,
    helm,
    imagefacts,
    nodebuild,
    nodes,
    ociimage,
    testing,
)

from .conftest import CACHE, REPO, tool_on_engine

CHP_PACKAGE = REPO / "images" / "z2jh" / "configurable-http-proxy" / "package.json"


@pytest.fixture
def raw():
    return yaml.safe_load((REPO / "images" / "matrix.yaml").read_text())


# --- the matrix (pure) ---------------------------------------------------------------


def test_the_sandbox_reads_the_same_refs_as_the_image_tool(matrix):
    """The sandbox asks the real tool (`gpuspawner-images facts --json`): the matrix's refs."""
    images = chartimages.load_chart_images()
    built = {i.name: i.ref for i in images}
    assert built == {
        **{name: matrix.z2jh.ref(name) for name in matrix.z2jh.images},
        "pause": f"gpuspawner.invalid/z2jh/pause:{matrix.z2jh.pause_tag}",
    }
    assert all(ref.startswith("gpuspawner.invalid/z2jh/") for ref in built.values())
    assert chartimages.pause_image(images).ref == matrix.z2jh.pause_ref
    assert {i.name: i.binaries for i in images if i.binaries} == {
        "image-awaiter": ("image-awaiter",),
        "kube-scheduler": ("k8s",),
    }


def test_versions_agree_with_what_the_images_are_built_from(matrix):
    go_mod = (build.GO_MODULE_DIR / "go.mod").read_text()
    assert matrix.z2jh.images["kube-scheduler"].tag == build.kubernetes_version(go_mod)
    chp = json.loads(CHP_PACKAGE.read_text())["dependencies"]["configurable-http-proxy"]
    assert matrix.z2jh.images["configurable-http-proxy"].tag == chp
    lock = json.loads(CHP_PACKAGE.with_name("package-lock.json").read_text())
    assert lock["packages"]["node_modules/configurable-http-proxy"]["version"] == chp


def test_chart_builds_send_their_host_built_programs(matrix):
    steps = plan_builds(
        matrix,
        ["kube-scheduler", "image-awaiter", "network-tools"],
        context="/repo",
        binaries={"k8s": "/bin/k8s", "image-awaiter": "/bin/ia"},
        provenance={"network-tools": Provenance("abc", "2026-12-01T00:00:00Z")},
    )
    by_name = {s.name: s for s in steps}
    assert by_name["kube-scheduler"].refs == ["gpuspawner.invalid/z2jh/kube-scheduler:v1.37.2"]
    assert by_name["kube-scheduler"].extra_files == {"images/z2jh/kube-scheduler/k8s": "/bin/k8s"}
    assert by_name["kube-scheduler"].buildargs["BASE_IMAGE"] == "debian:trixie-slim"
    assert by_name["image-awaiter"].extra_files == {
        "images/z2jh/image-awaiter/image-awaiter": "/bin/ia"
    }
    assert "BASE_IMAGE" not in by_name["image-awaiter"].buildargs  # FROM scratch
    assert by_name["network-tools"].extra_files == {}
    versions = {s.labels["org.opencontainers.image.version"] for s in steps}
    assert versions == {"v1.37.2", "4.4.0"}
    assert by_name["image-awaiter"].labels["org.opencontainers.image.base.name"] == "scratch"
    assert by_name["network-tools"].labels["org.opencontainers.image.created"] == (
        "2026-12-01T00:00:00Z"
    )
    # naming only chart images builds no notebook image
    assert len(steps) == 3
    assert base_images(matrix) == ["debian:trixie-slim"]


def test_a_chart_build_without_its_program_is_one_sentence(matrix):
    with pytest.raises(
        MatrixError, match=r"kube-scheduler copies the host-built k8s: pass --binary"
    ):
        plan_builds(matrix, ["kube-scheduler"], context="/repo")


def test_chart_image_names_must_not_clash(raw):
    raw["z2jh"]["images"]["hub"] = {"dockerfile": "x/Dockerfile", "tag": "1"}
    with pytest.raises(MatrixError, match=r"z2jh\.images hub clash"):
        parse_matrix(raw)


def test_the_hub_image_is_the_one_the_values_files_name_later_files_winning():
    admin = {"hub": {"image": {"name": "registry.example.org/gpuspawner/hub", "tag": "0.1.0"}}}
    local = {"hub": {"image": {"tag": "0.1.0.dev0", "pullPolicy": "Never"}}}
    assert chartimages.hub_ref([admin, local]) == "registry.example.org/gpuspawner/hub:0.1.0.dev0"
    assert chartimages.hub_ref([local, admin]) == "registry.example.org/gpuspawner/hub:0.1.0"
    with pytest.raises(chartimages.ChartImageError, match="no hub image"):
        chartimages.hub_ref([local])


def test_the_repositorys_values_files_name_the_hub_image_the_tool_builds(matrix):
    """Helm reads config/sandbox/z2jh-local-values.yaml as it is: its hub tag must be the
    image tool's answer (the package version), which the real program gives."""
    docs = [yaml.safe_load(p.read_text()) for p in chartimages.HUB_VALUES]
    answer = imagefacts.image_facts(REPO).hub_ref
    assert answer == f"{matrix.registry}/{matrix.hub.name}:{gpuspawner.__version__}"
    assert chartimages.hub_ref(docs) == answer
    chartimages.check_hub_values(answer, docs)


def test_values_naming_another_hub_tag_than_the_tools_are_refused():
    admin = {"hub": {"image": {"name": "registry.example.org/gpuspawner/hub", "tag": "0.1.0"}}}
    local = {"hub": {"image": {"tag": "0.0.9"}}}
    with pytest.raises(chartimages.ChartImageError) as err:
        chartimages.check_hub_values(
            "registry.example.org/gpuspawner/hub:0.1.0.dev0", [admin, local]
        )
    assert "name the hub image registry.example.org/gpuspawner/hub:0.0.9" in str(err.value)
    assert "set hub.image.tag in" in str(err.value) and "'0.1.0.dev0'" in str(err.value)


def test_the_deploy_archive_changes_name_when_any_image_changes():
    ids = {"a:1": "sha256:aa", "b:1": "sha256:bb"}
    name = chartimages.deploy_archive_name(ids)
    assert name.startswith("z2jh-") and name.endswith(".tar")
    assert chartimages.deploy_archive_name(dict(reversed(ids.items()))) == name
    assert chartimages.deploy_archive_name({**ids, "b:1": "sha256:cc"}) != name
    assert chartimages.deploy_archive_name({**ids, "c:1": "sha256:bb"}) != name


def test_the_tool_builds_every_chart_image_but_pause():
    images = chartimages.load_chart_images()
    args = chartimages.tool_build_args(
        images, {"k8s": "/c/k8s", "image-awaiter": "/c/ia", "pause": "/c/programs"}
    )
    assert args == [
        "build", "--reproducible", "--network", "host",
        "configurable-http-proxy", "network-tools", "image-awaiter", "kube-scheduler",
        "--binary=image-awaiter=/c/ia", "--binary=k8s=/c/k8s",
    ]  # fmt: skip
    with pytest.raises(chartimages.ChartImageError, match="No host-built program for k8s"):
        chartimages.tool_build_args(images, {"image-awaiter": "/c/ia"})


# --- the real images ------------------------------------------------------------------


def _emit(line: str) -> None:
    sys.__stderr__.write(line + "\n")


@pytest.fixture(scope="package")
def chart_built(engine):
    """Every chart image, built on the private engine on the Debian base (cached)."""
    if not (chartimages.IMAGE_AWAITER.module_dir / "go.mod").is_file():
        testing.third_party_missing(
            f"Z2JH'S IMAGE SOURCES ARE MISSING at {helm.Z2JH_SOURCE} (a copy of shared/ "
            "beside the clone), so the chart's images are not built"
        )
    base = tool_on_engine(engine.host, "base")
    assert base.returncode == 0, base.stdout[-3000:]
    try:
        images = chartimages.build_chart_images(
            engine,
            REPO,
            _emit,
            log_path=CACHE / "chart-images-build.log",
            build_out=sys.__stderr__,  # a cold `k8s` build takes minutes: show its progress
        )
    except build.GoMissing as e:
        testing.sandbox_unavailable(str(e))
    return {i.name: i.ref for i in images}


def run(client, ref: str, command=None, **kwargs) -> tuple[int, str]:
    """Run a container to its end with no network; (exit code, output)."""
    container = client.containers.run(ref, command, detach=True, network_mode="none", **kwargs)
    try:
        code = container.wait(timeout=120)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_chp_runs_the_charts_command_and_answers_on_its_api_port(docker_client, chart_built):
    ref = chart_built["configurable-http-proxy"]
    config = docker_client.images.get(ref).attrs["Config"]
    assert config["User"] == "65534"
    assert set(config["ExposedPorts"]) == {"8000/tcp", "8001/tcp"}
    code, out = run(docker_client, ref, ["--version"])
    assert (code, out.strip()) == (0, "5.2.0")
    # the proxy pod's command line (templates/proxy/deployment.yaml), on the container's loopback
    chart_command = [
        "configurable-http-proxy", "--ip=", "--api-ip=", "--api-port=8001",
        "--default-target=http://127.0.0.1:9", "--error-target=http://127.0.0.1:9/hub/error",
        "--port=8000",
    ]  # fmt: skip
    container = docker_client.containers.run(
        ref,
        entrypoint=chart_command[:1],
        command=chart_command[1:],
        environment={"CONFIGPROXY_AUTH_TOKEN": "secret"},
        detach=True,
        network_mode="none",
    )
    probe = (
        "fetch('http://127.0.0.1:8001/api/routes', {headers: {Authorization: 'token secret'}})"
        ".then(r => r.text().then(t => { console.log(r.status, t); process.exit(r.ok ? 0 : 1) }))"
        ".catch(e => { console.log(String(e)); process.exit(1) })"
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            code, out = container.exec_run(["node", "-e", probe])
            if code == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        logs = container.logs().decode(errors="replace")
        assert code == 0, out.decode() + logs
        status, routes = out.decode().split(" ", 1)
        assert status == "200"
        assert json.loads(routes)["/"]["target"] == "http://127.0.0.1:9"
    finally:
        container.remove(force=True)


def test_network_tools_blocks_the_metadata_server_with_legacy_iptables(docker_client, chart_built):
    ref = chart_built["network-tools"]
    code, out = run(docker_client, ref, ["iptables", "--version"])
    assert code == 0 and "(legacy)" in out, out
    # the chart's block-cloud-metadata init container's command, in a network namespace
    # of its own (--network none): the host's rules are not touched
    rule = [
        "--append", "OUTPUT", "--protocol", "tcp", "--destination", "169.254.169.254",
        "--destination-port", "80", "--jump", "DROP",
    ]  # fmt: skip
    code, out = run(
        docker_client,
        ref,
        ["sh", "-c", f"iptables {' '.join(rule)} && iptables -S OUTPUT"],
        # the chart runs it privileged; NET_ADMIN is what iptables needs (and all this
        # machine's runtime can grant: "privileged" asks for capabilities it may not hold)
        cap_add=["NET_ADMIN", "NET_RAW"],
    )
    assert code == 0, out
    assert "-A OUTPUT -d 169.254.169.254/32 -p tcp -m tcp --dport 80 -j DROP" in out


def test_image_awaiter_runs_from_scratch(docker_client, chart_built):
    ref = chart_built["image-awaiter"]
    code, out = run(docker_client, ref, ["/image-awaiter", "-help"])
    assert code == 0, out
    assert "-daemonset string" in out and "-namespace string" in out
    layers = docker_client.images.get(ref).attrs["RootFS"]["Layers"]
    assert len(layers) == 1  # FROM scratch: the program alone


def test_kube_scheduler_wrapper_is_the_control_planes_scheduler(docker_client, chart_built):
    ref = chart_built["kube-scheduler"]
    version = build.kubernetes_version((build.GO_MODULE_DIR / "go.mod").read_text())
    code, out = run(docker_client, ref, ["/usr/local/bin/kube-scheduler", "--version"])
    assert (code, out.strip()) == (0, f"Kubernetes {version}")
    assert ref.endswith(f":{version}")
    assert docker_client.images.get(ref).attrs["Config"]["User"] == "65534"


def test_pause_is_the_real_nodes_pause_image(docker_client, chart_built):
    ref = chart_built["pause"]
    programs = nodebuild.build_image_programs()
    spec = nodes.pause_spec(ref, programs, nodebuild.go_arch())
    assert docker_client.images.get(ref).id == ociimage.image_id(spec)
    container = docker_client.containers.run(ref, detach=True, network_mode="none")
    try:
        time.sleep(1)
        container.reload()
        assert container.status == "running"
        container.stop(timeout=10)  # SIGTERM: pause exits 0 at once
        assert container.wait(timeout=30)["StatusCode"] == 0
    finally:
        container.remove(force=True)


def test_a_rebuild_of_unchanged_sources_builds_nothing(engine, docker_client, chart_built):
    before = {name: docker_client.images.get(ref).id for name, ref in chart_built.items()}
    lines: list[str] = []
    started = time.monotonic()
    chartimages.build_chart_images(
        engine, REPO, lines.append, log_path=CACHE / "chart-images-rebuild.log"
    )
    seconds = time.monotonic() - started
    after = {name: docker_client.images.get(ref).id for name, ref in chart_built.items()}
    assert after == before
    log = (CACHE / "chart-images-rebuild.log").read_text()
    assert "Using cache" in log
    assert " ---> Running in " not in log, "a step ran again"
    assert any("(cached)" in line for line in lines)
    _emit(f"chart images: cached rebuild took {seconds:.0f}s")
