"""start.sh in the entry point: hooks, NB_UID and JUPYTER_PORT under every way a server starts.

docker-stacks' start semantics on the built jupyter stage, on the real engine (the
`built` fixture). One container per way of starting, each started as root with
NB_UID=1010 and a mounted before-notebook.d hook that logs every run:

- z2jh's default `singleuser.cmd: jupyterhub-singleuser`, which KubeSpawner passes as
  the container's *args* (kubespawner/objects.py: `args=cmd`), keeping the entry point;
- `start-singleuser.sh` as a pod's `command`, which replaces the entry point: the
  script calls start.sh itself, and the hooks still run once;
- a plain `docker run IMAGE` with JUPYTER_PORT, here with DOCKER_STACKS_JUPYTER_CMD=notebook
  (Notebook 7 on the moved port).

The two hub-started servers check in with a stand-in hub API on the host's loopback
(the containers share the host's network and listen on 127.0.0.1 only). The jupyter
stage is the same in every notebook image (test_dockerfiles), so one image is run.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuspawner.images.plan import image_ref
from gpuspawner_sandbox.hubprocess import free_port

from .test_built_images import wait_health

HOOKS = "/usr/local/bin/before-notebook.d"
HOOK_LOG = "/tmp/before-notebook-runs"
USER = "alice"

# Run inside the container (as root, its user): what the hook logged, the uid of each
# Jupyter server process, and the answers of the server's port(s).
PROBE = r"""
import glob, json, os, sys, urllib.request
servers = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    # python3 /opt/venv/bin/jupyter-notebook (or jupyterhub-singleuser) ARGS...
    if any(os.path.basename(a) in (b"jupyterhub-singleuser", b"jupyter-notebook",
                                   b"jupyter-lab") for a in argv[:2]):
        servers.append(os.stat(f"/proc/{pid}").st_uid)
answers = {}
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            answers[url] = [r.status, r.read().decode("utf-8", "replace")]
    except OSError as e:
        answers[url] = [None, str(e)]
hook = open("/tmp/before-notebook-runs").read().splitlines() if os.path.exists(
    "/tmp/before-notebook-runs") else []
