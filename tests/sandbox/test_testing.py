"""The helpers test suites use around the sandbox."""

from __future__ import annotations

import os
import socket

import pytest

from gpuspawner_sandbox import testing


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_an_unbuildable_sandbox_fails_in_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="CI must build it"):
        testing.sandbox_unavailable("no Go")


def test_an_unbuildable_sandbox_skips_loudly_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as excinfo:
        testing.sandbox_unavailable("no Go")
    assert "CANNOT BE BUILT" in str(excinfo.value)
    assert "no Go" in str(excinfo.value)


def test_missing_go_skips_the_sandbox_tests(monkeypatch, tmp_path):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("GPUSPAWNER_SANDBOX_CACHE", str(tmp_path / "cache"))
    with pytest.raises(pytest.skip.Exception, match=r"Go 1\.26 or newer is needed"):
        testing.control_plane_binary()


def test_listening_addresses_sees_this_process_listen():
    with socket.socket() as s:
        s.bind(("127.0.0.7", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ("127.0.0.7", port) in testing.listening_addresses(os.getpid())
    assert ("127.0.0.7", port) not in testing.listening_addresses(os.getpid())


@pytest.mark.parametrize(
    ("local", "remote", "ok"),
    [
        (("127.0.0.1", 6443), ("0.0.0.0", 0), True),  # listening on loopback
        (("127.0.0.5", 8888), ("127.0.0.1", 40000), True),  # a pod IP talking to the hub
        (("::ffff:127.0.0.1", 1), ("::ffff:127.0.0.2", 2), True),
        (("::1", 1), ("::", 0), True),
        (("0.0.0.0", 8888), ("0.0.0.0", 0), False),  # all interfaces
        (("10.1.2.3", 5000), ("0.0.0.0", 0), False),
        (("127.0.0.1", 5000), ("192.0.2.1", 53), False),  # talking out
        (("127.0.0.1", 5000), ("::ffff:10.0.0.1", 443), False),
        (("::", 8888), ("::", 0), False),
    ],
)
def test_stays_on_loopback(local, remote, ok):
    sock = {"proto": "tcp", "local": local, "remote": remote, "state": "01"}
    assert testing.stays_on_loopback(sock) is ok


def test_sockets_reads_this_process_connections():
    with socket.socket() as server:
        server.bind(("127.0.0.9", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            mine = testing.sockets(os.getpid())
            assert any(s["remote"] == server.getsockname() for s in mine)
            assert any(s["local"] == client.getsockname() for s in mine)
            assert testing.non_loopback_sockets(os.getpid()) == []
