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


def _dns_server(answer_from: int):
    """A UDP DNS server on loopback that ignores the first ``answer_from - 1`` queries it gets.

    It answers NXDOMAIN, echoing the question; returns (port, queries seen, thread).
    """
    import socket
    import struct
    import threading

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(10)
    seen = []

    def serve():
        with sock:
            while len(seen) < answer_from:
                try:
                    query, peer = sock.recvfrom(512)
                except TimeoutError:
                    return
                seen.append(query)
                if len(seen) == answer_from:
                    header = struct.pack(
                        "!HHHHHH", struct.unpack("!H", query[:2])[0], 0x8183, 1, 0, 0, 0
                    )
                    sock.sendto(header + query[12:], peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return sock.getsockname()[1], seen, thread


def test_dns_query_sends_again_when_an_answer_is_lost():
    port, seen, thread = _dns_server(answer_from=2)
    rcode, addresses = testing.dns_query("127.0.0.1", port, "gone.example", timeout=0.5)
    assert (rcode, addresses) == (testing.DNS_NXDOMAIN, [])
    assert len(seen) == 2 and seen[0] == seen[1]  # the same query, sent again
    thread.join(5)


def test_dns_query_gives_up_after_its_attempts():
    port, seen, _thread = _dns_server(answer_from=10)
    with pytest.raises(
        TimeoutError, match=r"no answer from 127.0.0.1:\d+ for x.example \(2 attempts\)"
    ):
        testing.dns_query("127.0.0.1", port, "x.example", timeout=0.3, attempts=2)
    assert len(seen) == 2
