"""A private Docker engine: Debian's ``dockerd`` with its own socket, exec root and data root.

No image registry is reachable from our machines, so images are built here
with the real Docker engine, started privately: its socket, pid file and exec
root under a state directory, its data root wherever its layers should be kept
(``.cache/images/engine``: the image tests and the sandbox's notebook image
share it, so one build's layers serve the other), ``--iptables=false
--ip-masq=false --ip-forward=false --bridge=none`` (it touches no host network
setting; builds use ``--network host``, containers ``--network none``) and its
own containerd namespace. :meth:`PrivateEngine.stop` leaves no process,
mount or directory behind (containerd's shims put their sockets in
``/run/containerd/s`` whatever they are told; the engine removes what it created). Used by the sandbox (:mod:`gpuspawner_sandbox.notebookimage`)
and by ``tests/images``.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from . import machineclaim, suitecosts


class HarnessError(Exception):
    """The engine could not be started; str() says what to do."""


def need(program: str) -> str:
    """The path of a Debian program the engine needs, or one sentence saying how to get it."""
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


def stop_process(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM a process we started (in its own session), SIGKILL its group after ``grace`` s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def ping(socket_path: Path, timeout: float = 5) -> bool:
    """Whether an engine answers ``GET /_ping`` on its unix socket."""
    conn = _UnixConnection(str(socket_path), timeout)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


#: Where containerd's runc shims put their sockets, hard-coded in containerd:
#: the engine's builds and containers create it on the host if it is missing.
SHIM_SOCKET_DIRS = (Path("/run/containerd"), Path("/run/containerd/s"))


def missing_dirs(paths: tuple[Path, ...]) -> list[Path]:
    """Those of ``paths`` that do not exist now (to remove again once done with them)."""
    return [p for p in paths if not os.path.lexists(p)]


def remove_empty_dirs(paths: list[Path]) -> list[Path]:
    """Remove each of ``paths`` that is an empty directory, deepest first; return those kept."""
    kept = []
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            kept.append(path)
    return kept


@dataclass
class PrivateEngine:
    """One private ``dockerd``; :meth:`start` and :meth:`stop` it (or use it as a context)."""

    state: Path
    data_root: Path
    proc: subprocess.Popen | None = None
    lock: IO[str] | None = None
    #: Host directories this engine's start found missing: :meth:`stop` removes them.
    created_dirs: list[Path] | None = None

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

    def __enter__(self) -> PrivateEngine:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @suitecosts.recorded(suitecosts.DOCKER_ENGINE, lambda self, *a, **k: str(self.data_root))
    def start(self, timeout: float = 90) -> None:
        dockerd = need("dockerd")
        if os.geteuid() != 0:
            raise HarnessError(
                "a private dockerd (and debootstrap for its base image) needs root: "
                "run as root (as CI does)"
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
                f"another private Docker engine (the image tests, or another sandbox build) is "
                f"using {self.data_root}; wait for it to finish"
            ) from None
        self.created_dirs = missing_dirs(SHIM_SOCKET_DIRS)
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
            if self.socket.exists() and ping(self.socket):
                return
            time.sleep(0.5)
        self.stop()
        raise HarnessError(f"dockerd did not answer within {timeout:.0f}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return " / ".join(self.log.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def client(self) -> Any:
        """A docker SDK client for this engine (the SDK is imported only here)."""
        import docker

        return docker.DockerClient(base_url=self.host, timeout=600)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                # The engine is going away anyway; stopping it removes what is left.
                client = self.client()
                for c in client.containers.list(all=True):
                    c.remove(force=True)
            stop_process(self.proc, grace=60)
            self.proc = None
        # dockerd unmounts its layers on a clean stop; after a kill they may remain.
        for point in sorted(mounts_under(self.data_root, self.exec_root), reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        # Real nodes started since use /run/containerd as a mount point in their own
        # mount namespaces (nodes.py): removing it under them would detach their mounts.
        if self.created_dirs and not machineclaim.CLAIM_PATH.exists():
            remove_empty_dirs(self.created_dirs)
        self.created_dirs = None
        if self.lock is not None:
            self.lock.close()
            self.lock = None
