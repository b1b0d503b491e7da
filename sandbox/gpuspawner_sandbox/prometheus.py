"""A real Prometheus (Debian's ``prometheus`` package) on 127.0.0.1, scraping DCGM exporters.

The demo runs one over every GPU node's emulated DCGM exporter, so the culler and
the admin page read GPU activity as they would on a real cluster; the tests
start the same one. The local cluster's in-cluster Prometheus
(:mod:`.clusterprometheus`, a pod reachable from pods) runs the same program with
the same flags and the same scrape job, there discovering the exporters through
the cluster DNS (SRV records of their Service).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .lifetime import dying_with_us
from .ports import free_port

INSTALL_HINT = "scripts/install-system-packages.sh (or: apt-get install -y prometheus)"


class PrometheusMissing(RuntimeError):
    """Prometheus is not installed; the message says how to install it."""


def prometheus_binary() -> str | None:
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None
    )


#: Loopback or a pod's address: never through a proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: The scrape job's name, as NVIDIA's dcgm-exporter chart names its ServiceMonitor's.
DCGM_JOB = "dcgm-exporter"


def dcgm_scrape_config(
    *,
    static_targets: list[str] | None = None,
    dns_sd: dict | None = None,
    honor_labels: bool = True,
    target_labels: dict | None = None,
    scrape_interval: str = "1s",
) -> dict:
    """prometheus.yml scraping the DCGM exporters: listed (``static_targets``, ``host:port``
    each) or discovered (one ``dns_sd`` entry: SRV records of the exporters' Service).

    ``honor_labels`` keeps the exporter's own ``pod``/``namespace`` labels, as the
    DCGM exporter's documentation asks of a Prometheus that scrapes it.
    """
    job: dict = {"job_name": DCGM_JOB, "honor_labels": honor_labels}
    if static_targets is not None:
        static: dict = {"targets": list(static_targets)}
        if target_labels:
            static["labels"] = target_labels
        job["static_configs"] = [static]
    if dns_sd is not None:
        job["dns_sd_configs"] = [dns_sd]
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [job],
    }


def server_args(config_file: str, data_dir: str, listen: str) -> list[str]:
    """Prometheus's flags (after the program), on the host and in the cluster alike."""
    return [
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address={listen}",
        "--storage.tsdb.retention.time=1h",
        # a series that stops being scraped disappears from instant queries in 10 s
        "--query.lookback-delta=10s",
        "--log.level=warn",
    ]


@dataclass
class PrometheusApi:
    """Prometheus's HTTP API at ``url`` (on 127.0.0.1, or a pod's address in the cluster)."""

    url: str

    def query(self, promql: str) -> dict:
        data = urllib.parse.urlencode({"query": promql}).encode()
        with _DIRECT.open(f"{self.url}/api/v1/query", data=data, timeout=10) as r:
            return json.loads(r.read())

    def wait_for(self, promql: str, predicate, timeout: float = 30) -> dict:
        """Poll a query until ``predicate(result list)`` holds (scrapes take a moment)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.query(promql)["data"]["result"]
            if predicate(last):
                return last
            time.sleep(0.5)
        raise AssertionError(f"Prometheus never satisfied the check for {promql!r}: {last}")


@dataclass
class Prometheus(PrometheusApi):
    """A Prometheus this process started on 127.0.0.1 (:func:`start_prometheus`)."""

    process: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_prometheus(
    workdir: Path,
    targets: str | list[str],
    *,
    binary: str | None = None,
    honor_labels: bool = True,
    target_labels: dict | None = None,
    scrape_interval: str = "1s",
) -> Prometheus:
    """Prometheus on 127.0.0.1 scraping DCGM exporters (``host:port`` each), data in ``workdir``.

    ``honor_labels`` and the rest: :func:`dcgm_scrape_config`.
    """
    binary = binary or prometheus_binary()
    if binary is None:
        raise PrometheusMissing(f"the prometheus binary is not installed: run {INSTALL_HINT}")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = dcgm_scrape_config(
        static_targets=[targets] if isinstance(targets, str) else list(targets),
        honor_labels=honor_labels,
        target_labels=target_labels,
        scrape_interval=scrape_interval,
    )
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    log_path = workdir / "prometheus.log"
    process = subprocess.Popen(
        [binary, *server_args(str(config_path), str(workdir / "data"), f"127.0.0.1:{port}")],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        # A crashed or killed demo, test run or benchmark must not leave it running.
        preexec_fn=dying_with_us(),
    )
    prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"Prometheus exited at start:\n{log_path.read_text()[-2000:]}")
            try:
                with _DIRECT.open(f"{prometheus.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return prometheus
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
    except BaseException:
        # Interrupted (Ctrl-C, a benchmark's SIGTERM) before the caller holds it to stop.
        prometheus.stop()
        raise
    prometheus.stop()
    raise RuntimeError(f"Prometheus did not become ready:\n{log_path.read_text()[-2000:]}")
