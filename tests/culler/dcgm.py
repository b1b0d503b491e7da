"""A DCGM-exporter-format /metrics endpoint on 127.0.0.1 whose pods and utilisation the tests set.

The lines come from ``tests/fixtures/dcgm/exporter-sample.prom`` (the
exporter's own format); a test only changes the ``pod``/``namespace``/``container``
labels (which pod holds a GPU), the utilisation values, and, for more GPUs than the
sample has, copies a sample GPU's series under the next index.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..conftest import FIXTURES

SAMPLE = FIXTURES / "dcgm" / "exporter-sample.prom"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"

_SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Series:
    metric: str
    labels: dict[str, str]
    value: str

    @property
    def device(self) -> str:
        """``0`` for a whole GPU, ``2/7`` for MIG instance 7 on GPU 2."""
        gi = self.labels.get("GPU_I_ID")
        return f"{self.labels['gpu']}/{gi}" if gi else self.labels["gpu"]


def parse_sample(path: Path = SAMPLE) -> tuple[dict[str, list[str]], list[Series]]:
    """The sample's HELP/TYPE lines per metric, and its series in order."""
    headers: dict[str, list[str]] = {}
    series = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            metric = line.split()[2]
            headers.setdefault(metric, []).append(line)
            continue
        m = _SERIES.match(line)
        if m:
            series.append(Series(m.group(1), dict(_LABEL.findall(m.group(2))), m.group(3)))
    return headers, series


@dataclass
class Device:
    namespace: str = ""
    pod: str = ""
    util: float = 0.0  # percent
    hidden: bool = False  # the exporter stops reporting it (missing metrics)


@dataclass
class DCGMExporter:
    devices: dict[str, Device] = field(default_factory=dict)

    def __post_init__(self):
        self.headers, self.series = parse_sample()
        self.lock = threading.Lock()
        for s in self.series:
            self.devices.setdefault(s.device, Device())
        self._server = None

    def sample_devices(self) -> list[str]:
        return list(dict.fromkeys(s.device for s in self.series))

    def add_gpu(self, like: str = "0") -> str:
        """A copy of sample GPU ``like`` under the next free index; returns its key."""
        with self.lock:
            index = 1 + max(int(s.labels["gpu"]) for s in self.series)
            for s in [s for s in self.series if s.device == like]:
                labels = dict(s.labels)
                labels["gpu"] = str(index)
                labels["device"] = f"nvidia{index}"
                labels["UUID"] = f"{labels['UUID'][:-4]}{index:04d}"
                self.series.append(Series(s.metric, labels, s.value))
            key = str(index)
            self.devices[key] = Device()
            return key

    def assign(self, device: str, namespace: str, pod: str, util: float = 0.0) -> None:
        with self.lock:
            self.devices[device] = Device(namespace=namespace, pod=pod, util=util)

    def set_util(self, device: str, util: float) -> None:
        with self.lock:
            self.devices[device].util = util

    def hide(self, device: str, hidden: bool = True) -> None:
        with self.lock:
            self.devices[device].hidden = hidden

    def render(self) -> str:
        out = []
        with self.lock:
            by_metric: dict[str, list[Series]] = {}
            for s in self.series:
                by_metric.setdefault(s.metric, []).append(s)
            for metric, items in by_metric.items():
                out.extend(self.headers.get(metric, []))
                for s in items:
                    d = self.devices[s.device]
                    if d.hidden:
                        continue
                    labels = dict(s.labels)
                    labels["namespace"], labels["pod"] = d.namespace, d.pod
                    labels["container"] = "notebook" if d.pod else ""
                    value = s.value
                    if metric == UTIL:
                        value = f"{d.util:g}"
                    elif metric == ENGINE:
                        value = f"{d.util / 100:.6f}"
                    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                    out.append(f"{metric}{{{text}}} {value}")
        return "\n".join(out) + "\n"

    def start(self) -> str:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
