"""The local cluster's DNS: CoreDNS, built from its Go module, serving the cluster's zone.

Pods of a real cluster find Services by name (``hub``, ``proxy-api`` in the
zero-to-jupyterhub chart) through the cluster DNS, which on almost every
cluster is CoreDNS with its ``kubernetes`` plugin. Ours is the same program,
built from ``github.com/coredns/coredns`` with only the plugins a cluster DNS
needs (``sandbox/coredns/main.go``): no ``forward`` plugin, so a name outside
the cluster's zones is refused and never sent anywhere.

It reads Services, EndpointSlices, Pods and Namespaces with its own service
account, bound to the ``system:coredns`` ClusterRole that kubeadm also gives
it (``coredns-rbac.yaml``).

:func:`corefile` is pure; :func:`running_coredns` starts and stops the process.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from . import nodebuild

COREDNS = nodebuild.COREDNS
COREDNS_MODULE_DIR = COREDNS.module_dir

#: The RBAC a cluster DNS needs (as kubeadm's system:coredns), and its service account.
RBAC_MANIFEST = Path(__file__).with_name("coredns-rbac.yaml")
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "coredns"

CLUSTER_DOMAIN = "cluster.local"
#: Reverse zones answered for Service and Pod IPs (PTR records), as kubeadm's Corefile.
REVERSE_ZONES = ("in-addr.arpa", "ip6.arpa")


class DNSStartError(RuntimeError):
    """CoreDNS did not start; the message says why, with its log."""


@dataclass(frozen=True)
class DNSAddress:
    """Where the DNS server answers, and where its health and readiness are served."""

    ip: str
    port: int
    health_port: int
    ready_port: int


def corefile(address: DNSAddress, kubeconfig: Path, domain: str = CLUSTER_DOMAIN) -> str:
    """The Corefile: the cluster's zone and the reverse zones, bound to one address only.

    As kubeadm 1.37 writes it, less ``forward`` (nothing is asked outside): the
    cluster's own names are not cached, since the kubernetes plugin answers them
    from its watch; a name asked for just before its Service appeared is not
    then denied for the cache's 30 s.
    """
    zones = " ".join(f"{zone}:{address.port}" for zone in (domain, *REVERSE_ZONES))
    return f"""{zones} {{
    bind {address.ip}
    errors
    health {address.ip}:{address.health_port}
    ready {address.ip}:{address.ready_port}
    kubernetes {domain} {" ".join(REVERSE_ZONES)} {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 30
    }}
    cache 30 {{
        disable success {domain}
        disable denial {domain}
    }}
}}
"""


def build_coredns(cache: Path | None = None, *, out: TextIO | None = None) -> Path:
    """Build (or find cached) CoreDNS; the binary's path."""
    return nodebuild.build_local(COREDNS, cache, out=out)


def ready(address: DNSAddress) -> bool:
    """Whether CoreDNS says it is ready: its kubernetes plugin has synced."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(
            f"http://{address.ip}:{address.ready_port}/ready", timeout=2
        ) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


@contextlib.contextmanager
def running_coredns(
    binary: Path,
    state_dir: Path,
    address: DNSAddress,
    kubeconfig: Path,
    timeout: float = 60,
) -> Iterator[subprocess.Popen]:
    """CoreDNS serving the cluster's zones on ``address`` until the block ends.

    Ready means its ``kubernetes`` plugin has synced with the API server.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    config = state_dir / "Corefile"
    config.write_text(corefile(address, kubeconfig))
    log_path = state_dir / "coredns.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(binary), "-conf", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
        )
    try:
        deadline = time.monotonic() + timeout
        while not ready(address):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                what = (
                    "exited" if process.poll() is not None else f"was not ready in {timeout:.0f}s"
                )
                raise DNSStartError(f"CoreDNS {what}; its log:\n{tail}")
            time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
