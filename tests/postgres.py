"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, on loopback only.

z2jh deployments keep the hub's database in SQLite or PostgreSQL, so the usage
store is tested on both (tests/accounting). :class:`PostgresServer` runs the
distribution's own ``initdb`` and ``pg_ctl`` in a fresh temporary directory,
listening on 127.0.0.1 on a free port with its socket in that directory (never
the system's ``/var/run/postgresql``), with trust authentication for the
``postgres`` superuser (nothing but this machine's loopback can reach it), and
stops and removes it afterwards. PostgreSQL refuses to run as root, so under root
the server runs as ``nobody`` (``runuser``). The binaries come from
``scripts/install-system-packages.sh``; without them the tests fail, never skip.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

#: Where Debian puts the server's programs (``/usr/lib/postgresql/<major>/bin``);
#: ``GPUSPAWNER_PG_BIN`` names another directory.
DEBIAN_BIN = Path("/usr/lib/postgresql")
#: The user the server runs as when the tests run as root.
UNPRIVILEGED = "nobody"


def pg_bin() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl`` (the newest Debian major version)."""
    override = os.environ.get("GPUSPAWNER_PG_BIN")
    candidates = [Path(override)] if override else []
    if DEBIAN_BIN.is_dir():
        versions = [p for p in DEBIAN_BIN.iterdir() if p.name.isdigit()]
        candidates += [p / "bin" for p in sorted(versions, key=lambda p: -int(p.name))]
    for path in candidates:
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    pytest.fail(
        "PostgreSQL's server programs (initdb, pg_ctl) are missing: install Debian's "
        "postgresql package with `sudo scripts/install-system-packages.sh`.",
        pytrace=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One PostgreSQL server in a temporary directory; :meth:`database` makes fresh databases."""

    def __init__(self) -> None:
        self.bin = pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="gpuspawner-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.started = False
        self._names = itertools.count(1)
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, user=UNPRIVILEGED)
            self._as_user = ["runuser", "-u", UNPRIVILEGED, "--"]

    def _run(self, *args: str) -> None:
        proc = subprocess.run(
            [*self._as_user, *args], capture_output=True, text=True, timeout=120, cwd=self.root
        )
        if proc.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr[-2000:]}{tail}"
            )

    def start(self) -> PostgresServer:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
        )
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={self.port}",
                f"-c unix_socket_directories={self.root}",
                # a test server: its data dies with it
                "-c fsync=off",
                "-c full_page_writes=off",
            ]
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
        )
        self.started = True
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new, empty database's SQLAlchemy URL."""
        import psycopg2

        name = f"test_{next(self._names)}"
        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres"
        )
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {name}")
        finally:
            conn.close()
        return self.url(name)

    def stop(self) -> None:
        try:
            if self.started:
                self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast")
                self.started = False
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
