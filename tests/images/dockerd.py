"""A private Docker engine and image registry for the image tests (test harness).

Debian's `dockerd` (package docker.io) runs with its own socket and exec root under
the test's state directory, its own data root (kept in .cache/images/engine so that
layers are reused across runs), no iptables and no bridge: containers get
`--network none` or the host's loopback only. Debian's `docker-registry` listens
on 127.0.0.1 for `gpuspawner-images push`. Both are stopped afterwards, and no
process or mount is left behind.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import docker


class HarnessError(Exception):
    """The engine or registry could not be started; str() says what to do."""


def _need(program: str) -> str:
    path = shutil.which(program) or (
        f"/usr/bin/{program}" if Path(f"/usr/bin/{program}").exists() else None
    )
    if path is None:
        raise HarnessError(
            f"{program} is not installed: run `make system-packages` "
            "(scripts/install-system-packages.sh installs docker.io, docker-registry and debootstrap)"
        )
    return path


def mounts_under(*roots: Path) -> list[str]:
    """Mount points at or below any of `roots` (from /proc/self/mountinfo)."""
    found = []
    prefixes = [str(r.resolve()) for r in roots]
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if any(point == p or point.startswith(p + "/") for p in prefixes):
                found.append(point)
    return found


def _stop(proc: subprocess.Popen, grace: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@dataclass
class PrivateEngine:
    state: Path
    data_root: Path
    proc: subprocess.Popen | None = None
    lock: IO[str] | None = None

    @property
    def socket(self) -> Path:
        return self.state / "docker.sock"

    @property
    def exec_root(self) -> Path:
        return self.state / "exec"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.state / "dockerd.log"

    def start(self, timeout: float = 90) -> None:
        dockerd = _need("dockerd")
        if os.geteuid() != 0:
            raise HarnessError(
                "the image tests start a private dockerd and run debootstrap, which need root: "
                "run the suite as root (as CI does)"
            )
        self.state.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        # One engine per data root: a second one would fail late and obscurely.
        self.lock = open(self.data_root.parent / f"{self.data_root.name}.lock", "w")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock.close()
            self.lock = None
            raise HarnessError(
                f"another run of the image tests is using {self.data_root}; wait for it to finish"
            ) from None
        # A containerd namespace of its own: another engine on this machine keeps its containers.
        ns = f"gpuspawner-test-{os.getpid()}"
        cmd = [
            dockerd,
            "--data-root", str(self.data_root),
            "--exec-root", str(self.exec_root),
            "-H", self.host,
            "--pidfile", str(self.state / "dockerd.pid"),
            "--iptables=false",
            "--ip-masq=false",
            # dockerd turns on net.ipv4.ip_forward by default: a host setting it must not change.
            "--ip-forward=false",
            "--bridge=none",
            "--containerd-namespace", ns,
            "--containerd-plugins-namespace", f"{ns}-plugins",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                why = f"dockerd exited with {self.proc.returncode}: {self._log_tail()}"
                self.stop()
                raise HarnessError(why)
            try:
                if self.socket.exists():
                    docker.DockerClient(base_url=self.host, timeout=5).ping()
                    return
            except Exception:
                pass
            time.sleep(0.5)
        self.stop()
        raise HarnessError(f"dockerd did not answer within {timeout:.0f}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return " / ".join(self.log.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=600)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                client = docker.DockerClient(base_url=self.host, timeout=30)
                for c in client.containers.list(all=True):
                    c.remove(force=True)
            except Exception:
                pass  # the engine is going away anyway; stopping it removes what is left
            _stop(self.proc, grace=60)
        # dockerd unmounts its layers on a clean stop; after a kill they may remain.
        for point in sorted(mounts_under(self.data_root, self.exec_root), reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalRegistry:
    state: Path
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> None:
        registry = _need("docker-registry")
        self.state.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = self.state / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.state / 'data'}\n"
            f"http:\n  addr: {self.address}\n"
        )
        with open(self.state / "registry.log", "ab") as log:
            self.proc = subprocess.Popen(
                [registry, "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError(f"docker-registry exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise HarnessError(f"docker-registry did not listen on {self.address}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, grace=10)
