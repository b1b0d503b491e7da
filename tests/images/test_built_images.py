"""The notebook images' jupyter stage and the hub image, built and run on a real Docker engine.

The session's `built` fixture makes the Debian base with debootstrap and builds the
images with `gpuspawner-images` against a private dockerd (gpuspawner_sandbox.dockerd);
every test here then runs a container the way a user or the spawner would.
Only the GPU and its driver are emulated: an `nvidia-smi` that prints recorded
real output (tests/fixtures/nvidia-smi) is mounted where the driver's would be.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
from packaging.utils import canonicalize_name

from gpuspawner.core.labels import IMAGE_LABEL_CUDA, IMAGE_LABEL_DRIVER_FLOOR, IMAGE_LABEL_FRAMEWORK
from gpuspawner.images.plan import STAGE_LABEL, image_ref
from gpuspawner.validation.command import check_command
from gpuspawner_sandbox.hubprocess import free_port, start_hub

from .conftest import FIXTURES, REPO

NOTEBOOKS = ["cuda-pytorch", "cuda-tensorflow"]
JUPYTERHUB_LABEL = "io.gpuspawner.image.jupyterhub"


@pytest.fixture(params=NOTEBOOKS)
def notebook(request, built, matrix):
    """(matrix spec, image reference) of one notebook image's jupyter stage."""
    spec = matrix.images[request.param]
    return spec, image_ref(matrix, spec, stage="jupyter")


def run(client, image, command=None, stdout_only=False, **kwargs):
    """Run a container to completion: (exit code, output). Network: none unless given.

    `stdout_only`: the command's output without start.sh's messages (stderr), whose
    lines the engine's log may interleave with it in any order.
    """
    kwargs.setdefault("network_mode", "none")
    container = client.containers.run(image, command, detach=True, **kwargs)
    try:
        status = container.wait(timeout=300)
        logs = container.logs(stdout=True, stderr=not stdout_only)
        return status["StatusCode"], logs.decode("utf-8", "replace")
    finally:
        container.remove(force=True)


def wait_health(container, timeout=240):
    """The container's health once it is no longer 'starting' (or the last seen)."""
    deadline = time.monotonic() + timeout
    status = "starting"
    while time.monotonic() < deadline:
        container.reload()
        state = container.attrs["State"]
        if not state.get("Running"):
            return "exited: " + container.logs().decode("utf-8", "replace")[-2000:]
        status = state["Health"]["Status"]
        if status != "starting":
            return status
        time.sleep(2)
    return status


def test_user_is_jovyan_1000_100_with_a_writable_home(docker_client, notebook):
    _, image = notebook
    rc, out = run(
        docker_client,
        image,
        ["bash", "-c", "id -un; id -u; id -g; echo $HOME; touch ~/probe && echo home-writable"],
        stdout_only=True,
    )
    assert rc == 0, out
    assert out.split() == ["jovyan", "1000", "100", "/home/jovyan", "home-writable"]


def test_any_uid_in_group_100_can_install_into_the_environment(docker_client, notebook):
    """What `pip install` needs: new files in site-packages and bin/, as an arbitrary uid."""
    _, image = notebook
    script = (
        "site=$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
        "mkdir $site/probe_pkg && touch $site/probe_pkg/__init__.py $VIRTUAL_ENV/bin/probe "
        "&& python -c 'import probe_pkg; print(\"importable\")'"
    )
    rc, out = run(docker_client, image, ["start.sh", "bash", "-c", script], user="4321:100")
    assert rc == 0, out
    assert "importable" in out


def test_an_arbitrary_uid_in_group_0_gets_a_passwd_entry(docker_client, notebook):
    """As docker-stacks (OpenShift's arbitrary uid runs in group 0): /etc/passwd is
    writable by group 0 only, so start.sh names the uid; in group 100 it only warns."""
    _, image = notebook
    rc, out = run(docker_client, image, ["start.sh", "whoami"], user="4321:0", stdout_only=True)
    assert (rc, out.strip()) == (0, "jovyan"), out
    rc, out = run(docker_client, image, ["start.sh", "true"], user="4321:100")
    assert rc == 0
    assert "WARNING: uid 4321 has no passwd entry and /etc/passwd is not writable" in out