print(json.dumps({"hook": hook, "server_uids": servers, "answers": answers}))
"""


@pytest.fixture
def image(built, matrix):
    return image_ref(matrix, next(iter(matrix.images.values())), stage="jupyter")


@pytest.fixture
def hooks(tmp_path):
    """A before-notebook.d with one sourced hook that logs each run (and whose uid)."""
    directory = tmp_path / "before-notebook.d"
    directory.mkdir()
    (directory / "10-log.sh").write_text(
        f'echo "ran as $(id -u)" >> {HOOK_LOG}\necho "before-notebook hook: marker"\n'
    )
    return {str(directory): {"bind": HOOKS, "mode": "ro"}}


class _StandInHub(BaseHTTPRequestHandler):
    """The hub API jupyterhub-singleuser asks while it starts: its version, activity."""

    def _answer(self):
        self.send_response(200)
        self.send_header("X-JupyterHub-Version", "5.5.0")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub_api():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _StandInHub)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/hub/api"
    httpd.shutdown()
    httpd.server_close()


def hub_environment(api_url: str, port: int) -> dict[str, str]:
    """What KubeSpawner sets for a server of user alice listening on `port`."""
    prefix = f"/user/{USER}/"
    return {
        "JUPYTERHUB_API_TOKEN": "stand-in-token",
        "JUPYTERHUB_CLIENT_ID": f"jupyterhub-user-{USER}",
        "JUPYTERHUB_API_URL": api_url,
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_SERVICE_PREFIX": prefix,
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}{prefix}",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{prefix}oauth_callback",
        "JUPYTERHUB_USER": USER,
        "JUPYTERHUB_HOST": "",
        "NB_UID": "1010",
    }


def wait_answer(container, url: str, timeout: float = 240) -> None:
    """Until `url` (on the host's loopback) answers 200; fails with the logs if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        container.reload()
        if container.status != "running":
            break
        time.sleep(0.5)
    logs = container.logs().decode("utf-8", "replace")
    pytest.fail(f"{url} did not answer (container {container.status}):\n{logs[-3000:]}")


def probe(container, *urls: str) -> dict:
    rc, out = container.exec_run(["python3", "-c", PROBE, *urls])
    assert rc == 0, out.decode()
    return json.loads(out.decode().strip().splitlines()[-1])


def start_under_hub(docker_client, image, hub_api, hooks, **kwargs):
    port = free_port()
    container = docker_client.containers.run(
        image,
        detach=True,
        user="0",
        network_mode="host",
        environment=hub_environment(hub_api, port),
        volumes=hooks,
        **kwargs,
    )
    return container, f"http://127.0.0.1:{port}/user/{USER}/"


def test_z2jh_default_command_as_args_runs_hooks_and_nb_uid(docker_client, image, hub_api, hooks):
    """`singleuser.cmd: jupyterhub-singleuser` as args: start.sh (the entry point) runs first."""
    container, url = start_under_hub(
        docker_client, image, hub_api, hooks, command=["jupyterhub-singleuser"]
    )
    try:
        wait_answer(container, url + "api")
        found = probe(container)
        logs = container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    assert found["hook"] == ["ran as 0"], logs
    assert found["server_uids"] == [1010], logs
    assert "before-notebook hook: marker" in logs
    assert "Running as jovyan: jupyterhub-singleuser" in logs


def test_start_singleuser_as_the_command_runs_hooks_once(docker_client, image, hub_api, hooks):
    """A pod's `command: [start-singleuser.sh]` replaces the entry point (no tini, no
    start.sh): the script's own call to start.sh runs the hooks, once, and applies NB_UID."""
    container, url = start_under_hub(
        docker_client, image, hub_api, hooks, entrypoint=["start-singleuser.sh"]
    )
    try:
        wait_answer(container, url + "api")
        found = probe(container)
        logs = container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    assert found["hook"] == ["ran as 0"], logs
    assert found["server_uids"] == [1010], logs
    assert logs.count("Running hooks in: /usr/local/bin/before-notebook.d") == 1, logs


def test_plain_docker_run_honours_jupyter_port_hooks_nb_uid_and_notebook(
    docker_client, image, hooks
):
    """`docker run -e JUPYTER_PORT -e DOCKER_STACKS_JUPYTER_CMD=notebook IMAGE`: Notebook 7
    on the moved port (8888 is not listened on), the hook ran once, the server is uid 1010,
    and the healthcheck finds the server on its port."""
    port = 9123
    container = docker_client.containers.run(
        image,
        detach=True,
        user="0",
        network_mode="none",
        environment={
            "JUPYTER_PORT": str(port),
            "DOCKER_STACKS_JUPYTER_CMD": "notebook",
            "NB_UID": "1010",
        },
        volumes=hooks,
    )
    try:
        assert wait_health(container) == "healthy"
        rc, token = container.exec_run(
            [
                "python3",
                "-c",
                "import glob, json; print(json.load(open(sorted(glob.glob("
                "'/home/jovyan/.local/share/jupyter/runtime/jpserver-*.json'))[-1]))['token'])",
            ]
        )
        assert rc == 0, token.decode()
        tree = f"http://127.0.0.1:{port}/tree?token={token.decode().strip()}"
        found = probe(container, f"http://127.0.0.1:{port}/api", "http://127.0.0.1:8888/api", tree)
        logs = container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    assert found["hook"] == ["ran as 0"], logs
    assert found["server_uids"] == [1010], logs
    answers = found["answers"]
    assert answers[f"http://127.0.0.1:{port}/api"][0] == 200
    assert answers["http://127.0.0.1:8888/api"][0] is None  # nothing listens there
    status, page = answers[tree]
    assert status == 200
    # Notebook 7's file browser, not JupyterLab: its page config names the app.
    assert re.search(r'"appName":\s*"Jupyter Notebook"', page), page[:2000]
    assert "Running: jupyter notebook" in logs


def test_a_bad_jupyter_port_is_refused_in_one_sentence(docker_client, image):
    """No traceback: start-notebook.sh says what is wrong with the value, escaped, and exits."""
    container = docker_client.containers.run(
        image, detach=True, network_mode="none", environment={"JUPYTER_PORT": "8888; rm -rf ~"}
    )
    try:
        status = container.wait(timeout=120)
        logs = container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 2, logs
    assert (
        "ERROR: JUPYTER_PORT=8888\\;\\ rm\\ -rf\\ ~ is not a port number: "
        "set it to one from 1 to 65535, e.g. 8888." in logs
    ), logs
    assert "Traceback" not in logs
