"""CPU time of a notebook image's Jupyter start: `jupyterhub-singleuser` until it answers.

    sudo flock /tmp/machine-tests.lock .venv/bin/python benchmarks/jupyter_start_cpu.py \
        [--image REF ...] [--runs 7] [--smoke]

What docs/benchmarks.md ("A lighter Jupyter start") measured: the built jupyter stage
is started on the image tests' private Docker engine (.cache/images/engine, where
`pytest tests/images` or `gpuspawner-images build --target jupyter` built it) the way
KubeSpawner starts it: the image's entry point (tini, start.sh) with
`jupyterhub-singleuser` as the only argument and a hub's JUPYTERHUB_* variables,
pointing at a stand-in hub API on the host's loopback (the container shares the
host's network). From the container's start until `GET <prefix>api` answers 200, the
CPU time is the container's cgroup total (the engine's stats: tini, start.sh and its
hooks, the server), so the start scripts' own cost is in it too.

Each image is started `--runs` times after one warm-up start (page cache), one at a
time, the images taking turns; the container's median, min and max CPU-s, the server
process's own median CPU-s (its /proc/PID/stat) and the median wall time to the first
answer are printed as a Markdown table. `--image` repeats, to compare two builds (tag
the old one first: `docker tag`); by default the matrix's first image's jupyter stage
is measured, and built first (as tests/images builds it) when the engine lacks it.
Every container started is removed on every way out, then the engine is stopped.
``--smoke`` (one image, one start, no warm-up) runs every step for the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchlib import Steps, add_arguments, guarded, run, sizes, work_dir

from gpuspawner.images.matrix import load_matrix
from gpuspawner.images.plan import image_ref
from gpuspawner_sandbox.build import image_cache_dir
from gpuspawner_sandbox.dockerd import PrivateEngine

REPO = Path(__file__).resolve().parent.parent

STEPS = ["engine", "hub", "runs"]
#: The data root the image tests build into (tests/images/conftest.py, CACHE).
DATA_ROOT = image_cache_dir(REPO) / "engine"
#: A start that has not answered by then is reported as a failure, not measured.
ANSWER_TIMEOUT_S = 240
USER = "bench"


class _StandInHub(BaseHTTPRequestHandler):
    """What jupyterhub-singleuser asks a hub while it starts: its version, activity."""

    def _answer(self) -> None:
        body = b"{}"
        self.send_response(200)
        self.send_header("X-JupyterHub-Version", _StandInHub.version)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer
    version = "5.5.0"

    def log_message(self, *args) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        # The server runs on this host's loopback (host network): plain HTTP.
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def ensure_built(client, engine, image: str, matrix_name: str | None) -> None:
    """The matrix's image (`matrix_name`) is built, its jupyter stage on the debootstrap
    base as tests/images builds it, when the engine lacks it; one named with --image
    (`matrix_name` None) must exist."""
    import docker

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        if matrix_name is None:
            raise SystemExit(
                f"{image} is not on the image tests' engine: build or tag it first."
            ) from None
    print(f"{image} is not built: building its jupyter stage first", file=sys.stderr, flush=True)
    tool = [sys.executable, "-m", "gpuspawner.images.cli"]
    build = ["build", "--target", "jupyter", "--network", "host", matrix_name]
    for command in (["base"], build):
        subprocess.run(
            [*tool, *command],
            cwd=REPO,
            env={**os.environ, "DOCKER_HOST": engine.host},
            stdout=sys.stderr,
            check=True,
        )


def remove_all(live: dict) -> None:
    """Remove the containers still listed (a start cut short), whatever their state."""
    for container in list(live.values()):
        with contextlib.suppress(Exception):
            container.remove(force=True)
    live.clear()


def server_cpu(client, container) -> float:
    """CPU-s of the container's jupyterhub-singleuser process alone (its /proc/PID/stat on
    this host, where the private engine runs it): what docs/benchmarks.md measured."""
    top = client.api.top(container.id, ps_args="-o pid,args")
    pid_col = top["Titles"].index("PID")
    found = []
    for proc in top["Processes"]:
        # tini's own arguments name it too: the server is the python process.
        argv = " ".join(proc[pid_col + 1 :]).split()
        if len(argv) > 1 and "python" in argv[0] and argv[1].endswith("/jupyterhub-singleuser"):
            fields = Path(f"/proc/{proc[pid_col]}/stat").read_text().rsplit(")", 1)[1].split()
            # utime and stime: fields 14 and 15 of proc(5), 12 and 13 after the name.
            found.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    if len(found) != 1:
        raise RuntimeError(f"not one jupyterhub-singleuser process in {container.id[:12]}: {top}")
    return found[0]


def one_start(client, live: dict, image: str, hub_url: str) -> tuple[float, float, float]:
    """Start `image` as KubeSpawner would; (container CPU-s, server CPU-s, wall-s) until
    its API answers."""
    port = free_port()
    prefix = f"/user/{USER}/"
    env = {
        "JUPYTERHUB_API_TOKEN": "stand-in-token",
        "JUPYTERHUB_CLIENT_ID": f"jupyterhub-user-{USER}",
        "JUPYTERHUB_API_URL": hub_url + "/hub/api",
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_SERVICE_PREFIX": prefix,
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}{prefix}",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{prefix}oauth_callback",
        "JUPYTERHUB_USER": USER,
        "JUPYTERHUB_HOST": "",
    }
    container = client.containers.create(
        image, ["jupyterhub-singleuser"], environment=env, network_mode="host"
    )
    live[container.id] = container
    url = f"http://127.0.0.1:{port}{prefix}api"
    started = time.monotonic()
    container.start()
    try:
        while not answers(url):
            container.reload()
            if container.status != "running":
                raise RuntimeError(
                    f"{image} exited before answering:\n"
                    + container.logs().decode("utf-8", "replace")[-2000:]
                )
            if time.monotonic() - started > ANSWER_TIMEOUT_S:
                raise RuntimeError(f"{image} did not answer {url} in {ANSWER_TIMEOUT_S}s")
            time.sleep(0.05)
        wall = time.monotonic() - started
        stats = client.api.stats(container.id, stream=False, one_shot=True)
        cpu = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        server = server_cpu(client, container)
    finally:
        container.remove(force=True)
        live.pop(container.id, None)
    return cpu, server, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--image", action="append", help="an image reference to measure (repeat to compare)"
    )
    parser.add_argument("--runs", type=int, help="measured starts per image (default 7)")
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(args, {"runs": 7}, {"runs": 1})
    steps = Steps(args)
    matrix = load_matrix(REPO / "images" / "matrix.yaml")
    first = next(iter(matrix.images.values()))
    images = args.image or [image_ref(matrix, first, stage="jupyter")]

    results: dict[str, list[tuple[float, float, float]]] = {i: [] for i in images}
    with guarded() as stack:
        state = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jupyter-cpu-")))
        engine = PrivateEngine(state=work_dir(state), data_root=DATA_ROOT)
        engine.start()
        stack.callback(engine.stop)
        client = engine.client()
        stack.callback(client.close)
        live: dict = {}
        stack.callback(remove_all, live)
        for image in images:
            ensure_built(client, engine, image, None if args.image else first.name)
        steps.done("engine")

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _StandInHub)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        stack.callback(httpd.server_close)
        stack.callback(httpd.shutdown)
        hub_url = f"http://127.0.0.1:{httpd.server_address[1]}"
        steps.done("hub")

        if not args.smoke:
            for image in images:
                one_start(client, live, image, hub_url)  # warm-up, not counted
        # Images take turns, so that what else the machine does falls on each alike.
        for _ in range(args.runs):
            for image in images:
                results[image].append(one_start(client, live, image, hub_url))
        steps.done("runs")

    print(
        "| image | container CPU-s, median | min | max | server process CPU-s, median "
        "| wall-s to answer, median | starts |"
    )
    print("|---|---|---|---|---|---|---|")
    for image, runs in results.items():
        cpus, servers, walls = ([r[i] for r in runs] for i in range(3))
        print(
            f"| {image} | {statistics.median(cpus):.3f} | {min(cpus):.3f} | {max(cpus):.3f} "
            f"| {statistics.median(servers):.3f} | {statistics.median(walls):.2f} "
            f"| {len(runs)} |"
        )
    print(json.dumps({i: [[round(x, 3) for x in r] for r in runs] for i, runs in results.items()}))
    return 0


if __name__ == "__main__":
    run(main)
