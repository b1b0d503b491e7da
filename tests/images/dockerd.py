"""A local image registry for the image tests (test harness); the private engine is the sandbox's.

Debian's `dockerd` runs as :class:`gpuspawner_sandbox.dockerd.PrivateEngine` (one
implementation for the sandbox's notebook image and these tests). Debian's
`docker-registry` listens on 127.0.0.1 for `gpuspawner-images push`. Both are
stopped afterwards, and no process or mount is left behind.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpuspawner_sandbox.dockerd import HarnessError, need, stop_process
from gpuspawner_sandbox.ports import free_port


@dataclass
class LocalRegistry:
    state: Path
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> None:
        registry = need("docker-registry")
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
            stop_process(self.proc, grace=10)
