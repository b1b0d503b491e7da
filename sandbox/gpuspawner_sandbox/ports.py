"""Free TCP ports for the processes the local cluster and the tests start."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at the moment (the kernel's choice).

    Another process may take it before the caller binds it: callers that start a
    server on it retry with a new port when the bind fails.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
