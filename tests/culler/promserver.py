"""Start a real Prometheus (Debian's ``prometheus`` package) on 127.0.0.1 for the tests.

The runner is the sandbox's (:mod:`gpuspawner_sandbox.prometheus`, which the demo
uses too); this adds only the tests' rule for a missing binary.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuspawner_sandbox import prometheus as runner
from gpuspawner_sandbox.prometheus import INSTALL_HINT, Prometheus, prometheus_binary

__all__ = ["Prometheus", "require_prometheus", "start_prometheus"]


def require_prometheus() -> str:
    """The binary; without it skip loudly, or fail under CI=true (never pass silently)."""
    binary = prometheus_binary()
    if binary is None:
        message = f"the prometheus binary is not installed: run {INSTALL_HINT}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}")
        pytest.skip(f"SKIPPED, NOT TESTED: {message}")
    return binary


def start_prometheus(workdir: Path, targets: str | list[str], **settings) -> Prometheus:
    """The sandbox's Prometheus over ``targets``, after :func:`require_prometheus`."""
    return runner.start_prometheus(workdir, targets, binary=require_prometheus(), **settings)