def test_hooks_run_before_the_command(docker_client, notebook, tmp_path):
    _, image = notebook
    start = tmp_path / "start-notebook.d"
    before = tmp_path / "before-notebook.d"
    start.mkdir()
    before.mkdir()
    (start / "10-export.sh").write_text("export HOOK_START=sourced-$(id -u)\n")
    exe = before / "20-touch"
    exe.write_text("#!/bin/bash\necho before-ran > /tmp/before-hook\n")
    exe.chmod(0o755)
    (before / "30-not-executable").write_text("#!/bin/bash\nexit 1\n")
    rc, out = run(
        docker_client,
        image,
        ["start.sh", "bash", "-c", 'echo "start=$HOOK_START"; cat /tmp/before-hook'],
        volumes={
            str(start): {"bind": "/usr/local/bin/start-notebook.d", "mode": "ro"},
            str(before): {"bind": "/usr/local/bin/before-notebook.d", "mode": "ro"},
        },
    )
    assert rc == 0, out
    assert "start=sourced-1000" in out
    assert "before-ran" in out
    assert "Ignoring non-executable: /usr/local/bin/before-notebook.d/30-not-executable" in out


def test_root_start_applies_nb_uid_chown_home_and_grant_sudo(docker_client, notebook):
    _, image = notebook
    rc, out = run(
        docker_client,
        image,
        ["start.sh", "bash", "-c", "id -u; id -g; stat -c %u:%g $HOME; sudo -n id -u"],
        user="root",
        environment={"NB_UID": "1010", "NB_GID": "1020", "CHOWN_HOME": "yes", "GRANT_SUDO": "yes"},
        stdout_only=True,
    )
    assert rc == 0, out
    assert out.split() == ["1010", "1020", "1010:1020", "0"]


def test_without_root_nb_uid_is_refused_with_a_warning(docker_client, notebook):
    _, image = notebook
    rc, out = run(docker_client, image, ["start.sh", "id", "-u"], environment={"NB_UID": "1010"})
    assert rc == 0, out
    assert "NB_UID/NB_GID (1010:100) only take effect when the container starts as root" in out
    rc, out = run(
        docker_client,
        image,
        ["start.sh", "id", "-u"],
        environment={"NB_UID": "1010"},
        stdout_only=True,
    )
    assert (rc, out.strip()) == (0, "1000")


def test_docker_run_alone_serves_jupyterlab_and_turns_healthy(docker_client, notebook):
    _, image = notebook
    container = docker_client.containers.run(image, detach=True, network_mode="none")
    try:
        assert wait_health(container) == "healthy"
        # The server's own runtime file holds its token, as `jupyter server list` shows it.
        probe = (
            "import glob, json, os, urllib.request as u; "
            "d = os.path.expanduser('~/.local/share/jupyter/runtime'); "
            "info = json.load(open(sorted(glob.glob(d + '/jpserver-*.json'))[-1])); "
            "r = u.urlopen(f'http://127.0.0.1:8888/lab?token={info[\"token\"]}', timeout=10); "
            "print(r.status, '<title>JupyterLab</title>' in r.read().decode())"
        )
        rc, out = container.exec_run(["python3", "-c", probe])
        assert (rc, out.decode().strip()) == (0, "200 True")
        logs = container.logs().decode()
        assert "jupyter lab" in logs or "Jupyter Server" in logs
    finally:
        container.remove(force=True)


def test_a_server_start_compiles_no_iri_parsers_and_other_formats_are_still_checked(
    docker_client, notebook
):
    """rfc3987-syntax is uninstalled in the jupyter stage (docs/images.md: half of every
    server's start went to its Lark parsers): what the server imports loads no Lark,
    jsonschema still checks the other formats, and pip finds nothing broken."""
    _, image = notebook
    probe = (
        "import sys, jupyter_server.serverapp, jupyterhub.singleuser, jsonschema; "
        "checkers = jsonschema.Draft7Validator.FORMAT_CHECKER.checkers; "
        "print(sorted({'rfc3987_syntax', 'lark'} & set(sys.modules)), "
        "'iri' in checkers, 'date-time' in checkers, 'uri' in checkers)"
    )
    rc, out = run(docker_client, image, ["python3", "-c", probe], stdout_only=True)
    assert (rc, out.strip()) == (0, "[] False True True")
    rc, out = run(docker_client, image, ["pip", "check"], stdout_only=True)
    assert (rc, out.strip()) == (0, "No broken requirements found.")


@pytest.fixture(scope="module")
def real_hub(tmp_path_factory):
    """A real JupyterHub + proxy on 127.0.0.1 for jupyterhub-singleuser to check in with."""
    hub = start_hub(
        tmp_path_factory.mktemp("hub"),
        env={"KUBECONFIG": str(FIXTURES / "k8s-offline" / "kubeconfig.yaml")},
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def test_singleuser_mode_with_hub_variables_turns_healthy(docker_client, notebook, real_hub):
    """With a hub's variables the same command starts jupyterhub-singleuser, which checks in
    with the (real) hub's API before serving. The container shares the host's network
    to reach the hub on 127.0.0.1, and serves on a loopback port only."""
    _, image = notebook
    port = free_port()
    env = {
        "JUPYTERHUB_API_TOKEN": real_hub.token,
        "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-alice",
        "JUPYTERHUB_API_URL": real_hub.public_url.rstrip("/") + "/hub/api",
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/",
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}/user/alice/",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": "/user/alice/oauth_callback",
        "JUPYTERHUB_USER": "alice",
        "JUPYTERHUB_HOST": "",
    }
    container = docker_client.containers.run(
        image, detach=True, network_mode="host", environment=env
    )
    try:
        assert wait_health(container) == "healthy"
        logs = container.logs().decode()
        assert "using start-singleuser.sh" in logs
        assert "Running: jupyterhub-singleuser" in logs
        assert f"127.0.0.1:{port}/user/alice/" in logs
    finally:
        container.remove(force=True)


