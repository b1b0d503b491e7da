"""The test suite's expensive steps, recorded for its time table.

A cluster's start, a Kueue deployment, an image build, a hub's start or a Helm install
costs seconds to minutes; the suite's time table (``tests/timetable.py``,
``scripts/test_times.py``) counts how often each ran and which test waited for it.
Each such step is wrapped in :func:`step`, which appends one JSON line to the file named
by :data:`ENV` when it is set (the time table sets it per pytest process; subprocesses
such as a benchmark's inherit it) and does nothing otherwise: no file, no cost.

One line: ``{"kind", "what", "start", "end", "ok", "pid"}``, times from ``time.time()``
so that lines from several processes compare. Appends of one short line are atomic on
a local file system, so concurrent writers need no lock.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: The file the steps are appended to; unset: nothing is recorded.
ENV = "GPUSPAWNER_SUITE_COSTS"

#: The kinds of step, as the time table names them.
CONTROL_PLANE = "control plane start"
REAL_NODES = "real nodes start"
KUEUE = "Kueue deploy"
IMAGE_BUILD = "image build"
HUB = "hub start"
HELM_INSTALL = "Helm install or upgrade"
HELM_PACKAGE = "Helm dependency packaged"
GO_BUILD = "Go build"
DOCKER_ENGINE = "Docker engine start"

KINDS = (
    CONTROL_PLANE,
    REAL_NODES,
    KUEUE,
    IMAGE_BUILD,
    HUB,
    HELM_INSTALL,
    HELM_PACKAGE,
    GO_BUILD,
    DOCKER_ENGINE,
)


@contextlib.contextmanager
def step(kind: str, what: str = "") -> Iterator[None]:
    """Record one expensive step (its kind, a few words on what, when, and whether it
    finished) when :data:`ENV` names a file; a failed step is recorded too."""
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    start = time.time()
    ok = False
    try:
        yield
        ok = True
    finally:
        line = {
            "kind": kind,
            "what": what,
            "start": start,
            "end": time.time(),
            "ok": ok,
            "pid": os.getpid(),
        }
        # A recording that cannot be written must never fail the step it records.
        with contextlib.suppress(OSError):
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")


def recorded(kind: str, what: Callable[..., str] | None = None) -> Callable[[F], F]:
    """A function whose every call is one :func:`step` of ``kind``; ``what`` makes the
    step's words from the call's arguments."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not os.environ.get(ENV):
                return function(*args, **kwargs)
            with step(kind, what(*args, **kwargs) if what else function.__qualname__):
                return function(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
