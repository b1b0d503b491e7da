"""One culling pass over N servers in a real hub: gpuspawner-culler beside jupyterhub-idle-culler.

    .venv/bin/python benchmarks/culler_pass.py [--users 5000] [--gpu-share 0.2] [--rounds 2]
                                               [--smoke]

Set-up (all on 127.0.0.1): a real JupyterHub 6 with its configurable-http-proxy;
``--users`` users, each with a running default server. The servers are cheap:
``tests.culler.spawners.NoProcessSpawner`` starts no process and reports
running; every server's URL is one tiny HTTP server this script runs, so the
hub's "is it up" check passes. The users and their servers are written into
the hub's database while it is stopped; at its start the hub checks each
server and adds its proxy route, as after any restart. A share of the servers (``--gpu-share``) have
GPUs: DCGM-format series for their pods are served to a real Prometheus.

Each culler runs one pass in this process through a counting proxy in front of
the hub API, with a timeout no server reaches (so both read everything and stop
nothing — the listing and deciding is what is compared):

* gpuspawner-culler with Prometheus (2 queries per pass) and without;
* jupyterhub-idle-culler 2.0 (``cull_idle``, one pass) with its default page
  size (the hub's default, 50) and with 200 (ours).

Rounds alternate the cullers; the table gives each run. Writes Markdown to stdout.
``--smoke`` (20 users, one round) runs every step once for the tests; whatever
ends the run, the hub, its proxy and Prometheus are stopped before it exits
(benchmarks/benchlib.py).
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Steps, add_arguments, guarded, run, sizes, work_dir  # noqa: E402
from jupyterhub_idle_culler import cull_idle  # noqa: E402

from tests.culler.dcgm import DCGMExporter  # noqa: E402
from tests.culler.faultproxy import FaultProxy  # noqa: E402
from tests.culler.hubtools import make_culler, start_culler_hub  # noqa: E402
from tests.culler.promserver import start_prometheus  # noqa: E402
from tests.culler.spawners import NAMESPACE, pod_name  # noqa: E402

#: --fail-after's steps, in order.
STEPS = ("prometheus", "hub", "servers", "measured")


def serve_ok() -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("X-JupyterHub-Version", __import__("jupyterhub").__version__)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # the hub may close a connection early; nothing to report

    server = Server(("127.0.0.1", 0), Handler)
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


def prepopulate(db_url: str, users: int, port: int, gpu_users: int) -> None:
    """Write users with running servers straight into the hub's database (hub stopped).

    Spawning 5,000 servers through the API takes the hub ~20 minutes on 2 cores;
    rows written here are what the hub itself writes for a running server, and
    at its next start it checks each one (poll + an HTTP request to its URL) and
    adds its proxy route, as after any hub restart.
    """
    from jupyterhub import orm
    from jupyterhub.utils import utcnow

    db = orm.new_session_factory(db_url)()
    now = utcnow(with_tz=False)
    for i in range(users):
        name = f"user{i:05d}"
        user = orm.User(name=name, created=now, last_activity=now)
        db.add(user)
        server = orm.Server(proto="http", ip="127.0.0.1", port=port, base_url=f"/user/{name}/")
        db.add(server)
        db.add(
            orm.Spawner(
                user=user,
                name="",
                server=server,
                started=now,
                last_activity=now,
                user_options=(
                    {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
                    if i < gpu_users
                    else {"profile": "pytorch", "gpus": "0"}
                ),
                state={"pod_name": pod_name(name), "namespace": NAMESPACE},
            )
        )
        if i % 1000 == 999:
            db.commit()
    db.commit()
    db.close()


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
        "gpu_decisions": Counter(
            f"{d.action}/{d.reason}/{d.gpu_state}" for d in decisions if d.server.gpus > 0
        ),
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
    try:
        return await _rounds(hub, token, proxy, prometheus_url, rounds)
    finally:
        proxy.stop()


async def _rounds(hub, token, proxy, prometheus_url, rounds: int) -> list[tuple[str, dict]]:
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
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, help="users, each with a server (5000; --smoke: 20)")
    parser.add_argument("--gpu-share", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, help="passes of each culler (2; --smoke: 1)")
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(args, full={"users": 5000, "rounds": 2}, smoke={"users": 20, "rounds": 1})
    steps = Steps(args)

    def log(message):
        print(f"# {message}", file=sys.stderr, flush=True)

    workdir = work_dir(Path(tempfile.mkdtemp(prefix="culler-bench-")))
    gpu_users = int(args.users * args.gpu_share)
    token = secrets.token_hex(16)
    hub_dir = workdir / "hub"
    extra = """
c.JupyterHub.last_activity_interval = 3600
c.Spawner.poll_interval = 3600
c.JupyterHub.init_spawners_timeout = 1
c.JupyterHub.log_level = "WARN"
"""
    with guarded() as started:
        ok = serve_ok()
        started.callback(ok.server_close)
        started.callback(ok.shutdown)
        exporter = DCGMExporter()
        for i in range(gpu_users):
            device = exporter.add_gpu("0")
            exporter.assign(device, NAMESPACE, pod_name(f"user{i:05d}"), 0 if i % 2 else 50)
        target = exporter.start()
        started.callback(exporter.stop)
        prometheus = start_prometheus(
            workdir / "prometheus", target, scrape_interval="1s" if args.smoke else "5s"
        )
        started.callback(prometheus.stop)
        steps.done("prometheus")
        os.environ["CULLER_BENCH_SERVER_PORT"] = str(ok.server_address[1])
        # first start creates the database; then the servers are written into it
        first = start_culler_hub(hub_dir, token, spawner="NoProcessSpawner", extra=extra)
        try:
            steps.done("hub")
        finally:
            first.stop()
        started_at = time.monotonic()
        prepopulate(
            f"sqlite:///{hub_dir / 'jupyterhub.sqlite'}",
            args.users,
            ok.server_address[1],
            gpu_users,
        )
        hub = start_culler_hub(hub_dir, token, spawner="NoProcessSpawner", extra=extra)
        started.callback(hub.stop)
        while ready_count(hub) < args.users:
            time.sleep(1)
        log(f"{args.users} servers running after {time.monotonic() - started_at:.0f} s")
        prometheus.wait_for(
            'count(DCGM_FI_DEV_GPU_UTIL{pod!=""})',
            lambda r: bool(r) and int(float(r[0]["value"][1])) >= gpu_users,
            timeout=120,
        )
        steps.done("servers")
        results = asyncio.run(measure(hub, token, prometheus.url, args.rounds))
        steps.done("measured")

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
            f"{ours[0]['gpu_fresh']} with fresh GPU data; GPU servers' decisions "
            f"(action/reason/GPU data): {dict(ours[0]['gpu_decisions'])}"
        )
    return 0


if __name__ == "__main__":
    run(main)
