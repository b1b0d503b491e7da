"""A real Prometheus (Debian's ``prometheus`` package) on 127.0.0.1, scraping DCGM exporters.

The demo runs one over every GPU node's emulated DCGM exporter, so the culler and
the admin page read GPU activity as they would on a real cluster; the tests
start the same one.
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


@dataclass
class Prometheus:
    process: subprocess.Popen
    url: str
    log_path: Path

    def query(self, promql: str) -> dict:
        data = urllib.parse.urlencode({"query": promql}).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query", data=data, timeout=10) as r:
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

    ``honor_labels`` keeps the exporter's own ``pod``/``namespace`` labels, as the
    DCGM exporter's documentation asks of a Prometheus that scrapes it.
    """
    binary = binary or prometheus_binary()
    if binary is None:
        raise PrometheusMissing(f"the prometheus binary is not installed: run {INSTALL_HINT}")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    static = {"targets": [targets] if isinstance(targets, str) else list(targets)}
    if target_labels:
        static["labels"] = target_labels
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "honor_labels": honor_labels,
                "static_configs": [static],
            }
        ],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    log_path = workdir / "prometheus.log"
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            # a series that stops being scraped disappears from instant queries in 10 s
            "--query.lookback-delta=10s",
            "--log.level=warn",
        ],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        # A crashed or killed demo, test run or benchmark must not leave it running.
        preexec_fn=dying_with_us(),
    )
    prometheus = Prometheus(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"Prometheus exited at start:\n{log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as r:
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