def test_labels_match_the_matrix(docker_client, notebook, matrix):
    spec, image = notebook
    labels = docker_client.images.get(image).labels
    assert labels[STAGE_LABEL] == "jupyter"
    assert labels[JUPYTERHUB_LABEL] == spec.jupyterhub
    assert labels["io.gpuspawner.image.jupyterlab"] == spec.jupyterlab
    assert labels["io.gpuspawner.image.notebook"] == spec.notebook
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")
    # The jupyter stage has no framework, so it must not claim one.
    for key in (IMAGE_LABEL_CUDA, IMAGE_LABEL_DRIVER_FLOOR, IMAGE_LABEL_FRAMEWORK):
        assert key not in labels


def test_environment_has_the_driver_paths_and_no_visible_devices(docker_client, notebook):
    _, image = notebook
    env = dict(e.split("=", 1) for e in docker_client.images.get(image).attrs["Config"]["Env"])
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert "/usr/local/nvidia/bin" in env["PATH"].split(":")
    assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"].split(":")
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    rc, out = run(
        docker_client,
        image,
        ["bash", "-c", "echo ${NVIDIA_VISIBLE_DEVICES-unset}"],
        stdout_only=True,
    )
    assert (rc, out.strip()) == (0, "unset")


def emulated_driver(tmp_path, gpu: str):
    """/usr/local/nvidia/bin as a node's driver install would mount it, with an nvidia-smi
    that prints the recorded output of the same command on a real `gpu` node."""
    bindir = tmp_path / "nvidia-bin"
    recorded = bindir / "recorded"
    recorded.mkdir(parents=True)
    for path in (FIXTURES / "nvidia-smi").glob(f"*__{gpu}.txt"):
        shutil.copy(path, recorded / path.name)
    exe = bindir / "nvidia-smi"
    exe.write_text(
        "#!/usr/bin/env python3\n"
        "# Replays the recorded output whose `# command:` line is this invocation.\n"
        "import pathlib, re, sys\n"
        "asked = ' '.join(['nvidia-smi', *sys.argv[1:]])\n"
        "for f in sorted((pathlib.Path(__file__).parent / 'recorded').glob('*.txt')):\n"
        "    text = f.read_text()\n"
        "    m = re.search(r'^# command: (.*)$', text, re.M)\n"
        "    if m and m.group(1).strip() == asked:\n"
        "        rc = re.search(r'^# exit_code: (\\d+)', text, re.M)\n"
        "        sys.stdout.write(text.split('# ----- verbatim output below this line -----\\n', 1)[1])\n"
        "        sys.exit(int(rc.group(1)) if rc else 0)\n"
        "print('Invalid combination of input arguments. Please run \\'nvidia-smi -h\\' for help.')\n"
        "sys.exit(2)\n"
    )
    exe.chmod(0o755)
    return bindir


def test_gpu_check_passes_with_the_emulated_driver(docker_client, notebook, tmp_path):
    """The spawner's init container command, in this image, on an emulated H200 node."""
    spec, image = notebook
    bindir = emulated_driver(tmp_path, "h200_590.48.01")
    assert len(list((bindir / "recorded").iterdir())) >= 3, "no recorded H200 outputs"
    command = check_command(1, "nvidia.com/gpu", spec.cuda)
    rc, out = run(
        docker_client,
        image,
        # The init container sets `command`, which replaces the entry point (tini,
        # start.sh): no hooks, no NB_UID, as on the node (podspec.validation_container).
        entrypoint=command,
        volumes={str(bindir): {"bind": "/usr/local/nvidia/bin", "mode": "ro"}},
        # What the NVIDIA runtime sets in a container given one GPU.
        environment={"NVIDIA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000000"},
    )
    assert rc == 0, out
    assert "nvidia-smi sees 1 GPU" in out, out


def test_gpu_check_fails_clearly_without_a_driver(docker_client, notebook):
    spec, image = notebook
    rc, out = run(docker_client, image, entrypoint=check_command(1, "nvidia.com/gpu", spec.cuda))
    assert rc != 0
    assert "nvidia-smi was not found in the container" in out
    assert "Traceback" not in out


