"""The real-hub test harness; it lives in the package so the demo uses the same code."""

from gpuspawner_sandbox.hubprocess import Hub, Response, free_port, proxy_command, start_hub

__all__ = ["Hub", "Response", "free_port", "proxy_command", "start_hub"]
