"""The helpers test suites use around the sandbox."""

from __future__ import annotations

import os
import socket

import pytest

from gpuspawner.sandbox import testing


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