def test_gpu_smoke_test_in_the_jupyter_stage_fails_with_its_message(docker_client, notebook):
    """The jupyter stage has no framework: the smoke test says so in one sentence (the full
    images' no-GPU failure is recorded in docs/measurements.md)."""
    _, image = notebook
    # Through start.sh (the entry point), quiet: its messages would precede the test's.
    rc, out = run(
        docker_client, image, ["gpu-smoke-test"], environment={"JUPYTER_DOCKER_STACKS_QUIET": "1"}
    )
    assert rc == 2, out
    assert out.strip() == (
        "gpu-smoke-test: none of torch, tensorflow, numpy can be imported in this environment."
    )


# --- the hub image -------------------------------------------------------------------


@pytest.fixture
def hub_image(built, matrix):
    from gpuspawner import __version__
    from gpuspawner.images.plan import hub_ref

    return hub_ref(matrix, __version__)


def test_hub_image_runs_the_hub_jupyterhub_and_gpuspawner(docker_client, hub_image, matrix):
    from gpuspawner import __version__

    probe = (
        "import jupyterhub, kubespawner, gpuspawner, sys; "
        "print(jupyterhub.__version__, gpuspawner.__version__, sys.version_info[:2] >= (3, 10))"
    )
    rc, out = run(docker_client, hub_image, ["python3", "-c", probe])
    assert rc == 0, out
    assert out.strip() == f"{matrix.hub.jupyterhub} {__version__} True"
    # the hub itself starts, through k8s-hub's entry point (tini)
    rc, out = run(docker_client, hub_image, ["jupyterhub", "--version"], stdout_only=True)
    assert (rc, out.strip()) == (0, matrix.hub.jupyterhub)
    rc, out = run(docker_client, hub_image, ["id", "-u"])
    assert (rc, out.strip()) == (0, "1000")


def test_hub_image_is_built_from_k8s_hub_under_quay_s_reference(docker_client, hub_image, matrix):
    """No registry here: the tool rebuilt k8s-hub and tagged it quay.io/jupyterhub/k8s-hub:4.4.0
    in this engine, and the hub image's FROM (that reference, the Dockerfile's default)
    found it there: the hub image is that image's layers plus gpuspawner's."""
    k8s_hub = docker_client.images.get(matrix.hub.k8s_hub_ref)
    hub = docker_client.images.get(hub_image)
    base_layers = k8s_hub.attrs["RootFS"]["Layers"]
    hub_layers = hub.attrs["RootFS"]["Layers"]
    assert hub_layers[: len(base_layers)] == base_layers
    assert len(hub_layers) > len(base_layers)
    assert hub.labels["org.opencontainers.image.base.name"] == matrix.hub.k8s_hub_ref
    assert k8s_hub.labels["org.opencontainers.image.base.name"] == matrix.hub.base_image
    # k8s-hub's command, user and port, as z2jh's chart expects them
    config = hub.attrs["Config"]
    assert config["Entrypoint"] == ["tini", "--"]
    assert config["Cmd"] == [
        "jupyterhub",
        "--config",
        "/usr/local/etc/jupyterhub/jupyterhub_config.py",
    ]
    assert "8081/tcp" in config["ExposedPorts"]


def test_hub_image_keeps_every_z2jh_pin(docker_client, hub_image, matrix):
    """Every pin of z2jh's hub requirements is installed as pinned, JupyterHub and
    KubeSpawner included: installing gpuspawner upgraded nothing."""
    req = (
        REPO.parent / "shared/third-party/zero-to-jupyterhub-k8s-4.4.0/images/hub/requirements.txt"
    )
    pins = {}
    for line in req.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name.strip())] = version.strip()
    rc, out = run(docker_client, hub_image, ["pip", "list", "--format", "json"], stdout_only=True)
    assert rc == 0, out
    installed = {
        canonicalize_name(p["name"]): p["version"] for p in json.loads(out.splitlines()[-1])
    }
    missing = sorted(set(pins) - set(installed))
    assert not missing, f"z2jh pins not installed: {missing}"
    moved = {name: (pins[name], installed[name]) for name in pins if installed[name] != pins[name]}
    assert moved == {}, f"z2jh pins changed by installing gpuspawner: {moved}"
    assert installed["jupyterhub"] == matrix.hub.jupyterhub
    assert "gpuspawner" in installed


def test_hub_image_has_no_nvidia_variables(docker_client, hub_image):
    env = docker_client.images.get(hub_image).attrs["Config"]["Env"]
    assert not [e for e in env if e.startswith("NVIDIA_")]
