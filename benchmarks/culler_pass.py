"""One culling pass over N servers in a real hub: gpuspawner-culler beside jupyterhub-idle-culler.

    .venv/bin/python benchmarks/culler_pass.py [--users 5000] [--gpu-share 0.2] [--rounds 2]

Set-up (all on 127.0.0.1): a real JupyterHub 6 with its configurable-http-proxy;
``--users`` users, each with a running default server. The servers are cheap:
``tests.culler.spawners.NoProcessSpawner`` starts no process and reports
running; every server's URL is one tiny HTTP server this script runs, so the
hub's "is it up" check passes. A share of the servers (``--gpu-share``) have
GPUs: DCGM-format series for their pods are served to a real Prometheus.

Each culler runs one pass in this process through a counting proxy in front of
the hub API, with a timeout no server reaches (so both read everything and stop
nothing — the listing and deciding is what is compared):

* gpuspawner-culler with Prometheus (2 queries per pass) and without;
* jupyterhub-idle-culler 2.0 (``cull_idle``, one pass) with its default page
  size (the hub's default, 50) and with 200 (ours).

Rounds alternate the cullers; the table gives each run. Writes Markdown to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import os
import platform
import secrets
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jupyterhub_idle_culler import cull_idle  # noqa: E402

from tests.culler.dcgm import DCGMExporter  # noqa: E402
from tests.culler.faultproxy import FaultProxy  # noqa: E402
from tests.culler.hubtools import make_culler, start_culler_hub  # noqa: E402
from tests.culler.promserver import start_prometheus  # noqa: E402
from tests.culler.spawners import NAMESPACE, pod_name  # noqa: E402


def serve_ok() -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def ready_count(hub) -> int:
    request = urllib.request.Request(
        f"{hub.public_url}/hub/api/users?state=ready&limit=1",
        headers={
            "Authorization": f"token {hub.token}",
            "Accept": "application/jupyterhub-pagination+json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())["_pagination"]["total"]


def populate(hub, users: int, log) -> None:
    names = [f"user{i:05d}" for i in range(users)]
    for i in range(0, users, 1000):
        r = hub.api("POST", "/users", {"usernames": names[i : i + 1000]})
        assert r.status == 201, r.body
    started = time.monotonic()

    def spawn(name):
        for _ in range(20):
            r = hub.api("POST", f"/users/{name}/server", {"profile": "pytorch", "gpus": "0"})
            if r.status in (201, 202, 400):  # 400: already running
                return
            time.sleep(0.5)  # 429: too many spawns at once
        raise RuntimeError(f"could not spawn {name}: {r.status} {r.body[:200]}")

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(spawn, names))
    while ready_count(hub) < users:
        time.sleep(1)
    log(f"{users} servers running after {time.monotonic() - started:.0f} s")


async def run_ours(hub, token, proxy, prometheus_url: str | None) -> dict:
    traits = {"hub_api_url": f"{proxy.url}/hub/api", "timeout": 10**7, "min_running": 0}
    if prometheus_url:
        traits.update(
            prometheus_url=prometheus_url, gpu_window=600, gpu_query_step=15, gpu_freshness=60
        )
    app = make_culler(hub, token, **traits)
    app.log.setLevel(logging.WARNING)
    proxy.counts.clear()
    started = time.perf_counter()
    decisions = await app.cull_pass()
    wall = time.perf_counter() - started
    assert decisions is not None
    return {
        "wall": wall,
        "hub": proxy.total,
        "prom": app.prometheus.requests if app.prometheus else 0,
        "servers": len(decisions),
        "gpu_fresh": sum(1 for d in decisions if d.gpu_state == "fresh"),
    }


async def run_theirs(token, proxy, page_size: int) -> dict:
    logger = logging.getLogger("idle-culler")
    logger.setLevel(logging.WARNING)
    proxy.counts.clear()
    started = time.perf_counter()
    await cull_idle(
        url=f"{proxy.url}/hub/api",
        api_token=token,
        inactive_limit=10**7,
        logger=logger,
        concurrency=10,
        api_page_size=page_size,
    )
    return {"wall": time.perf_counter() - started, "hub": proxy.total, "prom": 0}


async def measure(hub, token, prometheus_url, rounds: int) -> list[tuple[str, dict]]:
    proxy = FaultProxy(hub.public_url)
    proxy.start()
    results = []
    for _ in range(rounds):
        results.append(
            (
                "gpuspawner-culler, with Prometheus",
                await run_ours(hub, token, proxy, prometheus_url),
            )
        )
        results.append(
            (
                "jupyterhub-idle-culler 2.0, page size 50 (default)",
                await run_theirs(token, proxy, 0),
            )
        )
        results.append(
            ("gpuspawner-culler, without Prometheus", await run_ours(hub, token, proxy, None))
        )
        results.append(
            ("jupyterhub-idle-culler 2.0, page size 200", await run_theirs(token, proxy, 200))
        )
    proxy.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--gpu-share", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    def log(message):
        print(f"# {message}", file=sys.stderr, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="culler-bench-"))
    ok = serve_ok()
    exporter = DCGMExporter()
    gpu_users = int(args.users * args.gpu_share)
    for i in range(gpu_users):
        device = exporter.add_gpu("0")
        exporter.assign(device, NAMESPACE, pod_name(f"user{i:05d}"), 0 if i % 2 else 50)
    target = exporter.start()
    prometheus = start_prometheus(workdir / "prometheus", target, scrape_interval="5s")
    token = secrets.token_hex(16)
    os.environ["CULLER_BENCH_SERVER_PORT"] = str(ok.server_address[1])
    hub = start_culler_hub(
        workdir / "hub",
        token,
        spawner="NoProcessSpawner",
        extra="""
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.last_activity_interval = 3600
c.Spawner.poll_interval = 3600
c.JupyterHub.log_level = "WARN"
""",
    )
    try:
        populate(hub, args.users, log)
        prometheus.wait_for(
            'count(DCGM_FI_DEV_GPU_UTIL{pod!=""})',
            lambda r: bool(r) and int(float(r[0]["value"][1])) >= gpu_users,
            timeout=120,
        )
        results = asyncio.run(measure(hub, token, prometheus.url, args.rounds))
    finally:
        hub.stop()
        prometheus.stop()
        exporter.stop()
        ok.shutdown()

    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"Hub: JupyterHub (real, with configurable-http-proxy), {args.users} users each with a "
        f"running server; {gpu_users} of them with GPU series in Prometheus."
    )
    print()
    print("| culler | wall time (s) | hub API requests | Prometheus queries |")
    print("|---|---|---|---|")
    for name, r in results:
        print(f"| {name} | {r['wall']:.2f} | {r['hub']} | {r['prom']} |")
    print()
    by_name: dict[str, list[float]] = {}
    for name, r in results:
        by_name.setdefault(name, []).append(r["wall"])
    for name, walls in by_name.items():
        print(f"- {name}: median {statistics.median(walls):.2f} s over {len(walls)} runs")
    ours = [r for n, r in results if n.startswith("gpuspawner-culler, with")]
    if ours:
        print(
            f"- gpuspawner-culler saw {ours[0]['servers']} servers, "
            f"{ours[0]['gpu_fresh']} with fresh GPU data"
        )


if __name__ == "__main__":
    main()
